"""`python bench.py manifest`: hashing a checkpoint for its manifest (runtime/checkpoint.py), every block on every core
(`tree_digests`, what the manifest records) against one whole-file SHA-256 stream per file (`sha256_of`, what
manifests recorded before), over random files shaped like a checkpoint's (AdamW state, weights, small files)."""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import above_0, at_least_1, emit
from runtime import checkpoint


def bench_manifest(args: argparse.Namespace) -> None:
    if args.dir is not None and not Path(args.dir).is_dir():
        sys.exit(f"error: --dir {args.dir}: no such folder (the random files are written in it)")
    sizes = {"optimizer.pt": 2 / 3, "model.safetensors": 1 / 3}  # AdamW's two moments are twice the weights
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        paths = []
        for name, share in sizes.items():
            path = Path(directory) / name
            with open(path, "wb") as f:  # random bytes, 64 MiB at a time (a file of zeros could be sparse)
                for _ in range(max(1, round(args.gb * share * 2**30 / (64 << 20)))):
                    f.write(os.urandom(64 << 20))
            paths.append(path)
        total = sum(p.stat().st_size for p in paths)
        runs = {"whole_file_streams": lambda: [checkpoint.sha256_of(p) for p in paths],
                "block_tree_threads": lambda: checkpoint.tree_digests(paths)}
        seconds = {name: [] for name in runs}
        for _ in range(args.repeats):  # round-robin; the files stay in the page cache, as right after a write
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                seconds[name].append(time.perf_counter() - start)
    for name, timings in seconds.items():
        median = statistics.median(timings)
        emit({"bench": "manifest", "impl": name, "gb": round(total / 1e9, 2), "cpus": os.cpu_count(),
              "median_s": round(median, 2), "gb_per_s": round(total / 1e9 / median, 2),
              "runs_s": [round(t, 2) for t in timings]})


def add_parser(subparsers) -> None:
    manifest = subparsers.add_parser("manifest", help="a checkpoint's hashing: block digests on every core vs one "
                                     "SHA-256 stream per file")
    manifest.add_argument("--gb", type=above_0, default=4.0, help="GiB of random files (1.5B's checkpoint: ~20)")
    manifest.add_argument("--repeats", type=at_least_1, default=3, help="timed runs of each (median reported)")
    manifest.add_argument("--dir", default=None, help="where the files go (default: the system's temp directory)")
    manifest.set_defaults(run=bench_manifest)
