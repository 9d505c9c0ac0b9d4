"""research/analysis.py and the estimators: diversity metrics against hand counts, bootstrap intervals against a
hand-rolled resample, the paired comparison against hand counts on small samples files."""

import json
import math
import sys
from pathlib import Path

import preloaded
import pytest
import torch

import eval as S
from research import analysis as A
from reward import RewardPool
from runtime import diagnostics as D

ROOT = Path(__file__).resolve().parents[1]


def boxed(answer: str) -> str:
    return f"so the answer is \\boxed{{{answer}}}"


# ----------------------------------------------------------------------------- diversity


def test_equivalent_answers_count_once_through_the_checker():
    texts = [boxed("\\frac{1}{2}"), boxed("0.5"), boxed("1/2"), boxed("3"),  # 2 classes: 1/2 and 3
             boxed("7"), boxed("7"), "no answer here", "nor here",  # 1 class, two unanswered
             "I am not sure yet.", "Let me think about it more.", "Hmm, that is hard to say.",
             "Not sure."]  # no answers at all: 0 classes (a lone formula such as "x" would be one)
    with RewardPool(num_workers=1) as pool:
        metrics = D.group_diversity(texts, [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0], 4, same=pool)
    assert metrics["div/distinct_answers"] == pytest.approx((2 + 1 + 0) / 3)
    assert metrics["div/no_answer"] == pytest.approx(6 / 12)
    assert metrics["div/mixed_groups"] == pytest.approx(1 / 3)  # only the first group has both


def test_in_process_the_graders_exact_rules_decide_without_its_workers():
    """What a training step passes: the answers its reward read (RewardPool.answers) and FastRules(pool), the
    grader's exact rules in this process: 1/2, \\frac{1}{2} and 0.5 count once, no worker starts."""
    texts = [boxed("\\frac{1}{2}"), boxed("0.5"), boxed("1/2"), boxed("3"), boxed("4"), boxed("4.0"), boxed("5"),
             "no answer"]
    with RewardPool(num_workers=1) as pool:
        pool.score([(text, "1/2") for text in texts])
        metrics = D.group_diversity(texts, [1, 1, 1, 0, 0, 0, 0, 0], 4, answers=pool.answers,
                                    same=D.FastRules(pool))
        assert not pool._workers  # every pair was decided in this process
    assert pool.answers[:4] == ["\\frac{1}{2}", "0.5", "1/2", "3"] and pool.answers[-1] is None
    assert metrics["div/distinct_answers"] == pytest.approx((2 + 2) / 2)  # {1/2, 3}, {4, 5}


def test_without_a_checker_only_identical_strings_count_once():
    texts = [boxed("\\frac{1}{2}"), boxed("0.5"), boxed(" 0.5 "), boxed("3")]
    assert D.group_diversity(texts, [0, 0, 0, 0], 4)["div/distinct_answers"] == 3


def test_a_plain_callable_decides_equivalence():
    same = lambda a, b: abs(float(a) - float(b)) < 1e-9
    assert D.count_distinct_answers([["2", "2.0", "3", "3.00", "4"]], same=same) == [3]


def test_distinct_ngram_ratios_by_hand():
    # Group of three: "a b c a", "a b d", "e f". Word n-gram sets:
    #   n=1: {a,b,c} {a,b,d} {e,f}; pairs: (1-2/4), (1-0/5), (1-0/5) -> mean (0.5 + 1 + 1) / 3
    #   n=2: {ab,bc,ca} {ab,bd} {ef}; pairs: (1-1/4), 1, 1 -> (0.75 + 2) / 3
    #   n=3: {abc,bca} {abd} {}; pairs: 1, 1, 1 (union non-empty) -> 1
    #   n=4: {abca} {} {}; pairs (1,2) 1, (1,3) 1, (2,3) no value -> 1
    # Second group: two identical texts "x y z": 0 for n = 1..3; no 4-gram: no value.
    texts = ["a b c a", "a b d", "e f", "x y z", "x y z", "x y z"]
    metrics = D.group_diversity(texts, [0] * 6, 3)
    assert metrics["div/distinct_1"] == pytest.approx((0.5 + 1 + 1 + 0 + 0 + 0) / 6)
    assert metrics["div/distinct_2"] == pytest.approx((0.75 + 1 + 1) / 6)
    assert metrics["div/distinct_3"] == pytest.approx(3 / 6)
    assert metrics["div/distinct_4"] == pytest.approx(1.0)  # only the two pairs that have a value


def test_groups_must_divide_the_texts():
    with pytest.raises(ValueError, match="groups of 4"):
        D.group_diversity(["a"] * 6, [0] * 6, 4)


def test_mixture_cosine_equals_a_hand_loop():
    g = torch.Generator().manual_seed(0)
    V, d, N, T, K = 11, 5, 2, 4, 3
    embed = torch.randn(V, d, generator=g)
    cand_ids = torch.randint(V, (N, T, K), generator=g)
    cand_weights = torch.rand(N, T, K, generator=g).softmax(-1)
    response_ids = torch.randint(V, (N, T), generator=g)
    mixed = torch.tensor([[True, False, True, False], [False, False, False, True]])
    cosines = []
    for n in range(N):
        for t in range(T):
            if mixed[n, t]:
                fed = [sum(float(cand_weights[n, t, k]) * float(embed[cand_ids[n, t, k], j])
                           for k in range(K)) for j in range(d)]
                own = [float(x) for x in embed[response_ids[n, t]]]
                dot = sum(x * y for x, y in zip(fed, own))
                cosines.append(dot / math.sqrt(sum(x * x for x in fed) * sum(y * y for y in own)))
    got = D.mixture_closeness(embed, cand_ids, cand_weights, response_ids, mixed, chunk=2)[1]  # chunks of 2 of 3
    assert got == pytest.approx(sum(cosines) / len(cosines), abs=1e-6)
    none_mixed = torch.zeros(N, T, dtype=torch.bool)
    assert D.mixture_closeness(embed, cand_ids, cand_weights, response_ids, none_mixed) is None


# ----------------------------------------------------------------------------- bootstrap


def test_intervals_of_a_constant_have_zero_width():
    # Every problem has 2 of 4 correct: every resample has the same Mean@4 and Pass@k.
    correct = {f"p{i}": [True, False, True, False] for i in range(7)}
    result = S.intervals(correct, resamples=500)
    assert result["mean@4"] == [0.5, 0.5]
    assert result["pass@2"] == [pytest.approx(5 / 6), pytest.approx(5 / 6)]  # 1 - C(2,2)/C(4,2)
    assert result["pass@4"] == [1.0, 1.0]


def hand_quantile(sorted_values, q):
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (position - low) * (sorted_values[high] - sorted_values[low])


def test_seeded_intervals_match_a_hand_rolled_resample():
    correct = [[True, True, False], [False, False, False], [True, True, True], [True, False, False],
               [False, True, False]]
    accuracy = [sum(c) / 3 for c in correct]
    solved = [float(any(c)) for c in correct]
    B, seed = 300, 7
    # The documented procedure: one torch.randint(P, (B, P)) draw from a generator seeded with `seed`.
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(correct), (B, len(correct)), generator=generator).tolist()
    mean_draws = sorted(sum(accuracy[i] for i in row) / len(row) for row in picks)
    pass_draws = sorted(sum(solved[i] for i in row) / len(row) for row in picks)
    result = S.intervals(correct, metrics=["mean@3", "pass@3"], resamples=B, seed=seed)
    for metric, draws in (("mean@3", mean_draws), ("pass@3", pass_draws)):
        assert result[metric] == pytest.approx([hand_quantile(draws, 0.025), hand_quantile(draws, 0.975)])


def test_intervals_cover_the_estimate_and_narrow_with_more_problems():
    few = {f"p{i}": [i % 2 == 0] * 4 for i in range(10)}
    many = {f"p{i}": [i % 2 == 0] * 4 for i in range(400)}
    lo_few, hi_few = S.intervals(few)["mean@4"]
    lo_many, hi_many = S.intervals(many)["mean@4"]
    assert lo_few < 0.5 < hi_few and lo_many < 0.5 < hi_many
    assert hi_many - lo_many < (hi_few - lo_few) / 3  # width ~ 1/sqrt(P): sqrt(40) ~ 6.3 times narrower


def test_unknown_metric_and_ragged_samples_are_clear_errors():
    with pytest.raises(ValueError, match="pass@k, k <= 2"):
        S.intervals([[True, False]], metrics=["pass@4"])
    with pytest.raises(ValueError, match="same number of samples"):
        S.intervals([[True, False], [True]])


# ----------------------------------------------------------------------------- paired comparison


def write_samples(path: Path, table: dict[str, dict[str, list[int]]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"benchmark": bench, "problem_id": pid, "sample": s, "response": "",
                         "extracted": None, "correct": bool(c)})
             for bench, problems in table.items() for pid, samples in problems.items()
             for s, c in enumerate(samples)]
    (path / "samples.jsonl").write_text("\n".join(reversed(lines)) + "\n")  # any order
    return path


RUN_A = {"toy": {"p1": [1, 0, 0, 0], "p2": [1, 1, 1, 1], "p3": [0, 0, 0, 0], "p4": [0, 1, 0, 0],
                 "p5": [0, 0, 0, 0]}}
RUN_B = {"toy": {"p1": [0, 0, 0, 0], "p2": [1, 1, 0, 1], "p3": [0, 0, 1, 0], "p4": [0, 0, 0, 0],
                 "p5": [0, 0, 0, 0]}}


def test_paired_view_equals_the_hand_count(tmp_path):
    a = A.load_samples(write_samples(tmp_path / "a", RUN_A))
    b = A.load_samples(write_samples(tmp_path / "b", RUN_B))
    result = A.compare_runs(a, b, resamples=200)["toy"]
    # Solved (a correct sample among 4): A solves p1 p2 p4, B solves p2 p3.
    assert result["solved"] == {"only_a": 2, "only_b": 1, "both": 1, "neither": 1}
    mean = result["metrics"]["mean@4"]
    assert mean["a"] == pytest.approx(6 / 20) and mean["b"] == pytest.approx(4 / 20)
    assert mean["diff"] == pytest.approx(2 / 20)
    assert mean["diff_ci"][0] <= mean["diff"] <= mean["diff_ci"][1]
    assert result["metrics"]["pass@4"]["diff"] == pytest.approx((3 - 2) / 5)


def test_identical_runs_differ_by_zero_with_p_one(tmp_path):
    a = A.load_samples(write_samples(tmp_path / "a", RUN_A))
    row = A.compare_runs(a, a, resamples=200)["toy"]["metrics"]["pass@1"]
    assert row["diff"] == 0 and row["diff_ci"] == [0.0, 0.0] and row["p_value"] == 1.0


def test_sign_flip_test_finds_a_consistent_difference():
    # A beats B by the same margin on all 12 problems: only the all-plus and all-minus sign draws are as
    # extreme, probability 2 / 4096, so p ~ 5e-4 (at least 1 / 10001).
    differences = torch.full((12, 1), 0.25, dtype=torch.float64)
    p = A.sign_flip_p_values(differences, 10_000, torch.Generator().manual_seed(0))[0]
    assert 1 / 10_001 <= p < 0.002


def test_different_problem_sets_and_incomplete_runs_are_clear_errors(tmp_path):
    a = A.load_samples(write_samples(tmp_path / "a", RUN_A))
    fewer = {"toy": {pid: s for pid, s in RUN_B["toy"].items() if pid != "p5"}}
    with pytest.raises(ValueError, match="different problems"):
        A.compare_runs(a, A.load_samples(write_samples(tmp_path / "b", fewer)))
    broken = {"toy": dict(RUN_A["toy"], p5=[0, 0])}
    with pytest.raises(ValueError, match="eval.py --resume"):
        A.load_samples(write_samples(tmp_path / "c", broken))


def test_compare_cli_prints_the_table_and_writes_json(tmp_path):
    write_samples(tmp_path / "a", RUN_A)
    write_samples(tmp_path / "b", RUN_B)
    out = tmp_path / "cmp.json"
    done = preloaded.run([sys.executable, "-m", "research.analysis", "compare", str(tmp_path / "a"),
                           str(tmp_path / "b"), "--out", str(out), "--resamples", "100"],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    assert "only A 2, only B 1, both 1, neither 1" in done.stdout
    saved = json.loads(out.read_text())
    assert saved["benchmarks"]["toy"]["solved"]["only_a"] == 2 and saved["resamples"] == 100


def test_diversity_of_an_evaluated_run_groups_each_problems_samples(tmp_path):
    records = [("p1", 0, boxed("2"), True), ("p1", 1, boxed("2"), True), ("p1", 2, boxed("5"), False),
               ("p2", 0, boxed("1"), False), ("p2", 1, "no box", False), ("p2", 2, boxed("3"), False)]
    (tmp_path / "samples.jsonl").write_text("".join(
        json.dumps({"benchmark": "toy", "problem_id": pid, "sample": s, "response": text, "correct": c})
        + "\n"
        for pid, s, text, c in records))
    metrics = A.sample_diversity(tmp_path)["toy"]
    assert metrics["div/distinct_answers"] == pytest.approx((2 + 2) / 2)  # p1: {2, 5}; p2: {1, 3}
    assert metrics["div/mixed_groups"] == pytest.approx(1 / 2)
    assert metrics["div/no_answer"] == pytest.approx(1 / 6)
