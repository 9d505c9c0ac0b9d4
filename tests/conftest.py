"""Shared test fixtures and helpers: the repo root on sys.path, the ../shared/data location, CPU threads, and
scripts run side by side (now, or started as soon as the tests to run are collected)."""

import json
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHARED_DATA = ROOT.parent / "shared" / "data"

torch.set_num_threads(2)


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


class Background:
    """Scripts (key -> [script, *args], each run as `python -c script args`) started at once, each a process of one
    thread (such runs spend much of their time starting, and a CPU has more than one core); `results` waits for
    all of them, then judges each: one that failed shows its stderr."""

    def __init__(self, scripts: dict):
        self.processes = {key: subprocess.Popen([sys.executable, "-c", *command], cwd=ROOT, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, text=True,
                                                env={**os.environ, "OMP_NUM_THREADS": "1"})
                          for key, command in scripts.items()}

    def results(self, timeout: float) -> dict:
        """key -> the JSON object that its script printed last."""
        outputs = {key: process.communicate(timeout=timeout) for key, process in self.processes.items()}
        for key, (_, stderr) in outputs.items():
            assert self.processes[key].returncode == 0, f"{key}:\n{stderr[-3000:]}"
        return {key: json.loads(stdout.strip().splitlines()[-1]) for key, (stdout, _) in outputs.items()}

    def stop(self) -> None:
        for process in self.processes.values():
            process.kill()
            process.communicate()


def run_at_once(scripts: dict, timeout: float) -> dict:
    """key -> the JSON object that `python -c script` printed last, for each (key, [script, *args]) of `scripts`:
    all started at once, then each judged (Background)."""
    return Background(scripts).results(timeout)


# Long runs a fixture needs, started as soon as the tests to run are known, so that they go on beside the rest
# of the suite (a fixture's processes otherwise hold the suite up while they run: the demo's take ~3 minutes):
# fixture name -> a function giving its scripts (run_at_once's). started_early(name) waits for their results.
EARLY_STARTS: dict[str, Callable[[], dict]] = {}
_STARTED: dict[str, Background] = {}


def pytest_collection_finish(session):
    wanted = {name for item in session.items for name in getattr(item, "fixturenames", ()) if name in EARLY_STARTS}
    for name in sorted(wanted):
        _STARTED[name] = Background(EARLY_STARTS[name]())


def started_early(name: str, timeout: float) -> dict:
    """The results of the scripts EARLY_STARTS[name] gives, started at collection (or now, if they were not)."""
    background = _STARTED.pop(name, None) or Background(EARLY_STARTS[name]())
    return background.results(timeout)


def pytest_sessionfinish(session, exitstatus):
    for background in _STARTED.values():  # started, but the tests that wanted them did not run (-x, Ctrl-C)
        background.stop()
