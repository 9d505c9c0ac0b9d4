"""Evaluation with the paper's protocol: n samples per problem, Mean@n and unbiased Pass@k on the
benchmarks.

    python eval.py --model deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B --benchmarks aime24,aime25,amc23,math500
    python eval.py --model tiny --benchmarks ../shared/data/eval/math500.jsonl --limit 6 --n 4 --max-new-tokens 16
    torchrun --nproc-per-node 8 -- eval.py --model runs/ngrpo/checkpoints/step-500 --batch-size 64
    python eval.py --model runs/demo --benchmarks arith:max_count=5 --instruction ''   # the demo's run, held out

Defaults are the paper's: n = 32, temperature 0.6, top-p 0.95, up to 8,192 new tokens, no mixing
(`--explore` evaluates with mixing at inference, the paper's ablation and Soft Thinking). Writes
OUT/samples.jsonl (one line per sample) and OUT/results.json (fractions in [0, 1]); prints the table
in percent. A sample's random draws depend only on (--seed, benchmark, problem, sample number), not
on its batch: on a CPU the samples do not change with --batch-size, the number of processes under
torchrun, or where a `--resume` picked up (on a GPU, bf16 kernels may round a row's logits
differently in another batch shape, which can flip a token where two are nearly tied). Each finished
batch is appended to samples.jsonl at once, so `--resume` after an interruption ends with the same
results as one whole run; Ctrl-C or SIGTERM stops after the batch in flight and prints that
`--resume` command.
"""

import argparse
import contextlib
import hashlib
import json
import math
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

NOTHING_KEPT = "interrupted before the first sample was written; nothing to resume"
if __name__ == "__main__":  # a SIGTERM while the imports below load torch (~2 s) says so too (main's handler after)
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(print(NOTHING_KEPT, file=sys.stderr) or 128 + signum))

import torch

import config
import data
import reward
from model import load_model, resolve_device
from neighbors import table_for
from rollout import exploration_from_config, generate, sampling_from_config
from runtime import cli, distributed, guard, lora, tracking
from runtime.checkpoint import checkpoint_dirs, newest_intact
from runtime.diagnostics import think_end_id, token_counts, token_efficiency
from runtime.distributed import World
from runtime.plan import auto_batch_size
from strategies import STRATEGIES

# What marks a training run's --out-dir given as eval.py --model (checkpoint_of_run).
RUN_MARKS = ("checkpoints", "best", "metrics.jsonl")
# Benchmark name -> (hub dataset id, split). GPQA-Diamond is gated on the hub: it needs a local
# file.
HUB_BENCHMARKS = {
    "aime24": ("math-ai/aime24", "test"),
    "aime25": ("math-ai/aime25", "test"),
    "amc23": ("math-ai/amc23", "test"),
    "math500": ("HuggingFaceH4/MATH-500", "test"),
}
# ----------------------------------------------------------------------------- the estimators
#
# Over a benchmark's samples: unbiased Pass@k, Mean@n, and percentile bootstrap intervals over
# problems. This file reports them; research/analysis.py and research/experiments.py compare runs
# with them. Nothing here knows where the samples came from.


PASS_KS = (1, 2, 4, 8, 16, 32)
RESAMPLES = 10_000  # bootstrap draws and permutation draws; the Monte Carlo error of a 95% bound is ~0.2%
LEVEL = 0.95


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def metric_values(correct: Sequence[Sequence[bool]], metrics: Sequence[str]) -> torch.Tensor:
    """[P, S] float64: each problem's value of each metric, "mean@n" (its accuracy c / n) or
    "pass@k" (the unbiased estimator; "pass@n" is k = n), so that a metric over a benchmark is the
    mean of its column."""
    sizes = {len(samples) for samples in correct}
    if len(sizes) != 1:
        raise ValueError(f"every problem needs the same number of samples, found {sorted(sizes)}")
    n = sizes.pop()
    columns = []
    for metric in metrics:
        name, _, k = metric.partition("@")
        if name == "mean" and k in ("n", str(n)):
            columns.append([sum(samples) / n for samples in correct])
        elif name == "pass" and (k == "n" or k.isdigit() and 1 <= int(k) <= n):
            columns.append([pass_at_k(n, sum(samples), n if k == "n" else int(k)) for samples in correct])
        else:
            raise ValueError(f"unknown metric {metric!r} for {n} samples per problem: use mean@{n} or "
                             f"pass@k, k <= {n}")
    return torch.tensor(columns, dtype=torch.float64).T.reshape(len(correct), len(metrics))


def default_metrics(n: int, ks: Sequence[int] = PASS_KS) -> list[str]:
    return [f"mean@{n}"] + [f"pass@{k}" for k in ks if k <= n]


def bootstrap_means(values: torch.Tensor, resamples: int, generator: torch.Generator) -> torch.Tensor:
    """[B, S]: for each of B resamples of the P problems (uniform, with replacement: one
    torch.randint(P, (B, P)) draw), the mean of each column of values [P, S] over the resampled
    problems."""
    P = values.shape[0]
    picks = torch.randint(P, (resamples, P), generator=generator)  # [B, P]
    ones = torch.ones_like(picks, dtype=values.dtype)
    counts = torch.zeros(resamples, P, dtype=values.dtype).scatter_add_(1, picks, ones)  # [B, P] times drawn
    return counts @ values / P  # [B, S]


def percentile_interval(draws: torch.Tensor, level: float = LEVEL) -> torch.Tensor:
    """[S, 2]: the (1 - level) / 2 and (1 + level) / 2 quantiles of each column of draws [B, S]
    (linear interpolation between order statistics)."""
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=draws.dtype)
    return torch.quantile(draws, q, dim=0).T


def intervals(correct_by_problem: Mapping[str, Sequence[bool]] | Sequence[Sequence[bool]], *,
              metrics: Sequence[str] | None = None, resamples: int = RESAMPLES, seed: int = 0,
              level: float = LEVEL) -> dict[str, list[float]]:
    """Percentile bootstrap intervals over problems for one run's Mean@n and Pass@k (fractions in
    [0, 1]).

    >>> intervals({"a": [True, True], "b": [True, True]}, resamples=100)
    {'mean@2': [1.0, 1.0], 'pass@1': [1.0, 1.0], 'pass@2': [1.0, 1.0]}
    """
    by_problem = correct_by_problem
    correct = list(by_problem.values() if isinstance(by_problem, Mapping) else by_problem)
    if not correct:
        raise ValueError("intervals: no problems")
    metrics = list(metrics or default_metrics(len(correct[0])))
    draws = bootstrap_means(metric_values(correct, metrics), resamples, torch.Generator().manual_seed(seed))
    return {metric: bounds for metric, bounds in zip(metrics, percentile_interval(draws, level).tolist())}


# ----------------------------------------------------------------------------- benchmarks and prompts


def load_benchmark(spec: str, limit: int | None) -> tuple[str, list[dict], str]:
    """(name, problems, kind) for a benchmark name, a local file or a built-in set; kind is "choice"
    for GPQA, else "math". A built-in set (`arith`, `arith:max_count=5`, the demo's) is its test
    split, which never shares a problem with the training split; it is named as experiments.py names
    it (arith-max-count-5)."""
    path = Path(spec).expanduser()
    if spec == "arith" or spec.startswith("arith:"):
        name = re.sub(r"[^A-Za-z0-9.]+", "-", spec).strip("-").lower()
        problems = data.load_problems(spec, split="test", limit=limit)
    elif path.suffix in data.DATA_SUFFIXES or path.exists():
        name, problems = path.stem, data.load_problems(str(path), limit=limit)
    elif spec in HUB_BENCHMARKS:
        repo, split = HUB_BENCHMARKS[spec]
        name, problems = spec, data.load_problems(repo, split=split, limit=limit)
    elif spec == "gpqa_diamond":
        raise data.DataError("gpqa_diamond is gated on the hub: pass the path of a local copy "
                             "(e.g. ../shared/data/eval/gpqa_diamond.jsonl)")
    else:
        raise data.DataError(f"unknown benchmark {spec!r}: use one of {', '.join(HUB_BENCHMARKS)}, a .jsonl/.json "
                             "path, or the built-in arith (arith:max_count=5, the demo's)")
    return name, problems, "choice" if "gpqa" in name.lower() else "math"


def load_benchmarks(specs: str, limit: int | None, *, flag: str) -> list[tuple[str, list[dict], str]]:
    """load_benchmark for each of a comma-separated list; a failure is one DataError naming `flag`."""
    benchmarks, named = [], {}
    for spec in (spec.strip() for spec in specs.split(",") if spec.strip()):
        try:
            benchmarks.append(load_benchmark(spec, limit))
        except Exception as error:  # a missing file, a malformed line, the hub: one line naming the flag
            raise data.DataError(data.describe_load_error(error, f"{flag} {spec}")) from None
        name = benchmarks[-1][0]
        if name in named:  # results, samples and progress are keyed by the name: two would merge into one
            raise data.DataError(f"{flag}: {named[name]!r} and {spec!r} are both the benchmark {name!r}: name each "
                                 "once (a file's name is its stem: rename one of two files of the same name)")
        named[name] = spec
    return benchmarks


def render_prompts(benchmarks, tokenizer, instruction: str) -> list[tuple[str, list[dict], str]]:
    """The benchmarks with each problem's prompt_ids: the math prompt with `instruction` ('' = the
    problem alone), or GPQA's own prompt for multiple choice."""
    return [(name, data.tokenize_problems(problems, tokenizer, style="gpqa" if kind == "choice" else "math",
                                          instruction=instruction, max_prompt_tokens=10**9)[0], kind)
            for name, problems, kind in benchmarks]


def training_instruction_warning(model: str, instruction: str) -> str | None:
    """A warning when --model is a checkpoint of train.py (its training config, config.json.run,
    beside the weights; for a run's OUT/best, the run's config.json) whose math prompts had another
    instruction than this evaluation's. The evaluation keeps its own --instruction: the same flags
    give the same prompts to every model of a comparison."""
    run_config = Path(model).expanduser() / "config.json.run"
    if run_config.parent.name == "best" and not run_config.exists():
        run_config = run_config.parent.parent / "config.json"
    try:
        trained = json.loads(run_config.read_text()).get("instruction", data.MATH_INSTRUCTION)
    except (OSError, ValueError, AttributeError):  # no training config (a hub id, 'tiny'), or not one we read
        return None
    if trained == instruction:
        return None
    return (f"warning: {model} was trained with --instruction {trained!r} ({run_config.name}), this "
            f"evaluation uses {instruction!r}; pass --instruction {shlex.quote(trained)} to evaluate on the "
            "prompts it learned on")


def sampler_fn(model, tokenizer, sampling, exploration, table=None, progress: bool = True):
    """evaluate()'s generate_fn: (prompt ids, seed, row keys) -> (decoded responses, tokens
    generated, each response's token counts: diagnostics.token_counts)."""

    think_end = think_end_id(tokenizer)

    def generate_fn(prompts, seed, row_keys):
        rollout = generate(model, prompts, sampling, exploration, neighbor_table=table, seed=seed,
                           row_keys=row_keys, progress=progress)
        responses = rollout.responses()
        return (tokenizer.batch_decode(responses, skip_special_tokens=True), sum(map(len, responses)),
                token_counts(rollout.response_ids, rollout.lengths, think_end))

    return generate_fn


def summarize(correct: dict[str, list[bool]], n: int) -> dict:
    """Mean@n (mean accuracy over all samples) and Pass@k for each k <= n, averaged over problems,
    and "ci95": each one's 95% bootstrap interval over problems."""
    counts = [sum(samples) for samples in correct.values()]
    summary = {"n": n, "problems": len(counts), f"mean@{n}": sum(counts) / (n * len(counts))}
    for k in (k for k in PASS_KS if k <= n):
        summary[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in counts) / len(counts)
    summary["ci95"] = intervals(correct)  # percentile bootstrap over problems (RESAMPLES, seed 0)
    return summary


def benchmark_seed(seed: int, benchmark: str) -> int:
    """The sampling seed of every sample of one benchmark (benchmarks draw independently of each
    other)."""
    digest = hashlib.sha256(f"{seed}:{benchmark}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def sample_key(problem_index: int, sample: int) -> int:
    """The row key of a sample (rollout.generate's row_keys): its draws are a hash of
    (benchmark_seed, this key, position), whatever batch it is generated in. Independent of --n:
    with --n 8, samples 0-3 are those of --n 4."""
    return problem_index << 32 | sample


def evaluate(benchmarks, generate_fn, *, n: int, out_dir, batch_size: int, seed: int = 0, resume: bool = False,
             score_fn=None, progress: bool = True, world: World = World(), scored_by: dict | None = None,
             stop: guard.StopOnSignals | None = None) -> dict:
    """Runs every (problem, sample) of every benchmark through `generate_fn(prompt_ids, seed,
    row_keys) -> (texts, tokens)` in batches sorted by prompt length (seed: benchmark_seed;
    row_keys: each sample's sample_key), scores them with `score_fn(pairs, kind, benchmark name) ->
    [0/1]`, writes samples.jsonl and results.json (with `scored_by`, the grader settings, when
    given) under out_dir and returns the results.

    Under torchrun the batches are dealt to the ranks, W at a time (batch b to rank b % W); rank 0
    gathers each round's samples, writes them in batch order and alone writes the files. A sample's
    draws depend on its seed and key only, so the results depend on neither the world size nor the
    batch size.

    With `stop` (every rank passes one), a signal it caught ends the evaluation after the round in
    flight, on every rank alike: KeyboardInterrupt(samples in samples.jsonl, the signal's number)."""
    out_dir = Path(out_dir)
    samples_path = out_dir / "samples.jsonl"
    done = finished_samples(samples_path, resume) if world.is_main else None
    done = distributed.broadcast_object(done, world)
    results = {}
    pace = tracking.Pace(sum(-(-(-(-len(problems) * n // batch_size)) // world.size) for _, problems, _ in benchmarks),
                         sum(len(problems) for _, problems, _ in benchmarks) * n, told=not (progress and world.is_main))
    # unbuffered: a write the disk refuses fails here, naming the file, not later when the file is
    # closed
    with open(samples_path, "ab", buffering=0) if world.is_main else contextlib.nullcontext() as samples_file:
        for name, problems, kind in benchmarks:
            items = sorted(((len(p["prompt_ids"]), i, s) for i, p in enumerate(problems) for s in range(n)))
            batches = [items[i : i + batch_size] for i in range(0, len(items), batch_size)]
            rounds = range(0, len(batches), world.size)
            # Rounds a --resume finds done are skipped, not run through the bar: counted as instant,
            # they would make its rate and time to go look many times faster than sampling is. Every
            # rank skips the same (same done).
            todo = [first for first in rounds if not all(batch_done(name, problems, batch, done)
                                                         for batch in batches[first : first + world.size])]
            for _ in range(len(rounds) - len(todo)):
                pace.batch_done(0.0, generated=False)
            bar = tracking.progress(todo, total=len(rounds), initial=len(rounds) - len(todo), desc=name, unit="batch",
                                    disable=not (progress and world.is_main))
            for first in bar:
                mine, start = ([], 0), time.perf_counter()
                if first + world.rank < len(batches):
                    mine = run_batch(name, problems, kind, batches[first + world.rank], done, generate_fn, score_fn,
                                     benchmark_seed(seed, name))
                    # refresh=False: the bar draws it with its next count (a redraw now would show a
                    # stale one)
                    bar.set_postfix(tokens_per_s=f"{mine[1] / (time.perf_counter() - start):.0f}", refresh=False)
                pace.batch_done(time.perf_counter() - start, generated=mine[1] > 0)
                this_round = min(world.size, len(batches) - first)
                records = [r for records, _ in distributed.gather_dealt([mine], this_round, world) for r in records]
                done.update({(name, record["problem_id"], record["sample"]): record for record in records})
                if world.is_main:
                    append_samples(samples_file, records)
                caught = stop and distributed.max_across({"signal": float(stop.signal_number)}, world)["signal"]
                if caught:  # every rank stops after the same round, whichever got the signal
                    raise KeyboardInterrupt(len(done), int(caught))
            correct = {p["id"]: [done[(name, p["id"], s)]["correct"] for s in range(n)] for p in problems}
            results[name] = summarize(correct, n)  # and the token counts' figures, where samples carry them
            results[name].update(token_efficiency([done[(name, p["id"], s)] for p in problems for s in range(n)]))
    math_sets = [results[name] for name, _, kind in benchmarks if kind == "math"]
    if math_sets:
        results["average"] = {key: sum(r[key] for r in math_sets) / len(math_sets)
                              for key in math_sets[0] if key.startswith(("mean@", "pass@"))}
    if world.is_main:
        record = {**results, "scored_by": scored_by} if scored_by else results
        (out_dir / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    return results


def append_samples(samples_file, records: list[dict]) -> None:
    """Appends a finished batch at once, so that it survives an interruption; a refused write (a
    full disk) names the file. A torn last line is dropped by the next --resume."""
    unwritten = memoryview("".join(json.dumps(record) + "\n" for record in records).encode())
    try:
        while unwritten:
            unwritten = unwritten[samples_file.write(unwritten):]
    except OSError as error:
        raise OSError(error.errno, error.strerror, samples_file.name) from None


def finished_samples(samples_path: Path, resume: bool) -> dict:
    """The samples of an earlier run kept by --resume, by (benchmark, problem id, sample); without
    --resume the file is removed. A last line cut short by an interruption is dropped (that batch
    runs again)."""
    samples_path.parent.mkdir(parents=True, exist_ok=True)
    done = {}
    if resume and samples_path.exists():
        try:
            lines = samples_path.read_text().splitlines()
        except UnicodeDecodeError:
            raise data.DataError(f"{samples_path}: not a samples file (not text); cannot resume: pass --overwrite "
                                 "to start over") from None
        for line_no, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
                key = (record["benchmark"], record["problem_id"], record["sample"])
            except (json.JSONDecodeError, KeyError, TypeError):
                if line_no < len(lines):  # a last line cut short by an interruption is dropped; any other is not
                    raise data.DataError(f"{samples_path}:{line_no}: not a sample record; cannot resume: pass "
                                         "--overwrite to start over") from None
                break
            done[key] = record
        partial = samples_path.with_suffix(".partial")
        partial.write_text("".join(json.dumps(r) + "\n" for r in done.values()))
        os.replace(partial, samples_path)  # never lose finished samples to a second interruption
    elif samples_path.exists():
        samples_path.unlink()
    return done


def run_batch(name, problems, kind, batch, done, generate_fn, score_fn, seed) -> tuple[list[dict], int]:
    """Generates and scores one batch of (prompt length, problem index, sample) items; returns the
    records of the samples not yet in `done` (a batch of another --batch-size may have done part of
    this one) and the number of tokens generated."""
    if batch_done(name, problems, batch, done):
        return [], 0
    keys = [(name, problems[i]["id"], s) for _, i, s in batch]
    texts, num_tokens, *counts = generate_fn([problems[i]["prompt_ids"] for _, i, _ in batch], seed,
                                             [sample_key(i, s) for _, i, s in batch])
    scores = score_fn([(text, problems[i]["answer"]) for text, (_, i, _) in zip(texts, batch)], kind, name)
    records = [{"benchmark": name, "problem_id": key[1], "sample": key[2], "response": text,
                "extracted": extracted_answer(text, kind), "reference": problems[i]["answer"],
                "correct": bool(score), **count}
               for (_, i, _), key, text, score, count in zip(batch, keys, texts, scores, counts[0] if counts else
                                                            [{}] * len(texts)) if key not in done]
    return records, num_tokens


def batch_done(name, problems, batch, done) -> bool:
    """Whether every (problem, sample) of the batch is in `done` (written by an earlier run that
    --resume reads)."""
    return all((name, problems[i]["id"], s) in done for _, i, s in batch)


def extracted_answer(text: str, kind: str) -> str | None:
    return reward.extract_choice(text) if kind == "choice" else reward.extract_answer(text)


def format_table(results: dict) -> str:
    """Mean@n and pass@k in percent, then the mean tokens and thinking tokens of a sample where they were counted."""
    columns = [key for key in next(iter(results.values())) if key.startswith(("mean@", "pass@"))]
    counts = [c for c in ("tokens_mean", "think_tokens_mean") if any(c in row for row in results.values())]
    lines = [f"{'benchmark':<16}{'problems':>9}" + "".join(f"{c:>10}" for c in columns)
             + "".join(f"{c[:-5]:>13}" for c in counts)]
    for name, row in results.items():
        problems = str(row["problems"]) if "problems" in row else ""
        lines.append(f"{name:<16}{problems:>9}" + "".join(f"{100 * row[c]:>10.1f}" for c in columns)
                     + "".join(f"{row[c]:>13.1f}" if c in row else " " * 13 for c in counts))
    return "\n".join(lines)


# The Config fields eval.py shares with train.py (same flags, same help, same validation): every
# method's knobs but the table refresh, which needs optimizer steps; and the defaults of the paper's
# evaluation protocol where they differ from training's.
EVAL_FIELDS = ("model", "tokenizer", "instruction", "max_new_tokens", "temperature", "top_p", "top_k", "min_p",
               "explore", *config.THINKING, *(name for name in config.KNOBS if name != "neighbor_refresh"),
               "seed", "out_dir", "resume", "overwrite", "device", "dist_timeout_s", "grader", "reward",
               "require_boxed", "rel_tol", "reward_timeout_s", *config.JUDGE)
EVAL_DEFAULTS = dict(temperature=0.6, top_p=0.95, explore="none", out_dir="runs/eval")
# eval.py's own words for the shared flags (and section titles) whose training help would mislead
# here.
EVAL_HELP = {
    "model": "the model to evaluate (required): a Hugging Face directory such as a run's "
             "runs/ngrpo/checkpoints/step-N, a training run's --out-dir (its best checkpoint, else its latest), a "
             "hub id, or 'tiny' (random, offline)",
    "rollouts": "sampling (the paper's evaluation protocol by default)",
    "temperature": "sampling temperature (0 = greedy)",
    "top_p": "nucleus sampling threshold (1 = off)",
    "explore": "mixing at inference, an ablation (none = plain sampling, as the paper evaluates): " + "; ".join(
        f"{name} = {strategy.about}" for name, strategy in STRATEGIES.items() if name != "none"),
    "the run": "the evaluation",
    "seed": "seed of the samples' draws (each sample's draws depend on the seed, its benchmark, problem and "
            "sample number only)",
    "out_dir": "directory for samples.jsonl (one line per sample), results.json and settings.json",
    "resume": "continue an interrupted evaluation in --out-dir: its finished samples are kept (the settings must "
              "be the same)",
    "overwrite": "start over in an --out-dir that holds an earlier evaluation, deleting its samples (without it "
                 "such an evaluation stops at once)",
}
# What results.json's numbers depend on: a --resume with any of these changed would mix two
# evaluations.
RESULT_SETTINGS = ("benchmarks", "limit", "n", *(name for name in EVAL_FIELDS if name not in (
    "out_dir", "resume", "overwrite", "device", "dist_timeout_s", "reward_timeout_s", "judge_timeout_s")))
# What an out-dir written before a setting was recorded holds: eval.py then always used the paper's
# instruction; any other setting it does not hold (the sampling settings from min_p on were recorded
# from 2026-11-28; a knob added since) was at its default.
UNRECORDED_SETTINGS = {"instruction": data.MATH_INSTRUCTION, "rel_tol": None}
# A benchmark's published rule for numbers (--rel-tol unset): a relative tolerance where its own
# grader allows one. TheoremQA: within_eps, |prediction - reference| <= 0.04 |reference|
# (TIGER-AI-Lab/TheoremQA, number_utils.py, lines 19-24, used at line 83); every other benchmark
# here is graded exactly (docs/reward.md).
PUBLISHED_REL_TOL = {"theoremqa": 0.04}


def benchmark_rel_tol(name: str, rel_tol: float | None) -> float:
    """The relative tolerance a benchmark's numbers are graded with: --rel-tol if given, else its
    published rule."""
    if rel_tol is not None:
        return rel_tol
    return next((tol for key, tol in PUBLISHED_REL_TOL.items() if key in name.lower()), 0.0)


def build_parser() -> argparse.ArgumentParser:
    # A usage of one line: argparse's own lists every flag, 19 lines before each error message.
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     usage="%(prog)s [--model MODEL] [--benchmarks NAMES] [--FLAG VALUE ...] "
                                           "(--help lists every flag)")
    parser.add_argument("--benchmarks", default="aime24,aime25,amc23,math500",
                        help="comma-separated names (aime24, aime25, amc23, math500 from the hub), local "
                             ".jsonl/.json paths, or the built-in arith sets' test split (arith, arith:max_count=5 "
                             "as the demo trains); a file named *gpqa* is scored as multiple choice "
                             "(default: %(default)s)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems of each benchmark "
                        "(default: all)")
    parser.add_argument("--n", type=int, default=32, help="samples per problem (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=0, help="sequences decoded together (default: 0 = as "
                        "many as half the free GPU memory holds; 16 on a CPU)")
    cli.add_config_flags(parser, EVAL_FIELDS, EVAL_DEFAULTS, EVAL_HELP)
    return parser


def parse_args(argv=None) -> tuple[argparse.Namespace, config.Config]:
    """The eval-only flags and a Config of the shared ones, validated by the same rules as
    train.py's."""
    parser = build_parser()
    with cli.quiet_on_broken_pipe():  # --help | head
        args = parser.parse_args(argv)
    shared = {**EVAL_DEFAULTS, **{name: getattr(args, name) for name in EVAL_FIELDS if hasattr(args, name)}}
    typed = cli.typed_values(sys.argv[1:] if argv is None else argv)
    rules = [
        ("n", args.n >= 1, "must be at least 1"),
        ("limit", args.limit is None or args.limit >= 1, "must be at least 1"),
        ("batch_size", args.batch_size >= 0, "must be >= 0 (0 = automatic)"),
        ("benchmarks", all(name.strip() for name in args.benchmarks.split(",")), "names benchmarks separated by "
         "commas, none of them empty"),
    ]
    problems = [f"--{name.replace('_', '-')} {typed.get(name, getattr(args, name))}: {message}"
                for name, ok, message in rules if not ok]
    if "model" not in shared:
        problems.append("--model is required: a checkpoint directory, a hub id, or 'tiny'")
    if problems:
        parser.error("; ".join(problems))
    try:
        shared["model"], args.model_note = checkpoint_of_run(shared["model"])
        args.model = shared["model"]  # settings.json records the checkpoint: a --resume after a newer one differs
        cfg = config.Config(**shared)
        config.idle_flags(cfg, [name for name in EVAL_FIELDS if hasattr(args, name)])
    except config.ConfigError as error:
        parser.error(error.describe(typed))
    except data.DataError as error:  # a run's folder without a checkpoint
        parser.error(str(error))
    return args, cfg


def read_json_object(path: Path) -> dict:
    """A JSON file's object, or {} where there is none (no file, not JSON, not an object)."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def checkpoint_of_run(model: str) -> tuple[str, str | None]:
    """(--model as eval.py loads it, a note or None). A training run's --out-dir (a folder with
    RUN_MARKS and no weights of its own) stands for its best checkpoint (OUT/best, kept by
    --keep-best), else its newest intact one; the note says which."""
    path = Path(model).expanduser()
    if not path.is_dir() or any(path.glob("*.safetensors")):
        return model, None
    if not any((path / m).exists() for m in RUN_MARKS):
        if "out_dir" in read_json_object(path / "config.json"):  # train.py's config.json, not a model's
            raise data.DataError(f"--model {model} is a training run's folder with no checkpoint yet; pass a "
                                 "checkpoint directory, or evaluate the run once it has saved one")
        return model, None
    best = path / "best" / "best.json"
    if best.is_file():
        record = json.loads(best.read_text())
        return str(path / "best"), (f"note: --model {model} is a training run: evaluating its best checkpoint "
                                    f"{path / 'best'} (step {record['step']}, {record['metric']} "
                                    f"{record['value']:.4g})")
    found, skipped = newest_intact(checkpoint_dirs(path))
    if found is None:
        raise data.DataError(f"--model {model} is a training run's folder without an intact checkpoint"
                             f"{' (' + '; '.join(skipped) + ')' if skipped else ''}; pass a checkpoint directory")
    return str(found), f"note: --model {model} is a training run: evaluating its latest checkpoint {found}"


def settings_of(args: argparse.Namespace, cfg: config.Config) -> dict:
    settings = {name: getattr(args, name) if hasattr(args, name) else getattr(cfg, name) for name in RESULT_SETTINGS}
    settings["rel_tol"] = getattr(args, "rel_tol", None)  # unset: each benchmark's published rule
    return settings


def claim_out_dir(out_dir: Path, settings: dict, *, resume: bool, overwrite: bool) -> None:
    """An out-dir holding an earlier evaluation needs --resume (with the same settings) or
    --overwrite. Checked before anything is loaded; main writes OUT/settings.json before the first
    sample."""
    if out_dir.exists() and not out_dir.is_dir():
        raise data.DataError(f"--out-dir {out_dir} is a file, not a directory; pass another --out-dir")
    saved_path, samples = out_dir / "settings.json", out_dir / "samples.jsonl"
    if resume and saved_path.exists():
        try:
            saved = json.loads(saved_path.read_text())
        except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
            raise data.DataError(f"--resume: {saved_path} is damaged ({error}); pass --overwrite to start over") \
                from None
        if not isinstance(saved, dict):
            raise data.DataError(f"--resume: {saved_path} is not a settings file; pass --overwrite to start over")
        defaults = config.Config()
        saved = {**{name: getattr(defaults, name) for name in settings if hasattr(defaults, name)},
                 **EVAL_DEFAULTS, **UNRECORDED_SETTINGS, **saved}
        changed = [f"--{k.replace('_', '-')} {saved.get(k)!r} -> {v!r}" for k, v in settings.items()
                   if saved.get(k) != v]
        if changed:
            raise data.DataError(f"--resume: {out_dir} holds samples made with other settings ({', '.join(changed)}); "
                                 "resume with the same settings, or pass --overwrite or another --out-dir")
    elif resume and samples.exists():
        raise data.DataError(f"--resume: {out_dir} has samples but no settings.json to check them against; pass "
                             "--overwrite to start over")
    elif samples.exists() and not overwrite:
        raise data.DataError(f"{out_dir} holds an earlier evaluation (samples.jsonl); pass --resume to continue it, "
                             "--overwrite to start over there (deleting it), or another --out-dir")


def main(argv=None) -> dict:
    """Under torchrun every rank loads the model and samples its share of the batches (see
    `evaluate`)."""
    args, cfg = parse_args(argv)
    try:
        world = distributed.init_world(cfg.device, cfg.dist_timeout_s)
    except ValueError as error:
        sys.exit(f"error: {error}")
    try:  # a SIGTERM while loading stops as Ctrl-C does, with its line (its default ends the program silently)
        with guard.sigterm_interrupts(), \
                guard.exclusive(Path(cfg.out_dir), "eval.py") if world.is_main else contextlib.nullcontext():
            results = run(args, cfg, world)
        distributed.barrier(world)  # every rank done with its collectives before the group is torn down
        return results
    except KeyboardInterrupt as interrupt:  # (samples kept, signal) when evaluate stopped after a batch
        if world.is_main:  # rank 0 says it once
            print(interrupted(interrupt, Path(cfg.out_dir), list(sys.argv[1:] if argv is None else argv)),
                  file=sys.stderr)
        number = interrupt.args[1] if len(interrupt.args) > 1 else \
            signal.SIGTERM if isinstance(interrupt, guard.Terminated) else signal.SIGINT
        raise SystemExit(128 + number) from None
    except (guard.Refused, data.DataError) as error:  # another evaluation holds --out-dir, the OS refused a
        sys.exit(f"error: {error}")  # write, a damaged samples.jsonl
    except OSError as error:
        if error.errno not in guard.REFUSED_WRITES:
            raise
        sys.exit(f"error: cannot write {error.filename or cfg.out_dir}: {guard.reason(error, Path(cfg.out_dir))}")
    finally:
        distributed.close_world(world)


def interrupted(interrupt: KeyboardInterrupt, out_dir: Path, argv: list[str]) -> str:
    """What an interrupted evaluation says: the samples kept and the command that continues it. A
    second Ctrl-C (a KeyboardInterrupt with no args) drops the batch in flight; the samples written
    before it stay."""
    samples = out_dir / "samples.jsonl"
    kept = interrupt.args[0] if interrupt.args else \
        (len(samples.read_text().splitlines()) if samples.is_file() else 0)
    if not kept:
        return NOTHING_KEPT
    dropped = "" if interrupt.args else " (the batch in flight is dropped)"
    return (f"interrupted: {kept} samples kept in {samples}{dropped}; continue with: "
            f"{guard.resume_command(argv, 'eval.py')}")


def run(args: argparse.Namespace, cfg: config.Config, world: World) -> dict:
    out_dir = Path(cfg.out_dir)
    try:
        device = world.device if world.distributed else resolve_device(cfg.device)
        settings = settings_of(args, cfg)
        pools = {tol: reward.RewardPool.of(cfg, rel_tol=tol)
                 for tol in {benchmark_rel_tol(name, settings["rel_tol"]) for name in args.benchmarks.split(",")}}
        if world.is_main:
            if args.model_note:
                print(args.model_note, file=sys.stderr)
            claim_out_dir(out_dir, settings, resume=cfg.resume, overwrite=cfg.overwrite)
            warning = training_instruction_warning(cfg.model, cfg.instruction)
            if warning:
                print(warning, file=sys.stderr)
        distributed.barrier(world)
        benchmarks = load_benchmarks(args.benchmarks, args.limit, flag="--benchmarks")
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        flag = f"--model {cfg.model}"
        try:
            model = (lora.load_merged(cfg.model, dtype=dtype, device=device) if lora.is_adapter(cfg.model)
                     else load_model(cfg.model, dtype=dtype, device=device)).eval()  # a --lora-rank checkpoint merged
            flag = f"--tokenizer {cfg.tokenizer}" if cfg.tokenizer else flag
            tokenizer = data.load_tokenizer(cfg.tokenizer or cfg.model)
        except Exception as error:  # OSError, ValueError, a corrupt safetensors file, the hub: one line
            raise data.DataError(data.describe_load_error(error, flag)) from None
        cfg.check_model(model.cfg, cfg.model)
        exploration = exploration_from_config(cfg, tokenizer)
    except (data.DataError, ValueError) as error:
        sys.exit(f"error: {error}")
    prompted = render_prompts(benchmarks, tokenizer, cfg.instruction)
    table = None
    if cfg.explore == "neighbor" and world.is_main:  # built once, on rank 0, and shared
        table = table_for(model, cfg).cpu()
    table = distributed.broadcast_object(table, world)
    table = None if table is None else table.to(device)
    sampling = sampling_from_config(cfg, tokenizer)
    longest = max(len(p["prompt_ids"]) for _, problems, _ in prompted for p in problems)
    batch_size = args.batch_size or auto_batch_size(model, longest + cfg.max_new_tokens,
                                                    sum(len(p) for _, p, _ in prompted) * args.n)
    batch_size = distributed.broadcast_object(batch_size, world)  # rank 0's: batches must agree across ranks

    if world.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")
    generate_fn = sampler_fn(model, tokenizer, sampling, exploration, table, progress=world.is_main)
    tolerance = {name: benchmark_rel_tol(name, settings["rel_tol"]) for name, _, _ in prompted}
    scored_by = {"grader": cfg.grader, "reward": cfg.reward, "require_boxed": cfg.require_boxed, "rel_tol": tolerance,
                 **{name: getattr(cfg, name) for name in config.JUDGE if cfg.judge}}
    with contextlib.ExitStack() as closing, guard.StopOnSignals("this batch (every finished sample is kept)") as stop:
        for pool in pools.values():
            closing.enter_context(pool)
        results = evaluate(prompted, generate_fn, n=args.n, out_dir=out_dir, batch_size=batch_size,
                           seed=cfg.seed, resume=cfg.resume, world=world, scored_by=scored_by, stop=stop,
                           score_fn=lambda pairs, kind, name: pools[tolerance[name]].score(pairs, kind=kind))
        counts = [pool.counts() for pool in pools.values()]
        failed = distributed.sum_across({key: sum(c[key] for c in counts) for key in counts[0]}, world)
    if world.is_main:
        if cfg.judge:  # its calls and flips over every benchmark and rank, in results.json beside the grader's settings
            judged = {key: int(value) for key, value in failed.items() if key.startswith("judge")}
            record = json.loads((out_dir / "results.json").read_text())
            (out_dir / "results.json").write_text(json.dumps({**record, "judge": judged}, indent=2) + "\n")
            print("judge: " + ", ".join(f"{key[6:]} {value}" for key, value in judged.items()))
        if failed["errors"] or failed["timeouts"]:
            last = next((p.last_error for p in pools.values() if p.last_error), "on another rank")
            print(f"warning: {failed['errors']:.0f} reward error(s) and {failed['timeouts']:.0f} timeout(s) scored 0 "
                  f"(last: {last})", file=sys.stderr)
        print(format_table(results))
        print(f"results in {out_dir / 'results.json'}, samples in {out_dir / 'samples.jsonl'}")
    return results


if __name__ == "__main__":
    main()
