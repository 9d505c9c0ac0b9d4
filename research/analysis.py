"""Measuring exploration and comparing runs: group-diversity diagnostics, bootstrap intervals, paired tests.

    python -m research.analysis compare RUN_A RUN_B [--out FILE]   # two eval.py output directories (or samples.jsonl)
    python -m research.analysis diversity RUN [RUN ...]            # group diversity of evaluated runs

Diversity of evaluated runs: runtime/diagnostics.py's group_diversity (what metrics.jsonl records each training
step; docs/experiments.md defines each key) over each problem's samples, answers compared by the reward's pool.

Uncertainty (eval.py's estimators: a bootstrap over problems: percentile intervals, RESAMPLES seeded draws):
    eval.intervals({"p1": [True, False, ...], ...})  -> {"mean@n": [lo, hi], "pass@1": [lo, hi], ...}
    compare_runs(load_samples(A), load_samples(B))  -> per benchmark: each run's metrics with intervals, the
        paired difference with its interval and a paired sign-flip permutation test, solved only by A / B /
        both.
"""

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path

import torch

import reward
from eval import LEVEL, PASS_KS, RESAMPLES, bootstrap_means, metric_values, percentile_interval
from runtime.diagnostics import NGRAM_ORDERS, group_diversity

# ----------------------------------------------------------------------------- paired comparison of two runs


def load_samples(run: str | Path, field: str = "correct") -> dict[str, dict[str, list]]:
    """benchmark -> problem id -> `field` of each sample in sample order (correct: bool), from eval.py's
    samples.jsonl (a run directory or the file itself). A problem with missing samples (an interrupted eval)
    is an error."""
    path = Path(run)
    path = path / "samples.jsonl" if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"{run}: no samples.jsonl (pass an eval.py --out-dir or its samples.jsonl)")
    found: dict[str, dict[str, dict[int, object]]] = {}
    for line_no, line in enumerate(path.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
            value = bool(record["correct"]) if field == "correct" else record[field]
            problem = found.setdefault(record["benchmark"], {}).setdefault(str(record["problem_id"]), {})
            problem[int(record["sample"])] = value
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path}:{line_no}: not an eval.py sample record ({error})") from None
    runs = {}
    for benchmark, problems in found.items():
        n = max(max(samples) + 1 for samples in problems.values())
        incomplete = [pid for pid, samples in problems.items() if len(samples) != n]
        if incomplete:
            raise ValueError(f"{path}: {benchmark} has problems with fewer than {n} samples (e.g. "
                             f"{incomplete[0]}): finish the evaluation with eval.py --resume")
        runs[benchmark] = {pid: [samples[s] for s in range(n)] for pid, samples in problems.items()}
    return runs


def sign_flip_p_values(differences: torch.Tensor, resamples: int, generator: torch.Generator) -> list[float]:
    """Two-sided paired permutation test of each column of differences [P, S]: under "A and B are
    exchangeable within a problem" each problem's difference is +d or -d with probability 1/2. p = (1 + #draws
    with |mean| >= |observed mean|) / (1 + draws), which is never 0 and is exact in expectation."""
    P = differences.shape[0]
    signs = torch.randint(2, (resamples, P), generator=generator, dtype=torch.float64) * 2 - 1  # [B, P]
    flipped = (signs @ differences / P).abs()  # [B, S]
    observed = differences.mean(0).abs()  # [S]
    extreme = (flipped >= observed - 1e-12).sum(0)
    return ((1 + extreme) / (1 + resamples)).tolist()


def compare_benchmark(a: Mapping[str, list[bool]], b: Mapping[str, list[bool]], *, resamples: int = RESAMPLES,
                      seed: int = 0, level: float = LEVEL) -> dict:
    """Paired comparison of two runs on the same problems: each metric's value and interval for A and B, the
    difference A - B with its paired-bootstrap interval (the same resampled problems for both) and the
    sign-flip p-value; `solved`: problems with a correct sample in A only, in B only, in both, in neither."""
    if set(a) != set(b):
        raise ValueError(f"the runs evaluated different problems ({len(a)} and {len(b)}, "
                         f"{len(set(a) & set(b))} shared): compare evaluations of the same benchmark file "
                         "and --limit")
    ids = sorted(a)
    n_a, n_b = len(a[ids[0]]), len(b[ids[0]])
    passes = [f"pass@{k}" for k in PASS_KS if k <= min(n_a, n_b)]
    values_a = metric_values([a[i] for i in ids], [f"mean@{n_a}"] + passes)  # [P, S]
    values_b = metric_values([b[i] for i in ids], [f"mean@{n_b}"] + passes)  # [P, S]
    differences = values_a - values_b  # Mean@n of different n are still comparable accuracies
    names = [f"mean@{n_a}" if n_a == n_b else "mean"] + passes
    generator = torch.Generator().manual_seed(seed)
    draws = bootstrap_means(torch.cat([values_a, values_b, differences], 1), resamples, generator)
    bounds = percentile_interval(draws, level).tolist()
    p_values = sign_flip_p_values(differences, resamples, generator)
    S = len(names)
    table = {}
    for s, name in enumerate(names):
        table[name] = {"a": float(values_a[:, s].mean()), "a_ci": bounds[s],
                       "b": float(values_b[:, s].mean()), "b_ci": bounds[S + s],
                       "diff": float(differences[:, s].mean()), "diff_ci": bounds[2 * S + s],
                       "p_value": p_values[s]}
    solved_a, solved_b = [any(a[i]) for i in ids], [any(b[i]) for i in ids]
    solved = {"only_a": sum(x and not y for x, y in zip(solved_a, solved_b)),
              "only_b": sum(y and not x for x, y in zip(solved_a, solved_b)),
              "both": sum(x and y for x, y in zip(solved_a, solved_b)),
              "neither": sum(not x and not y for x, y in zip(solved_a, solved_b))}
    return {"problems": len(ids), "n_a": n_a, "n_b": n_b, "metrics": table, "solved": solved}


def compare_runs(a: Mapping[str, Mapping], b: Mapping[str, Mapping], **options) -> dict:
    """compare_benchmark for every benchmark both runs evaluated (load_samples layout)."""
    shared = [name for name in a if name in b]
    if not shared:
        raise ValueError(f"the runs share no benchmark (A: {', '.join(a)}; B: {', '.join(b)})")
    return {name: compare_benchmark(a[name], b[name], **options) for name in shared}


def format_comparison(comparison: dict, label_a: str = "A", label_b: str = "B") -> str:
    """The comparison as a text table, in percent."""
    pct = lambda x: f"{100 * x:5.1f}"
    span = lambda lo_hi: f"[{pct(lo_hi[0])}, {pct(lo_hi[1])}]"
    lines = []
    for name, result in comparison.items():
        lines.append(f"{name}: {result['problems']} problems, n = {result['n_a']} (A) / {result['n_b']} (B)")
        lines.append(f"  {'metric':<9}{'A':>22}{'B':>22}{'A - B':>24}{'p':>8}")
        for metric, row in result["metrics"].items():
            diff = f"{100 * row['diff']:+5.1f} {span(row['diff_ci'])}"
            lines.append(f"  {metric:<9}{pct(row['a']) + ' ' + span(row['a_ci']):>22}"
                         f"{pct(row['b']) + ' ' + span(row['b_ci']):>22}{diff:>24}{row['p_value']:>8.3f}")
        solved = result["solved"]
        lines.append(f"  solved (a correct sample among all): only A {solved['only_a']}, "
                     f"only B {solved['only_b']}, both {solved['both']}, neither {solved['neither']}")
    lines.append(f"A = {label_a}; B = {label_b}. Intervals: {LEVEL:.0%} percentile bootstrap over problems; "
                 "p: paired sign-flip permutation test over problems.")
    return "\n".join(lines)


def sample_diversity(run: str | Path, same=None) -> dict[str, dict]:
    """group_diversity of an evaluated run per benchmark: each problem's n samples are one group."""
    correct, responses = load_samples(run), load_samples(run, "response")
    result = {}
    for benchmark, problems in correct.items():
        ids = sorted(problems)
        n = len(problems[ids[0]])
        result[benchmark] = group_diversity([text for i in ids for text in responses[benchmark][i]],
                                            [float(c) for i in ids for c in problems[i]], n, same=same)
    return result


def format_diversity(by_run: dict[str, dict[str, dict]]) -> str:
    keys = ["div/distinct_answers", "div/no_answer", "div/mixed_groups"]
    keys += [f"div/distinct_{n}" for n in NGRAM_ORDERS]
    width = max(len(str(run)) for run in by_run) + 2
    lines = [f"{'run':<{width}}{'benchmark':<14}" + "".join(f"{k[4:]:>17}" for k in keys)]
    for run, benchmarks in by_run.items():
        for benchmark, metrics in benchmarks.items():
            cells = "".join(f"{metrics[k]:>17.3f}" if k in metrics else f"{'-':>17}" for k in keys)
            lines.append(f"{str(run):<{width}}{benchmark:<14}{cells}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    compare = commands.add_parser("compare", help="paired comparison of two eval.py runs")
    compare.add_argument("run_a", help="eval.py --out-dir of run A (or its samples.jsonl)")
    compare.add_argument("run_b", help="eval.py --out-dir of run B (or its samples.jsonl)")
    compare.add_argument("--out", help="JSON file for the comparison (default: "
                                        "RUN_A/compare-vs-<last 3 parts of RUN_B's path>.json)")
    compare.add_argument("--resamples", type=int, default=RESAMPLES, help="bootstrap and permutation draws")
    compare.add_argument("--seed", type=int, default=0, help="seed of the draws")
    diversity = commands.add_parser("diversity",
                                    help="group diversity of evaluated runs (a problem's samples = a group)")
    diversity.add_argument("runs", nargs="+", help="eval.py --out-dir directories (or samples.jsonl files)")
    args = parser.parse_args(argv)
    if args.command == "diversity":
        try:
            with reward.RewardPool() as pool:
                by_run = {run: sample_diversity(run, same=pool) for run in args.runs}
        except (OSError, ValueError) as error:
            sys.exit(f"error: {error}")
        print(format_diversity(by_run))
        return by_run
    try:
        comparison = compare_runs(load_samples(args.run_a), load_samples(args.run_b),
                                  resamples=args.resamples, seed=args.seed)
    except (OSError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(format_comparison(comparison, args.run_a, args.run_b))
    run_a = Path(args.run_a) if Path(args.run_a).is_dir() else Path(args.run_a).parent
    run_b = Path(args.run_b).resolve()
    out = Path(args.out) if args.out else run_a / f"compare-vs-{'-'.join(run_b.parts[-3:])}.json"
    out.write_text(json.dumps({"a": str(args.run_a), "b": str(args.run_b), "resamples": args.resamples,
                               "seed": args.seed, "level": LEVEL, "benchmarks": comparison}, indent=2) + "\n")
    print(f"wrote {out}")
    return comparison


if __name__ == "__main__":
    main()
