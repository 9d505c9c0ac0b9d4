"""The loss side of exploration (issue 44): the entropy bonus takes its gradient through the chunked log-prob pass,
and moves weights that nothing else would move."""

import json
from dataclasses import replace

import torch

import ngrpo
import train
from config import preset
from engine.logprobs import token_logprobs
from model import TINY_CONFIG, load_model, random_model
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
