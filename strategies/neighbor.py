"""N-GRPO's rule (Zhu, Yu, Di, Zhu, arXiv 2606.10768; its released sglang sampler, github.com/ZJUSCL/N-GRPO):

    m = Bernoulli(mix_rate), until </think>      the mixing coin (base.mix_steps)
    C = [a = argmax p] + a's table neighbors     the anchor is the greedy token, not the sampled y
    w = softmax(p(C) / tau)  or  p(C) / sum p(C)  --mix-weights code (the release's) or renorm (the paper's figure)
    e = sum_c w_c E[c] if m else E[y]             y stays the action: recorded, rewarded, trained on

The table holds each token's nearest rows of the output matrix (or E), built once (neighbors.py); the mixture
always uses the input embedding E. docs/algorithm.md gives each step and where the paper's text reads otherwise.
"""

import torch

from strategies.base import AT_LEAST_1, Mixture, StepView, Strategy, mix_steps, mix_where, option

KNOBS = dict(
    num_neighbors=option(1, "semantic neighbors mixed with the greedy anchor token", check=AT_LEAST_1,
                         vocab="below"),
    mix_weights=option("code", "weights over [anchor, neighbors]: code = softmax(p / temperature) as the released "
                       "code does; renorm = p renormalised over the candidates (the paper's figure)",
                       choices=("code", "renorm")),
    neighbor_space=option("output", "matrix searched for neighbors: output = lm_head (released code), input = the "
                          "embedding matrix (mixing always uses the input embeddings)", choices=("output", "input")),
    neighbor_metric=option("cosine", "similarity that ranks neighbors", choices=("cosine", "dot", "l2", "l1")),
    neighbor_refresh=option(0, "rebuild the neighbor table every N optimizer steps (0 = build once)",
                            check=(lambda v: v >= 0, "must be >= 0 (0 = build once)")),
)


def candidate_table(table: torch.Tensor, num_neighbors: int) -> torch.Tensor:
    """[V, 1 + num_neighbors]: row v holds v itself, then its first num_neighbors table neighbors, so one
    gather at the anchor gives the whole candidate list."""
    own = torch.arange(table.shape[0], device=table.device)[:, None]
    return torch.cat([own, table[:, :num_neighbors]], dim=-1)


def neighbor_candidates(probs: torch.Tensor, cand_table: torch.Tensor, *, temperature: float,
                        weights: str = "code") -> tuple[torch.Tensor, torch.Tensor]:
    """From the sampling distribution p [B, V]: candidates [anchor = argmax p, its neighbors] [B, K] and
    their weights [B, K]. cand_table comes from candidate_table()."""
    cand_ids = cand_table[probs.argmax(-1)]  # [B, K]
    cand_probs = probs.gather(-1, cand_ids)
    if weights == "code":
        # The released code divides the already-softmaxed probabilities by tau and softmaxes again:
        # at tau = 1 a neighbor the model gives ~0 still gets ~27-43% of the mixture.
        return cand_ids, (cand_probs / temperature if temperature != 1.0 else cand_probs).softmax(-1)
    return cand_ids, cand_probs / cand_probs.sum(-1, keepdim=True)


def explore_neighbor(view: StepView) -> Mixture:
    """N-GRPO: at a step whose coin lands (rate mix_rate), the anchor argmax p and its table neighbors."""
    cand_ids, cand_weights = neighbor_candidates(view.probs, view.cand_table, temperature=view.temperature,
                                                 weights=view.exploration.mix_weights)
    return mix_where(view, cand_ids, cand_weights, mix_steps(view))


STRATEGIES = {
    "neighbor": Strategy(explore_neighbor, "N-GRPO: the greedy token mixed with its nearest neighbors",
                         candidates=lambda x: 1 + x.num_neighbors, knobs=tuple(KNOBS), coin=True),
}
