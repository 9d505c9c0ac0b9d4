"""SofT-GRPO (arXiv 2511.06411; github.com/zz1358m/SofT-GRPO-master: its sglang layers/sampler.py and verl
utils/torch_functional.py) and its Dirichlet and Gaussian variants (its -dir / -gau scripts).

How it departs from N-GRPO: no coin and no neighbors. Every thinking step feeds a noisy mixture of the top-k tokens
of p, and the loss does not score the sampled token at a thinking step: it scores the recorded noise by its density
under the policy being trained (the reparameterised log-probability):

    C = top-k(p), q = p(C) renormalised      g' = log(q + 1e-6) + f g, g ~ Gumbel clamped
    e = sum_k softmax(g' / tau_g)_k E[c_k]   the loss's log p of a thinking step: the mean over kept k of
                                             log Gumbel(clamp(g'_k - log q_k))
"""

import math
from collections.abc import Callable
from dataclasses import replace

import torch

from engine.draws import DIRICHLET, GUMBEL, NOISE, gamma_log_draws
from strategies.base import AT_LEAST_0, Field, Mixture, StepView, Strategy, mix_where, option
from strategies.soft import GUMBEL_SOFTMAX, soft_candidates, top_k_candidates

GUMBEL_NOISE = dict(
    noise_factor=option(1.0, "the scale of the clamped Gumbel noise added to log q in g' (SofT-GRPO's "
                        "rollout.noise_factor, 1 in its scripts; the loss still scores g' - log q as one Gumbel draw, "
                        "as theirs does)", check=AT_LEAST_0),
)
VARIANTS = dict(  # the Dirichlet and Gaussian variants' replay
    replay_softmax_temperature=option(0.0, "> 0: training replays a thinking step's input as sum_k softmax(noise / "
                                      "t)_k E[c_k] of the recorded noise, as SofT-GRPO's trainer rebuilds every "
                                      "soft input (their dp_actor.py l. 158-163, t = their "
                                      "gumbel_softmax_temperature, 1 in the -dir / -gau scripts), not the input "
                                      "the sampler fed (g / sum g, s / sum s): their numbers. 0 = replay what was "
                                      "fed", check=AT_LEAST_0),
)


def explore_soft_grpo(view: StepView) -> Mixture:
    """SofT-GRPO (its sampler's add_noise_gumbel_softmax): every thinking step takes the top-k tokens of p, q = p
    renormalised over them, the perturbed logits g' = log(q + 1e-6) + g with g a Gumbel draw clamped to [-1.5, 3]
    (the row's GUMBEL stream), and feeds sum_k softmax(g' / tau_g)_k E[c_k]. The record keeps g' (`gumbel_logits`):
    training scores the step by g's Gumbel log-density under the policy being trained (soft_grpo_logprob)."""
    x = view.exploration
    cand_ids, q = soft_candidates(view.probs, x.soft_top_k)  # [B, K] each
    gumbel = (-(-view.draws.uniform(GUMBEL, x.soft_top_k).log()).log()).float().clamp(-1.5, 3.0)
    perturbed = (q + 1e-6).log() + x.noise_factor * gumbel  # [B, K]
    mixture = mix_where(view, cand_ids, (perturbed / x.gumbel_temperature).softmax(-1), view.eligible)
    return replace(mixture, extra={"gumbel_logits": torch.where(view.eligible[:, None], perturbed, 0.0)})


def soft_grpo_logprob(logp: torch.Tensor, action_logp: torch.Tensor, steps: dict[str, torch.Tensor]) -> torch.Tensor:
    """[B, T] what SofT-GRPO's loss takes as a step's log-probability, from log p of its K candidates [B, T, K] and of
    its action [B, T] (its verl utils/torch_functional.py, logprobs_from_logits_topk_gumbel): at a thinking step,
    with log q_k = log(p_k / sum_j p_j + 1e-6) under the policy being scored and the recorded g', the Gumbel noise
    that policy would have needed, e_k = clamp(g'_k - log q_k, -1.5, 3), scored by the Gumbel log-density -e_k -
    exp(-e_k), averaged over the candidates with log q_k > -3; at an answer step log p(y)."""
    log_q = (logp - logp.logsumexp(-1, keepdim=True)).exp().add(1e-6).log()
    noise = (steps["gumbel_logits"] - log_q).clamp(-1.5, 3.0)
    kept = (log_q > -3).float()
    reparameterised = ((-noise - (-noise).exp()) * kept).sum(-1) / kept.sum(-1).clamp_min(1.0)
    return torch.where(steps["mixed"], reparameterised, action_logp)


def explore_soft_grpo_dirichlet(view: StepView) -> Mixture:
    """SofT-GRPO's Dirichlet variant (its sampler's add_noise_dirichlet, SofT-GRPO-deepscaler-8k-dir.sh): every
    thinking step takes the top-k tokens of p, q = p renormalised over them, draws g_k ~ Gamma(q_k, 1) (the row's
    DIRICHLET stream) and feeds sum_k g_k / sum_j g_j E[c_k]; the record keeps g (`topk_noise`)."""
    cand_ids, q = soft_candidates(view.probs, view.exploration.soft_top_k)  # [B, K] each
    g = gamma_log_draws(view.draws, DIRICHLET, q).exp().float()
    mixture = mix_where(view, cand_ids, g / g.sum(-1, keepdim=True).clamp_min(1e-30), view.eligible)
    return replace(their_replay(view, mixture, g), extra={"topk_noise": torch.where(view.eligible[:, None], g, 0.0)})


def explore_soft_grpo_gaussian(view: StepView) -> Mixture:
    """SofT-GRPO's Gaussian variant (its sampler's third branch, -gau.sh): s_k ~ N(q_k, 0.05^2) over the top-k's q (the
    row's NOISE stream), fed sum_k s_k / sum_j s_j E[c_k] (a weight may be negative, as theirs); recorded: s."""
    cand_ids, q = soft_candidates(view.probs, view.exploration.soft_top_k)
    noisy = q + 0.05 * view.draws.normal(NOISE, q.shape[-1]).to(q.dtype)
    mixture = mix_where(view, cand_ids, noisy / noisy.sum(-1, keepdim=True), view.eligible)
    return replace(their_replay(view, mixture, noisy),
                   extra={"topk_noise": torch.where(view.eligible[:, None], noisy, 0.0)})


def their_replay(view: StepView, mixture: Mixture, noise: torch.Tensor) -> Mixture:
    """The mixture with, under replay_softmax_temperature t > 0, the weights their trainer replays recorded in place
    of the fed ones: softmax(noise / t) at a thinking step (the fed input is unchanged; the logged sampler-vs-replay
    gap then measures the difference)."""
    t = view.exploration.replay_softmax_temperature
    if t <= 0:
        return mixture
    return replace(mixture, cand_weights=torch.where(view.eligible[:, None], (noise / t).softmax(-1),
                                                     mixture.cand_weights))


def topk_noise_logprob(density: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """A SofT-GRPO variant's loss log-probability (its verl logprobs_from_logits_topk_dirichlet / _normal): at a
    thinking step the mean of density(q, recorded noise) over q > 0.05 (q: the policy's p over the top-k)."""
    def log_prob(logp: torch.Tensor, action_logp: torch.Tensor, steps: dict[str, torch.Tensor]) -> torch.Tensor:
        q = (logp - logp.logsumexp(-1, keepdim=True)).exp().clamp_min(1e-20)  # 0 would make lgamma's gradient nan
        kept = (q > 0.05).float()
        value = (density(q, steps["topk_noise"]) * kept).sum(-1) / kept.sum(-1).clamp_min(1.0)
        return torch.where(steps["mixed"], value, action_logp)
    return log_prob


def gamma_density(q: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """log Gamma(g; q, 1) = (q - 1) log g - g - lgamma(q), clamped to [-5, 3] as theirs."""
    return ((q - 1) * g.clamp_min(1e-30).log() - g - torch.lgamma(q)).clamp(-5.0, 3.0)


def normal_density(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """log N(clamp(s, q - 0.15, q + 0.15); q, 0.05^2), as theirs."""
    x = torch.clamp(s, q - 0.15, q + 0.15)
    return -0.5 * ((x - q) / 0.05) ** 2 - math.log(0.05 * math.sqrt(2 * math.pi))


def reparameterised(log_prob):
    """A Strategy.loss_logp from log_prob(the candidates' log p [B, T, K], the action's [B, T], the record) -> [B, T]:
    one log-probability per step, each counting."""
    return lambda logp, steps: (log_prob(logp[..., 1:], logp[..., 0], steps), None)


KNOBS = {**GUMBEL_NOISE, **VARIANTS}
TOPK_NOISE = (Field("topk_noise", torch.float32, pad=0.0, per_candidate=True),)  # the variants' recorded noise
STRATEGIES = {
    "soft-grpo": Strategy(explore_soft_grpo, "SofT-GRPO's Gumbel-softmax soft tokens, trained by the "
                          "Gumbel-reparameterised log-probability (arXiv 2511.06411)",
                          candidates=top_k_candidates, knobs=("soft_top_k", *GUMBEL_SOFTMAX, *GUMBEL_NOISE),
                          record=(Field("gumbel_logits", torch.float32, pad=0.0, per_candidate=True),),
                          loss_logp=reparameterised(soft_grpo_logprob)),
    "soft-grpo-dirichlet": Strategy(explore_soft_grpo_dirichlet, "its Dirichlet-noise variant (their -dir script)",
                                    candidates=top_k_candidates, knobs=("soft_top_k", *VARIANTS), record=TOPK_NOISE,
                                    loss_logp=reparameterised(topk_noise_logprob(gamma_density))),
    "soft-grpo-gaussian": Strategy(explore_soft_grpo_gaussian, "its Gaussian-noise variant (their -gau script)",
                                   candidates=top_k_candidates, knobs=("soft_top_k", *VARIANTS), record=TOPK_NOISE,
                                   loss_logp=reparameterised(topk_noise_logprob(normal_density))),
}
