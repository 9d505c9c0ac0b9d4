"""The estimators a GRPO-family update is built from, each written once as the formula its docstring
states and registered by name, as verl's core_algos registers them: the advantage of each response
from its group's rewards, the per-token KL to the reference, and the entropy controls (which tokens
the policy gradient trains on, and the bonus's coefficient). docs/estimators.md gives each formula
with its source and when to use it.

    advantages_of(rewards, lengths, cfg)           --adv-estimator: grpo, negative, rloo, reinforce-baseline, passk
    KL_ESTIMATORS[cfg.kl_estimator](logp, ref_logp)  k1, k2, k3, low-var (the released code's k3, the default)
    high_entropy_mask(entropy, mask, q)            --top-entropy-quantile
    EntropyControl                                 --entropy-coef, fixed or held near --entropy-target
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

# ----------------------------------------------------------------------------- advantages


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


# Other advantage estimators, rewards [N] -> [N] (rows g G .. g G + G - 1: one prompt's group).
# "verl l. a-b": lines of verl/trainer/ppo/core_algos.py at github.com/volcengine/verl b178a3cd
# (2026-01-29). See docs/estimators.md.


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """r_i - mean_{j != i} r_j = G / (G - 1) (r_i - mean_G r): REINFORCE leave-one-out (Ahmadian et
    al. 2024, "Back to Basics", arXiv 2402.14740; verl l. 476-525, compute_rloo_outcome_advantage).
    A group of one: 0 (verl: r)."""
    groups = rewards.float().view(-1, group_size)  # [N / G, G]
    scale = group_size / (group_size - 1) if group_size > 1 else 0.0
    return ((groups - groups.mean(-1, keepdim=True)) * scale).flatten()


def reinforce_baseline_advantages(rewards: torch.Tensor, group_size: int, *,
                                  token_counts: torch.Tensor | None = None) -> torch.Tensor:
    """REINFORCE++-baseline (Hu 2025, arXiv 2501.03262) as verl l. 422-473 has it: x = r - mean_G r
    (a group of one: x = r), whitened over the batch, (x - mean x) / sqrt(var x + 1e-8), var
    unbiased (masked_whiten, verl/utils/ torch_functional.py l. 287-339). verl whitens tokens:
    token_counts [N] weighs each row by its response tokens as verl does; None weighs rows alike.
    One row or one token in all: 0 (verl raises; n / (n - 1) divides by 0)."""
    groups = rewards.float().view(-1, group_size)  # [N / G, G]
    centred = (groups - groups.mean(-1, keepdim=True) if group_size > 1 else groups).flatten()  # [N]
    weights = torch.ones_like(centred) if token_counts is None else token_counts.float()
    count = weights.sum()
    if count <= 1 or centred.numel() == 1:
        return torch.zeros_like(centred)
    mean = (weights * centred).sum() / count
    return (centred - mean) * torch.rsqrt((weights * (centred - mean).square()).sum() / (count - 1) + 1e-8)


def passk_advantages(rewards: torch.Tensor, group_size: int, *, k: int = 1) -> torch.Tensor:
    """G s_i^(loo-1) (Walder & Karkhanis, "Pass@K Policy Optimization", arXiv 2505.15201, Eq. 33):
    the group mean of A_i grad log p(y_i) estimates grad pass@k (max_g@k, the expected best of k
    samples) without bias. s_i = sum over k-subsets I holding i of (max_I r - max_{I \\ i} r) / C(G,
    k) = sum_{j ranked below i} C(rank_j - 1, k - 2) (r_i - r_j) / C(G, k), ranks 1..G ascending
    (ties add 0). Binary: G C(G - c, k - 1) / C(G, k) for a correct row, 0 for the rest (c correct).
    k = 1: RLOO, the paper's k = 1 baseline. 1 <= k <= G. verl's grpo_passk (l. 360-419) is k = G
    divided by G (std_G r + eps): (r_max - r_second) / (std_G r + eps) on a best row, 0 elsewhere.

    >>> passk_advantages(torch.tensor([1., 0., 0., 0.]), 4, k=2)   # 4 C(3, 1) / C(4, 2)
    tensor([2., 0., 0., 0.])"""
    if not 1 <= k <= group_size:
        raise ValueError(f"pass@k advantages need 1 <= k <= group size ({group_size}), got k = {k}")
    if k == 1:
        return rloo_advantages(rewards, group_size)
    ranked, order = rewards.float().view(-1, group_size).sort(-1)  # [N / G, G] ascending
    weights = ranked.new_tensor([math.comb(j, k - 2) for j in range(group_size)])  # [G]: C(rank - 1, k - 2)
    gaps = (ranked[:, :, None] - ranked[:, None, :]).clamp_min(0.0)  # [N / G, G, G]: r_i - r_j where r_j <= r_i
    s = (gaps * weights).sum(-1) * (group_size / math.comb(group_size, k))
    return torch.zeros_like(ranked).scatter_(-1, order, s).flatten()


@dataclass(frozen=True)
class Estimator:
    """An --adv-estimator: estimator(rewards [N], group_size, **options) -> advantages [N]
    (compute), one line for --help (about), and the run's settings it reads (knobs), which
    options(settings, lengths) passes it (lengths [N]: the response lengths, reinforce-baseline's
    token weights)."""

    compute: Callable[..., torch.Tensor]
    about: str
    knobs: tuple[str, ...] = ()
    options: Callable[..., dict] = lambda settings, lengths: {}

    def __call__(self, rewards: torch.Tensor, group_size: int, **options) -> torch.Tensor:
        return self.compute(rewards, group_size, **options)


def _grpo_options(s, lengths, **more) -> dict:
    return dict(scale=s.scale_rewards, eps=s.adv_eps, **more)


# By name (--adv-estimator): negative is NGRPO's calibration, group_advantages with virtual samples.
ADVANTAGES: dict[str, Estimator] = {
    "grpo": Estimator(group_advantages, "group-normalised", ("scale_rewards", "adv_eps"), _grpo_options),
    "negative": Estimator(group_advantages, "NGRPO (Nan et al. 2025): each group's mean and std also count virtual "
                          "samples of the maximum reward, so an all-wrong group gets negative advantages",
                          ("scale_rewards", "adv_eps", "virtual_max_count", "virtual_max_reward"),
                          lambda s, n: _grpo_options(s, n, virtual_count=s.virtual_max_count,
                                                     virtual_reward=s.virtual_max_reward)),
    "rloo": Estimator(rloo_advantages, "r minus the mean of the others (arXiv 2402.14740)"),
    "reinforce-baseline": Estimator(reinforce_baseline_advantages, "REINFORCE++'s group-centred, batch-whitened "
                                    "(arXiv 2501.03262)", options=lambda s, lengths: dict(token_counts=lengths)),
    "passk": Estimator(passk_advantages, "an unbiased gradient of pass@k (Walder and Karkhanis, arXiv 2505.15201)",
                       ("pass_k",), lambda s, n: dict(k=s.pass_k)),
}


def advantages_of(rewards: torch.Tensor, lengths: torch.Tensor, cfg) -> torch.Tensor:
    """--adv-estimator's advantages of a step's rewards [N], with that estimator's options from the run's settings
    (lengths [N]: the response lengths)."""
    estimator = ADVANTAGES[cfg.adv_estimator]
    return estimator(rewards, cfg.group_size, **estimator.options(cfg, lengths))


# ----------------------------------------------------------------------------- KL to the reference


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): exp(d) - d - 1 with d = ref - logp clamped
    to [-20, 20], the result clamped to [-10, 10]: the released code's low-variance KL (verl l.
    1890-1896, below)."""
    diff = (ref_logp - logp).clamp(-20.0, 20.0)
    return (diff.exp() - diff - 1.0).clamp(-10.0, 10.0)


# Other per-token KL estimators [B, T], d = ref_logp - logp (Schulman, "Approximating KL
# Divergence", 2020), as verl's kl_penalty_forward (verl l. 1867-1902) has them. k3_kl above is
# verl's "low_var_kl" (l. 1890-1896), clamps and all.


def k1_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """-d = logp - ref_logp: unbiased, high variance, negative on some tokens (verl's "kl" / "k1",
    l. 1879-1880)."""
    return logp - ref_logp


def k2_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """d^2 / 2: biased, low variance, >= 0; its gradient on policy samples is KL's (verl's "mse" /
    "k2", l. 1885-6)."""
    return 0.5 * (logp - ref_logp).square()


def k3_unclamped_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """exp(d) - d - 1 without k3_kl's clamps, as Schulman writes it and TRL's GRPOTrainer computes
    it: unbiased, >= 0; infinite where the policy gives a sampled token probability 0."""
    diff = ref_logp - logp
    return diff.exp() - diff - 1.0


# By name: KL_ESTIMATORS[name](logp, ref_logp) -> [B, T]. low-var (the default) is the released
# code's k3.
KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": k1_kl, "k2": k2_kl, "k3": k3_unclamped_kl, "low-var": k3_kl}


def kl_penalty(old_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, cfg) -> torch.Tensor:
    """--kl-in-reward: kl_coef x the sum over each response's tokens of the KL estimate between the
    policy that drew it and the reference [N], subtracted from its reward before the advantages
    (verl's apply_kl_penalty, ray_trainer.py: token-level rewards = scores - beta x kl, summed by an
    outcome estimator; OpenRLHF's and NeMo RL's reward KL)."""
    return cfg.kl_coef * (KL_ESTIMATORS[cfg.kl_estimator](old_logp, ref_logp) * mask).sum(-1)


# ----------------------------------------------------------------------------- entropy controls


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """The response tokens [B, T] whose entropy is among the top fraction `quantile` of the batch's
    (`mask`): the policy gradient trains on these alone (Wang et al., "Beyond the 80/20 Rule", arXiv
    2506.01939: the top 20% of a batch's tokens by entropy; TRL's top_entropy_quantile, the
    release's entropy_top_ratio). The threshold is the ceil(q n)-th largest of the n masked
    entropies; ties with it are kept, as TRL's `>=` keeps them."""
    values = entropy[mask.bool()].float()
    if quantile >= 1.0 or values.numel() == 0:
        return mask.bool()
    keep = max(1, math.ceil(quantile * values.numel()))
    threshold = values.kthvalue(values.numel() - keep + 1).values
    return mask.bool() & (entropy >= threshold)


@dataclass
class EntropyControl:
    """The entropy bonus's coefficient step by step. Fixed: --entropy-coef every step. Adaptive
    (--entropy-target > 0), Skywork-OR1's adaptive entropy control (He et al., arXiv 2505.22312,
    Sec. 3.2): step k's coefficient is c_k if e_k <= target, else 0, where e_k is the mean entropy
    of step k's responses under the policy that drew them; then c_{k+1} = c_k + delta if e_k <
    target, c_k - delta if e_k > target, clipped to [0, --entropy-coef]; c_0 = 0. Its state (c) is
    saved with the run, so a resumed run continues it."""

    max_coef: float = 0.0
    target: float = 0.0
    delta: float = 0.0
    coef: float = 0.0  # c_k, adaptive only

    @classmethod
    def of(cls, cfg) -> "EntropyControl":
        return cls(max_coef=cfg.entropy_coef, target=cfg.entropy_target, delta=cfg.entropy_coef_delta)

    @property
    def adaptive(self) -> bool:
        return self.target > 0

    def step(self, entropy: float) -> float:
        """This step's coefficient, given e_k; moves c on to c_{k+1}."""
        if not self.adaptive:
            return self.max_coef
        alpha = self.coef if entropy <= self.target else 0.0
        move = self.delta if entropy < self.target else -self.delta if entropy > self.target else 0.0
        self.coef = min(max(self.coef + move, 0.0), self.max_coef)
        return alpha
