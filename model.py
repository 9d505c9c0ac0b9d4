"""Our own decoder-only transformer for the Qwen2 (DeepSeek-R1-Distill-Qwen), Qwen3 and Llama-3
families.

One small module that owns the network and nothing else: the forward pass (token ids *or* input
embeddings, since the N-GRPO sampler feeds mixtures of embedding rows), a static KV cache that the
sampler preallocates for prompt + max_new_tokens, and loading / saving in the Hugging Face layout
(config.json + one or many *.safetensors) so checkpoints go both ways with `transformers`.

Module names equal the Hugging Face parameter names without their `model.` prefix, so a checkpoint
maps onto this module key for key:

    model = load_model("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", device="cuda")
    logits = model(input_ids)                                   # [B, T, V], same numbers as transformers
    cache = model.new_cache(batch_size=B, max_len=P + max_new_tokens)
    logits = model(prompt_ids, attention_mask=key_mask[:, :P], cache=cache, cache_pos=0)   # prefill
    logits = model(inputs_embeds=e, attention_mask=key_mask, cache=cache, cache_pos=P)     # one step
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch.utils.checkpoint import checkpoint

from data import hub_snapshot, is_hub_id, no_such_path

# model_type in config.json -> the architecture name transformers writes next to it.
ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}


@dataclass
class ModelConfig:
    """The architecture, in our names. `from_hf` / `to_hf` translate to and from config.json."""

    family: str  # "qwen2" | "qwen3" | "llama"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # the llama3 frequency remapping, or None for plain RoPE
    qkv_bias: bool = False  # Qwen2: q/k/v projections carry a bias
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before RoPE
    tie_word_embeddings: bool = False  # the output projection reuses the input embedding matrix
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    initializer_range: float = 0.02

    @classmethod
    def from_hf(cls, hf: dict) -> ModelConfig:
        """Reads a config.json dict as written by transformers 4.x (`rope_theta`, `rope_scaling`) or
        5.x (`rope_parameters`)."""
        family = hf.get("model_type")
        if family not in ARCHITECTURES:
            named = ", ".join(hf.get("architectures") or []) or f"model_type={family!r}"
            supported = ", ".join(f"{arch} ({mt})" for mt, arch in ARCHITECTURES.items())
            raise ValueError(f"unsupported architecture {named}; supported: {supported}")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r}: only silu is implemented")
        if hf.get("use_sliding_window"):
            raise ValueError("use_sliding_window=true is not implemented (no R1-Distill model uses it)")
        rope = dict(hf.get("rope_scaling") or {})
        rope.update(hf.get("rope_parameters") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "llama3"):
            raise ValueError(f"unsupported rope type {rope_type!r}; supported: default, llama3")
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError("partial_rotary_factor != 1 is not implemented")
        num_heads = hf["num_attention_heads"]
        attention_bias = hf.get("attention_bias", False)
        return cls(
            family=family,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
            rope_scaling=None if rope_type == "default" else {
                key: rope[key] for key in
                ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")},
            qkv_bias=True if family == "qwen2" else attention_bias,  # Qwen2 has no flag: always biased
            o_bias=False if family == "qwen2" else attention_bias,
            mlp_bias=hf.get("mlp_bias", False),
            qk_norm=family == "qwen3",
            tie_word_embeddings=hf.get("tie_word_embeddings", family != "qwen2"),
            max_position_embeddings=hf.get("max_position_embeddings", 32768),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=hf.get("eos_token_id"),
            initializer_range=hf.get("initializer_range", 0.02),
        )

    def to_hf(self) -> dict:
        """A config.json dict in the transformers 4.x spelling, which transformers 5.x also reads."""
        hf = {
            "architectures": [ARCHITECTURES[self.family]],
            "model_type": self.family,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None if self.rope_scaling is None else {"rope_type": "llama3", **self.rope_scaling},
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "initializer_range": self.initializer_range,
            "use_sliding_window": False,
        }
        if self.family != "qwen2":
            hf["attention_bias"] = self.qkv_bias
        if self.family == "llama":
            hf["mlp_bias"] = self.mlp_bias
        return hf


# The `tiny` preset: an R1-Distill-shaped Qwen2 (q/k/v bias, untied embeddings) small enough that
# every code path runs in seconds on a CPU. Its 262 rows are exactly data.py's built-in tokenizer
# (256 bytes + 6 chat tokens), so even an untrained tiny model never samples an id that decodes to
# nothing.
TINY_CONFIG = ModelConfig(
    family="qwen2", vocab_size=262, hidden_size=64, intermediate_size=192, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=16, qkv_bias=True, max_position_embeddings=4096,
)


# What --model takes besides a checkpoint: an architecture with random weights (load_model,
# runtime/plan.py).
MODEL_PRESETS = {"tiny": TINY_CONFIG}


def rope_inv_freq(cfg: ModelConfig, device=None) -> torch.Tensor:
    """Rotation frequency of each pair of head dimensions, in fp32: [head_dim // 2]."""
    exponent = torch.arange(0, cfg.head_dim, 2, device=device, dtype=torch.float32) / cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** exponent)
    if cfg.rope_scaling is None:
        return inv_freq
    # llama3: long wavelengths are slowed by `factor`, short ones kept, the band between
    # interpolated.
    s = cfg.rope_scaling
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 and cast back before the weight, exactly as transformers does.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> torch.Tensor:
    """Grouped-query attention. q [B, H, T, D]; k, v [B, Hkv, S, D]; mask None (causal, T == S), bool
    [B, 1, T, S] (True = may attend), or a packed sequence's attention (engine.packing). Returns [B, H, T, D]."""
    if callable(mask):
        return mask(q, k, v)
    B, H, T, D = q.shape
    groups = H // k.shape[1]
    if mask is None:
        # Causal (training, prefill): the flash kernels (CPU and CUDA) read each KV head for its `groups`
        # query heads in place, where repeat_interleave would copy K and V `groups` times (6x for
        # R1-Distill-1.5B: ~0.4 GB per layer at 8k tokens x batch 4 in bf16).
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=groups > 1)
    if T == 1:
        # One decode step: fold the query heads of each KV group into the query axis, so the cache is
        # read as it is instead of copied `groups` times. Head h uses KV head h // groups, as in HF.
        out = F.scaled_dot_product_attention(q.view(B, -1, groups, D), k, v, attn_mask=mask)
        # reshape, not view: CUDA's fp32 kernel returns [B, Hkv, groups, D] in a layout a view cannot fold.
        return out.reshape(B, H, 1, D)
    # A masked block of queries (left-padded batches): the kernels that take a mask do not all take
    # grouped heads, so K and V are expanded here.
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, kv=None, slots=None, window=None):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = cos.to(q.dtype)[:, None], sin.to(q.dtype)[:, None]  # [B, 1, T, D]
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin  # [B, H, T, D]
        k = k * cos + rotate_half(k) * sin  # [B, Hkv, T, D]
        if kv is not None:
            k_cache, v_cache = kv  # [B, max_len, Hkv, D]; attend to the first `window` slots
            if slots.dim() == 1:  # [T]: the same slots in every row
                k_cache.index_copy_(1, slots, k.transpose(1, 2))
                v_cache.index_copy_(1, slots, v.transpose(1, 2))
            else:  # [B, T]: each row writes its own slots
                rows = torch.arange(B, device=slots.device)[:, None]
                k_cache[rows, slots] = k.transpose(1, 2)
                v_cache[rows, slots] = v.transpose(1, 2)
            k, v = k_cache[:, :window].transpose(1, 2), v_cache[:, :window].transpose(1, 2)  # [B, Hkv, W, D]
        out = attend(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# The linear projections of every block, attention then MLP, named as in Hugging Face checkpoints
# (what LoRA's adapters can wrap: runtime/lora.py, --lora-targets).
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def projection_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) features of each of a block's PROJECTIONS."""
    h, i, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return dict(zip(PROJECTIONS, ((h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h))))


def unknown_targets(targets: str) -> list[str]:
    """The names of a --lora-targets list that are not PROJECTIONS (an empty name too)."""
    return [name for name in (t.strip() for t in targets.split(",")) if name not in PROJECTIONS]


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask, kv=None, slots=None, window=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, kv, slots, window)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class KVCache:
    """Preallocated keys and values for every layer: [num_layers, B, max_len, Hkv, D] each.

    Slot s of a row holds the token written at cache position s; rows of a left-padded batch share
    slot numbers, and the attention mask says which slots of each row are real. Positions before
    heads: each row's layer is one [max_len, Hkv, D] block, the layout FlashAttention's
    variable-length kernel reads in place."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def max_len(self) -> int:
        return self.k.shape[2]


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, hf_config: dict | None = None):
        super().__init__()
        self.cfg = cfg
        self.hf_config = hf_config  # the config.json it was loaded from, written back as it was by save_model
        # nn.Embedding's own N(0, 1) draw, skipped on the meta device (shapes only: load_model,
        # random_model, the plan), where its meta kernel alone imports torch._dynamo: ~2 s of CPU at
        # the start of every process.
        embedding = torch.empty(cfg.vocab_size, cfg.hidden_size)
        if not embedding.is_meta:
            nn.init.normal_(embedding)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=embedding)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.gradient_checkpointing = False  # recompute each block in backward instead of storing it
        self.compiled_layers: list | None = None  # compile_layers(): each block under torch.compile
        # RoPE frequencies per device, in fp32 whatever the weights' dtype: a cache, not a buffer,
        # so that casting the model to bf16 can never round them.
        self._inv_freq: dict[torch.device, torch.Tensor] = {}

    def compile_layers(self, enable: bool = True) -> None:
        """Run each block of the full-sequence forward (training, replay, prefill) under
        torch.compile, which fuses the elementwise chains between its matrix products (RMSNorm,
        RoPE, SiLU x up, residual adds, autocast's casts) in the forward and the backward. Sequence
        lengths are dynamic: one compile serves them all. The parameters stay the module's own
        (state_dict unchanged); enable=False goes back to eager."""
        self.compiled_layers = [torch.compile(layer, dynamic=True) for layer in self.layers] if enable else None

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        """RoPE's frequencies on `device` (rope_inv_freq, computed once per device)."""
        if device not in self._inv_freq:
            self._inv_freq[device] = rope_inv_freq(self.cfg, device)
        return self._inv_freq[device]

    @property
    def output_weight(self) -> torch.Tensor:
        """The [V, d] matrix that maps hidden states to logits (the input embedding when tied)."""
        return self.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight

    def new_cache(self, batch_size: int, max_len: int, *, dtype=None, device=None) -> KVCache:
        weight = self.embed_tokens.weight
        shape = (self.cfg.num_layers, batch_size, max_len, self.cfg.num_kv_heads, self.cfg.head_dim)
        dtype, device = dtype or weight.dtype, device or weight.device
        return KVCache(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    def forward(self, input_ids=None, **kwargs) -> torch.Tensor:
        """Logits [B, T, V] for the T input positions. Arguments as in `forward_hidden`."""
        return F.linear(self.forward_hidden(input_ids, **kwargs), self.output_weight)

    def forward_hidden(
        self,
        input_ids: torch.Tensor | None = None,
        *,
        inputs_embeds: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        cache_pos: int | torch.Tensor = 0,
        window: int | None = None,
        attention=None,
    ) -> torch.Tensor:
        """Final-norm hidden states [B, T, d], for callers that project to the vocabulary in chunks.

        input_ids [B, T] or inputs_embeds [B, T, d] (exactly one).
        attention_mask [B, S] (1 = real token): over the T inputs without a cache; with a cache over the
            cache slots 0..S-1, and the step attends to exactly those S slots (pass S = max_len to keep
            shapes fixed, e.g. for a CUDA graph). None: every position is real.
        positions [B, T]: RoPE positions. Default: count of real tokens before each one (left padding).
        cache, cache_pos: write the T inputs into slots cache_pos..cache_pos+T-1 and attend over the cache.
            cache_pos 0 with no attention_mask (a prefill into an empty cache) is plain causal attention
            over the T inputs, with no mask tensor.
        cache_pos [B] (per-row slots, no attention_mask): row b writes at cache_pos[b].. and attends to its
            slots 0..cache_pos[b]+t, all real (rows are not padded), within the first `window` slots
            (default max_len): a caller that knows every row's position is below W reads only W slots.
        attention: a packed sequence's attention (engine.packing.RowAttention, with its positions) for the causal.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds  # [B, T, d]
        B, T, _ = x.shape
        device = x.device
        slots = cache_pos + torch.arange(T, device=device)  # [T] cache slot (or sequence index) of each input
        mask = attention  # None = plain causal over the T inputs: the fast path for full-sequence training
        prefill = cache is not None and attention_mask is None and isinstance(cache_pos, int) and cache_pos == 0
        if torch.is_tensor(cache_pos) and cache_pos.dim() == 1:  # per-row slots [B]
            if attention_mask is not None:
                raise ValueError("per-row cache_pos takes no attention_mask: every slot below a row's is real")
            window = window or cache.max_len
            slots = cache_pos[:, None] + torch.arange(T, device=device)  # [B, T]
            mask = (torch.arange(window, device=device) <= slots[..., None])[:, None]  # [B, 1, T, window]
            positions = slots if positions is None else positions
        elif prefill:
            window = T
        elif cache is not None or attention_mask is not None:
            if attention_mask is None:
                S = cache_pos + T if isinstance(cache_pos, int) else cache.max_len
                attention_mask = torch.ones(B, S, dtype=torch.bool, device=device)
            key_slots = torch.arange(attention_mask.shape[1], device=device)
            causal = key_slots[None, :] <= slots[:, None]  # [T, S]
            mask = causal & attention_mask.bool()[:, None, :]  # [B, T, S]
            # A padding query sees no real key; letting it see itself keeps its row finite (it is unused).
            mask = (mask | (key_slots[None, :] == slots[:, None]))[:, None]  # [B, 1, T, S]
            window = attention_mask.shape[1]
        if positions is None:
            if attention_mask is None:
                positions = slots.expand(B, T)
            else:
                positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, slots]
        freqs = positions[..., None].float() * self.inv_freq(device)  # [B, T, D/2]
        freqs = torch.cat((freqs, freqs), dim=-1)
        cos, sin = freqs.cos(), freqs.sin()
        for i, layer in enumerate(self.layers if attention else self.compiled_layers or self.layers):
            kv = None if cache is None else (cache.k[i], cache.v[i])
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, x, cos, sin, mask, kv, slots, window, use_reentrant=False)
            else:
                x = layer(x, cos, sin, mask, kv, slots, window)
        return self.norm(x)


# ----------------------------------------------------------------------------- initialisation, I/O


def init_weights(model: Transformer, seed: int = 0) -> Transformer:
    """Random weights as transformers initialises them: N(0, initializer_range) matrices, zero
    biases, unit norms. Drawn from a seeded generator on the model's device, so it is reproducible."""
    device = model.embed_tokens.weight.device
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.normal_(0.0, model.cfg.initializer_range, generator=generator)
    return model


def random_model(cfg: ModelConfig | str | Path, *, dtype=torch.float32, device="cpu", seed: int = 0) -> Transformer:
    """A randomly initialised model of a given architecture (a ModelConfig or a config.json path):
    for tests and benchmarks at the real shapes without the real weights."""
    if not isinstance(cfg, ModelConfig):
        cfg = ModelConfig.from_hf(json.loads(Path(cfg).read_text()))
    # Built on the meta device (shapes only), then given memory in `dtype` on `device`: no fp32 copy
    # and no default initialisation to throw away (init_weights draws every value): 2.5x faster at
    # 1.5B on 2 cores.
    with torch.device("meta"):
        model = Transformer(cfg).to(dtype)
    return init_weights(model.to_empty(device=device), seed)


def resolve_checkpoint(name_or_path: str) -> Path:
    """A local directory as it is; anything else is a hub id, downloaded (or found in the HF cache)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if not is_hub_id(name_or_path):
        raise FileNotFoundError(no_such_path(name_or_path, "checkpoint directory") + " (nor a hub id: owner/name)")
    return hub_snapshot(name_or_path, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.jinja", "tokenizer*"],
                        instead="a local checkpoint directory (config.json and *.safetensors), or 'tiny'")


def _checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        return [path / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    if (path / "model.safetensors").exists():
        return [path / "model.safetensors"]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path} (pytorch_model.bin checkpoints are not supported)")
    return files


def load_model(name_or_path: str, *, dtype=torch.bfloat16, device="cuda", seed: int = 0) -> Transformer:
    """Load a Hugging Face checkpoint (local directory or hub id) into our Transformer.

    The module is built on the meta device and the safetensors tensors are read straight onto
    `device` and assigned, so the weights are never materialised twice. A name of MODEL_PRESETS
    ("tiny") gives that architecture with random weights drawn from `seed` in fp32, then cast to
    `dtype` (the same weights in any dtype: a bf16 reference is the fp32 policy rounded)."""
    if name_or_path in MODEL_PRESETS:
        return random_model(MODEL_PRESETS[name_or_path], dtype=torch.float32, device=device, seed=seed).to(dtype)
    path = resolve_checkpoint(name_or_path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} has no config.json")
    try:
        hf_config = json.loads((path / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path / 'config.json'}: not a JSON model config ({error})") from None
    if isinstance(hf_config, dict) and "model_type" not in hf_config and "out_dir" in hf_config:
        raise ValueError(f"{path} is a training run's folder (its config.json holds the run's settings), with no "
                         "checkpoint yet: pass one of its checkpoints (OUT/checkpoints/step-N) once it has one")
    cfg = ModelConfig.from_hf(hf_config)
    with torch.device("meta"):
        model = Transformer(cfg, hf_config)
    expected = model.state_dict().keys()
    state = {}
    for file in _checkpoint_files(path):
        try:
            with safe_open(str(file), framework="pt", device=str(device)) as f:
                for hf_key in f.keys():
                    key = hf_key.removeprefix("model.")
                    if key in expected:  # skips e.g. a tied lm_head copy or an old rotary_emb.inv_freq
                        state[key] = f.get_tensor(hf_key).to(dtype)
        except Exception as error:  # safetensors raises its own error type for a truncated or corrupt file
            if isinstance(error, torch.OutOfMemoryError):
                raise
            raise ValueError(f"{file}: not a readable safetensors file, truncated or corrupt? ({error})") from None
    missing = sorted(set(expected) - state.keys())
    if missing:
        raise ValueError(f"checkpoint {path} lacks {len(missing)} weights, e.g. {missing[:3]}")
    model.load_state_dict(state, assign=True)
    return model


def save_model(model: Transformer, out_dir, tokenizer=None, *, max_shard_bytes: int = 5 * 2**30, dtype=None):
    """Write `model` in the Hugging Face layout that `transformers.AutoModelForCausalLM` loads:
    config.json and model.safetensors, or numbered shards plus model.safetensors.index.json when the
    weights exceed `max_shard_bytes`; and the tokenizer's files when one is given. Tensors keep the
    model's dtype unless `dtype` says otherwise."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {}
    for key, tensor in model.state_dict().items():
        tensor = tensor.detach().to(dtype or tensor.dtype).contiguous().cpu()
        state[key if key.startswith("lm_head.") else "model." + key] = tensor
    shards, size = [{}], 0
    for key, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards, 1):
            name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(out_dir / name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, name))
        total = sum(t.numel() * t.element_size() for t in state.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    hf_config = dict(model.hf_config or model.cfg.to_hf())
    dtype_key = "dtype" if "dtype" in hf_config else "torch_dtype"  # transformers 5.x / 4.x spelling
    hf_config[dtype_key] = str(next(iter(state.values())).dtype).removeprefix("torch.")
    (out_dir / "config.json").write_text(json.dumps(hf_config, indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out_dir))


def kv_cache_bytes(cfg: ModelConfig, rows: int, tokens: int, dtype=torch.bfloat16) -> int:
    """Bytes of a KV cache for `rows` sequences of `tokens` positions (keys and values of every
    layer)."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * tokens * rows * element


def resolve_device(name: str = "") -> torch.device:
    """The device a --device flag names ("" = cuda when available); a GPU this torch cannot see is a
    ValueError saying what to do."""
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: this torch build ({torch.__version__}) sees no CUDA GPU; pass --device "
                         "cpu or install a CUDA build of torch")
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))
