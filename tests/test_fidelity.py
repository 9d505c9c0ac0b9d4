"""The paper presets against the released configs (configs/*.yaml of github.com/ZJUSCL/N-GRPO, numbers copied
here by hand), verl's per-micro-batch loss aggregation against a hand-computed gradient, GSPO's aggregation,
validation during training against eval.py, and --keep-best."""

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import eval as E
import ngrpo
import rollout
import train
from config import preset
from runtime.cli import parse_config

# (preset, released file): the values the released yaml sets (and verl's ppo_trainer defaults it inherits).
RELEASED = [
    ("paper-1.5b", "configs/n-grpo_1_5b.yaml", dict(
        mix_rate=0.1, num_neighbors=1,  # mix_top_k: 2 = the anchor and one neighbor
        neighbor_metric="cosine", stop_mixing_token="</think>", lr=5e-7, kl_coef=0.01, prompts_per_step=64,
        group_size=4, mini_batch_prompts=16, ppo_epochs=1, max_prompt_tokens=4096, max_new_tokens=8192,
        clip_low=0.2, clip_high=0.2, dual_clip=3.0, loss_agg="token-mean-per-rows", loss_agg_rows=2,
        val_data="aime24", val_n=32, val_temperature=0.6, val_top_p=0.95, val_every=1, val_before_train=True,
        save_every=10, keep_last=1, freeze_embeddings=True)),
    ("paper-7b", "configs/n-grpo_7b.yaml", dict(
        mix_rate=0.15, num_neighbors=2, lr=1e-6, kl_coef=0.001, loss_agg="token-mean-per-rows", loss_agg_rows=2,
        val_n=32, save_every=10, freeze_embeddings=True)),
    ("grpo-1.5b", "configs/grpo_1_5b.yaml", dict(explore="none", lr=1e-6, kl_coef=0.001, loss_agg_rows=2,
                                                  freeze_embeddings=False)),
    ("grpo-7b", "configs/grpo_7b.yaml", dict(explore="none", lr=1e-6, kl_coef=0.001, loss_agg_rows=2,
                                              freeze_embeddings=False)),
]


@pytest.mark.parametrize("name, released_file, values", RELEASED, ids=[r[0] for r in RELEASED])
def test_paper_presets_equal_the_released_configs(name, released_file, values):
    cfg = preset(name)
    assert {key: getattr(cfg, key) for key in values} == values, released_file
    assert ("7B" in cfg.model) == name.endswith("7b")


# The soft-token methods' presets against their authors' scripts (values copied by hand from the files and lines named).
AUTHORS = [
    ("soft-grpo-1.5b", "zz1358m/SofT-GRPO-master SofT-GRPO-deepscaler-8k.sh", dict(
        prompts_per_step=64, max_prompt_tokens=1024, max_new_tokens=8192, lr=1e-6, mini_batch_prompts=32,  # l. 6-14
        kl_coef=0.001, kl_estimator="low-var", entropy_coef=0.0, top_p=0.95, top_k=5, soft_top_k=5,  # l. 16-31
        temperature=1.0, after_thinking_top_p=0.95, after_thinking_top_k=5, gumbel_temperature=0.1,  # l. 31-35
        noise_factor=1.0, group_size=8,  # l. 40, 46
        loss_agg="token-mean-per-rows", loss_agg_rows=2,  # l. 15 ppo_micro_batch_size_per_gpu=2, a token mean each
        freeze_embeddings=True)),  # verl workers/actor/dp_actor.py l. 210: inputs_embeds=...detach()
    ("soft-grpo-7b", "zz1358m/SofT-GRPO-master SofT-GRPO-deepscaler-8k-qwen7.sh", dict(
        prompts_per_step=64, lr=1e-6, mini_batch_prompts=32, kl_coef=0.001, top_k=5, gumbel_temperature=0.1,
        loss_agg="seq-mean-token-mean",  # l. 15 ppo_micro_batch_size_per_gpu=1: one row's token mean each
        freeze_embeddings=True)),
    ("multiplex-7b", "MaxLEAF3824/Multiplex-Thinking README.md l. 83-96, scripts/train.sh", dict(
        max_steps=300, prompts_per_step=128, multiplex_width=3, max_new_tokens=4096, val_n=4, val_data="math500",
        multiplex_weights="uniform", lr=1e-6, mini_batch_prompts=128, kl_coef=0.0, temperature=1.0, top_p=1.0,
        multiplex_replacement=True, entropy_coef=0.0, group_size=8, max_prompt_tokens=1024)),
]


@pytest.mark.parametrize("name, script, values", AUTHORS, ids=[a[0] for a in AUTHORS])
def test_the_soft_token_presets_equal_their_authors_scripts(name, script, values):
    cfg = preset(name)
    assert {key: getattr(cfg, key) for key in values} == values, script


def verl_token_weights(lengths: list[int], micro: int) -> list[float]:
    """Their loss, written from verl 0.4's dp_actor.py (SofT-GRPO's fork, l. 451, 535) and core_algos.agg_loss
    (token-mean): the rows split into micro-batches of `micro` in order, each micro-batch's loss the mean over its
    tokens, divided by the number of micro-batches (gradient_accumulation) and summed. A token's weight: 1 / (its
    micro-batch's tokens x the number of micro-batches)."""
    batches = [lengths[i : i + micro] for i in range(0, len(lengths), micro)]
    return [1.0 / (sum(batch) * len(batches)) for batch in batches for _ in batch]


@pytest.mark.parametrize("name, micro", [("soft-grpo-1.5b", 2), ("soft-grpo-7b", 1)])
def test_each_tokens_weight_under_the_soft_grpo_presets_is_their_trainers(name, micro):
    """Rows of unequal lengths (40, 36, 5, 2 tokens): d loss / d logp of each token, ratio 1 and A = -1 (so the
    loss is the aggregated ratio), equals its weight in their loss."""
    lengths = [40, 36, 5, 2]
    mask = rollout.length_mask(torch.tensor(lengths), max(lengths))
    logp = torch.zeros(len(lengths), max(lengths), requires_grad=True)
    settings = replace(ngrpo.LossSettings.of(preset(name)), kl_coef=0.0)
    loss, _ = ngrpo.policy_loss(logp, logp.detach(), -torch.ones(len(lengths)), mask, settings=settings)
    loss.backward()
    for row, weight in enumerate(verl_token_weights(lengths, micro)):
        assert torch.allclose(logp.grad[row, : lengths[row]], torch.tensor(weight), rtol=1e-6, atol=0), row
        assert not logp.grad[row, lengths[row] :].any()


def test_the_soft_grpo_presets_leave_the_input_embeddings_as_they_were(tmp_path):
    """One step of soft-grpo-1.5b on the tiny model: the embeddings frozen (not even AdamW's weight decay moves them),
    the output matrix trained."""
    from model import TINY_CONFIG, load_model, random_model

    cfg = replace(preset("soft-grpo-1.5b"), model="tiny", tokenizer="tiny", data="arith", max_prompt_tokens=256,
                  max_new_tokens=8, prompts_per_step=2, mini_batch_prompts=2, group_size=2, rollout_batch_size=0,
                  micro_batch_size=4, lr=1e-2, max_steps=1, save_every=0, log_completions_every=0, device="cpu",
                  grad_checkpointing=False, out_dir=str(tmp_path / "run"))
    train.run(cfg)
    trained = load_model(str(tmp_path / "run" / "checkpoints" / "step-1"), dtype=torch.float32, device="cpu")
    start = random_model(TINY_CONFIG, seed=cfg.seed)
    assert torch.equal(trained.embed_tokens.weight, start.embed_tokens.weight)
    assert not torch.equal(trained.lm_head.weight, start.lm_head.weight)


def test_gspo_defaults_to_its_per_sequence_mean_unless_told():
    assert parse_config(["--loss", "gspo"]).loss_agg == "seq-mean-token-mean"
    assert parse_config(["--loss", "gspo", "--loss-agg", "token-mean"]).loss_agg == "token-mean"
    assert preset("n-gspo-1.5b").loss == "gspo" and preset("n-gspo-1.5b").loss_agg == "seq-mean-token-mean"


def test_print_config_shows_the_resolved_values(capsys):
    with pytest.raises(SystemExit) as stopped:
        parse_config(["--preset", "paper-7b", "--print-config"])
    assert stopped.value.code == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["lr"] == 1e-6 and shown["kl_coef"] == 0.001 and shown["num_neighbors"] == 2


# ----------------------------------------------------------------------------- per-rows aggregation


def test_token_mean_per_rows_against_a_hand_computed_gradient():
    """Rows of lengths 1, 3, 2, 4 (runs of 2 rows: tokens 4 and 6), ratio 1 (logp = old_logp), no KL: the loss
    is mean over runs of (sum of -A over the run's tokens / the run's tokens), and d loss / d logp at a token
    of row i is -A_i / (tokens of i's run) / (number of runs)."""
    lengths = torch.tensor([1, 3, 2, 4])
    mask = rollout.length_mask(lengths, 4)
    advantages = torch.tensor([1.0, -0.5, 2.0, -1.0])
    logp = torch.zeros(4, 4, requires_grad=True)
    cfg = replace(preset("tiny"), loss_agg="token-mean-per-rows", loss_agg_rows=2, kl_coef=0.0)
    loss, _ = ngrpo.policy_loss(logp, logp.detach(), advantages, mask, settings=ngrpo.LossSettings.of(cfg))
    run_tokens = [4, 4, 6, 6]
    expected_loss = ((-1.0 * 1 + 0.5 * 3) / 4 + (-2.0 * 2 + 1.0 * 4) / 6) / 2
    assert loss.item() == pytest.approx(expected_loss, abs=1e-7)
    loss.backward()
    expected = torch.zeros(4, 4)
    for row in range(4):
        expected[row, : lengths[row]] = -advantages[row] / run_tokens[row] / 2
    assert torch.allclose(logp.grad, expected, atol=1e-7)


def test_token_mean_per_rows_does_not_depend_on_the_micro_batch_size():
    """backward_minibatch with micro-batches of 1, 3 (a run of 2 rows split across micro-batches) and all."""
    from model import TINY_CONFIG, random_model
    from rollout import Exploration, Sampling, generate

    model = random_model(TINY_CONFIG, seed=3)
    prompts = [[5, 9, 2], [7, 1, 4, 4], [11], [3, 3, 9, 20], [100, 101]]
    rollout = generate(model, prompts, Sampling(max_new_tokens=12, stop_ids=tuple(range(0, 262, 9))), Exploration(),
                       seed=4)
    assert len(set(rollout.lengths.tolist())) > 2
    old_logp = rollout.logprobs + 0.3 * torch.randn(rollout.logprobs.shape, generator=torch.Generator().manual_seed(5))
    episodes = ngrpo.Episodes(rollout, torch.tensor([1.0, -0.5, 0.3, -1.2, 0.4]), old_logp)
    grads = {}
    for size in (1, 3, 5):
        copy_ = copy.deepcopy(model)
        cfg = replace(preset("tiny"), loss_agg="token-mean-per-rows", loss_agg_rows=2, micro_batch_size=size)
        ngrpo.backward_minibatch(copy_, episodes, cfg)
        grads[size] = torch.cat([p.grad.flatten() for p in copy_.parameters()])
    for size in (1, 3):
        assert (grads[size] - grads[5]).norm() / grads[5].norm() < 1e-6


# ----------------------------------------------------------------------------- validation during training


@pytest.fixture
def val_file(tmp_path) -> Path:
    path = tmp_path / "val.jsonl"
    path.write_text("".join(json.dumps({"problem": f"{i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(3)))
    return path


@pytest.mark.parametrize("instruction", [None, ""], ids=["paper-instruction", "bare-problem"])
def test_validation_equals_eval_py_on_the_same_model_and_seeds(tmp_path, val_file, instruction):
    cfg = replace(preset("tiny"), out_dir=str(tmp_path / "run"), max_steps=1, prompts_per_step=4,
                  mini_batch_prompts=4, max_new_tokens=8, val_data=str(val_file), val_n=2, val_before_train=True,
                  rollout_batch_size=4)
    if instruction is not None:
        cfg = replace(cfg, instruction=instruction)
    summary = train.run(cfg)
    instruction_flag = [] if instruction is None else ["--instruction", instruction]
    results = E.main(["--model", "tiny", "--benchmarks", str(val_file), "--n", "2", "--max-new-tokens", "8",
                      "--batch-size", "4", "--out-dir", str(tmp_path / "eval"), *instruction_flag])
    expected = {f"val/{name}/{key}": value for name, row in results.items() for key, value in row.items()
                if key.startswith(("mean@", "pass@"))}
    assert summary["val_before"] == expected
    step_0 = tmp_path / "run" / "val" / "step-0"
    evaluated = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert json.loads((step_0 / "results.json").read_text()) == evaluated
    # The same responses, sample by sample (the random model scores 0, so the numbers alone prove little).
    assert (step_0 / "samples.jsonl").read_text() == (tmp_path / "eval" / "samples.jsonl").read_text()
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert set(expected) <= set(last)  # the last step is validated too


def test_keep_best_keeps_the_weights_of_the_best_step(tmp_path, val_file, monkeypatch):
    scores = {1: 0.2, 2: 0.5, 3: 0.3}  # a stand-in validation metric: step 2 is the best
    monkeypatch.setattr(train, "validate", lambda r, step: {"val/val/mean@2": scores[step]})
    cfg = replace(preset("tiny"), out_dir=str(tmp_path / "run"), max_steps=3, prompts_per_step=4,
                  mini_batch_prompts=4, max_new_tokens=8, val_data=str(val_file), val_every=1,
                  keep_best="val/val/mean@2", save_every=1, keep_last=3)
    summary = train.run(cfg)
    best = tmp_path / "run" / "best"
    assert json.loads((best / "best.json").read_text()) == {"step": 2, "metric": "val/val/mean@2", "value": 0.5}
    assert summary["best"]["step"] == 2
    from safetensors.torch import load_file

    kept = load_file(best / "model.safetensors")
    step_2 = load_file(tmp_path / "run/checkpoints/step-2/model.safetensors")
    assert kept.keys() == step_2.keys() and all(torch.equal(kept[k], step_2[k]) for k in kept)
