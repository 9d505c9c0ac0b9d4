"""The long-tail workload of the benchmarks (benchmarks/long_tail.py): the length distribution the issue
describes, and rows that end exactly at their drawn lengths in every engine."""

import argparse
import math
import random

import pytest
import torch

from benchmarks import long_tail
from rollout import Sampler, Sampling, generate


def test_the_lognormal_has_the_asked_mean_and_share_at_the_limit_by_monte_carlo():
    mu, sigma = long_tail.lognormal_for(0.4, 0.1)
    rng = random.Random(0)
    draws = [rng.lognormvariate(mu, sigma) for _ in range(200_000)]
    # Standard errors: ~0.0007 for the share at the limit, ~0.0006 for the capped mean.
    assert sum(x >= 1 for x in draws) / len(draws) == pytest.approx(0.1, abs=0.003)
    assert sum(min(x, 1.0) for x in draws) / len(draws) == pytest.approx(0.4, abs=0.003)


def test_an_impossible_distribution_is_a_clear_error():
    with pytest.raises(ValueError, match="no log-normal"):
        long_tail.lognormal_for(0.05, 0.1)  # a mean below the share at the limit


def test_long_tail_lengths_have_the_distributions_shape_even_for_few_rows():
    many = long_tail.long_tail_lengths(20_000, 2048, seed=0)
    assert all(1 <= n <= 2048 for n in many)
    assert sum(many) / len(many) / 2048 == pytest.approx(0.4, abs=0.005)
    assert sum(n == 2048 for n in many) / len(many) == pytest.approx(0.1, abs=1e-3)  # stratified: ~exact
    few = long_tail.long_tail_lengths(32, 2048, seed=0)
    assert sum(n == 2048 for n in few) in (3, 4)  # 32 x 0.1 = 3.2
    assert few == long_tail.long_tail_lengths(32, 2048, seed=0) != long_tail.long_tail_lengths(32, 2048, seed=1)
    assert few != sorted(few) and few != sorted(few, reverse=True)  # in a random order


@pytest.mark.parametrize("refill", [True, False])
def test_rows_end_at_their_drawn_lengths_in_every_engine(monkeypatch, refill):
    max_new_tokens = 24
    lengths = [5, 24, 1, 17, 24, 9, 12]  # two at the limit: truncated, not stopped
    model = long_tail.long_tail_model(argparse.Namespace(vocab=64), torch.device("cpu"))
    monkeypatch.setattr(Sampler, "__call__", long_tail.forced_lengths_sampler(lengths, max_new_tokens, 0, "cpu"))
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 64) for _ in range(rng.randint(2, 9))] for _ in lengths]
    sampling = Sampling(max_new_tokens=max_new_tokens, stop_ids=(0,))
    rollout = generate(model, prompts, sampling, seed=3, slots=3, refill=refill)
    assert rollout.lengths.tolist() == lengths
    assert rollout.finished.tolist() == [n < max_new_tokens for n in lengths]
    for row, (response, n) in enumerate(zip(rollout.responses(), lengths)):
        assert (response[-1] == 0) == (n < max_new_tokens) and 0 not in response[:-1]
        assert all(math.isfinite(p) for p in rollout.logprobs[row, :n].tolist())  # no token drawn at p = 0


def test_the_rehearsal_meters_functions_that_exist():
    """bench.py rehearsal meters train.py's phases by wrapping functions by name: a reshape that moves one breaks the
    rehearsal at its start, which only a 7-minute CPU run or a GPU session would otherwise notice."""
    import ast
    import inspect

    from benchmarks import rehearsal

    calls = [node for node in ast.walk(ast.parse(inspect.getsource(rehearsal.rehearse)))
             if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "wrap"]
    wrapped = [(call.args[0].id, call.args[1].value) for call in calls]
    assert len(wrapped) == 8, wrapped
    missing = [(module, name) for module, name in wrapped if not hasattr(vars(rehearsal)[module], name)]
    assert not missing, missing
