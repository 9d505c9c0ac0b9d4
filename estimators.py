"""Estimators over a benchmark's samples: unbiased Pass@k, Mean@n, and percentile bootstrap intervals over
problems. eval.py reports them, analysis.py and experiments.py compare runs with them; nothing here knows
where the samples came from."""

import math
from collections.abc import Mapping, Sequence

import torch

PASS_KS = (1, 2, 4, 8, 16, 32)
RESAMPLES = 10_000  # bootstrap draws and permutation draws; the Monte Carlo error of a 95% bound is ~0.2%
LEVEL = 0.95


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def metric_values(correct: Sequence[Sequence[bool]], metrics: Sequence[str]) -> torch.Tensor:
    """[P, S] float64: each problem's value of each metric, "mean@n" (its accuracy c / n) or "pass@k" (the
    unbiased estimator; "pass@n" is k = n), so that a metric over a benchmark is the mean of its column."""
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
    """[B, S]: for each of B resamples of the P problems (uniform, with replacement: one torch.randint(P,
    (B, P)) draw), the mean of each column of values [P, S] over the resampled problems."""
    P = values.shape[0]
    picks = torch.randint(P, (resamples, P), generator=generator)  # [B, P]
    ones = torch.ones_like(picks, dtype=values.dtype)
    counts = torch.zeros(resamples, P, dtype=values.dtype).scatter_add_(1, picks, ones)  # [B, P] times drawn
    return counts @ values / P  # [B, S]


def percentile_interval(draws: torch.Tensor, level: float = LEVEL) -> torch.Tensor:
    """[S, 2]: the (1 - level) / 2 and (1 + level) / 2 quantiles of each column of draws [B, S] (linear
    interpolation between order statistics)."""
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=draws.dtype)
    return torch.quantile(draws, q, dim=0).T


def intervals(correct_by_problem: Mapping[str, Sequence[bool]] | Sequence[Sequence[bool]], *,
              metrics: Sequence[str] | None = None, resamples: int = RESAMPLES, seed: int = 0,
              level: float = LEVEL) -> dict[str, list[float]]:
    """Percentile bootstrap intervals over problems for one run's Mean@n and Pass@k (fractions in [0, 1]).

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
