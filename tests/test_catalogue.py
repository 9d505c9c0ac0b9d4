"""The catalogue of methods declared once: every (method, knob) pair through the real command lines of train.py and
eval.py, accepted exactly when the method reads the knob; a method with a knob of its own, written outside the repo,
reached from both command lines; the help and eval's flags made from the registry."""

import dataclasses
import json
import os
import sys
from pathlib import Path

import preloaded
import pytest

import config
import eval as E
import strategies
from estimators import ADVANTAGES
from runtime.cli import build_parser, parse_config

ROOT = Path(__file__).resolve().parents[1]

# What each method reads, written from its paper and its authors' code (docs/algorithm.md), not from the registry:
# the coin's rate and entropy gate where a step mixes by coin; every method that mixes also reads --mix-feed, the
# token that ends thinking and the after-thinking filters.
COIN = {"mix_rate", "mix_entropy_threshold"}
MIXING = {"mix_feed", "stop_mixing_token", "after_thinking_top_k", "after_thinking_top_p", "after_thinking_min_p"}
COLD_STOP = {"early_stopping_entropy_threshold", "early_stopping_length_threshold", "dirichlet_alpha"}
TOP_K = {"soft_top_k", "mix_temperature"}
READS = {
    "none": set(),
    "neighbor": COIN | MIXING | {"num_neighbors", "mix_weights", "neighbor_space", "neighbor_metric",
                                 "neighbor_refresh"},
    "soft": MIXING | TOP_K | COLD_STOP,
    "soft-gumbel": MIXING | COLD_STOP | {"soft_top_k", "gumbel_temperature"},
    "gaussian": COIN | MIXING | TOP_K | {"noise_sigma"},
    "topk": COIN | MIXING | TOP_K,
    "topk-gumbel": COIN | MIXING | TOP_K,
    "gaussian_embed_noise": COIN | MIXING | TOP_K | {"noise_sigma"},
    "orthogonal_noise": COIN | MIXING | TOP_K,
    "mixinputs": MIXING | {"mixinputs_beta"},
    "multiplex": MIXING | COLD_STOP | {"multiplex_width", "multiplex_weights", "multiplex_replacement",
                                       "multiplex_gumbel_tau", "multiplex_entropy_mask"},
    "soft-grpo": MIXING | {"soft_top_k", "gumbel_temperature", "noise_factor"},
    "soft-grpo-dirichlet": MIXING | {"soft_top_k", "replay_softmax_temperature"},  # their trainer's replay, opt-in
    "soft-grpo-gaussian": MIXING | {"soft_top_k", "replay_softmax_temperature"},
    "thinkrouter": MIXING | TOP_K | COLD_STOP - {"dirichlet_alpha"} | {"router_confidence"},
}
KNOBS = sorted(set().union(*READS.values()))
ESTIMATOR_READS = {"grpo": {"scale_rewards", "adv_eps"},
                   "negative": {"scale_rewards", "adv_eps", "virtual_max_count", "virtual_max_reward"},
                   "rloo": set(), "reinforce-baseline": set(), "passk": {"pass_k"}}
FIELDS = {f.name: f for f in dataclasses.fields(config.Config)}


def another_value(name: str) -> str:
    """A value of the flag other than its default that its own declaration allows, as typed."""
    f = FIELDS[name]
    if f.type is bool:
        return "--no-" if f.default else "--"
    if f.metadata["choices"]:
        return next(c for c in f.metadata["choices"] if c != f.default)
    if f.type is str:
        return "" if f.default else "x"
    ok = (f.metadata["check"] or (lambda v: True, ""))[0]
    return str(next(v for v in ([f.default + 1] if f.type is int else [f.default + 0.5, 0.5, f.default / 2])
                    if v != f.default and ok(v)))


def flags(name: str) -> list[str]:
    value = another_value(name)
    if value in ("--", "--no-"):
        return [value + name.replace("_", "-")]
    return ["--" + name.replace("_", "-"), value]


def test_the_registry_reads_what_each_method_reads():
    assert set(strategies.STRATEGIES) == set(READS)
    assert {name: set(config.knobs_read(name)) for name in READS} == READS
    assert {name: set(e.knobs) for name, e in ADVANTAGES.items()} == ESTIMATOR_READS


@pytest.mark.parametrize("method", READS)
def test_train_accepts_a_knob_exactly_when_the_method_reads_it(method, capsys):
    for knob in KNOBS:
        argv = ["--preset", "tiny", "--explore", method, *flags(knob)]
        if knob in READS[method]:
            cfg = parse_config(argv)
            assert getattr(cfg, knob) != getattr(config.Config(), knob), argv
        else:
            with pytest.raises(SystemExit):
                parse_config(argv)
            message = capsys.readouterr().err.strip().splitlines()[-1]
            assert knob.replace("_", "-") in message and f"--explore {method}" in message, message


@pytest.mark.parametrize("method", READS)
def test_eval_accepts_a_knob_exactly_when_the_method_reads_it(method, capsys):
    for knob in KNOBS:
        argv = ["--model", "tiny", "--explore", method, *flags(knob)]
        if knob in READS[method] and knob != "neighbor_refresh":  # a refresh needs optimizer steps: train.py's
            _, cfg = E.parse_args(argv)
            assert getattr(cfg, knob) != getattr(config.Config(), knob), argv
        else:
            with pytest.raises(SystemExit):
                E.parse_args(argv)
            message = capsys.readouterr().err.strip().splitlines()[-1]
            assert knob.replace("_", "-") in message, message


@pytest.mark.parametrize("argv, message", [
    (["--explore", "soft", "--mix-rate", "0.5"], "--mix-rate 0.5: has no effect with --explore soft (only with "
     "--explore neighbor, gaussian, topk, topk-gumbel, gaussian_embed_noise or orthogonal_noise)"),
    (["--explore", "none", "--mix-rate", "0.3"], "--mix-rate 0.3: has no effect with --explore none (only with "
     "--explore neighbor, gaussian, topk, topk-gumbel, gaussian_embed_noise or orthogonal_noise)"),
    (["--explore", "soft-grpo", "--mix-temperature", "0.5"], "--mix-temperature 0.5: has no effect with --explore "
     "soft-grpo (only with --explore soft, gaussian, topk, topk-gumbel, gaussian_embed_noise, orthogonal_noise or "
     "thinkrouter)"),
    (["--adv-estimator", "rloo", "--scale-rewards", "none"], "--scale-rewards none: has no effect with "
     "--adv-estimator rloo (only with --adv-estimator grpo or negative)"),
])
def test_the_flags_that_once_did_nothing_are_refused_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        parse_config(argv)
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f": error: {message}")


def test_the_explore_choices_and_help_come_from_the_registry(capsys):
    with pytest.raises(SystemExit):
        build_parser("test").parse_args(["--help"])
    text = "".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere, at hyphens too
    for name, strategy in strategies.STRATEGIES.items():
        assert f"{name}={''.join(strategy.about.split())}" in text
    assert "[--exploremultiplex]" in text and "[--adv-estimatorpassk]" in text  # who reads a knob
    assert {f.name for f in dataclasses.fields(strategies.Knobs)} <= set(E.EVAL_FIELDS) | {"neighbor_refresh"}


# A method with a knob of its own, in a file outside the repo: feeds g E[y] while thinking (g = --toy-gain).
OUTSIDE = '''
"""A toy method: every thinking step feeds the sampled token's embedding times a gain, recorded as ([y], [g])."""
import torch

from strategies.base import POSITIVE, Strategy, mix_where, option

KNOBS = dict(toy_gain=option(1.0, "the factor on the sampled token's embedding", check=POSITIVE))


def explore_gain(view):
    gain = torch.full((len(view.token), 1), view.exploration.toy_gain, device=view.token.device)
    return mix_where(view, view.token[:, None], gain, view.eligible)


STRATEGIES = {"toy-gain": Strategy(explore_gain, "the sampled token times a gain", candidates=lambda x: 1,
                                   knobs=("toy_gain",))}
'''
TINY = ["--preset", "tiny", "--prompts-per-step", "4", "--mini-batch-prompts", "4", "--max-new-tokens", "6"]


def test_a_method_from_outside_the_repo_is_reached_from_both_command_lines(tmp_path):
    method = tmp_path / "outside" / "toy_method.py"
    method.parent.mkdir()
    method.write_text(OUTSIDE)
    env = dict(os.environ, NGRPO_STRATEGIES=str(method))

    def run(*args):
        return preloaded.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)

    shown = run("train.py", *TINY, "--explore", "toy-gain", "--toy-gain", "2.5", "--print-config")
    assert shown.returncode == 0, shown.stderr
    assert (json.loads(shown.stdout)["explore"], json.loads(shown.stdout)["toy_gain"]) == ("toy-gain", 2.5)
    refused = run("train.py", *TINY, "--explore", "neighbor", "--toy-gain", "2.5")
    assert refused.returncode == 2
    assert refused.stderr.strip().endswith("--toy-gain 2.5: has no effect with --explore neighbor (only with "
                                           "--explore toy-gain)")
    helped = run("eval.py", "--help")
    assert "toy-gain = the sampled token times a gain" in " ".join(helped.stdout.split()) and "--toy-gain" in \
        helped.stdout
    out = tmp_path / "run"
    trained = run("train.py", *TINY, "--explore", "toy-gain", "--toy-gain", "2.5", "--max-steps", "1",
                  "--out-dir", str(out))
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert json.loads((out / "config.json").read_text())["toy_gain"] == 2.5
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["logp_gap_max"] < 1e-4  # replay = fed
    evaluated = run("eval.py", "--model", "tiny", "--tokenizer", "tiny", "--benchmarks", "arith", "--limit", "2",
                    "--n", "1", "--max-new-tokens", "4", "--explore", "toy-gain", "--toy-gain", "0.5",
                    "--out-dir", str(tmp_path / "eval"))
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert json.loads((tmp_path / "eval" / "settings.json").read_text())["toy_gain"] == 0.5
    without = preloaded.run([sys.executable, "train.py", "--config", str(out / "config.json"), "--resume"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={k: v for k, v in env.items() if k != "NGRPO_STRATEGIES"})
    assert without.returncode == 2 and "toy_gain" in without.stderr and "NGRPO_STRATEGIES" in without.stderr
