"""ngrpo.py (with its update, backward_minibatch): the GRPO update of docs/algorithm.md against numbers computed by
hand, the chunked log-probs against a plain full log_softmax, replay against the sampler's own log-probs, and a
mini-batch gradient that does not depend on how it is split into micro-batches.

Every expected number below is worked out from the formulas in plain Python on literal inputs."""

import copy
import dataclasses
import math

import pytest
import torch

import estimators
import model as M
import ngrpo
import replay
from config import Config
from engine import logprobs
from neighbors import build_neighbor_table
from rollout import Exploration, Sampling, generate

PROMPTS = [[5, 9, 2], [7, 1, 4, 4, 8, 3, 6], [11], [3, 3, 9, 20, 41], [100, 101]]
STOP_IDS = tuple(range(0, 262, 9))  # 30 of the tiny vocabulary's 262 ids: rows end early, at different steps


def cfg(**overrides) -> Config:
    """The paper's defaults (clip 0.2 / 0.2, dual clip 3, kl 0.01, grpo) with some fields changed."""
    return dataclasses.replace(Config(), **overrides)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def loss_and_grad(log_ratios, advantages, mask=None, ref_diffs=None, **overrides):
    """policy_loss on rows of tokens whose log-ratios logp - old_logp are given; returns (loss, metrics,
    d loss / d logp). logp is -1 everywhere, so old_logp = -1 - log_ratio; ref_logp = logp + ref_diff."""
    log_ratios = torch.tensor(log_ratios, dtype=torch.float32)
    logp = torch.full_like(log_ratios, -1.0, requires_grad=True)
    old_logp = -1.0 - log_ratios
    mask = torch.ones_like(log_ratios) if mask is None else torch.tensor(mask, dtype=torch.float32)
    ref_logp = None if ref_diffs is None else -1.0 + torch.tensor(ref_diffs, dtype=torch.float32)
    loss, metrics = ngrpo.policy_loss(logp, old_logp, torch.tensor(advantages), mask, ref_logp=ref_logp,
                                      settings=ngrpo.LossSettings.of(cfg(kl_coef=0.0, **overrides) if ref_diffs is None
                                                                     else cfg(**overrides)))
    loss.backward()
    return float(loss.detach()), {k: float(v) for k, v in metrics.items()}, logp.grad


def assert_close(actual, expected, tol=1e-6):
    actual = actual.flatten().tolist() if isinstance(actual, torch.Tensor) else actual
    expected = expected if isinstance(expected, list) else [expected]
    actual = actual if isinstance(actual, list) else [actual]
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert abs(a - e) <= tol * max(1.0, abs(e)), (actual, expected)


# ---------------------------------------------------------------------------------------------- advantages


def test_advantages_are_centred_and_divided_by_the_unbiased_group_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    # Group 1: mean 0.25, deviations (0.75, -0.25, -0.25, -0.25), unbiased variance (0.5625 + 3 * 0.0625) / 3 = 0.25.
    std1 = math.sqrt((0.75**2 + 3 * 0.25**2) / 3)
    # Group 2: mean 0.5, deviations +-0.5, unbiased variance 4 * 0.25 / 3.
    std2 = math.sqrt(4 * 0.25 / 3)
    expected = ([0.75 / (std1 + 1e-6)] + [-0.25 / (std1 + 1e-6)] * 3
                + [d / (std2 + 1e-6) for d in (-0.5, 0.5, 0.5, -0.5)])
    assert std1 == 0.5
    assert_close(estimators.group_advantages(rewards, 4), expected)


def test_a_group_with_equal_rewards_gets_zero_advantage():
    advantages = estimators.group_advantages(torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]), 4)
    assert advantages.tolist() == [0.0] * 8


def test_a_group_of_one_gets_zero_advantage():
    advantages = estimators.group_advantages(torch.tensor([1.0, 0.0, 1.0]), 1)
    assert advantages.tolist() == [0.0, 0.0, 0.0]  # not NaN: the std of one sample is undefined


def test_advantage_scale_none_only_centres():
    advantages = estimators.group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 3.0, 1.0]), 2, scale="none")
    assert_close(advantages, [0.5, -0.5, 0.0, 0.0, 1.0, -1.0])
    assert_close(estimators.group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, scale="none"),
                 [0.75, -0.25, -0.25, -0.25])


# ------------------------------------------------------------------------------------ clipped policy loss


def test_positive_advantage_above_the_ceiling_is_clipped_with_no_gradient():
    loss, metrics, grad = loss_and_grad([[math.log(1.5)]], [2.0])
    assert_close(loss, -2.0 * 1.2)  # max(-2 * 1.5, -2 * clip(1.5, 0.8, 1.2)) = -2.4
    assert grad.tolist() == [[0.0]]
    assert metrics["clip_frac_high"] == 1.0 and metrics["clip_frac_low"] == 0.0


def test_positive_advantage_inside_the_range_has_gradient_minus_a_ratio_over_tokens():
    loss, metrics, grad = loss_and_grad([[math.log(1.1), math.log(0.9)]], [2.0])
    assert_close(loss, (-2.0 * 1.1 - 2.0 * 0.9) / 2)
    # d/dlogp of -A * exp(logp - old) / N = -A * ratio / N, N = 2 tokens
    assert_close(grad, [-2.0 * 1.1 / 2, -2.0 * 0.9 / 2])
    assert metrics["clip_frac_high"] == 0.0 and metrics["clip_frac_low"] == 0.0


def test_positive_advantage_below_the_floor_is_not_clipped():
    # The pessimistic max keeps -A * 0.5 = -1 over -A * 0.8 = -1.6: the gradient still pushes the ratio up.
    loss, _, grad = loss_and_grad([[math.log(0.5)]], [2.0])
    assert_close(loss, -1.0)
    assert_close(grad, [-2.0 * 0.5])


def test_negative_advantage_below_the_floor_is_clipped_with_no_gradient():
    loss, metrics, grad = loss_and_grad([[math.log(0.5)]], [-1.0])
    assert_close(loss, 1.0 * 0.8)  # max(0.5, 0.8)
    assert grad.tolist() == [[0.0]]
    assert metrics["clip_frac_low"] == 1.0 and metrics["clip_frac_high"] == 0.0


def test_negative_advantage_above_the_ceiling_is_not_clipped_below_the_dual_bound():
    loss, metrics, grad = loss_and_grad([[math.log(2.0)]], [-1.0])
    assert_close(loss, 2.0)  # max(2.0, 1.2) = 2.0 < 3 * 1
    assert_close(grad, [1.0 * 2.0])  # -A * ratio
    assert metrics["dual_clip_frac"] == 0.0


def test_dual_clip_caps_a_negative_advantage_loss_at_c_times_abs_a():
    loss, metrics, grad = loss_and_grad([[math.log(10.0)]], [-1.5])
    assert_close(loss, 3 * 1.5)  # max(15, 1.8) = 15 > 3 * 1.5
    assert grad.tolist() == [[0.0]]
    assert metrics["dual_clip_frac"] == 1.0


def test_dual_clip_zero_turns_it_off():
    loss, metrics, grad = loss_and_grad([[math.log(10.0)]], [-1.5], dual_clip=0.0)
    assert_close(loss, 15.0, tol=1e-5)
    assert_close(grad, [15.0], tol=1e-5)
    assert metrics["dual_clip_frac"] == 0.0


def test_clip_higher_is_asymmetric():
    # clip_low 0.2, clip_high 0.28: the range is [0.8, 1.28].
    ratios, advantages = [1.25, 1.3, 0.75, 0.85], [1.0, 1.0, -1.0, -1.0]
    loss, metrics, grad = loss_and_grad([[math.log(r)] for r in ratios], advantages, clip_low=0.2, clip_high=0.28)
    # 1.25 inside (was clipped at 1.2); 1.3 clipped to 1.28; 0.75 clipped to 0.8 (A < 0); 0.85 inside.
    assert_close(loss, (-1.25 - 1.28 + 0.8 + 0.85) / 4)
    assert_close(grad, [-1.25 / 4, 0.0, 0.0, 0.85 / 4])
    assert metrics["clip_frac_high"] == 0.25 and metrics["clip_frac_low"] == 0.25


def test_clip_fractions_count_masked_tokens_over_the_mini_batch():
    ratios = [[1.5, 1.0, 0.5], [0.5, 5.0, 0.5]]
    mask = [[1, 1, 1], [1, 1, 0]]  # 5 tokens; the last one of row 2 would count as low-clipped
    _, metrics, _ = loss_and_grad([[math.log(r) for r in row] for row in ratios], [1.0, -1.0], mask=mask)
    # Row 1, A > 0: 1.5 is over the ceiling; 0.5 is under the floor but A > 0 does not clip there.
    # Row 2, A < 0: 0.5 is under the floor; 5.0 > 1 + 0.2 and -A * 5 = 5 > 3: dual-clipped.
    assert_close(metrics["clip_frac_high"], 1 / 5)
    assert_close(metrics["clip_frac_low"], 1 / 5)
    assert_close(metrics["dual_clip_frac"], 1 / 5)
    assert_close(metrics["ratio_mean"], (1.5 + 1.0 + 0.5 + 0.5 + 5.0) / 5)


# ------------------------------------------------------------------------------------------------- GSPO


def test_gspo_ratio_is_exp_of_the_mean_log_ratio_over_masked_tokens():
    # The masked fourth token's log-ratio (7) must not enter the mean.
    loss, metrics, grad = loss_and_grad([[0.1, -0.05, 0.25, 7.0]], [1.0], mask=[[1, 1, 1, 0]], loss="gspo")
    sequence_ratio = math.exp((0.1 - 0.05 + 0.25) / 3)  # 1.105, inside [0.8, 1.2]
    assert_close(metrics["ratio_mean"], sequence_ratio)
    assert_close(loss, -sequence_ratio)  # each of the 3 tokens: -A * s, token mean over 3
    # loss = -A * s with s = exp(mean of 3 log-ratios): d/dlogp_t = -A * s / 3 for each masked-in token
    assert_close(grad, [-sequence_ratio / 3] * 3 + [0.0])


def test_gspo_clips_the_sequence_ratio_not_each_token():
    # Token ratios 1.1 / e = 0.40 and 1.1 * e = 2.99 (the second would be clipped per token); their
    # mean log-ratio is log(1.1): the sequence ratio 1.1 is inside the range.
    loss, metrics, _ = loss_and_grad([[math.log(1.1) - 1.0, math.log(1.1) + 1.0]], [1.0], loss="gspo")
    assert_close(loss, -1.1)
    assert metrics["clip_frac_high"] == 0.0
    # Mean log-ratio log(1.5): the sequence ratio is clipped to 1.2 at every token, with no gradient.
    loss, metrics, grad = loss_and_grad([[math.log(1.5) - 1.0, math.log(1.5) + 1.0]], [1.0], loss="gspo")
    assert_close(loss, -1.2)
    assert grad.tolist() == [[0.0, 0.0]]
    assert metrics["clip_frac_high"] == 1.0


# --------------------------------------------------------------------------------------------------- KL


@pytest.mark.parametrize("d", [0.5, -0.5, 0.0, 2.0, -5.0])
def test_k3_kl_is_exp_d_minus_d_minus_one(d):
    logp = torch.tensor([-1.0], requires_grad=True)
    kl = estimators.k3_kl(logp, torch.tensor([-1.0 + d]))
    assert_close(kl, [math.exp(d) - d - 1])
    kl.sum().backward()
    assert_close(logp.grad, [-(math.exp(d) - 1)], tol=1e-5)  # d = ref - logp: dk3/dlogp = -(e^d - 1)


def test_k3_kl_clamps_inside_and_out():
    # d = 30 -> 20: e^20 - 21 = 4.9e8 -> 10.  d = -30 -> -20: e^-20 + 19 = 19.000000002 -> 10.
    # d = 3: e^3 - 4 = 16.09 -> 10 (the result clamp alone).  d = -9: e^-9 + 8 = 8.0001, under the clamp.
    d = [30.0, -30.0, 3.0, -9.0]
    logp = torch.zeros(4, requires_grad=True)
    kl = estimators.k3_kl(logp, torch.tensor(d))
    assert math.exp(20) - 21 > 10 and math.exp(-20) + 19 > 10
    assert_close(kl, [10.0, 10.0, 10.0, math.exp(-9) + 8])
    kl.sum().backward()
    assert_close(logp.grad, [0.0, 0.0, 0.0, -(math.exp(-9) - 1)])  # clamped values carry no gradient


def test_kl_term_is_added_with_its_coefficient_as_a_token_mean():
    # A = 0: only the KL remains. d = ref - logp: 0.5 and -0.5 in row 1; 1 and a masked-out 2 in row 2.
    ref_diffs = [[0.5, -0.5], [1.0, 2.0]]
    loss, metrics, _ = loss_and_grad([[0.0, 0.0], [0.0, 0.0]], [0.0, 0.0], mask=[[1, 1], [1, 0]],
                                     ref_diffs=ref_diffs, kl_coef=0.01)
    k3 = [math.exp(d) - d - 1 for d in (0.5, -0.5, 1.0)]
    assert_close(metrics["kl"], sum(k3) / 3)
    assert_close(loss, 0.01 * sum(k3) / 3)


# ------------------------------------------------------------------------------------------- token mean


def test_loss_is_the_mean_over_tokens_not_a_mean_of_sequence_means():
    # ratio 1 everywhere; row 1 has 1 token at A = +2, row 2 has 3 tokens at A = -1 (and one padded).
    mask = [[1, 0, 0, 0], [1, 1, 1, 0]]
    loss, _, grad = loss_and_grad([[0.0] * 4] * 2, [2.0, -1.0], mask=mask)
    assert_close(loss, (-2.0 + 1.0 + 1.0 + 1.0) / 4)  # 0.25; a mean of sequence means would be -0.5
    assert_close(grad, [-2.0 / 4, 0, 0, 0, 1 / 4, 1 / 4, 1 / 4, 0])


def test_micro_batch_losses_divided_by_the_mini_batch_count_add_up_to_the_token_mean():
    config = cfg(kl_coef=0.0)
    logp = torch.zeros(2, 4)
    old_logp = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.1, 0.0, -0.1, 0.0]])
    mask = torch.tensor([[1.0, 0, 0, 0], [1, 1, 1, 0]])
    advantages = torch.tensor([2.0, -1.0])
    parts = [ngrpo.policy_loss(logp[i : i + 1], old_logp[i : i + 1], advantages[i : i + 1], mask[i : i + 1],
                               settings=ngrpo.LossSettings.of(config), normalizer=torch.tensor(4.0))[0]
             for i in range(2)]
    # Row 2's ratios exp(-0.1), 1, exp(0.1) lie inside [0.8, 1.2]: -A * ratio each.
    expected = (-2.0 + math.exp(-0.1) + 1.0 + math.exp(0.1)) / 4
    assert_close(float(parts[0] + parts[1]), expected)


# ---------------------------------------------------------------------------------------- token_logprobs


def full_log_softmax(hidden, weight, labels, temperature):
    """The reference: all logits at once, log_softmax, gather; entropy = -(p * log p).sum."""
    logits = hidden @ weight.T / temperature  # [N, V]
    log_probs = logits.log_softmax(-1)
    return log_probs.gather(-1, labels[..., None])[..., 0], -(log_probs.exp() * log_probs).sum(-1)


def random_hidden_weight_labels(seed=0, shape=(3, 7), d=16, vocab=50):
    g = seeded(seed)
    hidden = torch.randn(*shape, d, generator=g)
    weight = torch.randn(vocab, d, generator=g) * 0.5
    labels = torch.randint(0, vocab, shape, generator=g)
    return hidden, weight, labels


@pytest.fixture(params=["log_softmax", "fused"])
def logprob_path(request, monkeypatch):
    """Both ways ChunkedLogprobs computes a chunk: log_softmax (a CPU) and the fused functions a GPU compiles
    (logprob_stats, logits_grad), here run as written."""
    if request.param == "fused":
        monkeypatch.setattr(logprobs, "_fused_or_none", lambda device: (logprobs.logprob_stats, logprobs.logits_grad,
                                                                         logprobs.logits_grad_with_entropy))
    return request.param


@pytest.mark.parametrize("chunk_tokens", [1, 4, 5, 21, 1024])  # 21 tokens: 4 and 5 do not divide it
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_equal_a_full_log_softmax(chunk_tokens, temperature, logprob_path):
    hidden, weight, labels = random_hidden_weight_labels()
    logp, entropy = logprobs.token_logprobs(hidden, weight, labels, temperature=temperature, chunk_tokens=chunk_tokens)
    ref_logp, ref_entropy = full_log_softmax(hidden, weight, labels, temperature)
    assert logp.shape == entropy.shape == labels.shape
    assert torch.allclose(logp, ref_logp, atol=1e-5)
    assert torch.allclose(entropy, ref_entropy, atol=1e-5)


@pytest.mark.parametrize("chunk_tokens", [1, 4, 5, 1024])
@pytest.mark.parametrize("uses", ["entropy", "both"])
def test_the_entropy_gradient_through_the_chunks_equals_autograd_over_full_logits(chunk_tokens, uses, logprob_path):
    """A loss may use the entropy (an entropy bonus): its gradient through the chunked backward, alone or beside the
    log-probs', equals plain autograd through the full [N, V] log_softmax."""
    hidden, weight, labels = random_hidden_weight_labels(seed=3)
    on_logp = torch.randn(labels.shape, generator=seeded(4)) if uses == "both" else torch.zeros(labels.shape)
    on_entropy = torch.randn(labels.shape, generator=seeded(5))
    grads = []
    for chunked in (True, False):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if chunked:
            logp, entropy = logprobs.token_logprobs(h, w, labels, temperature=0.7, chunk_tokens=chunk_tokens)
        else:
            logp, entropy = full_log_softmax(h, w, labels, 0.7)
        loss = (entropy * on_entropy).sum() + ((logp * on_logp).sum() if uses == "both" else 0.0)
        loss.backward()
        grads.append((h.grad, w.grad))
    (h_ours, w_ours), (h_ref, w_ref) = grads
    assert float(h_ref.abs().max()) > 1e-2  # a gradient to compare
    assert torch.allclose(h_ours, h_ref, atol=1e-5, rtol=1e-5)
    assert torch.allclose(w_ours, w_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk_tokens", [1, 4, 5, 1024])
def test_token_logprobs_gradient_equals_the_unchunked_reference(chunk_tokens, logprob_path):
    hidden, weight, labels = random_hidden_weight_labels(seed=1)
    upstream = torch.randn(labels.shape, generator=seeded(2))  # a loss that weighs each token differently
    grads = []
    for chunked in (True, False):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if chunked:
            logp, _ = logprobs.token_logprobs(h, w, labels, temperature=0.7, chunk_tokens=chunk_tokens)
        else:
            logp, _ = full_log_softmax(h, w, labels, 0.7)
        (logp * upstream).sum().backward()
        grads.append((h.grad, w.grad))
    (h_ours, w_ours), (h_ref, w_ref) = grads
    assert torch.allclose(h_ours, h_ref, atol=1e-5, rtol=1e-5)
    assert torch.allclose(w_ours, w_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk_tokens", [1, 5, 1024])
@pytest.mark.parametrize("uses", ["logp", "both"])
def test_k_labels_per_position_give_each_log_prob_and_the_gradient_of_autograd(chunk_tokens, uses, logprob_path):
    """Labels [..., K] (Multiplex Thinking's K sampled tokens per position, one drawn twice): log p of each [..., K]
    and, for a loss over all K (and the entropy), the gradient of plain autograd through the full log_softmax."""
    hidden, weight, _ = random_hidden_weight_labels(seed=6)
    labels = torch.randint(0, weight.shape[0], (*hidden.shape[:-1], 3), generator=seeded(7))
    labels[0, 0, 2] = labels[0, 0, 0]  # a token drawn twice counts twice
    on_logp = torch.randn(labels.shape, generator=seeded(8))
    on_entropy = torch.randn(labels.shape[:-1], generator=seeded(9)) if uses == "both" else None
    results = []
    for chunked in (True, False):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if chunked:
            logp, entropy = logprobs.token_logprobs(h, w, labels, temperature=0.7, chunk_tokens=chunk_tokens)
        else:
            log_probs = (h @ w.T / 0.7).log_softmax(-1)  # [..., V]
            logp, entropy = log_probs.gather(-1, labels), -(log_probs.exp() * log_probs).sum(-1)
        loss = (logp * on_logp).sum() + ((entropy * on_entropy).sum() if on_entropy is not None else 0.0)
        loss.backward()
        results.append((logp.detach(), entropy.detach(), h.grad, w.grad))
    ours, ref = results
    assert ours[0].shape == labels.shape and ours[1].shape == labels.shape[:-1]
    assert float(ref[2].abs().max()) > 1e-2  # a gradient to compare
    for mine, theirs in zip(ours, ref):
        assert torch.allclose(mine, theirs, atol=1e-5, rtol=1e-5)


# -------------------------------------------------------------------------- replay and the mini-batch


@pytest.fixture(scope="module")
def tiny():
    """The random tiny Qwen2 preset, fp32 on CPU, and a 2-neighbor cosine table of its output matrix."""
    model = M.load_model("tiny", dtype=torch.float32, device="cpu").eval()
    return model, build_neighbor_table(model.output_weight, 2)


@pytest.fixture(scope="module")
def confident(tiny):
    """The tiny model with its output matrix scaled by 20: peaked next-token distributions, as a trained
    model has (random weights alone give nearly uniform ones)."""
    model = copy.deepcopy(tiny[0])
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    return model, build_neighbor_table(model.output_weight, 2)


@torch.no_grad()
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("exploration", [Exploration("neighbor", mix_rate=0.5, num_neighbors=2),
                                         Exploration("soft", soft_top_k=4)], ids=["neighbor", "soft"])
def test_replayed_logprobs_equal_the_sampling_logprobs(confident, temperature, exploration):
    model, table = confident
    rollout = generate(model, PROMPTS, Sampling(temperature=temperature, max_new_tokens=20, stop_ids=STOP_IDS),
                       exploration, neighbor_table=table, seed=0)
    assert rollout.mixed.any()
    logp, _ = replay.sequence_logprobs(model, rollout, temperature=temperature, chunk_tokens=7)
    mask = torch.arange(rollout.response_ids.shape[1])[None] < rollout.lengths[:, None]
    assert (logp - rollout.logprobs)[mask].abs().max() < 1e-4


def episodes_from_a_rollout(model, table, *, old_logp_noise: float, with_ref: bool, seed: int = 4):
    """Episodes from a real neighbor-mixing rollout: rows of different lengths, ended by a stop id or
    truncated (seed 4: lengths 7, 8, 16 (truncated), 2, 2)."""
    rollout = generate(model, PROMPTS, Sampling(max_new_tokens=16, stop_ids=STOP_IDS),
                       Exploration("neighbor", mix_rate=0.5, num_neighbors=2), neighbor_table=table,
                       seed=seed)
    g = seeded(seed + 1)
    old_logp = rollout.logprobs + old_logp_noise * torch.randn(rollout.logprobs.shape, generator=g)
    ref_logp = rollout.logprobs + 0.5 * torch.randn(rollout.logprobs.shape, generator=g) if with_ref else None
    advantages = torch.tensor([1.5, -0.5, -0.5, -0.5, 0.8])
    episodes = ngrpo.Episodes(rollout, advantages, old_logp, ref_logp)
    return rollout, episodes


def test_gradient_does_not_depend_on_the_micro_batch_size(tiny):
    model, table = tiny
    model = copy.deepcopy(model)
    rollout, episodes = episodes_from_a_rollout(model, table, old_logp_noise=0.5, with_ref=True)
    lengths = rollout.lengths.tolist()
    assert rollout.mixed.any() and len(set(lengths)) > 2 and rollout.finished.any() and not rollout.finished.all()
    config = cfg(kl_coef=0.01)
    grads, metrics = {}, {}
    for micro_batch_size in (1, 2, len(episodes)):  # 2 splits 5 rows as 2 + 2 + 1
        model.zero_grad(set_to_none=True)
        metrics[micro_batch_size] = ngrpo.backward_minibatch(
            model, episodes, dataclasses.replace(config, micro_batch_size=micro_batch_size, logprob_chunk_tokens=16))
        grads[micro_batch_size] = {name: p.grad.clone() for name, p in model.named_parameters()}
    # The ratios do differ from 1: some tokens are clipped on each side, some dual-clipped.
    assert all(metrics[len(episodes)][key] > 0 for key in ("clip_frac_high", "clip_frac_low", "dual_clip_frac"))
    reference = grads[len(episodes)]
    for micro_batch_size in (1, 2):
        for name, grad in grads[micro_batch_size].items():
            norm = reference[name].norm()
            if norm == 0:
                assert grad.norm() == 0, name
            else:
                assert (grad - reference[name]).norm() / norm < 1e-6, (micro_batch_size, name)
        assert metrics[micro_batch_size]["loss"] == pytest.approx(metrics[len(episodes)]["loss"], rel=1e-5)


def test_minibatch_loss_is_the_token_mean_over_all_its_response_tokens(tiny):
    model, table = tiny
    # old_logp = the sampler's own log-probs: replay reproduces them (< 1e-5 here), so every ratio is 1
    # and each token's loss is -A of its row.
    rollout, episodes = episodes_from_a_rollout(model, table, old_logp_noise=0.0, with_ref=False)
    lengths, advantages = rollout.lengths.tolist(), [1.5, -0.5, -0.5, -0.5, 0.8]
    assert len(set(lengths)) > 2
    expected = -sum(a * n for a, n in zip(advantages, lengths)) / sum(lengths)
    mean_of_sequence_means = -sum(advantages) / len(advantages)
    assert abs(expected - mean_of_sequence_means) > 0.01  # the example tells the two apart
    for micro_batch_size in (1, 2, len(episodes)):
        metrics = ngrpo.backward_minibatch(copy.deepcopy(model), episodes,
                                           cfg(kl_coef=0.0, micro_batch_size=micro_batch_size))
        assert metrics["loss"] == pytest.approx(expected, abs=1e-4)
        assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)


def test_cosine_schedule_against_hand_values():
    """--lr-schedule cosine with lr 1, 2 warm-up steps, floor 0.1, 10 steps: 1/2, 2/2, then
    0.1 + 0.9 * (1 + cos(pi * k / 7)) / 2 for k = 0..7 (computed here from the formula, by hand)."""
    cfg = Config(lr=1.0, lr_schedule="cosine", warmup_steps=2, min_lr_ratio=0.1)
    expected = [0.5, 1.0] + [0.1 + 0.9 * (1 + math.cos(math.pi * k / 7)) / 2 for k in range(8)]
    assert [ngrpo.scheduled_lr(cfg, step, 10) for step in range(10)] == pytest.approx(expected, abs=1e-12)
    assert ngrpo.scheduled_lr(cfg, 9, 10) == pytest.approx(0.1)  # the last step sits on the floor
    assert [ngrpo.scheduled_lr(Config(lr=3e-4), step, 10) for step in range(10)] == [3e-4] * 10


def test_bad_schedule_settings_are_one_message():
    with pytest.raises(ValueError, match="--lr-schedule linear: must be one of constant, cosine"):
        Config(lr_schedule="linear")
    with pytest.raises(ValueError, match=r"--min-lr-ratio 1.5: must be in \[0, 1\]"):
        Config(min_lr_ratio=1.5)


def test_on_policy_update_skips_the_replay_and_has_the_replayed_gradient(tiny, monkeypatch):
    """One optimizer step on the weights that sampled (one mini-batch, one epoch): the old log-probs are the
    update forward's own, detached, and the no-grad replay is skipped. The gradient equals the one with old
    log-probs from a separate replay (ratio 1 either way: gradient -A grad log p / tokens), and the
    sampler-vs-trainer gap is still measured."""
    model, table = tiny
    rollout = generate(model, PROMPTS, Sampling(max_new_tokens=16, stop_ids=STOP_IDS),
                       Exploration("neighbor", mix_rate=0.5, num_neighbors=2), neighbor_table=table, seed=4)
    advantages = torch.tensor([1.5, -0.5, -0.5, -0.5, 0.8])
    config = cfg(kl_coef=0.0, micro_batch_size=2)
    replays = []
    real_replay = ngrpo.replay_logprobs
    monkeypatch.setattr(ngrpo, "replay_logprobs", lambda *a, **k: replays.append(1) or real_replay(*a, **k))
    grads, metrics = {}, {}
    for on_policy in (False, True):
        trained = copy.deepcopy(model)
        episodes, gap, _ = ngrpo.make_episodes(trained, None, rollout, advantages, config, on_policy=on_policy)
        assert (episodes.old_logp is None) == on_policy and (gap is None) == on_policy
        trained.zero_grad(set_to_none=True)
        metrics[on_policy] = ngrpo.backward_minibatch(trained, episodes, config)
        grads[on_policy] = {name: p.grad for name, p in trained.named_parameters() if p.grad is not None}
    assert replays == [1]  # only the off-policy path replayed
    for name, grad in grads[False].items():
        assert (grads[True][name] - grad).norm() <= 1e-6 * max(grad.norm(), 1e-12), name
    assert metrics[True]["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics[True]["loss"] == pytest.approx(metrics[False]["loss"])
    assert 0 <= metrics[True]["logp_gap_mean"] <= metrics[True]["logp_gap_max"] < 1e-4


def test_update_is_on_policy_only_for_one_step_on_the_sampled_weights(tiny, monkeypatch):
    model, table = tiny
    rollout = generate(model, PROMPTS[:4], Sampling(max_new_tokens=8, stop_ids=STOP_IDS), seed=1)
    seen = []
    real = ngrpo.make_episodes
    monkeypatch.setattr(ngrpo, "make_episodes", lambda *a, on_policy, **k: seen.append(on_policy) or real(
        *a, on_policy=on_policy, **k))
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    for overrides in (dict(mini_batch_prompts=2), dict(mini_batch_prompts=1), dict(mini_batch_prompts=2,
                                                                                      ppo_epochs=2)):
        trained = copy.deepcopy(model)
        optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-3)
        result, skipped = ngrpo.update(trained, None, optimizer, rollout, rewards,
                                       cfg(group_size=2, prompts_per_step=2, kl_coef=0.0, **overrides))
        assert not skipped and "logp_gap_max" in result
    assert seen == [True, False, False]


def test_an_update_frees_the_gradients_it_made(tiny):
    """.grad is not held through the next rollouts (runtime/plan.py counts the gradients in the update phase only)."""
    model, _ = tiny
    rollout = generate(model, PROMPTS[:4], Sampling(max_new_tokens=8, stop_ids=STOP_IDS), seed=1)
    trained = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in trained.parameters()]
    ngrpo.update(trained, None, optimizer, rollout, torch.tensor([1.0, 0.0, 0.0, 1.0]),
                 cfg(group_size=2, prompts_per_step=2, mini_batch_prompts=1, kl_coef=0.0))
    assert any(not torch.equal(p, b) for p, b in zip(trained.parameters(), before))  # it did step
    assert all(p.grad is None for p in trained.parameters())
