"""The ablation runner: trains and evaluates every run of a sweep file, then writes one table.

    python -m research.experiments sweeps/demo-tiny.json        # runs/sweeps/demo-tiny/table.md and table.csv
    python -m research.experiments sweeps/methods.json --dry-run # the commands, without running them

Each run is `python train.py` then `python eval.py` on its final checkpoint, as subprocesses: the runner
only needs the command lines, so it works for any flags the two accept. A sweep file is JSON:

    {"preset": "demo",                            # train.py --preset of every run (a run may override it)
     "train": {"max_steps": 30},                  # train.py flags of every run (flag name with _ or -)
     "eval": {"benchmarks": ["arith"], "n": 8},   # eval.py flags of every evaluation; "arith..." specs are
                                                  # written to OUT/benchmarks/*.jsonl (eval.py reads files)
     "seeds": [0, 1],                             # --seed of train.py and eval.py; a run may override them
     "metrics": ["mean@8", "pass@8"],             # table columns per benchmark (default mean@n, pass@n)
     "runs": [{"name": "GRPO", "train": {"explore": "none"}},
              {"name": "N-GRPO", "train": {"explore": "neighbor"},
               "evals": {"N-GRPO": {}, "N-GRPO + mixing at inference": {"explore": "neighbor"}}},
              {"name": "base model", "model": "tiny"}]}   # "model": evaluated as it is, no training

A run's "evals" maps table rows to eval.py flag overrides (default: one row named as the run, no overrides; {}: a
run trained and never evaluated, e.g. the warm start the next runs start from). A text value's {seed} and {out} are
the run's seed and the sweep's output directory (`"model": "{out}/warm-start/seed-{seed}/warm_start"`).
An evaluation gets only the flags written for it, none taken from training: a sweep whose training changes
the prompt (the demo preset's `instruction: ""`) says so in "eval" too (`"instruction": ""`, passed as
`--instruction ''`), and eval.py warns in eval.log when a checkpoint was trained on another instruction.
Outputs: OUT/<run>/seed-<s>/ (train.py's --out-dir, train.log), OUT/<run>/seed-<s>/eval-<row>/ (eval.py's
--out-dir, eval.log). A finished step (a training's summary.json with its step count, an evaluation's
results.json) is skipped; an interrupted one continues with --resume (Ctrl-C stops the sweep and says so); a
directory holding a run of other flags is an error. --dry-run parses every command's flags as its program would.
The table's value is the mean over seeds; its interval is a percentile bootstrap over problems (eval.RESAMPLES
draws, seed 0) of each problem's score averaged over seeds; the average column averages the benchmarks' resamples
(stratified).
"""

import argparse
import contextlib
import csv
import io
import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

import data
from eval import LEVEL, RESAMPLES, bootstrap_means, metric_values, percentile_interval
from eval import parse_args as evaluation_args
from research.analysis import load_samples
from research.plot import plot_gain_by_entropy
from runtime.cli import parse_config
from runtime.tracking import LOG_EVERY_S, read_summary

ROOT = Path(__file__).resolve().parents[1]  # the repo: train.py and eval.py are there
SWEEP_KEYS = {"description", "preset", "train", "eval", "seeds", "metrics", "runs"}
RUN_KEYS = {"name", "preset", "train", "eval", "seeds", "evals", "model"}


class SweepError(ValueError):
    pass


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=]+", "-", text).strip("-").lower()


def flag_args(flags: dict, **fields) -> list[str]:
    """{"mix_rate": 0.2, "refill": True, "benchmarks": ["a", "b"]} -> ["--mix-rate", "0.2", "--refill",
    "--benchmarks", "a,b"]; False gives --no-FLAG. fields fill a text value's {name} (plan's {seed} and {out})."""
    args = []
    for name, value in flags.items():
        value = value.format(**fields) if isinstance(value, str) and fields else value
        flag = "--" + name.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + flag[2:])
        else:
            args += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return args


def load_sweep(path: Path) -> dict:
    """The sweep file, checked: known keys, named runs, distinct table rows."""
    try:
        sweep = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise SweepError(f"{path}: {error}") from None
    unknown = set(sweep) - SWEEP_KEYS
    if unknown or not sweep.get("runs"):
        raise SweepError(f"{path}: needs a non-empty 'runs' list; unknown keys {sorted(unknown)} "
                         f"(known: {sorted(SWEEP_KEYS)})")
    rows = []
    for index, run in enumerate(sweep["runs"]):
        if not isinstance(run, dict) or not run.get("name") or set(run) - RUN_KEYS:
            raise SweepError(f"{path}: run {index} needs a 'name' and only the keys {sorted(RUN_KEYS)}")
        if "model" in run and "train" in run:
            raise SweepError(f"{path}: run {run['name']!r} gives 'model' (evaluate as is) and 'train' flags")
        rows += list(run.get("evals", {run["name"]: {}}))
    if len(set(rows)) != len(rows) or len({slug(r["name"]) for r in sweep["runs"]}) != len(sweep["runs"]):
        raise SweepError(f"{path}: run names and table rows must be distinct")
    return sweep


def materialize_benchmarks(specs, out_dir: Path, *, write: bool = True) -> list[str]:
    """eval.py --benchmarks entries: built-in `arith...` sets become JSONL files (their test split; eval.py
    reads the sets themselves too, but the sweeps' recorded commands name the files). write=False (--dry-run):
    only their paths."""

    specs = specs.split(",") if isinstance(specs, str) else list(specs)
    paths = []
    for spec in specs:
        if spec.startswith("arith"):
            path = out_dir / "benchmarks" / f"{slug(re.sub('[:,=]', '-', spec))}.jsonl"
            if write and not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                problems = data.load_problems(spec, split="test")
                path.write_text("".join(json.dumps(p) + "\n" for p in problems))
            spec = str(path)
        paths.append(spec)
    return paths


def plan(sweep: dict, out_dir: Path, *, write: bool = True) -> list[dict]:
    """One entry per (run, seed): its train command (None for a model evaluated as is) and evaluations; with
    write=False nothing is written (the benchmark files are only named)."""
    python = sys.executable
    jobs = []
    for run in sweep["runs"]:
        for seed in run.get("seeds", sweep.get("seeds", [0])):
            run_dir = out_dir / slug(run["name"]) / f"seed-{seed}"
            train = None
            if "model" not in run:
                preset = run.get("preset", sweep.get("preset"))
                train = ([python, str(ROOT / "train.py")] + (["--preset", preset] if preset else [])
                         + flag_args({**sweep.get("train", {}), **run.get("train", {})}, seed=seed, out=out_dir)
                         + ["--seed", str(seed), "--out-dir", str(run_dir)])
            evals = []
            for row, overrides in run.get("evals", {run["name"]: {}}).items():
                flags = {**sweep.get("eval", {}), **run.get("eval", {}), **overrides}
                if "benchmarks" in flags:
                    flags["benchmarks"] = materialize_benchmarks(flags["benchmarks"], out_dir, write=write)
                eval_dir = run_dir / f"eval-{slug(row)}"
                command = ([python, str(ROOT / "eval.py")] + flag_args(flags, seed=seed, out=out_dir)
                           + ["--seed", str(seed), "--out-dir", str(eval_dir)])
                evals.append({"row": row, "dir": eval_dir, "command": command})
            jobs.append({"run": run["name"], "seed": seed, "dir": run_dir, "train": train,
                         "model": run.get("model"), "evals": evals})
    return jobs


def final_checkpoint(run_dir: Path) -> Path:
    steps = [d for d in (run_dir / "checkpoints").glob("step-*") if d.is_dir() and d.name[5:].isdigit()]
    if not steps:
        raise SweepError(f"{run_dir}: training finished without a checkpoint in {run_dir / 'checkpoints'}")
    return max(steps, key=lambda d: int(d.name[5:]))


def run_step(command: list[str], out_dir: Path, finished, log_name: str, resume_when: str, label: str = "") -> bool:
    """Runs command (unless finished(out_dir); a file name: unless out_dir holds it), logging to out_dir/log_name
    and saying every LOG_EVERY_S seconds what its log last said. Adds --resume when out_dir/resume_when exists.
    Returns whether it ran. The command is recorded in out_dir/command.json: a directory that holds a run of
    another command is an error, not silently reused."""
    record = out_dir / "command.json"
    recorded = command[2:]  # the flags: the interpreter's and the script's paths may change between sessions
    if record.exists() and json.loads(record.read_text()) != recorded:
        raise SweepError(f"{out_dir} holds a run of other flags (see {record}): delete the directory or "
                         "rename the run in the sweep file")
    if (finished(out_dir) if callable(finished) else (out_dir / finished).exists()):
        return False
    resume = ["--resume"] if list(out_dir.glob(resume_when)) else []
    out_dir.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(recorded) + "\n")
    log_path = out_dir / log_name
    with log_path.open("a") as log:
        log.write(f"$ {shlex.join(command + resume)}\n")
        log.flush()
        process = subprocess.Popen(command + resume, stdout=log, stderr=subprocess.STDOUT)
        said = None
        while True:
            try:
                status = process.wait(timeout=LOG_EVERY_S)
                break
            except subprocess.TimeoutExpired:  # still running: what its log says now
                last = last_line(log_path)
                if last and last != said:
                    print(f"{label or command[1]}: {last}", flush=True)
                    said = last
    if status in (130, 143, -signal.SIGINT, -signal.SIGTERM):  # the step was stopped by a signal (it checkpointed):
        raise KeyboardInterrupt  # so is the sweep, even where this process did not get the signal itself
    if status != 0:
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:])
        raise SweepError(f"{Path(command[1]).name} failed (exit {status}); end of {log_path}:\n{tail}")
    return True


def last_line(path: Path) -> str:
    """The last line of a log with something in it (a progress bar's last state: after its last carriage return)."""
    lines = [line.rsplit("\r", 1)[-1].strip() for line in path.read_text(errors="replace").splitlines()]
    return next((line for line in reversed(lines) if line), "")[:160]


def training_finished(run_dir: Path) -> bool:
    """train.py writes summary.json when a run begins; the end of the run adds its step count."""
    return "steps" in read_summary(run_dir)


def check_flags(what: str, command: list[str], label: str) -> None:
    """--dry-run: the flags of a step parsed as its program parses them (presets, names, values), so that a typo
    is found before the sweep's first run rather than after its trainings."""
    flags = ["tiny" if flag == "<final checkpoint>" else flag for flag in command[2:]]  # not trained yet
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            parse_config(flags) if what == "train" else evaluation_args(flags)
    except SystemExit as stop:
        if stop.code not in (0, None):
            said = errors.getvalue().strip().splitlines()
            message = said[-1].split(": error: ", 1)[-1] if said else str(stop.code)  # without argparse's prog
            raise SweepError(f"{label}: {Path(command[1]).name}: {message}") from None


def run_sweep(sweep: dict, out_dir: Path, *, dry_run: bool = False) -> list[dict]:
    jobs = plan(sweep, out_dir, write=not dry_run)
    total = sum(bool(job["train"]) + len(job["evals"]) for job in jobs)
    count = 0
    for job in jobs:
        steps = []
        if job["train"]:
            steps.append(("train", job["train"], job["dir"], training_finished, "train.log",
                          "checkpoints/step-*"))
        for evaluation in job["evals"]:
            steps.append((f"eval {evaluation['row']!r}", evaluation["command"], evaluation["dir"],
                          lambda d: (d / "results.json").exists(), "eval.log", "samples.jsonl"))
        for what, command, step_dir, finished, log_name, resume_when in steps:
            count += 1
            if what != "train":  # a trained model exists only once training is done
                model = job["model"]
                if model is None:
                    model = "<final checkpoint>" if dry_run else str(final_checkpoint(job["dir"]))
                command = command[:2] + ["--model", model] + command[2:]
            label = f"[{count}/{total}] {job['run']} seed {job['seed']}: {what}"
            if dry_run:
                check_flags(what, command, label)
                # pasteable: `python` for this interpreter's path; quoted, so an empty value shows as ''
                print(f"{label}\n  {shlex.join(['python', *command[1:]])}")
                continue
            start = time.perf_counter()
            print(f"{label}: running (log: {step_dir / log_name})", flush=True)
            ran = run_step(command, step_dir, finished, log_name, resume_when, label)
            outcome = f"done in {time.perf_counter() - start:.0f} s" if ran else "already done"
            print(f"{label}: {outcome}", flush=True)
    return jobs


# ----------------------------------------------------------------------------- the table


# Counts a sample record holds (eval.py) that a table may show beside mean@n / pass@k: each problem's mean over its
# samples, in tokens (think_tokens: up to and with </think>).
COUNTS = ("tokens", "think_tokens")


def shown(metric: str, value: float) -> float:
    """A table's number: accuracies in percent, counts in tokens."""
    return value if metric in COUNTS else 100 * value


def problem_values(evaluations: list[Path], metrics: list[str]) -> dict[str, tuple[list, torch.Tensor]]:
    """benchmark -> (its problem ids, [seeds, P, S] each seed's score of each problem for each metric: mean@n and
    pass@k from its samples' correctness, a count of COUNTS as the mean over its samples)."""
    accuracies = [m for m in metrics if m not in COUNTS]
    runs = [load_samples(d) for d in evaluations]
    counts = [{m: load_samples(d, field=m) for m in metrics if m in COUNTS} for d in evaluations]
    values = {}
    for benchmark in runs[0]:
        ids = sorted(runs[0][benchmark])
        if any(sorted(run.get(benchmark, {})) != ids for run in runs):
            raise SweepError(f"{benchmark}: the seeds of one row evaluated different problems: {evaluations}")
        per_seed = []
        for run, count in zip(runs, counts):
            columns = dict(zip(accuracies, metric_values([run[benchmark][i] for i in ids], accuracies).T)) \
                if accuracies else {}
            columns.update({m: torch.tensor([sum(c[benchmark][i]) / len(c[benchmark][i]) for i in ids],
                                            dtype=torch.float64) for m, c in count.items()})
            per_seed.append(torch.stack([columns[m] for m in metrics], -1))
        values[benchmark] = ids, torch.stack(per_seed)
    return values


def row_cells(evaluations: list[Path], metrics: list[str], resamples: int) -> dict:
    """benchmark (and "average") -> metric -> {mean, ci, per_seed}: a table row from its seeds' eval dirs."""
    generator = torch.Generator().manual_seed(0)
    cells, average_draws = {}, []
    for benchmark, (_, per_seed) in problem_values(evaluations, metrics).items():  # per_seed [seeds, P, S]
        values = per_seed.mean(0)  # [P, S]: each problem's score averaged over seeds
        draws = bootstrap_means(values, resamples, generator)  # [B, S]
        bounds = percentile_interval(draws, LEVEL).tolist()
        cells[benchmark] = {m: {"mean": float(values[:, s].mean()), "ci": bounds[s],
                                "per_seed": per_seed[:, :, s].mean(1).tolist()}
                            for s, m in enumerate(metrics)}
        if "gpqa" not in benchmark.lower():  # eval.py's average is over the math benchmarks
            average_draws.append((draws, values.mean(0), per_seed.mean(1)))
    if len(average_draws) > 1:
        draws = torch.stack([d for d, _, _ in average_draws]).mean(0)
        means = torch.stack([m for _, m, _ in average_draws]).mean(0)
        per_seed = torch.stack([p for _, _, p in average_draws]).mean(0)  # [seeds, S]
        bounds = percentile_interval(draws, LEVEL).tolist()
        cells["average"] = {m: {"mean": float(means[s]), "ci": bounds[s], "per_seed": per_seed[:, s].tolist()}
                            for s, m in enumerate(metrics)}
    return cells


def paired(by_row: dict[str, list[Path]], seeds: dict[str, list[int]], metrics: list[str],
           resamples: int) -> dict[str, tuple[list[int], dict]]:
    """Each row against the first, paired: row -> (the seeds both ran, benchmark -> metric -> (mean, low, high)), the
    mean over problems of (row - first) of each problem's score averaged over those seeds, with a percentile
    bootstrap interval over problems (the same resampled problems for both rows: their own difficulty cancels)."""
    first, *others = by_row
    base, comparisons = dict(zip(seeds[first], by_row[first])), {}
    for row in others:
        shared = [seed for seed in seeds[row] if seed in base]
        if not shared:
            continue
        mine = dict(zip(seeds[row], by_row[row]))
        theirs = problem_values([base[seed] for seed in shared], metrics)
        cells = {}
        for benchmark, (ids, values) in problem_values([mine[seed] for seed in shared], metrics).items():
            if benchmark not in theirs or theirs[benchmark][0] != ids:
                continue
            difference = values.mean(0) - theirs[benchmark][1].mean(0)  # [P, S]
            draws = bootstrap_means(difference, resamples, torch.Generator().manual_seed(0))
            cells[benchmark] = {metrics[s]: (float(difference[:, s].mean()), low, high)
                                for s, (low, high) in enumerate(percentile_interval(draws, LEVEL).tolist())}
        comparisons[row] = shared, cells
    return comparisons


def paired_lines(comparisons: dict, first: str) -> list[str]:
    """`paired`'s comparisons as the table's lines."""
    lines = ["", f"Paired against {first} (percentage points, tokens for counts; {LEVEL:.0%} bootstrap interval over "
             "problems of each problem's difference of seed means; the seeds both rows ran):", ""]
    for row, (shared, cells) in comparisons.items():
        text = [f"{benchmark} {m} {shown(m, mean):+.1f} [{shown(m, low):+.1f}, {shown(m, high):+.1f}]"
                for benchmark, by_metric in cells.items() for m, (mean, low, high) in by_metric.items()]
        lines.append(f"- {row} - {first} (seeds {' '.join(map(str, shared))}): " + "; ".join(text))
    return lines


def mixed_entropy(run_dirs: list[Path]) -> tuple[float, float] | None:
    """(the policy's mean entropy at the steps a method mixed, the fraction of thinking steps it mixed), over its
    training runs' steps (metrics.jsonl: mixed_entropy, think/mixed_frac); None when no step was mixed."""
    records = [json.loads(line) for d in run_dirs if (d / "metrics.jsonl").is_file()
               for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
    entropies = [r["mixed_entropy"] for r in records if "mixed_entropy" in r]
    if not entropies:
        return None
    fractions = [r.get("think/mixed_frac", r.get("mix_rate", 0.0)) for r in records]
    return sum(entropies) / len(entropies), sum(fractions) / len(fractions)


def by_x(point: tuple) -> float:
    return point[1]


def entropy_analysis(comparisons: dict, first: str, trained: dict[str, list[Path]], metric: str,
                     out_dir: Path | None = None) -> list[str]:
    """Each method's paired gain (its first benchmark's `metric`) against the mean entropy of the steps it mixed:
    lines of a table, and OUT/entropy_gain.png drawn by research.plot (with matplotlib)."""
    points = []
    for row, (_, cells) in comparisons.items():
        where = mixed_entropy(trained.get(row, []))
        gain = next(iter(cells.values()), {}).get(metric)
        if where is not None and gain is not None:
            points.append((row, *where, *gain))
    if not points:
        return []
    lines = ["", f"Gain against the entropy of the mixed steps (the policy's, nats, over the training steps; the "
             f"gain is {metric} paired against {first}):", "", f"| method | mixed-step entropy | thinking steps "
             f"mixed | {metric} - {first} |", "|---|---|---|---|"]
    lines += [f"| {row} | {entropy:.3f} | {fraction:.3f} | {shown(metric, mean):+.1f} [{shown(metric, low):+.1f}, "
              f"{shown(metric, high):+.1f}] |" for row, entropy, fraction, mean, low, high in sorted(points, key=by_x)]
    if out_dir is not None:
        with contextlib.suppress(ImportError):  # matplotlib is optional: the table stands without the figure
            plot_gain_by_entropy([(row, e, shown(metric, m), shown(metric, lo), shown(metric, hi))
                                  for row, e, _, m, lo, hi in points], f"{metric} - {first}",
                                 out_dir / "entropy_gain.png")
            lines += ["", f"Figure: {out_dir / 'entropy_gain.png'}"]
    return lines


def build_table(sweep: dict, jobs: list[dict], resamples: int = RESAMPLES,
                out_dir: Path | None = None) -> tuple[str, str]:
    """(markdown, csv): rows = table rows in sweep order, columns = benchmark x metric, then the average; then each
    row paired against the first, and where methods mixed, their gains against the entropy of what they mixed (its
    figure in out_dir)."""
    by_row: dict[str, list[Path]] = {}
    seeds: dict[str, list[int]] = {}
    trained: dict[str, list[Path]] = {}
    for job in jobs:
        for evaluation in job["evals"]:
            by_row.setdefault(evaluation["row"], []).append(evaluation["dir"])
            seeds.setdefault(evaluation["row"], []).append(job["seed"])
            trained.setdefault(evaluation["row"], []).append(job["dir"])
    metrics = sweep.get("metrics", ["mean@n", "pass@n"])
    rows = {row: row_cells(dirs, metrics, resamples) for row, dirs in by_row.items()}
    columns = list(dict.fromkeys(b for cells in rows.values() for b in cells))
    header = ["method"] + [f"{b} {m}" for b in columns for m in metrics]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["method", "benchmark", "metric", "mean", "ci_low", "ci_high", "seeds", "per_seed"])
    for row, cells in rows.items():
        text = []
        for benchmark in columns:
            for metric in metrics:
                cell = cells.get(benchmark, {}).get(metric)
                if cell is None:
                    text.append("")
                    continue
                low, high = cell["ci"]
                text.append(f"{shown(metric, cell['mean']):.1f} [{shown(metric, low):.1f}, {shown(metric, high):.1f}]")
                per_seed = " ".join(f"{v:.6f}" for v in cell["per_seed"])
                writer.writerow([row, benchmark, metric, f"{cell['mean']:.6f}", f"{low:.6f}", f"{high:.6f}",
                                 " ".join(map(str, seeds[row])), per_seed])
        lines.append("| " + " | ".join([row] + text) + " |")
    lines.append("")
    average = "; the average's interval resamples each benchmark" if "average" in columns else ""
    lines.append(f"Percent (tokens for {', '.join(COUNTS)}); mean over seeds [{LEVEL:.0%} percentile bootstrap "
                 "interval over problems, "
                 f"{resamples} resamples, of each problem's score averaged over seeds{average}]. Seeds: "
                 + "; ".join(f"{row}: {' '.join(map(str, s))}" for row, s in seeds.items()))
    if len(by_row) > 1:
        comparisons, first = paired(by_row, seeds, metrics, resamples), next(iter(by_row))
        lines += paired_lines(comparisons, first)
        lines += entropy_analysis(comparisons, first, trained, metrics[0], out_dir)
    return "\n".join(lines) + "\n", out.getvalue()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", help="sweep file (JSON), e.g. sweeps/demo-tiny.json")
    parser.add_argument("--out-dir", help="where runs and table go (default: runs/sweeps/<file name>)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands; run nothing")
    parser.add_argument("--resamples", type=int, default=RESAMPLES,
                        help="bootstrap draws of the table's intervals")
    args = parser.parse_args(argv)
    path = Path(args.sweep)
    out_dir = Path(args.out_dir or Path("runs") / "sweeps" / path.stem)
    try:
        sweep = load_sweep(path)
        jobs = run_sweep(sweep, out_dir, dry_run=args.dry_run)
        if args.dry_run:
            return
        markdown, table_csv = build_table(sweep, jobs, args.resamples, out_dir)
    except (SweepError, OSError, ValueError) as error:
        sys.exit(f"error: {error}")
    except KeyboardInterrupt:  # the step running got the signal too (one process group) and stopped
        print("\ninterrupted; run the same command again to continue (finished steps are skipped, an "
              "interrupted one resumes)", file=sys.stderr)
        raise SystemExit(130) from None
    (out_dir / "table.md").write_text(markdown)
    (out_dir / "table.csv").write_text(table_csv)
    print(markdown + f"wrote {out_dir / 'table.md'} and {out_dir / 'table.csv'}")


if __name__ == "__main__":
    main()
