"""The bf16 paths a GPU run takes, checked on the CPU where torch runs them too: the sampler's bf16 copy and its
refresh after an optimizer step, and the dtypes at each boundary between the bf16 sampler and the fp32 policy
(what a GPU run alone checks is listed in docs/plan.md)."""

import torch

from model import TINY_CONFIG, random_model
from replay import sequence_logprobs
from rollout import Exploration, Sampling, generate
from runtime import distributed
from strategies import mixed_embeddings


def test_the_sampler_copy_is_bf16_and_equals_the_policy_after_a_step():
    policy = random_model(TINY_CONFIG, dtype=torch.float32, seed=0)
    sampler = distributed.unsharded_copy(policy, dtype=torch.bfloat16, device="cpu")
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    policy(torch.arange(10)[None]).float().logsumexp(-1).sum().backward()
    optimizer.step()
    distributed.copy_weights(policy, sampler)  # Run.refresh_sampler
    for (name, trained), (_, copy) in zip(policy.named_parameters(), sampler.named_parameters()):
        assert copy.dtype == torch.bfloat16 and not copy.requires_grad, name
        assert torch.equal(copy, trained.detach().to(torch.bfloat16)), name  # the same rounding, nothing stale


def test_dtypes_at_the_boundaries_of_a_bf16_rollout_and_its_fp32_replay():
    policy = random_model(TINY_CONFIG, dtype=torch.float32, seed=0)
    sampler = distributed.unsharded_copy(policy, dtype=torch.bfloat16, device="cpu")
    table = torch.randint(0, TINY_CONFIG.vocab_size, (TINY_CONFIG.vocab_size, 2))
    rollout = generate(sampler, [[1, 2, 3], [4, 5]], Sampling(max_new_tokens=8),
                       Exploration("neighbor", mix_rate=1.0, num_neighbors=2), neighbor_table=table)
    # What the sampler records is full precision, whatever the model's dtype: the weights and log-probs the
    # replay compares against, and the ids.
    assert rollout.cand_weights.dtype == torch.float32 and rollout.logprobs.dtype == torch.float32
    assert rollout.cand_ids.dtype == torch.long and rollout.mixed.any()
    # The mixture is summed in fp32 and rounded once to the embedding's dtype: bf16 for the sampler, fp32 for
    # the policy's replay.
    fed = mixed_embeddings(sampler.embed_tokens.weight, rollout.cand_ids, rollout.cand_weights)
    assert fed.dtype == torch.bfloat16
    with torch.no_grad():
        logp, entropy = sequence_logprobs(policy, rollout)
    assert logp.dtype == torch.float32 and entropy.dtype == torch.float32
    gap = (logp - rollout.logprobs).abs()[rollout.response_mask()]
    assert 0 < float(gap.max()) < 0.1  # bf16 sampling against fp32 replay: close, not equal
