"""The N-GRPO algorithm: what training does with a Rollout. Zhu, Yu, Di, Zhu, "N-GRPO:
Embedding-Level Neighbor Mixing for Enhanced Policy Optimization" (ACL 2026 Findings, arXiv
2606.10768); its released code is github.com/ZJUSCL/N-GRPO, whose recipe this repo follows where the
paper's text reads otherwise (docs/paper-vs-release.md).

What runs by default (`python train.py --model deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B`, preset paper-1.5b):
  1. Rollouts (rollout.py): 64 prompts x G = 4 responses at temperature 1. At each decode step, with probability
     0.1 until </think>, the next input is not the sampled token's embedding but a mixture of the greedy token and
     its 1 nearest cosine neighbor in the output matrix (neighbors.py), weighted softmax(p / tau) over the two
     (strategies.neighbor_candidates: the released code's weights). The sampled token stays the action.
  2. Rewards (reward.py): 1 if the last \boxed{} answer equals the reference (sympy), else 0.
  3. Advantages (estimators.group_advantages): (r - mean_G r) / (std_G r + 1e-6) within each prompt's group.
  4. Replay (replay.py): the policy, the old policy and the reference model are scored on the inputs the sampler
     fed, mixtures included; the input embeddings stay frozen, as in the released runs.
  5. Loss (policy_loss): dual-clip PPO (ratio clipped to [0.8, 1.2], losses of negative advantages capped at
     -3 A) + 0.01 x the k3 KL to the reference, summed over each run of 2 rows' tokens (the released
     aggregation), AdamW at lr 5e-7 over 4 mini-batches of 16 prompts, one epoch (update).

    rewards -> replay (old policy, reference) -> advantages -> micro-batches -> policy_loss -> AdamW

Each estimator (the advantage, the KL, the entropy controls) is a function of estimators.py, chosen
by name.

The loss is a token mean over the mini-batch (or over runs of rows, or over its sequences:
--loss-agg): each micro-batch divides by the whole mini-batch's count, so the gradient does not
depend on how it is split. --rollout-is weighs each token's loss by pi_train(y) / pi_sampler(y) (off
by default, as released).
"""

import math
import sys
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F
from tqdm import tqdm

from estimators import KL_ESTIMATORS, EntropyControl, advantages_of, high_entropy_mask, kl_penalty
from replay import sequence_logprobs
from rollout import Rollout
from runtime import distributed
from runtime.distributed import World
from strategies import STRATEGIES


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
    """DAPO's soft overlong punishment, added to the reward: 0 up to max - L tokens, then falling
    linearly to -factor at max (L = buffer). [N] float; all zero when buffer is 0."""
    if buffer <= 0:
        return torch.zeros(lengths.shape)
    return ((max_new_tokens - buffer - lengths.float()) / buffer * factor).clamp(max=0.0)


def length_shaping(scores: torch.Tensor, lengths: torch.Tensor, group_size: int, mode: str,
                   alpha: float = 0.33) -> torch.Tensor:
    """Success-gated length shaping within each group of G responses (prime-rl's length_shaping, its
    orchestrator/advantage.py): brevity = a correct response's score times L_min / L, L_min the group's shortest
    correct length (its brevity_bonus); gr3 = times 1 / (1 + alpha L / mean L), the group's mean length. Only a
    score > 0 is shaped: a wrong response is never rewarded for being short. none: the scores. [N] float."""
    if mode == "none":
        return scores
    scores, lengths = scores.view(-1, group_size), lengths.view(-1, group_size).to(scores.dtype)
    if mode == "brevity":
        factor = lengths.masked_fill(scores <= 0, float("inf")).amin(-1, keepdim=True) / lengths
    else:
        factor = 1.0 / (1.0 + alpha * lengths / lengths.mean(-1, keepdim=True))
    return torch.where(scores > 0, scores * factor, scores).view(-1)


def shaped_rewards(scores: torch.Tensor, lengths: torch.Tensor, cfg) -> torch.Tensor:
    """The rewards the advantages see: the scores, length-shaped (--length-shaping), plus DAPO's overlong penalty."""
    if cfg.length_shaping != "none":
        scores = length_shaping(scores, lengths, cfg.group_size, cfg.length_shaping, cfg.length_shaping_alpha)
    if cfg.overlong_buffer <= 0:
        return scores
    return scores + overlong_penalty(lengths, cfg.max_new_tokens, cfg.overlong_buffer, cfg.overlong_penalty_factor)


def aggregate(values: torch.Tensor, mask: torch.Tensor, *, mode: str, normalizer, max_tokens: int,
              group_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token values [B, T] -> one number: token-mean = sum over `mask` / normalizer (the mini-batch's
    token count); seq-mean-token-mean = each row's mean over its tokens, summed / normalizer (the
    mini-batch's sequence count); seq-mean-token-sum-norm = each row's sum / max_tokens, summed / normalizer;
    token-mean-per-rows = each row's sum / group_tokens (the tokens of its run of rows, [B]), summed /
    normalizer (the mini-batch's number of runs)."""
    if mode == "token-mean":
        return (values * mask).sum() / normalizer
    row_sums = (values * mask).sum(-1)
    if mode == "token-mean-per-rows":
        per_row = group_tokens
    else:
        per_row = mask.sum(-1).clamp_min(1.0) if mode == "seq-mean-token-mean" else max_tokens
    return (row_sums / per_row).sum() / normalizer


def group_tokens(mask: torch.Tensor, rows: int) -> torch.Tensor:
    """[B]: the response tokens of the run of `rows` consecutive rows (0..rows-1, rows..2 rows-1,
    ...) that each row belongs to, at least 1.

    >>> group_tokens(torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]]), 2)
    tensor([3., 3., 3.])"""
    run = torch.arange(mask.shape[0], device=mask.device) // rows  # [B]
    per_run = torch.zeros(int(run[-1]) + 1, device=mask.device).index_add_(0, run, mask.float().sum(-1))
    return per_run[run].clamp_min(1.0)


def loss_normalizer(mask: torch.Tensor, loss_agg: str, rows: int = 1) -> torch.Tensor:
    """What the summed loss of a mini-batch is divided by: its number of response tokens (token-mean), of
    runs of `rows` rows (token-mean-per-rows), or of rows with at least one token (the per-sequence modes);
    at least 1. mask: [B, T]."""
    if loss_agg == "token-mean-per-rows":
        return torch.tensor(float(-(-mask.shape[0] // rows)), device=mask.device)
    count = mask.sum() if loss_agg == "token-mean" else mask.any(-1).sum()
    return count.clamp_min(1).to(torch.float32)


@dataclass(frozen=True)
class LossSettings:
    """What policy_loss reads of a run's settings (the defaults are config.Config's)."""

    loss: str = "grpo"  # grpo: each token's ratio; gspo: one ratio per sequence, exp(mean_t(logp - old_logp))
    clip_low: float = 0.2  # the ratio is clipped to [1 - clip_low, 1 + clip_high]
    clip_high: float = 0.2
    dual_clip: float = 3.0  # for A < 0 a token's loss is at most -dual_clip * A (0: off)
    kl_coef: float = 0.01  # the KL to the reference model, added to the loss (to the reward with kl_in_reward)
    kl_estimator: str = "low-var"  # estimators.KL_ESTIMATORS
    kl_in_reward: bool = False
    entropy_coef: float = 0.0  # the entropy bonus: this x the aggregated per-token entropy, subtracted from the loss
    loss_agg: str = "token-mean"  # how token losses become one number (`aggregate`)
    loss_agg_rows: int = 1  # token-mean-per-rows: rows per run
    max_new_tokens: int = 8192  # seq-mean-token-sum-norm's divisor

    @classmethod
    def of(cls, cfg) -> "LossSettings":
        """The settings of a Config (or anything with these attributes)."""
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(cls)})


def aggregators(mask: torch.Tensor, cfg: LossSettings, normalizer=None, run_tokens=None):
    """(total, mean): values [B, T] over `mask` -> the loss's sum / normalizer as cfg.loss_agg says (default: this
    batch's loss_normalizer), and the metrics' token mean (per run of rows, or of sequences' token means)."""
    if normalizer is None:
        normalizer = loss_normalizer(mask, cfg.loss_agg, cfg.loss_agg_rows)
    if run_tokens is None and cfg.loss_agg == "token-mean-per-rows":
        run_tokens = group_tokens(mask, cfg.loss_agg_rows)
    mean_mode = cfg.loss_agg if cfg.loss_agg in ("token-mean", "token-mean-per-rows") else "seq-mean-token-mean"
    by = lambda mode: lambda values: aggregate(values, mask, mode=mode, normalizer=normalizer,
                                               max_tokens=cfg.max_new_tokens, group_tokens=run_tokens)
    return by(cfg.loss_agg), by(mean_mode)


def clipped_losses(log_ratio: torch.Tensor, advantages: torch.Tensor, cfg: LossSettings):
    """(loss, ratio, dual) [B, T, K]: -A ratio, ratio = exp(clamp(log_ratio, +-20)) clipped to [1 - clip_low, 1 +
    clip_high], for A < 0 at most -dual_clip A (where `dual`)."""
    ratio = log_ratio.clamp(-20.0, 20.0).exp()
    adv = advantages.float().view(-1, 1, 1)  # [B, 1, 1]
    token_loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high))
    dual = torch.zeros_like(token_loss, dtype=torch.bool)
    if cfg.dual_clip > 0:  # for A < 0 a huge ratio would make the loss unbounded: cap it at -c * A
        dual = (adv < 0) & (token_loss > -cfg.dual_clip * adv)
        token_loss = torch.where(dual, -cfg.dual_clip * adv, token_loss)
    return token_loss, ratio, dual


def policy_loss(logp, old_logp, advantages, mask, *, settings: LossSettings, ref_logp=None, normalizer=None,
                run_tokens=None, is_weights=None, entropy=None, candidates=None):
    """Clipped policy-gradient loss (+ kl_coef * the KL estimate, - entropy_coef * the entropy) aggregated over the
    tokens of `mask` as settings.loss_agg says, divided by normalizer (default: this batch's loss_normalizer; pass
    the whole mini-batch's when this is one micro-batch). Returns (loss, metrics); each metric is a sum /
    normalizer, so micro-batches add up (fractions and ratio_mean are token means, as the loss aggregates).

    logp, old_logp, ref_logp, mask: [B, T]; advantages: [B]. is_weights [B, T] (--rollout-is; 0 on the tokens
    --top-entropy-quantile leaves out) multiplies each token's clipped loss, with no gradient; not the KL term.
    candidates [B, T, K] bool (a strategy's loss_terms: Multiplex Thinking's joint loss; logp, old_logp and
    ref_logp then [B, T, K]): a ratio and a clipped loss per term, summed over the terms it marks (the KL term
    alike), as verl's compute_multiplex_thinking_policy_loss; the metrics are means over them."""
    cfg, mask = settings, mask.float()
    if candidates is None:  # one term per step: an axis of one
        logp, old_logp, candidates = logp[..., None], old_logp[..., None], torch.ones_like(mask)[..., None]
        ref_logp = None if ref_logp is None else ref_logp[..., None]
    total, mean = aggregators(mask, cfg, normalizer, run_tokens)
    count = candidates.float()  # [B, T, K]
    per_token = lambda values: (values * count).sum(-1)  # [B, T, K] -> [B, T], the terms' sum
    token_mean = lambda values: mean(per_token(values.float()) / count.sum(-1).clamp_min(1))
    log_ratio = logp - old_logp
    if cfg.loss == "gspo":  # one ratio per sequence; its gradient flows to every token through the mean
        log_ratio = ((log_ratio * mask[..., None]).sum(1, keepdim=True)
                     / mask.sum(-1).clamp_min(1.0)[:, None, None]).expand_as(logp)
    token_loss, ratio, dual = clipped_losses(log_ratio, advantages, cfg)
    token_loss = per_token(token_loss)
    if is_weights is not None:  # after both clips, before the KL term, as TRL's GRPOTrainer and verl apply it
        token_loss = token_loss * is_weights.detach()
    loss = total(token_loss)
    adv = advantages.float().view(-1, 1, 1)
    with torch.no_grad():
        metrics = {"pg_loss": loss.detach(), "clip_frac_high": token_mean((adv > 0) & (ratio > 1.0 + cfg.clip_high)),
                   "clip_frac_low": token_mean((adv < 0) & (ratio < 1.0 - cfg.clip_low)),
                   "dual_clip_frac": token_mean(dual), "ratio_mean": token_mean(ratio)}
    if ref_logp is not None and cfg.kl_coef > 0 and not cfg.kl_in_reward:
        kl = total(per_token(KL_ESTIMATORS[cfg.kl_estimator](logp, ref_logp)))
        loss, metrics["kl"] = loss + cfg.kl_coef * kl, kl.detach()
    if cfg.entropy_coef > 0:  # entropy [B, T] with its gradient (replay.sequence_logprobs): higher entropy, lower loss
        bonus = total(entropy)
        loss, metrics["entropy_bonus"] = loss - cfg.entropy_coef * bonus, bonus.detach()
    metrics["loss"] = loss.detach()
    return loss, metrics


# ----------------------------------------------------------------------------- the sampler is not the policy
#
# On a GPU the rollouts come from a bf16 copy of the weights and the loss from the fp32 policy under
# autocast: a token y was drawn from pi_sampler, not from the pi_train the PPO ratio assumes. w =
# pi_train(y) / pi_sampler(y) (the replayed old policy's probability over the one the sampler
# recorded) measures it and, with --rollout-is, corrects it (docs/algorithm.md, "The sampler is not
# the policy"): truncated importance sampling (TIS: Yao et al. 2025, "Your efficient RL framework
# secretly brings you off-policy RL training") or masked importance sampling (IcePop; Liu, Li et al.
# 2025, "When speed kills stability"), per token or per sequence; verl's rollout_corr_helper.py and
# TRL's vllm_importance_sampling_mode offer the same four modes.

# What mismatch_sums adds up over micro-batches and ranks (the *_max ones are maxima).
MISMATCH_SUMS = ("tokens", "rows", "gap_sum", "gap_max", "kl_sum", "ppl_ratio_sum", "weight_sum", "weight_count",
                 "weight_max", "changed_tokens", "changed_rows")
# What metrics.jsonl logs of the mismatch every step, whatever --rollout-is is (mismatch_metrics).
MISMATCH_METRICS = ("logp_gap_mean", "logp_gap_max", "rollout_kl", "rollout_ppl_ratio", "rollout_is_weight_mean",
                    "rollout_is_weight_max", "rollout_is_token_frac", "rollout_is_seq_frac")


@dataclass(frozen=True)
class RolloutCorrection:
    """--rollout-is and its bounds: what w = pi_train(y) / pi_sampler(y) does to each token's loss.
    mode: none, token-truncate, token-mask, sequence-truncate or sequence-mask; cap: C, the
    truncation cap and the mask modes' upper bound; lower: the mask modes' lower bound (0 = 1 / C)."""

    mode: str = "none"
    cap: float = 2.0
    lower: float = 0.0

    @classmethod
    def of(cls, cfg) -> "RolloutCorrection":
        return cls(cfg.rollout_is, cfg.rollout_is_cap, cfg.rollout_is_lower)

    @property
    def per_sequence(self) -> bool:
        return self.mode.startswith("sequence")


def importance_weights(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                       correction: RolloutCorrection) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(w, factor, changed), [B, T] each, no gradient, from the old policy's and the sampler's log-probs of the
    sampled tokens over the response tokens `mask` [B, T].

    w: per token exp(old_logp - sampler_logp); in the sequence modes every token of a row holds the row's
    geometric mean exp(mean_t(old_logp - sampler_logp)) (the product of 8k tokens' weights grows exponentially
    with the length; the mean is Liu, Li et al.'s Geo-RS bound, verl's seq_mean_k1 filter). factor, what
    multiplies each token's loss: min(w, C) (truncate), w inside [lower, C] and 0 outside (mask; TRL's and
    IcePop's masked weighting), 1 (none). changed: the response tokens whose factor is not w (truncated or
    masked).

    >>> w, factor, changed = importance_weights(torch.log(torch.tensor([[3.0, 0.4, 1.0]])), torch.zeros(1, 3),
    ...                                         torch.ones(1, 3), RolloutCorrection("token-mask"))
    >>> factor, changed
    (tensor([[0., 0., 1.]]), tensor([[ True,  True, False]]))"""
    mask = mask.bool()
    log_w = torch.where(mask, old_logp.detach().float() - sampler_logp.float(), 0.0)  # [B, T]
    if correction.per_sequence:
        log_w = (log_w.sum(-1) / mask.sum(-1).clamp_min(1))[:, None].expand_as(log_w)
    w = log_w.clamp(-20.0, 20.0).exp()  # verl's SAFETY_BOUND: a far-off token gives a huge weight, not inf
    if correction.mode.endswith("truncate"):
        changed, factor = w > correction.cap, w.clamp(max=correction.cap)
    elif correction.mode.endswith("mask"):
        changed = (w < (correction.lower or 1.0 / correction.cap)) | (w > correction.cap)
        factor = torch.where(changed, 0.0, w)
    else:
        changed, factor = torch.zeros_like(mask), torch.ones_like(w)
    return w, factor, changed & mask


def mismatch_sums(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                  correction: RolloutCorrection) -> dict[str, float]:
    """The mismatch of the rows of `mask` [B, T] (their response tokens) as the sums of MISMATCH_SUMS, which add
    up over micro-batches and ranks (add_sums; maxima for *_max); mismatch_metrics turns them into numbers."""
    mask = mask.bool()
    rows = mask.any(-1)  # [B]
    log_w = torch.where(mask, old_logp.detach().float() - sampler_logp.float(), 0.0)
    w, _, changed = importance_weights(old_logp, sampler_logp, mask, correction)
    # The mode's own weights: one per response token, or one per sequence.
    weights = w[:, 0][rows] if correction.per_sequence else w[mask]
    # Training perplexity over rollout perplexity, per sequence: exp(mean_t(sampler_logp - old_logp)).
    ppl_ratio = (-log_w.sum(-1) / mask.sum(-1).clamp_min(1)).exp()[rows]
    gap = log_w.abs()[mask]
    # k3 of KL(sampler || policy), w - log w - 1 (the tokens were drawn from the sampler), as expm1 in float64: in
    # fp32 exp(d) - d - 1 rounds a ~1e-7 gap to exactly 0 and a 0.02 one (a GPU's) to 3 digits.
    d = log_w.double().clamp(-20.0, 20.0)
    kl = (d.expm1() - d)[mask]
    most = lambda x: float(x.max()) if x.numel() else 0.0
    return {"tokens": float(mask.sum()), "rows": float(rows.sum()), "gap_sum": float(gap.sum()),
            "gap_max": most(gap), "kl_sum": float(kl.sum()),
            "ppl_ratio_sum": float(ppl_ratio.sum()), "weight_sum": float(weights.sum()),
            "weight_count": float(weights.numel()), "weight_max": most(weights),
            "changed_tokens": float(changed.sum()), "changed_rows": float(changed.any(-1).sum())}


def add_sums(total: dict[str, float], part: dict[str, float]) -> dict[str, float]:
    """Two mismatch_sums as one: sums added, *_max the larger."""
    return {key: max(total[key], part[key]) if key.endswith("_max") else total[key] + part[key] for key in total}


def mismatch_metrics(sums: dict[str, float]) -> dict[str, float]:
    """The logged numbers (MISMATCH_METRICS) from mismatch_sums' totals: the |old_logp - sampler_logp| gap per
    token (mean, max); rollout_kl, the k3 estimate of KL(sampler || policy) per token (the tokens were drawn from
    the sampler: exp(d) - d - 1, d = old_logp - sampler_logp, as verl's k3_kl); rollout_ppl_ratio, the mean over
    sequences of training over rollout perplexity (verl's ppl_ratio); the mode's raw weights w (mean, max; per
    token, or per sequence in the sequence modes); the fraction of response tokens, and of sequences with any,
    truncated or masked."""
    tokens, rows = max(sums["tokens"], 1.0), max(sums["rows"], 1.0)
    return {"logp_gap_mean": sums["gap_sum"] / tokens, "logp_gap_max": sums["gap_max"],
            "rollout_kl": sums["kl_sum"] / tokens, "rollout_ppl_ratio": sums["ppl_ratio_sum"] / rows,
            "rollout_is_weight_mean": sums["weight_sum"] / max(sums["weight_count"], 1.0),
            "rollout_is_weight_max": sums["weight_max"], "rollout_is_token_frac": sums["changed_tokens"] / tokens,
            "rollout_is_seq_frac": sums["changed_rows"] / rows}


# ----------------------------------------------------------------------------- micro-batches
#
# How the update splits rows into micro-batches: a fixed number of rows (--micro-batch-size), or a
# token budget (--micro-batch-tokens N) that groups rows of similar length so that little of the
# replay computes on padding. A micro-batch is replayed right-padded to its longest row, so its cost
# is rows x padded length: under a budget the rows are sorted longest first and cut into runs with
# rows x longest <= N. The loss still divides by the whole mini-batch's count, so the gradient is
# the fixed-row one up to the order of float sums. Under torchrun every rank holds the whole
# mini-batch; rows go to the ranks longest first, each to the rank with the fewest tokens so far,
# and the rank with fewer micro-batches pads with stand-ins (its shortest row, masked out of the
# loss), since FSDP's forward and backward are collectives every rank must join
# (docs/micro-batches.md).


def replay_tokens(rollout) -> list[int]:
    """Per row, the positions its replay forward computes: prompt + response - 1 (the input after
    the last response token is never needed)."""
    return [len(prompt) + int(length) - 1 for prompt, length in zip(rollout.prompts, rollout.lengths.tolist())]


def budget_batches(rows: list[int], tokens: list[int], budget: int) -> list[list[int]]:
    """`rows` sorted longest first (ties: lower index first) and cut into runs whose count x longest
    row's tokens stays within `budget` (a row longer than the budget is a run of its own): as few
    runs as possible, and of those cuts the one with the fewest padded positions (sum of count x
    longest).

    Filling each run greedily gives the fewest runs, but may put a row of 300 tokens with rows of 30; a
    dynamic program over the cut points then finds, for that number of runs, the cut that pads least.
    >>> budget_batches([0, 1, 2, 3, 4], [5, 20, 6, 18, 2], 40)    # 20 + 18 (2 x 20); 6, 5, 2 (3 x 6)
    [[1, 3], [2, 0, 4]]
    >>> budget_batches(list(range(6)), [10, 6, 6, 6, 1, 1], 40)    # greedy: 4 x 10 + 2 x 1 = 42 positions
    [[0], [1, 2, 3, 4, 5]]"""
    order = sorted(rows, key=lambda r: (-tokens[r], r))
    s = [tokens[r] for r in order]
    fits = lambda i, j: j - i == 1 or (j - i) * s[i] <= budget  # run order[i:j]
    runs, start = 0, 0
    while start < len(s):  # greedy: the fewest runs
        end = start + 1
        while end < len(s) and fits(start, end + 1):
            end += 1
        runs, start = runs + 1, end
    # least[j]: (padded positions, cut) of order[:j] in the runs so far; one more run per pass.
    least = {0: (0, [])}
    for _ in range(runs):
        longer = {}
        for j in range(1, len(s) + 1):
            for i in range(j - 1, -1, -1):
                if not fits(i, j):
                    break  # fits only gets harder as the run grows to the left
                if i in least and (j not in longer or least[i][0] + (j - i) * s[i] < longer[j][0]):
                    longer[j] = (least[i][0] + (j - i) * s[i], least[i][1] + [j])
        least = longer
    cuts = [0] + least[len(s)][1]
    return [order[i:j] for i, j in zip(cuts, cuts[1:])]


def balanced_shares(tokens: list[int], size: int) -> list[list[int]]:
    """Rows 0..n-1 given to `size` ranks, longest first, each to the rank with the fewest tokens so
    far (ties: the lower rank): every rank's token count within one row of the others'.

    >>> balanced_shares([8, 1, 5, 4, 2], 2)    # 8 -> 0; 5 -> 1; 4 -> 1 (9); 2 -> 0 (10); 1 -> 1 (10)
    [[0, 4], [2, 3, 1]]"""
    shares: list[list[int]] = [[] for _ in range(size)]
    loads = [0] * size
    for row in sorted(range(len(tokens)), key=lambda r: (-tokens[r], r)):
        rank = min(range(size), key=lambda k: (loads[k], k))
        shares[rank].append(row)
        loads[rank] += tokens[row]
    return shares


def micro_batches(rollout, cfg, world: World = World()) -> list[tuple[list[int], bool]]:
    """This rank's micro-batches of the rows of `rollout`, as (row indices, real) pairs, the same number on
    every rank (stand-ins with real = False pad the shorter lists; their outputs must count for nothing).

    cfg.micro_batch_tokens = 0: cfg.micro_batch_size consecutive rows of this rank's `deal` share
    (distributed.dealt_batches). Otherwise a token budget: this rank's share of balanced_shares, cut by
    budget_batches."""
    num_rows = len(rollout.prompts)
    if cfg.micro_batch_tokens <= 0:
        return distributed.dealt_batches(num_rows, cfg.micro_batch_size, world)
    tokens = replay_tokens(rollout)
    plans = [budget_batches(share, tokens, cfg.micro_batch_tokens) for share in balanced_shares(tokens, world.size)]
    calls = max(len(plan) for plan in plans)
    stand_in = min(range(num_rows), key=lambda r: (tokens[r], r))  # the cheapest row to replay for nothing
    return [(rows, True) for rows in plans[world.rank]] + [([stand_in], False)] * (calls - len(plans[world.rank]))


# ----------------------------------------------------------------------------- the update


@dataclass
class Episodes:
    """A rollout and what the update needs beside it, row-aligned (N rows, T = the longest
    response)."""

    rollout: Rollout  # prompts, lengths and the record: response_ids, the fed (cand_ids, cand_weights), ...
    advantages: torch.Tensor  # [N]
    old_logp: torch.Tensor | None  # [N, T]; None = on-policy: the update's own forward, detached
    ref_logp: torch.Tensor | None = None  # [N, T], when a KL term is on
    in_loss: torch.Tensor | None = None  # [N] bool, rows whose tokens count (--mask-truncated); None = all
    pg_mask: torch.Tensor | None = None  # [N, T] bool, the tokens the policy gradient trains on; None = all

    def __len__(self) -> int:
        return len(self.rollout.prompts)

    def rows(self, index: slice | list[int]) -> "Episodes":
        pick = lambda x: None if x is None else x[index]
        return Episodes(rollout=self.rollout.select(index), advantages=self.advantages[index],
                        old_logp=pick(self.old_logp), ref_logp=pick(self.ref_logp), in_loss=pick(self.in_loss),
                        pg_mask=pick(self.pg_mask))

    def micro_batch(self, index: list[int]) -> "Episodes":
        """The rows `index`, cut to their longest response, so that the log-probs of a micro-batch of short
        rows are not computed over the mini-batch's longest."""
        micro = self.rows(index)
        rollout = micro.rollout.trimmed()
        width = rollout.response_ids.shape[1]
        cut = lambda x: None if x is None else x[:, :width]
        return Episodes(rollout=rollout, advantages=micro.advantages, old_logp=cut(micro.old_logp),
                        ref_logp=cut(micro.ref_logp), in_loss=micro.in_loss, pg_mask=cut(micro.pg_mask))

    def loss_mask(self) -> torch.Tensor:
        """[N, T] bool: the response tokens that count in the loss."""
        mask = self.rollout.response_mask()
        return mask if self.in_loss is None else mask & self.in_loss[:, None].to(mask.device)


def replay(model, rollout, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p, entropy) [N, T] of every response token, replaying the recorded inputs through `model` (a
    Transformer, or the distributed.ModelCall that is FSDP's root) under autocast at the sampling
    temperature."""
    with distributed.autocast(distributed.device_of(model)):
        return distributed.run_model(model, sequence_logprobs, rollout, temperature=cfg.temperature,
                                     chunk_tokens=cfg.logprob_chunk_tokens, packed=cfg.pack)


@torch.no_grad()
def replay_logprobs(model, rollout, cfg, world: World = World(), *, entropy: bool = False):
    """No-grad fp32 log-probs [N, T] of every response token (with entropy: (log-probs, entropies)), micro-batch by
    micro-batch (rows or a token budget: "micro-batches" above). Under torchrun each rank replays its share of the
    rows and every rank gets all of them back, in row order. Positions past a row's response hold values the
    response mask ignores."""
    num_rows, width, rows = len(rollout.prompts), rollout.response_ids.shape[1], []
    # A bar only on a terminal (of rank 0), and only when replay takes more than 2 s.
    bar = tqdm(micro_batches(rollout, cfg, world), desc="replay", leave=False, delay=2, file=sys.stderr,
               disable=None if world.is_main else True)
    for index, real in bar:
        micro = rollout.select(index).trimmed()  # up to its longest response only
        logp, entropies = replay(model, micro, cfg)
        # [b, T or less, S (+ 1)]: log p of the scored tokens (S = 1, the action; 1 + K where the candidates are
        # scored too), then the entropy
        values = torch.cat([logp.view(*entropies.shape, -1)] + [entropies[..., None]] * entropy, -1).float()
        values = F.pad(values, (0, 0, 0, width - values.shape[1]))  # [b, T, S (+ 1)]
        rows += list(zip(index, values.cpu() if world.distributed else values)) if real else []  # stand-ins dropped
    values = torch.stack(distributed.gather_indexed(rows, num_rows, world)).to(distributed.device_of(model))
    labels = STRATEGIES[rollout.strategy].labels(rollout.steps)  # the scored tokens: their shape, the result's
    logp = values[..., : values.shape[-1] - entropy].reshape(labels.shape)
    return (logp, values[..., -1]) if entropy else logp


def action_logp(logp: torch.Tensor) -> torch.Tensor:
    """[N, T] log p of each step's action y (what the sampler records) from the replay's log-probs: [N, T], or
    [N, T, 1 + K] (y, then every candidate) where the candidates are scored."""
    return logp[..., 0] if logp.dim() == 3 else logp


def make_episodes(policy, reference, rollout, advantages, cfg, world: World = World(), *, on_policy: bool = False,
                  entropy: bool = False) -> tuple[Episodes, dict[str, float] | None, torch.Tensor | None]:
    """The update's input: old-policy (and reference) log-probs by replaying the recorded inputs, and the
    sampler-vs-replay mismatch of the response tokens (`mismatch_sums` of the whole batch: every rank holds
    every row's replay): the sampler / trainer drift, and what --rollout-is does with it.

    on_policy (one optimizer step on weights the rollout was sampled with): the old policy is the policy
    being updated, so its log-probs are the update forward's own, detached, and the no-grad replay is
    skipped (a quarter of the update's compute; the mismatch is then measured in that forward: None here).
    entropy: also return the replayed old policy's entropies [N, T] (None when the replay is skipped)."""
    replayed = old_entropy = None
    if not (on_policy and cfg.old_logp == "replay"):
        policy.eval()
        replayed = replay_logprobs(policy, rollout, cfg, world, entropy=entropy)
        replayed, old_entropy = replayed if entropy else (replayed, None)
    ref_logp = None if reference is None else replay_logprobs(reference, rollout, cfg, world)
    old_logp = rollout.logprobs.float() if cfg.old_logp == "rollout" else replayed
    mismatch = None if replayed is None else mismatch_sums(action_logp(replayed), rollout.logprobs,
                                                           rollout.response_mask(), RolloutCorrection.of(cfg))
    episodes = Episodes(rollout=rollout, advantages=advantages.to(rollout.logprobs.device), old_logp=old_logp,
                        ref_logp=ref_logp, in_loss=rollout.finished if cfg.mask_truncated else None)
    return episodes, mismatch, old_entropy


def backward_minibatch(model, episodes: Episodes, cfg, world: World = World(), *,
                       entropy_coef: float | None = None) -> dict:
    """Accumulates into .grad the gradient of the loss over all response tokens of `episodes` (aggregated as
    cfg.loss_agg says), cfg.micro_batch_size rows per forward / backward. Every micro-batch divides by the
    whole mini-batch's loss_normalizer, so the gradient does not depend on the split. Returns the metrics,
    or the loss alone with `"finite": False` if a micro-batch's loss was not finite (nothing more is
    accumulated). cfg.micro_batch_tokens > 0: micro-batches under that token budget instead (see "micro-batches"
    above). entropy_coef: this step's bonus coefficient (adaptive), in place of cfg's.

    Under torchrun each rank takes its share of the rows (in the same number of calls on every rank)
    and divides by the whole mini-batch's count, so FSDP's reduced gradient is the one-process gradient;
    the metrics are reduced over the ranks. A non-finite loss on any rank makes every rank report it; the
    backward still runs everywhere (FSDP's collectives must match) and the step is skipped."""
    full_mask = episodes.loss_mask()
    # Every rank holds the whole mini-batch, so its count is known everywhere; FSDP averages the ranks'
    # gradients, hence the division by the world size: the reduced gradient is sum_r loss_r / count.
    normalizer = loss_normalizer(full_mask, cfg.loss_agg, cfg.loss_agg_rows) / world.size
    # token-mean-per-rows: runs of rows are counted over the whole mini-batch, not per micro-batch.
    run_tokens = group_tokens(full_mask, cfg.loss_agg_rows) if cfg.loss_agg == "token-mean-per-rows" else None
    device = distributed.device_of(model)
    correction, settings = RolloutCorrection.of(cfg), LossSettings.of(cfg)
    if entropy_coef is not None:
        settings = replace(settings, entropy_coef=entropy_coef)
    totals: dict[str, float] = {}
    finite, mismatch = True, dict.fromkeys(MISMATCH_SUMS, 0.0)
    sums = dict.fromkeys(("entropy", "mixed", "mixed_H"), 0.0)  # the entropy's sums: over all tokens, the mixed ones
    for index, real in micro_batches(episodes.rollout, cfg, world):
        micro = episodes.micro_batch(index)
        logp, entropy = replay(model, micro.rollout, cfg)
        mask = micro.loss_mask().to(device) & real  # a stand-in counts for nothing
        # on-policy: the sampled weights are these, so ratio = 1 with its gradient
        old_logp = logp.detach() if micro.old_logp is None else micro.old_logp.to(device)
        sampler_logp, response_mask = micro.rollout.logprobs.to(device), micro.rollout.response_mask().to(device)
        if micro.old_logp is None:  # the mismatch is measured in this forward (make_episodes did not replay)
            mismatch = add_sums(mismatch, mismatch_sums(action_logp(old_logp), sampler_logp, response_mask & real,
                                                        correction))
        # Weights per row, from the row's own log-probs: the same whatever the micro-batch or the rank.
        is_weights = None if correction.mode == "none" else \
            importance_weights(action_logp(old_logp), sampler_logp, response_mask, correction)[1]
        if micro.pg_mask is not None:  # --top-entropy-quantile: the other tokens get no policy gradient
            keep = micro.pg_mask.to(device).float()
            is_weights = keep if is_weights is None else is_weights * keep
        # What the loss scores of a step: log p(y), or the strategy's terms of its candidates (Strategy.loss_terms)
        strategy, steps = STRATEGIES[micro.rollout.strategy], micro.rollout.steps
        (logp, candidates), (old_logp, _) = strategy.loss_terms(logp, steps), strategy.loss_terms(old_logp, steps)
        ref_logp = None if micro.ref_logp is None else strategy.loss_terms(micro.ref_logp.to(device), steps)[0]
        with distributed.autocast(device):  # the forward only; backward runs in the dtypes the forward chose
            loss, metrics = policy_loss(logp, old_logp, micro.advantages.to(device), mask, ref_logp=ref_logp,
                                        settings=settings, normalizer=normalizer.to(device),
                                        run_tokens=None if run_tokens is None else
                                        run_tokens[index].to(device), is_weights=is_weights, entropy=entropy,
                                        candidates=candidates)
        if real and not torch.isfinite(loss):
            finite = False
            if not world.distributed:
                return {"loss": float(loss.detach()), "finite": False}
        loss.backward()
        for key, value in metrics.items():
            totals[key] = totals.get(key, 0.0) + float(value)
        mixed = micro.rollout.mixed.to(device) & mask  # the entropy where inputs were mixed (docs/experiments.md)
        sums = add_sums(sums, {"entropy": float((entropy.detach() * mask).sum()), "mixed": float(mixed.sum()),
                               "mixed_H": float((entropy.detach() * mixed).sum())})
    totals = distributed.mean_across(totals, 1.0, world)  # each rank's sums / (count / W): their mean
    sums = distributed.sum_across(sums, world)
    totals["entropy"] = sums["entropy"] / float(full_mask.sum().clamp_min(1))
    if sums["mixed"]:
        totals["mixed_entropy"] = sums["mixed_H"] / sums["mixed"]
    if episodes.old_logp is None:
        maxima = {key: mismatch.pop(key) for key in MISMATCH_SUMS if key.endswith("_max")}
        totals.update(mismatch_metrics({**distributed.sum_across(mismatch, world),
                                        **distributed.max_across(maxima, world)}))
    totals["finite"] = not distributed.max_across({"bad": float(not finite)}, world)["bad"]
    return totals


def optimize(policy, optimizer, episodes: Episodes, cfg, world: World = World(), *,
             entropy_coef: float | None = None) -> tuple[dict, int]:
    """ppo_epochs passes of mini-batch updates (mini_batch_prompts groups each, grad-norm clipped). A
    mini-batch whose loss or gradient is not finite is skipped. Returns (metric -> values per update, skipped)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    policy.train()
    update, skipped = {}, 0
    per_minibatch = cfg.mini_batch_prompts * cfg.group_size
    starts = [start for _ in range(cfg.ppo_epochs) for start in range(0, len(episodes), per_minibatch)]
    for start in tqdm(starts, desc="update", unit="minibatch", leave=False, delay=2, file=sys.stderr,
                      disable=None if world.is_main else True):
        optimizer.zero_grad(set_to_none=True)
        result = backward_minibatch(policy, episodes.rows(slice(start, start + per_minibatch)), cfg, world,
                                    entropy_coef=entropy_coef)
        grad_norm = distributed.clip_grad_norm(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        if not result.pop("finite") or not torch.isfinite(grad_norm):
            skipped += 1  # a non-finite loss or gradient: no update from this mini-batch
            optimizer.zero_grad(set_to_none=True)
            continue
        optimizer.step()
        result["grad_norm"] = float(grad_norm)
        for key, value in result.items():
            update.setdefault(key, []).append(value)
    optimizer.zero_grad(set_to_none=True)  # the gradients are not held through the next rollouts
    return update, skipped


def scheduled_lr(cfg, step: int, total_steps: int) -> float:
    """The learning rate of update `step` (0-based) of `total_steps`: --lr throughout, or with --lr-schedule
    cosine a linear warm-up to --lr over --warmup-steps and then half a cosine down to --min-lr-ratio x lr at
    the last step. A function of the step alone, so a resumed run continues the same curve."""
    if cfg.lr_schedule == "constant":
        return cfg.lr
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(total_steps - 1 - cfg.warmup_steps, 1)  # 0 -> 1
    floor = cfg.min_lr_ratio * cfg.lr
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def update(policy, reference, optimizer, rollout, rewards: torch.Tensor, cfg, world: World = World(),
           entropy_control: EntropyControl | None = None) -> tuple[dict, int]:
    """One rollout batch's whole update: replayed old / reference log-probs -> advantages (--adv-estimator, of the
    rewards less the KL with --kl-in-reward) -> ppo_epochs of clipped mini-batch steps. Returns (metric -> mean over
    the optimizer steps, with the sampler-vs-replay mismatch of the whole batch (MISMATCH_METRICS,
    `mismatch_metrics`); mini-batches skipped). entropy_control: the bonus's coefficient (adaptive: its state
    moves on one step here); None = --entropy-coef."""
    control = entropy_control or EntropyControl.of(cfg)
    # The old policy's log-probs and entropies before any step: the KL in the reward, the top-entropy tokens, e_k.
    needs_old = cfg.kl_in_reward or cfg.top_entropy_quantile < 1 or control.adaptive
    on_policy = cfg.ppo_epochs == 1 and len(rollout.prompts) <= cfg.mini_batch_prompts * cfg.group_size \
        and not needs_old
    episodes, mismatch, old_entropy = make_episodes(policy, reference, rollout, torch.zeros_like(rewards), cfg, world,
                                                    on_policy=on_policy, entropy=needs_old)
    mask, extra = episodes.loss_mask().to(distributed.device_of(policy)), {}  # where the replay's tensors are
    if cfg.kl_in_reward and episodes.ref_logp is not None:
        penalty = kl_penalty(episodes.old_logp, episodes.ref_logp, mask, cfg).cpu()
        rewards, extra["kl_in_reward"] = rewards - penalty.to(rewards.dtype), float(penalty.mean())
    episodes.advantages = advantages_of(rewards, rollout.lengths.cpu(), cfg).to(rollout.logprobs.device)
    if cfg.top_entropy_quantile < 1:
        episodes.pg_mask = high_entropy_mask(old_entropy, mask, cfg.top_entropy_quantile)
        extra["pg_token_frac"] = float(episodes.pg_mask.sum() / mask.sum().clamp_min(1))
    if control.adaptive:
        mean_entropy = float((old_entropy * mask).sum() / mask.sum().clamp_min(1))
        extra["entropy_coef"] = control.step(mean_entropy)
    per_step, skipped = optimize(policy, optimizer, episodes, cfg, world, entropy_coef=extra.get("entropy_coef"))
    result = {key: sum(values) / len(values) for key, values in per_step.items()}
    if mismatch is not None and result:  # empty when every mini-batch was skipped, which train.py counts
        result.update(mismatch_metrics(mismatch))
    return ({**result, **extra} if result else result), skipped
