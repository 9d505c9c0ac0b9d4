"""The loss side of exploration (issue 44): the entropy bonus takes its gradient through the chunked log-prob pass,
and moves weights that nothing else would move; the top-entropy tokens, the KL in the reward and the adaptive
coefficient, each against values worked out by hand or a brute-force loss from plain forwards."""

import copy
import json
import math
import pickle
from dataclasses import replace

import pytest
import torch

import ngrpo
import train
from config import Config, preset
from engine.logprobs import token_logprobs
from estimators import EntropyControl, high_entropy_mask, kl_penalty
from model import TINY_CONFIG, load_model, random_model
from reward import RewardPool
from rollout import Sampling, generate
from runtime.diagnostics import LearningSignal


def full_logprobs(hidden, weight, labels, temperature):
    """The reference: all logits at once, log_softmax, gather; entropy = -(p * log p).sum."""
    log_probs = (hidden @ weight.T / temperature).log_softmax(-1)
    return log_probs.gather(-1, labels[..., None])[..., 0], -(log_probs.exp() * log_probs).sum(-1)


def test_the_entropy_bonus_gradient_equals_autograd_over_full_logits():
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(3, 7, 16, generator=g), torch.randn(50, 16, generator=g) * 0.5
    labels = torch.randint(0, 50, (3, 7), generator=g)
    mask = torch.arange(7)[None] < torch.tensor([7, 4, 2])[:, None]
    advantages, old_logp = torch.tensor([1.0, -0.5, 0.3]), torch.full((3, 7), -3.0)
    settings = ngrpo.LossSettings(kl_coef=0.0, entropy_coef=0.05)
    grads = []
    for chunked in (True, False):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        logp, entropy = (token_logprobs(h, w, labels, temperature=0.7, chunk_tokens=5) if chunked
                         else full_logprobs(h, w, labels, 0.7))
        loss, metrics = ngrpo.policy_loss(logp, old_logp, advantages, mask, settings=settings, entropy=entropy)
        loss.backward()
        grads.append((h.grad, w.grad, float(metrics["entropy_bonus"])))
    (h_ours, w_ours, bonus), (h_ref, w_ref, bonus_ref) = grads
    assert abs(bonus - bonus_ref) < 1e-5 and bonus > 0
    assert torch.allclose(h_ours, h_ref, atol=1e-5) and torch.allclose(w_ours, w_ref, atol=1e-5)


def test_with_no_reward_the_entropy_bonus_alone_moves_the_weights(tmp_path, one_thread):
    """The random tiny model scores 0 on every answer: with no KL, every advantage and so the policy gradient is 0,
    and AdamW's weight decay alone moves the weights (w (1 - lr wd)); an entropy bonus moves them further."""
    base = replace(preset("tiny"), prompts_per_step=4, mini_batch_prompts=4, micro_batch_size=16, max_new_tokens=8,
                   max_steps=1, kl_coef=0.0, save_every=1)
    initial = random_model(TINY_CONFIG, dtype=torch.float32, device="cpu", seed=base.seed).state_dict()
    moved = {}
    for coef in (0.0, 0.05):
        out = tmp_path / f"coef-{coef}"
        train.run(replace(base, entropy_coef=coef, out_dir=str(out)))
        weights = load_model(str(out / "checkpoints" / "step-1"), dtype=torch.float32, device="cpu").state_dict()
        decayed = {name: initial[name] * (1 - base.lr * base.weight_decay) for name in weights}
        moved[coef] = max(float((weights[name] - decayed[name]).abs().max()) for name in weights)
    assert moved[0.0] < 1e-7, moved  # where weight decay puts them
    assert moved[0.05] > 1e-5, moved  # the bonus moved them (AdamW's first step moves each weight by about lr)


def test_a_run_that_learns_nothing_says_so_once(tmp_path, one_thread, capsys):
    """The random tiny model answers nothing right (every group's rewards equal) and, with 4 new tokens, every
    response is cut: both causes are named once, after 3 steps, in the log, metrics.jsonl and summary.json."""
    cfg = replace(preset("tiny"), prompts_per_step=4, mini_batch_prompts=4, micro_batch_size=16, max_new_tokens=4,
                  max_steps=5, out_dir=str(tmp_path / "run"))
    summary = train.run(cfg)
    errors = capsys.readouterr().err
    assert errors.count("had all-equal rewards for 3 steps in a row") == 1
    assert errors.count("ran to --max-new-tokens for 3 steps in a row") == 1
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [("warning" in m) for m in metrics] == [False, False, True, False, False]
    assert len(summary["warnings"]) == 1 and summary["warnings"][0].startswith("step 3: ")


def test_a_run_that_learns_says_nothing():
    signal = LearningSignal()
    steady = {"zero_variance_groups": 0.5, "truncated_frac": 0.1}
    assert [signal.observe(steady) for _ in range(10)] == [None] * 10
    bad = {"zero_variance_groups": 1.0, "truncated_frac": 0.1}
    assert [signal.observe(m) is None for m in (bad, bad, steady, bad, bad)] == [True] * 5  # never 3 in a row


def test_a_training_accuracy_that_falls_and_stays_down_is_said_once():
    """20 steps at 0.60, then 0.45: the 10-step mean reaches 0.50 (0.10 below its best) at step 27 and the warning
    comes when it has stayed there 10 steps, at step 36, once."""
    signal = LearningSignal()
    said = {step: signal.observe({"step": step, "accuracy": 0.60 if step <= 20 else 0.45}) for step in range(1, 61)}
    warned = {step: warning for step, warning in said.items() if warning}
    assert list(warned) == [36]
    assert "fell from 0.600 (steps 1-10) to 0.450" in warned[36] and "unlearning" in warned[36]


def test_a_noisy_training_accuracy_says_nothing():
    signal = LearningSignal()
    assert not any(signal.observe({"step": step, "accuracy": 0.55 + 0.1 * (step % 2)}) for step in range(1, 101))


@pytest.mark.parametrize("held_out, warned", [
    ([0.68, 0.60, 0.55], 60),  # two falls in a row, 13 points below the best
    ([0.68, 0.66, 0.65], None),  # two falls, within 5 points of the best
    ([0.60, 0.70, 0.65, 0.66], None),  # a fall, then a rise
    ([0.70, 0.72, 0.69, 0.60], 80),
])
def test_a_held_out_accuracy_that_falls_twice_in_a_row_is_said(held_out, warned):
    signal = LearningSignal()
    said = [step for step, value in zip(range(20, 20 * len(held_out) + 1, 20), held_out)
            if signal.observe({"step": step, "held_out_accuracy": value})]
    assert said == ([] if warned is None else [warned])


def test_a_checkpoint_from_before_the_unlearning_watch_resumes_it():
    old = LearningSignal()
    for name in ("accuracies", "best_window", "below_best", "held_out"):
        del old.__dict__[name]  # as pickled before these existed
    resumed = pickle.loads(pickle.dumps(old))
    assert resumed.observe({"step": 1, "accuracy": 0.5, "held_out_accuracy": 0.5}) is None
    assert resumed.accuracies == [(1, 0.5)] and resumed.held_out == [(1, 0.5)]


# ----------------------------------------------------------------------------- the top-entropy tokens


def test_high_entropy_mask_keeps_the_top_fraction_of_the_batch_by_hand():
    entropy = torch.tensor([[0.1, 0.9, 0.5, 0.7], [0.3, 0.2, 5.0, 5.0]])
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])  # the 5.0s are padding
    assert high_entropy_mask(entropy, mask, 0.5).tolist() == [[False, True, True, True], [False] * 4]  # 3 of 6
    assert high_entropy_mask(entropy, mask, 0.2).tolist() == [[False, True, False, True], [False] * 4]  # ceil(1.2)
    assert high_entropy_mask(entropy, mask, 1.0).tolist() == mask.tolist()
    assert high_entropy_mask(entropy, mask, 0.01).sum() == 1  # at least one token
    tied = torch.tensor([[0.5, 0.5, 0.5, 0.1]])
    assert high_entropy_mask(tied, torch.ones(1, 4, dtype=torch.bool), 0.25).tolist() == [[True, True, True, False]]


def test_the_kl_penalty_sums_each_responses_tokens_by_hand():
    old, ref = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]]), torch.tensor([[-2.0, -2.0, 0.0], [0.0] * 3])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    cfg = replace(Config(), kl_coef=0.5, kl_estimator="k1")
    assert torch.allclose(kl_penalty(old, ref, mask, cfg), torch.tensor([0.5 * (1.0 + 0.0), 0.5 * -1.0]))
    cfg = replace(cfg, kl_estimator="k3")  # d = ref - old: -1, 0 | 1
    assert torch.allclose(kl_penalty(old, ref, mask, cfg), torch.tensor([0.5 * math.exp(-1), 0.5 * (math.e - 2)]))


def test_the_adaptive_coefficient_follows_skywork_or1s_rule_by_hand():
    control = EntropyControl(max_coef=0.015, target=0.2, delta=0.01)
    # e_k:  0.1 (c 0 -> 0.01)   0.1 (0.01 -> 0.015, the ceiling)   0.5 (above: off, 0.015 -> 0.005)   0.2 (= target)
    assert [control.step(e) for e in (0.1, 0.1, 0.5, 0.2)] == pytest.approx([0.0, 0.01, 0.0, 0.005], abs=1e-12)
    assert control.coef == pytest.approx(0.005, abs=1e-12)  # at the target it stays
    assert [EntropyControl(max_coef=0.03).step(e) for e in (0.1, 9.0)] == [0.03, 0.03]  # fixed


def brute_force_update_gradient(policy, reference, rollout, rewards, cfg) -> dict:
    """The loss of --adv-estimator rloo, --kl-in-reward with k3, --top-entropy-quantile and a fixed
    --entropy-coef, token by token from one plain forward per row (full logits), and its gradient."""
    policy = copy.deepcopy(policy)
    rows = []
    for row, prompt in enumerate(rollout.prompts):
        n = int(rollout.lengths[row])
        ids = torch.tensor([prompt + rollout.response_ids[row, :n].tolist()])
        at = [len(prompt) - 1 + t for t in range(n)]
        tokens = rollout.response_ids[row, :n]
        log_probs = policy(ids)[0].float().log_softmax(-1)[at]  # [n, V]
        with torch.no_grad():
            ref = reference(ids)[0].float().log_softmax(-1)[at].gather(-1, tokens[:, None])[:, 0]
        rows.append((log_probs.gather(-1, tokens[:, None])[:, 0], ref, -(log_probs.exp() * log_probs).sum(-1)))
    shaped = []
    for (logp, ref, _), r in zip(rows, rewards.tolist()):
        d = ref - logp.detach()
        shaped.append(r - cfg.kl_coef * float((d.exp() - d - 1).sum()))
    G = cfg.group_size
    advantages = [(shaped[i] - sum(shaped[g * G: g * G + G]) / G) * G / (G - 1) for g in range(len(shaped) // G)
                  for i in range(g * G, g * G + G)]
    entropies = sorted((float(h) for _, _, h in rows for h in h.detach()), reverse=True)
    threshold = entropies[math.ceil(cfg.top_entropy_quantile * len(entropies)) - 1]
    total = 0.0
    for (logp, _, entropy), a in zip(rows, advantages):
        ratio = torch.exp(logp - logp.detach())  # 1, with the gradient of log p
        kept = (entropy.detach() >= threshold).float()
        total = total + (-a * ratio * kept).sum() - cfg.entropy_coef * entropy.sum()
    (total / len(entropies)).backward()
    return {name: p.grad for name, p in policy.named_parameters()}


def test_the_loss_side_update_equals_a_brute_force_loss():
    policy, reference = random_model(TINY_CONFIG, seed=0), random_model(TINY_CONFIG, seed=1)
    prompts = [[5, 9, 2]] * 4 + [[7, 1, 4, 4, 8]] * 4
    rollout = generate(policy, prompts, Sampling(max_new_tokens=10, stop_ids=tuple(range(0, 262, 9))), seed=3)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    cfg = replace(Config(), adv_estimator="rloo", kl_coef=0.5, kl_estimator="k3", kl_in_reward=True,
                  top_entropy_quantile=0.4, entropy_coef=0.03, loss_agg="token-mean", micro_batch_size=3,
                  grad_clip=0.0, mini_batch_prompts=2, prompts_per_step=2)
    expected = brute_force_update_gradient(policy, reference, rollout, rewards, cfg)
    trained = copy.deepcopy(policy)
    optimizer = torch.optim.SGD(trained.parameters(), lr=1.0)  # one step: the weights move by -gradient
    metrics, skipped = ngrpo.update(trained, reference, optimizer, rollout, rewards, cfg)
    assert skipped == 0 and 0.4 <= metrics["pg_token_frac"] < 0.45 and metrics["kl_in_reward"] > 0
    before = dict(policy.named_parameters())
    for name, p in trained.named_parameters():
        if expected[name] is None:  # frozen (the input embeddings)
            continue
        assert torch.allclose(before[name] - p.detach(), expected[name], atol=2e-6), name


def test_a_top_entropy_quantile_of_1_is_the_run_without_it(tmp_path, one_thread, monkeypatch):
    # Rewards by the parity of a response's length: the random model's groups have advantages to train on.
    monkeypatch.setattr(RewardPool, "score", lambda self, pairs, kind="math": [float(len(t) % 2) for t, _ in pairs])
    base = replace(preset("tiny"), prompts_per_step=4, mini_batch_prompts=4, micro_batch_size=16, max_new_tokens=8,
                   max_steps=2, kl_coef=0.05, entropy_coef=0.01, save_every=2)
    runs = {}
    for name, cfg in (("without", base), ("q=1", replace(base, top_entropy_quantile=1.0)),
                      ("q=0.5", replace(base, top_entropy_quantile=0.5))):
        train.run(replace(cfg, out_dir=str(tmp_path / name)))
        metrics = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        weights = load_model(str(tmp_path / name / "checkpoints" / "step-2"), dtype=torch.float32,
                             device="cpu").state_dict()
        runs[name] = [{k: v for k, v in m.items() if not k.endswith(("_s", "_per_s"))} for m in metrics], weights
    assert runs["q=1"][0] == runs["without"][0]
    assert all(torch.equal(runs["q=1"][1][k], runs["without"][1][k]) for k in runs["without"][1])
    assert all(0.5 <= m["pg_token_frac"] < 0.55 for m in runs["q=0.5"][0])  # the fraction trained on, logged
    assert any(not torch.equal(runs["q=0.5"][1][k], runs["without"][1][k]) for k in runs["without"][1])
