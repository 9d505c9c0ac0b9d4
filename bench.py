"""Benchmarks. Each prints one JSON line per measurement to stdout; notes go to stderr.

    python bench.py grader              # the reward checker (reward.py) on a realistic answer mix
    python bench.py rollout             # the sampler (rollout.py) against transformers' generate
    python bench.py rollout-grid        # on a GPU: the sampler at the real shape against its memory floor (issue 28)
    python bench.py train               # the training log-prob path (ngrpo.py) against full logits
    python bench.py neighbors           # the neighbor table (neighbors.py); --device cuda: the 1.5B shape
    python bench.py trl                 # a GRPO step of ours beside TRL's GRPOTrainer (pip install trl)
    python bench.py rehearsal           # the 1.5B shape end to end on the CPU, memory against train.py --plan
    python bench.py manifest            # hashing a checkpoint: block digests on every core vs one stream per file
    python bench.py torchrun-check      # on a GPU: train.py under torchrun (world of one) vs one process, resume
    python bench.py fingerprint         # five tiny training runs hashed: unchanged by a behaviour-preserving change
    python bench.py step-lines          # the lines and files one tiny training step executes

Each benchmark is one file in benchmarks/ with an `add_parser(subparsers)` that registers its
subcommand (and sets `run`); add a new one there and name it in BENCHMARKS below. This file is only
the entry: it imports the one benchmark named (`python bench.py NAME --help` shows its flags), so
that one benchmark's imports (the trainer, torch.compile, transformers) are not every benchmark's.
"""

import argparse
import importlib
import sys

BENCHMARKS = ("grader", "rollout", "rollout-grid", "neighbors", "train", "trl", "rehearsal", "manifest",
              "torchrun-check", "fingerprint", "step-lines")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="benchmark", required=True, metavar="{" + ",".join(BENCHMARKS) + "}")
    named = [name for name in BENCHMARKS if name in argv[:1]]
    for name in named:
        importlib.import_module(f"benchmarks.{name.replace('-', '_')}").add_parser(subparsers)
    if not named:  # --help, or a name that is not a benchmark: argparse says so, listing the names
        for name in BENCHMARKS:
            subparsers.add_parser(name)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
