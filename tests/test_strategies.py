"""strategies/released.py: the released code's other exploration strategies (topk, topk-gumbel, gaussian_embed_noise,
orthogonal_noise) and its entropy gate, one decode step at a time, against hand computations on small
logits. The arithmetic follows the release's sglang `layers/sampler.py` (the `mix_strategy` branches),
read by hand: every score is the already-softmaxed p divided by tau once more."""

import math

import pytest
import torch

import strategies
from engine.draws import GUMBEL, RowDraws
from strategies import Exploration, StepView, base, released

Z = [1.0, 3.0, 0.5, 2.0, -1.0]  # one row's logits; p's order: token 1, 3, 0, 2, 4


def softmax(xs: list[float]) -> list[float]:
    top = max(xs)
    e = [math.exp(x - top) for x in xs]
    total = sum(e)
    return [v / total for v in e]


def entropy(xs: list[float]) -> float:
    return -sum(q * math.log(q) for q in xs)


def step_view(exploration: Exploration, z_rows: list[list[float]], *, tau: float = 1.0, coin: float = 0.0,
              embed: torch.Tensor | None = None, seed: int = 0) -> StepView:
    """One decode step of len(z_rows) rows (row keys 0, 1, ...), every row eligible, p = softmax(z / tau)
    computed here in float64, token y = 4 (never a top candidate), coin as given."""
    B, V = len(z_rows), len(z_rows[0])
    probs = torch.tensor([softmax([v / tau for v in z]) for z in z_rows])
    embed = torch.eye(V, 8) if embed is None else embed
    draws = RowDraws(seed, torch.arange(B), torch.zeros(B, dtype=torch.long))
    return StepView(exploration, torch.tensor(z_rows) / tau, probs.float(), torch.full((B,), 4),
                    torch.ones(B, dtype=torch.bool), torch.full((B,), coin, dtype=torch.float64), tau, embed,
                    None, draws, {}, torch.tensor(z_rows))


@pytest.mark.parametrize("tau, t", [(1.0, 0.0), (1.0, 0.7), (0.5, 1.0)])
def test_topk_weights_are_a_softmax_of_probabilities(tau, t):
    view = step_view(Exploration("topk", soft_top_k=3, mix_temperature=t, mix_rate=0.5), [Z], tau=tau)
    p = softmax([v / tau for v in Z])
    cand = [1, 3, 0]  # the three most likely tokens
    expected = softmax([p[c] / (tau * (t or 1.0)) for c in cand])
    mixture = released.explore_topk(view)
    assert mixture.cand_ids.tolist() == [cand] and bool(mixture.mixed[0])
    assert torch.allclose(mixture.cand_weights, torch.tensor([expected]), atol=1e-6)
    E = view.embed
    assert torch.allclose(mixture.inputs[0], sum(w * E[c] for w, c in zip(expected, cand)), atol=1e-6)


def test_topk_at_an_unmixed_step_feeds_the_sampled_token():
    view = step_view(Exploration("topk", soft_top_k=3, mix_rate=0.5), [Z], coin=0.9)
    mixture = released.explore_topk(view)
    assert not bool(mixture.mixed[0])
    assert mixture.cand_ids.tolist() == [[4, 4, 4]] and mixture.cand_weights.tolist() == [[1.0, 0.0, 0.0]]
    assert torch.equal(mixture.inputs[0], view.embed[4])


def test_topk_gumbel_ranks_by_gumbel_perturbed_scores_and_weighs_without_them():
    rows = 16
    t = 0.7
    view = step_view(Exploration("topk-gumbel", soft_top_k=3, mix_temperature=t, mix_rate=0.5), [Z] * rows, seed=3)
    mixture = released.explore_topk_gumbel(view)
    p = softmax(Z)
    u = view.draws.uniform(GUMBEL, len(Z))  # the step's uniforms (the draws are tested on their own, test_draws.py)
    for row in range(rows):
        ranked = [p[i] / t - math.log(-math.log(min(max(float(u[row, i]), 1e-6), 1 - 1e-6))) for i in range(5)]
        cand = sorted(range(5), key=lambda i: -ranked[i])[:3]
        assert mixture.cand_ids[row].tolist() == cand
        expected = softmax([p[c] / t for c in cand])
        assert torch.allclose(mixture.cand_weights[row], torch.tensor(expected), atol=1e-6)


def test_topk_gumbel_first_candidate_follows_the_second_softmax():
    """Gumbel-max: the first candidate is distributed as softmax(p / (tau t)) over the vocabulary, a nearly
    uniform law: the greedy token (p = 0.64) is first only ~1.9 / 6.3 of the time."""
    rows = 4000
    view = step_view(Exploration("topk-gumbel", soft_top_k=2, mix_rate=1.0), [Z] * rows, seed=11)
    first = released.explore_topk_gumbel(view).cand_ids[:, 0]
    q = softmax(softmax(Z))
    for token in range(5):
        freq = float((first == token).float().mean())
        assert abs(freq - q[token]) < 4 * math.sqrt(q[token] * (1 - q[token]) / rows)


def test_gaussian_embed_noise_feeds_topk_plus_scaled_noise_and_records_the_clean_mixture():
    rows, d, sigma = 64, 64, 0.5
    torch.manual_seed(0)
    E = torch.randn(5, d)
    view = step_view(Exploration("gaussian_embed_noise", soft_top_k=3, mix_rate=0.5, noise_sigma=sigma), [Z] * rows,
                     embed=E)
    mixture = released.explore_gaussian_embed_noise(view)
    p = softmax(Z)
    expected = softmax([p[c] for c in (1, 3, 0)])
    clean = sum(w * E[c] for w, c in zip(expected, (1, 3, 0)))  # [d]
    assert mixture.mixed.all() and (mixture.cand_ids == torch.tensor([1, 3, 0])).all()
    assert torch.allclose(mixture.cand_weights, torch.tensor([expected]).expand(rows, 3), atol=1e-6)
    standard = (mixture.inputs - clean) / (sigma * clean.pow(2).mean().sqrt())  # [rows, d]: N(0, 1)
    assert abs(float(standard.mean())) < 4 / math.sqrt(rows * d)
    assert abs(float(standard.std()) - 1) < 0.05
    assert not mixture.extra  # no noise is recorded: the replay feeds the clean mixture


def test_gaussian_embed_noise_under_the_entropy_gate_noises_unmixed_thinking_steps_too():
    """The release's mask under `mix_rate: null` is every thinking step: E[y] + noise where the gate is shut."""
    rows, d = 64, 32
    E = torch.randn(5, d, generator=torch.Generator().manual_seed(1))
    x = Exploration("gaussian_embed_noise", soft_top_k=3, noise_sigma=0.3, mix_entropy_threshold=100.0)
    mixture = released.explore_gaussian_embed_noise(step_view(x, [Z] * rows, embed=E))
    assert not mixture.mixed.any() and (mixture.cand_ids[:, 0] == 4).all()
    standard = (mixture.inputs - E[4]) / (0.3 * E[4].pow(2).mean().sqrt())
    assert abs(float(standard.std()) - 1) < 0.05


# Embeddings for orthogonal_noise, d = 3; the anchor is token 1 and the next two top tokens are 3 and 0.
E3 = torch.tensor([[0.0, 3.0, -1.0], [1.0, 1.0, 0.0], [5.0, 5.0, 5.0], [2.0, 0.0, 1.0], [0.0, 0.0, 7.0]])
# By hand: E[3] - (E[3].E[1] / |E[1]|^2) E[1] = [2, 0, 1] - (2 / 2) [1, 1, 0] = [1, -1, 1], norm sqrt(3);
# E[0] - (3 / 2) [1, 1, 0] = [-1.5, 1.5, -1], norm sqrt(5.5).
ORTH_NORMS = [math.sqrt(3.0), math.sqrt(5.5)]


@pytest.mark.parametrize("tau, t", [(1.0, 0.0), (0.8, 0.7)])
def test_orthogonal_noise_scale_by_hand(tau, t):
    rows = 2000
    x = Exploration("orthogonal_noise", soft_top_k=3, mix_temperature=t, mix_rate=0.5)
    view = step_view(x, [Z] * rows, tau=tau, embed=E3)
    mixture = released.explore_orthogonal_noise(view)
    p = softmax([v / tau for v in Z])
    tt = t or 1.0
    w = softmax([p[3] / (tau * tt * tt), p[0] / (tau * tt * tt)])  # the release divides by t twice
    scale = math.sqrt(sum((wk * nk) ** 2 for wk, nk in zip(w, ORTH_NORMS)))
    assert mixture.cand_ids.tolist() == [[1]] * rows and mixture.cand_weights.tolist() == [[1.0]] * rows
    assert mixture.mixed.all()
    assert torch.allclose(mixture.extra["noise_scales"], torch.full((rows,), scale), atol=1e-6)
    standard = (mixture.inputs - E3[1]) / scale  # [rows, 3]: N(0, 1) in every coordinate
    assert abs(float(standard.mean())) < 4 / math.sqrt(3 * rows)
    assert abs(float(standard.std()) - 1) < 0.05


def test_orthogonal_noise_with_one_candidate_or_unmixed_feeds_plain_rows():
    E = E3
    alone = released.explore_orthogonal_noise(step_view(Exploration("orthogonal_noise", soft_top_k=1), [Z], embed=E))
    assert torch.equal(alone.inputs[0], E[1]) and float(alone.extra["noise_scales"][0]) == 0.0  # no other token
    x = Exploration("orthogonal_noise", soft_top_k=3, mix_rate=0.5)
    unmixed = released.explore_orthogonal_noise(step_view(x, [Z], embed=E, coin=0.9))
    assert torch.equal(unmixed.inputs[0], E[4]) and float(unmixed.extra["noise_scales"][0]) == 0.0
    assert unmixed.cand_ids.tolist() == [[4]]


ROWS_Z = [Z, [0.0, 0.1, 0.0, 0.2, 0.0], [9.0, 0.0, 0.0, 0.0, 0.0], [2.0, 2.0, 1.0, 1.0, 0.0]]


@pytest.mark.parametrize("strategy", ["neighbor", "topk", "topk-gumbel", "gaussian", "gaussian_embed_noise",
                                      "orthogonal_noise"])
@pytest.mark.parametrize("tau", [1.0, 0.6])
def test_entropy_gate_mixes_the_steps_whose_released_entropy_reaches_the_threshold(strategy, tau):
    """The release's `latent_entropy`: of softmax(p / tau) over the vocabulary, p = softmax(z / tau)."""
    entropies = [entropy(softmax([q / tau for q in softmax([v / tau for v in z])])) for z in ROWS_Z]
    threshold = sorted(entropies)[1] + 1e-4  # between the 2nd and 3rd lowest: two rows mix
    top_k = {} if strategy == "neighbor" else dict(soft_top_k=2)  # neighbor reads no top-k
    x = Exploration(strategy, mix_rate=0.0, mix_entropy_threshold=threshold, **top_k)
    view = step_view(x, ROWS_Z, tau=tau, coin=0.99)
    view.cand_table = strategies.candidate_table(torch.tensor([[1], [2], [3], [4], [0]]), 1)
    mixed = strategies.STRATEGIES[strategy].explore(view).mixed
    assert mixed.tolist() == [h >= threshold for h in entropies] and int(mixed.sum()) == 2


def test_released_entropy_barely_moves_on_a_real_vocabulary():
    """docs/algorithm.md's finding: at V = 151,936 (R1-Distill) the gate's entropy is log V to within ~1e-5 for a sure
    and for a flat distribution alike, less than fp32's rounding of a sum of V terms (~1e-3): no threshold
    separates confident steps from uncertain ones."""
    V = 151936
    x = Exploration("topk", mix_entropy_threshold=1.0)
    sure = [30.0] + [0.0] * (V - 1)  # p(token 0) = 1 - 1.4e-8
    sharp = float(base.released_entropy(step_view(x, [sure]))[0])
    flat = float(base.released_entropy(step_view(x, [[0.0] * V]))[0])
    # p one-hot: q = [e, 1, ..., 1] / (e + V - 1), so H = log(e + V - 1) - e / (e + V - 1)
    by_hand = math.log(math.e + V - 1) - math.e / (math.e + V - 1)
    assert abs(by_hand - math.log(V)) < 1e-5
    # fp32 sums of V terms, whose order (hence rounding) depends on the threads: ~1e-3, 2.008e-3 seen once
    assert abs(sharp - by_hand) < 4e-3 and abs(flat - math.log(V)) < 4e-3
