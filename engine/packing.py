"""Padding-free packing for the update (`--pack`): a micro-batch's rows laid end to end as one sequence, so that no
padded position goes through the model.

    hidden = packed_hidden(model, inputs, lengths, read)   # [B, T, d]: forward_hidden(inputs_embeds=inputs) at read

Row b's first lengths[b] positions of inputs [B, L, d] are its real ones (right padding after them). Packed, the
N = sum(lengths) positions run through the model as [1, N, d] with RoPE positions restarting at 0 for each row and
attention causal within each row, never across: exactly the padded forward's values at the real positions (the
model's linear layers and norms act per position; only attention and RoPE see the row). The positions a caller
reads are gathered from the packed sequence itself (no [B, L, d] copy); one past a row's length reads the row's
last (the replay's response mask ignores it).

Attention runs once per row (`RowAttention`, the flash kernels' causal path on each row's [1, H, n_b, D]): no
[N, N] mask is built and no padded query or key is computed. A variable-length attention kernel
(cumulative-length offsets, one launch for all rows) is the GPU's faster form of the same loop.
"""

import torch
import torch.nn.functional as F


class RowAttention:
    """Causal attention within each row of a packed sequence: q [1, H, N, D], k, v [1, Hkv, N, D] split at the
    rows' lengths; the model's `attend` calls it in place of a mask."""

    def __init__(self, lengths: list[int]):
        self.lengths = lengths

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        grouped = q.shape[1] != k.shape[1]
        rows = zip(q.split(self.lengths, 2), k.split(self.lengths, 2), v.split(self.lengths, 2))
        return torch.cat([F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=grouped)
                          for qb, kb, vb in rows], dim=2)


def packed_hidden(model, inputs: torch.Tensor, lengths: list[int], read: torch.Tensor) -> torch.Tensor:
    """model.forward_hidden over the rows of inputs [B, L, d] (row b real in its first lengths[b] positions), packed
    end to end, at the positions read [B, T] of each row: [B, T, d]."""
    L, device = inputs.shape[1], inputs.device
    n = torch.tensor(lengths, device=device)  # [B]
    real = torch.arange(L, device=device)[None] < n[:, None]  # [B, L]
    positions = torch.cat([torch.arange(length, device=device) for length in lengths])[None]  # [1, N]
    hidden = model.forward_hidden(inputs_embeds=inputs[real][None], positions=positions,
                                  attention=RowAttention(lengths))[0]  # [N, d]
    start = n.cumsum(0) - n  # [B]: where each row begins in the packed sequence
    index = start[:, None] + torch.minimum(read, (n[:, None] - 1).clamp_min(0))  # [B, T]
    return hidden[index.clamp(max=hidden.shape[0] - 1)]
