"""The thinking testbed (the `demo-think` preset): R1-shaped worked solutions with one-token markers, each part of a
response measured (thinking, answer, where it mixed, Cold Stop's ends), eval.py's token-efficiency figures, and the
success-gated length shaping against hand-computed tables."""

import json
from dataclasses import replace

import pytest
import torch
from conftest import script_think_ends

import eval as E
import train
from config import PRESETS, Config, preset
from data import END_THINK, THINK, arith_problems, encode_prompt, load_problems, tiny_tokenizer
from model import TINY_CONFIG, ModelConfig, random_model
from ngrpo import length_shaping, shaped_rewards
from rollout import Sampling, generate
from runtime.diagnostics import think_end_id, thinking_metrics, token_counts, token_efficiency
from strategies import STRATEGIES, Exploration

# ----------------------------------------------------------------------------- the task


def test_think_solutions_close_thinking_with_one_token_then_answer():
    """arith think=1: the same problems as think=0, each worked solution R1's shape: steps, then </think> (one token
    of the tiny tokenizer, as of R1-Distill's) once, then the boxed answer; the prompt opens the block (<think>, one
    token) and the preset's responses have room for every solution and its EOS."""
    tokenizer, cfg = tiny_tokenizer(), preset("demo-think")
    plain, think = arith_problems(300, difficulty=2, max_count=5), load_problems(cfg.data, limit=300)
    assert [(p["problem"], p["answer"]) for p in plain] == [(p["problem"], p["answer"]) for p in think]
    end, start = tokenizer.convert_tokens_to_ids([END_THINK, THINK])
    assert think_end_id(tokenizer) == end and tokenizer.encode(THINK, add_special_tokens=False) == [start]
    for p in think:
        ids = tokenizer.encode(p["solution"], add_special_tokens=False)
        assert ids.count(end) == 1, p["solution"]
        steps, answer = p["solution"].split(END_THINK)
        assert steps.count("=") == 2 and answer == f"\n\n\\boxed{{{p['answer']}}}", p["solution"]
        assert len(ids) + 1 <= cfg.max_new_tokens
    prompt = encode_prompt(tokenizer, think[0]["problem"])
    assert prompt[-2:] == [start, tokenizer.encode("\n", add_special_tokens=False)[0]]
    assert all(p["solution"].count(END_THINK) == 0 for p in plain)


# ----------------------------------------------------------------------------- each part of a response


def test_thinking_metrics_against_a_hand_count():
    """Three responses (</think> = 9, EOS = 0): one closes thinking at position 2, one never does (a 9 past its end
    is not its), one closes at once and mixes a step of its answer."""
    response_ids = torch.tensor([[1, 2, 9, 3, 4, 0], [1, 1, 1, 1, 0, 9], [9, 5, 0, 0, 0, 0]])
    lengths = torch.tensor([6, 5, 3])
    mixed = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0]]).bool()
    forced = torch.zeros(3, 6, dtype=torch.bool)
    forced[0, 2] = True
    metrics = thinking_metrics(response_ids, lengths, mixed, 9, torch.tensor([True, False, True]), forced)
    # thinking 3, 5, 1 tokens; answers 3, 0, 2; thinking steps mixed 2 + 2 + 0 of 9; one answer step mixed
    assert metrics == pytest.approx({"think/len_mean": 3.0, "think/answer_len_mean": 5 / 3, "think/closed": 2 / 3,
                                     "think/mixed_frac": 4 / 9, "think/answer_mixed": 1,
                                     "think/correct_per_1k": 2000 / 9, "think/correct_len_mean": 4.5,
                                     "think/cold_stop_ends": 1})
    assert token_counts(response_ids, lengths, 9) == [{"tokens": 6, "think_tokens": 3},
                                                      {"tokens": 5, "think_tokens": 5},
                                                      {"tokens": 3, "think_tokens": 1}]
    assert token_counts(response_ids, lengths, None) == [{"tokens": 6}, {"tokens": 5}, {"tokens": 3}]


def test_token_efficiency_against_a_hand_count():
    records = [{"tokens": 10, "think_tokens": 6, "correct": True}, {"tokens": 20, "think_tokens": 20, "correct": False},
               {"tokens": 30, "think_tokens": 14, "correct": True}, {"tokens": 4, "think_tokens": 4, "correct": False}]
    assert token_efficiency(records) == pytest.approx({
        "tokens_mean": 16.0, "think_tokens_mean": 11.0, "answer_tokens_mean": 5.0, "correct_tokens_mean": 20.0,
        "correct_per_1k_think": 2000 / 44})
    assert token_efficiency([{"tokens": 3, "correct": False}]) == {"tokens_mean": 3.0}
    assert token_efficiency([{"correct": True}]) == {}  # samples written before the counts were kept


THINK_END, EOS = 60, 61
THINK_AT = [2, 5, 0, 9, None, 3]  # the response position each row is sure of </think> (None: never)


@pytest.fixture(scope="module")
def small_model():
    cfg = ModelConfig(family="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True)
    return random_model(cfg, seed=4).eval()


@pytest.mark.parametrize("strategy", [name for name, s in STRATEGIES.items() if s.mixes])
def test_no_method_mixes_an_answer_step(small_model, monkeypatch, strategy):
    """Every method that mixes, its logits scripted (graded over the vocabulary; sure of </think> at each row's
    position): it mixes thinking steps, never a step at or after </think>, and the step metrics count 0 answer steps
    mixed."""
    T = 12
    script_think_ends(monkeypatch, THINK_AT, THINK_END, EOS)
    x = Exploration.of(strategy, THINK_END, mix_rate=1.0, router_confidence=0.0)  # each keeps the knobs it reads
    table = torch.arange(64)[:, None].roll(-1, 0).repeat(1, 4)  # each token's neighbors: the next ids
    result = generate(small_model, [[1, 2, 3]] * len(THINK_AT), Sampling(temperature=1.0, max_new_tokens=T,
                                                                            stop_ids=(EOS,)), x,
                      neighbor_table=table, seed=3)
    closes = [[t for t, y in enumerate(row) if y == THINK_END] for row in result.response_ids.tolist()]
    assert [c[:1] or [None] for c in closes] == [[t] for t in THINK_AT]
    for row, at in enumerate(THINK_AT):
        mixed = result.mixed[row].tolist()
        assert not any(mixed[at:] if at is not None else []), (row, mixed)
    assert result.mixed.any()  # it mixed where it may
    metrics = thinking_metrics(result.response_ids, result.lengths, result.mixed, THINK_END,
                               torch.zeros(len(THINK_AT), dtype=torch.bool))
    assert metrics["think/answer_mixed"] == 0 and metrics["think/mixed_frac"] > 0


# ----------------------------------------------------------------------------- the length shaping

SHAPING_CASES = [
    # mode, scores, lengths, group size, expected (hand-computed)
    ("brevity", [1, 1, 0, 1], [10, 20, 5, 40], 4, [1.0, 0.5, 0.0, 0.25]),  # the short wrong one gains nothing
    ("brevity", [0, 0, 0, 0], [3, 9, 27, 81], 4, [0.0, 0.0, 0.0, 0.0]),  # no correct response: nothing to scale
    ("brevity", [1, 1, 1, 1], [10, 20, 40, 80], 2, [1.0, 0.5, 1.0, 0.5]),  # each group its own shortest
    ("brevity", [-0.5, 1.0], [2, 10], 2, [-0.5, 1.0]),  # a (custom) negative reward is never shaped
    ("gr3", [1, 0, 1, 1], [10, 20, 30, 40], 4,  # mean length 25: 1 / (1 + 0.33 L / 25)
     [1 / 1.132, 0.0, 1 / 1.396, 1 / 1.528]),
    ("gr3", [0, 0], [1, 100], 2, [0.0, 0.0]),
    ("none", [1, 0, 1, 0], [1, 2, 3, 4], 2, [1.0, 0.0, 1.0, 0.0]),
]


@pytest.mark.parametrize("mode, scores, lengths, group_size, expected", SHAPING_CASES)
def test_length_shaping_against_a_hand_computed_table(mode, scores, lengths, group_size, expected):
    shaped = length_shaping(torch.tensor(scores, dtype=torch.float32), torch.tensor(lengths), group_size, mode)
    assert shaped.tolist() == pytest.approx(expected, rel=1e-6)
    scores = torch.tensor(scores, dtype=torch.float32)
    assert bool((shaped[scores <= 0] == scores[scores <= 0]).all())  # a wrong answer is never rewarded


def test_length_shaping_is_off_by_default_and_in_every_preset_and_adds_to_the_overlong_penalty():
    assert Config().length_shaping == "none" and all(preset(name).length_shaping == "none" for name in PRESETS)
    cfg = replace(Config(), group_size=2, length_shaping="brevity", max_new_tokens=100, overlong_buffer=20)
    rewards = shaped_rewards(torch.tensor([1.0, 1.0]), torch.tensor([50, 90]), cfg)
    assert rewards.tolist() == pytest.approx([1.0, 50 / 90 - 0.5])  # DAPO's: (100 - 20 - 90) / 20
    off = replace(cfg, length_shaping="none", overlong_buffer=0)
    assert shaped_rewards(torch.tensor([1.0, 0.0]), torch.tensor([7, 3]), off).tolist() == [1.0, 0.0]


# ----------------------------------------------------------------------------- in a run and in eval.py


def test_a_thinking_run_logs_each_part_and_eval_reports_token_efficiency(tmp_path):
    """demo-think's task for one short step of Soft Thinking with Cold Stop (every step low-entropy enough: it forces
    </think> at the 3rd step of thinking): the step's metrics hold the thinking figures, Cold Stop's ends are the
    responses' </think> at position 2, no answer step mixed; eval.py's samples carry their counts and its results the
    figures computed from them."""
    cfg = replace(preset("demo-think"), out_dir=str(tmp_path / "run"), sft_steps=0, max_steps=1, prompts_per_step=4,
                  mini_batch_prompts=4, max_new_tokens=8, eval_problems=0, eval_every=0, log_completions_every=0,
                  explore="soft", early_stopping_entropy_threshold=10.0, early_stopping_length_threshold=3)
    train.run(cfg)
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    rows = cfg.prompts_per_step * cfg.group_size
    # a row ends thinking at its 3rd step, or sooner where it sampled </think> (or EOS) itself (p ~ 1/262 a step)
    assert metrics["think/answer_mixed"] == 0 and rows - 4 <= metrics["think/cold_stop_ends"] <= rows
    assert 2.5 <= metrics["think/len_mean"] <= 3.0 and metrics["think/mixed_frac"] > 0
    assert metrics["think/answer_len_mean"] == pytest.approx(metrics["response_len_mean"] - metrics["think/len_mean"])

    tokenizer = tiny_tokenizer()
    problems = [{"id": str(i), "problem": p["problem"], "answer": p["answer"], "prompt_ids":
                 encode_prompt(tokenizer, p["problem"])} for i, p in enumerate(arith_problems(3, think=1))]
    x = Exploration.of("soft", think_end_id(tokenizer), early_stopping_entropy_threshold=10.0,
                       early_stopping_length_threshold=3)
    model = random_model(TINY_CONFIG, seed=0).eval()
    generate_fn = E.sampler_fn(model, tokenizer, Sampling(temperature=1.0, max_new_tokens=8,
                                                          stop_ids=(tokenizer.eos_token_id,)), x, progress=False)
    results = E.evaluate([("arith", problems, "math")], generate_fn, n=2, out_dir=tmp_path / "eval", batch_size=4,
                         score_fn=lambda pairs, kind, name: [0.0] * len(pairs), progress=False)
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 6 and all(s["think_tokens"] <= 3 for s in samples)
    assert sum(s["think_tokens"] == 3 and END_THINK in s["response"] for s in samples) >= 4
    assert results["arith"]["think_tokens_mean"] == pytest.approx(sum(s["think_tokens"] for s in samples) / 6)
    assert results["arith"]["tokens_mean"] == pytest.approx(sum(s["tokens"] for s in samples) / 6)
    assert results["arith"]["correct_per_1k_think"] == 0.0 and "correct_tokens_mean" not in results["arith"]
