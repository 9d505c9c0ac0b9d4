"""`python bench.py step-lines`: how much code one training step walks through, as a reader following it would.

One `--preset tiny` run of two steps; the second step (from its rollouts to the end of its bookkeeping) runs under
a profiler that notes every function of the repo it enters. A function counts with every line of its source (its
docstring and comments too: a reader reads them); the lines of each file are counted once. Three figures:

- all: every file of the repo the step enters;
- core: without the grader's internals (grading/), diagnostics (research/, runtime/diagnostics.py) and logging
  (runtime/tracking.py);
- spine: the method's top-level files alone, without train.py's run-keeping around the step loop;
- metrics: what the step's metrics phase (train.step_metrics) enters, with the lines of grading/ it enters that the
  rest of the step (the reward among it) did not: the metrics reuse the reward's reading of the answers.

The reward workers are other processes: their code is not counted (what they run is grading/'s)."""

import argparse
import sys
import tempfile
from pathlib import Path

import train
from benchmarks.common import ROOT, emit

CORE_EXCLUDED = ("grading/", "research/", "runtime/diagnostics.py", "runtime/tracking.py")
# train.py functions the step calls that keep the run rather than compute the step
TRAIN_RUN_KEEPING = ("after_step", "log_step", "check_scored", "save_checkpoint", "say")


def _lines(code) -> set[int]:
    """Every line of a function's source: from its first line to the last line it has code on."""
    last = max((line for _, _, line in code.co_lines() if line is not None), default=code.co_firstlineno)
    return set(range(code.co_firstlineno, last + 1))


def covered_lines(codes) -> tuple[dict[str, set[int]], dict[str, set[str]]]:
    """{file: its lines} and {file: its functions} of the repo's code objects among `codes` (tests and benchmarks
    left out)."""
    covered: dict[str, set[int]] = {}
    functions: dict[str, set[str]] = {}
    for code in codes:
        path = Path(code.co_filename).resolve()
        if not path.is_file() or not path.is_relative_to(ROOT) or path.relative_to(ROOT).parts[0] in ("tests",
                                                                                                      "benchmarks"):
            continue
        name = str(path.relative_to(ROOT))
        covered.setdefault(name, set()).update(_lines(code))
        functions.setdefault(name, set()).add(code.co_qualname)
    return covered, functions


def bench_step_lines(args: argparse.Namespace) -> None:
    step_codes, metrics_codes = set(), set()
    into = [step_codes]  # where the profiler notes what it enters: the metrics phase's own set while it runs

    def profile(frame, event, arg):
        if event == "call":
            into[0].add(frame.f_code)

    collect, after, metrics = train.collect_groups, train.after_step, train.step_metrics

    def traced_metrics(*args, **kwargs):
        into[0] = metrics_codes
        try:
            return metrics(*args, **kwargs)
        finally:
            into[0] = step_codes

    def traced_collect(r, step):
        if step == 1:
            sys.setprofile(profile)
        return collect(r, step)

    def traced_after(r, watch, step, *rest, **kwargs):
        try:
            return after(r, watch, step, *rest, **kwargs)
        finally:
            if step == 2:
                sys.setprofile(None)

    train.collect_groups, train.after_step, train.step_metrics = traced_collect, traced_after, traced_metrics
    with tempfile.TemporaryDirectory() as out:
        train.main(["--preset", "tiny", "--max-steps", "2", "--out-dir", out, "--device", "cpu"])
    codes = step_codes | metrics_codes
    covered, functions = covered_lines(codes)
    spine_lines = {name: set(lines) for name, lines in covered.items() if "/" not in name}
    for code in codes:  # train.py's run-keeping is not the step's spine
        if Path(code.co_filename).name == "train.py" and code.co_name in TRAIN_RUN_KEEPING:
            spine_lines.get("train.py", set()).difference_update(_lines(code))
    views = {"all": covered,
             "core": {n: v for n, v in covered.items() if not n.startswith(CORE_EXCLUDED)},
             "spine": {n: v for n, v in spine_lines.items() if v}}
    in_metrics, outside = covered_lines(metrics_codes)[0], covered_lines(step_codes)[0]
    views["metrics"] = in_metrics
    beyond = {name: lines - outside.get(name, set()) for name, lines in in_metrics.items()
              if name.startswith("grading/")}
    for view, files in views.items():
        emit({"bench": "step-lines", "view": view, "lines": sum(map(len, files.values())), "files": len(files),
              "per_file": {name: len(lines) for name, lines in sorted(files.items())},
              **({"grading_lines_beyond_the_reward": sum(map(len, beyond.values()))} if view == "metrics" else {})})
    if args.functions:
        for name in sorted(functions):
            print(name, sorted(functions[name]), file=sys.stderr)


def add_parser(subparsers) -> None:
    step_lines = subparsers.add_parser("step-lines", help="the lines and files one tiny training step executes "
                                       "(all, core, spine; its metrics phase)")
    step_lines.add_argument("--functions", action="store_true", help="also list the functions entered, per file")
    step_lines.set_defaults(run=bench_step_lines)
