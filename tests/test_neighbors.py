"""neighbors.build_neighbor_table against brute force: full V x V scores in float64, no chunking."""

import pytest
import torch

import neighbors
from neighbors import build_neighbor_table

METRICS = ("cosine", "dot", "l2", "l1")


def brute_force_scores(weight: torch.Tensor, metric: str) -> torch.Tensor:
    """[V, V] float64, higher = nearer, with each row's own entry at -inf."""
    w = weight.double()
    if metric == "cosine":
        unit = w / w.norm(dim=1, keepdim=True).clamp_min(1e-12)
        scores = unit @ unit.T
    elif metric == "dot":
        scores = w @ w.T
    elif metric == "l2":
        scores = -(w[:, None, :] - w[None, :, :]).square().sum(-1).sqrt()
    else:
        scores = -(w[:, None, :] - w[None, :, :]).abs().sum(-1)
    scores.fill_diagonal_(float("-inf"))
    return scores


def brute_force_table(weight: torch.Tensor, k: int, metric: str, rows=slice(None)) -> torch.Tensor:
    scores = brute_force_scores(weight, metric)[rows]
    ranked = scores.sort(dim=1, descending=True)
    # The comparison is exact, so it is only meaningful where the ranking has no near-ties that fp32
    # chunked arithmetic could flip: check the test matrix has clear gaps among the top k + 1.
    gaps = ranked.values[:, :k] - ranked.values[:, 1:k + 1]
    assert gaps.min() > 1e-4, "test matrix has a near-tie; pick another seed"
    return ranked.indices[:, :k]


def random_weight(vocab_size: int = 53, dim: int = 16, seed: int = 4) -> torch.Tensor:
    return torch.randn(vocab_size, dim, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("chunk_size", [None, 1, 7, 53, 100])
def test_table_equals_brute_force(metric, chunk_size):
    weight = random_weight()  # V = 53: chunk sizes 7 and 100 do not divide it
    table = build_neighbor_table(weight, 5, metric, chunk_size=chunk_size)
    assert table.dtype == torch.long and table.shape == (53, 5)
    assert torch.equal(table, brute_force_table(weight, 5, metric))


def test_cosine_is_the_default_metric():
    weight = random_weight()
    assert torch.equal(build_neighbor_table(weight, 3), brute_force_table(weight, 3, "cosine"))


def test_neighbors_are_nearest_first():
    # Points on a line: the neighbors of 0.0 are 1.0, then 2.5, then 4.5, then 7.0 under every metric but dot.
    weight = torch.tensor([[0.0, 1.0], [1.0, 1.0], [2.5, 1.0], [4.5, 1.0], [7.0, 1.0]])
    for metric in ("l2", "l1"):
        assert build_neighbor_table(weight, 4, metric)[0].tolist() == [1, 2, 3, 4]
    # Cosine: the angle from (0, 1) grows with the first coordinate.
    assert build_neighbor_table(weight, 4, "cosine")[0].tolist() == [1, 2, 3, 4]
    # Dot with (0, 1) is 1 for every other row: check row 4 instead, whose dot grows with the first coordinate.
    assert build_neighbor_table(weight, 4, "dot")[4].tolist() == [3, 2, 1, 0]


@pytest.mark.parametrize("metric", METRICS)
def test_row_never_contains_its_own_id(metric):
    weight = random_weight(vocab_size=40, dim=4)
    # Under dot, a long row beats each row's own score; the table must still exclude v explicitly.
    weight[9] *= 50
    table = build_neighbor_table(weight, 39, metric, chunk_size=6)  # k = V - 1: every other id, once
    for v, row in enumerate(table.tolist()):
        assert sorted(row) == [u for u in range(40) if u != v]


@pytest.mark.parametrize("metric", METRICS)
def test_duplicate_row_is_a_neighbor_but_v_is_not(metric):
    weight = random_weight(vocab_size=30, dim=8)
    weight[17] = weight[4]
    table = build_neighbor_table(weight, 3, metric, chunk_size=4)
    assert 4 not in table[4].tolist() and 17 not in table[17].tolist()
    if metric != "dot":  # under dot a longer row can outrank an identical one
        assert table[4, 0] == 17 and table[17, 0] == 4
    # Other rows tie exactly between 4 and 17, so compare only the two rows whose ranking is tie-free.
    assert torch.equal(table[[4, 17]], brute_force_table(weight, 3, metric, rows=[4, 17]))


@pytest.mark.parametrize("metric", METRICS)
def test_bf16_weight_matches_brute_force_on_its_values(metric):
    weight = random_weight().bfloat16()
    table = build_neighbor_table(weight, 4, metric, chunk_size=10)
    assert table.dtype == torch.long
    assert torch.equal(table, brute_force_table(weight.float(), 4, metric))


def test_zero_rows_under_cosine_give_valid_ids():
    weight = random_weight(vocab_size=40, dim=8, seed=1)
    weight[[0, 21]] = 0.0
    table = build_neighbor_table(weight, 3, "cosine", chunk_size=8)
    for v, row in enumerate(table.tolist()):
        assert len(set(row)) == 3 and v not in row and all(0 <= u < 40 for u in row)
    nonzero = [v for v in range(40) if v not in (0, 21)]
    assert torch.equal(table[nonzero], brute_force_table(weight, 3, "cosine", rows=nonzero))


def test_cache_returns_identical_table_without_searching_again(tmp_path, monkeypatch):
    weight = random_weight()
    built = build_neighbor_table(weight, 3, "l2", cache_dir=tmp_path / "cache")
    assert len(list((tmp_path / "cache").iterdir())) == 1

    def search_must_not_run(*args, **kwargs):
        raise AssertionError("the cached table should have been loaded")

    monkeypatch.setattr(neighbors, "_search", search_must_not_run)
    loaded = build_neighbor_table(weight.clone(), 3, "l2", cache_dir=tmp_path / "cache")
    assert torch.equal(loaded, built) and torch.equal(loaded, brute_force_table(weight, 3, "l2"))


def test_changed_weight_k_or_metric_gives_a_new_cache_entry(tmp_path):
    weight = random_weight()
    changed = weight.clone()
    changed[11, 3] += 1e-3
    build_neighbor_table(weight, 3, "cosine", cache_dir=tmp_path)
    build_neighbor_table(changed, 3, "cosine", cache_dir=tmp_path)
    build_neighbor_table(weight, 4, "cosine", cache_dir=tmp_path)
    build_neighbor_table(weight, 3, "dot", cache_dir=tmp_path)
    build_neighbor_table(weight.bfloat16(), 3, "cosine", cache_dir=tmp_path)
    files = list(tmp_path.iterdir())
    assert len(files) == 5 and all(f.suffix == ".pt" for f in files)  # no temp files left behind
    assert torch.equal(build_neighbor_table(changed, 3, "cosine", cache_dir=tmp_path),
                       brute_force_table(changed, 3, "cosine"))


@pytest.mark.parametrize("weight, k, metric, message", [
    (torch.randn(8, 4), 8, "cosine", "k must be between 1 and V - 1"),
    (torch.randn(8, 4), 0, "cosine", "k must be between 1 and V - 1"),
    (torch.randn(8, 4), 2, "euclid", "unknown neighbor metric 'euclid'"),
    (torch.randn(8), 2, "cosine", "2-D floating-point"),
    (torch.randn(2, 8, 4), 2, "cosine", "2-D floating-point"),
    (torch.arange(32).view(8, 4), 2, "cosine", "2-D floating-point"),
])
def test_bad_arguments_raise_a_clear_value_error(weight, k, metric, message):
    with pytest.raises(ValueError, match=message):
        build_neighbor_table(weight, k, metric)


def test_bad_chunk_size_raises_a_clear_value_error():
    with pytest.raises(ValueError, match="chunk_size must be at least 1"):
        build_neighbor_table(torch.randn(8, 4), 2, chunk_size=0)


def test_a_long_search_reports_every_row_to_its_progress_bar(monkeypatch):
    """The bar (tracking.progress: stderr, shown after 3 s) counts the vocabulary's rows, chunk by chunk, to the
    end."""
    bars = []

    class Recorder:
        def __init__(self, **kwargs):
            self.kwargs, self.done, self.closed = kwargs, 0, False
            bars.append(self)

        def update(self, rows):
            self.done += rows

        def close(self):
            self.closed = True

    monkeypatch.setattr(neighbors, "progress", Recorder)
    build_neighbor_table(torch.randn(50, 8), 2, chunk_size=7)
    (bar,) = bars
    assert bar.kwargs["total"] == 50 and bar.done == 50 and bar.closed
    assert bar.kwargs["delay"] > 0  # nothing printed for a search of a few seconds
