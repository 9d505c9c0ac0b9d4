"""The decode step's kernels: the model's forward for one new position of each of S rows, written for speed.

The sampler's hot loop runs one new position for each of S rows, every row at its own position of its own cache
row. It is written for a CUDA graph: fixed shapes, no host sync, and the row lengths are data (`positions`), not
shapes, so one captured graph serves every length. The chains of small elementwise kernels between the matrix
products (residual add + RMSNorm, RoPE, SiLU x up) are three functions that torch.compile fuses on a GPU; on a
CPU they run as they are, and their arithmetic is the training forward's (model.py), op for op, so that
`decode_hidden` gives what `Transformer.forward_hidden` gives for the same inputs (tests/test_model.py).

On a GPU the attention of a step is FlashAttention's variable-length kernel reading each row's own cache length
(`FlashDecode`); elsewhere scaled_dot_product_attention over a power-of-two window of the cache.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from model import KVCache, ModelConfig, Transformer, rotate_half


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm's arithmetic, as RMSNorm.forward does it: normalise in fp32, cast back, then the weight."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """(RMSNorm(residual + x), residual + x): a block's residual add fused with the next norm (the first norm of
    the first block gets a zero residual: adding it changes nothing)."""
    x = residual + x  # in the model's dtype, as Block.forward adds
    return rms_norm(x, weight, eps), x


def rotary(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           positions: torch.Tensor, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, eps: float,
           k_cache: torch.Tensor, v_cache: torch.Tensor, grouped: bool = False) -> torch.Tensor:
    """One step's q [S, H, D] and k [S, Hkv, D] (Qwen3: each head RMS-normed first) rotated by RoPE (cos, sin
    [S, 1, D] in q's dtype), the training forward's arithmetic for one position per row; k and v [S, Hkv, D] are
    written into row b's cache slot positions[b] (k_cache, v_cache [S, max_len, Hkv, D]). Returns the rotated q,
    [S, H, D] or, grouped, [S, H / Hkv, Hkv, D] (each KV head's query heads side by side: FlashDecode's grouped
    layout)."""
    if q_norm is not None:
        q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
    rows = torch.arange(q.shape[0], device=q.device)
    k_cache[rows, positions] = k * cos + rotate_half(k) * sin
    v_cache[rows, positions] = v
    q = q * cos + rotate_half(q) * sin
    if grouped:
        q = q.view(q.shape[0], k.shape[1], -1, q.shape[2]).transpose(1, 2).contiguous()
    return q


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


@dataclass(frozen=True)
class DecodeOps:
    """The decode step's elementwise functions: as written (eager), or compiled by torch.compile."""

    add_rms_norm: Callable
    rotary: Callable
    silu_mul: Callable


_DECODE_OPS: dict[str | None, DecodeOps] = {}


def decode_ops(backend: str | None) -> DecodeOps:
    """The elementwise functions eager (backend None) or under torch.compile(backend) with dynamic sizes: one
    compile per dtype serves every batch size, cache and length (a single row, size 1, is compiled apart). One set
    per process, shared by every model."""
    if backend not in _DECODE_OPS:
        if backend is None:
            _DECODE_OPS[None] = DecodeOps(add_rms_norm, rotary, silu_mul)
        else:
            _DECODE_OPS[backend] = DecodeOps(*(compiled(fn, backend) for fn in (add_rms_norm, rotary, silu_mul)))
    return _DECODE_OPS[backend]


def compiled(fn, backend: str):
    """fn under torch.compile with every size dynamic, none assumed equal to another because they happen to be
    equal at the first call (duck sizing: rows = heads in one call would recompile when they differ)."""
    fn_compiled = torch.compile(fn, backend=backend, fullgraph=True, dynamic=True)

    def run(*args):
        with torch.fx.experimental._config.patch(use_duck_shape=False):
            return fn_compiled(*args)

    return run


_COMPILED: dict[tuple[Callable, str], Callable] = {}


def compiled_once(fn: Callable, backend: str | None) -> Callable:
    """fn as written (backend None), or `compiled(fn, backend)` made once per process and kept: what a step rule
    calls for its own elementwise functions under the backend the decoder runs (None once compiling failed)."""
    if backend is None:
        return fn
    if (fn, backend) not in _COMPILED:
        _COMPILED[fn, backend] = compiled(fn, backend)
    return _COMPILED[fn, backend]


def flash_decode_supported(cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether FlashAttention's variable-length kernel (bf16 / fp16 on a CUDA GPU) can run the decode step's
    attention for this architecture."""
    return (device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and cfg.head_dim % 8 == 0
            and cfg.head_dim <= 256 and hasattr(torch.ops.aten, "_flash_attention_forward"))


@dataclass(frozen=True)
class FlashDecode:
    """How a decode step calls FlashAttention's variable-length kernel over S rows of a max_len-slot cache, each
    row reading only its own first positions[b] + 1 slots (`seqused_k`): one kernel for every length.

    grouped False: q [S, H, D], one query per row; the kernel moves each KV head's query heads into the query axis
    itself (two copies) and splits the cache across blocks, then combines them (a second kernel). grouped True: q
    arrives so laid out ([S, H / Hkv, Hkv, D], written so by the rotary kernel): one kernel, no split, and one
    copy back. Which is faster depends on the GPU, the rows and the cache: fastest_flash_layout measures it."""

    cu_q: torch.Tensor  # [S + 1] int32: where each row's queries start (b, or b * H / Hkv grouped)
    cu_k: torch.Tensor  # [S + 1] int32: where each row's cache starts (b * max_len)
    grouped: bool


def flash_decode(rows: int, max_len: int, groups: int, grouped: bool, device) -> FlashDecode:
    index = torch.arange(rows + 1, dtype=torch.int32, device=device)
    return FlashDecode(index * groups if grouped else index, index * max_len, grouped)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor, *,
                     mask: torch.Tensor | None = None, flash: FlashDecode | None = None,
                     lengths: torch.Tensor | None = None) -> torch.Tensor:
    """One query per head per row over that row's cache slots 0..positions[b]: k_cache / v_cache
    [S, max_len, Hkv, D]; returns [S, H, D].

    flash: FlashAttention's variable-length kernel (q as FlashDecode's layout says); lengths: positions + 1 in
    int32, if the caller has it already. Else scaled_dot_product_attention (any device and dtype) over the first
    W slots, mask [S, W] bool = slot <= positions[b], q [S, H, D]."""
    S, max_len, kv_heads, D = k_cache.shape
    if flash is not None:
        lengths = (positions + 1).to(torch.int32) if lengths is None else lengths
        groups = q.shape[1] if flash.grouped else q.shape[1] // kv_heads
        out = torch.ops.aten._flash_attention_forward(
            q.view(S * groups, kv_heads, D) if flash.grouped else q, k_cache.view(S * max_len, kv_heads, D),
            v_cache.view(S * max_len, kv_heads, D), flash.cu_q, flash.cu_k, groups if flash.grouped else 1,
            max_len, 0.0, False, False, scale=D**-0.5, seqused_k=lengths)[0]
        if flash.grouped:  # [S * groups, Hkv, D] -> the heads' own order
            return out.view(S, groups, kv_heads, D).transpose(1, 2).reshape(S, groups * kv_heads, D)
        return out.view(S, -1, D)
    H, window = q.shape[1], mask.shape[1]
    k, v = k_cache[:, :window].transpose(1, 2), v_cache[:, :window].transpose(1, 2)  # [S, Hkv, W, D]
    # The query heads of each KV group are the query axis: the cache is read as it is (see attend).
    out = F.scaled_dot_product_attention(q.view(S, kv_heads, H // kv_heads, D), k, v,
                                         attn_mask=mask[:, None, None])
    return out.reshape(S, H, D)


@torch.no_grad()
def fastest_flash_layout(cfg: ModelConfig, cache: KVCache) -> tuple[bool, dict[str, float]]:
    """Times FlashDecode's two layouts on this cache's rows and length (its first layer filled with random
    values: timings on zeros can flatter) at three row lengths; returns (grouped is faster, milliseconds of each)."""
    k, v = cache.k[0], cache.v[0]
    S, max_len, kv_heads, D = k.shape
    generator = torch.Generator(device=k.device).manual_seed(0)
    k.normal_(generator=generator), v.normal_(generator=generator)
    q = torch.randn(S, cfg.num_heads, D, device=k.device, dtype=k.dtype, generator=generator)
    groups = cfg.num_heads // kv_heads
    times = {}
    for grouped in (False, True):
        flash = flash_decode(S, max_len, groups, grouped, k.device)
        q_in = q.view(S, kv_heads, groups, D).transpose(1, 2).contiguous() if grouped else q
        start, end, total = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), 0.0
        for length in sorted({min(128, max_len), max_len // 2, max_len}):
            positions = torch.full((S,), length - 1, device=k.device)
            run = lambda: decode_attention(q_in, k, v, positions, flash=flash)
            run(), run()
            start.record()
            for _ in range(10):
                run()
            end.record()
            end.synchronize()
            total += start.elapsed_time(end) / 10
        times["grouped" if grouped else "split"] = round(total, 4)
    return times["grouped"] < times["split"], times


def decode_hidden(model: Transformer, inputs: torch.Tensor, positions: torch.Tensor, cache: KVCache, *,
                  ops: DecodeOps, window: int | None = None, flash: FlashDecode | None = None) -> torch.Tensor:
    """The final-norm hidden state [S, d] of one decode step: row b feeds inputs[b] ([S, d], an embedding or
    a mixture) at cache slot and RoPE position positions[b] ([S]: rows are not padded) and attends to its
    slots 0..positions[b] (with FlashAttention, `flash`; else over the first `window` slots). Layers whose
    projections were fused (fuse_projections) run one product each."""
    cfg = model.cfg
    S, H, Hkv, D = inputs.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    inv_freq, eps = model.inv_freq(inputs.device), cfg.rms_norm_eps
    lengths = (positions + 1).to(torch.int32) if flash is not None else None  # FlashAttention's, once a step
    grouped = flash is not None and flash.grouped
    mask = None if flash is not None else (torch.arange(window, device=inputs.device) <= positions[:, None])
    freqs = positions[:, None].float() * inv_freq  # [S, D/2], once a step for every layer
    freqs = torch.cat((freqs, freqs), dim=-1)[:, None]  # [S, 1, D]
    cos, sin = freqs.cos().to(inputs.dtype), freqs.sin().to(inputs.dtype)
    x, residual = inputs, torch.zeros_like(inputs)
    for i, layer in enumerate(model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        k_cache, v_cache = cache.k[i], cache.v[i]
        h, residual = ops.add_rms_norm(x, residual, layer.input_layernorm.weight, eps)
        if hasattr(attn, "qkv"):
            q, k, v = F.linear(h, *attn.qkv).split(attn.qkv_sizes, dim=-1)
        else:
            q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
        q_norm = attn.q_norm.weight if cfg.qk_norm else None
        k_norm = attn.k_norm.weight if cfg.qk_norm else None
        q = ops.rotary(q.view(S, H, D), k.view(S, Hkv, D), v.view(S, Hkv, D), cos, sin, positions, q_norm, k_norm,
                       eps, k_cache, v_cache, grouped)
        out = decode_attention(q, k_cache, v_cache, positions, mask=mask, flash=flash, lengths=lengths)
        h, residual = ops.add_rms_norm(attn.o_proj(out.view(S, -1)), residual,
                                       layer.post_attention_layernorm.weight, eps)
        if hasattr(mlp, "gate_up"):
            gate, up = F.linear(h, *mlp.gate_up).chunk(2, dim=-1)
        else:
            gate, up = mlp.gate_proj(h), mlp.up_proj(h)
        x = mlp.down_proj(ops.silu_mul(gate, up))
    return ops.add_rms_norm(x, residual, model.norm.weight, eps)[0]


def fuse_projections(model: Transformer) -> bool:
    """Each layer's q/k/v projections become views of one [(H + 2 Hkv) D, d] matrix (`qkv`), and gate/up of one
    [2 I, d] matrix (`gate_up`), so that a decode step runs one matrix product for each group instead of three
    and two (the k and v products are small: latency, not bytes). The parameters keep their names, shapes and
    values (state_dict and the Hugging Face layout are unchanged), and writing them in place (the sampler
    copy's refresh) writes the fused matrices. Something that replaces a parameter (`.to()`, load_state_dict
    with assign) undoes it: this checks and fuses again. Returns whether anything was (re)fused."""
    changed = False
    for layer in model.layers:
        for owner, names, attr in ((layer.self_attn, ("q_proj", "k_proj", "v_proj"), "qkv"),
                                   (layer.mlp, ("gate_proj", "up_proj"), "gate_up")):
            linears = [getattr(owner, name) for name in names]
            fused = getattr(owner, attr, None)
            if fused is not None and linears[0].weight.data_ptr() == fused[0].data_ptr() and all(
                    a.weight.data_ptr() + a.weight.numel() * a.weight.element_size() == b.weight.data_ptr()
                    for a, b in zip(linears, linears[1:])):
                continue
            weight = torch.cat([linear.weight.detach() for linear in linears])
            bias = None if linears[0].bias is None else torch.cat([linear.bias.detach() for linear in linears])
            sizes = [linear.out_features for linear in linears]
            for linear, part_w, part_b in zip(linears, weight.split(sizes), (bias.split(sizes) if bias is not None
                                                                            else [None] * len(sizes))):
                linear.weight = nn.Parameter(part_w, requires_grad=linear.weight.requires_grad)
                if part_b is not None:
                    linear.bias = nn.Parameter(part_b, requires_grad=linear.bias.requires_grad)
            object.__setattr__(owner, attr, (weight, bias))  # not a parameter or buffer: a view's owner
            if attr == "qkv":
                object.__setattr__(owner, "qkv_sizes", sizes)
            changed = True
    return changed
