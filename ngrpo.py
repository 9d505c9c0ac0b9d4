"""The N-GRPO algorithm: what training does with a Rollout.

For now the one piece the sampler shares with training: `mixed_embeddings`, the input the model sees at a
response position. The sampler builds its inputs with it and training replays the recorded candidates
through it, so the two see the same numbers (DESIGN.md §3 step 7).
"""

import torch


def mixed_embeddings(embed_weight: torch.Tensor, cand_ids: torch.Tensor, cand_weights: torch.Tensor) -> torch.Tensor:
    """sum_c w_c E[c] over the last axis: [..., K] ids and weights -> [..., d] in the embedding's dtype.

    A step that was not mixed holds ([y, *], [1, 0, ...]) and gives exactly E[y]: 1·x and 0·z are exact and
    so is their sum. The sum runs in fp32 so that a bf16 sampler and an fp32 replay round only once."""
    rows = embed_weight[cand_ids]  # [..., K, d]
    mixed = (cand_weights.unsqueeze(-1).float() * rows.float()).sum(-2)  # [..., d]
    return mixed.to(embed_weight.dtype)
