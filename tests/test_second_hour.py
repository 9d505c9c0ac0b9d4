"""What a new user meets right after the demo (issue 35): a preset never deletes another run and an overwrite
leaves nothing of the earlier one; eval.py stops on Ctrl-C / SIGTERM like train.py and resumes from the
printed command; a hub id on a machine without the hub fails at once in one line; eval.py takes a training
run's folder and the built-in arith sets; checkpoints follow the umask; --help shows what a run uses."""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import preloaded
import pytest
import torch
from conftest import torch_threads
from test_first_hour import error_line, snapshot

import data
import eval as E
import neighbors
import train
from research import experiments
from runtime import tracking

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--preset", "tiny", "--prompts-per-step", "4", "--mini-batch-prompts", "4", "--max-new-tokens", "8"]
# A run of another preset (the demo's, cut to seconds) that writes every kind of output: a warm start,
# completions, held-out accuracy, checkpoints.
DEMO = ["--preset", "demo", "--data", "arith:max_count=5,n=100", "--sft-steps", "1", "--sft-batch-size", "4",
        "--sft-eval-every", "1", "--sft-dev-problems", "4", "--eval-problems", "4", "--eval-every", "0",
        "--prompts-per-step", "4", "--mini-batch-prompts", "4", "--max-new-tokens", "8",
        "--log-completions-every", "1", "--max-steps", "1"]


# ----------------------------------------------------------------------------- nothing deleted unasked


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> Path:
    """The outputs of a run of the demo preset (each test copies them)."""
    out = tmp_path_factory.mktemp("demo") / "run"
    train.main([*DEMO, "--out-dir", str(out)])
    return out


def test_a_preset_run_never_deletes_another_run(tmp_path, capsys, demo_run):
    out = tmp_path / "my-real-run"
    shutil.copytree(demo_run, out)
    assert {"completions.jsonl", "warm_start", "checkpoints", "summary.json"} <= {p.name for p in out.iterdir()}
    (out / ".lock").write_text("train.py, pid 1\n")  # as another process's run left it
    before = snapshot(out)
    message = error_line(train.main, [*TINY, "--max-steps", "1", "--out-dir", str(out)], capsys)
    assert message.startswith(f"error: {out} holds checkpoints of an earlier run (latest: step-1)")
    assert "--overwrite" in message and "--resume" in message
    assert snapshot(out) == before  # not a byte changed


def test_an_overwrite_deletes_the_whole_earlier_run(tmp_path, capsys, demo_run):
    out = tmp_path / "run"
    shutil.copytree(demo_run, out)
    (out / "notes.txt").write_text("mine")  # not the run's: stays
    capsys.readouterr()
    train.main([*TINY, "--max-steps", "1", "--out-dir", str(out), "--overwrite", "--save-every", "0"])
    assert "deleted the earlier run (checkpoints, config.json, metrics.jsonl, completions.jsonl, summary.json, " \
           "warm_start" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == [".lock", "checkpoints", "config.json", "metrics.jsonl",
                                                     "neighbors", "notes.txt", "summary.json"]
    assert [d.name for d in train.checkpoint_dirs(out)] == ["step-1"]
    assert json.loads((out / "config.json").read_text())["preset"] == "tiny"
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1]
    assert (out / "notes.txt").read_text() == "mine"


def test_a_preset_replaces_its_own_earlier_output_and_says_so(tmp_path, capsys):
    out = tmp_path / "tiny"
    train.main([*TINY, "--max-steps", "1", "--out-dir", str(out), "--log-completions-every", "1", "--seed", "1"])
    capsys.readouterr()
    train.main([*TINY, "--max-steps", "1", "--out-dir", str(out)])
    assert "the tiny preset replaces its own earlier output" in capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["seed"] == 0 and not (out / "completions.jsonl").exists()


def test_a_run_without_checkpoints_is_not_silently_replaced(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n')
    (out / "config.json").write_text(json.dumps({"preset": "grpo-1.5b"}))
    message = error_line(train.main, [*TINY, "--max-steps", "1", "--out-dir", str(out)], capsys)
    assert "holds an earlier run (config.json, metrics.jsonl; no checkpoint to resume)" in message
    assert (out / "metrics.jsonl").read_text() == '{"step": 1, "reward_mean": 0.5}\n'


# ----------------------------------------------------------------------------- eval.py stops like train.py


def eval_run(bench: Path, out_dir: Path) -> list[str]:
    """An evaluation of 6 problems x 4 samples in 12 batches: long enough to be interrupted in the middle."""
    return ["--model", "tiny", "--benchmarks", str(bench), "--n", "4", "--batch-size", "2", "--max-new-tokens", "32",
            "--out-dir", str(out_dir)]


def outcome(out_dir: Path) -> tuple[dict, dict]:
    """(results.json, every sample by (benchmark, problem, sample))."""
    samples = [json.loads(line) for line in (out_dir / "samples.jsonl").read_text().splitlines()]
    return (json.loads((out_dir / "results.json").read_text()),
            {(s["benchmark"], s["problem_id"], s["sample"]): s for s in samples})


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Path, tuple[dict, dict]]:
    """The benchmark file and the outcome of one whole evaluation of it (one thread, as the subprocesses run)."""
    root = tmp_path_factory.mktemp("eval")
    bench = root / "sums.jsonl"
    bench.write_text("".join(json.dumps({"problem": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)}) + "\n"
                             for i in range(6)))
    with torch_threads(1):
        E.main(eval_run(bench, root / "whole"))
    return bench, outcome(root / "whole")


SIGNALS = {"ctrl-c": signal.SIGINT, "sigterm": signal.SIGTERM}


def interrupt_and_resume(bench: Path, out: Path, signum: int) -> SimpleNamespace:
    """eval.py in a process of its own, sent `signum` once its first batch is written; then the command its last
    line prints, run as printed (a shell). Returns what the test judges: the interrupted process's exit status
    and stderr, the samples file as the interruption left it, whether results.json existed then, and the resumed
    command's process (None when no command was printed)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    process = preloaded.Popen([sys.executable, "eval.py", *eval_run(bench, out)], cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    samples = out / "samples.jsonl"
    while process.poll() is None and not (samples.exists() and samples.read_text().count("\n")):
        time.sleep(0.01)  # until the first batch is written
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    seen = SimpleNamespace(out=out, samples=samples, returncode=process.returncode, stderr=stderr,
                           kept_lines=len(samples.read_text().splitlines()) if samples.exists() else None,
                           results_existed=(out / "results.json").exists(), resumed=None)
    line = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if "continue with: " in line:
        seen.resumed = subprocess.run(line.split("continue with: ")[1], shell=True, cwd=ROOT, env=env, text=True,
                                      capture_output=True, timeout=120)
    return seen


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, uninterrupted) -> dict[str, SimpleNamespace]:
    """Signal name -> interrupt_and_resume of the uninterrupted fixture's benchmark, each in an out-dir with a
    space (the printed command must quote it). The two signals' processes are independent and run side by side
    (threads only wait on them): each spends most of its seconds importing on one core."""
    bench, _ = uninterrupted
    with ThreadPoolExecutor(len(SIGNALS)) as pool:
        futures = {name: pool.submit(interrupt_and_resume, bench, tmp_path_factory.mktemp(name) / "my eval", signum)
                   for name, signum in SIGNALS.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("name", list(SIGNALS))
def test_eval_stops_on_a_signal_and_the_printed_command_resumes_it_to_the_same_results(uninterrupted, interrupted,
                                                                                       name):
    _, whole = uninterrupted
    signum, seen = SIGNALS[name], interrupted[name]
    samples, stderr = seen.samples, seen.stderr
    assert seen.returncode == 128 + signum and "Traceback" not in stderr, stderr
    line = stderr.strip().splitlines()[-1]
    kept = int(line.removeprefix("interrupted: ").split()[0])
    assert line.startswith(f"interrupted: {kept} samples kept in {samples}; continue with: python eval.py ")
    assert 2 <= kept < 24 and seen.kept_lines == kept and not seen.results_existed
    resumed = seen.resumed
    assert resumed.returncode == 0, resumed.stderr
    assert outcome(seen.out) == whole


# ----------------------------------------------------------------------------- a hub id without the hub


@pytest.mark.hub
@pytest.mark.parametrize("hub", ["unreachable", "switched off"])
def test_a_hub_id_without_the_hub_fails_at_once_in_one_line_naming_what_to_pass(hub, tmp_path, shared_data):
    """The hub's address is a closed local port (nothing touches the network) and its cache an empty folder:
    huggingface_hub then fails as on a machine without the hub, or with HF_HUB_OFFLINE=1 (as many clusters set
    it) as on one that keeps it off. hf_hub_download (--plan's config.json) retried an unreachable hub for 27 s
    and transformers' AutoTokenizer for 49 s, each retry a line, before their errors; both must say at once, in
    one line, why and what to pass instead of the hub id. The test sets the switch itself: an HF_HUB_OFFLINE or
    TRANSFORMERS_OFFLINE of the shell that runs the tests changes nothing."""
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:1", "HF_HOME": str(tmp_path / "hf"),
           "OMP_NUM_THREADS": "1"}
    for switch in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # huggingface_hub reads either as "offline"
        env.pop(switch, None)
    if hub == "switched off":
        env["HF_HUB_OFFLINE"] = "1"
    why = {"unreachable": "the hub did not answer (ConnectError: [Errno 111] Connection refused)",
           "switched off": "HF_HUB_OFFLINE keeps the hub off"}[hub]
    refused = f"{why} and the local cache does not hold it"
    commands = {  # argv -> (exit status, the line)
        ("train.py", "--preset", "paper-7b", "--model", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "--plan"):
            (2, "--model deepseek-ai/DeepSeek-R1-Distill-Qwen-7B: deepseek-ai/DeepSeek-R1-Distill-Qwen-7B is a "
                f"Hugging Face hub id, but {refused}; pass a local checkpoint directory or its config.json"),
        ("eval.py", "--model", "tiny", "--tokenizer", "owner/tok", "--benchmarks",
         str(shared_data / "eval" / "aime24.jsonl"), "--out-dir", str(tmp_path / "k")):
            (1, f"--tokenizer owner/tok: owner/tok is a Hugging Face hub id, but {refused}; pass a local directory "
                "holding the tokenizer's files"),
    }
    running = {argv: preloaded.Popen([sys.executable, *argv], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env) for argv in commands}
    for argv, process in running.items():
        _, stderr = process.communicate(timeout=120)
        status, line = commands[argv]
        assert (process.returncode, stderr) == (status, f"error: cannot load {line} instead\n")
    assert not (tmp_path / "k").exists()  # nothing written


@pytest.mark.hub
def test_a_hub_id_under_hf_hub_offline_is_asked_for_once(tmp_path, capsys, monkeypatch):
    """snapshot_download replaced by what it raises under HF_HUB_OFFLINE=1 with nothing cached: train.py's
    memory check asked the hub, kept quiet about its answer and load_model asked again; now the first answer is
    the one line."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    asked = []

    def offline(repo_id, **kwargs):
        asked.append(repo_id)
        try:
            raise OfflineModeIsEnabled(f"Cannot reach https://huggingface.co/api/models/{repo_id}: offline mode")
        except OfflineModeIsEnabled as cause:
            raise LocalEntryNotFoundError("Cannot find an appropriate cached snapshot folder") from cause

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    message = error_line(train.main, [*TINY, "--model", "owner/name", "--out-dir", str(tmp_path / "t")], capsys)
    assert message == ("error: cannot load --model owner/name: owner/name is a Hugging Face hub id, but HF_HUB_OFFLINE "
                       "keeps the hub off and the local cache does not hold it; pass a local checkpoint directory "
                       "(config.json and *.safetensors), or 'tiny' instead") and asked == ["owner/name"]
    message = error_line(E.main, ["--model", "tiny", "--benchmarks", "aime24", "--out-dir", str(tmp_path / "e")],
                         capsys)
    assert message.endswith("pass the path of a local .jsonl / .json / .parquet file of its problems instead")
    assert asked == ["owner/name", "math-ai/aime24"]


# ----------------------------------------------------------------------------- evaluating what you trained


def test_eval_takes_a_training_runs_folder_and_the_built_in_arith_sets(tmp_path, capsys):
    run = tmp_path / "run"
    train.main([*TINY, "--max-steps", "2", "--save-every", "1", "--out-dir", str(run)])
    shutil.copytree(run / "checkpoints" / "step-1", run / "best")  # as --keep-best leaves it: step 1 was best
    (run / "best" / "best.json").write_text(json.dumps({"step": 1, "metric": "val/x/mean@2", "value": 0.25}))
    evaluate = ["--model", str(run), "--benchmarks", "arith:n=20", "--limit", "3", "--n", "2", "--max-new-tokens",
                "8", "--out-dir", str(tmp_path / "eval")]
    capsys.readouterr()
    E.main(evaluate)
    assert (f"note: --model {run} is a training run: evaluating its best checkpoint {run / 'best'} (step 1, "
            "val/x/mean@2 0.25)") in capsys.readouterr().err
    assert json.loads((tmp_path / "eval" / "settings.json").read_text())["model"] == str(run / "best")
    held_out = data.load_problems("arith:n=20", split="test", limit=3)  # the test split: never trained on
    results, samples = outcome(tmp_path / "eval")
    assert results["arith-n-20"]["problems"] == 3
    assert {(s["problem_id"], s["reference"]) for s in samples.values()} == {(p["id"], p["answer"]) for p in held_out}
    shutil.rmtree(run / "best")  # a run that keeps no best checkpoint: its latest
    args, cfg = E.parse_args(evaluate)
    assert cfg.model == args.model == str(run / "checkpoints" / "step-2")
    assert args.model_note == f"note: --model {run} is a training run: evaluating its latest checkpoint {cfg.model}"
    shutil.rmtree(run / "checkpoints")
    assert "without an intact checkpoint" in error_line(E.main, evaluate, capsys)


def test_evals_estimate_is_within_2x_of_the_time_it_takes(tmp_path, capsys, monkeypatch):
    """Batches on a clock of their own: the first 5 s (warm-up), then 1 s each, but every seventh 10 s (a row
    that runs to --max-new-tokens), the second among them: 145 s in all. The old estimate, the second batch's
    time x 60 batches, said 600 s."""
    clock = [0.0]
    seconds = [5.0] + [10.0 if i % 7 == 0 else 1.0 for i in range(59)]
    monkeypatch.setattr(E, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    def generate(prompts, seed, row_keys):
        clock[0] += seconds.pop(0)
        return ["\\boxed{1}"] * len(prompts), 3 * len(prompts)

    problems = [{"id": f"p{i}", "prompt_ids": [1, 2], "answer": "1"} for i in range(30)]
    E.evaluate([("sums", problems, "math")], generate, n=4, out_dir=tmp_path, batch_size=2,
               score_fn=lambda pairs, kind, name: [1] * len(pairs))
    total_s = clock[0]
    told = [line for line in capsys.readouterr().err.splitlines() if line.startswith("eval: ")]
    assert total_s == 145 and len(told) == 1, told
    said_s = told[0].split(" to go, ")[1].split(" in all")[0]
    minutes, _, rest = said_s.partition(" min ")
    said_s = 60 * int(minutes) + int(rest.removesuffix(" s"))
    assert total_s / 2 <= said_s <= 2 * total_s, told[0]


def test_long_phases_say_how_far_they_are_in_a_log_file(tmp_path, capsys, monkeypatch):
    """Where stderr is not a terminal (a log, a pipe: capsys here) tqdm draws nothing; the warm start, the
    neighbor table and the evaluation write a line every LOG_EVERY_S seconds (0 here: every state) and their
    last state."""
    monkeypatch.setattr(tracking, "LOG_EVERY_S", 0.0)
    bar = tracking.progress(total=3, desc="phase", unit="step")
    for _ in range(3):
        bar.update()
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    shown = [line.split("|")[0] for line in lines]  # tqdm's monitor thread may draw a state twice
    assert {"phase:  33%", "phase:  67%"} <= set(shown) and shown[-1] == "phase: 100%" and "3/3" in lines[-1]
    assert "\r" not in "".join(lines)
    train.main([*DEMO, "--max-steps", "1", "--out-dir", str(tmp_path / "run")])
    assert "warm start: 100%|" in capsys.readouterr().err
    tables = []
    monkeypatch.setattr(neighbors, "progress", lambda **kwargs: tables.append(kwargs) or
                        tracking.progress(**{**kwargs, "delay": 0}))
    neighbors.build_neighbor_table(torch.randn(300, 8), k=2, chunk_size=100)
    assert tables[0]["desc"] == "neighbor table" and "neighbor table: 100%|" in capsys.readouterr().err
    bench = tmp_path / "sums.jsonl"
    bench.write_text(json.dumps({"problem": "1 + 1?", "answer": "2"}) + "\n")
    E.main(["--model", "tiny", "--benchmarks", str(bench), "--n", "2", "--batch-size", "1", "--max-new-tokens", "4",
            "--out-dir", str(tmp_path / "eval")])
    assert "sums: 100%|" in capsys.readouterr().err


# ----------------------------------------------------------------------------- smaller things


def test_a_runs_files_follow_the_umask(tmp_path, capsys):
    """mkdtemp / mkstemp / safetensors made checkpoints 0700 and weights 0600: others on a shared machine could
    not read a model. Under umask 027 every directory of the run is 0750 and every file 0640."""
    out = tmp_path / "run"
    previous = os.umask(0o027)
    try:
        train.main([*TINY, "--sft-steps", "1", "--max-steps", "1", "--out-dir", str(out)])
    finally:
        os.umask(previous)
    assert {"warm_start", "checkpoints", "neighbors"} <= {p.name for p in out.iterdir()}
    modes = {str(p.relative_to(out)): p.stat().st_mode & 0o777 for p in [out, *out.rglob("*")]}
    assert {p: m for p, m in modes.items() if m != (0o750 if (out / p).is_dir() else 0o640)} == {}
    assert "random model" not in capsys.readouterr().out  # a warm-started tiny model can answer


def test_the_tiny_preset_says_why_its_reward_is_zero(tmp_path, capsys):
    train.main([*TINY, "--max-steps", "1", "--out-dir", str(tmp_path / "run")])
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("note: --model tiny is a random model") and "rewards stay at 0" in out[1]
    assert out[2].startswith("step 1 | reward 0.000")


@pytest.mark.parametrize("argv", [[], ["--preset", "tiny"], ["--preset", "grpo-7b", "--lr", "3e-6"]],
                         ids=["no-preset", "tiny", "grpo-7b"])
def test_help_shows_the_values_a_run_uses(capsys, monkeypatch, argv):
    """Each flag's default in --help is the value `--print-config` resolves for the same command line."""
    monkeypatch.setenv("COLUMNS", "2000")  # no wrapping inside a value
    with pytest.raises(SystemExit):
        train.main([*argv, "--print-config"])
    resolved = json.loads(capsys.readouterr().out)
    with pytest.raises(SystemExit):
        train.main([*argv, "--help"])
    text = capsys.readouterr().out
    options = [b.split("\n\n")[0] for b in re.split(r"\n  (?=--)", text)]  # one block per option
    for name, value in resolved.items():
        if name in ("preset", "lr"):  # --preset's own; a flag given shows the starting point's default
            continue
        flag = "--" + name.replace("_", "-")
        (block,) = [b for b in options if re.match(rf"{flag}\b(?!-)", b)]
        shown = re.search(r"\(default: (.*?)\)\s*$", " ".join(block.split())).group(1)
        assert shown == repr(value), (flag, shown, value)


def test_a_dry_run_writes_nothing(tmp_path, capsys):
    out = tmp_path / "sweep"
    experiments.main([str(ROOT / "sweeps" / "demo-tiny.json"), "--out-dir", str(out), "--dry-run"])
    printed = capsys.readouterr().out
    assert printed.count("train.py --preset demo") == 4 and "arith-n-200-max-count-5.jsonl" in printed
    assert not out.exists()
    commands = [shlex.split(line) for line in printed.splitlines() if line.startswith("  ")]
    assert len(commands) == 8  # each pasteable as printed: python, then a script that exists
    assert all(command[0] == "python" and Path(command[1]).is_file() for command in commands)
