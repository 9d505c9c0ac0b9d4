"""The GPU rollout grid's arithmetic (benchmarks/rollout_grid.py): the memory floor of a decode step, counted
by hand from the architecture, and the budget that skips what would not fit instead of starting it."""

import json
import os
import sys
from pathlib import Path

import preloaded
import pytest
import torch

from benchmarks import rollout_grid
from benchmarks.common import SHARED_DATA
from model import ModelConfig, Transformer, random_model

ROOT = Path(__file__).resolve().parents[1]


def hand_count_bytes(cfg: ModelConfig, batch: int, window: int, element: int) -> int:
    """Weights read by one decode step (every matrix and vector but the input embedding, of which only the
    batch's rows), K and V of the window, fp32 logits written; from the config alone."""
    d, ffn = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * ffn + 2 * d  # q, k, v, o, gate / up / down, two norms
    per_layer += (q + 2 * kv) if cfg.qkv_bias else 0
    per_layer += 2 * cfg.head_dim if cfg.qk_norm else 0
    weights = cfg.num_layers * per_layer + d  # + the final norm
    weights += d * batch if cfg.tie_word_embeddings else cfg.vocab_size * d + d * batch
    cache = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * batch * window
    return (weights + cache) * element + batch * cfg.vocab_size * 4


def test_the_decode_floor_counts_what_a_step_must_move():
    cfg = ModelConfig(family="qwen2", vocab_size=1000, hidden_size=64, intermediate_size=96, num_layers=3,
                      num_heads=4, num_kv_heads=2, head_dim=16, qkv_bias=True)
    model = random_model(cfg, dtype=torch.bfloat16, seed=0)
    got = rollout_grid.step_bytes(model, batch=8, window=128)
    assert got["total"] == hand_count_bytes(cfg, 8, 128, 2)
    assert got["kv"] == 3 * 2 * 2 * 16 * 8 * 128 * 2


def test_the_real_shapes_floor_is_the_1_5b_without_its_input_embedding():
    path = SHARED_DATA / "tokenizers" / "DeepSeek-R1-Distill-Qwen-1.5B" / "config.json"
    if not path.is_file():
        pytest.skip("../shared/data is not present")
    cfg = ModelConfig.from_hf(json.loads(path.read_text()))
    with torch.device("meta"):  # shapes only: 1.78 B parameters never allocated
        model = Transformer(cfg).to(torch.bfloat16)
    got = rollout_grid.step_bytes(model, batch=64, window=512)
    assert got["total"] == hand_count_bytes(cfg, 64, 512, 2)
    # 1.78 B parameters, of which 0.23 B the input embedding: ~3.09 GB of weights read per step in bf16.
    assert 3.0e9 < got["weights"] < 3.2e9


def test_the_grid_skips_what_its_budget_cannot_fit_and_says_so():
    command = [sys.executable, "bench.py", "rollout-grid", "--device", "cpu", "--shape", "tiny",
               "--prompt-len", "8", "--configs", "2x8x1", "2x1000000x1", "--impls", "ours,transformers",
               "--skip-steps", "--copy-gib", "0.01", "--budget-s", "60"]
    out = preloaded.run(command, cwd=ROOT, capture_output=True, text=True, check=True,
                        env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    lines = [json.loads(line) for line in out.splitlines()]
    measured = {(r["new_tokens"], r["impl"]) for r in lines if "tokens_per_s" in r}
    skipped = {(r["new_tokens"], r["impl"]) for r in lines if "skipped" in r}
    assert measured == {(8, "ours"), (8, "transformers")}
    # A million steps at the seconds per step of the 8-token run do not fit the time left: neither is started.
    assert skipped == {(1000000, "ours"), (1000000, "transformers")}


def test_the_budget_predicts_longer_and_wider_runs_from_what_ran_never_less():
    """What was measured at 64 rows x a mean window of 512 predicts a run at 256 rows (x2: the square root of
    the rows) and a mean window of 2,304 (x4.5: linear in the window), and never scales down."""
    grid = rollout_grid.Grid(budget_s=100.0)
    assert rollout_grid.predicted_s(grid, "transformers", 64, 512, 512) == 0.0  # nothing known yet
    grid.record("transformers", 0.02, 64, 512)
    grid.record("transformers", 0.01, 64, 512)  # a faster later run does not lower the estimate
    assert rollout_grid.predicted_s(grid, "transformers", 64, 512, 100) == pytest.approx(2.0)
    assert rollout_grid.predicted_s(grid, "transformers", 256, 2304, 100) == pytest.approx(2.0 * 2 * 4.5)
    assert rollout_grid.predicted_s(grid, "transformers", 8, 64, 100) == pytest.approx(2.0)


def test_the_budget_predicts_our_rollouts_from_the_graphed_step_at_their_window():
    grid = rollout_grid.Grid(budget_s=100.0)
    grid.step_s.update({(64, 512): 0.004, (64, 4096): 0.006})
    assert rollout_grid.predicted_s(grid, "ours", 64, 2304, 1000) == pytest.approx(1000 * 0.006 * 1.2)
    assert rollout_grid.predicted_s(grid, "ours", 64, 300, 1000) == pytest.approx(1000 * 0.004 * 1.2)
    assert rollout_grid.predicted_s(grid, "ours", 64, 9000, 1000) == pytest.approx(1000 * 0.006 * 1.2)
    assert rollout_grid.predicted_s(grid, "ours", 256, 300, 1000) == 0.0  # no step measured at 256 rows


def test_transformers_rollouts_too_long_to_run_are_estimated_from_their_step_and_say_so():
    """With --hf-whole-max-s, a configuration whose whole transformers runs are predicted to take longer gets the
    sampled estimate (prefill + new tokens x the step at the mean window), labelled as such; measured here
    against a whole run of the same configuration (the first, before anything was known to predict from)."""
    command = [sys.executable, "bench.py", "rollout-grid", "--device", "cpu", "--shape", "tiny",
               "--prompt-len", "8", "--configs", "2x64x5", "2x64x5", "--impls", "transformers", "--skip-steps",
               "--hf-warm-up", "short", "--hf-whole-max-s", "0", "--copy-gib", "0.01", "--budget-s", "120"]
    out = preloaded.run(command, cwd=ROOT, capture_output=True, text=True, check=True,
                        env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    lines = [json.loads(line) for line in out.splitlines() if '"rollout"' in line]
    whole = [r for r in lines if "runs_s" in r]
    estimated = [r for r in lines if "estimated" in r]
    assert len(whole) == 1 and len(estimated) == 1, lines
    assert "mean window 40" in estimated[0]["estimated"]  # 8 prompt tokens + 64 / 2
    # Two ways to time the same work, at moments when the suite's other workers load the 2 CPUs differently: within a
    # factor of 6 (a fresh-clone run of the suite measured 0.32); a wrong step count would be 30x off.
    assert 1 / 6 < estimated[0]["tokens_per_s"] / whole[0]["tokens_per_s"] < 6, (whole, estimated)
