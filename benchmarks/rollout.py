"""`python bench.py rollout`: the sampler (rollout.py) against transformers' generate, with and without
neighbor mixing; `--long-tail`: continuous refill vs static batches, decode-step time vs attention window and
the cost of per-row draws; `--memory`: peak memory of the sampler's and replay's memory changes."""

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from unittest import mock

import torch
import torch.nn.functional as F

from benchmarks.common import (
    BENCH,
    SHAPES,
    at_least_1,
    busy_decoder,
    device_arg,
    dies_with_parent,
    emit,
    latency_ms,
    peak_mem_mb,
    shape_config,
    sync,
    transformers_twin,
)
from benchmarks.long_tail import forced_lengths_sampler, long_tail_lengths, long_tail_model
from engine import decoder as engine_decoder
from engine.decoder import Decoder, release_decoder
from engine.draws import TOKEN, RowDraws
from model import random_model
from neighbors import build_neighbor_table
from rollout import Exploration, Sampler, Sampling, generate, sample_tokens
from strategies import STRATEGIES, mixed_embeddings


def bench_rollout(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    config = shape_config(args.shape)
    model = random_model(config, dtype=dtype, device=device, seed=0).eval()
    twin = transformers_twin(model)
    vocab = model.cfg.vocab_size
    prompts = torch.randint(0, vocab, (args.batch, args.prompt_len), generator=torch.Generator().manual_seed(0))
    table = build_neighbor_table(model.output_weight, 1)
    sampling = Sampling(max_new_tokens=args.new_tokens)  # no stop ids: every row runs the full length

    cuda_graph = device.type == "cuda" and args.cuda_graph

    def ours(explore):  # no stop-mixing token: a soft-token strategy mixes every step, its most costly case
        exploration = Exploration(explore, mix_rate=0.1)
        return lambda: generate(model, prompts.tolist(), sampling, exploration, neighbor_table=table,
                                seed=0, cuda_graph=cuda_graph)

    def theirs():
        ids = prompts.to(device)
        return twin.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_p=1.0,
                             top_k=0, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, pad_token_id=0)

    runs = [*(("ours", explore, ours(explore)) for explore in args.explore),
            *([("transformers", "none", theirs)] if args.transformers else [])]
    seconds = {impl_explore: [] for impl_explore in [(impl, explore) for impl, explore, _ in runs]}
    peak = {}
    for impl, explore, run in runs:
        run()  # warm-up
    # Round-robin over the configurations, so that drift in the machine's speed hits all of them alike.
    for _ in range(args.repeats):
        for impl, explore, run in runs:
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            run()
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds[impl, explore].append(time.perf_counter() - start)
            peak[impl, explore] = peak_mem_mb(device)
    for (impl, explore), timings in seconds.items():
        emit({"bench": "rollout", "impl": impl, "explore": explore, "device": device.type, "shape": args.shape,
              "batch": args.batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
              "tokens_per_s": round(args.batch * args.new_tokens / statistics.median(timings), 1),
              "median_s": round(statistics.median(timings), 4), "min_s": round(min(timings), 4),
              "peak_mem_mb": peak[impl, explore], "cuda_graph": cuda_graph and impl == "ours",
              "repeats": args.repeats})


def run_rollout_bench(args: argparse.Namespace) -> None:
    if args.memory_of:
        memory_case(args.memory_of, args.after)
    elif args.memory:
        bench_rollout_memory(args)
    elif args.long_tail:
        args.repeats = args.repeats or 1  # a run of the three engines at 2,048 tokens takes minutes on a CPU
        bench_rollout_long_tail(args)
        bench_decode_step(args)
        bench_draw_cost(args)
    else:
        args.repeats = args.repeats or 15
        bench_rollout(args)


def bench_rollout_long_tail(args: argparse.Namespace) -> None:
    """Rows with long-tailed lengths (long_tail_lengths), more rows than slots: continuous refill vs static
    batches (the same engine with refill=False) vs static batches attending over the whole cache (the
    engine before refill), one after another in one process. Per-row randomness makes all three produce
    the same rows, which is checked."""
    device = torch.device(args.device)
    model = long_tail_model(args, device)
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(1, args.vocab) for _ in range(rng.randint(16, args.prompt_len))]
               for _ in range(args.rows)]
    drawn = long_tail_lengths(args.rows, args.new_tokens, args.seed)
    sampling = Sampling(max_new_tokens=args.new_tokens, stop_ids=(0,))
    forced = forced_lengths_sampler(drawn, args.new_tokens, 0, device)
    configs = {"refill": dict(refill=True), "static": dict(refill=False),
               "static_full_cache": dict(refill=False)}
    counts = {name: [0, 0] for name in configs}  # decode steps, KV slots read (sum of slots x window)
    decode_step = Decoder.step

    def run(name):
        counts[name] = [0, 0]

        def counted(decoder, model, key, window):  # the machine-independent cost of the run
            counts[name][0] += 1
            counts[name][1] += decoder.slots * window
            return decode_step(decoder, model, key, window)

        # static_full_cache: every window is the whole cache, as the engine before refill read it.
        min_window = 1 << 30 if name == "static_full_cache" else engine_decoder.MIN_WINDOW
        release_decoder(model)  # a fresh cache of the exact size for each engine
        with (mock.patch.object(engine_decoder, "MIN_WINDOW", min_window),
              mock.patch.object(Decoder, "step", counted), mock.patch.object(Sampler, "__call__", forced)):
            return generate(model, prompts, sampling, seed=args.seed, slots=args.slots, **configs[name])

    seconds, results = {name: [] for name in configs}, {}
    for _ in range(args.repeats):  # round-robin, so that drift in the machine's speed hits all alike
        for name in configs:
            sync(device)
            start = time.perf_counter()
            results[name] = run(name)
            sync(device)
            seconds[name].append(time.perf_counter() - start)
    lengths = results["refill"].lengths.float()
    if lengths.long().tolist() != drawn:
        raise RuntimeError("the rows' lengths are not the drawn ones: forced_lengths_sampler no longer fits")
    for name, timings in seconds.items():
        same = results[name].responses() == results["refill"].responses()
        emit({"bench": "rollout_long_tail", "engine": name, "device": device.type, "rows": args.rows,
              "slots": args.slots, "new_tokens": args.new_tokens, "vocab": args.vocab, "seed": args.seed,
              "mean_length": round(float(lengths.mean()), 1),
              "at_limit": round(float((lengths == args.new_tokens).float().mean()), 3),
              "tokens_per_s": round(float(lengths.sum()) / statistics.median(timings), 1),
              "median_s": round(statistics.median(timings), 3), "runs_s": [round(t, 3) for t in timings],
              "speedup_vs_this": round(statistics.median(timings) / statistics.median(seconds["refill"]), 2),
              "decode_steps": counts[name][0], "kv_slots_read": counts[name][1],
              "same_rows_as_refill": same})


def bench_decode_step(args: argparse.Namespace) -> None:
    """The time of one decode step of the long-tail model for --slots rows against the attention window
    (the filled cache length it reads), up to the whole cache of prompt_len + new_tokens."""
    device = torch.device(args.device)
    model = long_tail_model(args, device)
    decoder, key = busy_decoder(model, args.slots, args.prompt_len + args.new_tokens,
                                cuda_graph=device.type == "cuda" and args.cuda_graph)
    window = engine_decoder.MIN_WINDOW
    while True:
        window = min(window, decoder.max_len)
        timings = []
        for _ in range(args.step_repeats + 3):
            decoder.state.prompt_len.fill_(window - 1)  # every row at the window's last slot
            decoder.state.length.zero_()
            sync(device)
            start = time.perf_counter()
            decoder.step(model, key, window)
            sync(device)
            timings.append(time.perf_counter() - start)
        emit({"bench": "decode_step", "device": device.type, "slots": args.slots, "window": window,
              "cache_len": decoder.max_len, **latency_ms(timings[3:])})
        if window == decoder.max_len:
            break
        window *= 2


# Peak-memory cases of issue-17 item 5, each run in a fresh process ("before" = how the code did it).
MEMORY_CASES = {
    "prefill": ("[B, 1, P, P] mask, K and V repeated (before)", "causal, no mask, enable_gqa (after)"),
    "gqa_attention": ("repeat_interleave K, V (before)", "enable_gqa (after)"),
    "replay_mixture": ("[.., K, d] gather (before)", "one candidate at a time (after)"),
}


def memory_case(case: str, after: bool) -> None:
    """Runs one case once in this process and prints its peak resident memory above the set-up's."""
    torch.manual_seed(0)
    if case == "prefill":  # 8 prompts of 2048 tokens into a cache, the long-tail model
        model = long_tail_model(argparse.Namespace(vocab=1024), torch.device("cpu"))
        ids = torch.randint(0, 1024, (8, 2048))
        cache = model.new_cache(8, 2048)
        mask = None if after else torch.ones(8, 2048, dtype=torch.bool)

        def run():
            return model.forward_hidden(ids, attention_mask=mask, cache=cache, cache_pos=0)
    elif case == "gqa_attention":  # one R1-Distill-1.5B layer's attention (12 query, 2 KV heads), 4k tokens
        q, k, v = torch.randn(1, 12, 4096, 128), torch.randn(1, 2, 4096, 128), torch.randn(1, 2, 4096, 128)

        def run():  # before: the copies made inside the measured call, as attend made them
            if after:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return F.scaled_dot_product_attention(q, k.repeat_interleave(6, 1), v.repeat_interleave(6, 1),
                                                  is_causal=True)
    else:  # the replayed soft mixtures (K = 10) of 2 rows of 4k tokens at d = 1536, forward and backward
        embed = torch.randn(4096, 1536, requires_grad=True)
        ids, weights = torch.randint(0, 4096, (2, 4096, 10)), torch.rand(2, 4096, 10).softmax(-1)

        def run():
            if after:
                mixed = mixed_embeddings(embed, ids, weights)
            else:
                mixed = (weights.unsqueeze(-1) * embed[ids]).sum(-2)
            mixed.square().sum().backward()
    before_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with torch.no_grad() if case != "replay_mixture" else torch.enable_grad():
        run()
    emit({"peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before_mb, 1)})


def bench_rollout_memory(args: argparse.Namespace) -> None:
    """Peak memory before and after each item-5 change, one fresh process per measurement (CPU, peak RSS)."""
    for case, labels in MEMORY_CASES.items():
        for after, label in enumerate(labels):
            command = [sys.executable, str(BENCH), "rollout", "--memory-of", case]
            command += ["--after"] if after else []
            line = subprocess.run(command, preexec_fn=dies_with_parent, capture_output=True, text=True, check=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout.strip().splitlines()[-1]
            emit({"bench": "rollout_memory", "case": case, "version": label, **json.loads(line)})


def bench_draw_cost(args: argparse.Namespace) -> None:
    """One sampling draw per row from p [rows, vocab]: per-row hashed uniforms and the float64 inverse CDF
    (rollout.sample_tokens) against the generator-drawn exponential race the sampler used before."""
    device = torch.device(args.device)
    generator = torch.Generator(device).manual_seed(0)
    for rows, vocab in ((args.slots, args.vocab), (64, 151936)):
        probs = torch.rand(rows, vocab, device=device, generator=generator).softmax(-1)
        keys, positions = torch.arange(rows, device=device), torch.full((rows,), 100, device=device)
        draws = RowDraws(0, keys, positions)
        runs = {"row_draws_inverse_cdf": lambda: sample_tokens(probs, draws.uniform(TOKEN, 1)[:, 0]),
                "generator_exponential_race": lambda: (probs / torch.rand(probs.shape, device=device,
                                                                          generator=generator).log_().neg_()
                                                       ).argmax(-1)}
        for name, run in runs.items():
            timings = []
            for _ in range(args.step_repeats + 2):
                sync(device)
                start = time.perf_counter()
                run()
                sync(device)
                timings.append(time.perf_counter() - start)
            emit({"bench": "token_draws", "impl": name, "device": device.type, "rows": rows, "vocab": vocab,
                  **latency_ms(timings[2:])})


def add_parser(subparsers) -> None:
    rollout = subparsers.add_parser("rollout", help="sampler: ours vs transformers' generate, neighbor mixing vs none")
    rollout.add_argument("--device", type=device_arg, default="cpu", help="cpu or cuda")
    rollout.add_argument("--shape", default="tiny", choices=["tiny", *SHAPES],
                         help="tiny preset, or the real R1-Distill config from ../shared with random weights")
    rollout.add_argument("--batch", type=at_least_1, default=16, help="prompts decoded together")
    rollout.add_argument("--prompt-len", type=at_least_1, default=32, help="tokens per prompt")
    rollout.add_argument("--new-tokens", type=at_least_1, default=128,
                         help="tokens generated per prompt (no early stop)")
    rollout.add_argument("--explore", nargs="+", choices=list(STRATEGIES), default=["none", "neighbor"],
                         help="our sampler's strategies, each timed beside transformers' plain sampling (every "
                              "soft-token one: none neighbor soft soft-gumbel mixinputs multiplex soft-grpo)")
    rollout.add_argument("--no-transformers", dest="transformers", action="store_false",
                         help="time our sampler alone (the strategies against each other)")
    rollout.add_argument("--repeats", type=at_least_1, default=None,
                         help="timed runs per configuration, median reported (default: 15; --long-tail: 1)")
    rollout.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false",
                         help="on cuda, run our decode step eagerly instead of replaying a CUDA graph")
    rollout.add_argument("--long-tail", action="store_true",
                         help="long-tailed response lengths, rows > slots: continuous refill vs static "
                              "batches, and decode-step time vs attention window (options below)")
    rollout.add_argument("--rows", type=at_least_1, default=32, help="--long-tail: rows generated")
    rollout.add_argument("--slots", type=at_least_1, default=8, help="--long-tail: rows decoded at once")
    rollout.add_argument("--vocab", type=at_least_1, default=896, help="--long-tail: the model's vocabulary size")
    rollout.add_argument("--seed", type=int, default=0,
                         help="--long-tail: seed of the prompts, the response lengths and the sampling draws")
    rollout.add_argument("--step-repeats", type=at_least_1, default=20,
                         help="--long-tail: timed decode steps per window")
    rollout.add_argument("--memory", action="store_true",
                         help="peak memory before / after the sampler's and replay's memory changes (CPU)")
    rollout.add_argument("--memory-of", choices=list(MEMORY_CASES), default=None,
                         help="internal: measure one --memory case in this fresh process")
    rollout.add_argument("--after", action="store_true", help="internal: with --memory-of, the new code")
    rollout.set_defaults(run=run_rollout_bench)
