"""The soft-token methods beside N-GRPO (strategies.py): Mixture of Inputs (`mixinputs`), Randomized Soft Thinking's
Gumbel-softmax soft tokens (`soft-gumbel`), Multiplex Thinking (`multiplex`: its draws, merge and joint loss),
SofT-GRPO (`soft-grpo`: its rollouts and reparameterised log-probability), and Soft Thinking's Dirichlet noise, min-p
and Cold Stop. Each fed input is
checked against the paper's formula computed here by brute force (plain Python floats) on hand-set logits; Cold Stop on
a scripted low-entropy stretch through the engine's slots and refill; and short tiny-model training runs, whose
logged sampler-vs-replay log-prob gap must be at float rounding, and whose resumed run must equal an uninterrupted
one."""

import json
import math
from dataclasses import replace

import pytest
import torch
from conftest import script_think_ends

import rollout
import train
from config import preset
from engine import decoder as engine
from engine.draws import DIRICHLET, GAMMA_TRIES, GUMBEL, MULTIPLEX, NOISE, RowDraws, gamma_log_draws
from engine.logprobs import token_logprobs
from model import ModelConfig, load_model, random_model
from ngrpo import LossSettings, policy_loss
from rollout import Sampling, filtered_logits, generate
from strategies import STRATEGIES, Exploration, StepView, mixture_inputs, multiplex_draws, soft_grpo_logprob

V, D = 30, 6
EMBED = torch.randn(V, D, generator=torch.Generator().manual_seed(0))
LOGITS = torch.randn(3, V, generator=torch.Generator().manual_seed(1)) * 2.0  # [3, V]


def softmax(xs: list[float]) -> list[float]:
    top = max(xs)
    e = [math.exp(x - top) for x in xs]
    return [v / sum(e) for v in e]


def ranked(xs: list[float]) -> list[int]:
    return sorted(range(len(xs)), key=lambda i: -xs[i])


def weighted_sum(weights: list[float], ids: list[int]) -> list[float]:
    """sum_c w_c E[c] in float64, one coordinate at a time."""
    return [sum(w * float(EMBED[c, j]) for w, c in zip(weights, ids)) for j in range(D)]


def step_view(x: Exploration, token: list[int], *, tau: float = 1.0, top_k: int = 0, seed: int = 0,
              keys: list[int] | None = None, positions: list[int] | None = None) -> StepView:
    """One decode step of LOGITS' rows, every row eligible, y = token; the view's p after temperature tau and a
    top-k filter (what the sampler hands a strategy), the raw logits as they came."""
    B = LOGITS.shape[0]
    scaled = filtered_logits(LOGITS, tau, top_k)
    keys = torch.tensor(keys if keys is not None else list(range(B)))
    positions = torch.tensor(positions if positions is not None else [0] * B)
    return StepView(x, scaled, scaled.softmax(-1), torch.tensor(token), torch.ones(B, dtype=torch.bool),
                    torch.full((B,), 0.5, dtype=torch.float64), tau, EMBED, None, RowDraws(seed, keys, positions), {},
                    LOGITS.clone())


# ----------------------------------------------------------------------------- ThinkRouter


@pytest.mark.parametrize("threshold", [0.0, 0.5, 0.75, 1.0])
def test_thinkrouter_feeds_the_top_k_mixture_where_the_model_is_confident_and_the_sampled_token_elsewhere(threshold):
    """ThinkRouter (arXiv 2602.11683): where max p >= tau, Soft Thinking's mixture of the top 4 of p renormalised; the
    sampled token y elsewhere. Rows of LOGITS at temperature 0.5 have max p of about 0.83, 0.68 and 0.37."""
    x = Exploration("thinkrouter", soft_top_k=4, router_confidence=threshold)
    tokens = [3, 7, 11]
    mixture = STRATEGIES["thinkrouter"].explore(step_view(x, tokens, tau=0.5))
    confident = []
    for row, y in enumerate(tokens):
        p = softmax([float(z) / 0.5 for z in LOGITS[row]])
        top = ranked(p)[:4]
        confident.append(max(p) >= threshold)
        expected = weighted_sum([p[c] / sum(p[c] for c in top) for c in top], top) if confident[-1] else \
            weighted_sum([1.0], [y])
        assert mixture.inputs[row].tolist() == pytest.approx(expected, abs=1e-5)
    assert mixture.mixed.tolist() == confident
    assert threshold not in (0.5, 0.75) or 0 < sum(confident) < len(tokens)  # the thresholds between the rows split


# ----------------------------------------------------------------------------- Mixture of Inputs


def mixinputs_by_hand(z: list[float], y: int, beta: float) -> list[float]:
    """Zhuang et al. (arXiv 2505.14827), as the authors' gpu_model_runner.py computes it: the prior q = p renormalised
    over the 20 most likely tokens of the raw logits, H_n = H(q) / log 20, the posterior (q + beta onehot(y)) /
    (1 + beta), fed as H_n E[posterior] + (1 - H_n) E[y]; beta <= -99: sum q_c E[c]."""
    top = ranked(z)[:20]
    q = softmax([z[c] for c in top])
    if beta <= -99:
        return weighted_sum(q, top)
    h = -sum(v * math.log(v) for v in q) / math.log(20)
    posterior = [(v + beta * (c == y)) / (1 + beta) for v, c in zip(q, top)]
    return weighted_sum([h * w for w in posterior] + [1 - h], top + [y])


@pytest.mark.parametrize("beta", [1.0, 0.5, 0.0, -100.0])
def test_mixinputs_feeds_the_posterior_of_the_prior_and_the_sampled_token(beta):
    """Row 0 samples the top token, row 1 one outside the top 20 (its posterior then sums to 1 / (1 + beta), as
    the authors' code leaves it), row 2 the fifth. The view's temperature and top-k do not touch the prior."""
    z = LOGITS.tolist()
    token = [ranked(z[0])[0], ranked(z[1])[-1], ranked(z[2])[4]]
    mixture = STRATEGIES["mixinputs"].explore(step_view(Exploration("mixinputs", mixinputs_beta=beta), token,
                                                        tau=0.6, top_k=5))
    expected = torch.tensor([mixinputs_by_hand(z[b], token[b], beta) for b in range(3)], dtype=torch.float64)
    assert torch.allclose(mixture.inputs.double(), expected, atol=1e-5, rtol=0)
    assert mixture.mixed.all() and mixture.cand_ids.shape == (3, 21)
    # the record rebuilds the fed input exactly (what replay.py feeds)
    assert torch.equal(mixture_inputs(EMBED, {"cand_ids": mixture.cand_ids, "cand_weights": mixture.cand_weights}),
                       mixture.inputs)


# ----------------------------------------------------------------------------- Gumbel-softmax soft tokens


def soft_gumbel_by_hand(z: list[float], tau: float, k: int, tau_g: float, u: list[float]) -> list[float]:
    """Wu et al. (arXiv 2508.03440), the authors' sglang sampler: q = p = softmax(z / tau) renormalised over its top
    k, w = softmax((log q + g) / tau_g) with g = -log(-log u) one Gumbel draw per candidate, fed sum w_c E[c]."""
    p = softmax([v / tau for v in z])
    top = ranked(p)[:k]
    q = [p[c] / sum(p[c] for c in top) for c in top]
    w = softmax([(math.log(v) - math.log(-math.log(ui))) / tau_g for v, ui in zip(q, u)])
    return weighted_sum(w, top)


@pytest.mark.parametrize("tau, tau_g", [(1.0, 0.5), (0.6, 1.0)])
def test_soft_gumbel_feeds_the_gumbel_softmax_of_the_top_k(tau, tau_g):
    """Keys 7, 3, 12 at positions 4, 0, 9: each row's Gumbel draws are the uniforms of its own GUMBEL stream at
    (seed, key, position)."""
    x = Exploration("soft-gumbel", soft_top_k=4, gumbel_temperature=tau_g)
    keys, positions = [7, 3, 12], [4, 0, 9]
    mixture = STRATEGIES["soft-gumbel"].explore(step_view(x, [0, 0, 0], tau=tau, seed=5, keys=keys,
                                                          positions=positions))
    u = RowDraws(5, torch.tensor(keys), torch.tensor(positions)).uniform(GUMBEL, 4).tolist()
    expected = torch.tensor([soft_gumbel_by_hand(z, tau, 4, tau_g, u[b]) for b, z in enumerate(LOGITS.tolist())],
                            dtype=torch.float64)
    assert torch.allclose(mixture.inputs.double(), expected, atol=1e-5, rtol=0)
    assert torch.equal(mixture_inputs(EMBED, {"cand_ids": mixture.cand_ids, "cand_weights": mixture.cand_weights}),
                       mixture.inputs)


def test_soft_gumbel_weights_move_with_the_draws_not_the_probabilities_alone():
    """Different seeds give different weights over the same candidates (plain `soft` would feed q itself)."""
    x = Exploration("soft-gumbel", soft_top_k=4, gumbel_temperature=0.5)
    a, b = (STRATEGIES["soft-gumbel"].explore(step_view(x, [0, 0, 0], seed=s)) for s in (1, 2))
    assert torch.equal(a.cand_ids.sort(-1).values, b.cand_ids.sort(-1).values)
    assert not torch.allclose(a.cand_weights, b.cand_weights)


# ----------------------------------------------------------------------------- Soft Thinking's Dirichlet noise


def gamma_by_hand(a: float, u: list[float]) -> float:
    """Gamma(a, 1) from the uniforms u[j] (block j of the row): Marsaglia and Tsang's Gamma(a + 1), the first of
    GAMMA_TRIES proposals x = sqrt(-2 log u1) cos(2 pi u2) that passes log u < x^2 / 2 + d - d v + d log v (else x = 0),
    times u[0]^(1/a) (Gamma(a) = Gamma(a + 1) U^(1/a)); a = 0 gives 0."""
    if a == 0:
        return 0.0
    d = a + 1 - 1 / 3
    c = 1 / math.sqrt(9 * d)
    v = 1.0
    for r in range(GAMMA_TRIES):
        u1, u2, ua = u[3 * r + 1], u[3 * r + 2], u[3 * r + 3]
        x = math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)
        vx = (1 + c * x) ** 3
        if vx > 0 and math.log(ua) < x * x / 2 + d - d * vx + d * math.log(vx):
            v = vx
            break
    return d * v * u[0] ** (1 / a)


def soft_dirichlet_by_hand(z: list[float], tau: float, filter_k: int, k: int, alpha: float,
                           u: list[float]) -> list[float]:
    """Soft Thinking's sglang sampler with --add_noise_dirichlet: p = softmax(z / tau) over the filter's top
    filter_k, g_v ~ Gamma(alpha p_v) (token v reads u[j V + v] of block j), p' = g / sum g, fed the top k of p'
    renormalised."""
    kept = ranked(z)[:filter_k]
    e = {c: math.exp((z[c] - max(z)) / tau) for c in kept}
    p = [e.get(c, 0.0) / sum(e.values()) for c in range(V)]
    g = [gamma_by_hand(alpha * p[c], u[c::V]) for c in range(V)]
    top = ranked(g)[:k]
    return weighted_sum([g[c] / sum(g[c] for c in top) for c in top], top)


@pytest.mark.parametrize("alpha", [1.0, 30.0])
def test_soft_dirichlet_feeds_the_top_k_of_a_dirichlet_draw_from_the_rows_own_uniforms(alpha):
    """Keys 7, 3, 12 at positions 4, 0, 9, a top-12 filter (18 tokens at concentration 0, never fed)."""
    x = Exploration("soft", soft_top_k=4, dirichlet_alpha=alpha)
    keys, positions = [7, 3, 12], [4, 0, 9]
    mixture = STRATEGIES["soft"].explore(step_view(x, [0, 0, 0], tau=0.6, top_k=12, seed=5, keys=keys,
                                                   positions=positions))
    u = RowDraws(5, torch.tensor(keys), torch.tensor(positions)).uniform(DIRICHLET, (3 * GAMMA_TRIES + 1) * V)
    expected = torch.tensor([soft_dirichlet_by_hand(z, 0.6, 12, 4, alpha, u[b].tolist())
                             for b, z in enumerate(LOGITS.tolist())], dtype=torch.float64)
    assert torch.allclose(mixture.inputs.double(), expected, atol=1e-5, rtol=0)
    assert torch.equal(mixture_inputs(EMBED, {"cand_ids": mixture.cand_ids, "cand_weights": mixture.cand_weights}),
                       mixture.inputs)


@pytest.mark.parametrize("a", [0.05, 1.0, 7.0])
def test_gamma_draws_have_the_gamma_mean_and_variance(a):
    """40,000 rows' draws at concentration a: mean a and variance a, within 4 standard errors (the sample
    variance's: sqrt((mu_4 - a^2) / n), Gamma's fourth central moment mu_4 = 3 a^2 + 6 a)."""
    n = 40_000
    draws = RowDraws(11, torch.arange(n), torch.zeros(n, dtype=torch.long))
    g = gamma_log_draws(draws, DIRICHLET, torch.full((n, 1), a)).exp()[:, 0]
    assert abs(g.mean() - a) < 4 * math.sqrt(a / n)
    assert abs(g.var() - a) < 4 * math.sqrt((2 * a * a + 6 * a) / n)


# ----------------------------------------------------------------------------- Soft Thinking's min-p


# ----------------------------------------------------------------------------- Multiplex Thinking


def inverse_cdf(p: list[float], u: float) -> int:
    """The first token whose cumulative probability exceeds u * sum p (plain floats)."""
    total, running = sum(p), 0.0
    for token, mass in enumerate(p):
        running += mass
        if running > u * total:
            return token
    return max(t for t, mass in enumerate(p) if mass > 0)


@pytest.mark.parametrize("weights", ["uniform", "probs"])
@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("tau, top_k", [(1.0, 0), (0.7, 5)])
def test_multiplex_feeds_the_merge_of_k_tokens_drawn_from_p(weights, replacement, tau, top_k):
    """Multiplex Thinking (arXiv 2601.08808, its sglang sampler): the step's action y, then K - 1 inverse-CDF draws
    from p (top-k applied) at the row's MULTIPLEX uniforms, each from p without the tokens drawn so far when without
    replacement; fed as the plain average of their embeddings (uniform) or weighted by p renormalised over the K."""
    K, token = 4, [3, 7, 11]
    x = Exploration("multiplex", multiplex_width=K, multiplex_weights=weights, multiplex_replacement=replacement)
    view = step_view(x, token, tau=tau, top_k=top_k, seed=5, keys=[2, 9, 4], positions=[0, 3, 8])
    view = replace(view, token=view.probs.argmax(-1))  # y: a token top-k keeps
    mixture = STRATEGIES["multiplex"].explore(view)
    uniforms = view.draws.uniform(MULTIPLEX, K - 1)
    for row in range(LOGITS.shape[0]):
        p = [float(v) for v in view.probs[row].double()]
        drawn = [int(view.token[row])]
        for k in range(K - 1):
            left = p if replacement else [0.0 if t in drawn else mass for t, mass in enumerate(p)]
            drawn.append(inverse_cdf(left, float(uniforms[row, k])))
        w = [1.0] * K if weights == "uniform" else [p[t] for t in drawn]
        w = [v / sum(w) for v in w]
        assert mixture.cand_ids[row].tolist() == drawn
        assert replacement or len(set(drawn)) == K
        assert all(p[t] > 0 for t in drawn)  # top-k's removed tokens are never drawn
        assert mixture.cand_weights[row].tolist() == pytest.approx(w, abs=1e-6)
        assert mixture.inputs[row].tolist() == pytest.approx(weighted_sum(w, drawn), abs=1e-5)


@pytest.mark.parametrize("weights", ["uniform", "probs"])
def test_multiplex_with_dirichlet_noise_draws_all_k_tokens_the_action_too_from_the_noisy_p(weights):
    """Multiplex Thinking's sampler with Dirichlet noise: p' = g / sum g, g_v ~ Gamma(alpha p_v) (the row's DIRICHLET
    uniforms), replaces p for the K draws, the first of which is the step's action (its K MULTIPLEX uniforms); the
    merge is uniform or weighted by p' renormalised over the K."""
    K, alpha, keys, positions = 3, 2.0, [7, 3, 12], [4, 0, 9]
    x = Exploration("multiplex", multiplex_width=K, multiplex_weights=weights, dirichlet_alpha=alpha)
    view = step_view(x, [0, 0, 0], tau=0.7, top_k=10, seed=5, keys=keys, positions=positions)
    mixture = STRATEGIES["multiplex"].explore(view)
    draws = RowDraws(5, torch.tensor(keys), torch.tensor(positions))
    gamma_u = draws.uniform(DIRICHLET, (3 * GAMMA_TRIES + 1) * V)
    uniforms = draws.uniform(MULTIPLEX, K)
    for row in range(LOGITS.shape[0]):
        p = [float(v) for v in view.probs[row].double()]
        g = [gamma_by_hand(alpha * p[c], gamma_u[row, c::V].tolist()) for c in range(V)]
        noisy = [v / sum(g) for v in g]
        drawn = [inverse_cdf(noisy, float(uniforms[row, k])) for k in range(K)]
        w = [1.0] * K if weights == "uniform" else [noisy[t] for t in drawn]
        w = [v / sum(w) for v in w]
        assert mixture.cand_ids[row].tolist() == drawn and int(mixture.token[row]) == drawn[0]
        assert mixture.cand_weights[row].tolist() == pytest.approx(w, rel=1e-4, abs=1e-6)
        assert mixture.inputs[row].tolist() == pytest.approx(weighted_sum(w, drawn), abs=1e-5)


@pytest.mark.parametrize("weights", ["uniform", "probs"])
def test_multiplex_with_gumbel_noise_draws_all_k_tokens_from_the_gumbel_softmax_of_p(weights):
    """Multiplex Thinking's sampler with enable_gumbel: p' = softmax((log max(p, 1e-20) + g) / tau) over the
    vocabulary, g = -log(-log u) at the row's GUMBEL uniforms (one per token), replaces p for the K draws (its K
    MULTIPLEX uniforms), the first being the action."""
    K, tau, keys, positions = 3, 0.7, [7, 3, 12], [4, 0, 9]
    x = Exploration("multiplex", multiplex_width=K, multiplex_weights=weights, multiplex_gumbel_tau=tau)
    view = step_view(x, [0, 0, 0], tau=0.8, top_k=12, seed=5, keys=keys, positions=positions)
    mixture = STRATEGIES["multiplex"].explore(view)
    draws = RowDraws(5, torch.tensor(keys), torch.tensor(positions))
    gumbel_u, uniforms = draws.uniform(GUMBEL, V), draws.uniform(MULTIPLEX, K)
    for row in range(LOGITS.shape[0]):
        p = [float(v) for v in view.probs[row].double()]
        noisy = softmax([(math.log(max(v, 1e-20)) - math.log(-math.log(float(u)))) / tau
                         for v, u in zip(p, gumbel_u[row])])
        drawn = [inverse_cdf(noisy, float(uniforms[row, k])) for k in range(K)]
        w = [1.0] * K if weights == "uniform" else [noisy[t] for t in drawn]
        w = [v / sum(w) for v in w]
        assert mixture.cand_ids[row].tolist() == drawn and int(mixture.token[row]) == drawn[0]
        assert mixture.cand_weights[row].tolist() == pytest.approx(w, rel=1e-4, abs=1e-6)


def test_multiplex_entropy_mask_mixes_only_the_steps_above_the_threshold():
    """enable_entropy_mask: a thinking step whose H(p) is at or under the threshold feeds its sampled token."""
    view = step_view(Exploration("multiplex"), [1, 2, 3], tau=0.8, seed=5)
    entropy = [-sum(v * math.log(v) for v in softmax([float(z) / 0.8 for z in row]) if v > 0)
               for row in LOGITS.tolist()]
    threshold = sorted(entropy)[1]  # the middle row's: it and the lower one are not mixed
    x = Exploration("multiplex", multiplex_entropy_mask=threshold)
    mixture = STRATEGIES["multiplex"].explore(replace(view, exploration=x))
    assert mixture.mixed.tolist() == [h > threshold for h in entropy] and sum(mixture.mixed.tolist()) == 1
    for row in range(LOGITS.shape[0]):
        if not mixture.mixed[row]:
            assert mixture.cand_ids[row].tolist() == [row + 1] * 3 and mixture.cand_weights[row].tolist() == [1, 0, 0]


def test_multiplex_draws_are_distributed_as_p():
    """Over 20,000 rows (their own keys) the extra draws of one step follow p: each token's frequency within 5
    standard errors of its probability."""
    rows, K = 20_000, 3
    z = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    p = z.softmax(-1)
    probs = p.expand(rows, -1)
    draws = RowDraws(11, torch.arange(rows), torch.zeros(rows, dtype=torch.long)).uniform(MULTIPLEX, K - 1)
    drawn = multiplex_draws(probs, torch.zeros(rows, dtype=torch.long), draws)[:, 1:].reshape(-1)
    frequency = torch.bincount(drawn, minlength=len(z)).double() / drawn.numel()
    error = (p.double() * (1 - p.double()) / drawn.numel()).sqrt()
    assert ((frequency - p.double()).abs() <= 5 * error + 1e-12).all(), (frequency, p)


def released_multiplex_loss(logp, old_logp, advantages, mask, weights, clip=0.2, clip_c=3.0) -> torch.Tensor:
    """verl's compute_multiplex_thinking_policy_loss (Multiplex Thinking's release, core_algos.py) as written there,
    loop by loop: a step whose weights are [1, 0, ...] is an answer token (only its first candidate counts), every
    candidate of the others counts; per candidate the dual-clipped PPO loss; summed over the candidates; token-mean."""
    total, tokens = 0.0, 0
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if not mask[b, t]:
                continue
            tokens += 1
            answer = float(weights[b, t, 0]) == 1.0 and float(weights[b, t, 1:].sum()) == 0.0
            for k in range(logp.shape[2]):
                if answer and not float(weights[b, t, k]) > 1e-20:
                    continue
                ratio = torch.exp((logp[b, t, k] - old_logp[b, t, k]).clamp(-20.0, 20.0))
                a = advantages[b]
                loss1 = torch.maximum(-a * ratio, -a * ratio.clamp(1 - clip, 1 + clip))
                total = total + (torch.minimum(-a * clip_c, loss1) if a < 0 else loss1)
    return total / tokens


def test_the_joint_loss_and_its_gradient_equal_the_released_multiplex_loss():
    g = torch.Generator().manual_seed(12)
    B, T, K = 4, 5, 3
    logp = (torch.randn(B, T, K, generator=g) * 0.3 - 2.0).requires_grad_()
    old_logp = logp.detach() + torch.randn(B, T, K, generator=g) * 0.3  # ratios from ~0.4 to ~2.5: clips on
    advantages = torch.tensor([1.5, -0.7, -2.0, 0.4])
    mask = torch.rand(B, T, generator=g) > 0.2
    weights = torch.full((B, T, K), 1.0 / K)
    answer = torch.rand(B, T, generator=g) > 0.6
    weights[answer] = torch.tensor([1.0, 0.0, 0.0])
    settings = LossSettings(kl_coef=0.0, dual_clip=3.0)
    ours, _ = policy_loss(logp, old_logp, advantages, mask, settings=settings, candidates=weights > 0)
    (grad_ours,) = torch.autograd.grad(ours, logp)
    theirs = released_multiplex_loss(logp, old_logp, advantages, mask, weights)
    (grad_theirs,) = torch.autograd.grad(theirs, logp)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    assert torch.allclose(grad_ours, grad_theirs, atol=1e-7) and float(grad_ours.abs().max()) > 1e-3


# ----------------------------------------------------------------------------- SofT-GRPO


@pytest.mark.parametrize("tau_g, factor", [(0.1, 1.0), (1.0, 1.0), (0.5, 0.3)])
def test_soft_grpo_feeds_the_gumbel_softmax_of_clamped_gumbels_and_records_the_perturbed_logits(tau_g, factor):
    """SofT-GRPO (arXiv 2511.06411, its sglang sampler's add_noise_gumbel_softmax): q = p renormalised over its top k,
    g' = log(q + 1e-6) + f clamp(-log(-log u), -1.5, 3) at the row's GUMBEL uniforms (f: its noise_factor), fed
    sum softmax(g' / tau_g) E."""
    x = Exploration("soft-grpo", soft_top_k=5, gumbel_temperature=tau_g, noise_factor=factor)
    view = step_view(x, [0, 1, 2], tau=0.8, seed=3, keys=[4, 5, 6], positions=[2, 0, 9])
    mixture = STRATEGIES["soft-grpo"].explore(view)
    uniforms = view.draws.uniform(GUMBEL, 5)
    for row in range(LOGITS.shape[0]):
        p = softmax([float(z) / 0.8 for z in LOGITS[row]])
        top = ranked(p)[:5]
        q = [p[c] / sum(p[c] for c in top) for c in top]
        perturbed = [math.log(v + 1e-6) + factor * min(3.0, max(-1.5, -math.log(-math.log(float(u)))))
                     for v, u in zip(q, uniforms[row])]
        w = softmax([g / tau_g for g in perturbed])
        assert mixture.cand_ids[row].tolist() == top
        assert mixture.extra["gumbel_logits"][row].tolist() == pytest.approx(perturbed, abs=1e-5)
        assert mixture.inputs[row].tolist() == pytest.approx(weighted_sum(w, top), abs=1e-5)


def released_soft_grpo_logprob(logits, ids, gumbels, labels, thinking):
    """verl's logprobs_from_logits_topk_gumbel (SofT-GRPO's release, utils/torch_functional.py) as written there, from
    full logits [N, V]: the Gumbel log-density of the noise each recorded perturbed logit implies, averaged over the
    top tokens with log q > -3, at a thinking step (theirs tells an answer step by ids [y, 0, 0, ...]); else
    log p(y)."""
    topk = torch.softmax(logits, dim=-1).gather(-1, ids)
    topk = (topk / topk.sum(-1, keepdim=True) + 1e-6).log()
    noise = (gumbels - topk).clamp(-1.5, 3)
    density = -noise - (-noise).exp()
    kept = (topk > -3).float()
    thinking_value = (density * kept).sum(-1) / kept.sum(-1)
    answer_value = logits.log_softmax(-1).gather(-1, labels[:, None])[:, 0]
    return torch.where(thinking, thinking_value, answer_value)


@pytest.mark.parametrize("chunk_tokens", [3, 1024])
def test_soft_grpo_logprob_and_its_gradient_equal_the_released_function(chunk_tokens):
    """Ours goes through the chunked replay (log p of the action and of each candidate, engine.logprobs) and
    soft_grpo_logprob; theirs through full logits: equal values, and equal gradients for a loss over them."""
    g = torch.Generator().manual_seed(21)
    N, d, vocab, K = 10, 8, 40, 5
    hidden, weight = torch.randn(N, d, generator=g), torch.randn(vocab, d, generator=g) * 0.6
    ids = torch.stack([torch.randperm(vocab, generator=g)[:K] for _ in range(N)])  # [N, K] distinct
    labels = torch.randint(0, vocab, (N,), generator=g)
    gumbels = torch.randn(N, K, generator=g) - 1.0  # recorded perturbed logits
    thinking = torch.rand(N, generator=g) > 0.3
    upstream = torch.randn(N, generator=g)
    results = []
    for ours in (True, False):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if ours:
            logp, _ = token_logprobs(h, w, torch.cat([labels[:, None], ids], -1), temperature=0.9,
                                     chunk_tokens=chunk_tokens)
            value = soft_grpo_logprob(logp[:, 1:], logp[:, 0], {"gumbel_logits": gumbels, "mixed": thinking})
        else:
            value = released_soft_grpo_logprob(h @ w.T / 0.9, ids, gumbels, labels, thinking)
        (value * upstream).sum().backward()
        results.append((value.detach(), h.grad, w.grad))
    for mine, theirs in zip(*results):
        assert torch.allclose(mine, theirs, atol=1e-5, rtol=1e-5)
    assert float(results[1][1].abs().max()) > 1e-3  # a gradient to compare


@pytest.mark.parametrize("variant", ["dirichlet", "gaussian"])
def test_soft_grpo_variants_feed_their_noisy_top_k_weights_and_record_the_noise(variant):
    """SofT-GRPO's -dir / -gau samplers: q = p renormalised over the top 5; g_k ~ Gamma(q_k, 1) (the row's DIRICHLET
    uniforms) or s_k = q_k + 0.05 z_k (its NOISE normals); fed the noise renormalised, the noise recorded."""
    x = Exploration(f"soft-grpo-{variant}", soft_top_k=5)
    keys, positions = [4, 5, 6], [2, 0, 9]
    view = step_view(x, [0, 1, 2], tau=0.8, seed=3, keys=keys, positions=positions)
    mixture = STRATEGIES[x.strategy].explore(view)
    draws = RowDraws(3, torch.tensor(keys), torch.tensor(positions))
    gamma_u, normals = draws.uniform(DIRICHLET, (3 * GAMMA_TRIES + 1) * 5), draws.normal(NOISE, 5)
    for row in range(LOGITS.shape[0]):
        p = softmax([float(z) / 0.8 for z in LOGITS[row]])
        top = ranked(p)[:5]
        q = [p[c] / sum(p[c] for c in top) for c in top]
        noise = [gamma_by_hand(v, gamma_u[row, k::5].tolist()) if variant == "dirichlet" else
                 v + 0.05 * float(normals[row, k]) for k, v in enumerate(q)]
        assert mixture.cand_ids[row].tolist() == top
        assert mixture.extra["topk_noise"][row].tolist() == pytest.approx(noise, rel=1e-4, abs=1e-6)
        assert mixture.inputs[row].tolist() == pytest.approx(weighted_sum([v / sum(noise) for v in noise], top),
                                                             abs=1e-4)


@pytest.mark.parametrize("variant", ["dirichlet", "gaussian"])
@pytest.mark.parametrize("t", [1.0, 0.5])
def test_their_replay_of_the_variants_records_a_softmax_of_the_noise_and_feeds_what_it_fed(variant, t):
    """--replay-softmax-temperature t (SofT-GRPO's trainer, dp_actor.py l. 158-163): a thinking step records the
    weights softmax(noise / t), computed here by hand, which the replay feeds; the sampler still fed noise / sum."""
    x = Exploration(f"soft-grpo-{variant}", soft_top_k=5, replay_softmax_temperature=t)
    view = step_view(x, [0, 1, 2], tau=0.8, seed=3, keys=[4, 5, 6], positions=[2, 0, 9])
    mixture = STRATEGIES[x.strategy].explore(view)
    for row in range(LOGITS.shape[0]):
        noise, top = mixture.extra["topk_noise"][row].tolist(), mixture.cand_ids[row].tolist()
        theirs = softmax([v / t for v in noise])
        assert mixture.cand_weights[row].tolist() == pytest.approx(theirs, abs=1e-6)
        assert mixture.inputs[row].tolist() == pytest.approx(weighted_sum([v / sum(noise) for v in noise], top),
                                                             abs=1e-4)
        replayed = mixture_inputs(view.embed, {"cand_ids": mixture.cand_ids[row], "cand_weights":
                                               mixture.cand_weights[row]})
        assert replayed.tolist() == pytest.approx(weighted_sum(theirs, top), abs=1e-4)
        assert max(abs(a - b) for a, b in zip(theirs, [v / sum(noise) for v in noise])) > 1e-3  # they differ


def released_variant_logprob(variant, logits, ids, noise, labels, thinking):
    """verl's logprobs_from_logits_topk_dirichlet / _normal (SofT-GRPO's release) from full logits [N, V]."""
    q = torch.softmax(logits, dim=-1).gather(-1, ids)
    q = q / q.sum(-1, keepdim=True)
    if variant == "dirichlet":
        density = torch.distributions.Gamma(q * 1.0, torch.ones_like(q)).log_prob(noise).clamp(min=-5, max=3)
    else:
        density = torch.distributions.Normal(q, torch.ones_like(q) * 0.05).log_prob(noise.clamp(q - 0.15, q + 0.15))
    kept = (q > 0.05).float()
    answer = logits.log_softmax(-1).gather(-1, labels[:, None])[:, 0]
    return torch.where(thinking, (density * kept).sum(-1) / kept.sum(-1), answer)


@pytest.mark.parametrize("variant", ["dirichlet", "gaussian"])
def test_soft_grpo_variants_logprob_and_its_gradient_equal_the_released_functions(variant):
    """Through the chunked replay ours, through full logits and torch.distributions theirs: equal values and
    gradients."""
    g = torch.Generator().manual_seed(22)
    N, d, vocab, K = 10, 8, 40, 5
    hidden, weight = torch.randn(N, d, generator=g), torch.randn(vocab, d, generator=g) * 1.5
    ids = torch.stack([torch.randperm(vocab, generator=g)[:K] for _ in range(N)])
    labels = torch.randint(0, vocab, (N,), generator=g)
    noise = torch.rand(N, K, generator=g) * 0.6 + 0.01  # recorded gamma draws, or normals near q
    thinking, upstream = torch.rand(N, generator=g) > 0.3, torch.randn(N, generator=g)
    strategy = STRATEGIES[f"soft-grpo-{variant}"]
    results = []
    for ours in (True, False):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if ours:
            logp, _ = token_logprobs(h, w, torch.cat([labels[:, None], ids], -1), temperature=0.9, chunk_tokens=3)
            value, _ = strategy.loss_terms(logp, {"topk_noise": noise, "mixed": thinking})
        else:
            value = released_variant_logprob(variant, h @ w.T / 0.9, ids, noise, labels, thinking)
        (value * upstream).sum().backward()
        results.append((value.detach(), h.grad, w.grad))
    for mine, theirs in zip(*results):
        assert torch.allclose(mine, theirs, atol=1e-5, rtol=1e-5)
    assert float(results[1][1].abs().max()) > 1e-3


def test_min_p_keeps_the_tokens_within_min_p_of_the_top_token_after_top_k():
    z = LOGITS[0].tolist()
    for min_p, top_k in ((0.1, 0), (0.3, 6), (0.02, 12)):
        kept = filtered_logits(LOGITS[:1], 0.8, top_k, 1.0, min_p)[0] > float("-inf")
        p = softmax([v / 0.8 for v in z])
        candidates = ranked(p)[:top_k] if top_k else list(range(V))
        expected = [c in candidates and p[c] >= min_p * max(p) for c in range(V)]
        assert kept.tolist() == expected


# ----------------------------------------------------------------------------- Cold Stop

THINK_END, EOS, SURE = 60, 61, 10  # </think>, the stop id, the token a low-entropy step is sure of
FLAT, LOW, END = 0, 1, 2  # a scripted step: high entropy; sure of SURE; sure of EOS
N_LOW = 6  # Cold Stop's steps in a row
# Each row's script by response position (then FLAT), the position Cold Stop forces </think> (None: never) and its
# length. Row 1 and row 3 end thinking-on with their counters at 2 and 3: whatever row enters their slot next
# must start from 0 (rows 2 and 5 would stop early otherwise); row 0 counts across the refill of the other slot;
# row 4's count restarts at its flat step 5.
SCRIPTS = [
    ([FLAT, FLAT] + [LOW] * 8 + [FLAT, END], 7, 12),
    ([FLAT, LOW, END], None, 3),
    ([LOW] * 7 + [END], 5, 8),
    ([FLAT, FLAT, FLAT, LOW, LOW, END], None, 6),
    ([LOW] * 5 + [FLAT] + [LOW] * 6 + [FLAT, END], 11, 14),
    ([FLAT] + [LOW] * 6 + [FLAT, END], 6, 9),
]


@pytest.fixture(scope="module")
def cold_model():
    cfg = ModelConfig(family="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True)
    model = random_model(cfg, seed=4).eval()
    yield model
    engine.release_decoder(model)


def scripted_logits(codes: torch.Tensor) -> torch.Tensor:
    """[len(codes), V] logits of each code: flat (never </think> or EOS), sure of SURE, sure of EOS."""
    flat = torch.zeros(64)
    flat[[THINK_END, EOS]] = -1e4
    low, end = flat.clone(), torch.zeros(64)
    low[SURE] = 30.0
    end[EOS], end[THINK_END] = 30.0, -1e4
    return torch.stack([flat, low, end])[codes]


@pytest.mark.parametrize("strategy", ["soft", "soft-gumbel", "multiplex"])
@pytest.mark.parametrize("slots", [1, 2, 6])
def test_cold_stop_ends_thinking_where_the_entropy_stayed_low_for_n_steps(cold_model, monkeypatch, strategy, slots):
    """The model's logits replaced by each row's script at its response position (the sampler reads them through
    the engine's slots, refill and step ring): the N-th low-entropy step in a row emits </think>, fed unmixed and
    recorded with its log-prob before filtering; every thinking step before it is mixed, none after."""
    T = 16
    codes = torch.tensor([script + [FLAT] * (T - len(script)) for script, _, _ in SCRIPTS])  # [rows, T]
    real_call = rollout.Sampler.__call__

    def scripted(self, logits, state, live, backend=None):
        row_codes = codes[state.key.clamp(0, len(SCRIPTS) - 1), state.length.clamp(max=T - 1)]  # [S]
        return real_call(self, scripted_logits(row_codes), state, live, backend)

    monkeypatch.setattr(rollout.Sampler, "__call__", scripted)
    x = Exploration.of(strategy, THINK_END, soft_top_k=3, early_stopping_entropy_threshold=0.5,
                       early_stopping_length_threshold=N_LOW)
    sampling = Sampling(temperature=1.0, max_new_tokens=T, stop_ids=(EOS,), min_p=0.1)  # min-p removes </think>
    result = generate(cold_model, [[1, 2, 3]] * len(SCRIPTS), sampling, x, seed=3, slots=slots)
    forced = scripted_logits(torch.tensor([LOW]))[0].log_softmax(-1)[THINK_END]  # unfiltered, as the replay scores
    for row, (script, stop, length) in enumerate(SCRIPTS):
        ids = result.response_ids[row, :length].tolist()
        assert int(result.lengths[row]) == length and ids[-1] == EOS, (row, ids)
        assert [t for t, y in enumerate(ids) if y == THINK_END] == ([] if stop is None else [stop]), (row, ids)
        thinking = length if stop is None else stop
        assert result.mixed[row, :length].tolist() == [t < thinking for t in range(length)], row
        assert result.cold_stop[row, :length].tolist() == [t == stop for t in range(length)], row  # its record
        if stop is not None:
            assert result.cand_ids[row, stop, 0] == THINK_END and result.cand_weights[row, stop, 0] == 1.0
            assert float(result.logprobs[row, stop]) == pytest.approx(float(forced), rel=1e-6)


THINK_AT = [2, 5, 0, 9, None, 3]  # the response position each row is sure of </think> (None: never)


@pytest.mark.parametrize("slots", [2, 6])
def test_after_thinking_rows_sample_with_the_after_thinking_filters(cold_model, monkeypatch, slots):
    """Soft Thinking's after_thinking_top_k / _top_p (its sglang sampler switches them per row once </think> is
    sampled): each row's logits scripted (graded over the vocabulary, and sure of </think> at its step); at and
    before that step the row samples from p unfiltered, after it from p cut to its top 4 and then to the 0.6 nucleus.
    Each recorded log-prob is the log of that brute-force p at its token."""
    T = 12
    graded = script_think_ends(monkeypatch, THINK_AT, THINK_END, EOS)
    sampling = Sampling(temperature=1.0, max_new_tokens=T, stop_ids=(EOS,), after_thinking_top_k=4,
                        after_thinking_top_p=0.6)
    result = generate(cold_model, [[1, 2, 3]] * len(THINK_AT), sampling,
                      Exploration("soft", soft_top_k=3, stop_mixing_id=THINK_END), seed=3, slots=slots)
    p = softmax(graded)
    top = softmax(graded[:4])  # the after-thinking top 4 (tokens 0-3), then the nucleus: keep while the mass
    kept = [t for t in range(4) if sum(top[:t]) < 0.6]  # above a token is under 0.6
    after = {t: top[t] / sum(top[c] for c in kept) for t in kept}
    thinking_tokens = []
    for row, at in enumerate(THINK_AT):
        ids, logprobs = result.response_ids[row].tolist(), result.logprobs[row].tolist()
        assert len(ids) == T and [t for t, y in enumerate(ids) if y == THINK_END] == ([] if at is None else [at])
        for t, (y, logprob) in enumerate(zip(ids, logprobs)):
            if at is not None and t > at:
                assert y in after, (row, t, y)
                assert logprob == pytest.approx(math.log(after[y]), abs=1e-5)
            elif t != at:
                thinking_tokens.append(y)
                assert logprob == pytest.approx(math.log(p[y]), abs=1e-5)
    assert len(kept) == 3 and max(thinking_tokens) > 3  # thinking drew tokens the after-thinking filters remove
    with pytest.raises(ValueError, match="after_thinking"):
        generate(cold_model, [[1, 2, 3]], sampling, Exploration("soft", soft_top_k=3))


def test_cold_stop_needs_the_token_it_forces():
    with pytest.raises(ValueError, match="Cold Stop"):
        Exploration("soft", early_stopping_entropy_threshold=0.1)
    with pytest.raises(ValueError, match="early_stopping_entropy_threshold is not read by the gaussian strategy"):
        Exploration("gaussian", early_stopping_entropy_threshold=0.1, stop_mixing_id=5)


# ----------------------------------------------------------------------------- training replays what was fed

TIMING = ("rollout_s", "score_s", "update_s", "step_s", "rollout_tokens_per_s", "update_tokens_per_s")
COLD_STOP = dict(early_stopping_entropy_threshold=10.0, early_stopping_length_threshold=3)  # > log V: every step


def tiny_run(tmp_path, name: str, **overrides):
    base = dict(out_dir=str(tmp_path / name), prompts_per_step=4, mini_batch_prompts=4, micro_batch_size=16,
                max_new_tokens=16, max_steps=1)
    return replace(preset("tiny"), **{**base, **overrides})


def read_metrics(run_dir) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("flags", [dict(explore="mixinputs"), dict(explore="soft-gumbel"),
                                   dict(explore="soft", **COLD_STOP), dict(explore="soft-gumbel", **COLD_STOP),
                                   dict(explore="soft", dirichlet_alpha=1.0),
                                   dict(explore="soft-gumbel", dirichlet_alpha=5.0, **COLD_STOP),
                                   dict(explore="multiplex"),
                                   dict(explore="multiplex", multiplex_weights="probs", multiplex_replacement=False),
                                   dict(explore="multiplex", dirichlet_alpha=1.0, multiplex_gumbel_tau=1.0,
                                        multiplex_entropy_mask=5.0, **COLD_STOP),
                                   dict(explore="soft-grpo", kl_coef=0.01, noise_factor=0.5),
                                   dict(explore="soft-grpo-dirichlet"), dict(explore="soft-grpo-gaussian"),
                                   dict(explore="thinkrouter", router_confidence=0.3, **COLD_STOP)],
                         ids=["mixinputs", "soft-gumbel", "soft-cold-stop", "soft-gumbel-cold-stop", "soft-dirichlet",
                              "soft-gumbel-dirichlet-cold-stop", "multiplex", "multiplex-probs-distinct",
                              "multiplex-noise-mask-cold-stop", "soft-grpo", "soft-grpo-dirichlet",
                              "soft-grpo-gaussian", "thinkrouter-cold-stop"])
def test_training_replays_what_the_sampler_fed(tmp_path, one_thread, flags):
    """CPU fp32: the replayed log-probs equal the sampler's to rounding (Cold Stop's forced </think> included)."""
    train.run(tiny_run(tmp_path, "run", **flags))
    (metrics,) = read_metrics(tmp_path / "run")
    assert metrics["logp_gap_max"] <= 1e-5, metrics["logp_gap_max"]


@pytest.mark.parametrize("flags", [dict(explore="soft-gumbel", **COLD_STOP), dict(explore="multiplex"),
                                   dict(explore="soft-grpo")], ids=["soft-gumbel-cold-stop", "multiplex", "soft-grpo"])
def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path, one_thread, flags):
    flags = dict(save_every=2, **flags)
    train.run(tiny_run(tmp_path, "straight", max_steps=4, **flags))
    cut = tiny_run(tmp_path, "cut", max_steps=2, **flags)
    train.run(cut)
    train.run(replace(cut, max_steps=4, resume=True))
    assert read_metrics(tmp_path / "cut") == read_metrics(tmp_path / "straight")
    a, b = (load_model(str(tmp_path / run / "checkpoints" / "step-4"), dtype=torch.float32, device="cpu")
            for run in ("straight", "cut"))
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name
