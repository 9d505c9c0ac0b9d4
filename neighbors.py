"""Nearest-neighbor table over a vocabulary matrix: the "semantic neighbors" N-GRPO mixes in.

At a mixed decode step N-GRPO feeds a weighted mixture of the anchor token's embedding and the
embeddings of the anchor's nearest vocabulary rows. The released code finds those neighbors by
computing a V x d similarity between the anchor's row and the whole output matrix (lm_head) at every
decode step. The matrix does not change during a rollout, so we precompute a [V, k] table once and
the sampler only gathers from it: row v holds the k nearest ids to v, v itself excluded, nearest
first.

    table = build_neighbor_table(model.lm_head.weight, k=2)                 # [V, 2]
    table = build_neighbor_table(weight, k=2, cache_dir="runs/neighbors")   # load if built before

The search is chunked over query rows: each chunk is scored against the whole matrix, so memory is
chunk_size x V scores (about 256 MB by default), never V x V (V = 151,936 for R1-Distill-Qwen). It
runs on whatever device `weight` is on, with no host sync inside the chunk loop; scores are always
fp32 (a bf16 matrix is upcast once, an fp32 copy of V x d).

Rebuilt on demand during training: with --neighbor-refresh N the trainer calls build_neighbor_table
again every N optimizer steps with the same cache_dir. The cache key is a hash of the weight bytes
plus (k, metric, V, d, dtype), so weights that changed since the last build are searched again,
while an unchanged matrix (a resumed run, a frozen lm_head, another run on the same model) is loaded
from disk.
"""

import ctypes
import hashlib
import os
import tempfile
from pathlib import Path

import torch

from runtime.guard import follow_umask
from runtime.tracking import progress

METRICS = ("cosine", "dot", "l2", "l1")
CHUNK_BYTES = 256 * 2**20  # fp32 scores held per chunk: bounds the working set on CPU and GPU alike


def build_neighbor_table(weight: torch.Tensor, k: int, metric: str = "cosine", *,
                         chunk_size: int | None = None, cache_dir: str | os.PathLike | None = None) -> torch.Tensor:
    """Row v: the k nearest rows of `weight` [V, d] to row v under `metric`, v excluded, nearest
    first.

    cosine / dot rank by highest similarity, l2 / l1 by smallest distance. Returns a LongTensor [V,
    k] on weight's device. With cache_dir, a table built before for identical weights and settings
    is loaded instead of searched, and a new one is saved there.
    """
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"weight must be a 2-D floating-point [V, d] matrix, got shape {tuple(weight.shape)} "
                         f"and dtype {weight.dtype}")
    if metric not in METRICS:
        raise ValueError(f"unknown neighbor metric {metric!r}; choose one of {', '.join(METRICS)}")
    vocab_size = weight.shape[0]
    if not 1 <= k < vocab_size:
        raise ValueError(f"k must be between 1 and V - 1 = {vocab_size - 1} (row v excludes v itself), got {k}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    if cache_dir is None:
        return _search(weight, k, metric, chunk_size)

    path = Path(cache_dir) / f"neighbors-{metric}-k{k}-{_weight_key(weight, k, metric)}.pt"
    if path.exists():
        return torch.load(path, map_location=weight.device, weights_only=True)
    table = _search(weight, k, metric, chunk_size)
    _save_atomically(table.cpu(), path)
    return table


def _search(weight: torch.Tensor, k: int, metric: str, chunk_size: int | None) -> torch.Tensor:
    keys = weight.detach().float()  # [V, d]; no copy when already fp32
    vocab_size = keys.shape[0]
    chunk_size = min(chunk_size or max(1, CHUNK_BYTES // (4 * vocab_size)), vocab_size)
    if metric == "cosine":
        # Clamped so a zero row scores 0 against everything instead of NaN.
        inv_norms = keys.norm(dim=1).clamp_min(1e-12).reciprocal()  # [V]
    elif metric == "l2":
        # ||q - u||^2 = ||q||^2 + ||u||^2 - 2 q.u; ||q||^2 is constant along a row, so ranking by the
        # highest 2 q.u - ||u||^2 gives the same order and avoids cancelling against ||q||^2.
        sq_norms = keys.square().sum(dim=1)  # [V]
    table = torch.empty(vocab_size, k, dtype=torch.long, device=keys.device)
    # Progress with an ETA (stderr: a bar on a terminal, a line every 15 s in a log) once the search
    # has run 3 s: the 1.5B vocabulary takes ~11 minutes on 2 CPU cores. On a GPU the loop only
    # queues kernels, so the bar fills at once.
    bar = progress(total=vocab_size, desc="neighbor table", unit="row", unit_scale=True, delay=3, leave=False)
    for start in range(0, vocab_size, chunk_size):
        queries = keys[start:start + chunk_size]  # [c, d]
        if metric == "cosine":
            scores = (queries * inv_norms[start:start + chunk_size, None]) @ keys.T  # [c, V]
            scores.mul_(inv_norms)
        elif metric == "dot":
            scores = queries @ keys.T
        elif metric == "l2":
            scores = torch.addmm(sq_norms, queries, keys.T, beta=-1, alpha=2)
        else:
            # No matmul form for L1: cdist works pair by pair without a [c, V, d] intermediate.
            scores = torch.cdist(queries, keys, p=1).neg_()
        # Entry (i, start + i) is the query against itself; under dot another row may outscore it,
        # so v is excluded explicitly rather than by dropping the first hit.
        scores.diagonal(start).fill_(float("-inf"))
        table[start:start + chunk_size] = scores.topk(k, dim=1).indices
        del scores  # free this chunk's scores before the next is computed: one chunk alive, not two
        bar.update(min(chunk_size, vocab_size - start))
    bar.close()
    return table


def _weight_key(weight: torch.Tensor, k: int, metric: str) -> str:
    """sha256 of the settings and the raw weight bytes (about 0.5 s for 151,936 x 1,536 fp32 on
    CPU)."""
    host = weight.detach().cpu().contiguous()
    digest = hashlib.sha256(f"{metric} k={k} shape={tuple(host.shape)} dtype={host.dtype}".encode())
    # A zero-copy view of the tensor's bytes that works for bf16 too and needs no numpy.
    digest.update(memoryview((ctypes.c_char * (host.numel() * host.element_size())).from_address(host.data_ptr())))
    return digest.hexdigest()[:32]


def _save_atomically(table: torch.Tensor, path: Path) -> None:
    """Write to a temp file beside `path`, then rename, so a crash never leaves a truncated table
    behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(table, f)
        follow_umask(tmp_path)  # mkstemp made it 0600
        os.replace(tmp_path, path)
    except BaseException:
        os.unlink(tmp_path)
        raise


def table_for(model, cfg, *, cache_dir=None) -> torch.Tensor:
    """The neighbor table a Config asks for over `model`: --neighbor-space picks the matrix searched
    (output = lm_head, as the released code; input = the embedding matrix), --neighbor-metric the
    similarity."""
    matrix = model.output_weight if cfg.neighbor_space == "output" else model.embed_tokens.weight
    return build_neighbor_table(matrix.detach(), cfg.num_neighbors, cfg.neighbor_metric, cache_dir=cache_dir)
