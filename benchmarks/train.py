"""`python bench.py train`: forward + backward of the training log-prob path (ngrpo.py), ours (chunked)
against transformers' full logits + log_softmax: speed, peak memory and the fp32 log-prob gap."""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import (
    BENCH,
    SHAPES,
    at_least_1,
    device_arg,
    dies_with_parent,
    emit,
    note,
    rss_mb,
    shape_config,
    transformers_twin,
)
from benchmarks.common import sync as sync_device
from benchmarks.train_long_tail import add_arguments as add_long_tail_arguments
from benchmarks.train_long_tail import bench_train_long_tail
from engine.logprobs import token_logprobs
from model import random_model

TRAIN_DEFAULTS = {"cpu": dict(shape="tiny", batch=8, seq_len=512, repeats=10),
                  "cuda": dict(shape="1.5b", batch=1, seq_len=8192, repeats=5)}


def train_setup(args: argparse.Namespace, device):
    """Our fp32 model (the trained weights stay fp32: README.md, "The real run"), its transformers twin holding the very
    same Parameter objects (one copy of the weights and of .grad serves both), and a random batch."""
    config = shape_config(args.shape)
    model = random_model(config, dtype=torch.float32, device=device, seed=0)
    twin = transformers_twin(model)
    shared = {(k if k.startswith("lm_head") else "model." + k): p for k, p in model.named_parameters()}
    twin.load_state_dict(shared, strict=not model.cfg.tie_word_embeddings, assign=True)
    model.gradient_checkpointing = args.grad_checkpointing
    model.train()  # our blocks are checkpointed only in training mode; neither model has dropout
    twin.train()
    if args.grad_checkpointing:  # non-reentrant, as ours; transformers 5 renamed the method
        enable = getattr(twin, "activation_checkpointing_enable", None) or twin.gradient_checkpointing_enable
        enable({"use_reentrant": False})
    ids = torch.randint(0, model.cfg.vocab_size, (args.batch, args.seq_len), generator=torch.Generator().manual_seed(0))
    return model, twin, ids.to(device)


def ours_logprobs(model, ids, chunk_tokens: int = 1024):
    """log p(ids[:, t+1] | ids[:, :t+1]), [B, T-1], from hidden states in chunks: never [B, T, V] logits."""
    hidden = model.forward_hidden(ids)  # [B, T, d]
    return token_logprobs(hidden[:, :-1], model.output_weight, ids[:, 1:], chunk_tokens=chunk_tokens)[0]


def theirs_logprobs(twin, ids):
    """The same from transformers' full logits [B, T, V], upcast to fp32, log_softmax, gather."""
    logits = twin(input_ids=ids, use_cache=False).logits
    return logits.float().log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]


def train_steps(model, twin, ids, chunk_tokens: int, autocast) -> dict:
    """impl -> a function that runs one forward + backward of sum(log p(next token)) over the batch."""
    mask = torch.ones(ids.shape[0], ids.shape[1] - 1, device=ids.device)  # every position scored

    def ours():
        with autocast():
            logp = ours_logprobs(model, ids, chunk_tokens)
        (logp * mask).sum().backward()

    def theirs():
        with autocast():
            logp = theirs_logprobs(twin, ids)
        (logp * mask).sum().backward()

    def ours_compiled():  # the blocks under torch.compile (Transformer.compile_layers), for the duration
        model.compile_layers()
        try:
            ours()
        finally:
            model.compile_layers(False)

    return {"ours": ours, "ours_compiled": ours_compiled, "transformers": theirs}


def cpu_step_memory_mb(args: argparse.Namespace, impl: str) -> float:
    """The memory one forward + backward of `impl` adds on CPU, measured in a fresh process.

    Peak RSS within one process only grows, so the second implementation measured there would inherit the
    first one's high-water mark; and glibc keeps freed memory for reuse, so even a reset mark would
    under-count whichever runs second. So each implementation runs alone in a new `bench.py train
    --memory-of IMPL` process, with MALLOC_MMAP_THRESHOLD_ set so that every large buffer is its own
    mapping, returned to the system when freed (RSS then follows live memory). There, after a warm-up step
    and with .grad freed, it resets the peak RSS (/proc/self/clear_refs) and reports peak minus current
    RSS over one more step: activations, logits and the gradients it allocates."""
    command = [sys.executable, str(BENCH), "train", "--memory-of", impl, "--device", "cpu", "--shape", args.shape,
               "--batch", str(args.batch), "--seq-len", str(args.seq_len), "--chunk-tokens", str(args.chunk_tokens)]
    if args.grad_checkpointing:
        command.append("--grad-checkpointing")
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    result = subprocess.run(command, preexec_fn=dies_with_parent, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"measuring the memory of {impl} failed:\n{result.stderr}")
    return json.loads(result.stdout)["peak_mem_mb"]


def bench_train(args: argparse.Namespace) -> None:
    """One forward + backward of the training log-prob path on the same weights and batch: ours (hidden
    states -> engine.logprobs.token_logprobs in chunks of --chunk-tokens, never [B, T, V] logits) against
    transformers' model computing full logits + log_softmax + gather. CUDA: fp32 weights under bf16
    autocast, as training runs; CPU: fp32. `peak_mem_mb` is what the step adds at its peak on top of the
    weights and the batch (CUDA: the allocator's peak; CPU: see cpu_step_memory_mb)."""
    if args.long_tail:
        bench_train_long_tail(args)
        return
    device = torch.device(args.device)
    for key, value in TRAIN_DEFAULTS[device.type].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    model, twin, ids = train_setup(args, device)
    if device.type == "cuda":
        autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    else:
        autocast = contextlib.nullcontext
    steps = train_steps(model, twin, ids, args.chunk_tokens, autocast)
    if device.type == "cpu" or args.memory_of:  # compiling for a CPU is not what this measures
        steps.pop("ours_compiled")
    if args.impls:
        steps = {impl: step for impl, step in steps.items() if impl in args.impls.split(",")}

    if args.memory_of:  # the child process of cpu_step_memory_mb
        if device.type != "cpu":
            sys.exit("--memory-of measures CPU memory only")
        steps[args.memory_of]()
        model.zero_grad(set_to_none=True)
        Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
        before_mb = rss_mb("VmRSS")
        steps[args.memory_of]()
        print(json.dumps({"peak_mem_mb": round(rss_mb("VmHWM") - before_mb, 1)}))
        return

    # Apples to apples: both compute the same log-probs from the same weights (fp32, no autocast), checked
    # once on at most 1,024 tokens of the first row (full fp32 logits of a real vocabulary are large).
    with torch.no_grad():
        rows = ids[:1, : min(args.seq_len, 1024)]
        gap = float((ours_logprobs(model, rows) - theirs_logprobs(twin, rows)).abs().max())
    # fp32 on CUDA: the two pick different attention kernels, whose sums round differently.
    tolerance = 1e-4 if device.type == "cpu" else 1e-3
    assert gap < tolerance, f"ours and transformers disagree on the log-probs by {gap:.2e}"
    note(f"train: ours and transformers' fp32 log-probs agree to {gap:.1e} (max abs diff)")

    if device.type == "cpu":
        peak = {impl: cpu_step_memory_mb(args, impl) for impl in steps}
    else:
        peak = {impl: 0.0 for impl in steps}
    seconds, warm_up_s = timed_steps(model, steps, args.repeats, device, peak)
    if args.profile_out and device.type == "cuda":
        profile_steps(model, steps, args.profile_out)
    for impl, timings in seconds.items():
        emit({"bench": "train", "impl": impl, "device": device.type, "shape": args.shape, "batch": args.batch,
              "seq_len": args.seq_len, "tokens_per_s": round(args.batch * args.seq_len / statistics.median(timings), 1),
              "median_s": round(statistics.median(timings), 4), "min_s": round(min(timings), 4),
              "peak_mem_mb": peak[impl], "grad_checkpointing": args.grad_checkpointing, "fp32_logp_gap": gap,
              "warm_up_s": warm_up_s[impl]})


def timed_steps(model, steps: dict, repeats: int, device, peak: dict) -> tuple[dict, dict]:
    """({impl: seconds of each timed step}, {impl: seconds of its warm-up step}); on CUDA `peak` gets each impl's
    largest allocator peak over what was allocated before its step (MB)."""
    seconds, warm_up_s = {impl: [] for impl in steps}, {}
    for impl, step in steps.items():  # warm-up (ours_compiled: its compile)
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        step()
        sync_device(device)
        warm_up_s[impl] = round(time.perf_counter() - start, 2)
    # Round-robin over the implementations, so that drift in the machine's speed hits both alike.
    for _ in range(repeats):
        for impl, step in steps.items():
            model.zero_grad(set_to_none=True)  # each step allocates its own .grad, as a training step does
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(device)
                before = torch.cuda.memory_allocated(device)
            start = time.perf_counter()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize()
                peak[impl] = max(peak[impl], round((torch.cuda.max_memory_allocated(device) - before) / 2**20, 1))
            seconds[impl].append(time.perf_counter() - start)
    return seconds, warm_up_s


def profile_steps(model, steps: dict, out: str) -> None:
    """torch.profiler over one step of each implementation: its kernels by device time, into `out`."""
    with open(out, "w") as f:
        for impl, step in steps.items():
            model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="device_time_total", row_limit=30)
            f.write(f"== {impl}: one forward + backward\n{table}\n")
    note(f"train: profiles in {out}")


def add_parser(subparsers) -> None:
    train = subparsers.add_parser("train", help="forward + backward of the log-prob path: ours (chunked) vs "
                                  "transformers' full logits + log_softmax")
    train.add_argument("--device", type=device_arg, default="cpu",
                       help="cpu (fp32) or cuda (fp32 weights, bf16 autocast)")
    train.add_argument("--shape", default=None, choices=["tiny", *SHAPES],
                       help="tiny preset, or the real R1-Distill config from ../shared with random weights "
                            "(default: tiny on cpu, 1.5b on cuda)")
    train.add_argument("--batch", type=at_least_1, default=None,
                       help="sequences per step (default: 8 on cpu, 1 on cuda)")
    train.add_argument("--seq-len", type=at_least_1, default=None,
                       help="tokens per sequence (default: 512 on cpu, 8192 on cuda)")
    train.add_argument("--chunk-tokens", type=at_least_1, default=1024, help="positions per chunk of our log-prob path")
    train.add_argument("--grad-checkpointing", action="store_true", help="recompute each block in backward (both)")
    train.add_argument("--repeats", type=at_least_1, default=None,
                       help="timed runs per implementation, median reported "
                       "(default: 10 on cpu, 5 on cuda; --long-tail: 2 updates of each kind)")
    train.add_argument("--impls", default=None, help="comma-separated subset of ours, ours_compiled (cuda: the "
                       "blocks under torch.compile, an experiment), transformers (default: all)")
    train.add_argument("--profile-out", default=None, help="cuda: also profile one step of each implementation "
                       "into this file")
    train.add_argument("--memory-of", choices=["ours", "transformers"], default=None,
                       help="internal: measure one implementation's memory in this fresh process (see bench_train)")
    add_long_tail_arguments(train)
    train.set_defaults(run=bench_train)
