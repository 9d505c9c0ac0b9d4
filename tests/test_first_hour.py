"""The mistakes a new user makes in the first hour, each ending in one line that names the flag or file and
says what to do (no traceback), and losing nothing: a refused or interrupted run leaves the earlier outputs as
they were. In-process through train.main / eval.main (argparse errors exit 2, run errors exit with the
message); the exit status, the absence of a traceback and Ctrl-C are checked in real subprocesses."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import preloaded
import pytest
import torch

import data
import eval as E
import model as M
import ngrpo
import train

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--preset", "tiny", "--prompts-per-step", "4", "--mini-batch-prompts", "4", "--max-new-tokens", "8"]


def error_line(main, argv, capsys) -> str:
    """Runs main(argv), which must stop with an error; returns its message after checking it is one line
    and no traceback was printed."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    code, err = stopped.value.code, capsys.readouterr().err
    assert code not in (0, None)
    assert "Traceback" not in err
    message = code if isinstance(code, str) else err.strip().splitlines()[-1]
    assert "\n" not in message.strip()
    return message


def snapshot(directory: Path) -> dict:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- train.py


def test_out_dir_that_is_a_file(tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("mine")
    for main, args in ((train.main, TINY), (E.main, ["--model", "tiny", "--benchmarks", "x.jsonl"])):
        assert "is a file" in error_line(main, [*args, "--out-dir", str(target)], capsys)
    assert target.read_text() == "mine"


def test_corrupt_safetensors_names_the_file(tmp_path, capsys):
    checkpoint = tmp_path / "ckpt"
    M.save_model(M.random_model(M.TINY_CONFIG), checkpoint, data.tiny_tokenizer())
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    message = error_line(train.main, [*TINY, "--model", str(checkpoint), "--out-dir", str(tmp_path / "run")], capsys)
    assert "--model" in message and str(weights) in message
    message = error_line(E.main, ["--model", str(checkpoint), "--benchmarks", "x.jsonl",
                                  "--out-dir", str(tmp_path / "ev")], capsys)
    assert str(weights) in message or "x.jsonl" in message  # the benchmark file is read first: also one line


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch sees a GPU")
def test_device_cuda_without_a_gpu(tmp_path, capsys):
    assert "no CUDA GPU" in error_line(train.main, [*TINY, "--device", "cuda", "--out-dir", str(tmp_path / "r")],
                                       capsys)
    assert "no CUDA GPU" in error_line(E.main, ["--model", "tiny", "--device", "cuda", "--out-dir",
                                                str(tmp_path / "e")], capsys)


def test_missing_eval_data(tmp_path, capsys):
    message = error_line(train.main, [*TINY, "--eval-data", str(tmp_path / "nope.jsonl"), "--eval-problems", "4",
                                      "--out-dir", str(tmp_path / "run")], capsys)
    assert "--eval-data" in message and "nope.jsonl" in message
    assert not (tmp_path / "run").exists()


def test_corrupt_config_json_names_the_file(tmp_path, capsys):
    broken = tmp_path / "config.json"
    broken.write_text('{"lr": 1e-6,')
    assert str(broken) in error_line(train.main, ["--config", str(broken)], capsys)
    broken.write_text('{"group_size": "four"}')
    message = error_line(train.main, ["--config", str(broken)], capsys)
    assert str(broken) in message and "group_size must be int" in message


def test_problem_with_a_lone_surrogate_names_file_and_line(tmp_path, capsys):
    path = tmp_path / "problems.jsonl"
    path.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "x \\ud800 y", "answer": "3"}\n')
    message = error_line(train.main, [*TINY, "--data", str(path), "--out-dir", str(tmp_path / "run")], capsys)
    assert f"{path}:2" in message and "surrogate" in message


def test_max_new_tokens_whose_kv_cache_cannot_fit(tmp_path, capsys):
    message = error_line(train.main, [*TINY, "--max-new-tokens", str(10**9), "--out-dir", str(tmp_path / "run")],
                         capsys)
    assert "KV cache" in message and "--max-new-tokens" in message


def test_data_that_is_a_directory(tmp_path, capsys):
    message = error_line(train.main, [*TINY, "--data", str(tmp_path), "--out-dir", str(tmp_path / "run")], capsys)
    assert "--data" in message and "is a directory" in message


@pytest.mark.parametrize("flags, named", [(["--group-size", "1"], "--group-size 1: must be at least 2"),
                                          (["--temperature", "0"], "--temperature 0: greedy decoding")])
def test_settings_that_cannot_learn(tmp_path, capsys, flags, named):
    assert named in error_line(train.main, [*TINY, *flags, "--out-dir", str(tmp_path / "run")], capsys)


def test_a_non_finite_loss_is_reported_when_it_happens(tmp_path, capsys, monkeypatch):
    real, calls = ngrpo.policy_loss, []

    def first_is_nan(*args, **kwargs):
        calls.append(1)
        loss, metrics = real(*args, **kwargs)
        return (loss * float("nan") if len(calls) == 1 else loss), metrics

    monkeypatch.setattr(ngrpo, "policy_loss", first_is_nan)
    train.main([*TINY, "--max-steps", "1", "--out-dir", str(tmp_path / "run")])
    assert "warning: step 1: 1 mini-batch(es) skipped: non-finite loss" in capsys.readouterr().err


def test_resume_with_changed_settings_refuses_unless_told(tmp_path, capsys):
    run = [*TINY, "--out-dir", str(tmp_path / "run"), "--save-every", "1"]
    train.main([*run, "--max-steps", "1"])
    before = snapshot(tmp_path / "run")
    message = error_line(train.main, [*run, "--max-steps", "2", "--resume", "--lr", "1e-3"], capsys)
    assert "--lr 0.0002 -> 0.001" in message and "--allow-config-change" in message
    assert snapshot(tmp_path / "run") == before  # nothing rewritten, nothing lost
    train.main([*run, "--max-steps", "2", "--resume"])  # more steps is not a change of settings
    train.main([*run, "--max-steps", "3", "--resume", "--lr", "1e-3", "--allow-config-change"])
    assert "continuing with changed settings: --lr 0.0002 -> 0.001" in capsys.readouterr().err
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def run_cli(args, **kwargs):
    return preloaded.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, **kwargs)


def run_clis_at_once(*commands) -> list[subprocess.CompletedProcess]:
    """run_cli of each command, all started at once (each spends seconds importing torch on one core), then
    each waited for: the same processes, arguments and environment as one after another."""
    started = [preloaded.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}) for args in commands]
    done = []
    for process in started:
        stdout, stderr = process.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    return done


def test_cli_errors_exit_non_zero_with_one_line(tmp_path):
    group_size, directory = run_clis_at_once(["train.py", *TINY, "--group-size", "1"],
                                             ["train.py", *TINY, "--data", str(tmp_path), "--out-dir",
                                              str(tmp_path / "run")])
    bad = group_size
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--group-size 1: must be at least 2" in bad.stderr
    bad = directory
    assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [
        f"error: cannot load --data {tmp_path}: {tmp_path} is a directory: pass one .jsonl / .json / .parquet file "
        "of problems"]


def test_ctrl_c_writes_a_checkpoint_and_says_how_to_resume(tmp_path):
    out = tmp_path / "run"
    args = ["train.py", *TINY, "--max-steps", "400", "--out-dir", str(out)]
    process = preloaded.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    for line in process.stdout:  # wait until training runs
        if line.startswith("step 1 "):
            break
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130 and "Traceback" not in stderr
    interrupted = [line for line in stderr.splitlines() if line.startswith("interrupted")]
    assert len(interrupted) == 1 and "--resume" in interrupted[0]
    step = int(interrupted[0].split("checkpoint of step ")[1].split()[0])
    assert [d.name for d in train.checkpoint_dirs(out)] == [f"step-{step}"]
    resumed = run_cli([*args, "--max-steps", str(step + 1), "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {out / 'checkpoints' / f'step-{step}'}" in resumed.stderr


# ----------------------------------------------------------------------------- eval.py


@pytest.fixture
def bench_file(tmp_path) -> Path:
    path = tmp_path / "bench.jsonl"
    path.write_text("".join(json.dumps({"problem": f"{i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(3)))
    return path


def eval_args(bench_file, out_dir, *extra):
    return ["--model", "tiny", "--benchmarks", str(bench_file), "--n", "2", "--max-new-tokens", "4",
            "--out-dir", str(out_dir), *extra]


@pytest.mark.parametrize("flag, value, named", [
    ("--n", "-3", "--n -3: must be at least 1"), ("--n", "0", "--n 0: must be at least 1"),
    ("--limit", "0", "--limit 0: must be at least 1"), ("--batch-size", "-1", "--batch-size -1: must be >= 0"),
    ("--top-p", "0", "--top-p 0: must be in (0, 1]"), ("--temperature", "-1", "--temperature -1: must be >= 0"),
    ("--max-new-tokens", "0", "--max-new-tokens 0: must be at least 1")])
def test_eval_flags_are_validated(tmp_path, capsys, bench_file, flag, value, named):
    assert named in error_line(E.main, [*eval_args(bench_file, tmp_path / "out"), flag, value], capsys)
    assert not (tmp_path / "out").exists()


def test_eval_records_its_settings_and_refuses_to_mix_two_evaluations(tmp_path, capsys, bench_file):
    out = tmp_path / "out"
    E.main(eval_args(bench_file, out))
    settings = json.loads((out / "settings.json").read_text())
    assert settings["n"] == 2 and settings["max_new_tokens"] == 4 and settings["model"] == "tiny"
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 6 and {s["reference"] for s in samples} == {"0", "2", "4"}
    before = snapshot(out)
    for changed, named in ((["--max-new-tokens", "16"], "--max-new-tokens 4 -> 16"), (["--n", "4"], "--n 2 -> 4"),
                           (["--instruction", ""], "--instruction \"Let's think step by step")):
        message = error_line(E.main, [*eval_args(bench_file, out), *changed, "--resume"], capsys)
        assert named in message
    assert "--resume" in error_line(E.main, eval_args(bench_file, out), capsys)  # no silent overwrite
    assert snapshot(out) == before
    E.main([*eval_args(bench_file, out), "--resume"])  # the same settings: resumes
    E.main([*eval_args(bench_file, out), "--n", "1", "--overwrite"])
    assert len((out / "samples.jsonl").read_text().splitlines()) == 3


@pytest.mark.hub
def test_a_hub_failure_names_the_argument_and_the_offline_way(tmp_path, capsys, monkeypatch):
    def unreachable(*args, **kwargs):
        raise OSError("Got: ConnectError('[Errno -3] Temporary failure in name resolution')")

    monkeypatch.setattr(data, "download_dataset", unreachable)
    message = error_line(E.main, ["--model", "tiny", "--benchmarks", "aime24", "--out-dir", str(tmp_path / "a")],
                         capsys)
    assert "--benchmarks aime24" in message and "HF_HUB_OFFLINE=1" in message
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def no_hub(*args, **kwargs):  # what snapshot_download raises when the hub does not answer
        raise LocalEntryNotFoundError("Got: ConnectError: [Errno -3] Temporary failure in name resolution\nAn error")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_hub)
    message = error_line(train.main, ["--preset", "tiny", "--model", "owner/name", "--tokenizer", "tiny",
                                      "--out-dir", str(tmp_path / "t")], capsys)
    assert message.startswith("error: cannot load --model owner/name: owner/name is a Hugging Face hub id, but the "
                              "hub did not answer (ConnectError: [Errno -3] Temporary failure in name resolution)")
    assert message.endswith("; pass a local checkpoint directory (config.json and *.safetensors), or 'tiny' instead")
