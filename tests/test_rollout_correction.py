"""--rollout-is, the sampler-vs-policy correction (ngrpo.importance_weights, policy_loss's is_weights, the mismatch
metrics): weights, truncation and masking against numbers worked out by hand, the weighted loss of grpo and gspo
with and without dual clip, the token-truncate gradient against a brute-force reweighted loss, tiny runs whose
sampler agrees with the policy (every mode is `none`) or is deliberately perturbed (a test hook: the sampler's
output matrix scaled, no user flag), and 2 processes against one."""

import copy
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ngrpo
import train
from config import PRESETS, Config, preset
from model import TINY_CONFIG, load_model, random_model
from ngrpo import RolloutCorrection, importance_weights, mismatch_metrics, mismatch_sums
from reward import RewardPool
from rollout import Sampling, generate
from runtime.cli import parse_config

ROOT = Path(__file__).resolve().parents[1]
MODES = ("token-truncate", "token-mask", "sequence-truncate", "sequence-mask")
TIMING = ("rollout_s", "score_s", "update_s", "step_s", "rollout_tokens_per_s", "update_tokens_per_s")


def cfg(**overrides) -> Config:
    return dataclasses.replace(Config(), **overrides)


def weights_of(log_ratios, mask, mode: str, cap: float = 2.0, lower: float = 0.0):
    """importance_weights with sampler log-probs 0 and old log-probs = the given log w."""
    old = torch.tensor(log_ratios, dtype=torch.float32)
    return importance_weights(old, torch.zeros_like(old), torch.tensor(mask, dtype=torch.bool),
                              RolloutCorrection(mode, cap, lower))


def close(actual, expected, tol=1e-6) -> bool:
    actual = actual.flatten().tolist() if isinstance(actual, torch.Tensor) else actual
    return len(actual) == len(expected) and all(abs(a - e) <= tol * max(1.0, abs(e)) for a, e in zip(actual, expected))


# ----------------------------------------------------------------------------- flags


def test_rollout_is_is_refused_where_the_recorded_log_prob_is_not_the_sampling_one():
    with pytest.raises(ValueError, match="--rollout-is token-mask: needs --old-logp replay: with rollout the old "
                                         "policy's log-probs are the sampler's own, so every weight would be 1"):
        Config(rollout_is="token-mask", old_logp="rollout")
    with pytest.raises(ValueError, match=r"--rollout-is sequence-truncate: needs --temperature > 0: a greedy "
                                         "sampler's log-probs"):
        Config(rollout_is="sequence-truncate", temperature=0.0)
    assert Config(rollout_is="token-truncate", top_p=0.9).top_p == 0.9  # the filtered p is what y was drawn from


@pytest.mark.parametrize("argv, message", [
    (["--rollout-is-cap", "3"], "--rollout-is-cap 3: has no effect without --rollout-is"),
    (["--rollout-is", "token-truncate", "--rollout-is-lower", "0.3"],
     "--rollout-is-lower 0.3: has no effect without --rollout-is token-mask or sequence-mask"),
    (["--rollout-is", "token-mask", "--rollout-is-cap", "1"], "--rollout-is-cap 1: must be > 1"),
    (["--rollout-is", "sequence-mask", "--rollout-is-lower", "1.5"], r"--rollout-is-lower 1.5: must be in \[0, 1\)"),
])
def test_bounds_that_do_nothing_or_make_no_sense_are_one_message(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_config(["--preset", "tiny", *argv])
    assert re.search(message, capsys.readouterr().err)


def test_the_presets_keep_the_released_behaviour():
    assert all(preset(name).rollout_is == "none" for name in PRESETS)
    cfg = parse_config(["--rollout-is", "sequence-mask", "--rollout-is-cap", "3", "--rollout-is-lower", "0.25"])
    assert RolloutCorrection.of(cfg) == RolloutCorrection("sequence-mask", 3.0, 0.25)


# ----------------------------------------------------------------------------- weights by hand

L = math.log
# Row 0: w = 3, 0.4, 1 and a padding position (log w 50) that must count for nothing.
TOKEN_ROWS, TOKEN_MASK = [[L(3.0), L(0.4), 0.0, 50.0]], [[1, 1, 1, 0]]


def test_token_weights_are_each_tokens_ratio_truncated_at_c():
    w, factor, changed = weights_of(TOKEN_ROWS, TOKEN_MASK, "token-truncate")
    assert close(w[0, :3], [3.0, 0.4, 1.0])
    assert close(factor[0, :3], [2.0, 0.4, 1.0])  # min(w, 2): only the 3 is cut; small weights stay
    assert changed.tolist() == [[True, False, False, False]]


def test_token_mask_zeroes_tokens_outside_one_over_c_to_c_and_keeps_w_inside():
    _, factor, changed = weights_of(TOKEN_ROWS, TOKEN_MASK, "token-mask")
    assert close(factor[0, :3], [0.0, 0.0, 1.0])  # 3 > 2 and 0.4 < 1/2 masked
    assert changed.tolist() == [[True, True, False, False]]
    _, factor, changed = weights_of(TOKEN_ROWS, TOKEN_MASK, "token-mask", cap=4.0, lower=0.3)
    assert close(factor[0, :3], [3.0, 0.4, 1.0])  # inside [0.3, 4]: each token keeps its own w
    assert not changed.any()
    _, factor, _ = weights_of([[L(0.9), L(1.1)]], [[1, 1]], "token-mask", cap=4.0, lower=0.95)
    assert close(factor, [0.0, 1.1])  # the given lower bound, not 1 / 4


def test_sequence_weights_are_the_geometric_mean_of_the_rows_tokens():
    # Row 0: w 4, 1, 1 -> 4^(1/3) = 1.587; row 1: 9, 1 -> 3; row 2: 0.16, 1 -> 0.4; padding at log w 50 ignored.
    rows = [[L(4.0), 0.0, 0.0, 50.0], [L(9.0), 0.0, 50.0, 50.0], [L(0.16), 0.0, 50.0, 50.0]]
    mask = [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0]]
    geo = 4.0 ** (1 / 3)
    w, factor, changed = weights_of(rows, mask, "sequence-truncate")
    assert close(w[:, 0], [geo, 3.0, 0.4]) and close(w[:, 1], [geo, 3.0, 0.4])  # one weight per row
    assert close(factor[:, 0], [geo, 2.0, 0.4])
    assert changed.tolist() == [[False] * 4, [True, True, False, False], [False] * 4]
    _, factor, changed = weights_of(rows, mask, "sequence-mask")
    assert close(factor[:, 0], [geo, 0.0, 0.0])  # 3 > 2 and 0.4 < 0.5: both whole rows masked
    assert changed.tolist() == [[False] * 4, [True, True, False, False], [True, True, False, False]]


def test_none_weighs_every_token_one_and_changes_nothing():
    w, factor, changed = weights_of(TOKEN_ROWS, TOKEN_MASK, "none")
    assert close(w[0, :3], [3.0, 0.4, 1.0]) and factor.tolist() == [[1.0] * 4] and not changed.any()


def test_mismatch_metrics_by_hand():
    """Two rows: log w = (log 2, 0) and (log 0.25,): k3 = w - log w - 1 per token, training / rollout perplexity
    per row exp(-mean log w), the token weights (2, 1, 0.25) and what token-mask (C 2) masks (the 0.25)."""
    old = torch.tensor([[L(2.0), 0.0], [L(0.25), 7.0]])
    sampler = torch.zeros(2, 2)
    mask = torch.tensor([[True, True], [True, False]])
    got = mismatch_metrics(mismatch_sums(old, sampler, mask, RolloutCorrection("token-mask")))
    k3 = [2.0 - L(2.0) - 1.0, 0.0, 0.25 - L(0.25) - 1.0]
    assert close([got["rollout_kl"]], [sum(k3) / 3])
    assert close([got["rollout_ppl_ratio"]], [(math.exp(-L(2.0) / 2) + 4.0) / 2])
    assert close([got["rollout_is_weight_mean"], got["rollout_is_weight_max"]], [(2.0 + 1.0 + 0.25) / 3, 2.0])
    assert close([got["rollout_is_token_frac"], got["rollout_is_seq_frac"]], [1 / 3, 1 / 2])
    assert close([got["logp_gap_mean"], got["logp_gap_max"]], [(L(2.0) + L(4.0)) / 3, L(4.0)])
    per_seq = mismatch_metrics(mismatch_sums(old, sampler, mask, RolloutCorrection("sequence-truncate", 1.2)))
    # Sequence weights sqrt(2) (truncated at 1.2) and 0.25.
    assert close([per_seq["rollout_is_weight_mean"], per_seq["rollout_is_weight_max"]],
                 [(math.sqrt(2.0) + 0.25) / 2, math.sqrt(2.0)])
    assert close([per_seq["rollout_is_token_frac"], per_seq["rollout_is_seq_frac"]], [2 / 3, 1 / 2])


# ----------------------------------------------------------------------------- the weighted loss by hand


def weighted_loss(log_ratios, advantages, is_weights, *, ref_diffs=None, mask=None, **overrides):
    """policy_loss with logp = -1, old_logp = -1 - log ratio, the given weights; (loss, d loss / d logp)."""
    log_ratios = torch.tensor(log_ratios)
    logp = torch.full_like(log_ratios, -1.0, requires_grad=True)
    mask = torch.ones_like(log_ratios) if mask is None else torch.tensor(mask, dtype=torch.float32)
    ref_logp = None if ref_diffs is None else -1.0 + torch.tensor(ref_diffs)
    loss, _ = ngrpo.policy_loss(logp, -1.0 - log_ratios, torch.tensor(advantages), mask, ref_logp=ref_logp,
                                settings=ngrpo.LossSettings.of(cfg(**{"kl_coef": 0.0, **overrides})),
                                is_weights=torch.as_tensor(is_weights))
    loss.backward()
    return float(loss.detach()), logp.grad


@pytest.mark.parametrize("dual_clip", [3.0, 0.0])
def test_grpo_token_loss_is_multiplied_by_its_weight_after_both_clips(dual_clip):
    """A = -1, ratios 1 and 4, token-truncate weights 2 (w = 3, cut at C 2) and 0.5. Token losses: 1 and
    max(4, 1.2) = 4, which dual clip caps at -3A = 3. Loss (1 x 2 + 3 x 0.5) / 2 = 1.75 with dual clip and
    (1 x 2 + 4 x 0.5) / 2 = 2 without; gradient -A ratio w / 2: 1 and (dual-clipped: 0) or 1."""
    _, factor, _ = weights_of([[L(3.0), L(0.5)]], [[1, 1]], "token-truncate")
    loss, grad = weighted_loss([[0.0, L(4.0)]], [-1.0], factor, dual_clip=dual_clip)
    assert close([loss], [1.75 if dual_clip else 2.0])
    assert close(grad, [1.0, 0.0 if dual_clip else 1.0])


@pytest.mark.parametrize("dual_clip", [3.0, 0.0])
def test_gspo_sequence_loss_is_multiplied_by_the_sequence_weight(dual_clip):
    """gspo, seq-mean-token-mean. Row 0: A = -1, token log-ratios log 8 and log 2: sequence ratio 4, token
    losses max(4, 1.2) = 4 (dual clip: 3); sequence weight sqrt(0.25 x 4) = 1 -> kept. Row 1: A = 2, ratio 1,
    losses -2; its sequence weight 3 (w 9, 1) is masked by sequence-mask: the row adds 0 but counts in the mean
    over 2 sequences. Loss 3/2 (4/2 without dual clip); gradient of row 0 (no dual clip): -A ratio / (2 x 2)."""
    _, factor, _ = weights_of([[L(0.25), L(4.0)], [L(9.0), 0.0]], [[1, 1], [1, 1]], "sequence-mask")
    assert close(factor.flatten(), [1.0, 1.0, 0.0, 0.0])
    loss, grad = weighted_loss([[L(8.0), L(2.0)], [0.0, 0.0]], [-1.0, 2.0], factor, dual_clip=dual_clip,
                               loss="gspo", loss_agg="seq-mean-token-mean")
    assert close([loss], [1.5 if dual_clip else 2.0])
    # Each token of row 0 moves the sequence ratio by ratio / 2: d/dlogp_t of 4/2 x mean_t = ratio / 2 / 2.
    assert close(grad, [0.0] * 4 if dual_clip else [1.0, 1.0, 0.0, 0.0])  # a masked row: no gradient


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                                      "token-mean-per-rows"])
def test_weights_compose_with_every_aggregation_and_leave_the_kl_term_alone(loss_agg):
    """Ratio 1 everywhere, so token losses are -A: row 0 (A = 1, 3 tokens, weights 2, 1, 0) and row 1 (A = -2,
    1 token, weight 0.5). The k3 KL term (ref - logp = log 2 on every token: 2 - log 2 - 1) is not weighted.
    Each aggregation by hand: token-mean over 4 tokens; mean of row means; row sums / max_new_tokens (10) over
    2 rows; the token mean of the one run of 2 rows."""
    token_losses = [[-2.0, -1.0, 0.0], [1.0]]  # -A x weight
    kl = 2.0 - L(2.0) - 1.0
    by_mode = {"token-mean": lambda v: sum(map(sum, v)) / 4,
               "seq-mean-token-mean": lambda v: (sum(v[0]) / 3 + sum(v[1]) / 1) / 2,
               "seq-mean-token-sum-norm": lambda v: (sum(v[0]) + sum(v[1])) / 10 / 2,
               "token-mean-per-rows": lambda v: sum(map(sum, v)) / 4}
    expected = by_mode[loss_agg](token_losses) + 0.01 * by_mode[loss_agg]([[kl] * 3, [kl]])
    loss, _ = weighted_loss([[0.0] * 3, [0.0] * 3], [1.0, -2.0], [[2.0, 1.0, 0.0], [0.5, 7.0, 7.0]],
                            mask=[[1, 1, 1], [1, 0, 0]], ref_diffs=[[L(2.0)] * 3] * 2, kl_coef=0.01,
                            loss_agg=loss_agg, max_new_tokens=10, loss_agg_rows=2)
    assert close([loss], [expected])


# ----------------------------------------------------------------------------- the gradient against brute force

PROMPTS = [[5, 9, 2], [7, 1, 4, 4, 8, 3, 6], [11], [3, 3, 9, 20, 41], [100, 101]]
STOP_IDS = tuple(range(0, 262, 9))  # rows end early, at different steps


@pytest.fixture(scope="module")
def perturbed_episodes():
    """A real rollout of the tiny model (explore none: the replay is a plain forward over the ids) whose
    sampler log-probs are moved by N(0, 0.8) per token (some weights past C = 1.5, some below 1 / C) and whose
    old log-probs by N(0, 0.7) (ratios clipped on both sides, some dual-clipped)."""
    model = random_model(TINY_CONFIG, seed=0)
    rollout = generate(model, PROMPTS, Sampling(max_new_tokens=10, stop_ids=STOP_IDS), seed=3)
    g = torch.Generator().manual_seed(5)
    mask = rollout.response_mask()
    sampler_logp = rollout.logprobs + 0.8 * torch.randn(rollout.logprobs.shape, generator=g) * mask
    rollout = rollout.with_fields(logprobs=sampler_logp)
    with torch.no_grad():
        replayed = ngrpo.replay_logprobs(model, rollout, cfg())
    old_logp = replayed + 0.7 * torch.randn(replayed.shape, generator=g)
    old_logp[1, 0] = replayed[1, 0] - 2.0  # ratio e^2 > 3 at A < 0: dual-clipped
    advantages = torch.tensor([1.5, -0.5, -2.0, 0.7, -1.0])
    return model, rollout, old_logp, advantages


def brute_force_gradient(model, rollout, old_logp, advantages, cap: float) -> dict:
    """The token-mean over all response tokens of min(exp(old - sampler), C) x the dual-clipped PPO loss,
    token by token from one plain forward per row, and its gradient."""
    model = copy.deepcopy(model)
    total, tokens = 0.0, int(rollout.lengths.sum())
    for row, prompt in enumerate(rollout.prompts):
        n, a = int(rollout.lengths[row]), float(advantages[row])
        ids = torch.tensor([prompt + rollout.response_ids[row, :n].tolist()])
        log_probs = model(ids)[0].float().log_softmax(-1)  # [P + n, V]
        for t in range(n):
            logp = log_probs[len(prompt) - 1 + t, int(rollout.response_ids[row, t])]
            old, sampled = float(old_logp[row, t]), float(rollout.logprobs[row, t])
            ratio = torch.exp(logp - old)
            loss = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.2))
            if a < 0:
                loss = torch.minimum(loss, torch.tensor(-3.0 * a))
            total = total + min(math.exp(old - sampled), cap) * loss
    (total / tokens).backward()
    return {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("split", [dict(micro_batch_size=2), dict(micro_batch_size=5),
                                   dict(micro_batch_tokens=40)])
def test_token_truncate_gradient_equals_a_brute_force_reweighted_loss(perturbed_episodes, split):
    model, rollout, old_logp, advantages = perturbed_episodes
    config = cfg(kl_coef=0.0, rollout_is="token-truncate", rollout_is_cap=1.5, **split)
    w = (old_logp - rollout.logprobs).exp()[rollout.response_mask()]
    assert (w > 1.5).any() and (w < 1.0).any()  # weights truncated, and weights kept below 1
    trained = copy.deepcopy(model)
    metrics = ngrpo.backward_minibatch(trained, ngrpo.Episodes(rollout, advantages, old_logp), config)
    assert metrics["clip_frac_high"] > 0 and metrics["clip_frac_low"] > 0 and metrics["dual_clip_frac"] > 0
    expected = brute_force_gradient(model, rollout, old_logp, advantages, cap=1.5)
    plain = copy.deepcopy(model)  # the same loss without the weights: the test can tell them apart
    ngrpo.backward_minibatch(plain, ngrpo.Episodes(rollout, advantages, old_logp), dataclasses.replace(
        config, rollout_is="none", rollout_is_cap=2.0))
    for name, p in trained.named_parameters():
        scale = expected[name].norm()
        assert (p.grad - expected[name]).norm() <= 1e-5 * scale, name
    assert any((p.grad - dict(plain.named_parameters())[n].grad).norm() > 1e-2 * expected[n].norm()
               for n, p in trained.named_parameters())


def test_on_policy_update_weighs_and_measures_like_the_replayed_one(perturbed_episodes):
    """One optimizer step on the sampled weights takes the old log-probs from its own forward: with
    sequence-mask it masks the same rows, and logs the same mismatch, as an update with a separate replay."""
    model, rollout, _, advantages = perturbed_episodes
    config = cfg(kl_coef=0.0, rollout_is="sequence-mask", rollout_is_cap=1.3, micro_batch_size=2)
    grads, metrics = {}, {}
    for on_policy in (False, True):
        trained = copy.deepcopy(model)
        episodes, mismatch, _ = ngrpo.make_episodes(trained, None, rollout, advantages, config, on_policy=on_policy)
        metrics[on_policy] = ngrpo.backward_minibatch(trained, episodes, config)
        if mismatch is not None:
            metrics[on_policy].update(mismatch_metrics(mismatch))
        grads[on_policy] = {n: p.grad for n, p in trained.named_parameters()}
    assert 0 < metrics[True]["rollout_is_seq_frac"] < 1
    for key in ngrpo.MISMATCH_METRICS + ("loss", "pg_loss"):
        assert metrics[True][key] == pytest.approx(metrics[False][key], rel=1e-5, abs=1e-7), key
    for name, grad in grads[False].items():
        assert (grads[True][name] - grad).norm() <= 1e-5 * max(grad.norm(), 1e-12), name


# ----------------------------------------------------------------------------- tiny runs

RUN = dict(explore="none", prompts_per_step=4, group_size=4, mini_batch_prompts=2, micro_batch_size=3,
           max_new_tokens=12, max_steps=1, kl_coef=0.05)


def perturb_the_sampler(monkeypatch, scale: float, rollouts: list) -> None:
    """The test hook: every rollout is sampled by a copy of the model whose output matrix is scaled by
    `scale` (1 = the policy itself, untouched); the rollouts are kept in `rollouts`."""
    real = train.generate

    def sampled_by_a_perturbed_copy(model, *args, **kwargs):
        sampler = model
        if scale != 1.0:
            sampler = copy.deepcopy(model)
            with torch.no_grad():
                sampler.lm_head.weight.mul_(scale)
        rollouts.append(real(sampler, *args, **kwargs))
        return rollouts[-1]

    monkeypatch.setattr(train, "generate", sampled_by_a_perturbed_copy)


def row_keys(rollout) -> list[tuple]:
    """Each row as (prompt, response): how a row is known in any mini-batch, micro-batch or process."""
    return [(tuple(p), tuple(r)) for p, r in zip(rollout.prompts, rollout.responses())]


def record_weights(monkeypatch) -> dict:
    """{row_keys' key: the factor that multiplied each of the row's token losses}, from the update's calls."""
    seen, current = {}, []
    real_micro, real_loss = ngrpo.Episodes.micro_batch, ngrpo.policy_loss

    def micro_batch(self, index):
        micro = real_micro(self, index)
        current[:] = row_keys(micro.rollout)
        return micro

    def policy_loss(logp, old_logp, advantages, mask, **kwargs):
        if kwargs.get("is_weights") is not None:
            for row, weights, row_mask in zip(current, kwargs["is_weights"], mask.bool()):
                seen[row] = weights[row_mask].tolist()
        return real_loss(logp, old_logp, advantages, mask, **kwargs)

    monkeypatch.setattr(ngrpo.Episodes, "micro_batch", micro_batch)
    monkeypatch.setattr(ngrpo, "policy_loss", policy_loss)
    return seen


def spied_run(out: Path, monkeypatch, *, scale: float = 1.0, **settings) -> tuple[list, dict]:
    """train.py's run of the tiny preset with RUN's settings and `settings` changed, its rollouts sampled by a
    copy of the model whose output matrix is scaled by `scale`, and a stand-in reward that gives the update a
    signal (odd-length responses score 1). Returns (the rollouts, record_weights' record)."""
    monkeypatch.setattr(RewardPool, "score", lambda self, pairs, kind="math": [float(len(t) % 2) for t, _ in pairs])
    rollouts = []
    perturb_the_sampler(monkeypatch, scale, rollouts)
    seen = record_weights(monkeypatch)
    train.run(dataclasses.replace(preset("tiny"), out_dir=str(out), **{**RUN, **settings}))
    return rollouts, seen


def tiny_run(out: Path, monkeypatch, mode: str, *, scale: float = 1.0, **settings):
    """One step of the tiny model (explore none, 16 rows, 12 tokens, replayed old log-probs, KL on) under
    --rollout-is `mode`. Returns (the step's metrics, the rollout, the recorded weights)."""
    rollouts, seen = spied_run(out, monkeypatch, scale=scale, **({} if mode == "none" else dict(rollout_is=mode)),
                               **settings)
    (metrics,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {k: v for k, v in metrics.items() if k not in TIMING}, rollouts[0], seen


@pytest.fixture(scope="module")
def none_run(tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        return tiny_run(tmp_path_factory.mktemp("none"), monkeypatch, "none")


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_is_none_when_the_sampler_is_the_policy(mode, none_run, tmp_path, monkeypatch):
    """On a CPU in fp32 the sampler is the policy: every weight is 1 (to the ~1e-7 of the sampler's log p(y)
    from a softmax against the replay's log_softmax), nothing is truncated or masked, and the step's metrics and
    metrics (loss, gradient norm, KL, ...) are those of --rollout-is none."""
    metrics, rollout, seen = tiny_run(tmp_path, monkeypatch, mode)
    expected, _, _ = none_run
    assert sorted(seen) == sorted(row_keys(rollout)) and len(seen) == 16
    assert all(abs(w - 1.0) < 1e-5 for weights in seen.values() for w in weights)
    assert metrics["rollout_is_token_frac"] == metrics["rollout_is_seq_frac"] == 0.0
    assert metrics["rollout_kl"] < 1e-10 and abs(metrics["rollout_ppl_ratio"] - 1) < 1e-6
    assert metrics["grad_norm"] > 0 and metrics.keys() == expected.keys()
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def expected_weights(rollout, mode: str, cap: float, lower: float = 0.0) -> dict:
    """{row key: (each token's w, the mode's w of each token, the factor each token's loss gets)} worked out token
    by token: the policy's log p(y) from one plain forward of the tiny model's initial weights per row (what the
    replay computes, independently), the sampler's as the rollout recorded it."""
    model = random_model(TINY_CONFIG, seed=0)
    lower = lower or 1.0 / cap
    found = {}
    for (prompt, response), sampled in zip(row_keys(rollout), rollout.logprobs.tolist()):
        with torch.no_grad():
            log_probs = model(torch.tensor([list(prompt) + list(response)]))[0].log_softmax(-1)
        log_w = [float(log_probs[len(prompt) - 1 + t, y]) - sampled[t] for t, y in enumerate(response)]
        w = [math.exp(x) for x in log_w]
        if mode.startswith("sequence"):  # the geometric mean of the row's token weights
            w = [math.exp(sum(log_w) / len(log_w))] * len(log_w)
        if mode.endswith("truncate"):
            factor = [min(x, cap) for x in w]
        else:
            factor = [x if lower <= x <= cap else 0.0 for x in w]
        found[(prompt, response)] = ([math.exp(x) for x in log_w], w, factor)
    return found


@pytest.mark.parametrize("mode, cap, lower", [("token-truncate", 2.0, 0.0), ("token-mask", 2.0, 0.0),
                                              ("sequence-truncate", 1.1, 0.0), ("sequence-mask", 1.1, 0.8)])
def test_a_perturbed_sampler_is_truncated_or_masked_where_it_should_be(mode, cap, lower, tmp_path, monkeypatch):
    """The sampler's output matrix x 4 (sharper than the policy; token weights ~0.2-4.5, sequence weights
    ~0.7-1.25): each token's loss gets the factor worked out from the policy's own forward, the truncated or
    masked tokens are those outside the bounds, and the logged mismatch says so."""
    overrides = dict(rollout_is_cap=cap, **({"rollout_is_lower": lower} if lower else {}))
    metrics, rollout, seen = tiny_run(tmp_path, monkeypatch, mode, scale=4.0, **overrides)
    expected = expected_weights(rollout, mode, cap, lower)
    assert sorted(seen) == sorted(expected) and len(expected) == 16  # every row recorded, rows told apart
    assert all(abs(x - bound) > 1e-4 for _, w, _ in expected.values() for x in w
               for bound in (cap, lower or 1.0 / cap))  # no weight on the edge of a bound
    for key, (_, _, factor) in expected.items():
        assert seen[key] == pytest.approx(factor, rel=1e-4, abs=1e-6), key
    changed = [[f != x for x, f in zip(w, factor)] for _, w, factor in expected.values()]
    token_w = [x for each, _, _ in expected.values() for x in each]
    tokens, rows = len(token_w), len(changed)
    assert 0 < sum(map(sum, changed)) < tokens  # the bounds act on some tokens, not on all
    assert metrics["rollout_is_token_frac"] == pytest.approx(sum(map(sum, changed)) / tokens)
    assert metrics["rollout_is_seq_frac"] == pytest.approx(sum(map(any, changed)) / rows)
    mode_w = [w[0] for _, w, _ in expected.values()] if mode.startswith("sequence") else token_w
    assert metrics["rollout_is_weight_mean"] == pytest.approx(sum(mode_w) / len(mode_w), rel=1e-4)
    assert metrics["rollout_is_weight_max"] == pytest.approx(max(mode_w), rel=1e-4)
    # k3 KL(sampler || policy) = w - log w - 1 per token; perplexity ratio = exp(-mean_t log w) per row.
    assert metrics["rollout_kl"] == pytest.approx(sum(x - math.log(x) - 1 for x in token_w) / tokens, rel=1e-3)
    ppl = [math.exp(-sum(map(math.log, each)) / len(each)) for each, _, _ in expected.values()]
    assert metrics["rollout_ppl_ratio"] == pytest.approx(sum(ppl) / rows, rel=1e-4)
    assert metrics["rollout_kl"] > 0.05  # far from the unperturbed run's ~1e-13


# ----------------------------------------------------------------------------- torchrun

# One rank's run: spied_run under torchrun; each rank writes the weights it applied to its rows.
TORCHRUN = """
import json, os, sys
from pathlib import Path
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
import pytest
import test_rollout_correction as T
out = Path(sys.argv[2])
with pytest.MonkeyPatch.context() as monkeypatch:
    _, seen = T.spied_run(out, monkeypatch, scale=4.0, **json.loads(sys.argv[3]))
(out / f"weights-rank-{os.environ['RANK']}.json").write_text(json.dumps([[list(map(list, k)), v] for k, v in
                                                                          seen.items()]))
"""
# Neighbor mixing, one mini-batch (the on-policy update: the mismatch is summed over the ranks' micro-batches),
# uneven micro-batches of 3 rows, token-mask.
DISTRIBUTED = dict(explore="neighbor", mix_rate=0.3, mini_batch_prompts=4, rollout_is="token-mask")


def test_two_processes_weigh_and_measure_like_one(tmp_path, monkeypatch):
    script = tmp_path / "rank.py"
    script.write_text(TORCHRUN)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    # The 2-process job starts first and the one-process reference runs here while it starts (another folder).
    process = subprocess.Popen([*launch, str(script), str(ROOT), str(tmp_path / "two"), json.dumps(DISTRIBUTED)],
                               env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        rollouts, expected = spied_run(tmp_path / "one", monkeypatch, scale=4.0, **DISTRIBUTED)
    finally:
        stdout, stderr = process.communicate(timeout=300)
    done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert done.returncode == 0, done.stderr[-3000:]
    per_rank = [{tuple(map(tuple, key)): weights for key, weights in
                 json.loads((tmp_path / "two" / f"weights-rank-{r}.json").read_text())} for r in range(2)]
    assert len(expected) == 16 and all(per_rank)  # both ranks trained rows
    assert sorted([*per_rank[0], *per_rank[1]]) == sorted(expected)  # each row on one rank
    for key, weights in {**per_rank[0], **per_rank[1]}.items():
        assert weights == pytest.approx(expected[key], rel=1e-5, abs=1e-6)
    read = lambda run: {k: v for k, v in json.loads((tmp_path / run / "metrics.jsonl").read_text()).items()
                        if k not in TIMING}
    one, two = read("one"), read("two")
    assert 0 < one["rollout_is_token_frac"] < 1 and one["mix_rate"] > 0 and one["grad_norm"] > 0
    assert one.keys() == two.keys()
    for key, value in one.items():
        assert two[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    weights = [load_model(str(tmp_path / run / "checkpoints" / "step-1"), dtype=torch.float32,
                          device="cpu").state_dict() for run in ("one", "two")]
    assert max(float((weights[0][k] - weights[1][k]).abs().max()) for k in weights[0]) < 1e-5


def test_the_rehearsal_reprints_every_mismatch_metric():
    """`bench.py rehearsal` on a GPU reports the new metrics at the real shape: it reprints these keys of each
    step's metrics.jsonl line."""
    from benchmarks.rehearsal import LOGGED

    assert set(ngrpo.MISMATCH_METRICS) <= set(LOGGED)
