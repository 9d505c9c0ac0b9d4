"""The advantage and KL estimators of estimators.py (docs/estimators.md), each against hand-computed numbers
or a brute-force reference: every outcome of a small group weighted by its probability, every k-subset."""

import itertools
import math

import pytest
import torch

from estimators import ADVANTAGES, KL_ESTIMATORS, group_advantages, k3_kl


def close(actual, expected, atol=1e-5):
    return torch.allclose(actual.double(), torch.tensor(expected, dtype=torch.float64), atol=atol)


# ----------------------------------------------------------------------------- the registries


def test_the_registries_hold_every_estimator_by_name():
    assert set(ADVANTAGES) == {"grpo", "negative", "rloo", "reinforce-baseline", "passk"}
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3", "low-var"}
    assert ADVANTAGES["grpo"].compute is group_advantages and KL_ESTIMATORS["low-var"] is k3_kl


# ----------------------------------------------------------------------------- grpo (today's group_advantages)


def test_grpo_on_hand_values():
    grpo = ADVANTAGES["grpo"]
    assert close(grpo(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4), [1.5, -0.5, -0.5, -0.5])  # mean 1/4, std 1/2
    tie = 0.5 / math.sqrt(1 / 3)  # [1, 1, 0, 0]: mean 1/2, unbiased std sqrt(1/3)
    assert close(grpo(torch.tensor([1.0, 1.0, 0.0, 0.0]), 4), [tie, tie, -tie, -tie])
    assert close(grpo(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]), 3), [0.0] * 6)  # all-equal groups
    assert close(grpo(torch.tensor([1.0, 0.0]), 1), [0.0, 0.0])  # groups of one


# ----------------------------------------------------------------------------- rloo


def test_rloo_subtracts_the_mean_of_the_others():
    rloo = ADVANTAGES["rloo"]
    assert close(rloo(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4), [1.0, -1 / 3, -1 / 3, -1 / 3])  # one correct
    assert close(rloo(torch.tensor([1.0, 1.0, 0.0, 0.0]), 4), [2 / 3, 2 / 3, -2 / 3, -2 / 3])  # 1 - 1/3; 0 - 2/3
    assert close(rloo(torch.tensor([0.5, 0.2, 0.8]), 3), [0.0, 0.2 - 0.65, 0.8 - 0.35])  # (0.2+0.8)/2; (0.5+0.8)/2...


def test_rloo_gives_all_equal_groups_and_groups_of_one_zero():
    rloo = ADVANTAGES["rloo"]
    assert close(rloo(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]), 3), [0.0] * 6)
    assert close(rloo(torch.tensor([1.0, 0.0, 1.0]), 1), [0.0, 0.0, 0.0])


# ----------------------------------------------------------------------------- reinforce-baseline


def test_reinforce_baseline_centres_per_group_then_whitens_over_the_batch():
    reinforce = ADVANTAGES["reinforce-baseline"]
    # Groups [1, 0] and [1, 1] centre to [0.5, -0.5, 0, 0]: mean 0, unbiased var (0.25 + 0.25) / 3 = 1/6.
    assert close(reinforce(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2), [0.5 / math.sqrt(1 / 6), -0.5 / math.sqrt(1 / 6),
                                                                     0.0, 0.0])
    # One correct of four: [0.75, -0.25, -0.25, -0.25], var (0.5625 + 3 x 0.0625) / 3 = 1/4.
    assert close(reinforce(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4), [1.5, -0.5, -0.5, -0.5])
    # Ties: [1, 1, 0, 0] centres to +-0.5, var 1/3.
    tie = 0.5 / math.sqrt(1 / 3)
    assert close(reinforce(torch.tensor([1.0, 1.0, 0.0, 0.0]), 4), [tie, tie, -tie, -tie])


def test_reinforce_baseline_keeps_a_group_of_one_uncentred_as_verl_does():
    # Groups of one keep x = r = [1, 0, 0]: mean 1/3, unbiased var ((2/3)^2 + 2 (1/3)^2) / 2 = 1/3.
    std = math.sqrt(1 / 3)
    assert close(ADVANTAGES["reinforce-baseline"](torch.tensor([1.0, 0.0, 0.0]), 1),
                 [(2 / 3) / std, (-1 / 3) / std, (-1 / 3) / std])


def test_reinforce_baseline_gives_all_equal_batches_and_a_batch_of_one_zero():
    reinforce = ADVANTAGES["reinforce-baseline"]
    assert close(reinforce(torch.tensor([1.0, 1.0, 0.0, 0.0]), 2), [0.0] * 4)  # both groups all-equal
    assert close(reinforce(torch.tensor([1.0]), 1), [0.0])  # verl raises here (n / (n - 1))
    assert close(reinforce(torch.tensor([1.0]), 1, token_counts=torch.tensor([5])), [0.0])


def test_reinforce_baseline_with_token_counts_whitens_tokens_as_verl():
    # verl tiles each row's value over its response tokens and whitens the tokens: rows [1, 0] (one group) with 3 and 1
    # tokens are the tokens [0.5, 0.5, 0.5, -0.5], mean 0.25, unbiased std 0.5.
    tokens = torch.tensor([0.5, 0.5, 0.5, -0.5], dtype=torch.float64)
    reference = ((tokens - tokens.mean()) / tokens.std())[[0, 3]]
    assert close(reference.float(), [0.5, -1.5])
    assert close(ADVANTAGES["reinforce-baseline"](torch.tensor([1.0, 0.0]), 2, token_counts=torch.tensor([3, 1])),
                 [0.5, -1.5])


# ----------------------------------------------------------------------------- passk


def test_passk_on_binary_hand_values():
    passk = ADVANTAGES["passk"]
    # k = 2, G = 4: a correct row gets G C(G - c, 1) / C(4, 2) = 4 (4 - c) / 6, an incorrect one 0.
    assert close(passk(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, k=2), [2.0, 0.0, 0.0, 0.0])  # one correct
    assert close(passk(torch.tensor([0.0, 1.0, 1.0, 0.0]), 4, k=2), [0.0, 4 / 3, 4 / 3, 0.0])  # ties
    assert close(passk(torch.tensor([1.0, 1.0, 1.0, 0.0]), 4, k=2), [2 / 3, 2 / 3, 2 / 3, 0.0])
    assert close(passk(torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]), 4, k=2), [0.0] * 8)  # all-equal
    # k = G = 4: C(4 - c, 3) / C(4, 4) is 1 for c = 1 and 0 beyond: one more correct sample adds nothing to pass@4.
    assert close(passk(torch.tensor([0.0, 0.0, 1.0, 0.0]), 4, k=4), [0.0, 0.0, 4.0, 0.0])
    assert close(passk(torch.tensor([0.0, 1.0, 1.0, 0.0]), 4, k=4), [0.0] * 4)


def test_passk_with_k_1_is_rloo_and_a_group_of_one_gets_zero():
    passk = ADVANTAGES["passk"]
    assert close(passk(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, k=1), [1.0, -1 / 3, -1 / 3, -1 / 3])
    assert close(passk(torch.tensor([1.0, 0.0]), 1, k=1), [0.0, 0.0])


def test_passk_on_continuous_rewards_by_hand():
    # k = 2 of [0.2, 0.8, 0.5]: 0.8 is in {0.8, 0.2} (0.8 - 0.2) and {0.8, 0.5} (0.8 - 0.5): 0.9 / C(3, 2) = 0.3;
    # 0.5 in {0.5, 0.2} (0.3) and {0.5, 0.8} (0): 0.1; 0.2 never raises a max: 0. Times G = 3.
    assert close(ADVANTAGES["passk"](torch.tensor([0.2, 0.8, 0.5]), 3, k=2), [0.0, 0.9, 0.3])
    # k = G: the best row gets G (r_max - r_second), as verl's grpo_passk does before its 1 / std.
    assert close(ADVANTAGES["passk"](torch.tensor([0.2, 0.9, 0.5, 0.1]), 4, k=4), [0.0, 1.6, 0.0, 0.0])


def test_passk_matches_its_definition_summed_over_every_subset():
    """Eq. 33 of Walder & Karkhanis, enumerated: G / C(G, k) sum_{|I| = k, i in I} (max_I r - max_{I \\ i} r)."""
    rewards = [0.3, -0.5, 0.3, 1.0, 0.0, 1.0]  # ties, a negative reward (an overlong penalty)
    size = len(rewards)
    for k in range(2, size + 1):
        expected = []
        for i in range(size):
            total = sum(max(rewards[j] for j in subset) - max(rewards[j] for j in subset if j != i)
                        for subset in itertools.combinations(range(size), k) if i in subset)
            expected.append(size * total / math.comb(size, k))
        assert close(ADVANTAGES["passk"](torch.tensor(rewards), size, k=k), expected), k


def test_passk_rejects_k_outside_one_to_the_group_size():
    for k in (0, 5):
        with pytest.raises(ValueError, match="1 <= k <= group size"):
            ADVANTAGES["passk"](torch.zeros(8), 4, k=k)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_passk_is_an_unbiased_gradient_of_pass_at_k(k):
    """G = 4 samples, each correct with probability p: over all 2^4 outcomes weighted by their probability,
    E[(1/G) sum_i A_i d log p(y_i) / dp] = d/dp pass@k = d/dp (1 - (1 - p)^k) = k (1 - p)^(k - 1)."""
    size = 4
    outcomes = torch.tensor(list(itertools.product([0.0, 1.0], repeat=size)), dtype=torch.float64)  # [16, G]
    advantages = ADVANTAGES["passk"](outcomes.flatten().float(), size, k=k).view(-1, size).double()
    for p in (0.1, 0.35, 0.5, 0.8):
        probability = (p ** outcomes * (1 - p) ** (1 - outcomes)).prod(-1)  # [16]
        score = outcomes / p - (1 - outcomes) / (1 - p)  # d log p(y_i) / dp
        lhs = (probability * (advantages * score).mean(-1)).sum()
        assert abs(float(lhs) - k * (1 - p) ** (k - 1)) < 1e-5, (k, p)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_passk_is_an_unbiased_gradient_of_the_expected_best_of_k(k):
    """Rewards -0.5, 0 or 1 drawn with probabilities softmax(theta): over all 3^4 outcomes of G = 4 samples,
    E[(1/G) sum_i A_i grad log pi(y_i)] = grad E[max of k samples], the latter by enumerating k samples."""
    size, values = 4, torch.tensor([-0.5, 0.0, 1.0], dtype=torch.float64)
    theta = torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64, requires_grad=True)
    log_pi = theta.log_softmax(-1)
    best_of_k = sum(log_pi[list(draw)].sum().exp() * values[list(draw)].max()
                    for draw in itertools.product(range(3), repeat=k))
    (expected,) = torch.autograd.grad(best_of_k, theta, retain_graph=True)  # log_pi serves both sides
    draws = torch.tensor(list(itertools.product(range(3), repeat=size)))  # [81, G]
    advantages = ADVANTAGES["passk"](values[draws].flatten().float(), size, k=k).view(-1, size).double()
    surrogate = (log_pi[draws].sum(-1).exp().detach() * (advantages * log_pi[draws]).mean(-1)).sum()
    (actual,) = torch.autograd.grad(surrogate, theta)
    assert torch.allclose(actual, expected, atol=1e-6), (actual, expected)


# ----------------------------------------------------------------------------- KL estimators


def kl_of(name, d):
    """The estimator on tokens with d = ref_logp - logp (logp = -2 throughout)."""
    logp = torch.full((1, len(d)), -2.0)
    return KL_ESTIMATORS[name](logp, logp + torch.tensor([d]))[0]


def test_every_kl_estimator_is_zero_where_the_policy_is_the_reference():
    for name in KL_ESTIMATORS:
        assert close(kl_of(name, [0.0, 0.0]), [0.0, 0.0]), name


def test_k1_is_the_negative_log_ratio():
    assert close(kl_of("k1", [1.0, -0.5]), [-1.0, 0.5])


def test_k2_is_half_the_squared_log_ratio():
    assert close(kl_of("k2", [1.0, -2.0, 0.5]), [0.5, 2.0, 0.125])


def test_low_var_is_exp_d_minus_d_minus_1_clamped():
    # e - 2; 1/e; e^2.5 - 3.5 (under the clamp); e^-10 + 9; e^3 - 4 = 16.09 and e^-12 + 11 clamped to 10
    assert close(kl_of("low-var", [1.0, -1.0, 2.5, -10.0, 3.0, -12.0]),
                 [0.718281828, 0.367879441, 8.682493960, 9.000045400, 10.0, 10.0])


def test_k3_is_exp_d_minus_d_minus_1_without_clamps():
    # the same first four; e^3 - 4 = 16.0855 and e^-12 + 11 = 11.000006 are not clamped
    assert close(kl_of("k3", [1.0, -1.0, 2.5, -10.0, 3.0, -12.0]),
                 [0.718281828, 0.367879441, 8.682493960, 9.000045400, 16.085536923, 11.000006144])


def test_k3_clamps_an_infinite_log_ratio_before_the_exponential():
    # A token the policy gives probability 0: d = +inf would make exp(d) - d nan; d is clamped to 20 first.
    logp, ref_logp = torch.tensor([[-math.inf, -1.0]]), torch.tensor([[-1.0, -math.inf]])
    assert close(k3_kl(logp, ref_logp)[0], [10.0, 10.0])
    assert close(KL_ESTIMATORS["low-var"](logp, ref_logp)[0], [10.0, 10.0])
