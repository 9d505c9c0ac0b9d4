"""What a user who reruns, is preempted or mistypes meets (issue 48): a run started from a saved config never touches
the run it came from; --resume keeps what the run's start found; a run refused by a failing check writes nothing;
a scheduler's SIGTERM to the whole process group changes no result."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import preloaded
import pytest
import torch
from conftest import torch_threads
from test_first_hour import error_line, snapshot
from test_second_hour import DEMO

import bench
import eval as E
import train
from reward import RewardPool

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- item 1: --config never deletes


@pytest.fixture(scope="module")
def earlier_runs(tmp_path_factory) -> dict[str, Path]:
    """A demo run (the demo preset replaces its own earlier output) and a sweep's run folder
    (OUT/<run>/seed-<s>/, as research.experiments lays them out), each cut to one step."""
    root = tmp_path_factory.mktemp("earlier")
    runs = {"demo": root / "runs" / "demo", "sweep": root / "sweeps" / "demo-tiny" / "mix-0.1" / "seed-0"}
    with torch_threads(1):
        for out in runs.values():
            train.main([*DEMO, "--out-dir", str(out)])
    return runs


@pytest.mark.parametrize("which", ["demo", "sweep"])
def test_a_run_started_from_a_saved_config_leaves_the_run_it_came_from(earlier_runs, which, tmp_path, capsys):
    out = earlier_runs[which]
    before = snapshot(out)
    saved = str(out / "config.json")
    # README's `--config OUT/config.json`: without an --out-dir of its own the new run is refused, not run there
    message = error_line(train.main, ["--config", saved, "--max-steps", "3"], capsys)
    assert "--out-dir of its own" in message and "--resume" in message
    # named explicitly, the folder is another run's: refused as such (the saved preset is not this run's preset)
    message = error_line(train.main, ["--config", saved, "--out-dir", str(out), "--max-steps", "3"], capsys)
    assert "holds checkpoints of an earlier run" in message
    assert snapshot(out) == before  # byte for byte
    # with an --out-dir of its own it runs, from the saved settings
    new = tmp_path / "new"
    with torch_threads(1):
        train.main(["--config", saved, "--out-dir", str(new), "--max-steps", "1"])
    started = json.loads((new / "config.json").read_text())
    assert started["preset"] == "" and started["data"] == json.loads(before["config.json"])["data"]
    assert snapshot(out) == before


# ----------------------------------------------------------------------------- item 3: --resume keeps the summary


def test_resume_keeps_what_the_runs_start_found(tmp_path, capsys):
    out = tmp_path / "run"
    with torch_threads(1):
        train.main([*DEMO, "--out-dir", str(out), "--save-every", "1"])
        first = json.loads((out / "summary.json").read_text())
        assert {"accuracy_before", "warm_start_steps", "warm_start_dev_accuracy", "accuracy_after"} <= first.keys()
        capsys.readouterr()
        train.main([*DEMO, "--out-dir", str(out), "--save-every", "1", "--max-steps", "2", "--resume"])
    resumed = json.loads((out / "summary.json").read_text())
    for key in ("accuracy_before", "warm_start_steps", "warm_start_dev_accuracy", "prompts", "prompts_dropped"):
        assert resumed[key] == first[key], key
    assert resumed["steps"] == 2
    printed = capsys.readouterr().out
    assert f"(before: {first['accuracy_before']:.3f}" in printed  # the final line keeps its gain


def test_summary_is_written_when_the_run_has_begun(tmp_path, monkeypatch):
    """A run stopped after its start (here: at its first step) has a summary with what its start found."""
    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "collect_groups", stop)
    with torch_threads(1), pytest.raises(KeyboardInterrupt):
        train.run(train.parse_config([*DEMO, "--out-dir", str(tmp_path / "run")]))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {"accuracy_before", "warm_start_steps"} <= summary.keys() and "accuracy_after" not in summary


# ----------------------------------------------------------------------------- item 4: a refused run writes nothing

TINY = ["--preset", "tiny", "--prompts-per-step", "4", "--mini-batch-prompts", "4", "--max-new-tokens", "8",
        "--max-steps", "1"]


@pytest.mark.parametrize("bad", ["reward", "grader", "report-to"])
def test_a_run_refused_by_a_failing_check_writes_nothing_and_the_corrected_rerun_runs(bad, tmp_path, capsys,
                                                                                     monkeypatch):
    out = tmp_path / "run"
    if bad == "reward":
        flags = ["--reward", str(tmp_path / "missing.py") + ":score"]
    elif bad == "grader":  # math-verify is not installed (hidden: None in sys.modules fails its import)
        monkeypatch.setitem(sys.modules, "math_verify", None)
        flags = ["--grader", "math-verify"]
    else:  # a tracking package that is not installed
        monkeypatch.setitem(sys.modules, "wandb", None)
        flags = ["--report-to", "wandb"]
    message = error_line(train.main, [*TINY, "--out-dir", str(out), *flags], capsys)
    assert message.startswith("error: ")
    assert not out.exists() or not any(out.iterdir()), sorted(p.name for p in out.iterdir())
    monkeypatch.undo()
    with torch_threads(1):
        train.main([*TINY, "--out-dir", str(out)])  # the corrected command: not refused as "holds an earlier run"
    assert (out / "summary.json").exists()


# ----------------------------------------------------------------------------- item 2: a scheduler's SIGTERM

# A reward that takes its time (so that a signal lands while answers are graded) and says when it starts grading.
SLOW_REWARD = '''
import os, time
from pathlib import Path

def score(response, reference):
    Path(os.environ["NGRPO_TEST_GRADING"]).touch()
    time.sleep(0.2)
    return float(len(response) % 2)
'''


def train_command(out: Path, reward: Path, steps: int, *extra) -> list[str]:
    return [sys.executable, str(ROOT / "train.py"), *TINY[:-2], "--max-steps", str(steps), "--save-every", "1",
            "--reward", f"{reward}:score", "--out-dir", str(out), *extra]


def test_sigterm_to_the_process_group_while_grading_changes_no_result(tmp_path):
    """As SLURM, `timeout` and most launchers do, the signal goes to the whole process group (the reward's
    workers too) while answers are being graded: the step's answers are still all graded, the run stops after
    the step with a checkpoint, and resumed it ends with the weights of an uninterrupted run (one thread)."""
    reward = tmp_path / "slow_reward.py"
    reward.write_text(SLOW_REWARD)
    grading = tmp_path / "grading"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NGRPO_TEST_GRADING": str(grading)}
    straight = preloaded.run(train_command(tmp_path / "straight", reward, 2), env=env, capture_output=True,
                             text=True, timeout=300)
    assert straight.returncode == 0, straight.stderr[-2000:]
    grading.unlink()
    out = tmp_path / "cut"
    process = preloaded.Popen(train_command(out, reward, 2), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)  # a group of its own
    deadline = time.monotonic() + 120
    while not grading.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert grading.exists(), "the run never graded"
    os.killpg(process.pid, signal.SIGTERM)  # the whole group: train.py and its reward workers
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 143 and "Traceback" not in stderr, stderr[-2000:]
    assert "reward error" not in stderr and "died" not in stderr, stderr[-2000:]  # no answer lost its grade
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics and all(m["reward_errors"] == 0 for m in metrics)
    resumed = preloaded.run(train_command(out, reward, 2, "--resume"), env=env, capture_output=True, text=True,
                            timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (out / "checkpoints" / "step-2" / "model.safetensors").read_bytes() == \
        (tmp_path / "straight" / "checkpoints" / "step-2" / "model.safetensors").read_bytes()


def test_the_reward_workers_are_not_in_the_programs_process_group():
    """What makes the test above hold: a signal to the program's group does not reach its grading workers, which
    end with the program instead (their input closes)."""
    with RewardPool(num_workers=1, timeout_s=5.0) as pool:
        pool.equal([(["x+1"], "1+x")], 5.0)  # undecided by the fast rules: starts a worker
        workers = [worker.process.pid for worker in pool._workers]
        assert workers and all(os.getpgid(pid) != os.getpgid(0) for pid in workers)


# ----------------------------------------------------------------------------- item 5: one line, the real cause


@pytest.mark.parametrize("argv, expected", [
    (["--lr", "1e30"], "--lr 1e30: must be in (0, 1]"),  # a typo of 1e-6 that would blow up the weights
    (["--sft-lr", "5"], "--sft-lr 5: must be in (0, 1]"),
    (["--instruction", "\udcff"], "--instruction"),  # a non-UTF-8 argument arrives holding a lone surrogate
    (["--plan", "--plan-gpus", "-3"], "--plan-gpus -3: must be at least 1"),
    (["--plan", "--plan-gpu-gb", "0"], "--plan-gpu-gb 0.0: must be above 0"),
])
def test_values_no_run_can_use_are_one_line(argv, expected, capsys):
    assert expected in error_line(train.main, [*TINY, *argv], capsys)


def test_a_reader_that_stops_early_ends_the_printout_quietly():
    """`train.py --print-config | head`: the pipe closes before everything is written; no traceback."""
    for flag in ("--print-config", "--help"):
        process = subprocess.Popen([sys.executable, str(ROOT / "train.py"), flag], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        process.stdout.close()  # the reader is gone before the first line
        stderr = process.stderr.read()
        assert process.wait(timeout=60) == 0 and stderr == "", (flag, stderr)


def test_sigterm_during_the_warm_start_says_what_happened(tmp_path):
    process = preloaded.Popen([sys.executable, str(ROOT / "train.py"), *DEMO, "--sft-steps", "100000",
                                "--sft-target-accuracy", "0", "--out-dir", str(tmp_path / "run")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    for line in process.stderr:  # the warm start's progress, in a log's form (stderr is a pipe): after ~15 s
        if line.startswith("warm start"):
            break
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143 and "Traceback" not in stderr
    assert "interrupted before the first checkpoint; nothing to resume" in stderr.splitlines(), stderr[-1000:]


# ----------------------------------------------------------------------------- item 6: what a user sees


def test_the_final_line_counts_the_steps_it_averages(tmp_path, capsys):
    with torch_threads(1):
        train.main([*TINY[:-2], "--max-steps", "2", "--out-dir", str(tmp_path / "run")])
    assert "(last 2)" in capsys.readouterr().out


# ----------------------------------------------------------------------------- the sweep runner


def test_a_sweeps_dry_run_checks_every_commands_flags(tmp_path):
    from research import experiments

    sweep = {"preset": "dmeo", "train": {"max_steps": 1}, "eval": {"benchmarks": "arith:n=4", "n": 1},
             "runs": [{"name": "a"}]}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(sweep))
    with pytest.raises(experiments.SweepError, match="train.py: argument --preset: invalid choice: 'dmeo'"):
        experiments.run_sweep(experiments.load_sweep(path), tmp_path / "out", dry_run=True)
    path.write_text(json.dumps({**sweep, "preset": "tiny", "eval": {"benchmarks": "arith:n=4", "n": 0}}))
    with pytest.raises(experiments.SweepError, match="eval.py: --n 0: must be at least 1"):
        experiments.run_sweep(experiments.load_sweep(path), tmp_path / "out", dry_run=True)
    assert not (tmp_path / "out").exists()


def test_ctrl_c_stops_a_sweep_in_one_line_and_the_same_command_continues_it(tmp_path):
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"preset": "tiny", "train": {"max_steps": 200, "prompts_per_step": 4,
                                                             "mini_batch_prompts": 4, "max_new_tokens": 8},
                                 "eval": {"benchmarks": "arith:n=4", "n": 1}, "runs": [{"name": "a"}]}))
    command = [sys.executable, "-m", "research.experiments", str(sweep), "--out-dir", str(tmp_path / "out")]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as in a terminal
    said = process.stdout.readline()
    assert "train: running (log: " in said, said  # it says what runs, and where its log is
    log = Path(said.split("(log: ")[1].rstrip(")\n"))
    deadline = time.monotonic() + 120
    while "step 1 " not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole foreground group
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130 and "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines()[-1].startswith("interrupted; run the same command again to continue")



@pytest.mark.parametrize("status", [130, 143])
def test_a_step_stopped_by_a_signal_stops_the_sweep_as_interrupted_not_failed(tmp_path, status):
    """A step that exits 130 / 143 (it got Ctrl-C or SIGTERM and checkpointed) while the sweep itself did not get
    the signal (another process group, or SIGINT ignored by the shell that started it): interrupted, not failed."""
    from research import experiments

    step = [sys.executable, "-c", f"import sys; sys.exit({status})"]
    with pytest.raises(KeyboardInterrupt):
        experiments.run_step(step, tmp_path / "run", "done.txt", "train.log", "checkpoints/step-*")
    with pytest.raises(experiments.SweepError, match="failed \\(exit 3\\)"):  # any other status is a failure
        experiments.run_step([sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path / "other", "done.txt",
                             "train.log", "checkpoints/step-*")

# ----------------------------------------------------------------------------- eval.py: the real cause, the file

EVAL = ["--model", "tiny", "--benchmarks", "arith", "--limit", "3", "--n", "2", "--max-new-tokens", "4"]


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("eval") / "run"
    with torch_threads(1):
        E.main([*EVAL, "--out-dir", str(out)])
    return out


@pytest.mark.parametrize("damage", ["a line that is not a sample", "bytes that are not text", "settings"])
def test_a_resume_over_damaged_files_names_the_file(evaluation, damage, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(evaluation, out)
    if damage == "settings":
        (out / "settings.json").write_text('{"n": ')
    elif damage == "bytes that are not text":
        (out / "samples.jsonl").write_bytes(b"\xff\xfe\x00")
    else:
        (out / "samples.jsonl").write_text("[1, 2]\n" + (evaluation / "samples.jsonl").read_text())
    message = error_line(E.main, [*EVAL, "--out-dir", str(out), "--resume"], capsys)
    name = "settings.json" if damage == "settings" else "samples.jsonl"
    assert f"{out / name}" in message and "--overwrite" in message, message


def test_a_mistyped_run_folder_is_not_taken_for_a_hub_id(tmp_path, capsys, monkeypatch):
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    message = error_line(E.main, ["--model", "runs/dmeo", "--benchmarks", "arith", "--limit", "1"], capsys)
    assert "runs/dmeo: no such checkpoint directory (runs/ holds: demo" in message, message
    assert "did not answer" not in message


def test_a_training_runs_folder_before_its_first_checkpoint_says_so(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model": "tiny", "out_dir": str(out), "preset": "tiny"}))
    message = error_line(E.main, ["--model", str(out), "--benchmarks", "arith", "--limit", "1"], capsys)
    assert "is a training run's folder" in message and "no checkpoint yet" in message, message


def test_a_benchmark_named_twice_is_one_line_not_an_empty_bar(tmp_path, capsys):
    """Two files of one name would be one benchmark in results.json, samples.jsonl and the progress bars."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "sums.jsonl").write_text('{"problem": "1 + 1?", "answer": "2"}\n')
    a, b = tmp_path / "a" / "sums.jsonl", tmp_path / "b" / "sums.jsonl"
    for specs in (f"{a},{a}", f"{a},{b}"):
        message = error_line(E.main, ["--model", "tiny", "--benchmarks", specs, "--out-dir", str(tmp_path / "out")],
                             capsys)
        assert "are both the benchmark 'sums'" in message, message
        assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- bench.py: one line, and one unit


@pytest.mark.parametrize("argv, expected", [
    (["rollout-grid"], None),  # its default device on a machine without one
    (["manifest", "--gb", "-1"], "argument --gb: -1.0: must be a finite number above 0"),
    (["manifest", "--repeats", "0"], "argument --repeats: 0: must be at least 1"),
    (["grader", "--responses", "0"], "argument --responses: 0: must be at least 1"),
    (["rollout", "--new-tokens", "-3"], "argument --new-tokens: -3: must be at least 1"),
    (["train", "--seq-len", "0"], "argument --seq-len: 0: must be at least 1"),
    (["rollout-grid", "--device", "cpu", "--budget-s", "-1"], "argument --budget-s: -1.0: must be a finite number"),
])
def test_bad_benchmark_arguments_are_one_line(argv, expected, capsys):
    """bench.py's main in this process (argparse's exit status 2; a traceback would be an exception here)."""
    with pytest.raises(SystemExit) as stopped:
        bench.main(argv)
    stderr = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in stderr, stderr[-2000:]
    last = stderr.strip().splitlines()[-1]
    if expected is None:
        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU: rollout-grid's default device exists")
        expected = "argument --device: --device cuda: this torch build"
    assert expected in last, last


def test_a_benchmarks_inner_process_dies_with_it(tmp_path):
    """kill -9 of a benchmark leaves no inner process running on alone (benchmarks.common.dies_with_parent)."""
    script = ("import subprocess, sys, time\nfrom benchmarks.common import dies_with_parent\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
              "preexec_fn=dies_with_parent)\nprint(child.pid, flush=True)\ntime.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{child}/stat") as stat:
            if stat.read().split()[2] == "Z":  # killed, not yet reaped by init
                return
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    pytest.fail("the inner process outlived its benchmark")


def test_a_plots_legend_counts_seeds_not_runs(tmp_path):
    from research import plot

    runs = [{"dir": tmp_path / f"r{i}", "config": {"explore": "neighbor", "seed": 0, "out_dir": f"r{i}"},
             "history": {}} for i in range(3)]
    assert [label for label, _ in plot.group_runs(runs)][0].endswith("(3 runs, 1 seed)")
    runs = [{**run, "config": {**run["config"], "seed": i}} for i, run in enumerate(runs)]
    assert [label for label, _ in plot.group_runs(runs)][0].endswith("(3 seeds)")
