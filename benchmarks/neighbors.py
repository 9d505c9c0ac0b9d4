"""`python bench.py neighbors`: the neighbor table (neighbors.py) over a random model's output matrix."""

import argparse
import statistics
import time

import torch

from benchmarks.common import SHAPES, at_least_1, device_arg, emit, peak_mem_mb, shape_config
from model import random_model
from neighbors import build_neighbor_table


def bench_neighbors(args: argparse.Namespace) -> None:
    """build_neighbor_table over the output matrix of a random model of the given shape, in the dtype the
    sampler holds it (bf16 on CUDA, fp32 on CPU). No disk cache: every run searches."""
    device = torch.device(args.device)
    shape = args.shape or ("1.5b" if device.type == "cuda" else "tiny")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    weight = random_model(shape_config(shape), dtype=dtype, device=device, seed=0).output_weight.detach()

    def build():
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        build_neighbor_table(weight, args.k, args.metric)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    first = build()  # includes one-off costs (cuBLAS handles, kernel selection)
    seconds = [build() for _ in range(args.repeats)]
    # peak_mem_mb: on CUDA the allocator's peak during the last build above the matrix itself; on CPU the
    # process's peak RSS.
    weight_mb = weight.numel() * weight.element_size() / 2**20 if device.type == "cuda" else 0.0
    emit({"bench": "neighbors", "device": device.type, "shape": shape, "vocab": weight.shape[0],
          "dim": weight.shape[1], "dtype": str(dtype).removeprefix("torch."), "k": args.k, "metric": args.metric,
          "first_s": round(first, 4), "median_s": round(statistics.median(seconds), 4),
          "min_s": round(min(seconds), 4), "repeats": args.repeats,
          "peak_mem_mb": round(peak_mem_mb(device) - weight_mb, 1)})


def add_parser(subparsers) -> None:
    neighbors = subparsers.add_parser("neighbors", help="the neighbor table over a real-shape output matrix")
    neighbors.add_argument("--device", type=device_arg, default="cpu",
                           help="cpu (fp32 matrix) or cuda (bf16 matrix, as the sampler's)")
    neighbors.add_argument("--shape", default=None, choices=["tiny", *SHAPES],
                           help="tiny preset, or the real R1-Distill config from ../shared with random weights "
                                "(default: tiny on cpu, 1.5b on cuda; 1.5b on cpu takes ~11 minutes)")
    neighbors.add_argument("--k", type=at_least_1, default=2, help="neighbors per row")
    neighbors.add_argument("--metric", default="cosine", choices=["cosine", "dot", "l2", "l1"])
    neighbors.add_argument("--repeats", type=at_least_1, default=3,
                           help="timed builds after a first one (median reported)")
    neighbors.set_defaults(run=bench_neighbors)
