"""`python bench.py torchrun-check`: train.py under `torchrun --nproc-per-node 1` against the same run in one plain
process, on a GPU. A world of one still builds a process group and shards the policy with FSDP2, so this runs
NCCL, the bf16 mixed-precision policy, the sampler copy gathered from DTensors and the checkpoint gather on
CUDA, which CI (CPU, gloo) cannot. Three processes of the same config: plain for --steps steps; torchrun for --steps
steps (a checkpoint every step); torchrun resumed from a copy of that run cut back to its step --steps - 1 (its
later checkpoints deleted, as if it had stopped there), for the last step. One JSON line per
comparison: the largest difference of each step's metrics (timings left out) and of the final weights, against
the size of the training update itself (the weights' change from the first checkpoint to the last).

    python bench.py torchrun-check --preset tiny                 # seconds
    python bench.py torchrun-check --preset paper-1.5b --layers 4  # the real width and vocabulary, random weights
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from safetensors.torch import load_file

from benchmarks import rehearsal
from benchmarks.common import ROOT, at_least_1, device_arg, dies_with_parent, emit, note
from config import preset

TIMING = ("_s", "per_s", "seconds")  # metric names that are timings end so; they differ run to run


def run_train(command: list[str], out_dir: Path, config: Path, extra: list[str]) -> str:
    """Runs train.py so; returns what it printed to stderr (exits with its output if it fails)."""
    full = [*command, str(ROOT / "train.py"), "--config", str(config), "--out-dir", str(out_dir), *extra]
    note("$ " + " ".join(full))
    result = subprocess.run(full, preexec_fn=dies_with_parent, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                            capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"{' '.join(full)} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stderr


def metrics(out_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if isinstance(v, (int, float)) and not k.endswith(TIMING)} for row in rows]


def weights(checkpoint: Path) -> dict:
    state = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        state.update({k: v.float() for k, v in load_file(str(file)).items()})
    return state


def compare(name: str, ours: Path, plain: Path, first: Path) -> dict:
    """The largest metric and weight differences between two runs' outputs, and the update's size."""
    a, b = metrics(ours), metrics(plain)
    worst_metric, worst_key = 0.0, None
    for row_a, row_b in zip(a, b):
        for key in row_a.keys() & row_b.keys():
            diff = abs(row_a[key] - row_b[key])
            if diff > worst_metric:
                worst_metric, worst_key = diff, f"step {row_a.get('step')}: {key} ({row_a[key]} vs {row_b[key]})"
    last = lambda run: sorted((run / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))[-1]
    w_a, w_b, w_0 = weights(last(ours)), weights(last(plain)), weights(first)
    weight_diff = max(float((w_a[k] - w_b[k]).abs().max()) for k in w_b)
    update = max(float((w_b[k] - w_0[k]).abs().max()) for k in w_b)
    identical = [k for k in ("reward_mean", "response_len_mean") if all(r.get(k) == s.get(k) for r, s in zip(a, b))]
    return {"bench": "torchrun_check", "compare": name, "steps": [len(a), len(b)],
            "max_metric_diff": worst_metric, "where": worst_key, "max_weight_diff": weight_diff,
            "update_max_abs": update, "weight_diff_over_update": round(weight_diff / max(update, 1e-30), 4),
            "identical_metrics": identical}


def bench_torchrun_check(args: argparse.Namespace) -> None:
    work = Path(args.work_dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    settings = dict(device=args.device, max_steps=args.steps, save_every=1, keep_last=args.steps, overwrite=True,
                    log_completions_every=0, val_data="", keep_best="", val_before_train=False)
    if args.preset != "tiny":  # the real width and vocabulary at --layers layers, random weights
        checkpoint = rehearsal.random_checkpoint(work, args.layers, args.device)
        settings.update(model=str(checkpoint), tokenizer=str(rehearsal.TOKENIZER), data=str(rehearsal.TRAIN_DATA),
                        prompts_per_step=4, group_size=4, mini_batch_prompts=4, rollout_batch_size=0,
                        micro_batch_size=16, max_new_tokens=args.new_tokens, max_prompt_tokens=256)
    config = work / "config.json"
    replace(preset(args.preset), **settings).save_json(config)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--standalone"]
    plain, dist, resumed = work / "plain", work / "torchrun", work / "resumed"
    first = plain / "checkpoints" / "step-1"
    facts = {"preset": args.preset, "layers": args.layers, "device": args.device}
    # Each comparison is printed as soon as its runs are done: a time limit that stops the resume keeps it.
    run_train([sys.executable], plain, config, [])
    run_train(torchrun, dist, config, [])
    emit({**compare("torchrun_vs_plain", dist, plain, first), **facts})
    # The resume starts from the torchrun run's own checkpoint of step --steps - 1 (a process fewer than running to
    # that step again: each costs ~35 s on a GPU); --resume trims metrics.jsonl back to it.
    shutil.copytree(dist, resumed)
    shutil.rmtree(resumed / "checkpoints" / f"step-{args.steps}")
    said = run_train(torchrun, resumed, config, ["--resume"])
    if f"(step {args.steps - 1})" not in said:
        sys.exit(f"the resumed run did not start from step {args.steps - 1}:\n{said[-3000:]}")
    emit({**compare("resumed_torchrun_vs_plain", resumed, plain, first), **facts})
    emit({**compare("resumed_vs_uninterrupted_torchrun", resumed, dist, first), **facts})


def add_parser(subparsers) -> None:
    check = subparsers.add_parser("torchrun-check", help="train.py under torchrun (a world of one: NCCL, FSDP2) "
                                  "against one plain process, and a resume, on a GPU")
    check.add_argument("--preset", default="tiny", help="tiny, or a paper preset at the real width with random "
                       "weights (--layers deep)")
    check.add_argument("--layers", type=at_least_1, default=2, help="decoder blocks of the real-shape model")
    check.add_argument("--steps", type=at_least_1, default=3, help="training steps of each run (the resume: the last)")
    check.add_argument("--new-tokens", type=at_least_1, default=64, help="max new tokens (real shape)")
    check.add_argument("--device", type=device_arg, default="cuda", help="cuda (cpu: the harness itself, gloo)")
    check.add_argument("--work-dir", default="/tmp/ngrpo-torchrun-check", help="scratch directory (emptied)")
    check.set_defaults(run=bench_torchrun_check)
