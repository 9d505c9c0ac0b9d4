"""rollout.py: the sampler against full forwards of transformers' own model, the mixing rules of docs/algorithm.md
against hand computations, and the statistics of the exploration strategies."""

import math
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

import replay
from engine import decoder as engine
from engine import kernels
from engine.draws import normal_from_keys
from model import load_model
from rollout import Exploration, Rollout, Sampling, filtered_logits, generate, mixing_candidates

V = 97
PROMPTS = [[5, 9, 2], [7, 1, 4, 4, 8, 3, 6], [11], [3, 3, 9, 20, 41]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(transformers' Qwen2, ours loaded from its checkpoint), fp32, random weights."""
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():  # larger logits than the default init, so sampling is far from uniform
        hf.lm_head.weight.mul_(40)
    path = tmp_path_factory.mktemp("qwen2")
    hf.save_pretrained(path)
    return hf, load_model(str(path), dtype=torch.float32, device="cpu").eval()


def ring_table(vocab: int, k: int) -> torch.Tensor:
    """A neighbor table for tests: row v holds v+1, ..., v+k (mod V), never v itself."""
    return (torch.arange(vocab)[:, None] + torch.arange(1, k + 1)[None]) % vocab


@torch.no_grad()
def test_greedy_equals_argmax_of_repeated_full_forwards(models):
    hf, ours = models
    rollout = generate(ours, PROMPTS, Sampling(temperature=0, max_new_tokens=10))
    for row, prompt in enumerate(PROMPTS):
        sequence = list(prompt)
        for _ in range(10):
            sequence.append(int(hf(torch.tensor([sequence])).logits[0, -1].argmax()))
        assert rollout.responses()[row] == sequence[len(prompt):]


@torch.no_grad()
def test_left_padding_changes_nothing(models):
    hf, ours = models
    batch = generate(ours, PROMPTS, Sampling(temperature=1.0, max_new_tokens=12), seed=0)
    for row, prompt in enumerate(PROMPTS):
        # The batch row's first step saw the logits of its prompt alone: its recorded log-prob is theirs.
        alone = hf(torch.tensor([prompt])).logits[0, -1].log_softmax(-1)
        token = int(batch.response_ids[row, 0])
        assert abs(float(batch.logprobs[row, 0]) - float(alone[token])) < 1e-4
    greedy_batch = generate(ours, PROMPTS, Sampling(temperature=0, max_new_tokens=12))
    for row, prompt in enumerate(PROMPTS):
        alone = generate(ours, [prompt], Sampling(temperature=0, max_new_tokens=12))
        assert alone.responses()[0] == greedy_batch.responses()[row]


@torch.no_grad()
def test_prefill_in_row_chunks_changes_nothing(models, monkeypatch):
    """Long prompts are prefilled a few rows at a time; every row's result equals the one-chunk prefill's."""
    _, ours = models
    sampling = Sampling(temperature=0.9, max_new_tokens=8)
    whole = generate(ours, PROMPTS, sampling, seed=4)
    monkeypatch.setattr(engine, "PREFILL_TOKENS", 8)  # the longest prompt has 7 tokens: one row a chunk
    chunked = generate(ours, PROMPTS, sampling, seed=4)
    assert torch.equal(whole.response_ids, chunked.response_ids)
    assert (whole.logprobs - chunked.logprobs).abs().max() < 1e-5


def assert_identical(a: Rollout, b: Rollout) -> None:
    """Two rollouts hold the same rows: lengths, finished and every recorded field, bit for bit."""
    assert a.steps.keys() == b.steps.keys()
    for name, value in {"lengths": a.lengths, "finished": a.finished, **a.steps}.items():
        assert torch.equal(value, getattr(b, name)), name


def replay_logits(hf, rollout, row):
    """transformers' full forward over the prompt's embeddings followed by the recorded mixtures, computed
    here by hand as sum_k w_k E[id_k] plus the recorded noise (scale * the normal draws of its key); returns
    the logits that predicted each response token."""
    E = hf.get_input_embeddings().weight
    prompt = rollout.prompts[row]
    n = int(rollout.lengths[row])
    fed = (rollout.cand_weights[row, : n - 1, :, None] * E[rollout.cand_ids[row, : n - 1]]).sum(-2)  # [n-1, d]
    if "noise_keys" in rollout.steps:  # orthogonal_noise records the noise it fed
        noise = normal_from_keys(rollout.noise_keys[row, : n - 1], E.shape[1])  # [n-1, d]
        fed = fed + rollout.noise_scales[row, : n - 1, None] * noise
    inputs = torch.cat([E[torch.tensor(prompt)], fed])[None]
    return hf(inputs_embeds=inputs).logits[0, len(prompt) - 1 :]  # [n, V]


@torch.no_grad()
@pytest.mark.parametrize("exploration", [
    Exploration("neighbor", mix_rate=0.5, num_neighbors=2, mix_weights="code"),
    Exploration("neighbor", mix_rate=0.5, num_neighbors=1, mix_weights="renorm"),
    Exploration("soft", soft_top_k=4),
])
def test_replaying_the_recorded_mixtures_reproduces_every_step(models, exploration):
    hf, ours = models
    rollout = generate(ours, PROMPTS, Sampling(temperature=0.8, max_new_tokens=16), exploration,
                       neighbor_table=ring_table(V, 2), seed=1)
    assert rollout.mixed.any()
    assert_replay_reproduces(hf, rollout, temperature=0.8)


@torch.no_grad()
def test_unmixed_steps_record_the_sampled_token_with_weight_one(models):
    _, ours = models
    rollout = generate(ours, PROMPTS, Sampling(max_new_tokens=16), Exploration("neighbor", mix_rate=0.3),
                       neighbor_table=ring_table(V, 1), seed=2)
    plain = ~rollout.mixed & (torch.arange(rollout.mixed.shape[1]) < rollout.lengths[:, None])
    assert torch.equal(rollout.cand_ids[..., 0][plain], rollout.response_ids[plain])
    assert torch.equal(rollout.cand_weights[plain], torch.tensor([1.0, 0.0]).expand(int(plain.sum()), 2))


@pytest.mark.parametrize("temperature", [1.0, 0.5])
@pytest.mark.parametrize("weights", ["code", "renorm"])
def test_mixing_candidates_match_a_hand_computation(temperature, weights):
    z = [1.0, 3.0, 0.5, 2.0, -1.0]
    table = torch.tensor([[1, 2], [3, 0], [0, 1], [1, 4], [3, 2]])
    exp = [math.exp(v / temperature) for v in z]
    p = [e / sum(exp) for e in exp]
    # anchor = argmax p = token 1; its neighbors from the table: 3 then 0.
    cand = [1, 3, 0]
    if weights == "code":
        raw = [math.exp(p[c] / temperature) for c in cand]
    else:
        raw = [p[c] for c in cand]
    expected = [r / sum(raw) for r in raw]
    ids, w = mixing_candidates(torch.tensor([z]), table, num_neighbors=2, temperature=temperature, weights=weights)
    assert ids.tolist() == [cand]
    assert torch.allclose(w, torch.tensor([expected]), atol=1e-6)
    assert abs(float(w.sum()) - 1.0) < 1e-6


def assert_replay_reproduces(hf, rollout, *, temperature: float, greedy_anchor: bool = True) -> None:
    """Every row's recorded log-probs equal transformers' replay of its recorded inputs (< 1e-4), and (when
    the strategy's first candidate is the greedy token) a mixed step's first candidate is the argmax of the
    distribution the replay gives."""
    for row in range(len(rollout.prompts)):
        n = int(rollout.lengths[row])
        replayed = replay_logits(hf, rollout, row)  # [n, V]
        logp = (replayed / temperature).log_softmax(-1).gather(-1, rollout.response_ids[row, :n, None])[:, 0]
        assert (logp - rollout.logprobs[row, :n]).abs().max() < 1e-4
        mixed = rollout.mixed[row, :n]
        if greedy_anchor:
            assert torch.equal(replayed[mixed].argmax(-1), rollout.cand_ids[row, :n, 0][mixed])


def test_code_weights_give_neighbors_a_large_share():
    """The mixing weights (docs/algorithm.md, step 4): at tau = 1 a neighbor with p ~ 0 gets e / (e^p_a + 1), ~27-37%
    of the mixture."""
    z = torch.tensor([[10.0, 0.0, 0.0, 0.0]])
    _, w = mixing_candidates(z, torch.tensor([[1], [0], [0], [0]]), num_neighbors=1, temperature=1.0)
    p_anchor = 1 / (1 + 3 * math.exp(-10))
    assert abs(float(w[0, 1]) - 1 / (1 + math.exp(p_anchor - 0))) < 1e-5  # ~0.269


def test_top_k_and_top_p_filtering_by_hand():
    z = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    p = torch.softmax(z, -1)[0].tolist()  # 0.644, 0.237, 0.087, 0.032
    kept = filtered_logits(z, 1.0, top_k=2).isfinite()[0].tolist()
    assert kept == [True, True, False, False]
    # top_p = 0.85: 0.644 < 0.85 so the second token is needed; 0.644 + 0.237 = 0.881 >= 0.85 covers it.
    assert p[0] < 0.85 <= p[0] + p[1]
    assert filtered_logits(z, 1.0, top_p=0.85).isfinite()[0].tolist() == [True, True, False, False]
    assert filtered_logits(z, 1.0, top_p=0.5).isfinite()[0].tolist() == [True, False, False, False]
    assert torch.equal(filtered_logits(z, 0.5), z / 0.5)


@torch.no_grad()
def test_sampling_logprobs_are_temperature_scaled_and_filtered(models):
    hf, ours = models
    rollout = generate(ours, PROMPTS, Sampling(temperature=0.7, top_k=5, max_new_tokens=8), seed=3)
    for row in range(len(PROMPTS)):
        logits = replay_logits(hf, rollout, row)  # no mixing: the full forward over prompt + response
        for t in range(int(rollout.lengths[row])):
            z = logits[t] / 0.7
            top = z.topk(5)
            token = int(rollout.response_ids[row, t])
            assert token in top.indices.tolist()  # sampled inside the top-k
            expected = z[token] - torch.logsumexp(top.values, 0)
            assert abs(float(rollout.logprobs[row, t]) - float(expected)) < 1e-5


@torch.no_grad()
def test_realised_mix_rate_is_within_three_standard_errors(models):
    _, ours = models
    rate = 0.1
    rollout = generate(ours, PROMPTS * 16, Sampling(max_new_tokens=64), Exploration("neighbor", mix_rate=rate),
                       neighbor_table=ring_table(V, 1), seed=4)
    n = int(rollout.lengths.sum())  # no stop ids: every step of every row is eligible
    assert n == 64 * 64
    se = math.sqrt(rate * (1 - rate) / n)
    assert abs(float(rollout.mixed.sum()) / n - rate) < 3 * se


@torch.no_grad()
def test_nothing_is_mixed_at_or_after_the_stop_mixing_token(models):
    _, ours = models
    sampling = Sampling(max_new_tokens=40)
    first = generate(ours, PROMPTS * 4, sampling, seed=5)
    stop_mixing = int(first.response_ids.flatten().mode().values)  # a token that does come up
    for exploration in (Exploration("neighbor", mix_rate=0.5, stop_mixing_id=stop_mixing),
                        Exploration("soft", soft_top_k=3, stop_mixing_id=stop_mixing)):
        rollout = generate(ours, PROMPTS * 4, sampling, exploration, neighbor_table=ring_table(V, 1),
                           seed=5)
        rows_with_stop = 0
        for row in range(rollout.response_ids.shape[0]):
            hits = (rollout.response_ids[row] == stop_mixing).nonzero()
            if len(hits):
                rows_with_stop += 1
                assert not rollout.mixed[row, int(hits[0]):].any()
            if exploration.strategy == "soft":  # every thinking step mixes
                end = int(hits[0]) if len(hits) else int(rollout.lengths[row])
                assert rollout.mixed[row, :end].all()
        assert rows_with_stop > 0


@torch.no_grad()
def test_none_never_mixes(models):
    _, ours = models
    with pytest.raises(ValueError, match="mix_rate is not read by the none strategy"):
        Exploration("none", mix_rate=1.0)
    rollout = generate(ours, PROMPTS, Sampling(max_new_tokens=30), Exploration("none"), seed=6)
    assert not rollout.mixed.any()
    assert rollout.cand_ids.shape[-1] == 1


@torch.no_grad()
@pytest.mark.parametrize("strategy", ["none", "neighbor", "soft", "gaussian"])
def test_same_seed_same_rollout_other_seed_another(models, strategy):
    _, ours = models
    exploration = Exploration.of(strategy, mix_rate=0.5, soft_top_k=3)
    run = lambda seed: generate(ours, PROMPTS, Sampling(max_new_tokens=20), exploration,
                                neighbor_table=ring_table(V, 1), seed=seed)
    a, b, c = run(7), run(7), run(8)
    for field in ("response_ids", "lengths", "logprobs", "cand_ids", "cand_weights", "mixed"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert not torch.equal(a.response_ids, c.response_ids)


@torch.no_grad()
@pytest.mark.parametrize("strategy", ["gaussian", "gaussian_embed_noise"])
def test_gaussian_noise_changes_what_is_fed_but_not_the_record(models, strategy):
    hf, ours = models
    rollout = generate(ours, PROMPTS, Sampling(max_new_tokens=12), Exploration.of(strategy, mix_rate=1.0, soft_top_k=3),
                       seed=9)
    assert rollout.mixed.all()
    assert abs(float(rollout.cand_weights.sum(-1).mean()) - 1.0) < 1e-6
    # The recorded noise-free mixture reproduces the first step (the prompt alone) but not the later ones:
    # noise was fed.
    logp = replay_logits(hf, rollout, 0).log_softmax(-1).gather(-1, rollout.response_ids[0, :, None])[:, 0]
    assert abs(float(logp[0] - rollout.logprobs[0, 0])) < 1e-4
    assert (logp[1:] - rollout.logprobs[0, 1:]).abs().max() > 1e-3


@torch.no_grad()
def test_rows_stop_at_their_stop_token_and_the_loop_exits_early(models):
    _, ours = models
    greedy = generate(ours, PROMPTS, Sampling(temperature=0, max_new_tokens=30))
    stop = greedy.responses()[0][2]  # row 0 samples this at step 3
    rollout = generate(ours, PROMPTS, Sampling(temperature=0, max_new_tokens=30, stop_ids=(stop,), pad_id=0))
    for row, full in enumerate(greedy.responses()):
        if stop in full:
            n = full.index(stop) + 1
            assert rollout.responses()[row] == full[:n] and bool(rollout.finished[row])
            assert (rollout.response_ids[row, n:] == 0).all()
        else:
            assert rollout.responses()[row] == full and not bool(rollout.finished[row])
    assert rollout.response_ids.shape[1] == int(rollout.lengths.max())


def test_on_a_cpu_the_loop_ends_with_its_last_row(models, monkeypatch):
    """No decode step after the longest row has ended (the host syncs every step once no row waits), where
    syncs every SYNC_EVERY steps would run on to the next multiple of it."""
    _, ours = models
    greedy = generate(ours, PROMPTS, Sampling(temperature=0, max_new_tokens=30))
    stops = tuple({response[4] for response in greedy.responses()})  # every row ends by its 5th token
    steps, real_step = [], engine.Decoder.step
    monkeypatch.setattr(engine.Decoder, "step",
                        lambda self, *args, **kwargs: steps.append(1) or real_step(self, *args, **kwargs))
    stopped = generate(ours, PROMPTS, Sampling(temperature=0, max_new_tokens=30, stop_ids=stops))
    longest = int(stopped.lengths.max())
    assert bool(stopped.finished.all()) and longest < engine.SYNC_EVERY and len(steps) == longest


def test_neighbor_strategy_without_a_table_is_a_clear_error(models):
    with pytest.raises(ValueError, match="neighbor_table"):
        generate(models[1], PROMPTS, Sampling(), Exploration("neighbor"))


def test_cuda_graph_on_a_cpu_model_is_a_clear_error(models):
    with pytest.raises(ValueError, match="CUDA device"):
        generate(models[1], PROMPTS, Sampling(max_new_tokens=4), cuda_graph=True)


@torch.no_grad()
def test_concat_pads_each_rollout_to_the_longest_and_select_takes_rows_back(models):
    _, ours = models
    short = generate(ours, PROMPTS[:2], Sampling(max_new_tokens=3), Exploration("soft", soft_top_k=2), seed=10)
    long = generate(ours, PROMPTS[2:], Sampling(max_new_tokens=7), Exploration("soft", soft_top_k=2), seed=11)
    joined = Rollout.concat([replace(short, pad_id=-1), replace(long, pad_id=-1)])
    assert joined.prompts == PROMPTS and joined.response_ids.shape == (4, 7)
    assert joined.responses() == short.responses() + long.responses()
    assert (joined.response_ids[:2, 3:] == -1).all() and (joined.cand_ids[:2, 3:] == -1).all()
    assert (joined.cand_weights[:2, 3:] == 0).all() and (joined.logprobs[:2, 3:] == 0).all()
    assert not joined.mixed[:2, 3:].any() and joined.mixed[:2, :3].all()
    picked = joined.select([3, 0, 3])
    assert picked.prompts == [PROMPTS[3], PROMPTS[0], PROMPTS[3]]
    assert picked.responses() == [long.responses()[1], short.responses()[0], long.responses()[1]]
    for name in ("lengths", "finished", "logprobs", "cand_weights"):
        assert torch.equal(getattr(picked, name)[0], getattr(long, name)[1]), name
    assert torch.equal(picked.cand_ids[1, :3], short.cand_ids[0])


def assert_same_rows(a: Rollout, b: Rollout, rows_of_b: list[int]) -> None:
    """Row i of a equals row rows_of_b[i] of b: tokens, lengths and records exactly; log-probs and weights to
    fp32 noise (other batch shapes round differently, and fed-back mixtures carry it from step to step)."""
    b = b.select(rows_of_b)
    assert a.prompts == b.prompts
    assert a.responses() == b.responses() and torch.equal(a.finished, b.finished)
    mask_a, mask_b = a.response_mask(), b.response_mask()  # the same lengths; the widths may differ
    for name in ("cand_ids", "mixed"):
        assert torch.equal(getattr(a, name)[mask_a], getattr(b, name)[mask_b]), name
    for name in ("logprobs", "cand_weights"):
        assert (getattr(a, name)[mask_a] - getattr(b, name)[mask_b]).abs().max() < 1e-3, name


# Eight rows for refill: with stop ids STOPS (tokens this model produces often) greedy rows end after
# 1 to 9 tokens or run to the limit, so slots free up at different steps.
MORE_PROMPTS = PROMPTS + [[1, 2], [50, 60, 70, 80, 90, 10, 20, 30, 40], [8], [33, 34, 35]]
STOPS = (79, 7)


@torch.no_grad()
def test_greedy_rows_with_refill_equal_argmax_of_full_forwards(models):
    """Rows > slots: each row, whichever slot and whichever row held it before, is its own greedy path."""
    hf, ours = models
    sampling = Sampling(temperature=0, max_new_tokens=24, stop_ids=STOPS)
    refilled = generate(ours, MORE_PROMPTS, sampling, slots=3)
    assert len(set(refilled.lengths.tolist())) >= 5 and 0 < int(refilled.finished.sum()) < len(MORE_PROMPTS)
    for row, prompt in enumerate(MORE_PROMPTS):
        sequence = list(prompt)
        while len(sequence) - len(prompt) < 24 and sequence[-1] not in STOPS or len(sequence) == len(prompt):
            sequence.append(int(hf(torch.tensor([sequence])).logits[0, -1].argmax()))
        assert refilled.responses()[row] == sequence[len(prompt):]
        assert bool(refilled.finished[row]) == (sequence[-1] in STOPS)


@torch.no_grad()
@pytest.mark.parametrize("strategy", ["none", "neighbor", "soft", "gaussian", "topk-gumbel", "soft-gumbel",
                                      "mixinputs"])
def test_a_rows_sample_depends_on_its_key_not_its_slots_batch_or_order(models, strategy):
    _, ours = models
    sampling = Sampling(temperature=0.9, max_new_tokens=16, stop_ids=STOPS)
    exploration = Exploration.of(strategy, mix_rate=0.5, soft_top_k=3)
    run = lambda prompts, keys, **kw: generate(ours, prompts, sampling, exploration,  # noqa: E731
                                               neighbor_table=ring_table(V, 1), seed=3, row_keys=keys, **kw)
    together = run(MORE_PROMPTS, None)
    assert len(set(together.lengths.tolist())) >= 3
    assert together.mixed.any() or strategy == "none"
    for slots in (1, 3):
        assert_same_rows(run(MORE_PROMPTS, None, slots=slots), together, list(range(len(MORE_PROMPTS))))
    assert_same_rows(run(MORE_PROMPTS, None, slots=3, refill=False), together, list(range(len(MORE_PROMPTS))))
    order = [5, 2, 7, 0, 3, 6, 1, 4]
    assert_same_rows(run([MORE_PROMPTS[i] for i in order], order, slots=3), together, order)
    assert_same_rows(run([MORE_PROMPTS[4]], [4]), together, [4])


@torch.no_grad()
@pytest.mark.parametrize("exploration", [Exploration("neighbor", mix_rate=0.5, num_neighbors=2),
                                         Exploration("soft", soft_top_k=4)], ids=["neighbor", "soft"])
def test_replaying_refilled_rows_reproduces_every_step(models, exploration):
    """Two slots for eight rows: every row after the second decodes in a slot another row used."""
    hf, ours = models
    rollout = generate(ours, MORE_PROMPTS, Sampling(temperature=0.8, max_new_tokens=16, stop_ids=STOPS),
                       exploration, neighbor_table=ring_table(V, 2), seed=5, slots=2)
    assert rollout.mixed.any() and len(set(rollout.lengths.tolist())) >= 3
    assert_replay_reproduces(hf, rollout, temperature=0.8)


# ----------------------------------------------------------------------------- the release's other strategies

RELEASED_STRATEGIES = [
    Exploration("topk", mix_rate=0.5, soft_top_k=3, mix_temperature=0.7),
    Exploration("topk-gumbel", mix_rate=0.5, soft_top_k=3),
    Exploration("gaussian_embed_noise", mix_rate=0.5, soft_top_k=3, noise_sigma=0.0),  # its record is noise-free
    Exploration("orthogonal_noise", mix_rate=0.5, soft_top_k=4),
]


@torch.no_grad()
@pytest.mark.parametrize("exploration", RELEASED_STRATEGIES, ids=lambda x: x.strategy)
def test_the_released_strategies_replay_exactly_in_training(models, exploration):
    """transformers over the recorded inputs (noise redrawn from its keys) and the training forward
    (replay.sequence_logprobs) both give back every recorded log-prob."""
    hf, ours = models
    rollout = generate(ours, PROMPTS, Sampling(temperature=0.8, max_new_tokens=16), exploration, seed=12)
    assert rollout.mixed.any() and not rollout.mixed.all()
    assert_replay_reproduces(hf, rollout, temperature=0.8, greedy_anchor=exploration.strategy != "topk-gumbel")
    logp, _ = replay.sequence_logprobs(ours, rollout, temperature=0.8)
    assert (logp - rollout.logprobs)[rollout.response_mask()].abs().max() < 1e-4
    if exploration.strategy == "orthogonal_noise":  # the one strategy that records the noise it fed
        assert torch.equal(rollout.noise_scales > 0, rollout.mixed)
    else:
        assert "noise_scales" not in rollout.steps


def released_entropies(hf, rollout, row: int, tau: float) -> torch.Tensor:
    """[n] the released gate's entropy at each step of a row, by hand in float64 from transformers' logits:
    H(softmax(p / tau)) with p = softmax(z / tau)."""
    z = replay_logits(hf, rollout, row).double() / tau  # [n, V]
    q = (z.softmax(-1) / tau).softmax(-1)
    return -(q * q.log()).sum(-1)


@torch.no_grad()
def test_entropy_gate_mixes_exactly_the_steps_at_or_above_the_threshold(models):
    hf, ours = models
    tau, sampling = 0.8, Sampling(temperature=0.8, max_new_tokens=16)
    plain = generate(ours, PROMPTS, sampling, seed=13)
    threshold = float(torch.cat([released_entropies(hf, plain, row, tau) for row in range(len(PROMPTS))]).median())
    gate = Exploration("neighbor", num_neighbors=2, mix_rate=0.0, mix_entropy_threshold=threshold)
    gated = generate(ours, PROMPTS, sampling, gate, neighbor_table=ring_table(V, 2), seed=13)
    checked = 0
    for row in range(len(PROMPTS)):
        n = int(gated.lengths[row])
        entropy = released_entropies(hf, gated, row, tau)  # [n]
        clear = (entropy - threshold).abs() > 1e-5  # fp32 and float64 may round a step on the line either way
        assert torch.equal(gated.mixed[row, :n][clear], (entropy >= threshold)[clear])
        checked += int(clear.sum())
    assert checked >= 0.9 * int(gated.lengths.sum())
    assert 0 < int(gated.mixed.sum()) < int(gated.lengths.sum())


@torch.no_grad()
@pytest.mark.parametrize("strategy", ["neighbor", "topk-gumbel", "orthogonal_noise"])
def test_replay_only_rollouts_are_plain_rollouts_token_for_token(models, strategy):
    """--mix-feed replay-only feeds E[y]: the same tokens and log-probs as --explore none with the same seed
    (the strategy's coin, Gumbel and noise draws are streams of their own), whatever it records."""
    _, ours = models
    sampling = Sampling(temperature=0.9, max_new_tokens=20, stop_ids=STOPS)
    plain = generate(ours, MORE_PROMPTS, sampling, Exploration("none"), seed=14, slots=3)
    exploration = Exploration.of(strategy, mix_rate=0.5, soft_top_k=3, mix_feed="replay-only")
    recorded = generate(ours, MORE_PROMPTS, sampling, exploration, neighbor_table=ring_table(V, 1), seed=14,
                        slots=3)
    assert recorded.mixed.any()
    assert recorded.responses() == plain.responses() and torch.equal(recorded.finished, plain.finished)
    assert torch.equal(recorded.logprobs, plain.logprobs)


@torch.no_grad()
def test_replay_only_records_the_mixtures_the_sampler_mode_feeds(models):
    """The record at a mixed step is the N-GRPO mixture of that step's distribution, recomputed here from
    transformers' logits over the plain tokens (what replay-only fed); the mixed steps are those of the
    sampler mode with the same seed (a coin depends on the row and the position only)."""
    hf, ours = models
    tau, table = 0.8, ring_table(V, 2)
    sampling = Sampling(temperature=tau, max_new_tokens=16)  # no stop ids: every row runs 16 steps
    fed_mode = Exploration("neighbor", mix_rate=0.4, num_neighbors=2)
    fed = generate(ours, PROMPTS, sampling, fed_mode, neighbor_table=table, seed=15)
    recorded = generate(ours, PROMPTS, sampling, replace(fed_mode, mix_feed="replay-only"), neighbor_table=table,
                        seed=15)
    assert torch.equal(recorded.mixed, fed.mixed) and recorded.mixed.any()
    assert not torch.equal(recorded.response_ids, fed.response_ids)  # feeding the mixtures changed the tokens
    for row, prompt in enumerate(PROMPTS):
        ids = torch.tensor([prompt + recorded.responses()[row]])
        p = (hf(ids).logits[0, len(prompt) - 1 : -1] / tau).softmax(-1)  # [16, V]: each response token's
        for t in recorded.mixed[row].nonzero()[:, 0].tolist():
            anchor = int(p[t].argmax())
            cand = [anchor, (anchor + 1) % V, (anchor + 2) % V]  # ring_table's neighbors
            assert recorded.cand_ids[row, t].tolist() == cand
            assert torch.allclose(recorded.cand_weights[row, t], (p[t, cand] / tau).softmax(-1), atol=1e-5)


@torch.no_grad()
def test_a_later_call_reuses_the_decoder_and_gives_what_a_fresh_one_gives(models):
    """generate keeps the model's Decoder (KV cache, buffers, graphs) for the next call that fits: nothing of
    one call (its rows' cache, slots, seed, neighbor table) leaks into the next, whose rows are what a fresh
    Decoder gives them."""
    _, ours = models
    table = ring_table(V, 2)
    kwargs = dict(sampling=Sampling(temperature=0.9, max_new_tokens=20, stop_ids=(3, 7)), neighbor_table=table,
                  exploration=Exploration("neighbor", mix_rate=0.5, num_neighbors=2), slots=2)
    engine.release_decoder(ours)
    generate(ours, PROMPTS, seed=1, **kwargs)
    decoder = engine._DECODERS[ours]
    later = generate(ours, PROMPTS[::-1], seed=2, **kwargs)  # other prompts in other slots, another seed
    assert engine._DECODERS[ours] is decoder
    engine.release_decoder(ours)
    fresh = generate(ours, PROMPTS[::-1], seed=2, **kwargs)
    assert engine._DECODERS[ours] is not decoder
    assert_identical(later, fresh)
    bigger = generate(ours, [p * 20 for p in PROMPTS], seed=2, **kwargs)  # longer prompts: a larger cache
    assert engine._DECODERS[ours].max_len >= max(len(p) * 20 for p in PROMPTS) + 20
    assert bigger.lengths.shape == (len(PROMPTS),)


@torch.no_grad()
def test_the_compiled_step_compiles_once_whatever_the_rows_lengths_and_cache(models, monkeypatch):
    """The decode step's elementwise functions run under torch.compile (on a GPU, inductor) with the rows and the
    cache's positions as dynamic sizes: the first step compiles them, and nothing recompiles afterwards, across
    windows, prompt lengths, caches, batch sizes, calls, seeds and strategies. (Counted with dynamo's eager
    backend: the same tracing and guards.)"""
    from torch._dynamo.utils import counters

    _, ours = models
    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(engine, "compile_backend", lambda device: "eager")
    kernels._DECODE_OPS.pop("eager", None)  # fresh compiled functions for this test
    kernels._COMPILED.clear()
    engine.release_decoder(ours)
    sampling = Sampling(temperature=1.0, max_new_tokens=70)  # windows 64 and 128
    compiled = generate(ours, PROMPTS, sampling, seed=4)
    warm = counters["stats"]["unique_graphs"]
    assert warm > 0
    generate(ours, [p + [1] * 9 for p in PROMPTS], sampling, Exploration("soft", soft_top_k=3), seed=5)
    generate(ours, PROMPTS[:2] * 2, Sampling(temperature=0.5, max_new_tokens=30), seed=6)
    generate(ours, PROMPTS[:3], sampling, seed=7)  # another batch size
    generate(ours, [p * 40 for p in PROMPTS[:2]], sampling, seed=8)  # another batch size, a longer cache
    assert counters["stats"]["unique_graphs"] == warm
    # The compiled functions compute what the plain ones do.
    monkeypatch.setattr(engine, "compile_backend", lambda device: None)
    engine.release_decoder(ours)
    plain = generate(ours, PROMPTS, sampling, seed=4)
    assert_identical(compiled, plain)
    engine.release_decoder(ours)
    kernels._DECODE_OPS.pop("eager", None)
    kernels._COMPILED.clear()


@torch.no_grad()
def test_a_decoder_whose_compiled_functions_fail_decodes_without_them(models, monkeypatch):
    """Where torch.compile cannot build the step's fused functions (no C compiler for Triton, say), the first step
    says so in a warning and every step runs the plain functions: the same rows as a decoder without them."""
    _, ours = models

    def broken_backend(graph_module, example_inputs):
        raise RuntimeError("no C compiler here")

    monkeypatch.setattr(engine, "compile_backend", lambda device: broken_backend)
    engine.release_decoder(ours)
    sampling = Sampling(temperature=1.0, max_new_tokens=12)
    with pytest.warns(UserWarning, match="without torch.compile"):
        fallen_back = generate(ours, PROMPTS, sampling, seed=9)
    engine.release_decoder(ours)
    kernels._DECODE_OPS.pop(broken_backend, None)
    kernels._COMPILED.clear()
    monkeypatch.setattr(engine, "compile_backend", lambda device: None)
    plain = generate(ours, PROMPTS, sampling, seed=9)
    assert_identical(fallen_back, plain)
    engine.release_decoder(ours)
