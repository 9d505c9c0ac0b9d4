"""The GRPO family as flags (docs/algorithm.md, "The GRPO family"): NGRPO's calibrated advantages, clip-higher, the loss
aggregation modes, DAPO's group filter and overlong penalty against numbers worked out by hand in plain
Python; then short CPU runs of each knob with their logged counters. (The default path's pinned runs are
in tests/test_regression_pins.py.)"""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import estimators
import ngrpo
import train
from config import PRESETS, Config, preset
from reward import RewardPool
from runtime.cli import parse_config

TIMING = ("rollout_s", "score_s", "update_s", "step_s", "rollout_tokens_per_s", "update_tokens_per_s")


def tiny(tmp_path, **overrides):
    """As tests/test_train.py: the tiny preset, 8 prompts x 4 responses per step, 16-token responses."""
    base = dict(out_dir=str(tmp_path / "run"), prompts_per_step=8, mini_batch_prompts=4, micro_batch_size=8,
                max_new_tokens=16, max_steps=3)
    return replace(preset("tiny"), **{**base, **overrides})


def history(cfg) -> list[dict]:
    train.run(cfg)
    return [json.loads(line) for line in (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]


def assert_close(actual, expected, tol=1e-6):
    actual = torch.as_tensor(actual, dtype=torch.float64).flatten().tolist()
    expected = torch.as_tensor(expected, dtype=torch.float64).flatten().tolist()
    assert len(actual) == len(expected) and all(abs(a - e) <= tol for a, e in zip(actual, expected)), (actual, expected)


# ------------------------------------------------------------------------------ NGRPO's calibrated advantages


def negative(rewards, group_size):
    return estimators.group_advantages(torch.tensor(rewards), group_size, virtual_count=1, virtual_reward=1.0)


def test_calibrated_all_wrong_group_gets_negative_advantages():
    # [0, 0, 0, 0] + virtual 1: mean 0.2, unbiased std sqrt((4 * 0.2^2 + 0.8^2) / 4) = 0.4472.
    std = math.sqrt((4 * 0.2**2 + 0.8**2) / 4)
    assert_close(negative([0.0] * 4, 4), [-0.2 / (std + 1e-6)] * 4)
    assert_close(negative([0.0] * 4, 4), [-0.4472] * 4, tol=1e-4)


def test_calibrated_mixed_group():
    # [1, 0, 0, 0] + virtual 1: mean 0.4, unbiased std sqrt((2 * 0.6^2 + 3 * 0.4^2) / 4) = sqrt(0.3).
    std = math.sqrt(0.3)
    assert_close(negative([1.0, 0.0, 0.0, 0.0], 4), [0.6 / (std + 1e-6)] + [-0.4 / (std + 1e-6)] * 3)


def test_calibrated_group_of_one_has_mean_0_and_std_1():
    assert_close(negative([0.0, 1.0], 1), [0.0, 1.0 / (1.0 + 1e-6)])


def test_batch_scale_divides_group_centred_rewards_by_the_batch_std():
    # Group means 0.25 and 0.75; the 8 rewards have mean 0.5 and unbiased variance 8 * 0.25 / 7.
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    std = math.sqrt(8 * 0.25 / 7)
    centred = [0.75, -0.25, -0.25, -0.25, 0.25, 0.25, -0.75, 0.25]
    assert_close(estimators.group_advantages(torch.tensor(rewards), 4, scale="batch"),
                 [c / (std + 1e-6) for c in centred])
    assert_close(estimators.group_advantages(torch.tensor(rewards), 4, scale="none"), centred)


# ------------------------------------------------------------------------------ clip-higher and aggregation


def test_asymmetric_clip_regions():
    # One token per row, clip 0.16 / 0.24. A > 0: ratio 1.2 inside (loss -1.2, grad -1.2), 1.3 above 1.24
    # (loss -1.24, no grad). A < 0: ratio 0.86 inside (loss 0.86, grad 0.86), 0.8 below 0.84 (0.84, no grad).
    config = replace(Config(), clip_low=0.16, clip_high=0.24, dual_clip=0.0, kl_coef=0.0)
    ratios = [1.2, 1.3, 0.86, 0.8]
    logp = torch.zeros(4, 1, requires_grad=True)
    old_logp = -torch.tensor([[math.log(r)] for r in ratios])
    loss, metrics = ngrpo.policy_loss(logp, old_logp, torch.tensor([1.0, 1.0, -1.0, -1.0]), torch.ones(4, 1),
                                      settings=ngrpo.LossSettings.of(config))
    loss.backward()
    assert_close(loss, (-1.2 - 1.24 + 0.86 + 0.84) / 4)
    assert_close(logp.grad, [-1.2 / 4, 0.0, 0.86 / 4, 0.0])
    assert_close([metrics["clip_frac_high"], metrics["clip_frac_low"]], [0.25, 0.25])


# Rows of 1, 3 and 2 tokens, ratio 1, A = +2, -1, +1: token losses -2 | 1 1 1 | -1 -1; max_new_tokens 4.
RAGGED_MASK = [[1.0, 0, 0], [1, 1, 1], [1, 1, 0]]
AGGREGATED = {
    "token-mean": ((-2 + 3 - 2) / 6, [-2 / 6, 0, 0] + [1 / 6] * 3 + [-1 / 6] * 2 + [0]),
    "seq-mean-token-mean": ((-2 + 1 - 1) / 3, [-2 / 3, 0, 0] + [1 / 9] * 3 + [-1 / 6] * 2 + [0]),
    "seq-mean-token-sum-norm": ((-2 / 4 + 3 / 4 - 2 / 4) / 3, [-2 / 12, 0, 0] + [1 / 12] * 3 + [-1 / 12] * 2 + [0]),
}


@pytest.mark.parametrize("mode", list(AGGREGATED))
def test_loss_aggregation_on_a_ragged_batch(mode):
    config = replace(Config(), loss_agg=mode, kl_coef=0.0, max_new_tokens=4)
    logp = torch.zeros(3, 3, requires_grad=True)
    loss, _ = ngrpo.policy_loss(logp, torch.zeros(3, 3), torch.tensor([2.0, -1.0, 1.0]), torch.tensor(RAGGED_MASK),
                                settings=ngrpo.LossSettings.of(config))
    loss.backward()
    expected_loss, expected_grad = AGGREGATED[mode]
    assert_close(loss, expected_loss)
    assert_close(logp.grad, expected_grad)


@pytest.mark.parametrize("mode", list(AGGREGATED))
def test_micro_batches_given_the_mini_batch_normalizer_add_up(mode):
    config = replace(Config(), loss_agg=mode, kl_coef=0.0, max_new_tokens=4)
    normalizer = torch.tensor(6.0 if mode == "token-mean" else 3.0)
    mask, advantages = torch.tensor(RAGGED_MASK), torch.tensor([2.0, -1.0, 1.0])
    parts = [ngrpo.policy_loss(torch.zeros(1, 3), torch.zeros(1, 3), advantages[i : i + 1], mask[i : i + 1],
                               settings=ngrpo.LossSettings.of(config), normalizer=normalizer)[0] for i in range(3)]
    assert_close(sum(parts), AGGREGATED[mode][0])


# ------------------------------------------------------------------------------ DAPO: filter and overlong penalty


# Groups of 2: all correct, all incorrect, mixed, all equal at 0.5 (neither 1 nor 0).
@pytest.mark.parametrize("strategy, expected", [("none", [True, True, True, True]),
                                                ("all", [False, False, True, False]),
                                                ("all_correct", [False, True, True, True]),
                                                ("all_incorrect", [True, False, True, True])])
def test_keep_groups(strategy, expected):
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.5, 0.5])
    assert ngrpo.keep_groups(rewards, 2, strategy).tolist() == expected


def test_overlong_penalty_at_its_boundaries():
    # max 16, buffer 4, factor 2: 0 up to 12 tokens, then (12 - n) / 4 * 2.
    lengths = torch.tensor([1, 11, 12, 13, 14, 16])
    assert_close(ngrpo.overlong_penalty(lengths, 16, 4, 2.0), [0.0, 0.0, 0.0, -0.5, -1.0, -2.0])
    assert_close(ngrpo.overlong_penalty(lengths, 16, 0, 2.0), [0.0] * 6)


# ------------------------------------------------------------------------------ config


def test_negative_grpo_preset_is_the_papers_recipe_on_top_of_n_grpo_mixing():
    cfg = preset("negative-grpo")
    assert (cfg.adv_estimator, cfg.virtual_max_reward, cfg.virtual_max_count, cfg.clip_low, cfg.clip_high,
            cfg.filter_groups, cfg.kl_coef, cfg.explore) == ("negative", 1.0, 1, 0.16, 0.24, "all_correct", 0.0,
                                                             "neighbor")
    assert parse_config(["--preset", "negative-grpo", "--explore", "none"]).explore == "none"


def test_refill_without_a_filter_is_refused():
    with pytest.raises(ValueError, match="--refill: needs --filter-groups"):
        Config(refill=True)


# ------------------------------------------------------------------------------ end to end on the CPU


def test_negative_grpo_run_logs_virtual_samples(tmp_path):
    recipe = {k: v for k, v in PRESETS["negative-grpo"].items() if k != "model"}
    for m in history(tiny(tmp_path, **recipe)):
        assert m["groups_kept"] + m["groups_filtered"] == 8 and m["refill_draws"] == 0
        assert m["virtual_samples"] == m["groups_kept"]  # one virtual sample per kept group
        if m["accuracy"] == 0.0:  # the random model: nothing to filter, every advantage -0.4472, ratio ~1
            assert m["groups_filtered"] == 0
            assert abs(m["pg_loss"] - math.sqrt(0.2)) < 1e-2


def test_filter_all_with_refill_fills_the_batch_or_stops_at_the_bound(tmp_path, monkeypatch):
    # The random model gets nothing right; an odd-length response "scores" 1 so that some groups are mixed.
    monkeypatch.setattr(RewardPool, "score", lambda self, pairs: [float(len(text) % 2) for text, _ in pairs])
    for m in history(tiny(tmp_path, filter_groups="all", refill=True, max_refill_draws=2)):
        assert m["prompts_drawn"] == 8 * (m["refill_draws"] + 1)
        assert m["groups_kept"] == min(8, m["prompts_drawn"] - m["groups_filtered"])
        assert m["groups_kept"] == 8 or m["refill_draws"] == 2
        assert m["update_skipped"] == int(m["groups_kept"] == 0)


def test_a_step_with_every_group_filtered_skips_the_update(tmp_path):
    # The random model gets every answer wrong: all_incorrect drops everything, even after a refill.
    for m in history(tiny(tmp_path, filter_groups="all_incorrect", refill=True, max_refill_draws=1, max_steps=2)):
        assert (m["groups_kept"], m["groups_filtered"], m["refill_draws"], m["update_skipped"]) == (0, 16, 1, 1)
        assert "loss" not in m


def test_mask_truncated_counts_the_truncated_rows(tmp_path):
    for m in history(tiny(tmp_path, mask_truncated=True, overlong_buffer=4)):
        assert m["truncated_masked"] == round(m["truncated_frac"] * 32)
        assert -1.0 <= m["overlong_penalty_mean"] <= -m["truncated_frac"]  # a truncated response gets -1


@pytest.mark.parametrize("mode", list(AGGREGATED))
def test_each_loss_aggregation_trains(tmp_path, mode):
    # Calibrated advantages so that the all-wrong groups of the random model still give a gradient.
    for m in history(tiny(tmp_path, loss_agg=mode, adv_estimator="negative")):
        assert math.isfinite(m["loss"]) and m["loss"] > 0 and m["grad_norm"] > 0 and m["skipped_minibatches"] == 0
