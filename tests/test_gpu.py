"""The CUDA-only code paths: the CUDA-graph decode step, the sampler and the replay on a GPU, the neighbor
search on a GPU, and a training run with its bf16 sampler copy and bf16 autocast. The whole file skips on
a machine without a CUDA device (CI); run it with `pytest tests/test_gpu.py` where there is one."""

import copy
import json
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

import model as M
import train
from config import preset
from neighbors import build_neighbor_table
from ngrpo import sequence_logprobs
from rollout import Exploration, Sampling, generate

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

V = 503
PROMPTS = [[5, 9, 2], [7, 1, 4, 4, 8, 3, 6], [11], [3, 3, 9, 20, 41, 77, 100, 2, 9], [400, 12]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(transformers' Qwen2, ours loaded from its checkpoint), fp32 on the GPU, random weights with logits
    scaled up so that sampling is far from uniform and greedy choices are far from ties."""
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=V, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        hf.lm_head.weight.mul_(40)
    path = tmp_path_factory.mktemp("qwen2")
    hf.save_pretrained(path)
    return hf.cuda(), M.load_model(str(path), dtype=torch.float32, device="cuda").eval()


# fp32 matmuls stay full fp32 here: PyTorch's default leaves TF32 off for them.


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graphed_decode_equals_the_eager_decode(models, dtype):
    """Replaying the captured steps runs the same kernels on the same buffers as calling the model: with
    refill (two slots for five rows, stop ids) and windows growing past 64, so several graphs are used."""
    ours = copy.deepcopy(models[1]).to(dtype)
    table = build_neighbor_table(ours.output_weight, 2)
    stops = tuple(range(0, V, 50))  # 11 of 503 tokens: rows end at different steps
    kwargs = dict(sampling=Sampling(temperature=0.8, max_new_tokens=100, stop_ids=stops), slots=2,
                  exploration=Exploration("neighbor", mix_rate=0.3, num_neighbors=2), neighbor_table=table)
    graphed = generate(ours, PROMPTS, seed=3, cuda_graph=True, **kwargs)
    eager = generate(ours, PROMPTS, seed=3, cuda_graph=False, **kwargs)
    assert graphed.mixed.any() and len(set(graphed.lengths.tolist())) > 1
    for name in ("response_ids", "lengths", "cand_ids", "mixed"):
        assert torch.equal(getattr(graphed, name), getattr(eager, name)), name
    assert (graphed.cand_weights - eager.cand_weights).abs().max() < 1e-5
    assert (graphed.logprobs - eager.logprobs).abs().max() < 1e-5


@torch.no_grad()
def test_graphed_greedy_equals_argmax_of_transformers_full_forwards(models):
    hf, ours = models
    rollout = generate(ours, PROMPTS, Sampling(temperature=0, max_new_tokens=12), cuda_graph=True, slots=2)
    for row, prompt in enumerate(PROMPTS):
        sequence = list(prompt)
        for _ in range(12):
            sequence.append(int(hf(torch.tensor([sequence], device="cuda")).logits[0, -1].argmax()))
        assert rollout.responses()[row] == sequence[len(prompt):]


@torch.no_grad()
@pytest.mark.parametrize("strategy", ["neighbor", "soft", "topk-gumbel", "orthogonal_noise"])
def test_replay_on_the_gpu_reproduces_the_sampling_logprobs(models, strategy):
    """What training replays (ngrpo.sequence_logprobs over the recorded mixtures, and noise redrawn from its
    keys) is what the graphed sampler saw, at the sampling temperature."""
    _, ours = models
    table = build_neighbor_table(ours.output_weight, 1)
    rollout = generate(ours, PROMPTS, Sampling(temperature=0.7, max_new_tokens=24),
                       Exploration(strategy, mix_rate=0.5, top_k=4), neighbor_table=table, seed=5)
    logp, _ = sequence_logprobs(ours, rollout.prompts, rollout.cand_ids, rollout.cand_weights, rollout.lengths,
                                rollout.response_ids, temperature=0.7, noise_keys=rollout.noise_keys,
                                noise_scales=rollout.noise_scales)
    mask = rollout.response_mask()
    assert rollout.mixed.any()
    assert (logp - rollout.logprobs)[mask].abs().max() < 1e-4


@pytest.mark.parametrize("metric", ["cosine", "dot", "l2", "l1"])
def test_neighbor_table_on_the_gpu_equals_the_cpu_one(metric):
    weight = torch.randn(3000, 48, generator=torch.Generator().manual_seed(0))
    cpu = build_neighbor_table(weight, 3, metric, chunk_size=700)
    gpu = build_neighbor_table(weight.cuda(), 3, metric, chunk_size=700)
    assert gpu.device.type == "cuda"
    assert torch.equal(gpu.cpu(), cpu)


def test_training_on_the_gpu_uses_a_bf16_sampler_and_learns_nothing_strange(tmp_path):
    """Two steps of the tiny preset on the GPU: fp32 policy under bf16 autocast, a bf16 sampler copy
    refreshed after each update, a bf16 reference model for the KL term. Every logged number is finite and
    the rollout-vs-replay log-prob gap stays at bf16 rounding size."""
    cfg = replace(preset("tiny"), out_dir=str(tmp_path / "run"), device="cuda", prompts_per_step=8,
                  mini_batch_prompts=4, micro_batch_size=8, max_new_tokens=16, max_steps=2, kl_coef=0.01)
    summary = train.run(cfg)
    assert summary["steps"] == 2
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        metrics = json.loads(line)
        assert all(value == value and abs(value) != float("inf")
                   for value in metrics.values() if isinstance(value, float)), metrics
        assert metrics["skipped_minibatches"] == 0
        assert metrics["logp_gap_mean"] < 0.05, metrics["logp_gap_mean"]
    reloaded = M.load_model(str(tmp_path / "run" / "checkpoints" / "step-2"), dtype=torch.float32, device="cuda")
    assert reloaded.embed_tokens.weight.dtype == torch.float32
