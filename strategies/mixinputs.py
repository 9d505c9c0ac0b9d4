"""Mixture of Inputs (Zhuang et al., arXiv 2505.14827; the authors' vLLM `gpu_model_runner.py`).

How it departs from N-GRPO: no coin and no neighbors. Every thinking step feeds the sampled token blended with the
distribution it came from, a Bayesian posterior over the 20 tokens of highest raw logit with y as the observation:

    e = H_n sum_c (q_c + beta [c = y]) / (1 + beta) E[c] + (1 - H_n) E[y]

q = p renormalised over those 20 (no temperature, no filter, as vLLM's logprobs), H_n = H(q) / log 20.
"""

import math

import torch

from strategies.base import Mixture, StepView, Strategy, mix_where, option

KNOBS = dict(
    mixinputs_beta=option(1.0, "the sampled token's concentration beta, posterior (prior + beta onehot(y)) / (1 + "
                          "beta) (MIXINPUTS_BETA; <= -99: direct mixture)",
                          check=(lambda v: v >= 0 or v <= -99, "must be >= 0 (or <= -99: the direct mixture)")),
)
MIXINPUTS_CANDIDATES = 20  # the prior's support: vLLM's 20 logprobs the authors' runner asks for by default


def explore_mixinputs(view: StepView) -> Mixture:
    """Every eligible step feeds H_n sum_c (q_c + beta [c = y]) / (1 + beta) E[c] + (1 - H_n) E[y] over the 20
    tokens c of highest raw logit, q = their renormalised p, H_n = H(q) / log 20 (beta <= -99: their direct
    mixture sum_c q_c E[c]). Recorded as [c_1..c_20, y] with those weights."""
    beta = view.exploration.mixinputs_beta
    top_logits, top_ids = view.raw.float().topk(min(MIXINPUTS_CANDIDATES, view.raw.shape[-1]), dim=-1)  # [B, n]
    prior = top_logits.softmax(-1)
    entropy = -(prior * prior.clamp_min(1e-12).log()).sum(-1, keepdim=True) / math.log(prior.shape[-1])  # [B, 1]
    posterior = (prior + beta * (top_ids == view.token[:, None]).float()) / (1 + beta)
    weights, own = (entropy * posterior, 1 - entropy) if beta > -99 else (prior, torch.zeros_like(entropy))
    spare = MIXINPUTS_CANDIDATES - prior.shape[-1]  # > 0 only for a vocabulary under 20: weight-0 copies of y
    cand_ids = torch.cat([top_ids, view.token[:, None].expand(-1, spare + 1)], dim=-1)  # [B, 21]
    cand_weights = torch.cat([weights, torch.zeros_like(prior[:, :1]).expand(-1, spare), own], dim=-1)
    return mix_where(view, cand_ids, cand_weights, view.eligible)


STRATEGIES = {
    "mixinputs": Strategy(explore_mixinputs, "Mixture of Inputs: the sampled token blended with its distribution "
                          "(arXiv 2505.14827)", candidates=lambda x: MIXINPUTS_CANDIDATES + 1, knobs=tuple(KNOBS)),
}
