"""The update benchmarks: `bench.py train --long-tail` at a tiny shape (both kinds run, agree, and the budget
pads less), and `bench.py trl` skipping with a message when TRL is not installed."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks import trl as trl_bench

ROOT = Path(__file__).resolve().parents[1]


def test_long_tail_update_bench_reports_both_kinds_with_the_same_weights():
    done = subprocess.run([sys.executable, str(ROOT / "bench.py"), "train", "--long-tail", "--rows", "8",
                           "--new-tokens", "48", "--prompt-len", "20", "--repeats", "1"],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    fixed, budget, summary = [json.loads(line) for line in done.stdout.splitlines()]
    assert (fixed["kind"], budget["kind"]) == ("fixed-rows", "token-budget")
    assert budget["micro_batch_tokens"] == 4 * (20 + 48 - 1)  # the fixed rows' worst case
    assert budget["padded_frac"] < fixed["padded_frac"]
    assert summary["speedup"] > 0 and summary["weights_max_abs_diff"] < 1e-5
    assert summary["metrics_max_rel_diff"] < 1e-4


def test_trl_bench_without_trl_skips_with_a_message(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "trl", None)  # import trl raises ImportError
    trl_bench.bench_trl(argparse.Namespace(side=None))
    captured = capsys.readouterr()
    assert captured.out == "" and "TRL is not installed (pip install trl); skipped" in captured.err
