"""Several processes and nodes with torchrun: the process group, FSDP2 sharding of the policy, and the few
things that cross ranks.

    torchrun --nproc-per-node 8 train.py --preset paper-1.5b

Each rank owns its share of a step's work (its chunks of rows -> their rollouts -> rewards); a group's G
responses never cross ranks. What crosses ranks: gradients (FSDP), the step's finished rollouts and rewards
(gathered, so that every rank holds the whole step and knows the loss normalizer, the filtered groups and
the logged metrics), the update's metrics, and checkpoints. Randomness is keyed by the work (seed, step,
call index), never by the rank, so a run's numbers do not depend on how many processes run it.

`python train.py` (not launched by torchrun) is a world of one with no process group: every function here
is then the identity or a no-op, and the model is not sharded.

    world = init_world(device="", timeout_s=600)
    policy = shard_model(model, world)                      # a ModelCall: policy(fn, ...) = fn(model, ...)
    logp, entropy = policy(sequence_logprobs, prompts, ...)  # the sharded weights gathered for this call only
"""

from __future__ import annotations

import contextlib
import gc
import os
import warnings
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

from model import Transformer


@dataclass(frozen=True)
class World:
    """Who this process is. `distributed` is True when a process group exists (launched by torchrun, even
    with one process), and only then is the model sharded."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    distributed: bool = False
    opened: bool = False  # init_world started the process group (close_world ends it); False: the caller's

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_world(device: str = "", timeout_s: float = 600.0) -> World:
    """The process group from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), or a
    world of one without a process group when those are absent.

    device: "" = this rank's GPU (cuda:LOCAL_RANK) when there is one, else the CPU; "cpu" forces the CPU (and
    the gloo backend). timeout_s bounds every collective: a rank that never arrives (hung, or dead without
    its launcher noticing) makes the others fail with a timeout error instead of waiting for ever."""
    if "RANK" not in os.environ:
        return World(device=torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")))
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if device.startswith("cuda:"):
        raise ValueError("under torchrun each rank uses cuda:LOCAL_RANK: give --device cuda or nothing")
    on_gpu = device != "cpu" and torch.cuda.is_available()
    if device == "cuda" and not on_gpu:
        raise ValueError("--device cuda, but no GPU is visible to this rank")
    where = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(where)
    opened = not dist.is_initialized()
    if opened:
        dist.init_process_group("nccl" if on_gpu else "gloo", timeout=timedelta(seconds=timeout_s))
    return World(rank, size, local_rank, where, True, opened)


def close_world(world: World) -> None:
    """Ends the process group init_world started; one the caller started stays for its next run (a program that
    runs train.run or eval.main several times in one job opens it once: gloo cannot start a second one)."""
    if world.opened and dist.is_initialized():
        # A finished run's sharded model can sit in reference cycles that still hold the group: freed now, while
        # the group and the interpreter are alive, not at exit, where a rank was seen to abort on 2 processes
        # ("terminate called without an active exception").
        gc.collect()
        dist.destroy_process_group()


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()


# ----------------------------------------------------------------------------- sharding


class ModelCall(nn.Module):
    """Runs `fn(model, *args)` as this module's forward.

    FSDP2 gathers a sharded module's parameters around its own `forward` only, but our callers also read
    `embed_tokens.weight` (replay mixtures), call `forward_hidden` and project with `output_weight` in
    chunks. Wrapping the whole call in one root forward gathers the root's parameters (embedding, final
    norm, output matrix) for exactly that call and reduces their gradients after its backward; each
    decoder block gathers its own around its forward, as usual. Unsharded, it is a plain function call."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, fn, *args, **kwargs):
        return fn(self.model, *args, **kwargs)


def shard_model(model: Transformer, world: World) -> ModelCall:
    """FSDP2: `fully_shard` per decoder block and at the root (which owns the embedding, final norm and output
    matrix); the parameters become DTensors sharded on dim 0 over the ranks, and AdamW over
    `policy.parameters()` keeps its state sharded with them. On GPU the forward and backward run on bf16
    copies of the parameters and gradients are reduced in fp32 (the fp32 shards stay the master weights,
    docs/distributed.md); on CPU all is fp32. A world of one without a process group is left unsharded."""
    call = ModelCall(model)
    if not world.distributed:
        return call
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # FSDP2 warns when a root returns a view (an in-place op on it would skip the backward hook); the
    # log-probs our calls return are views, and nothing modifies them in place.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")

    if world.device.type == "cuda":
        precision = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        precision = MixedPrecisionPolicy()
    for block in model.layers:
        fully_shard(block, mp_policy=precision)
    # The root's inputs include the recorded mixture weights: never cast them to bf16 on the way in.
    root_precision = MixedPrecisionPolicy(precision.param_dtype, precision.reduce_dtype,
                                          cast_forward_inputs=False)
    fully_shard(call, mp_policy=root_precision)
    return call


def run_model(model, fn, *args, **kwargs):
    """fn(model, *args, **kwargs); through `model` itself when it is a ModelCall (FSDP's root gathers its
    parameters for the call), else directly on the Transformer."""
    return model(fn, *args, **kwargs) if isinstance(model, ModelCall) else fn(model, *args, **kwargs)


def device_of(model) -> torch.device:
    """The device of a Transformer's (or a ModelCall's) parameters, or of this rank's shards."""
    while isinstance(model, ModelCall):  # a ModelCall may wrap another (lora.WithoutAdapters)
        model = model.model
    return model.embed_tokens.weight.device


def autocast(device: torch.device):
    """bf16 autocast on GPU (weights and optimizer stay fp32); nothing on CPU, where all is fp32."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole of a (possibly sharded) tensor: a collective for a DTensor, on every rank; else itself."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def copy_weights(source: Transformer, target: Transformer) -> None:
    """target's parameters := source's, by name, one parameter gathered at a time (never the whole fp32 model
    at once): how an unsharded (bf16) sampler copy is refreshed from the sharded policy. Every rank calls
    it."""
    targets = dict(target.named_parameters())
    with torch.no_grad():
        for name, param in source.named_parameters():
            targets[name].copy_(full_tensor(param.detach()))


def unsharded_copy(model: Transformer, *, dtype: torch.dtype, device) -> Transformer:
    """A plain Transformer with `model`'s weights (gathered one parameter at a time) in `dtype` on `device`,
    without gradients: the sampler copy. Every rank calls it."""
    with torch.device("meta"):
        copy = Transformer(model.cfg, model.hf_config).to(dtype)  # no memory yet: allocated once, on `device`
    copy = copy.to_empty(device=device).requires_grad_(False)
    copy_weights(model, copy)
    return copy


def gather_state_dict(model: Transformer, world: World) -> dict[str, torch.Tensor] | None:
    """{parameter name: whole tensor on the CPU} on rank 0 (None elsewhere), gathered one parameter at a time:
    what rank 0 writes in the Hugging Face layout. Every rank calls it."""
    state = {}
    for name, param in model.named_parameters():
        whole = full_tensor(param.detach())
        if world.is_main:
            state[name] = whole.to("cpu", copy=True)
    return state if world.is_main else None


def model_from_state(model: Transformer, state: dict[str, torch.Tensor]) -> Transformer:
    """A Transformer of `model`'s architecture holding `state` (tensors used as they are, not copied):
    what `model.save_model` is given on rank 0."""
    with torch.device("meta"):
        holder = Transformer(model.cfg, model.hf_config)
    holder.load_state_dict(state, assign=True)
    return holder


def load_state_dict(model: Transformer, state: dict[str, torch.Tensor] | None, world: World) -> None:
    """model's parameters := `state` by parameter name; `state` is needed on rank 0 only (other ranks may pass
    None): each whole tensor is broadcast from rank 0 and every rank keeps its own shard. Works whatever
    world size wrote `state`. Every rank calls it."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    names = [name for name, _ in model.named_parameters()]
    if world.is_main:
        missing = sorted(set(names) - set(state))
        if missing:
            raise ValueError(f"the checkpoint lacks {len(missing)} weights, e.g. {missing[:3]}")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not world.distributed:
                param.copy_(state[name])
                continue
            local = param.to_local() if isinstance(param, DTensor) else param
            whole = state[name].to(world.device, local.dtype) if world.is_main else \
                torch.empty(param.shape, dtype=local.dtype, device=world.device)
            dist.broadcast(whole, src=0)
            if isinstance(param, DTensor):
                local.copy_(distribute_tensor(whole, param.device_mesh, param.placements).to_local())
            else:
                param.copy_(whole)


def optimizer_state(policy: ModelCall, optimizer: torch.optim.Optimizer, world: World) -> dict | None:
    """The optimizer's whole state keyed by parameter name, on rank 0's CPU (None elsewhere), whatever the
    world size wrote it: it resumes under any other world size, or without torchrun. Every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_optimizer_state_dict(policy, optimizer, options=options)
    return state if world.is_main else None


def load_optimizer_state(policy: ModelCall, optimizer: torch.optim.Optimizer, state: dict | None,
                         world: World) -> None:
    """Inverse of `optimizer_state`; `state` is needed on rank 0 only (broadcast from there, each rank keeping
    its shards). Every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if not world.distributed:
        set_optimizer_state_dict(policy, optimizer, state, options=StateDictOptions())
        return
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_optimizer_state_dict(policy, optimizer, state if world.is_main else {}, options=options)


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """torch's clip_grad_norm_ over (possibly sharded) parameters; returns the whole model's gradient norm as
    a plain tensor, the same on every rank."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return full_tensor(norm)


# ----------------------------------------------------------------------------- what crosses ranks


def _reduce(values: dict[str, float], world: World, op) -> dict[str, float]:
    if not world.distributed or not values:
        return dict(values)
    names = sorted(values)
    packed = torch.tensor([float(values[n]) for n in names], dtype=torch.float64, device=world.device)
    dist.all_reduce(packed, op=op)
    return dict(zip(names, packed.tolist()))


def sum_across(values: dict[str, float], world: World) -> dict[str, float]:
    """Each value summed over the ranks (counts, totals)."""
    return _reduce(values, world, dist.ReduceOp.SUM)


def max_across(values: dict[str, float], world: World) -> dict[str, float]:
    """Each value's maximum over the ranks."""
    return _reduce(values, world, dist.ReduceOp.MAX)


def mean_across(values: dict[str, float], count: float, world: World) -> dict[str, float]:
    """Means over the ranks weighted by each rank's count (a mean over 30 tokens weighs three times one over
    10): the mean over the union of every rank's items. A rank with count 0 contributes nothing."""
    weighted = sum_across({**{n: v * count for n, v in values.items()}, " count": count}, world)
    total = weighted.pop(" count")
    return {n: v / total if total else 0.0 for n, v in weighted.items()}


def deal(num_items: int, world: World) -> list[int]:
    """This rank's share of items 0..num_items-1, dealt round robin (rank r: r, r + W, r + 2W, ...): the same
    items go to the same rank in every run of the same world size."""
    return list(range(world.rank, num_items, world.size))


def dealt_batches(num_items: int, batch_size: int, world: World) -> list[tuple[list[int], bool]]:
    """This rank's `deal` share of items 0..num_items-1 in batches of at most `batch_size`, as (item indices,
    real) pairs, padded with stand-ins ([0], False) so that every rank makes the same number of calls.

    FSDP's forward and backward are collectives: a rank that made one call fewer would leave the others
    waiting. A stand-in's output must count for nothing (mask it out of the loss, drop its log-probs).
    >>> dealt_batches(5, 2, World(rank=1, size=2))    # rank 1 holds items 1 and 3; rank 0 holds 0, 2, 4
    [([1, 3], True), ([0], False)]"""
    mine = deal(num_items, world)
    calls = -(-(-(-num_items // world.size)) // batch_size)  # ceil(largest share / batch_size)
    batches = [(mine[start : start + batch_size], True) for start in range(0, len(mine), batch_size)]
    return batches + [([0], False)] * (calls - len(batches))


def gather_dealt(local_results: list, num_items: int, world: World) -> list:
    """The results of every rank's `deal` share, on every rank, in item order (item i is rank i % W's
    (i // W)-th result). Results are any picklable objects (CPU tensors included)."""
    return gather_indexed(list(zip(deal(num_items, world), local_results)), num_items, world)


def gather_indexed(local_results: list[tuple[int, object]], num_items: int, world: World) -> list:
    """Results of items 0..num_items-1 given as (item, result) pairs, each item by exactly one rank, on every
    rank in item order (any assignment of items to ranks; `gather_dealt` is the round-robin one)."""
    parts = [list(local_results)]
    if world.distributed:
        parts = [None] * world.size
        dist.all_gather_object(parts, list(local_results))
    ordered = [None] * num_items
    for item, result in (pair for part in parts for pair in part):
        ordered[item] = result
    return ordered


def broadcast_object(obj, world: World):
    """Rank 0's `obj` on every rank (the value other ranks pass is ignored): e.g. the neighbor table, built
    once on rank 0 (which also owns its on-disk cache) and shared."""
    if not world.distributed:
        return obj
    box = [obj if world.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
