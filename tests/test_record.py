"""The step's record declared once: a strategy registered from outside the repo's files, which records one quantity
of its own (declared once, in its Strategy) and keeps a per-row counter, gets both through the engine (slots, the
step ring, refill, the graph path's warm-up-and-restore) into the Rollout, its concat and select, and the replay."""

from dataclasses import replace

import pytest
import torch

import strategies
from engine import decoder as engine
from model import ModelConfig, random_model
from replay import sequence_logprobs
from rollout import Rollout, Sampling, generate
from strategies import Exploration, Field, Strategy, mixed_embeddings

PROMPTS = [[5, 9, 2], [7, 1, 4, 4, 8, 3, 6], [11], [3, 3, 9, 20, 41], [1, 2], [50, 60, 70], [8], [33, 34, 35, 36]]
CYCLE = 4


def explore_scaled(view: strategies.StepView) -> strategies.Mixture:
    """Feeds s E[y] with s = 1 + (n mod CYCLE) / 4, n = the steps this row has taken (its own counter, kept in
    its slot), and records s."""
    count = view.state["toy_count"]  # [B], this row's steps so far
    scale = 1.0 + (count % CYCLE).float() / 4
    mixture = strategies.base.explore_none(view)
    mixture.inputs = (scale[:, None] * view.embed[view.token].float()).to(view.embed.dtype)
    mixture.extra = {"toy_scale": scale}
    count += view.eligible  # in place: the slot's state, as a CUDA graph would update it
    return mixture


def scaled_feed(embed: torch.Tensor, steps: dict[str, torch.Tensor]) -> torch.Tensor:
    """What explore_scaled fed, from its record: s E[y] (prompt positions hold s = the field's pad, 1)."""
    plain = mixed_embeddings(embed, steps["cand_ids"], steps["cand_weights"]).float()
    return (steps["toy_scale"][..., None] * plain).to(embed.dtype)


TOY = Strategy(explore_scaled, "feeds s E[y], s growing with the step", candidates=lambda x: 1,
               record=(Field("toy_scale", torch.float32, pad=1.0),), state=(Field("toy_count", torch.long, pad=0),),
               feed=scaled_feed)


@pytest.fixture(scope="module")
def toy_model():
    strategies.register("toy-scaled", TOY)
    cfg = ModelConfig(family="qwen2", vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True)
    model = random_model(cfg, seed=3).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # peaked distributions: rows end at different steps
    yield model
    engine.release_decoder(model)
    del strategies.STRATEGIES["toy-scaled"]


SAMPLING = Sampling(temperature=0.9, max_new_tokens=12, stop_ids=(7, 13, 21, 40))


def expected_scales(rollout: Rollout) -> torch.Tensor:
    """[B, T] by hand: 1 + (t mod CYCLE) / 4 at response position t < length, the pad 1 after."""
    t = torch.arange(rollout.response_ids.shape[1])[None]
    return torch.where(t < rollout.lengths[:, None], 1.0 + (t % CYCLE).float() / 4, 1.0)


@torch.no_grad()
def test_a_new_recorded_quantity_reaches_the_rollout_through_refilled_slots(toy_model):
    """Two slots for eight rows: rows wait, so the ring holds several steps between syncs and every row after the
    second starts in a slot another row used (its counter starts again at 0)."""
    rollout = generate(toy_model, PROMPTS, SAMPLING, Exploration("toy-scaled"), seed=1, slots=2)
    assert len(set(rollout.lengths.tolist())) >= 3  # rows of different lengths: slots freed at different steps
    assert rollout.toy_scale.dtype == torch.float32 and rollout.toy_scale.shape == rollout.response_ids.shape
    assert torch.equal(rollout.toy_scale, expected_scales(rollout))
    # the same rows whatever the slots (each row's draws are its own)
    alone = generate(toy_model, PROMPTS, SAMPLING, Exploration("toy-scaled"), seed=1)
    assert torch.equal(alone.response_ids, rollout.response_ids) and torch.equal(alone.toy_scale, rollout.toy_scale)


@torch.no_grad()
def test_concat_and_select_carry_the_new_quantity_with_its_pad(toy_model):
    short = generate(toy_model, PROMPTS[:3], replace(SAMPLING, max_new_tokens=3), Exploration("toy-scaled"), seed=2)
    long = generate(toy_model, PROMPTS[3:], SAMPLING, Exploration("toy-scaled"), seed=3)
    joined = Rollout.concat([short, long])
    assert joined.toy_scale.shape == joined.response_ids.shape
    assert torch.equal(joined.toy_scale, expected_scales(joined))  # short rows padded with the field's pad, 1
    assert torch.equal(joined.select([4, 0]).toy_scale[1, :3], short.toy_scale[0, :3])


def test_the_replay_feeds_what_the_sampler_fed_from_the_new_quantity(toy_model):
    """The replay's log-probs (its `feed` over the record) equal the sampler's; replayed without the recorded
    scales (all 1) they do not: the replay read the new field."""
    with torch.no_grad():
        rollout = generate(toy_model, PROMPTS, SAMPLING, Exploration("toy-scaled"), seed=4, slots=3)
        logp, _ = sequence_logprobs(toy_model, rollout, temperature=SAMPLING.temperature)
        mask = rollout.response_mask()
        assert (logp - rollout.logprobs)[mask].abs().max() < 1e-4
        unscaled = rollout.with_fields(toy_scale=torch.ones_like(rollout.toy_scale))
        wrong, _ = sequence_logprobs(toy_model, unscaled, temperature=SAMPLING.temperature)
        assert (wrong - rollout.logprobs)[mask].abs().max() > 1e-2


@torch.no_grad()
def test_the_graph_paths_warm_up_and_restore_puts_the_strategy_state_back(toy_model, monkeypatch):
    """A CUDA graph's capture runs two warm-up steps and restores what they changed (Decoder._saved / _restore)
    before the step itself: done here at every step, on the CPU, the rows (their per-row counters included) are
    those of plain steps. Rows wait (3 slots for 8 rows), so up to SYNC_EVERY steps go between syncs and the
    warm-up of the ring's last step wraps round to its first entry, which the restore must put back."""
    plain = generate(toy_model, PROMPTS, SAMPLING, Exploration("toy-scaled"), seed=5, slots=3)

    def warmed_up_step(self, model, key, window):
        saved = self._saved(key)
        self.run_step(model, key, window)
        self.run_step(model, key, window)
        self._restore(key, saved)
        self.run_step(model, key, window)

    monkeypatch.setattr(engine.Decoder, "_step", warmed_up_step)
    warmed = generate(toy_model, PROMPTS, SAMPLING, Exploration("toy-scaled"), seed=5, slots=3)
    assert plain.steps.keys() == warmed.steps.keys() and "toy_scale" in warmed.steps
    for name in ("lengths", "finished", *plain.steps):
        assert torch.equal(getattr(plain, name), getattr(warmed, name)), name
