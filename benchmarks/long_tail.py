"""The long-tail workload the rollout and update benchmarks share: a small random model at a shape where
attention matters on a CPU, log-normal response lengths with a share at the limit, and a sampler that ends
each row exactly at its drawn length in every engine."""

import math
import random
import statistics

import torch

from benchmarks.common import torch_dtype
from model import ModelConfig, random_model
from rollout import Sampler


def long_tail_model(args, device):
    """A random model at a shape where attention matters on a CPU: hidden 256, 2 layers, 4 query / 2 KV
    heads, `args.vocab` tokens."""
    config = ModelConfig(family="qwen2", vocab_size=args.vocab, hidden_size=256, intermediate_size=768,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64, qkv_bias=True,
                         max_position_embeddings=8192)
    return random_model(config, dtype=torch_dtype(device), device=device, seed=0).eval()


# The long-tail workload's response lengths, as fractions of max_new_tokens: a log-normal L / max with
# mean LONG_TAIL_MEAN after lengths past the limit are cut to it, where LONG_TAIL_AT_LIMIT of the rows end.
LONG_TAIL_MEAN, LONG_TAIL_AT_LIMIT = 0.4, 0.1


def lognormal_for(mean: float, at_limit: float) -> tuple[float, float]:
    """(mu, sigma) of log X ~ N(mu, sigma^2) with P(X >= 1) = at_limit and E[min(X, 1)] = mean.

    P(X >= 1) = at_limit fixes mu = -z sigma (z: the standard normal's 1 - at_limit quantile), and
    E[min(X, 1)] = exp(mu + sigma^2 / 2) Phi(-(mu + sigma^2) / sigma) + at_limit falls as sigma grows, so
    sigma is found by bisection. For (0.4, 0.1): sigma = 0.924, median exp(mu) = 0.306."""
    normal = statistics.NormalDist()
    z = normal.inv_cdf(1 - at_limit)

    def capped_mean(sigma: float) -> float:
        mu = -z * sigma
        return math.exp(mu + sigma**2 / 2) * normal.cdf(-(mu + sigma**2) / sigma) + at_limit

    if not at_limit < mean < capped_mean(1e-6):
        raise ValueError(f"no log-normal has mean {mean} below the limit with {at_limit} of it at the limit")
    low, high = 1e-6, 20.0
    for _ in range(100):
        sigma = (low + high) / 2
        low, high = (sigma, high) if capped_mean(sigma) > mean else (low, sigma)
    return -z * sigma, sigma


def long_tail_lengths(rows: int, max_new_tokens: int, seed: int) -> list[int]:
    """Response lengths in 1..max_new_tokens from the log-normal of lognormal_for(LONG_TAIL_MEAN,
    LONG_TAIL_AT_LIMIT), drawn by stratified quantiles: row i gets the quantile (k_i + u_i) / rows, k a
    seeded permutation and u_i uniform, so that even 32 rows have the distribution's shape (3-4 of them
    at the limit, not anywhere from 0 to 8) in a seeded random order."""
    rng = random.Random(f"long-tail lengths {seed}")  # not the stream the bench draws its prompts from
    mu, sigma = lognormal_for(LONG_TAIL_MEAN, LONG_TAIL_AT_LIMIT)
    normal = statistics.NormalDist(mu, sigma)
    strata = rng.sample(range(rows), rows)
    return [min(max_new_tokens, max(1, math.ceil(max_new_tokens * math.exp(normal.inv_cdf((k + rng.random())
                                                                                             / rows)))))
            for k in strata]


def forced_lengths_sampler(lengths: list[int], max_new_tokens: int, stop_id: int, device):
    """A rollout.Sampler.__call__ under which row i samples stop_id at response position lengths[i] - 1
    and never before (never at all when lengths[i] = max_new_tokens: the row is truncated at the limit).
    A random model's own stop decisions cannot follow a chosen distribution; this makes every row's length
    the drawn one in every engine, and leaves the rest of the step (forward, sampling, record) as it is."""
    sample = Sampler.__call__
    # [N + 1]: each row's stop position; the last entry is for empty slots (row -1), which are never live.
    stop_at = torch.tensor([n - 1 if n < max_new_tokens else max_new_tokens for n in lengths]
                           + [max_new_tokens], device=device)

    def forced(sampler, logits, state, *rest):
        at_stop = state.length == stop_at[state.row]  # [S]
        is_stop = torch.arange(logits.shape[1], device=logits.device) == stop_id  # [V]
        stop_logit = torch.where(at_stop, 0.0, float("-inf"))[:, None]  # [S, 1]
        others = torch.where(at_stop[:, None], float("-inf"), logits)  # [S, V]
        return sample(sampler, torch.where(is_stop, stop_logit, others), state, *rest)

    return forced
