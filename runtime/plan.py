"""Will it fit: the memory of a training run on each GPU (or on the CPU), from its Config and the model's
config.json alone, before anything is loaded.

    python train.py --preset paper-7b --plan --plan-gpus 8 --plan-gpu-gb 80

`plan_memory` counts what train.py, ngrpo.py, rollout.py and runtime/distributed.py hold, as they hold it (docs/plan.md
says where each row comes from): the fp32 policy, its gradients and AdamW moments (sharded over the GPUs under
torchrun), the sampler's copy (bf16, unsharded on every GPU; none on one CPU, where the policy samples), the
reference model (bf16; sharded under torchrun), the rollout's KV cache and decode buffers, and the update's
activations and log-prob chunks. Two phases never overlap: rollouts (the KV cache lives) and the update (the
activations live); the larger, plus the allocator's margin, must fit. When it does not, `suggest` finds the
smallest change of --rollout-batch-size, --micro-batch-size, --grad-checkpointing or the GPU count that fits.
train.py checks the same plan before it loads anything.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from data import describe_load_error, hub_snapshot, is_hub_id, no_such_path
from engine.decoder import CACHE_ROUND, PREFILL_TOKENS
from model import MODEL_PRESETS, ModelConfig, Transformer, kv_cache_bytes

GIB = 2**30
CUDA_RESERVED_BYTES = GIB  # CUDA context, cuBLAS / NCCL workspaces: memory torch's allocator never sees
FRAGMENTATION = 0.10  # the caching allocator's blocks that are reserved but not in use, as a share of the peak
DECODE_VOCAB_BUFFERS = 5  # fp32 [rows, V] tensors of one decode step: logits, their copy, filtered, probs, draws
LOGIT_CHUNK_BUFFERS = 3  # fp32 [chunk, V] tensors alive at once in a log-prob chunk's forward
BACKWARD_MLP_BUFFERS = 2  # [tokens, intermediate] gradients alive at once in one block's backward


@dataclass(frozen=True)
class Row:
    """One line of the plan: bytes held at the peak of each phase (0 = not held then)."""

    name: str
    rollout: int
    update: int
    optimizer_step: bool = False  # held only during AdamW's step, when the update's activations are freed


@dataclass
class Plan:
    """The plan of a run: its rows, the budget, and the transient peak of loading."""

    rows: list[Row]
    device: str  # "cuda" or "cpu"
    gpus: int
    budget_bytes: int
    load_bytes: int  # the policy as read before sharding: every rank holds the whole fp32 checkpoint at once
    description: str
    checkpoint: int = 0  # host memory that writing a checkpoint gathers on rank 0

    def phase_bytes(self, phase: str) -> int:
        """The phase's peak: for the update, the larger of the backward (activations) and AdamW's step."""
        backward = sum(getattr(row, phase) for row in self.rows if not row.optimizer_step)
        step = sum(getattr(row, phase) for row in self.rows if row.optimizer_step or row.rollout)
        return max(backward, step)


    def margin_bytes(self, phase: str) -> int:
        reserved = CUDA_RESERVED_BYTES if self.device == "cuda" else 0
        return reserved + int(FRAGMENTATION * self.phase_bytes(phase))

    def total_bytes(self, phase: str) -> int:
        return self.phase_bytes(phase) + self.margin_bytes(phase)

    @property
    def peak_bytes(self) -> int:
        return max(self.total_bytes("rollout"), self.total_bytes("update"), self.load_bytes)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.budget_bytes


# ----------------------------------------------------------------------------- the model's shape


def model_config(name_or_path: str) -> ModelConfig:
    """The architecture of --model from its config.json alone: 'tiny', a local checkpoint directory, a
    config.json path, or a hub id (only config.json is downloaded)."""
    if name_or_path in MODEL_PRESETS:
        return MODEL_PRESETS[name_or_path]
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    elif not path.exists():
        if not is_hub_id(name_or_path):
            raise FileNotFoundError(no_such_path(name_or_path, "checkpoint directory or config.json") +
                                    " (nor a hub id: owner/name)")
        path = hub_snapshot(name_or_path, allow_patterns=["config.json"],
                            instead="a local checkpoint directory or its config.json") / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the plan needs the model's config.json")
    try:
        return ModelConfig.from_hf(json.loads(path.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError) as error:
        raise ValueError(f"{path}: not a model config.json ({error!r})") from None


@dataclass(frozen=True)
class Params:
    """Parameter counts of an architecture, as our Transformer holds them."""

    total: int
    embed: int  # the input embedding (V x d)
    root: int  # what FSDP's root owns: embedding, final norm, untied output matrix
    block: int  # one decoder block

    def trainable(self, freeze_embeddings: bool) -> int:
        return self.total - (self.embed if freeze_embeddings else 0)


_COUNTED: dict[str, Params] = {}


def count_params(mc: ModelConfig) -> Params:
    """Counted on a meta-device instance of our Transformer: no memory, exactly the module's parameters."""
    key = json.dumps(mc.to_hf(), sort_keys=True)
    if key not in _COUNTED:
        _COUNTED[key] = _count(mc)
    return _COUNTED[key]


def _count(mc: ModelConfig) -> Params:
    with torch.device("meta"):
        model = Transformer(mc)
    total = sum(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.layers[0].parameters()) if mc.num_layers else 0
    return Params(total, model.embed_tokens.weight.numel(), total - block * mc.num_layers, block)


def adapter_count(mc: ModelConfig, rank: int, targets: str) -> int:
    """Parameters of --lora-rank adapters on the --lora-targets projections (comma-separated) of every block:
    rank x (in + out) each, A [rank, in] and B [out, rank] (runtime/lora.py)."""
    d, inter = mc.hidden_size, mc.intermediate_size
    q_width, kv_width = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
    sizes = {"q_proj": d + q_width, "k_proj": d + kv_width, "v_proj": d + kv_width, "o_proj": q_width + d,
             "gate_proj": d + inter, "up_proj": d + inter, "down_proj": inter + d}
    return mc.num_layers * rank * sum(sizes[name] for name in {t.strip() for t in targets.split(",")})


# ----------------------------------------------------------------------------- activations


def block_saved_bytes_per_token(mc: ModelConfig, device: str, sharded: bool) -> int:
    """What autograd saves for the backward of one decoder block, per token (model.Block with grad on).

    Dtypes as the code runs: on CPU everything is fp32. On one GPU the fp32 weights run under bf16 autocast:
    matmul outputs are bf16 but the residual stream stays fp32 (fp32 + bf16 promotes), and autocast casts
    a norm's fp32 output to bf16 once per projection that reads it (3 for q/k/v, 2 for gate/up). Under
    FSDP the gathered parameters are bf16, so the residual stream is bf16 too and the casts are no-ops."""
    d, inter = mc.hidden_size, mc.intermediate_size
    q_width, kv_width = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
    act, resid = _dtypes(device, sharded)
    norm = 4 * d + resid * d  # RMSNorm keeps its fp32 input and the normalised rows
    if device == "cpu":
        norm_outputs = 4 * d + 4 * d  # one fp32 output per norm, read by every projection
    elif sharded:
        norm_outputs = 2 * d + 2 * d
    else:
        norm_outputs = 3 * 2 * d + 2 * 2 * d  # a bf16 cast per projection
    # RoPE saves only cos / sin (they need no gradient); the attention kernel keeps rotated q and k, v, its
    # output and fp32 log-sum-exp per head; o_proj keeps the output's contiguous copy.
    attention = act * (3 * q_width + 2 * kv_width) + 4 * mc.num_heads
    if mc.qk_norm:
        attention += (4 + act) * (q_width + kv_width)
    mlp = 4 * act * inter  # gate, silu(gate), up, their product
    return 2 * norm + norm_outputs + attention + mlp


def _dtypes(device: str, sharded: bool) -> tuple[int, int]:
    """(bytes of a matmul output, bytes of the residual stream) in the update's forward."""
    return (4, 4) if device == "cpu" else (2, 2) if sharded else (2, 4)


def update_tokens(cfg, prompt_tokens: int) -> tuple[int, int]:
    """(sequences, positions per sequence) of one forward / backward of the update: --micro-batch-size rows
    of the longest prompt + --max-new-tokens (the replay length)."""
    return cfg.micro_batch_size, prompt_tokens + cfg.max_new_tokens


def activation_bytes(cfg, mc: ModelConfig, device: str, sharded: bool, prompt_tokens: int) -> int:
    """The update's activations of one micro-batch held all through its backward: with gradient
    checkpointing every block's input, without it every block's saved tensors; and the final norm's and
    the response positions' hidden states (with the candidates' embedding rows when E is trained)."""
    rows, seq = update_tokens(cfg, prompt_tokens)
    _, resid = _dtypes(device, sharded)
    head = (4 + resid) * mc.hidden_size * seq + resid * mc.hidden_size * cfg.max_new_tokens
    if not cfg.freeze_embeddings and not cfg.lora_rank:
        head += 4 * mc.hidden_size * (1 + cfg.num_neighbors) * seq
    per_block = resid * mc.hidden_size if cfg.grad_checkpointing else block_saved_bytes_per_token(mc, device, sharded)
    return rows * (mc.num_layers * per_block * seq + head)


def backward_peak_bytes(cfg, mc: ModelConfig, device: str, sharded: bool, prompt_tokens: int) -> int:
    """On top of the held activations, the larger of two moments of the backward: a log-prob chunk's
    (logit_chunk_bytes) or one block's (its saved tensors recomputed, under checkpointing, and the
    gradients of its MLP: BACKWARD_MLP_BUFFERS)."""
    rows, seq = update_tokens(cfg, prompt_tokens)
    act, _ = _dtypes(device, sharded)
    block = BACKWARD_MLP_BUFFERS * act * mc.intermediate_size
    if cfg.grad_checkpointing:
        block += block_saved_bytes_per_token(mc, device, sharded)
    return max(rows * seq * block, logit_chunk_bytes(cfg, mc, device, prompt_tokens))


def logit_chunk_bytes(cfg, mc: ModelConfig, device: str, prompt_tokens: int) -> int:
    """A log-prob chunk at its peak (ngrpo._chunk_logprobs; chunk = --logprob-chunk-tokens or the micro-batch's
    response tokens): its forward holds three fp32 [chunk, V] tensors at once (log-probs, their exp and the
    entropy's product); its backward one of them beside the output matrix's gradient, which autograd sums
    over the chunks out of place (running sum, the chunk's own, the result: measured on the CPU). With
    --lora-rank the output matrix is frozen: no gradient of it."""
    rows, _ = update_tokens(cfg, prompt_tokens)
    chunk = min(cfg.logprob_chunk_tokens, rows * cfg.max_new_tokens)
    buffer = 4 * chunk * mc.vocab_size
    act, _ = _dtypes(device, False)
    copies = 0 if cfg.lora_rank else 3 if rows * cfg.max_new_tokens > chunk else 1
    return max(LOGIT_CHUNK_BUFFERS * buffer, copies * act * mc.vocab_size * mc.hidden_size + buffer)


# ----------------------------------------------------------------------------- the rollout


def rollout_rows(cfg, gpus: int) -> int:
    """Rows decoded together by one generate call: --rollout-batch-size, or all of a step's rows (under
    torchrun, one call of a rank's share)."""
    return cfg.rollout_batch_size or -(-cfg.prompts_per_step * cfg.group_size // gpus)


def kv_bytes_per_token(mc: ModelConfig, element: int) -> int:
    return kv_cache_bytes(mc, 1, 1, torch.float32 if element == 4 else torch.bfloat16)


def rollout_buffer_bytes(cfg, mc: ModelConfig, rows: int, prompt_tokens: int, element: int) -> int:
    """Beside the KV cache during a rollout: the decode step's fp32 [rows, V] logits and sampling buffers,
    a prefill chunk's own cache and activations, and the record of every row's steps (engine.decoder.Record)."""
    decode = DECODE_VOCAB_BUFFERS * 4 * rows * mc.vocab_size
    prefill_tokens = min(PREFILL_TOKENS, max(PREFILL_TOKENS // prompt_tokens, 1) * prompt_tokens,
                         rows * prompt_tokens)
    prefill = prefill_tokens * (kv_bytes_per_token(mc, element) + element * (3 * mc.intermediate_size
                                                                              + 4 * mc.hidden_size))
    candidates = 1 + (cfg.soft_top_k if cfg.explore in ("soft", "gaussian", "topk", "topk-gumbel",
                                                        "gaussian_embed_noise") else cfg.num_neighbors)
    recorded = rows * cfg.max_new_tokens * (12 * candidates + 25)  # ids, weights, token, logp, flags, noise
    return decode + prefill + recorded


# ----------------------------------------------------------------------------- the plan


def plan_memory(cfg, mc: ModelConfig, *, gpus: int = 1, gpu_gb: float = 80.0, device: str = "cuda",
                prompt_tokens: int | None = None) -> Plan:
    """The memory of one GPU (or of the CPU, device "cpu") of a run of `cfg` on `gpus` processes; prompt
    tokens default to --max-prompt-tokens (the longest prompt the data may keep)."""
    prompt_tokens = prompt_tokens or cfg.max_prompt_tokens
    params = count_params(mc)
    sharded = gpus > 1
    # --lora-rank: the base frozen (bf16 on a GPU; under torchrun sharded with its adapters) and no reference copy
    # (the base is the reference); gradients and AdamW only for the adapters; the sampler a merged copy, on the CPU
    # too.
    adapters = adapter_count(mc, cfg.lora_rank, cfg.lora_targets) if cfg.lora_rank else 0
    trainable = adapters or params.trainable(cfg.freeze_embeddings)
    low = 4 if device == "cpu" else 2  # bytes per weight of the sampler copy and of the reference model
    rows = rollout_rows(cfg, gpus)
    tokens = -(-(prompt_tokens + cfg.max_new_tokens) // CACHE_ROUND) * CACHE_ROUND  # as the sampler allocates
    share = f" (1/{gpus} shard)" if sharded else ""
    kept = lambda name, n: Row(name, n, n)  # held through both phases
    plan_rows = [kept(f"fp32 weights{share}", 4 * params.total // gpus)] if not adapters else [
        kept(f"frozen base weights, {'bf16' if low == 2 else 'fp32'}{share} (also the KL reference)",
             low * params.total // gpus),
        kept(f"LoRA adapters, rank {cfg.lora_rank}: {adapters / 1e6:.1f} M fp32 parameters{share}",
             4 * adapters // gpus)]
    plan_rows += [
        Row(f"fp32 gradients{share}", 0, 4 * trainable // gpus),  # freed when the update ends
        kept(f"AdamW moments, fp32 x 2{share}", 8 * trainable // gpus),
    ]
    if device == "cuda" or sharded or adapters:
        plan_rows.append(kept(f"sampler copy{', merged' if adapters else ''}, {'bf16' if low == 2 else 'fp32'} "
                              "(unsharded, each process)", low * params.total))
    if cfg.kl_coef > 0 and not adapters:
        plan_rows.append(kept(f"reference model, {'bf16' if low == 2 else 'fp32'}{share}",
                              low * params.total // gpus))
    plan_rows += [
        Row(f"KV cache: {rows} rows x {tokens:,} tokens", rows * tokens * kv_bytes_per_token(mc, low), 0),
        Row("decode logits, prefill chunk, rollout record", rollout_buffer_bytes(cfg, mc, rows, prompt_tokens,
                                                                                  low), 0),
    ]
    if device == "cuda" and sharded:
        gathered = 2 * (params.root + 2 * params.block)  # bf16: the root for the whole call, ~2 blocks
        reduce = 0 if adapters else 4 * (params.root - params.embed * cfg.freeze_embeddings + 2 * params.block)
        plan_rows.append(Row("bf16 weights gathered + fp32 gradients before reduce-scatter", 0, gathered + reduce))
    elif device == "cuda" and not adapters:  # autocast's bf16 copy of every weight a matmul reads, for the forward
        plan_rows.append(Row("bf16 weight copies under autocast", 0, 2 * (params.total - params.embed
                                                                           * (not mc.tie_word_embeddings))))
    micro, seq = update_tokens(cfg, prompt_tokens)
    checkpointing = "checkpointed" if cfg.grad_checkpointing else "no checkpointing"
    plan_rows += [
        Row(f"activations held: {micro} x {seq:,} tokens, {checkpointing}", 0,
            activation_bytes(cfg, mc, device, sharded, prompt_tokens)),
        Row(f"backward peak: a block, or a {min(cfg.logprob_chunk_tokens, micro * cfg.max_new_tokens):,}-token "
            "log-prob chunk", 0, backward_peak_bytes(cfg, mc, device, sharded, prompt_tokens)),
    ]
    # AdamW's step: torch's foreach implementation (on GPU) makes one fp32 temporary per parameter shard (the
    # sqrt of the second moments); the per-tensor loop (on CPU) two of the largest tensor.
    largest = max(mc.vocab_size * mc.hidden_size, params.block) if not adapters else \
        cfg.lora_rank * max(mc.hidden_size, mc.intermediate_size, mc.num_heads * mc.head_dim)  # one adapter matrix
    step_temp = 4 * trainable // gpus if device == "cuda" else 2 * 4 * largest
    plan_rows.append(Row("AdamW step temporaries (instead of the two rows above)", 0, step_temp, optimizer_step=True))
    where = f"{gpus} x {gpu_gb:g} GiB GPU" if device == "cuda" else f"CPU with {gpu_gb:g} GiB"
    description = (f"{cfg.model}: {params.total / 1e9:.2f} B parameters, {mc.num_layers} layers, vocabulary "
                   f"{mc.vocab_size:,}; on {where}")
    # Writing a checkpoint: rank 0 copies the gathered fp32 weights to its CPU; AdamW's state is copied too from a
    # GPU (on the CPU it is written from where it is).
    checkpoint = 4 * (trainable if adapters else params.total) + (8 * trainable if device == "cuda" else 0)
    # Loading: the fp32 policy whole (every rank, before sharding); on the CPU the safetensors file is mapped while
    # it is read, so its bytes (a bf16 checkpoint's: 2 per weight) count in RSS beside the fp32 copy until closed.
    load = 4 * params.total + (2 * params.total if device == "cpu" else 0)
    return Plan(plan_rows, device, gpus, int(gpu_gb * GIB), load, description, checkpoint=checkpoint)


def format_plan(plan: Plan) -> str:
    """The plan as the table --plan prints (GiB = 2^30 bytes)."""
    gib = lambda n: f"{n / GIB:8.1f}" if n else "       -"
    width = max(len(row.name) for row in plan.rows) + 2
    lines = [f"memory plan, {plan.description}", "",
             f"{'GiB per ' + ('GPU' if plan.device == 'cuda' else 'process'):<{width}}rollout   update"]
    lines += [f"{row.name:<{width}}{gib(row.rollout)} {gib(row.update)}" for row in plan.rows]
    margin = "CUDA context 1 GiB + " if plan.device == "cuda" else ""
    lines.append(f"{'margin: ' + margin + f'{FRAGMENTATION:.0%} fragmentation':<{width}}"
                 f"{gib(plan.margin_bytes('rollout'))} {gib(plan.margin_bytes('update'))}")
    lines.append(f"{'total':<{width}}{gib(plan.total_bytes('rollout'))} {gib(plan.total_bytes('update'))}")
    lines.append(f"loading: the whole fp32 policy at once ({plan.load_bytes / GIB:.1f} GiB"
                 + (", before it is sharded" if plan.gpus > 1 else "")
                 + (", with the bf16 checkpoint file mapped" if plan.device == "cpu" else "") + ")")
    lines.append(f"checkpoints: rank 0 gathers {plan.checkpoint / GIB:.1f} GiB of host memory to write one")
    verdict = "fits" if plan.fits else "does NOT fit"
    lines.append(f"peak {plan.peak_bytes / GIB:.1f} GiB of {plan.budget_bytes / GIB:g} GiB: {verdict}")
    return "\n".join(lines)


def _halvings(value: int) -> list[int]:
    """value, value / 2, ..., 1."""
    return [value >> i for i in range(max(value, 1).bit_length()) if value >> i >= 1]


def suggest(cfg, mc: ModelConfig, *, gpus: int, gpu_gb: float, device: str = "cuda",
            prompt_tokens: int | None = None) -> tuple[dict, int] | None:
    """The smallest change that makes the run fit: ({flag field: value}, gpus) or None when nothing up to
    64 GPUs does. Fewer GPUs first; then the fewest halvings of --rollout-batch-size and --micro-batch-size;
    gradient checkpointing switched on when needed."""
    best = None
    counts = [gpus * 2**i for i in range(7) if gpus * 2**i <= 64] if device == "cuda" else [gpus]
    for n in counts:
        rows0 = rollout_rows(cfg, n)
        for checkpointing in dict.fromkeys((cfg.grad_checkpointing, True)):
            for i, rows in enumerate(_halvings(rows0)):
                for j, micro in enumerate(_halvings(cfg.micro_batch_size)):
                    changed = dict(rollout_batch_size=rows if rows != rows0 else cfg.rollout_batch_size,
                                   micro_batch_size=micro, grad_checkpointing=checkpointing)
                    trial = replace(cfg, **changed)
                    if plan_memory(trial, mc, gpus=n, gpu_gb=gpu_gb, device=device,
                                   prompt_tokens=prompt_tokens).fits:
                        cost = (n, checkpointing != cfg.grad_checkpointing, i + j, j)
                        if best is None or cost < best[0]:
                            best = (cost, {k: v for k, v in changed.items() if v != getattr(cfg, k)}, n)
        if best is not None:
            return best[1], best[2]
    return None


def larger_rollout_batch(cfg, mc: ModelConfig, *, gpus: int, gpu_gb: float, device: str = "cuda",
                         prompt_tokens: int | None = None) -> int | None:
    """The largest --rollout-batch-size above the one set that still fits: its doublings, and a process's whole
    share of a step's rows, tried up to that share. None on the CPU, when all rows already decode together, or
    when no larger one fits. A GPU decodes more tokens per second with more rows (on an H200 at the 1.5B shape:
    27,153 tokens/s at 256 rows, 9,234 at 64; BENCHMARKS.md), so a run that sets a cautious size is told."""
    share = rollout_rows(replace(cfg, rollout_batch_size=0), gpus)
    if device != "cuda" or not cfg.rollout_batch_size or cfg.rollout_batch_size >= share:
        return None
    tries = [cfg.rollout_batch_size << i for i in range(1, share.bit_length()) if cfg.rollout_batch_size << i < share]
    fitting = [rows for rows in [*tries, share]
               if plan_memory(replace(cfg, rollout_batch_size=rows), mc, gpus=gpus, gpu_gb=gpu_gb, device=device,
                              prompt_tokens=prompt_tokens).fits]
    return max(fitting, default=None)


def flags_of(changes: dict) -> str:
    parts = []
    for name, value in changes.items():
        flag = "--" + name.replace("_", "-")
        parts.append(flag if value is True else f"--no-{flag[2:]}" if value is False else f"{flag} {value}")
    return " ".join(parts)


def refusal(cfg, mc: ModelConfig, plan: Plan, *, prompt_tokens: int | None = None) -> str:
    """One line: how much the run needs against what it has, and what would make it fit."""
    where = "per GPU" if plan.device == "cuda" else "on the CPU"
    largest = {}  # the largest row of each phase, once when both phases name the same one
    for phase in ("rollout", "update"):
        row = max(plan.rows, key=lambda r: getattr(r, phase))
        largest.setdefault(row.name, f"{row.name}, {getattr(row, phase) / GIB:.1f} GiB")
    parts = "; ".join(largest.values())
    line = (f"the run needs {plan.peak_bytes / GIB:.1f} GiB {where} but has {plan.budget_bytes / GIB:.1f} GiB "
            f"({plan.gpus} process{'es' if plan.gpus > 1 else ''}; largest: {parts}; --plan shows all)")
    found = suggest(cfg, mc, gpus=plan.gpus, gpu_gb=plan.budget_bytes / GIB, device=plan.device,
                    prompt_tokens=prompt_tokens)
    adapters = ""  # offered where a run on a GPU would fit its GPUs with them
    if plan.device == "cuda" and not cfg.lora_rank and plan_memory(
            replace(cfg, lora_rank=64, lora_alpha=128.0), mc, gpus=plan.gpus, gpu_gb=plan.budget_bytes / GIB,
            prompt_tokens=prompt_tokens).fits:
        adapters = (f"; or on {'this GPU' if plan.gpus == 1 else 'these GPUs'} with low-rank adapters, --lora-rank 64 "
                    "--lora-alpha 128 (docs/lora.md; the paper's results are full fine-tuning)")
    if found is None:
        more = "nothing up to 64 GPUs makes it fit" if plan.device == "cuda" else "no batch size makes it fit"
        return line + f"; {more}: lower --max-new-tokens or --max-prompt-tokens" + adapters
    changes, gpus = found
    under = f" under torchrun --nproc-per-node {gpus}" if gpus != plan.gpus else ""
    return line + f": it would fit{under}" + (f" with {flags_of(changes)}" if changes else "") + adapters


def default_gpus() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def default_gpu_gb(device: str) -> float:
    """The visible GPU's memory in GiB, or 80 when none is visible; on the CPU, the machine's RAM."""
    if device == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    if torch.cuda.is_available():
        return torch.cuda.mem_get_info()[1] / GIB
    return 80.0


def print_plan(cfg, *, gpus: int | None = None, gpu_gb: float | None = None) -> int:
    """`train.py --plan`: prints the plan (and, when it does not fit, what would); returns the exit status."""
    device = "cpu" if cfg.device == "cpu" else "cuda"
    gpus = gpus or default_gpus()
    gpu_gb = gpu_gb or default_gpu_gb(device)
    try:
        mc = model_config(cfg.model)
    except (OSError, ValueError) as error:  # a missing file, a bad config.json, the hub (HubUnreachable)
        print(f"error: {describe_load_error(error, f'--model {cfg.model}')}", file=sys.stderr)
        return 2
    plan = plan_memory(cfg, mc, gpus=gpus, gpu_gb=gpu_gb, device=device)
    print(format_plan(plan))
    if plan.fits:
        larger = larger_rollout_batch(cfg, mc, gpus=gpus, gpu_gb=gpu_gb, device=device)
        if larger:
            print(f"--rollout-batch-size {larger} fits too (more rows per call decode more tokens per second)")
        return 0
    print(refusal(cfg, mc, plan))
    return 1


def auto_batch_size(model, max_len: int, num_items: int) -> int:
    """Rows decoded at once when none is asked for (eval.py's --batch-size, a validation): as many sequences
    as fit in half the free GPU memory as KV cache (16 on a CPU)."""
    if model.embed_tokens.weight.device.type != "cuda":
        return min(16, num_items)
    cfg = model.cfg
    element_bytes = model.embed_tokens.weight.element_size()
    bytes_per_seq = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * max_len * element_bytes
    free, _ = torch.cuda.mem_get_info()
    return max(1, min(num_items, int(0.5 * free / bytes_per_seq)))
