"""The update benchmarks: `bench.py train --long-tail` at a tiny shape (the three kinds run and agree, the budget
pads less, packing not at all) and on its defaults, and `bench.py trl` skipping with a message when TRL is not
installed."""

import argparse
import json
import os
import sys
from pathlib import Path

import preloaded
import torch

from benchmarks import train as train_bench
from benchmarks import train_long_tail
from benchmarks import trl as trl_bench

ROOT = Path(__file__).resolve().parents[1]


def test_long_tail_update_bench_reports_every_kind_with_the_same_weights():
    done = preloaded.run([sys.executable, str(ROOT / "bench.py"), "train", "--long-tail", "--rows", "8",
                           "--new-tokens", "48", "--prompt-len", "20", "--repeats", "1"],
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    fixed, budget, packed, summary = [json.loads(line) for line in done.stdout.splitlines()]
    assert (fixed["kind"], budget["kind"], packed["kind"]) == ("fixed-rows", "token-budget", "packed")
    assert budget["micro_batch_tokens"] == packed["micro_batch_tokens"] == 4 * (20 + 48 - 1)  # the fixed rows' worst
    assert 0 == packed["padded_frac"] < budget["padded_frac"] < fixed["padded_frac"]
    assert summary["speedup"] > 0 and summary["packed_over_token_budget"] > 0
    assert summary["weights_max_abs_diff"] < 1e-5
    assert summary["metrics_max_rel_diff"] < 1e-4


def test_long_tail_update_bench_runs_on_the_defaults_of_bench_train(monkeypatch, tmp_path):
    """`python bench.py train --long-tail` as docs/micro-batches.md gives it: `bench.py train`'s defaults work on
    this path (--repeats stayed None there: a TypeError). The updates themselves are replaced by their records."""
    parser = argparse.ArgumentParser()
    train_bench.add_parser(parser.add_subparsers())
    args = parser.parse_args(["train", "--long-tail"])
    kinds = []

    def update(args, kind, save):
        kinds.append(kind)
        torch.save({"w": torch.zeros(2)}, save)
        return {"seconds": 1.0, "cpu_seconds": 1.0, "metrics": {"loss": 0.5}, "padded_frac": 0.2, "peak_mem_mb": 9.0}

    monkeypatch.setattr(train_long_tail, "run_child", update)
    args.run(args)
    assert kinds == ["fixed-rows", "token-budget", "packed", "packed", "token-budget", "fixed-rows"]  # alternating


def test_trl_bench_without_trl_skips_with_a_message(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "trl", None)  # import trl raises ImportError
    trl_bench.bench_trl(argparse.Namespace(side=None))
    captured = capsys.readouterr()
    assert captured.out == "" and "TRL is not installed (pip install trl); skipped" in captured.err
