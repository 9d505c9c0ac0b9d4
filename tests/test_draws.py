"""engine/draws.py's counter-based draws: the hash against a pure-Python splitmix64, and the distributions it gives
(uniforms, normals, and the inverse-CDF token draw of rollout.sample_tokens) against their targets."""

import math

import torch

from engine.draws import COIN, NOISE, TOKEN, RowDraws, bits_to_uniform, seed_state
from rollout import sample_tokens

M64 = (1 << 64) - 1


def splitmix64_mix(z: int) -> int:
    """The reference finaliser on Python's unbounded ints, masked to 64 bits by hand."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def reference_bits(seed: int, stream: int, key: int, position: int, index: int) -> int:
    golden = 0x9E3779B97F4A7C15
    state = splitmix64_mix(((seed & M64) + golden) & M64)
    state = splitmix64_mix((key * golden + state + stream) & M64)
    state = splitmix64_mix(state ^ ((position * 0xBF58476D1CE4E5B9) & M64))
    return splitmix64_mix((state + (index + 1) * golden) & M64)


def test_bits_equal_a_pure_python_splitmix64():
    keys, positions = torch.tensor([0, 1, 7, 123456789]), torch.tensor([0, 5, 8191, 3])
    for seed in (0, 42, 2**63 + 5):
        got = RowDraws(seed, keys, positions).bits(TOKEN, 3)
        for b in range(4):
            for i in range(3):
                expected = reference_bits(seed, TOKEN, int(keys[b]), int(positions[b]), i)
                assert int(got[b, i]) & M64 == expected


def test_a_tuple_seed_folds_each_part_and_differs_from_its_parts():
    assert seed_state((3, 4)) != seed_state((4, 3)) != seed_state(3)
    assert seed_state((3, 4)) == seed_state((3, 4))


def test_uniforms_are_never_0_or_1_and_are_uniform():
    extremes = bits_to_uniform(torch.tensor([0, -1, 2**62]))  # all-zero bits, all-one bits, the middle
    assert 0.0 < float(extremes[0]) < 1e-15 and 1.0 - 1e-15 < float(extremes[1]) < 1.0
    u = RowDraws(0, torch.arange(4000), torch.zeros(4000, dtype=torch.long)).uniform(COIN, 50).flatten()
    counts = torch.histc(u, bins=20, min=0, max=1)
    expected = u.numel() / 20
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 43.8  # chi-square, 19 degrees of freedom, p = 0.001
    assert abs(float(u.mean()) - 0.5) < 0.002


def test_normals_have_mean_0_and_variance_1():
    z = RowDraws(1, torch.arange(2000), torch.arange(2000)).normal(NOISE, 100).double().flatten()
    assert abs(float(z.mean())) < 0.005 and abs(float(z.var()) - 1.0) < 0.01
    assert abs(float((z > 1.96).double().mean()) - 0.025) < 0.001


def test_token_draws_follow_p_down_to_tiny_probabilities():
    """200k draws from p with a 2e-4 token: the counts pass a chi-square test against p."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.0498, 2e-4], dtype=torch.float32)
    n = 200_000
    draws = RowDraws(7, torch.arange(n), torch.full((n,), 3))
    tokens = sample_tokens(p.expand(n, -1), draws.uniform(TOKEN, 1)[:, 0])
    counts = torch.bincount(tokens, minlength=5).double()
    expected = n * p.double()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.47  # 4 degrees of freedom, p = 0.001
    assert 20 <= int(counts[4]) <= 62  # 40 expected: a tiny probability is neither lost nor inflated


def test_rows_positions_streams_and_seeds_draw_independently():
    keys, positions = torch.arange(3), torch.tensor([4, 4, 4])
    base = RowDraws(0, keys, positions).bits(TOKEN, 8)
    assert len(set(base.flatten().tolist())) == 24
    others = (RowDraws(1, keys, positions).bits(TOKEN, 8), RowDraws(0, keys, positions + 1).bits(TOKEN, 8),
              RowDraws(0, keys, positions).bits(COIN, 8), RowDraws(0, keys + 3, positions).bits(TOKEN, 8))
    for other in others:
        assert not (other == base).any()
    # A row's draws do not depend on the other rows beside it.
    assert torch.equal(RowDraws(0, keys[1:2], positions[1:2]).bits(TOKEN, 8), base[1:2])
    assert math.isfinite(float(RowDraws(0, keys, positions).normal(NOISE, 4).sum()))


def test_a_token_of_probability_0_is_never_drawn_even_at_the_extreme_uniforms():
    p = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0]]).expand(3, -1)
    uniforms = bits_to_uniform(torch.tensor([0, -1, 2**62]))  # the smallest, the largest, and 0.25
    assert sample_tokens(p, uniforms).tolist() == [1, 3, 1]



def test_the_two_level_inverse_cdf_draws_what_one_scan_along_the_vocabulary_draws():
    """Against the definition (the first token whose float64 cumulative sum exceeds u * sum p, one scan per row):
    a vocabulary that is no multiple of the block, whole blocks of p = 0, a single token, the mass in the last,
    partial block. Exactly at a block's edge the two sums round differently (the last bit): there either token
    beside the edge with p > 0 is right, and never a token of p = 0."""
    torch.manual_seed(0)
    V = 1000
    p = torch.rand(6, V) ** 4
    p[:, 128:384] = 0  # two whole blocks with no mass
    p[1, :900] = 0  # the mass only in the last, partial block
    p[2] = 0
    p[2, 129] = 1.0  # a single token
    p[3, ::7] = 0
    probs = p.repeat_interleave(500, 0)
    uniforms = bits_to_uniform(torch.randint(-2**63, 2**63 - 1, (len(probs),)))
    cdf = probs.double().cumsum(-1)  # the reference, one scan per row
    total = cdf[:, -1:]
    target = torch.minimum(uniforms[:, None] * total, total.nextafter(torch.zeros_like(total)))
    assert torch.equal(sample_tokens(probs, uniforms), torch.searchsorted(cdf, target, right=True)[:, 0])

    edge = (cdf[:, 127] / total[:, 0]).clamp(max=1 - 2**-53)  # u at the end of the first block
    drawn = sample_tokens(probs, edge)
    assert bool((probs.gather(1, drawn[:, None]) > 0).all())
    before = torch.where(probs[:, :128] > 0, torch.arange(128), -1).amax(-1)  # the last token with p > 0 up to it
    after = torch.where(probs[:, 128:] > 0, torch.arange(128, V), V).amin(-1)  # the first after it
    assert bool(((drawn == before) | (drawn == after) | (total[:, 0] == cdf[:, 127])).all())
