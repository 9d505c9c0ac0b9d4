"""ThinkRouter (Xu, Yu, Chen, Wang, McAuley, Mitra, arXiv 2602.11683; no released code, so the paper's description):
Soft Thinking with a confidence gate, training-free.

How it departs from N-GRPO: no coin and no neighbors. A thinking step feeds Soft Thinking's mixture of the top-k
tokens of p (strategies/soft.py) where the model is confident, max p >= tau, and the sampled token where it is not;
Cold Stop may end thinking, as in the paper's setup. The opposite rule to the release's entropy gate (which mixes
where the model is uncertain, --mix-entropy-threshold): a clean ablation of where soft inputs help.

    m = [max p >= tau], until </think>     e = sum_{c in top-k(p)} p(c) / sum p(top-k) E[c] if m else E[y]
"""

from dataclasses import replace

from strategies.base import FRACTION, Mixture, StepView, Strategy, mix_where, option
from strategies.soft import (
    COLD_STOP,
    COLD_STOP_RECORD,
    COLD_STOP_STATE,
    TOP_K,
    cold_stop,
    soft_candidates,
    top_k_candidates,
)

KNOBS = dict(
    router_confidence=option(0.5, "tau, the confidence a thinking step needs to be fed the soft mixture: its largest "
                             "probability (of the sampling distribution) at least this; the others feed the sampled "
                             "token (the paper tunes tau on a validation set per model; 0.5 is not its value)",
                             check=FRACTION),
)


def explore_thinkrouter(view: StepView) -> Mixture:
    """A thinking step feeds the top-k mixture where max p reaches router_confidence, the sampled token elsewhere
    (Cold Stop may end thinking)."""
    x = view.exploration
    view, stopped = cold_stop(view)
    confident = view.probs.max(-1).values >= x.router_confidence  # [B]
    mixture = mix_where(view, *soft_candidates(view.probs, x.soft_top_k, x.mix_temperature), view.eligible & confident)
    return replace(mixture, token=view.token if x.early_stopping_entropy_threshold > 0 else None, extra=stopped)


STRATEGIES = {
    "thinkrouter": Strategy(explore_thinkrouter, "ThinkRouter's Soft Thinking where the model is confident, the "
                            "sampled token where it is not (arXiv 2602.11683)", candidates=top_k_candidates,
                            knobs=(*TOP_K, *COLD_STOP, *KNOBS), state=COLD_STOP_STATE,
                            record=COLD_STOP_RECORD),
}
