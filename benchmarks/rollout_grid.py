"""`python bench.py rollout-grid`: the sampler at the real shape on a GPU, in one process and one device call.

1. The machine's two ceilings, measured here: device-to-device copy bandwidth (bytes read + written) and a
   large bf16 matrix product.
2. Tokens/s of whole rollouts (prefill included, every row to its length: no stop ids) for each batch x length:
   ours (the library's default path: rollout.generate, CUDA graphs reused across calls), ours with neighbor
   mixing, ours eager (no graph), transformers' `generate`; interleaved (round-robin), so that drift in the
   machine's speed hits all alike. The first configuration's first call of ours is the cold start (compiles,
   graph capture): its time is the rollout's warm-up (warm_up_compile_s: torch.compile's part of it). With
   --hf-whole-max-s, transformers' rollouts that would take longer are estimated from its decode step at their
   mean window (hf_sampled), and say so.
3. The decode step (engine.decoder.Decoder) at --batch-for-steps rows at each attention window up to the longest
   prompt + response, graphed, against its memory floor: the bytes one step must read (every weight but the
   input embedding, whose B rows are gathered; the K and V of the window) and write (fp32 logits), over the copy
   bandwidth from 1. Twice: the model's step alone (decode_step_model) and the whole step the rollout replays,
   sampling and recording included (decode_step; its floor also reads the logits once).
4. A whole rollout's time per token against the graphed step at its mean window (rollout_vs_step).
5. A torch.profiler summary of one eager step's kernels, to say where a gap to the floor goes.

Device time is scarce, so the grid is ordered by priority and runs under --budget-s: a measurement whose time,
predicted from what already ran, would not fit is skipped with a `"skipped"` line saying so. A configuration
that fails prints its traceback and the grid goes on. One JSON line per measurement on stdout.
"""

import argparse
import statistics
import time
import traceback

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import (
    SHAPES,
    above_0,
    at_least_1,
    busy_decoder,
    device_arg,
    emit,
    note,
    shape_config,
    sync,
    torch_dtype,
    transformers_twin,
)
from engine import kernels
from engine.decoder import MIN_WINDOW
from model import random_model
from neighbors import build_neighbor_table
from rollout import Exploration, Sampling, generate


def seconds_of(device, run) -> float:
    """Wall seconds of run(), the device's queued work included (synchronised before and after)."""
    sync(device)
    start = time.perf_counter()
    run()
    sync(device)
    return time.perf_counter() - start


def ceilings(device, gib: float) -> dict:
    """Copy bandwidth (GB/s, read + write) over a gib-GiB buffer, and bf16 (GPU) / fp32 (CPU) matmul TFLOP/s."""
    source = torch.empty(int(gib * 2**30) // 2, dtype=torch.bfloat16, device=device).normal_()
    target = torch.empty_like(source)
    n = 1024 if device.type == "cpu" else 8192  # a CPU run checks the harness: a small product will do
    a, b = (torch.randn(n, n, device=device, dtype=torch_dtype(device)) for _ in range(2))
    timings = {"copy": [], "matmul": []}
    for _ in range(3 + 10):
        for name, run in (("copy", lambda: target.copy_(source)), ("matmul", lambda: a @ b)):
            timings[name].append(seconds_of(device, run))
    copy_s, matmul_s = (statistics.median(t[3:]) for t in timings.values())
    return {"copy_gb_per_s": round(2 * source.numel() * 2 / copy_s / 1e9, 1),
            "matmul_tflop_per_s": round(2 * n**3 / matmul_s / 1e12, 1), "matmul_n": n,
            "matmul_dtype": str(a.dtype).removeprefix("torch.")}


def step_bytes(model, batch: int, window: int) -> dict:
    """The fewest bytes one decode step of `batch` rows over a `window`-slot attention window moves."""
    cfg = model.cfg
    params = {id(p): p for p in model.parameters()}  # a tied embedding counts once
    weights = sum(p.numel() * p.element_size() for p in params.values())
    embed = model.embed_tokens.weight
    if not cfg.tie_word_embeddings:  # the input embedding is gathered (B rows), not read whole
        weights -= embed.numel() * embed.element_size() - batch * embed.shape[1] * embed.element_size()
    kv = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * embed.element_size() * batch * window
    logits = batch * cfg.vocab_size * 4
    return {"weights": weights, "kv": kv, "logits": logits, "total": weights + kv + logits}


class Grid:
    """The budget: what has run and how long it took, so that what would not fit is skipped, not started."""

    def __init__(self, budget_s: float):
        self.start, self.budget_s = time.perf_counter(), budget_s
        self.seconds_per_step: dict[str, float] = {}  # impl -> its slowest seconds per decode step so far
        self.measured_at: dict[str, tuple[int, float]] = {}  # impl -> (rows, mean window) of that measurement
        self.warmed = False  # a rollout of ours ran in this process (compiled, captured)
        self.step_s: dict[tuple[int, int], float] = {}  # (rows, window) -> the graphed whole step's seconds

    def record(self, impl: str, seconds_per_step: float, batch: int, window: float) -> None:
        if seconds_per_step >= self.seconds_per_step.get(impl, 0.0):
            self.seconds_per_step[impl], self.measured_at[impl] = seconds_per_step, (batch, window)

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.start)

    def fits(self, seconds: float, what: dict) -> bool:
        if seconds <= self.left():
            return True
        emit({"bench": "rollout_grid", **what, "skipped": f"predicted {seconds:.0f} s, {self.left():.0f} s of "
              f"--budget-s left"})
        return False

    def attempt(self, what: dict, run) -> None:
        try:
            run()
        except Exception as error:  # one broken configuration must not cost the rest of a device call
            traceback.print_exc()
            emit({"bench": "rollout_grid", **what, "error": f"{type(error).__name__}: {error}"[:500]})
            if "out of memory" in str(error).lower():
                torch.cuda.empty_cache()


def graphed_model_step(model, decoder, window: int | None, flash=None):
    """A function that replays the model's part of a decode step (engine.decoder.Decoder's cache, positions in a
    buffer; attention by `flash`, an engine.kernels.FlashDecode, else over `window` slots) from a CUDA graph of its
    own; on a CPU it runs it eagerly. Returns (run, positions buffer)."""
    inputs = torch.randn(decoder.slots, model.cfg.hidden_size, device=decoder.device, dtype=decoder.dtype) * 0.02
    positions = torch.zeros(decoder.slots, dtype=torch.long, device=decoder.device)

    def run():
        hidden = kernels.decode_hidden(model, inputs, positions, decoder.cache, ops=decoder.ops, window=window,
                                       flash=flash)
        decoder.logits.copy_(F.linear(hidden, model.output_weight))

    if decoder.device.type != "cuda":
        return run, positions
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=decoder.pool):
        run()
    return graph.replay, positions


def decode_steps(model, device, batch: int, max_len: int, repeats: int, bandwidth: float, grid: Grid,
                 windows: list[int] | None = None, both_layouts: bool = False) -> dict[int, float]:
    """Each window's graphed decode step (CUDA; eager on a CPU), the model's part alone (with both of
    FlashAttention's layouts when both_layouts) and the whole step with sampling, against the memory floor.
    Returns {window: median seconds of the whole step}."""
    graphed = device.type == "cuda"
    decoder, key = busy_decoder(model, batch, max_len, cuda_graph=graphed)
    if decoder.flash is not None:
        emit({"bench": "rollout_grid", "part": "flash_layout", "batch": batch, "cache_len": decoder.max_len,
              "chosen": "grouped" if decoder.flash.grouped else "split", "attention_ms": decoder.flash_timings})
    if windows is None:
        windows, window = [], MIN_WINDOW
        while window < max_len:
            windows.append(window)
            window *= 2
        windows.append(max_len)
    layouts = {"sdpa_window": None}  # attention name -> kernels.FlashDecode (None: windowed SDPA, a graph each)
    if decoder.flash is not None:
        groups = model.cfg.num_heads // model.cfg.num_kv_heads
        layouts = {f"flash_{'grouped' if grouped else 'split'}": kernels.flash_decode(
            batch, decoder.max_len, groups, grouped, device) for grouped in (decoder.flash.grouped,
                                                                            not decoder.flash.grouped)}
        if not both_layouts:
            layouts = dict(list(layouts.items())[:1])
    model_steps = {}  # attention -> (run, positions): flash serves every window with one graph
    whole_s = {}
    for window in windows:
        floor = step_bytes(model, batch, window)
        floor_s = floor["total"] / (bandwidth * 1e9)
        # Every row at the window's last slot; each step moves it one on (`length`), reset before each step.
        place = lambda: (decoder.state.prompt_len.fill_(window - 1), decoder.state.length.zero_())
        parts = []
        for name, flash in layouts.items():
            if flash is None or name not in model_steps:
                model_steps[name] = graphed_model_step(model, decoder, window if flash is None else None, flash)
            run_model, positions = model_steps[name]
            positions.fill_(window - 1)
            parts.append(("decode_step_model", name, run_model, floor_s))
        parts.append(("decode_step", list(layouts)[0], lambda: (place(), decoder.step(model, key, window)),
                      floor_s + batch * model.cfg.vocab_size * 4 / (bandwidth * 1e9)))  # + the logits read once
        for part, attention, run, floor_part_s in parts:
            what = {"part": part, "batch": batch, "window": window, "cuda_graph": graphed, "attention": attention}
            if not grid.fits(0, what):
                return whole_s
            timings = [seconds_of(device, run) for _ in range(repeats + 3)]
            median = statistics.median(timings[3:])
            if part == "decode_step":
                whole_s[window] = grid.step_s[(batch, window)] = median
            emit({"bench": "rollout_grid", **what, "median_ms": round(1000 * median, 3),
                  "min_ms": round(1000 * min(timings[3:]), 3), "floor_ms": round(1000 * floor_part_s, 3),
                  "first_call_ms": round(1000 * timings[0], 3), "over_floor": round(median / floor_part_s, 2),
                  "bytes_weights": floor["weights"], "bytes_kv": floor["kv"], "bytes_logits": floor["logits"],
                  "copy_gb_per_s": bandwidth})
    return whole_s


def implementations(model, twin, prompts, seed: int) -> dict:
    """impl -> a function of the number of new tokens that runs one whole rollout of `prompts` [B, P]."""
    table = build_neighbor_table(model.output_weight, 1)
    graphed = model.output_weight.device.type == "cuda"

    def ours(explore: str, cuda_graph: bool):
        exploration = Exploration(explore, mix_rate=0.1)  # paper-1.5b's rate

        def run(tokens: int):
            return generate(model, prompts.tolist(), Sampling(max_new_tokens=tokens), exploration,
                            neighbor_table=table, seed=seed, cuda_graph=cuda_graph)
        return run

    return {"ours": ours("none", graphed), "ours_neighbor": ours("neighbor", graphed),
            "ours_eager": ours("none", False), "transformers": lambda tokens: hf_generate(twin, prompts, tokens)}


def hf_generate(twin, prompts, tokens: int):
    """transformers' `generate` of exactly `tokens` new tokens for each row of `prompts` [B, P], sampled at
    temperature 1 with no top-k or top-p, as ours samples."""
    ids = prompts.to(twin.device)
    return twin.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_p=1.0,
                         top_k=0, max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=0)


HF_SAMPLED_STEPS = (8, 40)  # the two lengths of the sampled estimate's generates: 32 decode steps apart


def hf_sampled(twin, device, batch: int, prompt_len: int, new_tokens: int, repeats: int, seed: int) -> dict:
    """transformers' whole rollout where running it would take too long: its prefill of the real prompts plus
    `new_tokens` times its seconds per decode step at the rollout's mean window. That step is the difference of
    two generates from prompts of the mean window's length, 8 and 40 new tokens (the prefill cancels), each
    after an untimed one at the same shapes (transformers' first run at new shapes is far slower: the benefit
    of the doubt, as its whole-run warm-up). Its step grows with the window, near linearly (each step
    concatenates to a dynamic cache), so the step at the mean window is the mean step."""
    generator = torch.Generator().manual_seed(seed)
    vocab = twin.config.vocab_size
    mean_window = prompt_len + new_tokens // 2
    at_window = torch.randint(0, vocab, (batch, mean_window), generator=generator)
    prompts = torch.randint(0, vocab, (batch, prompt_len), generator=generator)
    few, many = HF_SAMPLED_STEPS
    timed = {"few": [], "many": [], "prefill": []}
    hf_generate(twin, at_window, many)  # untimed: the first run at these shapes
    hf_generate(twin, prompts, 1)
    for _ in range(repeats):
        timed["few"].append(seconds_of(device, lambda: hf_generate(twin, at_window, few)))
        timed["many"].append(seconds_of(device, lambda: hf_generate(twin, at_window, many)))
        timed["prefill"].append(seconds_of(device, lambda: hf_generate(twin, prompts, 1)))
    step_s = (statistics.median(timed["many"]) - statistics.median(timed["few"])) / (many - few)
    if step_s <= 0:  # noise larger than 32 steps: no estimate rather than a wrong one
        raise RuntimeError(f"{many} new tokens took no longer than {few} ({timed}): no step time to estimate from")
    prefill_s = statistics.median(timed["prefill"])
    seconds = prefill_s + new_tokens * step_s
    return {"tokens_per_s": round(batch * new_tokens / seconds, 1), "estimated_s": round(seconds, 3),
            "estimated": f"prefill + {new_tokens} x the decode step at the mean window {mean_window}, from "
                         f"{few}- and {many}-token generates", "step_ms": round(1000 * step_s, 3),
            "prefill_s": round(prefill_s, 3)}


def compile_seconds() -> float:
    """Seconds torch.compile has spent in this process so far (tracing and the backend's compile, for every
    function), by dynamo's own timer; 0 where this torch does not keep it."""
    import torch._dynamo.utils  # torch.compile's machinery: seconds to import, so only when asked

    return sum(getattr(torch._dynamo.utils, "compilation_time_metrics", {}).get("_compile.compile_inner", []))


def predicted_s(grid: Grid, impl: str, batch: int, window: float, steps: int) -> float:
    """Seconds of `steps` decode steps of `impl` at `batch` rows and mean window: for ours, from the graphed step
    measured at these rows and at least this window (+20%); else from its slowest measured seconds per step so
    far, scaled up (never down) for more rows (by the square root: a step's weights are read once whatever the
    rows) and for longer windows (linearly: pessimistic where the weights dominate); 0 when nothing ran yet."""
    graphed = [w for (b, w) in grid.step_s if b == batch]  # ours: the graphed step measured at these rows
    if impl in ("ours", "ours_neighbor") and graphed:
        at = min([w for w in graphed if w >= window] or [max(graphed)])
        return steps * grid.step_s[(batch, at)] * 1.2  # a rollout's step: within 20% of the graphed step
    if impl not in grid.seconds_per_step:
        return 0.0
    per_step, (batch0, window0) = grid.seconds_per_step[impl], grid.measured_at[impl]
    return steps * per_step * max(1.0, batch / batch0) ** 0.5 * max(1.0, window / window0)


def rollouts(model, twin, device, batch: int, prompt_len: int, new_tokens: int, impls: list[str], repeats: int,
             grid: Grid, seed: int, hf_warm_up: str, hf_whole_max_s: float | None = None) -> dict[str, float]:
    """Whole rollouts of `batch` prompts x `new_tokens` for each implementation, interleaved; transformers'
    estimated from sampled steps instead (hf_sampled) where its whole runs are predicted to take over
    hf_whole_max_s. Returns {impl: median seconds} of the whole runs."""
    vocab = model.cfg.vocab_size
    prompts = torch.randint(0, vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(seed))
    runs = implementations(model, twin, prompts, seed)
    graphed = device.type == "cuda"
    base = {"part": "rollout", "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens}
    # Warm-ups: ours, a short run (the first in the process compiles and captures: the cold start, reported;
    # later calls reuse the graphs); transformers, a whole run with --hf-warm-up whole (its first run at a length
    # is far slower: 37.6 s then 15.9 s at batch 64 x 512 on an H200; the baseline gets the benefit of the
    # doubt) or a short one.
    warm_tokens = {impl: new_tokens if impl == "transformers" and hf_warm_up == "whole" else 32 for impl in impls}
    window = prompt_len + new_tokens / 2
    chosen, predicted, sampled = [], 0.0, False
    for impl in impls:  # in priority order, each predicted from its own seconds per step so far
        if impl == "ours_eager" and not graphed:
            continue
        alone = predicted_s(grid, impl, batch, window, repeats * new_tokens + warm_tokens[impl])
        if impl == "transformers" and hf_whole_max_s is not None and alone > hf_whole_max_s:
            alone = predicted_s(grid, impl, batch, window, (repeats + 1) * sum(HF_SAMPLED_STEPS))
            sampled = grid.fits(predicted + alone, {**base, "impl": impl, "estimated": True})
            predicted += alone if sampled else 0.0
        elif grid.fits(predicted + alone, {**base, "impl": impl}):
            chosen.append(impl)
            predicted += alone
    warm_s = {}
    for impl in chosen:
        def warm(impl=impl):
            cold, compiling = not grid.warmed, compile_seconds()
            grid.warmed = True
            seconds = seconds_of(device, lambda: runs[impl](warm_tokens[impl]))
            warm_s[impl] = (round(seconds, 2), cold, round(compile_seconds() - compiling, 2))
        grid.attempt({**base, "impl": impl, "phase": "warm-up"}, warm)
    seconds = {impl: [] for impl in chosen if impl in warm_s}  # one whose warm-up failed is not timed
    peaks = {}
    for _ in range(repeats):
        for impl in list(seconds):
            if not grid.fits(predicted_s(grid, impl, batch, window, new_tokens), {**base, "impl": impl}):
                continue  # the budget ran out after all: the runs already made still count

            def timed(impl=impl):
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                seconds[impl].append(seconds_of(device, lambda: runs[impl](new_tokens)))
                if device.type == "cuda":
                    peaks[impl] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
            grid.attempt({**base, "impl": impl}, timed)
            if len(seconds[impl]) == 0:
                del seconds[impl]  # it failed: not again
            else:
                grid.record(impl, max(seconds[impl]) / new_tokens, batch, window)
    medians = {}
    for impl, timings in seconds.items():
        medians[impl] = median = statistics.median(timings)
        graph = impl not in ("ours_eager", "transformers") and graphed
        emit({"bench": "rollout_grid", **base, "impl": impl, "cuda_graph": graph,
              "tokens_per_s": round(batch * new_tokens / median, 1), "median_s": round(median, 3),
              "runs_s": [round(t, 3) for t in timings], "warm_up_s": warm_s[impl][0],
              "warm_up_cold_start": warm_s[impl][1], "warm_up_compile_s": warm_s[impl][2],
              "warm_up_tokens": warm_tokens[impl],
              "peak_gib": peaks.get(impl)})
    if sampled:
        def estimate():
            line = hf_sampled(twin, device, batch, prompt_len, new_tokens, repeats, seed)
            grid.record("transformers", line["step_ms"] / 1000, batch, window)
            emit({"bench": "rollout_grid", **base, "impl": "transformers", "cuda_graph": False, **line})
        grid.attempt({**base, "impl": "transformers", "estimated": True}, estimate)
    return medians


def profile_step(model, device, batch: int, window: int, out: str | None, grid: Grid) -> None:
    """torch.profiler over ten eager decode steps (sampling included): the kernels by their device time (CPU:
    by CPU time)."""
    if not grid.fits(0, {"part": "profile"}):
        return
    decoder, key = busy_decoder(model, batch, window, cuda_graph=False)
    decoder.state.prompt_len.fill_(window - 11)
    for _ in range(3):
        decoder.step(model, key, window)
    sync(device)
    decoder.state.length.zero_()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(10):
            decoder.step(model, key, window)
        sync(device)
    key = "device_time_total" if device.type == "cuda" else "cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=25)
    note(f"profile of 10 eager decode steps, batch {batch}, window {window}:\n{table}")
    if out:
        with open(out, "w") as f:
            f.write(table)


def bench_rollout_grid(args: argparse.Namespace) -> None:
    grid = Grid(args.budget_s)
    device = torch.device(args.device)
    facts = {"bench": "rollout_grid", "part": "machine", "device": device.type, "torch": torch.__version__}
    if device.type == "cuda":
        facts.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda)
    measured = ceilings(device, args.copy_gib)
    emit({**facts, **measured})
    bandwidth = measured["copy_gb_per_s"]
    model = random_model(shape_config(args.shape), dtype=torch_dtype(device), device=device, seed=0).eval()
    twin = transformers_twin(model)
    impls = [impl.strip() for impl in args.impls.split(",")]
    configs = [(batch, new_tokens, args.repeats) for new_tokens in args.new_tokens for batch in args.batches]
    if args.configs:  # BATCHxTOKENS[xREPEATS], in the order given
        configs = [tuple(int(n) for n in c.split("x")) + (args.repeats,) * (c.count("x") == 1)
                   for c in args.configs]
    with torch.no_grad():
        for index, (batch, new_tokens, repeats) in enumerate(configs):
            medians = {}
            grid.attempt({"part": "rollout", "batch": batch, "new_tokens": new_tokens}, lambda: medians.update(
                rollouts(model, twin, device, batch, args.prompt_len, new_tokens, impls, repeats, grid, args.seed,
                         args.hf_warm_up, args.hf_whole_max_s)))
            if "ours" in medians and not args.skip_steps:  # the rollout's step against the graphed step alone
                mean_window = args.prompt_len + new_tokens // 2
                steps = {}
                grid.attempt({"part": "rollout_vs_step"}, lambda: steps.update(decode_steps(
                    model, device, batch, args.prompt_len + new_tokens, args.step_repeats, bandwidth, grid,
                    windows=[mean_window])))
                if mean_window in steps:
                    per_token = medians["ours"] / new_tokens
                    emit({"bench": "rollout_grid", "part": "rollout_vs_step", "batch": batch,
                          "new_tokens": new_tokens, "rollout_ms_per_step": round(1000 * per_token, 3),
                          "graphed_step_ms": round(1000 * steps[mean_window], 3), "mean_window": mean_window,
                          "ratio": round(per_token / steps[mean_window], 3)})
            if index == 0 and not args.skip_steps:
                longest = args.prompt_len + max(c[1] for c in configs)
                grid.attempt({"part": "decode_step"}, lambda: decode_steps(
                    model, device, args.batch_for_steps, longest, args.step_repeats, bandwidth, grid,
                    both_layouts=True))
                grid.attempt({"part": "profile"}, lambda: profile_step(
                    model, device, args.batch_for_steps, args.prompt_len + new_tokens, args.profile_out, grid))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    note(f"rollout-grid: {time.perf_counter() - grid.start:.0f} s of a {args.budget_s:.0f} s budget")


def add_parser(subparsers) -> None:
    grid = subparsers.add_parser("rollout-grid", help="the sampler at the real shape on a GPU: ceilings, decode step "
                                 "vs its memory floor, tokens/s vs transformers, in one budgeted process")
    grid.add_argument("--device", type=device_arg, default="cuda",
                      help="cuda (cpu, with --shape tiny: a small check of the harness itself)")
    grid.add_argument("--shape", default="1.5b", choices=["tiny", *SHAPES],
                      help="the real R1-Distill config from ../shared with random weights, or the tiny preset")
    grid.add_argument("--batches", type=at_least_1, nargs="+", default=[64, 256], help="rows decoded together")
    grid.add_argument("--new-tokens", type=at_least_1, nargs="+", default=[512, 4096],
                      help="tokens generated per row (no early stop), shortest first")
    grid.add_argument("--configs", nargs="+", default=None, metavar="BxN[xR]",
                      help="instead of --batches x --new-tokens: these rows x new tokens (x repeats), in this order")
    grid.add_argument("--skip-steps", action="store_true", help="rollouts only: no decode-step floors or profile")
    grid.add_argument("--prompt-len", type=at_least_1, default=256, help="tokens per prompt")
    grid.add_argument("--impls", default="ours,ours_neighbor,ours_eager,transformers",
                      help="comma-separated: ours (the library's default: graphed on a GPU), ours_neighbor (the "
                           "same with neighbor mixing at rate 0.1), ours_eager (no CUDA graph), transformers")
    grid.add_argument("--hf-warm-up", choices=["whole", "short"], default="whole",
                      help="transformers' warm-up: a whole run at each length (its first run there is far "
                           "slower) or a 32-token one")
    grid.add_argument("--hf-whole-max-s", type=float, default=None,
                      help="transformers' whole rollouts (warm-up and repeats) predicted to take longer than this "
                           "are estimated instead: its prefill + the new tokens x its decode step at the mean "
                           "window, timed from two short generates (a line with an \"estimated\" field)")
    grid.add_argument("--repeats", type=at_least_1, default=2, help="timed rollouts per configuration (median)")
    grid.add_argument("--batch-for-steps", type=at_least_1, default=64, help="rows of the decode-step measurements")
    grid.add_argument("--step-repeats", type=at_least_1, default=20, help="timed decode steps per window")
    grid.add_argument("--copy-gib", type=above_0, default=2.0, help="the copy-bandwidth buffer (GiB)")
    grid.add_argument("--budget-s", type=above_0, default=300.0,
                      help="skip what would not finish within this many seconds of the start")
    grid.add_argument("--profile-out", default=None, help="also write the profiler table to this file")
    grid.add_argument("--seed", type=int, default=0, help="prompts and sampling draws")
    grid.set_defaults(run=bench_rollout_grid)
