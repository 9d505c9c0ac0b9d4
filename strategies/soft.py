"""Soft Thinking (Zhang et al., arXiv 2505.15778; its sglang fork, github.com/eric-ai-lab/Soft-Thinking) and its
Gumbel-softmax variant, Randomized Soft Thinking (arXiv 2508.03440).

How they depart from N-GRPO: no coin and no neighbors. Every thinking step (until </think>) feeds a mixture of the
top-k tokens of p itself, weighted by p renormalised over them (or by a Gumbel-softmax of them), and Cold Stop may
end thinking early:

    C = top-k(p)     w = p(C)^(1/t) / sum p(C)^(1/t)      soft
                     w = softmax((log q(C) + g) / tau_g)   soft-gumbel (q = p renormalised over C, g Gumbel)

With --dirichlet-alpha, p is first replaced by a draw of Dirichlet(alpha p), as in Multiplex Thinking's sampler too;
Cold Stop applies to Multiplex Thinking here (strategies/multiplex.py), though its authors' sampler reads the
threshold and does nothing.
"""

from dataclasses import replace

import torch

from engine.draws import DIRICHLET, GUMBEL, gamma_log_draws
from strategies.base import AT_LEAST_0, AT_LEAST_1, POSITIVE, Field, Mixture, StepView, Strategy, mix_where, option

TOP_K = dict(
    soft_top_k=option(10, "number of top tokens (Soft Thinking's scripts use 10)", check=AT_LEAST_1, vocab="at most"),
    mix_temperature=option(0.0, "Soft Thinking's and STHT's mixture weights p^(1/t) renormalised over the top "
                           "tokens (0 = the renormalised probabilities); the released code's strategies: "
                           "softmax(p / (temperature t)) (0 = t of 1)", check=AT_LEAST_0),
)
GUMBEL_SOFTMAX = dict(
    gumbel_temperature=option(0.5, "the Gumbel-softmax temperature (SofT-GRPO's gumbel_softmax_temperature is 0.1; "
                              "Randomized Soft Thinking's --gumbel_temperature in its math scripts)", check=POSITIVE),
)
COLD_STOP = dict(
    early_stopping_entropy_threshold=option(0.0, "Soft Thinking's Cold Stop: force --stop-mixing-token once the "
                                            "entropy stays under this for the next flag's steps in a row (0 = "
                                            "off). In nats, Soft Thinking's scale; Randomized Soft Thinking's "
                                            "scripts compare the entropy over log V: give theirs times log V "
                                            "(11.93 for R1-Distill's 151,936 rows)", check=AT_LEAST_0),
    early_stopping_length_threshold=option(256, "Cold Stop's steps", check=AT_LEAST_1),
)
NOISE = dict(
    dirichlet_alpha=option(0.0, "Dirichlet noise, p replaced by a draw of Dirichlet(alpha p) before the top-k or the "
                           "K draws (Soft Thinking's --add_noise_dirichlet --dirichlet_alpha, its sglang "
                           "layers/sampler.py, and Multiplex Thinking's; 0 = off)",
                           check=(lambda v: v >= 0, "must be >= 0 (0 = off)")),
)
KNOBS = {**TOP_K, **GUMBEL_SOFTMAX, **COLD_STOP, **NOISE}
COLD_STOP_STATE = (Field("low_entropy_steps", torch.long, pad=0),)  # Cold Stop's count of low-entropy steps
COLD_STOP_RECORD = (Field("cold_stop", torch.bool, pad=False),)  # the step where Cold Stop forced </think>


def top_k_candidates(exploration) -> int:
    """The candidates a step of a top-k strategy records: --soft-top-k."""
    return exploration.soft_top_k


def soft_candidates(probs: torch.Tensor, top_k: int,
                    mix_temperature: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft Thinking's mixture: the top-k tokens of p with p renormalised over them (or p^(1/t)
    renormalised)."""
    cand_probs, cand_ids = probs.topk(top_k, dim=-1)  # [B, K]
    if mix_temperature > 0:
        cand_probs = cand_probs.clamp_min(1e-30) ** (1.0 / mix_temperature)
    return cand_ids, cand_probs / cand_probs.sum(-1, keepdim=True)


def cold_stop(view: StepView) -> tuple[StepView, dict[str, torch.Tensor]]:
    """Soft Thinking's Cold Stop (its sglang `Req.update_topk_info`): a thinking row counts its steps in a row whose
    entropy H(softmax(z / tau)) (nats, unfiltered) is under the threshold; the step that brings the count to
    early_stopping_length_threshold emits stop_mixing_id (</think>) in place of its sample, unmixed, and the count
    restarts. The view with that action and those rows no longer eligible (off: the view itself), and the record
    of the rows it stopped (COLD_STOP_RECORD)."""
    x = view.exploration
    if x.early_stopping_entropy_threshold <= 0:
        return view, {"cold_stop": torch.zeros_like(view.eligible)}
    probs = (view.raw.float() / view.temperature).softmax(-1)  # [B, V]
    entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1)
    low = view.state["low_entropy_steps"]  # [B], the slot's own counter: updated in place
    counted = torch.where(entropy < x.early_stopping_entropy_threshold, low + 1, 0)
    low.copy_(torch.where(view.eligible, counted, low))  # past thinking (or no row): kept, and never read
    stop = view.eligible & (low >= x.early_stopping_length_threshold)
    low.masked_fill_(stop, 0)
    return replace(view, token=torch.where(stop, x.stop_mixing_id, view.token), eligible=view.eligible & ~stop), \
        {"cold_stop": stop}


def dirichlet_probs(view: StepView) -> torch.Tensor:
    """[B, V] what Soft Thinking's top-k reads: p, or with dirichlet_alpha > 0 a draw of Dirichlet(alpha p) over the
    vocabulary (its sglang sampler's `--add_noise_dirichlet`: Gamma(alpha p_v, 1) draws g_v, g / sum g; a token
    top-k / top-p / min-p removed keeps 0). The Gamma draws come from the row's DIRICHLET stream
    (engine.draws.gamma_log_draws); the record holds the weights they give, so the replay feeds them as they were."""
    alpha = view.exploration.dirichlet_alpha
    if alpha <= 0:
        return view.probs
    return gamma_log_draws(view.draws, DIRICHLET, alpha * view.probs).softmax(-1).to(view.probs.dtype)


def explore_soft(view: StepView) -> Mixture:
    """Soft Thinking: every thinking step feeds the top-k mixture of p, or of its Dirichlet draw (Cold Stop may end
    thinking)."""
    x = view.exploration
    view, stopped = cold_stop(view)  # the action: the sample, or Cold Stop's </think>
    mixture = mix_where(view, *soft_candidates(dirichlet_probs(view), x.soft_top_k, x.mix_temperature), view.eligible)
    return replace(mixture, token=view.token if x.early_stopping_entropy_threshold > 0 else None, extra=stopped)


def explore_soft_gumbel(view: StepView) -> Mixture:
    """Randomized Soft Thinking (arXiv 2508.03440): every thinking step feeds the top-k tokens of p weighted
    w = softmax((log q + g) / tau_g), q = p renormalised over them, g = -log(-log u) a Gumbel draw per candidate
    from the row's GUMBEL stream; the record holds w (Cold Stop may end thinking; Dirichlet noise moves p first).
    """
    x = view.exploration
    view, stopped = cold_stop(view)
    cand_ids, q = soft_candidates(dirichlet_probs(view), x.soft_top_k)  # [B, K] each
    gumbel = -(-view.draws.uniform(GUMBEL, x.soft_top_k).log()).log()  # [B, K] float64
    weights = ((q.log() + gumbel.float()) / x.gumbel_temperature).softmax(-1)
    mixture = mix_where(view, cand_ids, weights, view.eligible)
    return replace(mixture, token=view.token if x.early_stopping_entropy_threshold else None, extra=stopped)


STRATEGIES = {
    "soft": Strategy(explore_soft, "Soft Thinking's mixtures of the top tokens at every thinking step (arXiv "
                     "2505.15778)", candidates=top_k_candidates, knobs=(*TOP_K, *COLD_STOP, *NOISE),
                     state=COLD_STOP_STATE, record=COLD_STOP_RECORD),
    "soft-gumbel": Strategy(explore_soft_gumbel, "Randomized Soft Thinking's Gumbel-softmax soft tokens (arXiv "
                            "2508.03440)", candidates=top_k_candidates,
                            knobs=("soft_top_k", *GUMBEL_SOFTMAX, *COLD_STOP, *NOISE), state=COLD_STOP_STATE,
                            record=COLD_STOP_RECORD),
}
