"""`python bench.py train --long-tail`: one whole update (ngrpo.update: reference and old-policy replays,
two optimizer steps) on rows with the rollout bench's long-tailed response lengths, with fixed-row
micro-batches (--micro-batch-size) against micro-batches by token budget (--micro-batch-tokens, ngrpo.micro_batches)
and the same token-budget micro-batches packed (--pack, engine/packing.py): wall time (and CPU time: other users of
a shared machine inflate wall time more), the fraction of replayed positions that are padding, peak memory, and the
speedups.

Each update runs in a fresh process (peak RSS only grows within one), the kinds alternating (A B C C B A
...) so that a change in the machine's load hits all alike; each child saves its weights, and the parent
checks that every kind ends with the fixed rows' weights and metrics."""

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import BENCH, at_least_1, dies_with_parent, emit, note, rss_mb
from benchmarks.long_tail import long_tail_lengths, long_tail_model
from config import Config
from ngrpo import micro_batches, replay_tokens, update
from rollout import Rollout

KINDS = ("fixed-rows", "token-budget", "packed")
REPEATS = 2  # updates of each kind when --repeats is not given (an update at 2,048 tokens takes a minute on a CPU)


def long_tail_rollout(args, vocab: int):
    """A rollout record of args.rows rows as the sampler would leave it: prompts of 16..args.prompt_len
    tokens, long_tail_lengths responses (those at the limit not finished), and neighbor mixing at 10% of
    the steps (2 candidates, weights 0.7 / 0.3). Random ids: the update's cost does not depend on them."""
    g = torch.Generator().manual_seed(args.seed)
    rows, T = args.rows, args.new_tokens
    prompt_lens = torch.randint(16, args.prompt_len + 1, (rows,), generator=g).tolist()
    prompts = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in prompt_lens]
    lengths = torch.tensor(long_tail_lengths(rows, T, args.seed))
    response_ids = torch.randint(1, vocab, (rows, T), generator=g)
    mixed = (torch.rand(rows, T, generator=g) < 0.1) & (torch.arange(T)[None] < lengths[:, None])
    cand_ids = torch.stack([response_ids, torch.where(mixed, torch.randint(1, vocab, (rows, T), generator=g),
                                                      response_ids)], -1)  # [N, T, 2]
    cand_weights = torch.stack([torch.where(mixed, 0.7, 1.0), torch.where(mixed, 0.3, 0.0)], -1)
    steps = dict(response_ids=response_ids, logprobs=torch.zeros(rows, T), cand_ids=cand_ids,
                 cand_weights=cand_weights, mixed=mixed)  # strategies.RECORD: what neighbor mixing records
    return Rollout(prompts, lengths, lengths < T, steps, strategy="neighbor")


def update_config(args, kind: str):
    return Config(group_size=4, prompts_per_step=args.rows // 4, mini_batch_prompts=args.rows // 8,
                  max_new_tokens=args.new_tokens, kl_coef=0.01, lr=1e-5, micro_batch_size=args.micro_batch_size,
                  micro_batch_tokens=args.micro_batch_tokens if kind != "fixed-rows" else 0, pack=kind == "packed")


def padded_fraction(rollout, cfg) -> float:
    """The share of the positions the update's forwards compute that are padding: the two no-grad replays
    over all rows and the policy's forward over each mini-batch, each micro-batch padded to its longest."""
    def positions(record) -> tuple[int, int]:
        tokens = replay_tokens(record)
        plan = micro_batches(record, cfg)
        return sum(len(rows) * max(tokens[r] for r in rows) for rows, _ in plan), sum(tokens)

    per_minibatch = cfg.mini_batch_prompts * cfg.group_size
    parts = [positions(rollout)] * 2 + [positions(rollout.select(slice(s, s + per_minibatch)))
                                        for s in range(0, len(rollout.prompts), per_minibatch)]
    computed, real = sum(p[0] for p in parts), sum(p[1] for p in parts)
    return 0.0 if cfg.pack else 1 - real / computed  # packed: the real positions alone


def one_update(args) -> None:
    """The child: one update of `args.update_of` kind; prints wall, peak memory and metrics, saves weights."""
    device = torch.device("cpu")
    policy = long_tail_model(args, device).train()
    policy.gradient_checkpointing = True  # as train.py runs by default
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    rollout = long_tail_rollout(args, policy.cfg.vocab_size)
    rewards = torch.rand(args.rows, generator=torch.Generator().manual_seed(args.seed + 1)).round()
    cfg = update_config(args, args.update_of)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
    before_mb = rss_mb("VmRSS")
    start, cpu = time.perf_counter(), time.process_time()
    metrics, skipped = update(policy, reference, optimizer, rollout, rewards, cfg)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    torch.save(policy.state_dict(), args.save)
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds, "skipped": skipped, "metrics": metrics,
                      "peak_mem_mb": round(rss_mb("VmHWM") - before_mb, 1),
                      "padded_frac": padded_fraction(rollout, cfg)}))


def run_child(args, kind: str, save: Path) -> dict:
    command = [sys.executable, str(BENCH), "train", "--long-tail", "--update-of", kind, "--save", str(save)]
    for flag in ("rows", "new_tokens", "prompt_len", "vocab", "micro_batch_size", "micro_batch_tokens", "seed"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")  # freed buffers return to the system
    result = subprocess.run(command, preexec_fn=dies_with_parent, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"the {kind} update failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.splitlines()[-1])


def bench_train_long_tail(args: argparse.Namespace) -> None:
    if args.micro_batch_tokens is None:  # the worst case of the fixed rows: the same peak memory at most
        args.micro_batch_tokens = args.micro_batch_size * (args.prompt_len + args.new_tokens - 1)
    if args.repeats is None:  # `bench.py train`'s --repeats: each path has its own default
        args.repeats = REPEATS
    if args.update_of:
        one_update(args)
        return
    runs = {kind: [] for kind in KINDS}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for kind in KINDS if repeat % 2 == 0 else KINDS[::-1]:
                loads.append(os.getloadavg()[0])
                runs[kind].append(run_child(args, kind, Path(tmp) / f"{kind}.pt"))
                note(f"train --long-tail: {kind} {runs[kind][-1]['seconds']:.1f} s (load {loads[-1]:.1f})")
        weights = {kind: torch.load(Path(tmp) / f"{kind}.pt") for kind in KINDS}
    weight_diff = max(float((weights[KINDS[0]][n] - weights[kind][n]).abs().max())
                      for kind in KINDS[1:] for n in weights[KINDS[0]])
    first = {kind: runs[kind][0]["metrics"] for kind in KINDS}
    # Relative differences; a metric under 1e-4 (the KL of a policy that has barely moved: ~1e-7) is compared
    # against 1e-4, since fp32 sums in another order (packed attention, other micro-batches) move it by ~1e-9.
    metric_diff = max(abs(first[KINDS[0]][k] - first[kind][k]) / max(abs(first[KINDS[0]][k]), 1e-4)
                      for kind in KINDS[1:] for k in first[KINDS[0]])
    median = {kind: statistics.median(r["seconds"] for r in runs[kind]) for kind in KINDS}
    cpu = {kind: statistics.median(r["cpu_seconds"] for r in runs[kind]) for kind in KINDS}
    shape = {"rows": args.rows, "new_tokens": args.new_tokens, "prompt_len": args.prompt_len, "vocab": args.vocab,
             "seed": args.seed, "threads": torch.get_num_threads()}
    for kind in KINDS:
        emit({"bench": "train_long_tail", "kind": kind, **shape,
              "micro_batch_size" if kind == "fixed-rows" else "micro_batch_tokens":
                  args.micro_batch_size if kind == "fixed-rows" else args.micro_batch_tokens, "pack": kind == "packed",
              "median_s": round(median[kind], 2), "runs_s": [round(r["seconds"], 2) for r in runs[kind]],
              "cpu_s": [round(r["cpu_seconds"], 2) for r in runs[kind]],
              "padded_frac": round(runs[kind][0]["padded_frac"], 3),
              "peak_mem_mb": max(r["peak_mem_mb"] for r in runs[kind])})
    emit({"bench": "train_long_tail", **shape, "speedup": round(median["fixed-rows"] / median["token-budget"], 2),
          "cpu_speedup": round(cpu["fixed-rows"] / cpu["token-budget"], 2),
          "packed_over_token_budget": round(median["token-budget"] / median["packed"], 2),
          "packed_over_token_budget_cpu": round(cpu["token-budget"] / cpu["packed"], 2),
          "weights_max_abs_diff": weight_diff, "metrics_max_rel_diff": metric_diff,
          "load_1min": [round(x, 2) for x in loads]})


def add_arguments(train) -> None:
    """The --long-tail flags of `bench.py train`."""
    train.add_argument("--long-tail", action="store_true", help="one update at long-tailed response lengths: "
                       "fixed-row vs token-budget micro-batches vs packed ones (benchmarks/train_long_tail.py)")
    train.add_argument("--rows", type=at_least_1, default=32, help="--long-tail: rows of the update (prompts x 4)")
    train.add_argument("--new-tokens", type=at_least_1, default=2048, help="--long-tail: the response length limit")
    train.add_argument("--prompt-len", type=at_least_1, default=64, help="--long-tail: the longest prompt (from 16)")
    train.add_argument("--vocab", type=at_least_1, default=896, help="--long-tail: the model's vocabulary size")
    train.add_argument("--micro-batch-size", type=at_least_1, default=4, help="--long-tail: rows per fixed micro-batch")
    train.add_argument("--micro-batch-tokens", type=at_least_1, default=None, help="--long-tail: the token budget "
                       "(default: micro-batch-size x the longest row, the fixed rows' worst case)")
    train.add_argument("--seed", type=int, default=0, help="--long-tail: the seed of lengths and inputs")
    train.add_argument("--update-of", choices=KINDS, default=None, help="internal: run one update in this process")
    train.add_argument("--save", default=None, help="internal: with --update-of, where the weights go")
