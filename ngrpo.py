"""The N-GRPO algorithm: what training does with a Rollout (DESIGN.md §3, "GRPO update").

    rewards -> group_advantages -> replay the recorded inputs (policy, old policy, reference)
            -> token_logprobs from hidden states, in chunks -> policy_loss (dual-clip PPO or GSPO + k3 KL)

Replay: every response position is fed what the sampler fed, sum_k w_k E[id_k] (`mixed_embeddings`, the
one formula both sides use), so the policy is scored on the inputs it actually saw; gradients reach E
through the mixtures. Sequences are laid out [prompt | response] and right-padded, so plain causal
attention is exact for every real token. The loss is a token mean over all response tokens of the
mini-batch (or a mean over its sequences, --loss-agg): each micro-batch divides by the mini-batch's token
(or sequence) count, so the gradient does not depend on how the mini-batch is split.
"""

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def mixed_embeddings(embed_weight: torch.Tensor, cand_ids: torch.Tensor, cand_weights: torch.Tensor) -> torch.Tensor:
    """sum_c w_c E[c] over the last axis: [..., K] ids and weights -> [..., d] in the embedding's dtype.

    A step that was not mixed holds ([y, y, ...], [1, 0, ...]) and gives exactly E[y]: 1·x and 0·x are
    exact and so is their sum. The sum runs in fp32 so that a bf16 sampler and an fp32 replay round once.
    One candidate at a time: a [..., K, d] gather would hold K embeddings per position at once (K = 10 for
    soft / gaussian: ~2 GB for 4 rows of 8k tokens at d = 1536)."""
    mixed = None
    for k in range(cand_ids.shape[-1]):
        rows = F.embedding(cand_ids[..., k], embed_weight)  # [..., d]
        term = cand_weights[..., k, None].float() * rows.float()
        mixed = term if mixed is None else mixed + term
    return mixed.to(embed_weight.dtype)


def length_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """[B, width] bool: position t of row b is True when t < lengths[b]."""
    return torch.arange(width, device=lengths.device)[None] < lengths[:, None]


def group_advantages(rewards: torch.Tensor, group_size: int, *, scale: str = "group", eps: float = 1e-6,
                     virtual_count: int = 0, virtual_reward: float = 1.0) -> torch.Tensor:
    """(r - mean_G r) / (std_G r + eps) with the unbiased std, per group of `group_size` consecutive rewards.

    >>> group_advantages(torch.tensor([1., 0., 0., 0.]), 4)   # mean 0.25, std 0.5
    tensor([ 1.5000, -0.5000, -0.5000, -0.5000])
    A group whose rewards are all equal gets 0; so does a group of one. scale: group = the group's std,
    batch = the std of all `rewards`, none = centre only (Dr. GRPO).

    virtual_count = m > 0 is NGRPO's calibration: mean and std run over the group's rewards plus m virtual
    rewards `virtual_reward`, so [0, 0, 0, 0] + [1] gives mean 0.2, std 0.4472 and advantages -0.4472 each.
    A group of one then has mean 0 and std 1, as in NGRPO's released code."""
    groups = rewards.float().view(-1, group_size)  # [N / G, G]
    stats = groups
    if virtual_count > 0:
        stats = torch.cat([groups, groups.new_full((groups.shape[0], virtual_count), virtual_reward)], 1)
    if virtual_count > 0 and group_size == 1:
        mean, std = torch.zeros_like(groups), torch.ones_like(groups)
    else:
        mean, std = stats.mean(-1, keepdim=True), None
        if scale == "group" and group_size > 1:
            std = stats.std(-1, keepdim=True)
    if scale == "batch" and rewards.numel() > 1:
        std = rewards.float().std()
    centred = groups - mean
    if scale != "none" and std is not None:
        centred = centred / (std + eps)
    return centred.flatten()


def keep_groups(rewards: torch.Tensor, group_size: int, strategy: str) -> torch.Tensor:
    """Which groups carry a learning signal under DAPO's dynamic-sampling filter: [N / G] bool.

    none keeps all; all drops every group whose rewards are all equal; all_correct drops groups that are
    all 1; all_incorrect drops groups that are all 0.
    >>> keep_groups(torch.tensor([1., 1., 0., 1., 0., 0.]), 2, "all_correct")
    tensor([False,  True,  True])"""
    groups = rewards.float().view(-1, group_size)
    uniform = (groups == groups[:, :1]).all(1)
    if strategy == "all":
        return ~uniform
    if strategy in ("all_correct", "all_incorrect"):
        return ~(uniform & (groups[:, 0] == (1.0 if strategy == "all_correct" else 0.0)))
    return torch.ones_like(uniform)


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to the reward: 0 up to max - L tokens, then falling linearly to
    -factor at max (L = buffer). [N] float; all zero when buffer is 0."""
    if buffer <= 0:
        return torch.zeros(lengths.shape)
    return ((max_new_tokens - buffer - lengths.float()) / buffer * factor).clamp(max=0.0)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): exp(d) - d - 1 with d = ref - logp clamped to
    [-20, 20], the result clamped to [-10, 10] (the released code's low-variance KL)."""
    diff = (ref_logp - logp).clamp(-20.0, 20.0)
    return (diff.exp() - diff - 1.0).clamp(-10.0, 10.0)


def aggregate(values: torch.Tensor, mask: torch.Tensor, *, mode: str, normalizer, max_tokens: int) -> torch.Tensor:
    """Per-token values [B, T] -> one number: token-mean = sum over `mask` / normalizer (the mini-batch's
    token count); seq-mean-token-mean = each row's mean over its tokens, summed / normalizer (the
    mini-batch's sequence count); seq-mean-token-sum-norm = each row's sum / max_tokens, summed / normalizer."""
    if mode == "token-mean":
        return (values * mask).sum() / normalizer
    row_sums = (values * mask).sum(-1)
    per_row = mask.sum(-1).clamp_min(1.0) if mode == "seq-mean-token-mean" else max_tokens
    return (row_sums / per_row).sum() / normalizer


def policy_loss(logp, old_logp, advantages, mask, *, ref_logp=None, cfg, normalizer=None):
    """Clipped policy-gradient loss (+ kl_coef * k3 KL) aggregated over the tokens of `mask` as cfg.loss_agg
    says, divided by normalizer (default: this batch's token count for token-mean, else its count of rows
    with a token; pass the whole mini-batch's count when this is one micro-batch).

    logp, old_logp, ref_logp, mask: [B, T]; advantages: [B]. cfg supplies loss ("grpo": token ratio,
    "gspo": sequence ratio exp(mean_t(logp - old_logp))), clip_low, clip_high, dual_clip, kl_coef, loss_agg,
    max_new_tokens. Returns (loss, metrics); each metric is a sum / normalizer, so micro-batches add up
    (fractions and ratio_mean are token means, or means of per-sequence token means in the seq modes)."""
    mask = mask.float()
    if normalizer is None:
        normalizer = mask.sum() if cfg.loss_agg == "token-mean" else (mask.sum(-1) > 0).sum().float()
    total = lambda values: aggregate(values, mask, mode=cfg.loss_agg, normalizer=normalizer,
                                     max_tokens=cfg.max_new_tokens)
    mean = lambda values: aggregate(values, mask, mode="token-mean" if cfg.loss_agg == "token-mean"
                                    else "seq-mean-token-mean", normalizer=normalizer, max_tokens=cfg.max_new_tokens)
    log_ratio = logp - old_logp
    if cfg.loss == "gspo":
        # One ratio per sequence; its gradient flows to every token through the mean.
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp_min(1.0))[:, None].expand_as(logp)
    ratio = log_ratio.clamp(-20.0, 20.0).exp()
    adv = advantages[:, None].float()  # [B, 1]
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    token_loss = torch.maximum(unclipped, clipped)
    dual = torch.zeros_like(token_loss, dtype=torch.bool)
    if cfg.dual_clip > 0:
        # For A < 0 a huge ratio would make the loss unbounded: cap it at -c * A.
        dual = (adv < 0) & (token_loss > -cfg.dual_clip * adv)
        token_loss = torch.where(dual, -cfg.dual_clip * adv, token_loss)
    pg_loss = total(token_loss)
    with torch.no_grad():
        metrics = {
            "pg_loss": pg_loss.detach(),
            "clip_frac_high": mean(((adv > 0) & (ratio > 1.0 + cfg.clip_high)).float()),
            "clip_frac_low": mean(((adv < 0) & (ratio < 1.0 - cfg.clip_low)).float()),
            "dual_clip_frac": mean(dual.float()),
            "ratio_mean": mean(ratio),
        }
    loss = pg_loss
    if ref_logp is not None and cfg.kl_coef > 0:
        kl = total(k3_kl(logp, ref_logp))
        loss = loss + cfg.kl_coef * kl
        metrics["kl"] = kl.detach()
    metrics["loss"] = loss.detach()
    return loss, metrics


def _chunk_logprobs(hidden, weight, labels, temperature):
    if temperature != 1.0:  # (h / tau) W^T = (h W^T) / tau, with d divisions per position instead of V
        hidden = hidden / temperature
    log_probs = F.linear(hidden, weight).float().log_softmax(-1)  # [c, V]: the only vocabulary-sized tensor
    logp = log_probs.gather(-1, labels[:, None])[:, 0]
    with torch.no_grad():
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *, temperature: float = 1.0,
                   chunk_tokens: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(label) and the full-vocabulary entropy at each position, from hidden states [..., d] and the
    output matrix [V, d], at the sampling temperature. [...] each; the entropy carries no gradient.

    Logits exist for `chunk_tokens` positions at a time, and under autograd each chunk is recomputed in
    the backward pass instead of stored, so memory is O(chunk_tokens x V), never O(B x T x V)."""
    shape = labels.shape
    hidden, labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    logps, entropies = [], []
    for start in range(0, labels.shape[0], chunk_tokens):
        args = (hidden[start : start + chunk_tokens], weight, labels[start : start + chunk_tokens], temperature)
        if torch.is_grad_enabled() and hidden.requires_grad:
            logp, entropy = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            logp, entropy = _chunk_logprobs(*args)
        logps.append(logp)
        entropies.append(entropy)
    return torch.cat(logps).view(shape), torch.cat(entropies).view(shape)


def replay_inputs(embed_weight: torch.Tensor, prompts: list[list[int]], cand_ids: torch.Tensor,
                  cand_weights: torch.Tensor, lengths: torch.Tensor):
    """The training forward's inputs for rollout rows: [prompt | fed response inputs], right-padded.

    Returns inputs_embeds [B, L, d] and pred_pos [B, T]: the position whose output predicts response
    token t (prompt length - 1 + t). The input after the last response token is never needed."""
    device = embed_weight.device
    B, T = cand_ids.shape[:2]
    prompt_lens = torch.tensor([len(p) for p in prompts], device=device)
    L = int((prompt_lens + lengths.to(device) - 1).max())
    positions = torch.arange(L, device=device)
    # Position j of row b holds prompt token j while j < P_b, then the input fed at response step j - P_b.
    step = (positions[None] - prompt_lens[:, None]).clamp(0, T - 1)  # [B, L]
    in_prompt = positions[None] < prompt_lens[:, None]
    prompt_ids = torch.zeros(B, L, dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        prompt_ids[row, : len(prompt)] = torch.tensor(prompt, device=device)
    ids = torch.where(in_prompt[..., None], prompt_ids[..., None], cand_ids.to(device).gather(
        1, step[..., None].expand(-1, -1, cand_ids.shape[-1])))  # [B, L, K]
    weights = cand_weights.to(device).gather(1, step[..., None].expand(-1, -1, cand_weights.shape[-1]))
    first = torch.zeros_like(weights)
    first[..., 0] = 1.0
    weights = torch.where(in_prompt[..., None], first, weights)  # a prompt token: its own row, weight 1
    pred_pos = (prompt_lens[:, None] - 1 + torch.arange(T, device=device)[None]).clamp(max=L - 1)  # [B, T]
    return mixed_embeddings(embed_weight, ids, weights), pred_pos


def sequence_logprobs(model, prompts, cand_ids, cand_weights, lengths, response_ids, *, temperature: float = 1.0,
                      chunk_tokens: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Replays rollout rows through `model` and returns (log p of each response token, entropy), [B, T]
    each; positions past a row's length hold values that the response mask ignores."""
    inputs, pred_pos = replay_inputs(model.embed_tokens.weight, prompts, cand_ids, cand_weights, lengths)
    hidden = model.forward_hidden(inputs_embeds=inputs)  # [B, L, d], causal: right padding is harmless
    hidden = hidden.gather(1, pred_pos[..., None].expand(-1, -1, hidden.shape[-1]))  # [B, T, d]
    return token_logprobs(hidden, model.output_weight, response_ids.to(hidden.device), temperature=temperature,
                          chunk_tokens=chunk_tokens)
