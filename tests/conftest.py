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

import preloaded
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHARED_DATA = ROOT.parent / "shared" / "data"

HIDE_EXTRAS = ROOT / "tests" / "hide_extras"
if os.environ.get("NGRPO_HIDE_EXTRAS"):  # the optional packages unimportable here and in every process started
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HIDE_EXTRAS), os.environ.get("PYTHONPATH")]))
    runpy.run_path(str(HIDE_EXTRAS / "sitecustomize.py"))

# pytest-xdist (pyproject.toml's addopts, pytest_xdist_auto_num_workers below) runs test files side by side: each
# worker, and each process a test starts, computes on one thread, so that no thread spins waiting for a core another
# process holds. Without xdist (-p no:xdist, -n 0): two threads, as a 2-core machine gives a process.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)
preloaded.BASE_ENV = dict(os.environ)  # what every test starts from: the preloaded interpreter's environment


# pytest-xdist hands test files to its workers in this order (addopts: --no-loadscope-reorder), then the rest as
# collected: the files whose processes run longest start first, so that they overlap the many quick files instead of
# running on alone at the end (the demo's warm start and learning run alone take ~1.5 minutes of one core).
LONGEST_FIRST = ("test_train.py", "test_distributed.py", "test_documented_commands.py", "test_third_hour.py",
                 "test_second_hour.py", "test_reliability.py", "test_plan.py", "test_first_hour.py")


def pytest_collection_modifyitems(items) -> None:
    order = {name: rank for rank, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: order.get(item.path.name, len(order)))  # a stable sort: the rest keep their order


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject.toml's addopts): a worker per core and one more, up to 4, as many tests wait on a
    process (a signal's effect, a job's ranks) and a core would idle while they do."""
    return min(4, (os.cpu_count() or 1) + 1)


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
    processes = {key: preloaded.Popen([sys.executable, "-c", *command], cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
                 for key, command in scripts.items()}
    outputs = {key: process.communicate(timeout=timeout) for key, process in processes.items()}  # all, then judge
    for key, (_, stderr) in outputs.items():
        assert processes[key].returncode == 0, f"{key}:\n{stderr[-3000:]}"
    return {key: json.loads(stdout.strip().splitlines()[-1]) for key, (stdout, _) in outputs.items()}


def script_think_ends(monkeypatch, think_at: list, think_end: int, eos: int, vocab: int = 64) -> list[float]:
    """Replaces the logits every decode step samples from (rollout.Sampler's input) by a script: graded over the
    vocabulary (never </think> or EOS), or sure of </think> where a row's response position is its entry of think_at
    (None: never; rows by their row key). Returns the graded logits, a test's brute-force reference."""
    import rollout

    graded = [-0.15 * v for v in range(vocab)]
    graded[think_end] = graded[eos] = -1e4
    think = [0.0] * vocab
    think[think_end], think[eos] = 30.0, -1e4
    real_call = rollout.Sampler.__call__

    def scripted(self, logits, state, live, backend=None):
        at = torch.tensor([-1 if t is None else t for t in think_at])[state.key.clamp(0, len(think_at) - 1)]
        return real_call(self, torch.tensor([graded, think])[(state.length == at).long()], state, live, backend)

    monkeypatch.setattr(rollout.Sampler, "__call__", scripted)
    return graded
