"""Multiplex Thinking (Tang et al., arXiv 2601.08808; its sglang sampler, layers/sampler.py, and verl loss,
github.com/MaxLEAF3824/Multiplex-Thinking).

How it departs from N-GRPO: no coin and no neighbors. Every thinking step draws K tokens from p itself (the first is
the action y) and feeds their average (or their p-weighted mixture); its loss trains the joint log-probability of
the K draws, a clipped ratio per drawn token, summed (its compute_multiplex_thinking_policy_loss):

    i_1 = y, i_2..i_K ~ p      e = sum_k w_k E[i_k], w = 1/K or p(i_k) / sum p(i)      loss: sum_k clip(ratio(i_k))
"""

from dataclasses import replace

import torch

from engine.draws import GUMBEL, MULTIPLEX
from strategies.base import AT_LEAST_0, AT_LEAST_1, Mixture, StepView, Strategy, mix_where, option
from strategies.soft import COLD_STOP, COLD_STOP_RECORD, COLD_STOP_STATE, NOISE, cold_stop, dirichlet_probs

KNOBS = dict(
    multiplex_width=option(3, "K, the tokens drawn from the sampling distribution at each thinking step (Multiplex "
                           "Thinking's max_topk / MULTIPLEX_WIDTH; 3 in its run_train.sh)", check=AT_LEAST_1,
                           vocab="at most"),
    multiplex_weights=option("uniform", "the merge, uniform = the K embeddings' plain average (its "
                             "enable_unweighting=True, run_train.sh); probs = weighted by p(token) renormalised over "
                             "the K", choices=("uniform", "probs")),
    multiplex_replacement=option(True, "draw the K tokens with replacement (its enable_replacement=True, "
                                 "run_train.sh); off: K distinct tokens"),
    multiplex_gumbel_tau=option(0.0, "> 0: its enable_gumbel, p replaced by softmax((log p + g) / tau) over the "
                                "vocabulary (a Gumbel draw g per token) before the K draws; tau = this, its gumbel_tau "
                                "(0 = off, as in its recipe)", check=AT_LEAST_0),
    multiplex_entropy_mask=option(0.0, "> 0: its enable_entropy_mask, only thinking steps whose entropy of p (nats) "
                                  "exceeds this are mixed (0 = off, as in its recipe)", check=AT_LEAST_0),
)


def multiplex_draws(probs: torch.Tensor, first: torch.Tensor | None, uniforms: torch.Tensor,
                    replacement: bool = True) -> torch.Tensor:
    """[B, K] tokens from p [B, V]: `first` [B] (the step's action, already drawn from p; None: none), then one
    inverse-CDF draw per uniform [B, n] (float64 in (0, 1)); without replacement each draw renormalises p over the
    tokens not yet drawn, as torch.multinomial(p, K, replacement=False) draws in turn."""
    drawn, probs = [] if first is None else [first], probs.double()
    for k in range(uniforms.shape[1]):
        if not replacement and drawn:  # the tokens drawn so far are out (a row that drew every token keeps its last)
            left = probs.scatter(-1, torch.stack(drawn, -1), 0.0)
            probs = torch.where(left.sum(-1, keepdim=True) > 0, left, probs)
        cdf = probs.cumsum(-1)  # [B, V]
        total = cdf[:, -1:]
        target = torch.minimum(uniforms[:, k : k + 1] * total, total.nextafter(torch.zeros_like(total)))
        drawn.append(torch.searchsorted(cdf, target, right=True)[:, 0])  # the first token whose cdf exceeds it
    return torch.stack(drawn, -1)


def explore_multiplex(view: StepView) -> Mixture:
    """Every thinking step draws K = multiplex_width tokens from p (after temperature, top-k, top-p, min-p), the first
    being the step's action y and the others from the row's MULTIPLEX stream, with replacement (or without), and feeds
    sum_k w_k E[i_k], w = 1/K (uniform: its enable_unweighting, the released recipe) or p(i_k) renormalised over the K
    (probs). Answer steps feed y. Cold Stop may end thinking (ours: theirs is a `pass`); an entropy mask leaves thinking
    steps with H(p) <= the threshold unmixed (enable_entropy_mask); Dirichlet noise, then Gumbel noise (enable_gumbel:
    softmax((log p + g) / tau), a Gumbel g per token from the row's GUMBEL stream) replace p by p' for all K draws: the
    action too is then the first of K draws from p' (scored, like every candidate, under the policy's p)."""
    x = view.exploration
    view, stopped = cold_stop(view)
    if x.multiplex_entropy_mask > 0:
        p = view.probs.float()
        entropy = -(p * p.clamp_min(1e-12).log()).sum(-1)  # [B] nats
        view = replace(view, eligible=view.eligible & (entropy > x.multiplex_entropy_mask))
    probs, first = (view.probs, view.token) if x.dirichlet_alpha <= 0 else (dirichlet_probs(view), None)
    if x.multiplex_gumbel_tau > 0:
        gumbel = -(-view.draws.uniform(GUMBEL, probs.shape[-1]).log()).log()  # [B, V] float64
        probs = ((probs.double().clamp_min(1e-20).log() + gumbel) / x.multiplex_gumbel_tau).softmax(-1).to(probs.dtype)
        first = None
    uniforms = view.draws.uniform(MULTIPLEX, x.multiplex_width - (first is not None))  # [B, K - 1] or [B, K]
    cand_ids = multiplex_draws(probs, first, uniforms, x.multiplex_replacement)  # [B, K]
    weights = torch.ones(cand_ids.shape, device=cand_ids.device) if x.multiplex_weights == "uniform" else \
        probs.gather(-1, cand_ids).float()
    if first is None:  # the action: the first draw from p' at a thinking step
        view = replace(view, token=torch.where(view.eligible, cand_ids[:, 0], view.token))
    mixture = mix_where(view, cand_ids, weights / weights.sum(-1, keepdim=True), view.eligible)
    return replace(mixture, token=view.token if x.early_stopping_entropy_threshold > 0 or first is None else None,
                   extra=stopped)


def joint_logp(logp: torch.Tensor, steps: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Its loss's terms: log p of each of a step's K draws [B, T, K], and which count: those of weight > 0 (every
    draw of a thinking step; the action alone at an answer step, recorded [y, y, ...] with weights [1, 0, ...])."""
    return logp[..., 1:], steps["cand_weights"] > 0


STRATEGIES = {
    "multiplex": Strategy(explore_multiplex, "Multiplex Thinking's K sampled tokens merged, trained by their joint "
                          "log-probability (arXiv 2601.08808)", candidates=lambda x: x.multiplex_width,
                          knobs=(*KNOBS, *COLD_STOP, *NOISE), state=COLD_STOP_STATE, loss_logp=joint_logp,
                          record=COLD_STOP_RECORD,
                          requires=(("loss", "grpo", "GSPO's sequence ratio has no per-token candidates"),)),
}
