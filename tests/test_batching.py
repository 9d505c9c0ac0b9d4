"""Micro-batches by token budget (ngrpo.py, --micro-batch-tokens): every row replayed once, within the
budget, ranks balanced and making the same number of calls; and the same gradient, metrics, replayed
log-probs and weights as fixed-row micro-batches (the reference: the whole mini-batch in one forward); packed
micro-batches (--pack, engine/packing.py) too."""

import copy
import dataclasses
import random

import pytest
import torch

import model as M
import ngrpo
from config import Config
from neighbors import build_neighbor_table
from ngrpo import balanced_shares, budget_batches, micro_batches, replay_tokens
from rollout import Exploration, Sampling, generate
from runtime.distributed import World

PROMPTS = [[5, 9, 2], [7, 1, 4, 4, 8, 3, 6], [11], [3, 3, 9, 20, 41], [100, 101], [8] * 9, [60, 61, 62], [7]]
STOP_IDS = tuple(range(0, 262, 9))  # rows end early, at different steps
LOSS_AGG = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "token-mean-per-rows")


def cfg(**overrides) -> Config:
    return dataclasses.replace(Config(), kl_coef=0.01, logprob_chunk_tokens=16, **overrides)


@pytest.fixture(scope="module")
def tiny():
    """The tiny random model and a rollout of 8 rows (2 groups of 4) with neighbor mixing, rows of many lengths,
    some truncated at the limit."""
    model = M.load_model("tiny", dtype=torch.float32, device="cpu").eval()
    table = build_neighbor_table(model.output_weight, 2)
    rollout = generate(model, PROMPTS, Sampling(max_new_tokens=16, stop_ids=STOP_IDS),
                       Exploration("neighbor", mix_rate=0.5, num_neighbors=2), neighbor_table=table, seed=4)
    lengths = rollout.lengths.tolist()
    assert len(set(lengths)) >= 4 and rollout.finished.any() and not rollout.finished.all(), lengths
    return model, rollout


def episodes_of(rollout, *, in_loss=False) -> ngrpo.Episodes:
    g = torch.Generator().manual_seed(1)
    old_logp = rollout.logprobs + 0.5 * torch.randn(rollout.logprobs.shape, generator=g)
    ref_logp = rollout.logprobs + 0.5 * torch.randn(rollout.logprobs.shape, generator=g)
    advantages = torch.randn(len(rollout.prompts), generator=g)
    return ngrpo.Episodes(rollout, advantages, old_logp, ref_logp, rollout.finished if in_loss else None)


def gradient(model, episodes, config):
    model = copy.deepcopy(model)
    metrics = ngrpo.backward_minibatch(model, episodes, config)
    return metrics, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def assert_same_gradient(got, expected, rel=1e-5):
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        assert (got[name] - grad).norm() <= rel * max(float(grad.norm()), 1e-12), name


@pytest.mark.parametrize("loss_agg", LOSS_AGG)
def test_token_budget_gradient_equals_the_fixed_micro_batch_gradient(tiny, loss_agg):
    model, rollout = tiny
    episodes = episodes_of(rollout, in_loss=loss_agg == "token-mean")  # --mask-truncated too, once
    tokens = replay_tokens(rollout)
    reference, expected = gradient(model, episodes, cfg(loss_agg=loss_agg, micro_batch_size=len(PROMPTS)))
    assert reference["clip_frac_high"] > 0 and reference["clip_frac_low"] > 0
    for budget in (1, 2 * max(tokens), sum(tokens)):  # a row each; 2-5 rows each; the whole mini-batch
        config = cfg(loss_agg=loss_agg, micro_batch_tokens=budget)
        metrics, grads = gradient(model, episodes, config)
        assert_same_gradient(grads, expected)
        assert metrics.keys() == reference.keys()
        for key, value in reference.items():
            assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (budget, key)


def test_token_budget_gradient_with_gspo_and_on_policy(tiny):
    """GSPO's sequence ratio over a narrowed micro-batch, and the on-policy path (old log-probs from the
    update's own forward, the sampler gap measured there)."""
    model, rollout = tiny
    episodes = dataclasses.replace(episodes_of(rollout), old_logp=None)
    config = cfg(loss="gspo", loss_agg="seq-mean-token-mean")
    reference, expected = gradient(model, episodes, dataclasses.replace(config, micro_batch_size=len(PROMPTS)))
    metrics, grads = gradient(model, episodes, dataclasses.replace(config, micro_batch_tokens=30))
    assert_same_gradient(grads, expected)
    for key in ("loss", "kl", "logp_gap_mean", "logp_gap_max", "entropy"):
        assert metrics[key] == pytest.approx(reference[key], rel=1e-5, abs=1e-7), key


def test_replayed_logprobs_under_a_token_budget_equal_the_fixed_rows(tiny):
    model, rollout = tiny
    expected = ngrpo.replay_logprobs(model, rollout, cfg(micro_batch_size=3))
    got = ngrpo.replay_logprobs(model, rollout, cfg(micro_batch_tokens=25))
    mask = rollout.response_mask()
    assert got.shape == expected.shape
    assert (got - expected)[mask].abs().max() < 1e-5


def widths_replayed(monkeypatch) -> list[int]:
    """Records the response width of every micro-batch ngrpo.replay computes."""
    widths, real = [], ngrpo.replay
    monkeypatch.setattr(ngrpo, "replay", lambda model, rollout, *a, **k: widths.append(
        rollout.response_ids.shape[1]) or real(model, rollout, *a, **k))
    return widths


def test_fixed_row_micro_batches_replay_only_up_to_their_longest_response(tiny, monkeypatch):
    """Against one forward over every row at the full width (the reference holds a row truncated at the limit)."""
    model, rollout = tiny
    expected = ngrpo.replay(model, rollout, cfg())[0]
    widths = widths_replayed(monkeypatch)
    got = ngrpo.replay_logprobs(model, rollout, cfg(micro_batch_size=2))
    longest = [int(rollout.lengths[i:i + 2].max()) for i in range(0, len(PROMPTS), 2)]
    assert widths == longest and min(widths) < rollout.response_ids.shape[1]
    mask = rollout.response_mask()
    assert (got - expected)[mask].abs().max() < 1e-5


@pytest.mark.parametrize("loss_agg", LOSS_AGG)
def test_fixed_row_gradient_equals_the_whole_mini_batch_gradient(tiny, loss_agg, monkeypatch):
    model, rollout = tiny
    episodes = episodes_of(rollout, in_loss=loss_agg == "token-mean")
    reference, expected = gradient(model, episodes, cfg(loss_agg=loss_agg, micro_batch_size=len(PROMPTS)))
    widths = widths_replayed(monkeypatch)
    metrics, grads = gradient(model, episodes, cfg(loss_agg=loss_agg, micro_batch_size=2))
    assert min(widths) < rollout.response_ids.shape[1]  # some micro-batches were cut
    assert_same_gradient(grads, expected)
    for key, value in reference.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


def test_update_with_a_token_budget_gives_the_same_weights_and_metrics(tiny):
    """ngrpo.update end to end: reference replay, two mini-batches (so the old policy is replayed too), AdamW; and the
    same with packed micro-batches."""
    model, rollout = tiny
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    results, weights = [], []
    for overrides in (dict(micro_batch_size=3), dict(micro_batch_tokens=40), dict(micro_batch_tokens=40, pack=True)):
        policy = copy.deepcopy(model)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
        config = cfg(group_size=4, prompts_per_step=2, mini_batch_prompts=1, **overrides)
        result, skipped = ngrpo.update(policy, copy.deepcopy(model), optimizer, rollout, rewards, config)
        assert not skipped
        results.append(result)
        weights.append(dict(policy.named_parameters()))
    for result, weight_set in zip(results[1:], weights[1:]):
        assert results[0].keys() == result.keys()
        for key, value in results[0].items():
            assert result[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
        for name, weight in weights[0].items():
            assert float((weight_set[name] - weight).detach().abs().max()) < 1e-5, name


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_packed_micro_batches_give_the_padded_gradient_and_metrics(tiny, loss_agg):
    """--pack: each micro-batch's rows end to end (engine/packing.py), against the whole mini-batch padded in one
    forward: the same gradient (policy, KL and entropy terms) and metrics, under fixed rows and a token budget."""
    model, rollout = tiny
    episodes = episodes_of(rollout)
    config = cfg(loss_agg=loss_agg, entropy_coef=0.01)
    reference, expected = gradient(model, episodes, dataclasses.replace(config, micro_batch_size=len(PROMPTS)))
    for overrides in (dict(micro_batch_size=len(PROMPTS)), dict(micro_batch_size=3), dict(micro_batch_tokens=40)):
        metrics, grads = gradient(model, episodes, dataclasses.replace(config, pack=True, **overrides))
        assert_same_gradient(grads, expected)
        for key, value in reference.items():
            assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (overrides, key)


def test_a_packed_replay_computes_no_padded_position_and_scores_like_the_padded_one(tiny, monkeypatch):
    """The packed forward sees the rows' real positions only (prompt + response - 1 each), as one [1, N] sequence
    whose RoPE positions restart per row; its log-probs and entropies equal the padded replay's."""
    model, rollout = tiny
    shapes = []
    real_forward = M.Transformer.forward_hidden

    def seen(self, *args, **kwargs):
        shapes.append((kwargs["inputs_embeds"].shape[:2], kwargs.get("positions")))
        return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(M.Transformer, "forward_hidden", seen)
    padded = ngrpo.replay_logprobs(model, rollout, cfg(micro_batch_size=len(PROMPTS)), entropy=True)
    packed = ngrpo.replay_logprobs(model, rollout, cfg(micro_batch_size=len(PROMPTS), pack=True), entropy=True)
    lengths = [len(p) + n - 1 for p, n in zip(PROMPTS, rollout.lengths.tolist())]
    assert shapes[1][0] == (1, sum(lengths)) and sum(lengths) < shapes[0][0].numel()
    assert shapes[1][1][0].tolist() == [t for n in lengths for t in range(n)]
    mask = rollout.response_mask()
    for got, expected in zip(packed, padded):
        assert (got - expected)[mask].abs().max() < 1e-5


def fewest_runs_then_least_padding(tokens: list[int], budget: int) -> tuple[int, int]:
    """Brute force over every cut of the rows sorted longest first into consecutive runs within the budget:
    the fewest runs, and the least padded positions (sum of count x longest) among those."""
    s = sorted(tokens, reverse=True)
    best = None
    for mask in range(2 ** (len(s) - 1)):
        cuts = [0] + [i + 1 for i in range(len(s) - 1) if mask >> i & 1] + [len(s)]
        runs = list(zip(cuts, cuts[1:]))
        if all(j - i == 1 or (j - i) * s[i] <= budget for i, j in runs):
            score = (len(runs), sum((j - i) * s[i] for i, j in runs))
            best = score if best is None else min(best, score)
    return best


@pytest.mark.parametrize("seed", range(20))
def test_budget_batches_cover_every_row_once_in_fewest_runs_with_least_padding(seed):
    rng = random.Random(seed)
    tokens = [rng.randint(1, 100) for _ in range(rng.randint(1, 11))]
    budget = rng.randint(1, 400)
    batches = budget_batches(list(range(len(tokens))), tokens, budget)
    assert sorted(row for batch in batches for row in batch) == list(range(len(tokens)))
    for batch in batches:
        assert len(batch) * max(tokens[row] for row in batch) <= budget or len(batch) == 1, (batch, budget)
    padded = sum(len(batch) * max(tokens[row] for row in batch) for batch in batches)
    assert (len(batches), padded) == fewest_runs_then_least_padding(tokens, budget)


class Rows:
    """What micro_batches reads of a rollout: prompts and lengths."""

    def __init__(self, tokens):
        self.prompts = [[1] for _ in tokens]
        self.lengths = torch.tensor(tokens)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("size", [2, 3])
def test_ranks_replay_every_row_once_with_balanced_tokens_and_equal_call_counts(seed, size):
    rng = random.Random(seed)
    tokens = [rng.randint(1, 200) for _ in range(rng.randint(size, 50))]
    config = cfg(micro_batch_tokens=rng.randint(100, 800))
    plans = [micro_batches(Rows(tokens), config, World(rank=rank, size=size)) for rank in range(size)]
    assert len({len(plan) for plan in plans}) == 1  # the same number of forward / backward calls
    real = [[row for rows, is_real in plan if is_real for row in rows] for plan in plans]
    assert sorted(row for rows in real for row in rows) == list(range(len(tokens)))
    loads = [sum(tokens[row] for row in rows) for rows in real]
    assert max(loads) - min(loads) <= max(tokens)
    stand_ins = [rows for plan in plans for rows, is_real in plan if not is_real]
    assert all(rows == [tokens.index(min(tokens))] for rows in stand_ins)  # the cheapest row


def test_balanced_shares_by_hand():
    assert balanced_shares([8, 1, 5, 4, 2], 2) == [[0, 4], [2, 3, 1]]
    assert balanced_shares([3, 3, 3], 1) == [[0, 1, 2]]


def test_a_negative_budget_is_one_message():
    with pytest.raises(ValueError, match="--micro-batch-tokens -1: must be >= 0"):
        Config(micro_batch_tokens=-1)
