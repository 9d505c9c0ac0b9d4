"""eval.py: the Pass@k estimator on its whole grid, results on the real benchmark files against hand counts,
resume after an interruption, the offline CLI run on the tiny model, and the prompts --instruction makes."""

import itertools
import json
import math
import sys
from pathlib import Path

import preloaded
import pytest
import torch

import data
import eval as E
from reward import choice_reward, math_reward

ROOT = Path(__file__).resolve().parents[1]


def pass_at_k_by_product(n, c, k):
    """P(a random k-subset of n samples holds a correct one) = 1 - prod_i (n-c-i)/(n-i): another road to it."""
    miss = 1.0
    for i in range(k):
        miss *= max(n - c - i, 0) / (n - i)
    return 1.0 - miss


def test_pass_at_k_on_the_whole_grid():
    for n in range(1, 33):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert abs(E.pass_at_k(n, c, k) - pass_at_k_by_product(n, c, k)) < 1e-12


def test_pass_at_k_by_enumerating_subsets():
    n = 6
    for c in range(n + 1):
        correct = set(range(c))
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(range(n), k))
            hit = sum(bool(correct & set(s)) for s in subsets) / len(subsets)
            assert E.pass_at_k(n, c, k) == pytest.approx(hit, abs=1e-12)
    assert E.pass_at_k(32, 0, 1) == 0.0 and E.pass_at_k(32, 1, 32) == 1.0


def test_mean_is_the_mean_accuracy():
    summary = E.summarize({"a": [True, False, False, False], "b": [True, True, True, False]}, 4)
    assert summary["mean@4"] == 4 / 8
    assert summary["pass@1"] == (1 / 4 + 3 / 4) / 2
    assert set(summary) == {"n", "problems", "mean@4", "pass@1", "pass@2", "pass@4", "ci95"}


def test_summary_holds_bootstrap_intervals_over_problems():
    # Two problems with accuracies 1/4 and 3/4: a resample of 2 problems has mean 1/4 (both the first,
    # probability 1/4), 1/2 or 3/4 (1/4), so the 2.5% and 97.5% quantiles are 1/4 and 3/4. Both are solved
    # by some sample: Pass@4 is 1 in every resample.
    summary = E.summarize({"a": [True, False, False, False], "b": [True, True, True, False]}, 4)
    assert summary["ci95"]["mean@4"] == [0.25, 0.75]
    assert summary["ci95"]["pass@4"] == [1.0, 1.0]
    assert set(summary["ci95"]) == {"mean@4", "pass@1", "pass@2", "pass@4"}


def score(pairs, kind, name):
    reward = choice_reward if kind == "choice" else math_reward
    return [reward(response, answer) for response, answer in pairs]


class StandIn:
    """Answers by plan instead of by model: problem i gets the reference answer on all n samples when
    i % 3 == 0, on samples 0 and 1 only when i % 3 == 1, and never when i % 3 == 2."""

    def __init__(self, benchmarks):
        self.by_prompt = {tuple(p["prompt_ids"]): (i, p, kind) for _, problems, kind in benchmarks
                          for i, p in enumerate(problems)}
        self.seen = {}

    def __call__(self, prompts, seed, row_keys):
        texts = []
        for prompt in prompts:
            i, problem, kind = self.by_prompt[tuple(prompt)]
            sample = self.seen[tuple(prompt)] = self.seen.get(tuple(prompt), -1) + 1
            right = i % 3 == 0 or (i % 3 == 1 and sample < 2)
            if kind == "choice":
                letter = problem["answer"] if right else "ABCD"[("ABCD".index(problem["answer"]) + 1) % 4]
                texts.append(f"Let me think.\nAnswer: {letter}")
            else:
                texts.append(f"So the answer is $\\boxed{{{problem['answer'] if right else '-987654321'}}}$.")
        return texts, 0


def load_all(shared_data, names, limit=None):
    tokenizer = data.tiny_tokenizer()
    benchmarks = []
    for name in names:
        bench, problems, kind = E.load_benchmark(str(shared_data / "eval" / f"{name}.jsonl"), limit)
        kept, _ = data.tokenize_problems(problems, tokenizer, max_prompt_tokens=10**9,
                                         style="gpqa" if kind == "choice" else "math")
        benchmarks.append((bench, kept, kind))
    return benchmarks


def test_results_equal_the_hand_count_on_the_real_files(shared_data, tmp_path):
    names = ["aime24", "aime25", "amc23", "math500", "gpqa_diamond"]
    benchmarks = load_all(shared_data, names)
    results = E.evaluate(benchmarks, StandIn(benchmarks), n=4, out_dir=tmp_path, batch_size=64, score_fn=score,
                         progress=False)
    assert json.loads((tmp_path / "results.json").read_text()) == results
    for name, count in zip(names, [30, 30, 40, 500, 198]):
        all_right, two_right = len(range(0, count, 3)), len(range(1, count, 3))
        row = results[name]
        assert (row["n"], row["problems"]) == (4, count)
        assert row["mean@4"] == pytest.approx((4 * all_right + 2 * two_right) / (4 * count), abs=1e-12)
        # c = 2 of n = 4: pass@1 = 1/2, pass@2 = 1 - C(2,2)/C(4,2) = 5/6, pass@4 = 1.
        assert row["pass@1"] == pytest.approx((all_right + two_right / 2) / count, abs=1e-12)
        assert row["pass@2"] == pytest.approx((all_right + two_right * 5 / 6) / count, abs=1e-12)
        assert row["pass@4"] == pytest.approx((all_right + two_right) / count, abs=1e-12)
    math_rows = [results[name] for name in names[:4]]
    assert results["average"]["pass@4"] == pytest.approx(sum(r["pass@4"] for r in math_rows) / 4, abs=1e-12)
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 * (30 + 30 + 40 + 500 + 198)
    assert {"benchmark", "problem_id", "sample", "response", "extracted", "correct"} <= set(samples[0])


def test_aime_zero_padding_and_gpqa_letters_score_right(shared_data, tmp_path):
    benchmarks = load_all(shared_data, ["aime24", "gpqa_diamond"], limit=None)
    aime = benchmarks[0][1]
    padded = next(p for p in aime if p["answer"] == "025")
    assert math_reward("... so the answer is \\boxed{25}.", padded["answer"]) == 1.0
    gpqa = benchmarks[1][1]
    assert choice_reward("I pick (C).\nAnswer: C", "C") == 1.0
    assert choice_reward("Answer: B", gpqa[0]["answer"]) == float(gpqa[0]["answer"] == "B")
    samples_dir = tmp_path / "gpqa"
    E.evaluate([benchmarks[1]], StandIn([benchmarks[1]]), n=2, out_dir=samples_dir, batch_size=50, score_fn=score,
               progress=False)
    samples = [json.loads(line) for line in (samples_dir / "samples.jsonl").read_text().splitlines()]
    by_id = {p["id"]: p["answer"] for p in gpqa}
    assert all(s["extracted"] == by_id[s["problem_id"]] for s in samples if s["correct"])


class Interrupted(Exception):
    pass


def seeded_stand_in(stop_after=None):
    """Correct or not by a coin that depends on the seed and the row key, so resume must reproduce both."""
    calls = []

    def generate_fn(prompts, seed, row_keys):
        if stop_after is not None and len(calls) == stop_after:
            raise Interrupted
        calls.append(seed)
        return [f"\\boxed{{{hash((seed, key)) & 1}}}" for key in row_keys], 0

    return generate_fn, calls


def test_resume_after_an_interruption_gives_the_same_results(tmp_path):
    tokenizer = data.tiny_tokenizer()
    problems = [{"id": str(i), "problem": "x" * (i % 5 + 1), "answer": str(i % 2)} for i in range(20)]
    problems, _ = data.tokenize_problems(problems, tokenizer, max_prompt_tokens=1000)
    benchmarks = [("toy", problems, "math")]
    whole_fn, _ = seeded_stand_in()
    whole = E.evaluate(benchmarks, whole_fn, n=4, out_dir=tmp_path / "whole", batch_size=7, seed=3, score_fn=score,
                       progress=False)
    cut_fn, _ = seeded_stand_in(stop_after=5)
    with pytest.raises(Interrupted):
        E.evaluate(benchmarks, cut_fn, n=4, out_dir=tmp_path / "cut", batch_size=7, seed=3, score_fn=score,
                   progress=False)
    with (tmp_path / "cut" / "samples.jsonl").open("a") as f:
        f.write('{"benchmark": "toy", "probl')  # a write cut short by the interruption
    rest_fn, rest_calls = seeded_stand_in()
    resumed = E.evaluate(benchmarks, rest_fn, n=4, out_dir=tmp_path / "cut", batch_size=7, seed=3, score_fn=score,
                         resume=True, progress=False)
    assert len(rest_calls) == math.ceil(80 / 7) - 5  # only the batches not yet done ran
    assert resumed == whole
    assert (tmp_path / "cut" / "results.json").read_text() == (tmp_path / "whole" / "results.json").read_text()


def test_a_resumed_evaluations_bar_starts_at_what_was_done_and_times_only_what_runs(tmp_path, monkeypatch):
    """The batches a --resume finds done are the bar's starting count, not instant steps of it: counted as steps,
    they made its rate and its time to go several times too fast (a resumed run showed 4 s to go and took 14)."""
    tokenizer = data.tiny_tokenizer()
    problems = [{"id": str(i), "problem": "x" * (i % 5 + 1), "answer": str(i % 2)} for i in range(20)]
    problems, _ = data.tokenize_problems(problems, tokenizer, max_prompt_tokens=1000)
    benchmarks = [("toy", problems, "math")]
    cut_fn, _ = seeded_stand_in(stop_after=5)
    with pytest.raises(Interrupted):
        E.evaluate(benchmarks, cut_fn, n=4, out_dir=tmp_path, batch_size=7, seed=3, score_fn=score, progress=False)
    bars, real_progress = [], E.tracking.progress

    def kept_progress(iterable, **kwargs):
        bars.append((list(iterable), kwargs))
        return real_progress(bars[-1][0], **{**kwargs, "disable": True})

    monkeypatch.setattr(E.tracking, "progress", kept_progress)
    rest_fn, rest_calls = seeded_stand_in()
    E.evaluate(benchmarks, rest_fn, n=4, out_dir=tmp_path, batch_size=7, seed=3, score_fn=score, resume=True,
               progress=True)
    (steps, kwargs), = bars
    rounds = math.ceil(80 / 7)
    assert kwargs.get("total") == rounds and kwargs.get("initial") == 5  # starts at the 5 batches done
    assert len(steps) == len(rest_calls) == rounds - 5  # and takes a step only for each batch that runs


@pytest.fixture(scope="module")
def tiny_sampler():
    """eval.py's generate_fn on the tiny random model, sampling at temperature 1 with no nucleus, and a
    toy benchmark of 4 problems."""
    from model import load_model
    from rollout import Exploration, Sampling

    tokenizer = data.tiny_tokenizer()
    sampling = Sampling(temperature=1.0, max_new_tokens=12, stop_ids=(tokenizer.eos_token_id,),
                        pad_id=data.pad_id_of(tokenizer))
    generate_fn = E.sampler_fn(load_model("tiny", dtype=torch.float32, device="cpu"), tokenizer, sampling,
                               Exploration(), progress=False)
    problems = [{"id": f"p{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(4)]
    return generate_fn, [("toy", data.tokenize_problems(problems, tokenizer, max_prompt_tokens=1000)[0], "math")]


def sampled_eval(tiny_sampler, out: Path, batch_size: int, resume: bool = False) -> dict:
    """3 samples per problem, each "correct" when its text has an odd length (the grader is not under test
    here); returns {(problem, sample): response} from samples.jsonl."""
    generate_fn, benchmarks = tiny_sampler
    E.evaluate(benchmarks, generate_fn, n=3, out_dir=out, batch_size=batch_size, seed=5, resume=resume,
               score_fn=lambda pairs, kind, name: [len(text) % 2 for text, _ in pairs], progress=False)
    lines = (out / "samples.jsonl").read_text().splitlines()
    return {(s["problem_id"], s["sample"]): s["response"] for s in map(json.loads, lines)}


def test_samples_do_not_depend_on_the_batch_size(tiny_sampler, tmp_path):
    one = sampled_eval(tiny_sampler, tmp_path / "one", batch_size=1)
    three = sampled_eval(tiny_sampler, tmp_path / "three", batch_size=3)
    assert len(one) == 12 and one == three
    assert len(set(one.values())) == 12  # sampled, not all alike: a key shared by two samples would show


def test_a_resume_under_another_batch_size_equals_the_straight_run(tiny_sampler, tmp_path):
    straight = sampled_eval(tiny_sampler, tmp_path / "straight", batch_size=3)
    cut = tmp_path / "cut"
    sampled_eval(tiny_sampler, cut, batch_size=2)
    # An interruption after two batches of 2, in the middle of writing the third.
    lines = (cut / "samples.jsonl").read_text().splitlines()
    (cut / "samples.jsonl").write_text("\n".join(lines[:4]) + "\n" + lines[4][:20])
    resumed = sampled_eval(tiny_sampler, cut, batch_size=3, resume=True)
    assert resumed == straight
    assert (cut / "results.json").read_text() == (tmp_path / "straight" / "results.json").read_text()


def test_unknown_benchmark_and_gated_gpqa_are_clear_errors():
    with pytest.raises(data.DataError, match="unknown benchmark"):
        E.load_benchmark("aime2099", None)
    with pytest.raises(data.DataError, match="local copy"):
        E.load_benchmark("gpqa_diamond", None)


def test_cli_runs_offline_on_the_tiny_model(shared_data, tmp_path):
    out = tmp_path / "out"
    math500 = str(shared_data / "eval" / "math500.jsonl")
    command = [sys.executable, "eval.py", "--model", "tiny", "--benchmarks", math500,
               "--limit", "6", "--n", "4", "--max-new-tokens", "16", "--out-dir", str(out), "--device", "cpu"]
    finished = preloaded.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    results = json.loads((out / "results.json").read_text())
    assert (results["math500"]["n"], results["math500"]["problems"]) == (4, 6)
    assert len((out / "samples.jsonl").read_text().splitlines()) == 24
    assert "math500" in finished.stdout and "pass@4" in finished.stdout


# ----------------------------------------------------------------------------- --instruction

PAPER_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def prompts_seen(argv, monkeypatch) -> set[tuple[int, ...]]:
    """Runs eval.py's main(argv) on the real sampler and returns the prompts it was given."""
    seen, real_sampler_fn = set(), E.sampler_fn

    def recording_sampler_fn(*args, **kwargs):
        generate_fn = real_sampler_fn(*args, **kwargs)

        def recording(prompts, seed, row_keys):
            seen.update(map(tuple, prompts))
            return generate_fn(prompts, seed, row_keys)

        return recording

    monkeypatch.setattr(E, "sampler_fn", recording_sampler_fn)
    E.main(argv)
    return seen


def test_instruction_sets_the_math_prompt_and_leaves_gpqas(tmp_path, monkeypatch):
    math_file, gpqa_file = tmp_path / "sums.jsonl", tmp_path / "mini_gpqa.jsonl"
    math_file.write_text("".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                                 for i in range(3)))
    gpqa_file.write_text(json.dumps({"problem": "Which is a noble gas?\nA) N\nB) Ne\nC) Na\nD) Ni",
                                     "answer": "B"}) + "\n")
    tokenizer = data.tiny_tokenizer()

    def user_turn(text):  # R1-Distill's chat template, written out by hand
        return tuple(tokenizer(f"{data.BOS}{data.USER}{text}{data.ASSISTANT}{data.THINK}\n",
                               add_special_tokens=False)["input_ids"])

    gpqa = user_turn("Which is a noble gas?\nA) N\nB) Ne\nC) Na\nD) Ni\n\nLet's think step by step and output "
                     "the final answer in the last line as:\nAnswer: <A/B/C/D>")
    for index, (flags, instruction) in enumerate([([], PAPER_INSTRUCTION), (["--instruction", ""], "")]):
        out = tmp_path / f"out-{index}"
        argv = ["--model", "tiny", "--benchmarks", f"{math_file},{gpqa_file}", "--n", "1", "--max-new-tokens", "2",
                "--out-dir", str(out), *flags]
        after_problem = f" {instruction}" if instruction else ""  # the evaluation keeps the final period
        expected = {user_turn(f"What is {i} + {i}?{after_problem}") for i in range(3)} | {gpqa}
        assert prompts_seen(argv, monkeypatch) == expected
        assert json.loads((out / "settings.json").read_text())["instruction"] == instruction


def test_a_resume_under_another_instruction_is_refused_also_from_before_it_was_recorded(tmp_path):
    settings = {"model": "tiny", "n": 2, "instruction": PAPER_INSTRUCTION}
    (tmp_path / "samples.jsonl").write_text("")
    (tmp_path / "settings.json").write_text(json.dumps({"model": "tiny", "n": 2}))  # eval.py before --instruction
    E.claim_out_dir(tmp_path, settings, resume=True, overwrite=False)  # made with the paper's: resumes
    with pytest.raises(data.DataError, match=r"--instruction \"Let's think .*\" -> ''"):
        E.claim_out_dir(tmp_path, {**settings, "instruction": ""}, resume=True, overwrite=False)
    (tmp_path / "settings.json").write_text(json.dumps({**settings, "instruction": ""}))
    with pytest.raises(data.DataError, match=r"--instruction '' -> \"Let's think"):
        E.claim_out_dir(tmp_path, settings, resume=True, overwrite=False)


def test_a_resume_under_other_sampling_settings_is_refused_also_from_before_they_were_recorded(tmp_path):
    """Every setting that shapes a sample counts (--min-p, the soft-token methods' knobs, the after-thinking
    filters); a settings file from before they were recorded holds their defaults."""
    args, cfg = E.parse_args(["--model", "tiny", "--explore", "soft", "--dirichlet-alpha", "2",
                              "--after-thinking-top-k", "5", "--out-dir", str(tmp_path)])
    settings = E.settings_of(args, cfg)
    (tmp_path / "samples.jsonl").write_text("")
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    E.claim_out_dir(tmp_path, settings, resume=True, overwrite=False)
    for name, value in (("dirichlet_alpha", 1.0), ("after_thinking_top_k", -1), ("min_p", 0.05)):
        flag = "--" + name.replace("_", "-")
        with pytest.raises(data.DataError, match=f"{flag} {settings[name]!r} -> {value!r}"):
            E.claim_out_dir(tmp_path, {**settings, name: value}, resume=True, overwrite=False)
    old = {k: v for k, v in settings.items() if k not in ("min_p", "dirichlet_alpha", "after_thinking_top_k")}
    (tmp_path / "settings.json").write_text(json.dumps(old))
    E.claim_out_dir(tmp_path, {**settings, "dirichlet_alpha": 0.0, "after_thinking_top_k": -1}, resume=True,
                    overwrite=False)
    with pytest.raises(data.DataError, match=r"--dirichlet-alpha 0.0 -> 2.0"):
        E.claim_out_dir(tmp_path, settings, resume=True, overwrite=False)


def test_a_checkpoint_trained_on_another_instruction_gets_a_one_line_warning(tmp_path, capsys):
    import config
    import model as M

    checkpoint = tmp_path / "step-30"
    M.save_model(M.random_model(M.TINY_CONFIG), checkpoint, data.tiny_tokenizer())
    config.preset("demo").save_json(checkpoint / "config.json.run")  # as train.py leaves it: instruction ''
    bench = tmp_path / "b.jsonl"
    bench.write_text(json.dumps({"problem": "1 + 1?", "answer": "2"}) + "\n")
    E.main(["--model", str(checkpoint), "--benchmarks", str(bench), "--n", "1", "--max-new-tokens", "2",
            "--out-dir", str(tmp_path / "out")])
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "--instruction ''" in warnings[0] and str(checkpoint) in warnings[0]
    assert E.training_instruction_warning(str(checkpoint), "") is None
    assert E.training_instruction_warning("tiny", PAPER_INSTRUCTION) is None  # no training config: no warning
