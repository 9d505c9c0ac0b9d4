"""research/experiments.py: a 1-step sweep end to end through train.py and eval.py, the table against the per-run
results.json files, skipping finished runs, and the example sweep files against the real flags."""

import csv
import dataclasses
import json
from pathlib import Path

import pytest

import config
import eval as E
from research import experiments as X

ROOT = Path(__file__).resolve().parents[1]


def table_rows(out_dir: Path) -> dict:
    with (out_dir / "table.csv").open() as f:
        return {(r["method"], r["benchmark"], r["metric"]): r for r in csv.DictReader(f)}


def test_one_step_sweep_end_to_end_and_its_table_equals_the_results_files(tmp_path, capsys):
    # One seed (each subprocess costs seconds of imports); averaging over seeds is checked on the next test.
    sweep = {"preset": "tiny", "seeds": [0], "metrics": ["mean@2", "pass@1", "pass@2"],
             "train": {"max_steps": 1, "prompts_per_step": 2, "mini_batch_prompts": 2, "group_size": 2,
                       "max_new_tokens": 8},
             "eval": {"benchmarks": ["arith:n=3"], "n": 2, "max_new_tokens": 8, "batch_size": 6},
             "runs": [{"name": "N-GRPO", "train": {"explore": "neighbor"}}]}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(sweep))
    out = tmp_path / "out"
    X.main([str(path), "--out-dir", str(out), "--resamples", "200"])
    rows = table_rows(out)
    for metric in sweep["metrics"]:
        results = json.loads((out / "n-grpo" / "seed-0" / "eval-n-grpo" / "results.json").read_text())
        row = rows[("N-GRPO", "arith-n-3", metric)]
        assert float(row["mean"]) == pytest.approx(results["arith-n-3"][metric], abs=1e-6)
    assert (out / "n-grpo" / "seed-0" / "checkpoints" / "step-1" / "model.safetensors").exists()
    capsys.readouterr()
    X.main([str(path), "--out-dir", str(out), "--resamples", "200"])  # everything is done: nothing runs again
    assert capsys.readouterr().out.count("already done") == 2


def write_eval(eval_dir: Path, correct: dict[str, dict[str, list[bool]]]) -> None:
    """What eval.py leaves in its --out-dir for these verdicts: samples.jsonl and results.json."""
    eval_dir.mkdir(parents=True)
    (eval_dir / "samples.jsonl").write_text("".join(
        json.dumps({"benchmark": b, "problem_id": pid, "sample": s, "correct": c})+ "\n"
        for b, problems in correct.items() for pid, samples in problems.items()
        for s, c in enumerate(samples)))
    results = {b: E.summarize(problems, 4) for b, problems in correct.items()}
    math_sets = [results[b] for b in correct if "gpqa" not in b]
    results["average"] = {k: sum(r[k] for r in math_sets) / len(math_sets)
                          for k in ("mean@4", "pass@1", "pass@4")}
    (eval_dir / "results.json").write_text(json.dumps(results))


def test_table_means_over_seeds_equal_the_results_files(tmp_path):
    sweep = {"seeds": [0, 1, 2], "metrics": ["mean@4", "pass@1", "pass@4"], "eval": {"n": 4},
             "runs": [{"name": "A", "model": "tiny"}, {"name": "B", "model": "tiny",
                                                      "evals": {"B": {}, "B + soft": {"explore": "soft"}}}]}
    jobs = X.plan(sweep, tmp_path)
    for index, job in enumerate(jobs):
        for offset, evaluation in enumerate(job["evals"]):
            k = index + offset  # a different pattern of verdicts in every evaluation
            write_eval(evaluation["dir"], {
                "set1": {f"q{i}": [(i + s + k) % 3 == 0 for s in range(4)] for i in range(6)},
                "set2": {f"r{i}": [(i * s + k) % 4 == 1 for s in range(4)] for i in range(5)},
                "gpqa_x": {f"g{i}": [(i + k) % 2 == 0] * 4 for i in range(4)}})
    markdown, table = X.build_table(sweep, jobs, resamples=300)
    (tmp_path / "table.csv").write_text(table)
    rows = table_rows(tmp_path)
    for job in jobs:
        for evaluation in job["evals"]:
            assert evaluation["dir"].parent.name == f"seed-{job['seed']}"
    for row in ("A", "B", "B + soft"):
        dirs = [e["dir"] for job in jobs for e in job["evals"] if e["row"] == row]
        results = [json.loads((d / "results.json").read_text()) for d in dirs]
        for benchmark in ("set1", "set2", "gpqa_x", "average"):
            for metric in sweep["metrics"]:
                expected = sum(r[benchmark][metric] for r in results) / len(results)
                cell = rows[(row, benchmark, metric)]
                assert float(cell["mean"]) == pytest.approx(expected, abs=1e-6)
                assert float(cell["ci_low"]) <= float(cell["mean"]) + 1e-9 <= float(cell["ci_high"]) + 2e-9
                assert f"{100 * expected:.1f} [" in markdown.split(f"| {row} |")[1].split("\n")[0]
        assert rows[(row, "set1", "mean@4")]["seeds"] == "0 1 2"


def test_each_row_is_paired_against_the_first_by_hand(tmp_path):
    sweep = {"seeds": [0, 1], "metrics": ["mean@4"], "eval": {"n": 4},
             "runs": [{"name": "A", "model": "tiny"}, {"name": "B", "model": "tiny"}]}
    jobs = X.plan(sweep, tmp_path)
    correct = {  # (row, seed) -> problem -> how many of its 4 samples are right
        ("A", 0): [0, 1, 4, 2], ("A", 1): [0, 3, 4, 2], ("B", 0): [1, 4, 4, 2], ("B", 1): [3, 4, 4, 0]}
    for job in jobs:
        for evaluation in job["evals"]:
            counts = correct[(evaluation["row"], job["seed"])]
            write_eval(evaluation["dir"], {"set1": {f"q{i}": [s < c for s in range(4)] for i, c in enumerate(counts)}})
    markdown, _ = X.build_table(sweep, jobs, resamples=2000)
    # Seed means per problem: A 0, 2, 4, 2 and B 2, 4, 4, 1 correct of 4: differences +0.5, +0.5, 0, -0.25.
    expected = 100 * (0.5 + 0.5 + 0.0 - 0.25) / 4
    line = next(line for line in markdown.splitlines() if line.startswith("- B - A (seeds 0 1): "))
    value, interval = line.split("set1 mean@4 ")[1].split(" [")
    assert float(value) == pytest.approx(expected, abs=0.051)  # printed to 0.1
    low, high = (float(x) for x in interval.rstrip("]").split(", "))
    assert -25.0 <= low <= expected <= high <= 50.0  # within the smallest and largest per-problem difference


def test_token_counts_are_columns_and_each_gain_is_set_against_the_entropy_it_mixed(tmp_path):
    """A sweep's "tokens" / "think_tokens" metrics: each problem's mean over its samples, in tokens (not percent),
    paired like the accuracies; the entropy section lists each row's gain beside the mean mixed_entropy and
    think/mixed_frac of its training runs' metrics.jsonl, and its figure is drawn."""
    pytest.importorskip("matplotlib")
    sweep = {"seeds": [0, 1], "metrics": ["mean@2", "think_tokens"], "eval": {"n": 2},
             "runs": [{"name": "A", "model": "tiny"}, {"name": "B", "model": "tiny"}]}
    jobs = X.plan(sweep, tmp_path)
    think = {"A": [[4, 6], [10, 10]], "B": [[2, 2], [8, 12]]}  # problem -> its 2 samples' thinking tokens
    right = {"A": [[True, False], [False, False]], "B": [[True, True], [True, False]]}
    for job in jobs:
        row = job["run"]
        for evaluation in job["evals"]:
            evaluation["dir"].mkdir(parents=True)
            (evaluation["dir"] / "samples.jsonl").write_text("".join(json.dumps(
                {"benchmark": "set", "problem_id": f"q{i}", "sample": s, "correct": right[row][i][s],
                 "tokens": think[row][i][s] + 3, "think_tokens": think[row][i][s]}) + "\n"
                for i in range(2) for s in range(2)))
        job["dir"].mkdir(parents=True, exist_ok=True)
        if row == "B":  # B mixed at entropies 0.2 and 0.4 (seed 0), 0.6 (seed 1); A never mixed
            logged = [{"mixed_entropy": 0.2 + 0.2 * j + 0.4 * job["seed"], "think/mixed_frac": 0.5}
                      for j in range(2 - job["seed"])]
            (job["dir"] / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in logged))
    markdown, table = X.build_table(sweep, jobs, resamples=500, out_dir=tmp_path)
    (tmp_path / "table.csv").write_text(table)
    rows = table_rows(tmp_path)
    assert float(rows[("A", "set", "think_tokens")]["mean"]) == pytest.approx(7.5)  # (5 + 10) / 2
    assert float(rows[("B", "set", "think_tokens")]["mean"]) == pytest.approx(6.0)  # (2 + 10) / 2
    assert "| A | 25.0 [" in markdown and "| 7.5 [" in markdown  # accuracy in percent, tokens as they are
    line = next(line for line in markdown.splitlines() if line.startswith("- B - A (seeds 0 1): "))
    assert "set think_tokens -1.5 [" in line and "set mean@2 +50.0 [" in line
    entropy_row = next(line for line in markdown.splitlines() if line.startswith("| B | 0."))
    assert entropy_row.startswith("| B | 0.400 | 0.500 | +50.0 [")  # (0.2 + 0.4 + 0.6) / 3
    assert (tmp_path / "entropy_gain.png").stat().st_size > 0


def test_a_run_trained_for_the_others_is_not_a_row_and_seed_and_out_fill_the_flags(tmp_path):
    """`"evals": {}`: trained, never evaluated (the warm start the others start from); {seed} and {out} in a text
    value become the run's seed and the sweep's directory, in train.py's and eval.py's flags."""
    sweep = {"seeds": [3, 4], "train": {"model": "{out}/warm/seed-{seed}/warm_start"},
             "eval": {"instruction": "s{seed}"},
             "runs": [{"name": "warm", "train": {"model": "tiny"}, "evals": {}}, {"name": "B"}]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(sweep))
    jobs = X.plan(X.load_sweep(path), tmp_path / "out")
    assert [(job["run"], job["seed"], len(job["evals"])) for job in jobs] == [("warm", 3, 0), ("warm", 4, 0),
                                                                               ("B", 3, 1), ("B", 4, 1)]
    assert jobs[0]["train"][jobs[0]["train"].index("--model") + 1] == "tiny"
    assert jobs[3]["train"][jobs[3]["train"].index("--model") + 1] == str(tmp_path / "out" / "warm/seed-4/warm_start")
    assert jobs[3]["evals"][0]["command"][jobs[3]["evals"][0]["command"].index("--instruction") + 1] == "s4"


def test_a_directory_of_other_flags_is_not_reused(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "command.json").write_text(json.dumps(["--seed", "1"]))
    with pytest.raises(X.SweepError, match="other flags"):
        X.run_step(["python", "train.py", "--seed", "2"], run_dir, "summary.json", "train.log",
                   "checkpoints/step-*")


def test_bad_sweep_files_are_clear_errors(tmp_path):
    cases = [({"runs": []}, "non-empty 'runs'"), ({"runs": [{"train": {}}]}, "needs a 'name'"),
             ({"runs": [{"name": "a"}, {"name": "a"}]}, "distinct"),
             ({"runs": [{"name": "a"}], "sed": 1}, "unknown"),
             ({"runs": [{"name": "a", "model": "tiny", "train": {}}]}, "evaluate as is")]
    for sweep, message in cases:
        path = tmp_path / "s.json"
        path.write_text(json.dumps(sweep))
        with pytest.raises(X.SweepError, match=message):
            X.load_sweep(path)


@pytest.mark.parametrize("path", sorted((ROOT / "sweeps").glob("*.json")), ids=lambda p: p.name)
def test_example_sweeps_use_only_real_flags_and_presets(path):
    sweep = X.load_sweep(path)
    train_flags = {f.name for f in dataclasses.fields(config.Config)}
    eval_flags = {action.dest for action in E.build_parser()._actions}
    for run in sweep["runs"]:
        assert run.get("preset", sweep.get("preset", "paper-1.5b")) in config.PRESETS
        assert set(sweep.get("train", {})) | set(run.get("train", {})) <= train_flags
        for overrides in [sweep.get("eval", {}), run.get("eval", {}), *run.get("evals", {}).values()]:
            assert set(overrides) <= eval_flags


def test_each_evaluation_gets_its_model_and_flags(tmp_path, monkeypatch):
    sweep = {"preset": "tiny", "seeds": [3], "eval": {"n": 2},
             "runs": [{"name": "trained", "evals": {"plain": {}, "mixed": {"explore": "neighbor"}}},
                      {"name": "base", "model": "tiny", "eval": {"n": 4}}]}
    checkpoint = tmp_path / "trained" / "seed-3" / "checkpoints" / "step-7"
    checkpoint.mkdir(parents=True)
    (checkpoint.parent / "step-12").mkdir()  # the final one: step 12, not the last in name order
    calls = []
    monkeypatch.setattr(X, "run_step", lambda command, *rest: calls.append(command[1:]) or True)
    X.run_sweep(sweep, tmp_path)
    scripts = [Path(call[0]).name for call in calls]
    assert scripts == ["train.py", "eval.py", "eval.py", "eval.py"]  # no training for the base model
    assert calls[0][1:] == ["--preset", "tiny", "--seed", "3", "--out-dir", str(tmp_path / "trained" / "seed-3")]
    assert calls[1][1:3] == ["--model", str(checkpoint.parent / "step-12")] and "--explore" not in calls[1]
    assert calls[2][calls[2].index("--explore") + 1] == "neighbor"
    assert calls[3][1:5] == ["--model", "tiny", "--n", "4"]


def test_the_demo_sweep_evaluates_the_prompts_and_problems_the_demo_trains_on(tmp_path):
    import data

    sweep = X.load_sweep(ROOT / "sweeps" / "demo-tiny.json")
    demo = config.preset(sweep["preset"])
    held_out = data.load_problems(demo.data, split="test")  # the problems the demo holds out of training
    for job in X.plan(sweep, tmp_path):
        for evaluation in job["evals"]:
            command = evaluation["command"]
            assert command[command.index("--instruction") + 1] == "" == demo.instruction
            args, cfg = E.parse_args(["--model", "tiny", *command[2:]])  # what eval.py makes of the command
            assert cfg.instruction == ""
            problems = [json.loads(line) for line in Path(args.benchmarks).read_text().splitlines()]
            assert problems == held_out[:200]
