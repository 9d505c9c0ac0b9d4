"""The fourth hour, as a new user meets it: a value that cannot work is refused in one line before anything is
written, and no command writes into a run, a checkpoint or a run's own folder other than through the run: each case
exits non-zero, names the flag, and leaves every existing run byte-identical (hashed before and after)."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import preloaded
import pytest

import eval as E
from config import preset
from runtime import guard

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--preset", "tiny", "--prompts-per-step", "4", "--mini-batch-prompts", "4", "--max-new-tokens", "6"]


def run_cli(*args):
    return preloaded.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def folder_hash(folder: Path) -> str:
    """SHA-256 over every file below `folder`: its path and its bytes, in path order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def one_line(result) -> str:
    """The error a refused command gives: its last line, with no traceback before it."""
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    return result.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    """A finished tiny run with adapters: one checkpoint, its config.json, metrics."""
    out = tmp_path_factory.mktemp("fourth") / "run"
    done = run_cli("train.py", *TINY, "--max-steps", "1", "--lora-rank", "4", "--out-dir", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.mark.parametrize("flags, message", [
    (["--lora-rank", "100000"], "--lora-rank 100000: must be at most 32, the smaller side of k_proj (64 -> 32) of "
                                "--model tiny: a higher rank adds nothing a full update would not"),
    (["--explore", "multiplex", "--multiplex-width", "100000"], "--multiplex-width 100000: must be at most the "
                                                                "vocabulary size of --model tiny (262)"),
    (["--explore", "multiplex", "--no-multiplex-replacement", "--multiplex-width", "1000"],
     "--multiplex-width 1000: must be at most the vocabulary size of --model tiny (262)"),
    (["--tokenizer", "no/such/tokenizer/dir"], "no/such/tokenizer/dir: no such tokenizer directory"),
])
def test_a_value_that_cannot_work_is_one_line_before_anything_is_written(tmp_path, flags, message):
    out = tmp_path / "new"
    line = one_line(run_cli("train.py", *TINY, "--out-dir", str(out), *flags))
    assert message in line and line.startswith("error:"), line
    assert not out.exists()


def test_the_lora_merge_writes_neither_into_the_run_nor_into_its_checkpoint(run_folder):
    before = folder_hash(run_folder)
    checkpoint = run_folder / "checkpoints" / "step-1"
    for out in (run_folder, checkpoint, run_folder / "checkpoints" / "merged"):
        line = one_line(run_cli("-m", "runtime.lora", str(checkpoint), str(out)))
        assert line.startswith("python -m runtime.lora: error:") and str(out) in line, line
    assert folder_hash(run_folder) == before


def test_no_run_starts_inside_another(run_folder):
    before = folder_hash(run_folder)
    line = one_line(run_cli("train.py", *TINY, "--out-dir", str(run_folder / "checkpoints")))
    assert line == f"error: --out-dir {run_folder / 'checkpoints'} is inside the run {run_folder}; pass an " \
                   "--out-dir of its own"
    assert folder_hash(run_folder) == before


def test_no_evaluation_writes_into_a_run_or_its_checkpoints(run_folder, tmp_path):
    before = folder_hash(run_folder)
    for out in (run_folder, run_folder / "checkpoints" / "step-1"):
        line = one_line(run_cli("eval.py", "--model", "tiny", "--benchmarks", "arith", "--limit", "1", "--n", "1",
                                "--max-new-tokens", "4", "--out-dir", str(out)))
        assert f"--out-dir {out} is the training run" in line, line
    assert folder_hash(run_folder) == before
    started = tmp_path / "started"  # a run's folder before its first checkpoint: its config.json alone
    started.mkdir()
    preset("tiny").save_json(started / "config.json")
    line = one_line(run_cli("eval.py", "--model", str(started), "--out-dir", str(tmp_path / "eval")))
    assert line.endswith(f"--model {started} is a training run's folder with no checkpoint yet; pass a checkpoint "
                         "directory, or evaluate the run once it has saved one")
    assert not (tmp_path / "eval").exists()


def test_a_resumed_run_from_its_config_keeps_its_preset(run_folder, tmp_path):
    copy = tmp_path / "copy"
    done = run_cli("train.py", *TINY, "--max-steps", "1", "--out-dir", str(copy))
    assert done.returncode == 0, done.stderr[-2000:]
    resumed = run_cli("train.py", "--config", str(copy / "config.json"), "--resume", "--max-steps", "2")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((copy / "config.json").read_text())["preset"] == "tiny"


def test_plan_and_print_config_are_one_or_the_other():
    line = one_line(run_cli("train.py", "--preset", "tiny", "--plan", "--print-config"))
    assert line.endswith("error: --print-config and --plan each print and exit: give one of them")


def test_the_manifest_bench_on_a_missing_folder_is_one_line(tmp_path):
    line = one_line(run_cli("bench.py", "manifest", "--dir", str(tmp_path / "missing")))
    assert line == f"error: --dir {tmp_path / 'missing'}: no such folder (the random files are written in it)"


def test_a_sigterm_while_eval_loads_says_so(monkeypatch, tmp_path, capsys):
    """SIGTERM's default ends a program without a word; before its first sample eval.py stops as on Ctrl-C."""
    monkeypatch.setattr(E, "run", lambda *args: os.kill(os.getpid(), signal.SIGTERM) or signal.pause())
    with pytest.raises(SystemExit) as stopped:
        E.main(["--model", "tiny", "--benchmarks", "arith", "--out-dir", str(tmp_path / "eval")])
    assert stopped.value.code == 128 + signal.SIGTERM
    assert capsys.readouterr().err.strip().endswith("interrupted before the first sample was written; nothing to "
                                                    "resume")
    assert signal.getsignal(signal.SIGTERM) is not guard.Terminated  # the handler is put back


def catches_sigterm(pid: int) -> bool:
    """Whether process `pid` has a handler for SIGTERM (Linux: SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_a_sigterm_while_eval_imports_torch_says_so(tmp_path):
    """A fresh interpreter (its imports take seconds): once eval.py has its SIGTERM handler, which it takes before
    importing torch, a SIGTERM ends it with the line Ctrl-C gives, not silently."""
    process = subprocess.Popen([sys.executable, "eval.py", "--model", "tiny", "--benchmarks", "arith", "--out-dir",
                                str(tmp_path / "eval")], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not catches_sigterm(process.pid) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.001)
    process.send_signal(signal.SIGTERM)
    _, errors = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM
    assert errors.strip().splitlines()[-1] == "interrupted before the first sample was written; nothing to resume"
    assert not (tmp_path / "eval").exists()
