"""`python bench.py fingerprint`: five short training runs of the tiny preset, each reduced to what a refactor must
not change: a SHA-256 over every tensor of the final weights (name, dtype, shape and bytes, in name order) and one
over metrics.jsonl without its timings. A change meant to preserve behaviour prints the same five lines before and
after; one line per run, so a difference names the code path it touched.

The runs cover the paths a step takes: N-GRPO with a KL reference, a warm start and refilled rollout slots; plain
GRPO; Soft Thinking; STHT-style noise; and a strategy whose noise the replay redraws from recorded keys."""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, at_least_1, dies_with_parent, emit, note

# The first run warm-starts the random tiny model until it answers a third of the problems (so that rewards, hence
# gradients, differ between runs); the others start from its warm-start weights.
DATA = ["--data", "arith:max_count=5", "--instruction", ""]
WARM = ["--sft-steps", "150", "--sft-lr", "3e-3", "--sft-target-accuracy", "0"]
RUNS = {
    "neighbor-kl-warm-refill": ["--explore", "neighbor", "--kl-coef", "0.01", *WARM, "--rollout-batch-size", "24"],
    "none": ["--explore", "none"],
    "soft": ["--explore", "soft", "--soft-top-k", "4"],
    "gaussian": ["--explore", "gaussian", "--mix-rate", "0.5", "--soft-top-k", "3"],
    "orthogonal-noise": ["--explore", "orthogonal_noise", "--mix-rate", "0.5", "--soft-top-k", "3"],
}
TIMING_KEYS = ("_s", "tokens_per_s")  # metrics that measure time, not behaviour


def weights_digest(checkpoint: Path) -> str:
    import torch
    from safetensors import safe_open

    digest = hashlib.sha256()
    with safe_open(str(checkpoint / "model.safetensors"), framework="pt") as f:
        for name in sorted(f.keys()):
            tensor = f.get_tensor(name).contiguous()
            digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
            digest.update(tensor.view(-1).view(dtype=torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def metrics_digest(path: Path, leave_out: tuple[str, ...] = ()) -> str:
    """metrics.jsonl without timings, and without the keys that start with one of leave_out (metrics added since a
    hash was taken: the ones it had must be unchanged)."""
    lines = []
    for line in path.read_text().splitlines():
        record = {k: v for k, v in json.loads(line).items()
                  if not k.endswith(TIMING_KEYS) and not (leave_out and k.startswith(leave_out))}
        lines.append(json.dumps(record, sort_keys=True))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def bench_fingerprint(args: argparse.Namespace) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as root:
        warm = Path(root) / "neighbor-kl-warm-refill" / "warm_start"
        for name, flags in RUNS.items():
            out = Path(root) / name
            model = [] if name == "neighbor-kl-warm-refill" else ["--model", str(warm), "--tokenizer", "tiny"]
            command = [sys.executable, str(ROOT / "train.py"), "--preset", "tiny", "--max-steps", str(args.steps),
                       "--out-dir", str(out), "--device", "cpu", *DATA, *model, *flags]
            start = time.perf_counter()
            done = subprocess.run(command, preexec_fn=dies_with_parent, cwd=ROOT, env=env, capture_output=True,
                                  text=True)
            if done.returncode:
                note(done.stderr[-2000:])
                sys.exit(f"fingerprint run {name} failed: {' '.join(command)}")
            checkpoint = sorted((out / "checkpoints").iterdir())[-1]
            emit({"bench": "fingerprint", "run": name, "steps": args.steps,
                  "weights_sha256": weights_digest(checkpoint)[:16],
                  "metrics_sha256": metrics_digest(out / "metrics.jsonl", tuple(filter(None,
                                                                                      args.leave_out.split(","))))[:16],
                  "wall_s": round(time.perf_counter() - start, 1)})


def add_parser(subparsers) -> None:
    fingerprint = subparsers.add_parser("fingerprint", help="five tiny training runs hashed (weights, metrics): "
                                        "the same lines before and after a behaviour-preserving change")
    fingerprint.add_argument("--steps", type=at_least_1, default=3, help="training steps of each run")
    fingerprint.add_argument("--leave-out", default="", help="metrics left out of the hash, by the start of their "
                             "key, comma-separated (those added since the hash to compare with was taken)")
    fingerprint.set_defaults(run=bench_fingerprint)
