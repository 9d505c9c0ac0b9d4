"""`python bench.py rollout-grid`: the sampler at the real shape on a GPU, everything issue 28 asks of it, in
one process and one device call.

1. The machine's two ceilings, measured here: device-to-device copy bandwidth (bytes read + written) and a
   large bf16 matrix product.
2. The decode step (rollout.DecodeStep) at --batch-for-steps rows for each attention window up to the longest
   prompt + response, graphed and eager, against its memory floor: the bytes one step must read (every weight
   but the input embedding, whose B rows are gathered; the K and V of the window) and write (fp32 logits), over
   the copy bandwidth from 1.
3. Tokens/s of whole rollouts (prefill included, every row to its length: no stop ids) for each batch x length:
   ours graphed without and with neighbor mixing, ours eager, transformers' `generate`; interleaved
   (round-robin), so that drift in the machine's speed hits all alike. Two experiments measure fixes before the
   library takes them: ours_compiled (the step under torch.compile) and ours_fused (fused projections).
4. A torch.profiler summary of one eager decode step's kernels, to say where a gap to the floor goes.

Device time is scarce, so the grid is ordered by priority and runs under --budget-s: a measurement whose time,
predicted from what already ran, would not fit is skipped with a `"skipped"` line saying so. A configuration
that fails prints its traceback and the grid goes on. One JSON line per measurement on stdout.
"""

import argparse
import contextlib
import statistics
import time
import traceback

from benchmarks.common import SHAPES, emit, note, shape_config, sync, torch_dtype, transformers_twin


def seconds_of(device, run) -> float:
    """Wall seconds of run(), the device's queued work included (synchronised before and after)."""
    sync(device)
    start = time.perf_counter()
    run()
    sync(device)
    return time.perf_counter() - start


def ceilings(device, gib: float) -> dict:
    """Copy bandwidth (GB/s, read + write) over a gib-GiB buffer, and bf16 (GPU) / fp32 (CPU) matmul TFLOP/s."""
    import torch

    source = torch.empty(int(gib * 2**30) // 2, dtype=torch.bfloat16, device=device).normal_()
    target = torch.empty_like(source)
    n = 4096 if device.type == "cpu" else 8192
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
                import torch

                torch.cuda.empty_cache()


def decode_steps(model, device, batch: int, max_len: int, repeats: int, bandwidth: float, grid: Grid) -> None:
    """Each window's decode step, graphed (on CUDA) and eager, against the memory floor."""
    import torch

    import rollout
    from rollout import DecodeStep

    cache = model.new_cache(batch, max_len)
    inputs = torch.randn(batch, model.cfg.hidden_size, device=device, dtype=torch_dtype(device)) * 0.02
    modes = [True, False] if device.type == "cuda" else [False]
    steps = {graphed: DecodeStep(model, cache, cuda_graph=graphed) for graphed in modes}
    window = rollout.MIN_WINDOW
    while True:
        window = min(window, max_len)
        positions = torch.full((batch,), window - 1, device=device)
        floor = step_bytes(model, batch, window)
        for graphed, step in steps.items():
            what = {"part": "decode_step", "batch": batch, "window": window, "cuda_graph": graphed}
            if not grid.fits(0, what):
                return
            timings = [seconds_of(device, lambda: step(inputs, positions, window)) for _ in range(repeats + 3)]
            median = statistics.median(timings[3:])
            floor_s = floor["total"] / (bandwidth * 1e9)
            emit({"bench": "rollout_grid", **what, "median_ms": round(1000 * median, 3),
                  "min_ms": round(1000 * min(timings[3:]), 3), "floor_ms": round(1000 * floor_s, 3),
                  # graphed: the capture (two warm-up steps, then the recording) that every rollout pays once
                  # per window, since each generate call builds its own cache and graphs
                  "first_call_ms": round(1000 * timings[0], 3),
                  "over_floor": round(median / floor_s, 2), "bytes_weights": floor["weights"],
                  "bytes_kv": floor["kv"], "bytes_logits": floor["logits"], "copy_gb_per_s": bandwidth})
        if window == max_len:
            break
        window *= 2
    del steps, cache


def implementations(model, twin, prompts, seed: int) -> dict:
    """impl -> a function of the number of new tokens that runs one whole rollout of `prompts` [B, P]."""
    import torch

    from neighbors import build_neighbor_table
    from rollout import Exploration, Sampling, generate

    table = build_neighbor_table(model.output_weight, 1)
    graphed = model.output_weight.device.type == "cuda"

    def ours(explore: str, cuda_graph: bool, compiled: bool = False, fused: bool = False):
        exploration = Exploration(explore, mix_rate=0.1)  # paper-1.5b's rate

        def run(tokens: int):
            with (compiled_decode_step() if compiled else contextlib.nullcontext(),
                  fused_projections(model) if fused else contextlib.nullcontext()):
                return generate(model, prompts.tolist(), Sampling(max_new_tokens=tokens), exploration,
                                neighbor_table=table, seed=seed, cuda_graph=cuda_graph)
        return run

    def theirs(tokens: int):
        ids = prompts.to(model.output_weight.device)
        return twin.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_p=1.0,
                             top_k=0, max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=0)

    return {"ours": ours("none", graphed), "ours_neighbor": ours("neighbor", graphed),
            "ours_eager": ours("none", False), "ours_compiled": ours("none", graphed, compiled=True),
            "ours_fused": ours("none", graphed, fused=True),
            "transformers": theirs}


def rollouts(model, twin, device, batch: int, prompt_len: int, new_tokens: int, impls: list[str], repeats: int,
             grid: Grid, seed: int) -> None:
    """Whole rollouts of `batch` prompts x `new_tokens` for each implementation, interleaved."""
    import torch

    vocab = model.cfg.vocab_size
    prompts = torch.randint(0, vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(seed))
    runs = implementations(model, twin, prompts, seed)
    graphed = device.type == "cuda"
    base = {"part": "rollout", "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens}
    # Warm-ups: ours, a short run (kernels chosen, workspaces allocated; its graphs are captured in every call,
    # so capture is part of each timed run); transformers, a whole run: its first run at a length is far slower
    # (37.6 s then 15.9 s at batch 64 x 512 on an H200), and the baseline gets the benefit of the doubt;
    # ours_compiled, a whole run: it compiles once per attention window (the warm-up line reports how long).
    warm_tokens = {impl: new_tokens if impl in ("transformers", "ours_compiled") else 32 for impl in impls}
    chosen, predicted = [], 0.0
    for impl in impls:  # in priority order, each predicted from its own seconds per step so far
        if impl == "ours_eager" and not graphed:
            continue
        per_step = grid.seconds_per_step.get(impl)
        alone = (repeats + warm_tokens[impl] / new_tokens) * new_tokens * per_step if per_step else 0.0
        if grid.fits(predicted + alone, {**base, "impl": impl}):
            chosen.append(impl)
            predicted += alone
    warm_s = {}
    for impl in chosen:
        def warm(impl=impl):
            warm_s[impl] = round(seconds_of(device, lambda: runs[impl](warm_tokens[impl])), 2)
        grid.attempt({**base, "impl": impl, "phase": "warm-up"}, warm)
    seconds = {impl: [] for impl in chosen if impl in warm_s}  # one whose warm-up failed is not timed
    peaks = {}
    for _ in range(repeats):
        for impl in list(seconds):

            def timed(impl=impl):
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                seconds[impl].append(seconds_of(device, lambda: runs[impl](new_tokens)))
                if device.type == "cuda":
                    peaks[impl] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
            grid.attempt({**base, "impl": impl}, timed)
            if len(seconds[impl]) == 0:
                del seconds[impl]  # it failed: not again
    for impl, timings in seconds.items():
        median = statistics.median(timings)
        grid.seconds_per_step[impl] = max(grid.seconds_per_step.get(impl, 0.0), median / new_tokens)
        graph = impl not in ("ours_eager", "transformers") and graphed
        emit({"bench": "rollout_grid", **base, "impl": impl, "cuda_graph": graph,
              "tokens_per_s": round(batch * new_tokens / median, 1), "median_s": round(median, 3),
              "runs_s": [round(t, 3) for t in timings], "warm_up_s": warm_s.get(impl),
              "warm_up_tokens": warm_tokens[impl], "peak_gib": peaks.get(impl)})


_COMPILED = {}


@contextlib.contextmanager
def compiled_decode_step():
    """rollout.DecodeStep's forward under torch.compile for the duration (an experiment, not the library's
    path yet): inductor fuses the step's chains of small kernels (RMSNorm in fp32, RoPE, SiLU x up, residual
    adds: 2.1 of the 4.9 ms of a batch-64 step on an H200), and the CUDA graph captures the fused kernels. It
    recompiles once for a second window size, then treats the window as dynamic."""
    from unittest import mock

    import torch

    from rollout import DecodeStep

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    if "forward" not in _COMPILED:
        _COMPILED["forward"] = torch.compile(DecodeStep._forward)
    with mock.patch.object(DecodeStep, "_forward", _COMPILED["forward"]):
        yield


class FusedProduct:
    """Linear layers that read the same input, as one matrix product over their concatenated weights (a copy)."""

    def __init__(self, linears):
        import torch

        if len({linear.bias is None for linear in linears}) != 1:
            raise ValueError("fused layers must all have a bias or all have none")
        self.weight = torch.cat([linear.weight for linear in linears])
        self.bias = None if linears[0].bias is None else torch.cat([linear.bias for linear in linears])
        self.sizes = [linear.out_features for linear in linears]
        self.outputs = ()


def fused_part(fused: FusedProduct, index: int):
    """A module standing in for the index-th fused layer: the first computes the product for all of them, the
    others return their slice of it. Their caller must call them in order on the same input, as
    Attention.forward (q, k, v) and MLP.forward (gate, up) do."""
    import torch.nn.functional as F
    from torch import nn

    class Part(nn.Module):
        def forward(self, x):
            if index == 0:
                fused.outputs = F.linear(x, fused.weight, fused.bias).split(fused.sizes, dim=-1)
            return fused.outputs[index]

    return Part()


@contextlib.contextmanager
def fused_projections(model):
    """Each layer's q/k/v projections as one matrix product, and its gate/up as another, for the duration (an
    experiment, not the library's path yet): at batch 64 a decode step's matrix products took 2.2x their
    weights' memory floor on an H200, and the k and v products (256 of 1,536 columns each at 1.5B) are the
    smallest. The library's modules are put back on exit."""
    swapped = []
    try:
        for layer in model.layers:
            for owner, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj")),
                                 (layer.mlp, ("gate_proj", "up_proj"))):
                fused = FusedProduct([getattr(owner, name) for name in names])
                for index, name in enumerate(names):
                    swapped.append((owner, name, getattr(owner, name)))
                    setattr(owner, name, fused_part(fused, index))
        yield
    finally:
        for owner, name, linear in swapped:
            setattr(owner, name, linear)


def profile_step(model, device, batch: int, window: int, out: str | None, grid: Grid) -> None:
    """torch.profiler over ten eager decode steps: the kernels by their device time (CPU: by CPU time)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from rollout import DecodeStep

    if not grid.fits(0, {"part": "profile"}):
        return
    cache = model.new_cache(batch, window)
    step = DecodeStep(model, cache, cuda_graph=False)
    inputs = torch.randn(batch, model.cfg.hidden_size, device=device, dtype=torch_dtype(device)) * 0.02
    positions = torch.full((batch,), window - 1, device=device)
    for _ in range(3):
        step(inputs, positions, window)
    sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(10):
            step(inputs, positions, window)
        sync(device)
    key = "device_time_total" if device.type == "cuda" else "cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=20)
    note(f"profile of 10 eager decode steps, batch {batch}, window {window}:\n{table}")
    if out:
        with open(out, "w") as f:
            f.write(table)


def bench_rollout_grid(args: argparse.Namespace) -> None:
    import torch

    from model import random_model

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
    with torch.no_grad():
        if not args.skip_steps:
            grid.attempt({"part": "decode_step"}, lambda: decode_steps(
                model, device, args.batch_for_steps, args.prompt_len + max(args.new_tokens), args.step_repeats,
                bandwidth, grid))
            profile_window = args.prompt_len + min(args.new_tokens)  # the first grid row's longest window
            grid.attempt({"part": "profile"}, lambda: profile_step(
                model, device, args.batch_for_steps, profile_window, args.profile_out, grid))
        configs = [(batch, new_tokens, args.repeats) for new_tokens in args.new_tokens for batch in args.batches]
        if args.configs:  # BATCHxTOKENS[xREPEATS], in the order given
            configs = [tuple(int(n) for n in c.split("x")) + (args.repeats,) * (c.count("x") == 1)
                       for c in args.configs]
        for batch, new_tokens, repeats in configs:
            grid.attempt({"part": "rollout", "batch": batch, "new_tokens": new_tokens}, lambda: rollouts(
                model, twin, device, batch, args.prompt_len, new_tokens, impls, repeats, grid, args.seed))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    note(f"rollout-grid: {time.perf_counter() - grid.start:.0f} s of a {args.budget_s:.0f} s budget")


def add_parser(subparsers) -> None:
    grid = subparsers.add_parser("rollout-grid", help="the sampler at the real shape on a GPU: ceilings, decode step "
                                 "vs its memory floor, tokens/s vs transformers, in one budgeted process")
    grid.add_argument("--device", default="cuda", help="cuda (cpu: a small check of the harness itself)")
    grid.add_argument("--shape", default="1.5b", choices=["tiny", *SHAPES],
                      help="the real R1-Distill config from ../shared with random weights, or the tiny preset")
    grid.add_argument("--batches", type=int, nargs="+", default=[64, 256], help="rows decoded together")
    grid.add_argument("--new-tokens", type=int, nargs="+", default=[512, 4096],
                      help="tokens generated per row (no early stop), shortest first")
    grid.add_argument("--configs", nargs="+", default=None, metavar="BxN[xR]",
                      help="instead of --batches x --new-tokens: these rows x new tokens (x repeats), in this order")
    grid.add_argument("--skip-steps", action="store_true", help="rollouts only: no decode-step floors or profile")
    grid.add_argument("--prompt-len", type=int, default=256, help="tokens per prompt")
    grid.add_argument("--impls", default="ours,ours_neighbor,ours_eager,transformers",
                      help="comma-separated: ours (graphed), ours_neighbor (graphed, mixing at rate 0.1), "
                           "ours_eager, ours_compiled (graphed, the step under torch.compile), ours_fused "
                           "(graphed, q/k/v and gate/up each one matrix product), transformers")
    grid.add_argument("--repeats", type=int, default=2, help="timed rollouts per configuration (median)")
    grid.add_argument("--batch-for-steps", type=int, default=64, help="rows of the decode-step measurements")
    grid.add_argument("--step-repeats", type=int, default=20, help="timed decode steps per window")
    grid.add_argument("--copy-gib", type=float, default=2.0, help="the copy-bandwidth buffer (GiB)")
    grid.add_argument("--budget-s", type=float, default=300.0,
                      help="skip what would not finish within this many seconds of the start")
    grid.add_argument("--profile-out", default=None, help="also write the profiler table to this file")
    grid.add_argument("--seed", type=int, default=0, help="prompts and sampling draws")
    grid.set_defaults(run=bench_rollout_grid)
