"""Low-rank adapters (LoRA; Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", arXiv 2106.09685)
for RL on one GPU: the base weights stay frozen and each chosen projection learns W x + (alpha / r) B A dropout(x),
with A [r, in] drawn kaiming-uniform and B [out, r] zero at the start (as PEFT does), so a fresh adapter changes
nothing. Only A and B are trained and held by AdamW.

How train.py uses it (`--lora-rank r > 0`; under torchrun the adapted model is sharded with FSDP2 like a fully
trained one, each rank holding a shard of the frozen base and of the adapters):
- the sampler is a plain Transformer whose weights are the merged ones, W + (alpha / r) B A, written parameter by
  parameter at every refresh (`merge_into`), so the decode path and its CUDA graph are those of full fine-tuning;
- the KL reference is the policy itself with its adapters off (`WithoutAdapters`): no second copy of the base;
- checkpoints hold the adapters in PEFT's format (`save_adapters`: adapter_model.safetensors + adapter_config.json,
  what `peft.PeftModel.from_pretrained` loads on the Hugging Face base model) beside the optimizer and trainer
  state, and `python -m runtime.lora CHECKPOINT OUT_DIR` writes the merged model as a plain Hugging Face
  checkpoint (`export_merged`).

Our module names are the Hugging Face ones (model.py), so PEFT's `target_modules` are the same names and a
parameter `layers.0.self_attn.q_proj.lora_A.weight` of ours is PEFT's
`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`.

    settings = LoraSettings(rank=8, alpha=16, base_model="deepseek-ai/DeepSeek-R1-Distill-Qwen-7B")
    params = add_adapters(policy, settings, seed=0)   # the base frozen; these are what AdamW holds
    merge_into(policy, sampler)                       # sampler weights := W + scale * B @ A
    with adapters_off(policy): ...                    # the base model's numbers
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from data import load_tokenizer
from model import PROJECTIONS, Transformer, load_model, save_model
from runtime.distributed import ModelCall, World, broadcast_object, full_tensor, unsharded_copy
from runtime.guard import run_owns

TARGETS = PROJECTIONS  # what adapters can wrap: attention, then MLP (model.PROJECTIONS)
PEFT_PREFIX = "base_model.model.model."  # PeftModel -> its LoraModel -> the CausalLM's decoder, named `model`
ADAPTER_WEIGHTS, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"


@dataclass(frozen=True)
class LoraSettings:
    """An adapter's shape and scale, and the base model it adapts (adapter_config.json's base_model_name_or_path)."""

    rank: int
    alpha: float
    dropout: float = 0.0
    targets: tuple[str, ...] = TARGETS
    base_model: str = ""

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def peft_config(self) -> dict:
        """adapter_config.json as PEFT writes it for a plain LoRA adapter of a causal LM."""
        return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": self.base_model,
                "r": self.rank, "lora_alpha": self.alpha, "lora_dropout": self.dropout,
                "target_modules": list(self.targets), "bias": "none", "fan_in_fan_out": False,
                "use_rslora": False, "use_dora": False, "init_lora_weights": True, "inference_mode": True,
                "modules_to_save": None}

    @classmethod
    def read(cls, directory) -> LoraSettings:
        """The settings of the adapter saved in `directory`; a ValueError names what it cannot take."""
        path = Path(directory) / ADAPTER_CONFIG
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"{path}: not a readable adapter config ({error})") from None
        unsupported = {key: config.get(key) for key, plain in (("peft_type", "LORA"), ("bias", "none"),
                                                                ("fan_in_fan_out", False), ("use_rslora", False),
                                                                ("use_dora", False)) if config.get(key, plain) != plain}
        if unsupported:
            raise ValueError(f"{path}: only plain LoRA adapters load here, not {unsupported}")
        named = config.get("target_modules")
        targets = tuple(t for t in TARGETS if t in named) if isinstance(named, list) else ()
        if not targets or len(targets) != len(named):
            raise ValueError(f"{path}: target_modules {named!r}: a list of names among {', '.join(TARGETS)}")
        try:
            return cls(rank=int(config["r"]), alpha=float(config["lora_alpha"]),
                       dropout=float(config.get("lora_dropout", 0.0)), targets=targets,
                       base_model=config.get("base_model_name_or_path") or "")
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path}: r and lora_alpha must be numbers ({error!r})") from None


class LoRALinear(nn.Module):
    """A frozen nn.Linear plus its low-rank update: y = x W^T + b + scale * B A dropout(x). It holds the base
    layer's own `weight` and `bias` (not copies), so the base keeps its parameter names and checkpoint keys."""

    def __init__(self, base: nn.Linear, rank: int, scale: float, dropout: float, generator: torch.Generator):
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.register_parameter("bias", base.bias)
        self.lora_A = nn.Linear(base.in_features, rank, bias=False)  # fp32 whatever the base's dtype
        self.lora_B = nn.Linear(rank, base.out_features, bias=False)
        with torch.no_grad():
            # PEFT's initialisation: A as nn.Linear's default (kaiming-uniform, a = sqrt 5), B zero. Drawn on the CPU
            # from the caller's generator, so the same seed gives the same A on any device.
            nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5), generator=generator)
            nn.init.zeros_(self.lora_B.weight)
        self.lora_A.to(base.weight.device), self.lora_B.to(base.weight.device)
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.scale = scale
        self.enabled = True  # False inside adapters_off: the base layer alone

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        if not self.enabled:
            return out
        return out + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scale

    def delta_weight(self) -> torch.Tensor:
        """scale * B @ A [out, in] in fp32: what merging adds to the base weight (under FSDP2 each factor gathered
        whole first: a collective, every rank calls it)."""
        return (full_tensor(self.lora_B.weight) @ full_tensor(self.lora_A.weight)) * self.scale


def add_adapters(model: Transformer, settings: LoraSettings, *, seed: int = 0,
                 base_dtype: torch.dtype | None = None) -> list[nn.Parameter]:
    """Freezes every weight of `model` (cast to `base_dtype` when given: bf16 on a GPU) and wraps the projections
    named in settings.targets of every block in a LoRALinear, A drawn from `seed`. Returns the adapters'
    parameters, the only trainable ones."""
    if has_adapters(model):
        raise ValueError("the model already has adapters")
    model.requires_grad_(False)
    if base_dtype is not None:
        model.to(base_dtype)
    generator = torch.Generator().manual_seed(seed)
    for layer in model.layers:
        for owner in (layer.self_attn, layer.mlp):
            for name in TARGETS:  # in module order, whatever the order of settings.targets: the same draws
                if name in settings.targets and hasattr(owner, name):
                    setattr(owner, name, LoRALinear(getattr(owner, name), settings.rank, settings.scale,
                                                    settings.dropout, generator))
    model.lora = settings
    return adapter_parameters(model)


def has_adapters(model: nn.Module) -> bool:
    return getattr(model, "lora", None) is not None


def adapted_layers(model: Transformer) -> dict[str, LoRALinear]:
    """{module name (as `layers.0.self_attn.q_proj`): its LoRALinear}."""
    return {name: module for name, module in model.named_modules() if isinstance(module, LoRALinear)}


def adapter_parameters(model: Transformer) -> list[nn.Parameter]:
    return [p for layer in adapted_layers(model).values() for p in (layer.lora_A.weight, layer.lora_B.weight)]


def adapter_state(model: Transformer) -> dict[str, torch.Tensor]:
    """{our parameter name: tensor} of the adapters alone (`layers.0.self_attn.q_proj.lora_A.weight`, ...)."""
    return {f"{name}.{part}.weight": getattr(layer, part).weight
            for name, layer in adapted_layers(model).items() for part in ("lora_A", "lora_B")}


@contextlib.contextmanager
def adapters_off(model: Transformer):
    """Inside, `model` computes what its base computes (every adapter skipped); as they were after."""
    layers = adapted_layers(model).values()
    for layer in layers:
        layer.enabled = False
    try:
        yield model
    finally:
        for layer in layers:
            layer.enabled = True


class WithoutAdapters(ModelCall):
    """The base model as the KL reference, with no copy of its weights: the policy's ModelCall (sharded or not)
    called with its adapters off. Update code runs it as it runs any ModelCall (`distributed.run_model`)."""

    def forward(self, fn, *args, **kwargs):
        with adapters_off(self.model.model):
            return self.model(fn, *args, **kwargs)


@torch.no_grad()
def merge_into(model: Transformer, target: Transformer) -> None:
    """target's parameters := model's base weights, plus scale * B @ A where a projection has an adapter: one
    parameter at a time (the sum in fp32, then cast to target's dtype), never a second copy of the whole base.
    How the sampler is refreshed; target is a plain Transformer of model's architecture. Under FSDP2 each
    parameter is gathered whole first: every rank calls it."""
    layers, sources = adapted_layers(model), dict(model.named_parameters())
    for name, param in target.named_parameters():
        weight = full_tensor(sources[name])
        layer = layers.get(name.removesuffix(".weight")) if name.endswith(".weight") else None
        if layer is not None:
            weight = weight.float() + layer.delta_weight()
        param.copy_(weight)


def merged_copy(model: Transformer, *, dtype: torch.dtype, device) -> Transformer:
    """A plain Transformer (no adapters, no gradients) holding model's merged weights in `dtype` on `device`."""
    with torch.device("meta"):
        copy = Transformer(model.cfg, model.hf_config).to(dtype)
    copy = copy.to_empty(device=device).requires_grad_(False)
    merge_into(model, copy)
    return copy


def save_adapters(model: Transformer, out_dir, tokenizer=None, *, world: World = World()) -> None:
    """The adapters in PEFT's format: adapter_model.safetensors (fp32, PEFT's key names) and adapter_config.json,
    plus the tokenizer's files when one is given. Under torchrun every rank calls it (each adapter is gathered
    whole) and rank 0 writes."""
    gathered = {name: full_tensor(p.detach()) for name, p in adapter_state(model).items()}  # a collective each
    if not world.is_main:
        return
    tensors = {PEFT_PREFIX + name: p.to("cpu", torch.float32).contiguous() for name, p in gathered.items()}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (out_dir / ADAPTER_CONFIG).write_text(json.dumps(model.lora.peft_config(), indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out_dir))


@torch.no_grad()
def load_adapters(model: Transformer, directory, *, world: World = World()) -> None:
    """The adapter saved in `directory` (PEFT's format, by us or by PEFT) into `model`'s adapters, which must have
    its rank, scale and targets; a ValueError says what differs or is missing. Under torchrun rank 0 reads the
    files and every rank gets the tensors from it, as with every checkpoint (every rank calls it)."""
    tensors = broadcast_object(_read_adapters(model, directory) if world.is_main else None, world)
    for name, param in adapter_state(model).items():
        param.copy_(tensors[name])


def _read_adapters(model: Transformer, directory) -> dict[str, torch.Tensor]:
    """{our parameter name: tensor} of the adapter saved in `directory`, checked against `model`'s adapters."""
    saved = LoraSettings.read(directory)
    mine = model.lora
    differ = [f"{what} {a!r} (saved) vs {b!r} (this model)" for what, a, b in
              (("rank", saved.rank, mine.rank), ("alpha", saved.alpha, mine.alpha),
               ("target_modules", saved.targets, mine.targets)) if a != b]
    if differ:
        raise ValueError(f"{Path(directory) / ADAPTER_CONFIG}: {'; '.join(differ)}")
    tensors = {key.removeprefix(PEFT_PREFIX): value for key, value in
               load_file(str(Path(directory) / ADAPTER_WEIGHTS)).items()}
    params = adapter_state(model)
    if tensors.keys() != params.keys():
        missing, extra = sorted(params.keys() - tensors.keys()), sorted(tensors.keys() - params.keys())
        raise ValueError(f"{Path(directory) / ADAPTER_WEIGHTS}: lacks {missing[:3]}, has unexpected {extra[:3]}")
    return tensors


def export_merged(model: Transformer, out_dir, tokenizer=None, *, dtype: torch.dtype | None = None) -> None:
    """The adapted model as a plain Hugging Face checkpoint (model.save_model): merged weights, in `dtype`
    (default: the base's), loadable by transformers and eval.py with no adapter code."""
    dtype = dtype or model.embed_tokens.weight.dtype
    save_model(merged_copy(model, dtype=dtype, device="cpu"), out_dir, tokenizer)


def is_adapter(path) -> bool:
    """Whether `path` is a directory holding an adapter (adapter_config.json): a --lora-rank checkpoint."""
    return (Path(path).expanduser() / ADAPTER_CONFIG).is_file()


def load_merged(checkpoint, *, dtype: torch.dtype = torch.float32, device="cpu", base: str = "",
                seed: int | None = None) -> Transformer:
    """The adapter in `checkpoint` merged into its base (`base`, default adapter_config.json's
    base_model_name_or_path): a plain Transformer, as eval.py and the export use it. seed: a random base's (tiny);
    default the --seed of the run that wrote the checkpoint (its config.json.run), else 0."""
    settings = LoraSettings.read(checkpoint)
    run_config = Path(checkpoint) / "config.json.run"
    if seed is None:
        seed = json.loads(run_config.read_text()).get("seed", 0) if run_config.is_file() else 0
    try:
        model = load_model(base or settings.base_model, dtype=torch.float32, device="cpu", seed=seed)
    except (OSError, ValueError) as error:  # the base moved since the adapter was written: say whose base it is
        raise type(error)(f"the base model of the adapter in {checkpoint} ({ADAPTER_CONFIG}'s "
                          f"base_model_name_or_path): {error}") from None
    add_adapters(model, settings)
    load_adapters(model, checkpoint)
    return merged_copy(model, dtype=dtype, device=device)


def adapt_policy(policy: Transformer, cfg, world: World = World(), *, warm_start: Path | None = None,
                 saved: Path | None = None) -> Transformer:
    """train.py's --lora-rank (cfg: its Config): `policy` frozen as the base, bf16 on a GPU, with adapters of cfg's
    settings drawn from cfg.seed; with `saved` (a resume), the adapters that checkpoint holds, on the base the run
    began from: the warm start's weights (`warm_start`, the run's warm_start/ when it had one) are loaded again.
    Returns the adapted model: `policy` itself, or under torchrun a plain copy of the FSDP2-sharded `policy`
    (gathered one parameter at a time) for the caller to shard again, since FSDP2 shards the parameters a module
    holds when it is wrapped and the adapters' are new."""
    on_gpu = policy.embed_tokens.weight.device.type == "cuda"  # frozen weights need no fp32 master copy there
    if world.distributed:
        policy = unsharded_copy(policy, dtype=torch.bfloat16 if on_gpu else torch.float32, device=world.device)
    if saved is not None and warm_start is not None:
        policy.load_state_dict(load_model(str(warm_start), dtype=torch.float32, device="cpu").state_dict())
    targets = tuple(name for name in TARGETS if name in {t.strip() for t in cfg.lora_targets.split(",")})
    settings = LoraSettings(rank=cfg.lora_rank, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout, targets=targets,
                            base_model=str(Path(warm_start).resolve()) if warm_start else cfg.model)
    add_adapters(policy, settings, seed=cfg.seed, base_dtype=torch.bfloat16 if on_gpu else None)
    if saved is not None:
        load_adapters(policy, saved, world=world)
    return policy


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m runtime.lora", description="Write a LoRA checkpoint (train.py --lora-rank, or any PEFT LoRA "
        "adapter of a Qwen2 / Qwen3 / Llama model) merged into its base model, as a plain Hugging Face checkpoint.")
    parser.add_argument("checkpoint", help="a directory with adapter_config.json and adapter_model.safetensors")
    parser.add_argument("out_dir", help="where the merged checkpoint goes")
    parser.add_argument("--base", default="", help="the base model (default: adapter_config.json's "
                        "base_model_name_or_path)")
    parser.add_argument("--seed", type=int, default=None, help="with a random base (tiny): the run's --seed "
                        "(default: the one in the checkpoint's config.json.run, else 0)")
    args = parser.parse_args(argv)
    out = Path(args.out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        parser.error(f"{out} exists and is not an empty folder (a run, a checkpoint, or another model is written "
                     "only by what made it): pass a new folder for the merged model")
    if (run := run_owns(out)) is not None:
        parser.error(f"{out} is the run {run}'s own (its folder, checkpoints or best weights): pass a new folder for "
                     "the merged model")
    try:
        merged = load_merged(args.checkpoint, base=args.base, seed=args.seed)
    except (OSError, ValueError) as error:
        parser.error(f"{error}{'' if args.base else '; --base names the base model where it is now'}")
    # train.py's checkpoints carry the run's tokenizer: the merged model gets it too
    tokenizer = load_tokenizer(args.checkpoint) if (Path(args.checkpoint) / "tokenizer_config.json").exists() else None
    save_model(merged, args.out_dir, tokenizer)
    print(f"merged model written to {args.out_dir}")


if __name__ == "__main__":
    main()
