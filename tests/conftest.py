"""Shared test fixtures and helpers: the repo root on sys.path, the ../shared/data location, CPU threads, and
scripts run side by side. NGRPO_HIDE_EXTRAS=1 hides the optional packages (tests/hide_extras/sitecustomize.py), as
on a machine with only requirements.txt installed."""

import json
import os
import runpy
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHARED_DATA = ROOT.parent / "shared" / "data"

HIDE_EXTRAS = ROOT / "tests" / "hide_extras"
if os.environ.get("NGRPO_HIDE_EXTRAS"):  # the optional packages unimportable here and in every process started
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HIDE_EXTRAS), os.environ.get("PYTHONPATH")]))
    runpy.run_path(str(HIDE_EXTRAS / "sitecustomize.py"))

# pytest-xdist (pyproject.toml's addopts: a worker per core, up to 4) runs test files side by side: each worker,
# and each process a test starts, computes on one thread, so that no thread spins waiting for a core another
# process holds. Without xdist (-p no:xdist, -n 0): two threads, as a 2-core machine gives a process.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


@pytest.fixture
def shared_data() -> Path:
    """../shared/data beside the repo; tests that need it skip when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


@contextmanager
def torch_threads(count: int):
    """torch's CPU threads set to `count` inside, put back after. One thread: sums in the same order run to run
    (bit-exact comparisons), as each process of a torchrun job here has (OMP_NUM_THREADS=1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def one_thread():
    with torch_threads(1):
        yield


def run_at_once(scripts: dict, timeout: float) -> dict:
    """key -> the JSON object that `python -c script` printed last, for each (key, [script, *args]) of `scripts`:
    all started at once, each a process of one thread (such runs spend much of their time starting, and a CPU
    has more than one core), then each judged: one that failed shows its stderr."""
    processes = {key: subprocess.Popen([sys.executable, "-c", *command], cwd=ROOT, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
                 for key, command in scripts.items()}
    outputs = {key: process.communicate(timeout=timeout) for key, process in processes.items()}  # all, then judge
    for key, (_, stderr) in outputs.items():
        assert processes[key].returncode == 0, f"{key}:\n{stderr[-3000:]}"
    return {key: json.loads(stdout.strip().splitlines()[-1]) for key, (stdout, _) in outputs.items()}
