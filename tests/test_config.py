"""config.py: the released code's defaults, the presets, flags made from the dataclass, JSON round trip."""

import dataclasses

import pytest

from config import Config, preset
from rollout import exploration_from_config
from runtime.cli import build_parser, parse_config
from strategies import STRATEGIES

# The design document, read by hand: the released code's N-GRPO recipe for DeepSeek-R1-Distill-Qwen-1.5B
# (freeze_embeddings: the released runs' FSDP artifact, which the paper presets reproduce: tests/test_fidelity.py).
RELEASED_CODE_1P5B = dict(
    model="deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", data="agentica-org/DeepScaleR-Preview-Dataset",
    max_prompt_tokens=4096, max_new_tokens=8192, prompts_per_step=64, group_size=4, temperature=1.0, top_p=1.0,
    explore="neighbor", mix_rate=0.1, num_neighbors=1, mix_weights="code", neighbor_space="output",
    neighbor_metric="cosine", stop_mixing_token="</think>", noise_sigma=0.33, freeze_embeddings=True,
    loss="grpo", scale_rewards="group", adv_eps=1e-6, clip_low=0.2, clip_high=0.2, dual_clip=3.0, kl_coef=0.01,
    old_logp="replay", ppo_epochs=1, mini_batch_prompts=16, lr=5e-7, weight_decay=0.01, grad_clip=1.0,
)


def test_defaults_are_the_released_code_recipe():
    cfg = preset("paper-1.5b")
    assert {k: getattr(cfg, k) for k in RELEASED_CODE_1P5B} == RELEASED_CODE_1P5B
    assert parse_config([]) == cfg  # no flags at all = paper-1.5b


def test_paper_7b_preset():
    cfg = preset("paper-7b")
    assert (cfg.model, cfg.mix_rate, cfg.num_neighbors) == ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", 0.15, 2)


def test_grpo_baseline_preset():
    cfg = preset("grpo-1.5b")
    assert (cfg.explore, cfg.lr, cfg.kl_coef) == ("none", 1e-6, 0.001)
    assert cfg.model == "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"


@pytest.mark.parametrize("name", ["tiny", "demo"])
def test_small_presets_run_offline(name):
    cfg = preset(name)
    assert (cfg.model, cfg.tokenizer, cfg.data.partition(":")[0]) == ("tiny", "tiny", "arith")  # built-in data


def test_every_field_has_a_flag_with_help(capsys):
    with pytest.raises(SystemExit):
        build_parser("test").parse_args(["--help"])
    text = capsys.readouterr().out
    for field in dataclasses.fields(Config):
        assert "--" + field.name.replace("_", "-") in text
        assert field.metadata["help"].split()[0] in text


def test_flags_override_the_preset():
    cfg = parse_config(["--preset", "paper-7b", "--mix-rate", "0.3", "--freeze-embeddings", "--mix-weights", "renorm"])
    assert (cfg.mix_rate, cfg.num_neighbors, cfg.freeze_embeddings, cfg.mix_weights) == (0.3, 2, True, "renorm")
    assert parse_config(["--preset", "grpo-1.5b", "--no-freeze-embeddings"]).freeze_embeddings is False


@pytest.mark.parametrize("argv, message", [
    (["--explore", "bogus"], "invalid choice"),
    (["--mix-rate", "1.5"], "--mix-rate 1.5: must be in [0, 1]"),
    (["--prompts-per-step", "10", "--mini-batch-prompts", "4"],
     "--mini-batch-prompts 4: must divide --prompts-per-step (10)"),
    (["--lr", "abc"], "invalid float value"),
    (["--preset", "tiny", "--config", "x.json"], "give one of them"),
    (["--old-logp", "rollout", "--top-p", "0.9"], "--old-logp rollout: rollout needs --top-p 1"),
    (["--explore", "soft", "--mix-entropy-threshold", "4"], "--mix-entropy-threshold 4: has no effect with --explore "
     "soft (only with --explore neighbor, gaussian, topk, topk-gumbel, gaussian_embed_noise or orthogonal_noise)"),
    (["--explore", "none", "--mix-feed", "replay-only"], "--mix-feed replay-only: replay-only needs"),
    (["--mix-feed", "fed"], "invalid choice"),
])
def test_bad_flags_exit_with_one_message(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        parse_config(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_resolved_config_round_trips_through_json(tmp_path):
    cfg = parse_config(["--preset", "paper-7b", "--lr", "3e-6", "--kl-coef", "0", "--top-k", "20"])
    cfg.save_json(tmp_path / "run" / "config.json")
    assert Config.load_json(tmp_path / "run" / "config.json") == cfg
    again = parse_config(["--config", str(tmp_path / "run" / "config.json"), "--seed", "5",
                          "--out-dir", str(tmp_path / "again")])
    assert again == dataclasses.replace(cfg, seed=5, out_dir=str(tmp_path / "again"), preset="")  # a new run of its own


def test_unknown_json_keys_are_named(tmp_path):
    (tmp_path / "c.json").write_text('{"mix_rate": 0.2, "mixing_rate": 0.3}')
    with pytest.raises(ValueError, match="mixing_rate"):
        Config.load_json(tmp_path / "c.json")



def test_exploration_flags_reach_the_sampler():
    cfg = parse_config(["--explore", "orthogonal_noise", "--soft-top-k", "4", "--mix-temperature", "0.7",
                        "--mix-entropy-threshold", "11.9", "--mix-feed", "replay-only", "--stop-mixing-token", ""])
    x = exploration_from_config(cfg, tokenizer=None)
    assert (x.strategy, x.soft_top_k, x.mix_temperature, x.mix_entropy_threshold, x.mix_feed, x.stop_mixing_id) == (
        "orthogonal_noise", 4, 0.7, 11.9, "replay-only", None)
    assert preset("paper-1.5b").mix_feed == "sampler" and preset("paper-1.5b").mix_entropy_threshold == 0.0


def test_every_exploration_strategy_has_its_flag_value():
    explore = next(f for f in dataclasses.fields(Config) if f.name == "explore")
    assert explore.metadata["choices"] == tuple(STRATEGIES)
