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
from engine import decoder as engine_decoder
from engine import kernels
from engine.decoder import release_decoder
from engine.draws import bits_to_uniform, seed_state, step_uniforms
from engine.logprobs import token_logprobs
from neighbors import build_neighbor_table
from replay import sequence_logprobs
from rollout import Exploration, Sampler, Sampling, generate, sample_tokens

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


THINK_END = 7  # stands for </think>: Cold Stop forces it, and the after-thinking filters switch after it
# over log V: ends at step 5
COLD_STOP = dict(early_stopping_entropy_threshold=10.0, early_stopping_length_threshold=5, stop_mixing_id=THINK_END)
# Every strategy with the knobs that keep per-row state or take draws on: Cold Stop's counter (through refill and the
# graph), Dirichlet draws, the after-thinking filters' per-row switch.
EVERY_STRATEGY = {
    "none": (Exploration("none"), {}),
    "neighbor": (Exploration("neighbor", mix_rate=0.3, num_neighbors=2), {}),
    "soft": (Exploration("soft", soft_top_k=4, dirichlet_alpha=1.0, **COLD_STOP),
             dict(min_p=0.01, after_thinking_top_k=20)),
    "gaussian": (Exploration("gaussian", soft_top_k=4, mix_rate=0.3), {}),
    "topk": (Exploration("topk", soft_top_k=4, mix_rate=0.3), {}),
    "topk-gumbel": (Exploration("topk-gumbel", soft_top_k=4, mix_rate=0.3), {}),
    "gaussian_embed_noise": (Exploration("gaussian_embed_noise", soft_top_k=4, mix_rate=0.3), {}),
    "orthogonal_noise": (Exploration("orthogonal_noise", soft_top_k=4, mix_rate=0.3), {}),
    "soft-gumbel": (Exploration("soft-gumbel", soft_top_k=4, **COLD_STOP), dict(after_thinking_top_p=0.9)),
    "mixinputs": (Exploration("mixinputs", mixinputs_beta=2.0), {}),
    "multiplex": (Exploration("multiplex", multiplex_width=3, multiplex_weights="probs", dirichlet_alpha=1.0,
                              multiplex_gumbel_tau=1.0, multiplex_entropy_mask=1.0, **COLD_STOP), {}),
    "soft-grpo": (Exploration("soft-grpo", soft_top_k=5, gumbel_temperature=0.1, noise_factor=0.5), dict(top_k=5)),
    "soft-grpo-dirichlet": (Exploration("soft-grpo-dirichlet", soft_top_k=5), {}),
    "soft-grpo-gaussian": (Exploration("soft-grpo-gaussian", soft_top_k=5), {}),
    "thinkrouter": (Exploration("thinkrouter", soft_top_k=4, router_confidence=0.3, **COLD_STOP), {}),
}


@torch.no_grad()
@pytest.mark.parametrize("strategy", EVERY_STRATEGY)
def test_every_strategys_graphed_step_equals_its_eager_step(models, strategy):
    """Each strategy's step replayed from CUDA graphs records what the eager step records (two slots for five rows:
    refill; windows past 64: several graphs), Cold Stop's </think> included."""
    ours = models[1]
    exploration, settings = EVERY_STRATEGY[strategy]
    exploration = replace(exploration, stop_mixing_id=THINK_END)  # the after-thinking filters switch after it
    sampling = Sampling(temperature=0.8, max_new_tokens=80, stop_ids=tuple(range(0, V, 50)), **settings)
    table = build_neighbor_table(ours.output_weight, 2)
    graphed, eager = (generate(ours, PROMPTS, sampling, exploration, neighbor_table=table, seed=3, slots=2,
                               cuda_graph=graph) for graph in (True, False))
    assert graphed.strategy == strategy and (strategy == "none" or graphed.mixed.any())
    if exploration.early_stopping_entropy_threshold:
        assert (graphed.response_ids == THINK_END).any()
    for name, value in graphed.steps.items():
        if value.dtype.is_floating_point:
            assert (value - eager.steps[name]).abs().max() < 1e-5, name
        else:
            assert torch.equal(value, eager.steps[name]), name
    assert torch.equal(graphed.lengths, eager.lengths)


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
@pytest.mark.parametrize("strategy", [name for name in EVERY_STRATEGY  # gaussian's noise is fed, never replayed
                                      if name not in ("none", "gaussian", "gaussian_embed_noise")])
def test_replay_on_the_gpu_reproduces_the_sampling_logprobs(models, strategy):
    """What training replays (replay.sequence_logprobs over the recorded mixtures, and noise redrawn from its
    keys) is what the graphed sampler saw, at the sampling temperature (unfiltered: the filters are off here)."""
    _, ours = models
    exploration, _ = EVERY_STRATEGY[strategy]
    table = build_neighbor_table(ours.output_weight, 2)
    rollout = generate(ours, PROMPTS, Sampling(temperature=0.7, max_new_tokens=24),
                       replace(exploration, stop_mixing_id=THINK_END), neighbor_table=table, seed=5)
    logp, _ = sequence_logprobs(ours, rollout, temperature=0.7)
    logp = logp[..., 0] if logp.dim() == 3 else logp  # a strategy scoring its candidates: log p(y) first
    mask = rollout.response_mask()
    assert rollout.mixed.any()
    assert (logp - rollout.logprobs)[mask].abs().max() < 1e-4


def bf16_copy(models):
    ours = copy.deepcopy(models[1]).to(torch.bfloat16)
    release_decoder(ours)
    return ours


@torch.no_grad()
@pytest.mark.parametrize("grouped", [False, True])
def test_flash_decode_attention_reads_each_rows_own_slots_and_equals_sdpa(grouped):
    """The variable-length FlashAttention kernel the bf16 decode step uses, in either layout: each row attends to
    its slots 0..position and to nothing after (noise written there changes nothing), as masked SDPA computes."""
    g = torch.Generator(device="cuda").manual_seed(0)
    S, M_, H, Hkv, D = 5, 200, 12, 2, 128
    q = torch.randn(S, H, D, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(S, M_, Hkv, D, device="cuda", generator=g).bfloat16() for _ in range(2))
    positions = torch.tensor([0, 7, 63, 150, 199], device="cuda")
    plan = kernels.flash_decode(S, M_, H // Hkv, grouped, "cuda")
    q_in = q.view(S, Hkv, H // Hkv, D).transpose(1, 2).contiguous() if grouped else q
    flash = kernels.decode_attention(q_in, k, v, positions, flash=plan)
    masked = kernels.decode_attention(q, k, v, positions, mask=torch.arange(M_, device="cuda") <= positions[:, None])
    assert (flash.float() - masked.float()).norm() / masked.float().norm() < 1e-2
    beyond = torch.arange(M_, device="cuda")[None, :] > positions[:, None]  # [S, M]
    k[beyond], v[beyond] = 100.0, -100.0
    assert torch.equal(kernels.decode_attention(q_in, k, v, positions, flash=plan), flash)


@torch.no_grad()
@pytest.mark.parametrize("grouped", [False, True])
def test_the_bf16_fast_step_matches_the_full_forward(models, grouped):
    """The bf16 decode step as rollouts run it on a GPU (inductor-compiled elementwise functions, fused q/k/v and
    gate/up, FlashAttention over each row's own length) against the full forward of the same bf16 weights."""
    ours = bf16_copy(models)
    kernels.fuse_projections(ours)
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, V, (n,), generator=g).cuda() for n in (3, 9, 17, 40)]
    S, max_len, steps = len(rows), 64, 6
    cache = ours.new_cache(S, max_len)
    ops = kernels.decode_ops("inductor")
    plan = kernels.flash_decode(S, max_len, 2, grouped, "cuda")  # 4 heads, 2 KV heads
    width = max(len(r) for r in rows)
    prompt_ids = torch.stack([torch.cat([r, r.new_zeros(width - len(r))]) for r in rows])
    ours.forward_hidden(prompt_ids, cache=cache, cache_pos=0)
    extra = torch.randint(0, V, (S, steps), generator=g).cuda()
    for t in range(steps):
        positions = torch.tensor([len(r) + t for r in rows], device="cuda")
        hidden = kernels.decode_hidden(ours, ours.embed_tokens(extra[:, t]), positions, cache, ops=ops, flash=plan)
        logits = torch.nn.functional.linear(hidden, ours.output_weight).float()
        for b, row in enumerate(rows):
            full = ours(torch.cat([row, extra[b, : t + 1]])[None])[0, -1].float()
            assert (logits[b] - full).norm() / full.norm() < 2e-2


@torch.no_grad()
def test_graphs_are_captured_once_and_reused_by_later_calls(models):
    """The bf16 graphed step serves every length: one capture for the first call, none for later calls of the
    same sampling settings (other prompts, seeds, lengths), whose rows equal a fresh decoder's."""
    ours = bf16_copy(models)
    table = build_neighbor_table(ours.output_weight, 1)
    kwargs = dict(sampling=Sampling(temperature=0.8, max_new_tokens=90, stop_ids=(0, 50)), neighbor_table=table,
                  exploration=Exploration("neighbor", mix_rate=0.3), slots=3)
    generate(ours, PROMPTS, seed=1, **kwargs)
    decoder = engine_decoder._DECODERS[ours]
    assert decoder.flash is not None and decoder.captures == 1
    later = generate(ours, [p[::-1] for p in PROMPTS[:4]] + [[9] * 30], seed=2, **kwargs)
    assert engine_decoder._DECODERS[ours] is decoder and decoder.captures == 1
    release_decoder(ours)
    fresh = generate(ours, [p[::-1] for p in PROMPTS[:4]] + [[9] * 30], seed=2, **kwargs)
    assert later.steps.keys() == fresh.steps.keys()
    for name, value in {"lengths": later.lengths, "finished": later.finished, **later.steps}.items():
        assert torch.equal(value, getattr(fresh, name)), name


@torch.no_grad()
def test_a_decode_step_never_waits_for_the_host(models):
    """Sampling, the mixing draw, stop checks and the record stay on the GPU: with CUDA's sync debug mode set to
    raise, eager decode steps (sampler and model, what a graph captures) run through."""
    ours = bf16_copy(models)
    table = build_neighbor_table(ours.output_weight, 1)
    sampling = Sampling(temperature=0.7, top_p=0.9, max_new_tokens=40, stop_ids=(3,))
    exploration = Exploration("neighbor", mix_rate=0.5, stop_mixing_id=7)
    generate(ours, PROMPTS, sampling, exploration, neighbor_table=table, cuda_graph=False)  # compiles, warms up
    decoder = engine_decoder._DECODERS[ours]
    key = (sampling, exploration)  # generate's key for the sampler it ran: kept by the decoder, not built again
    sampler = decoder.start(ours, key, lambda: Sampler(sampling, exploration, ours.embed_tokens.weight))
    sampler.begin(0, table)
    rows = torch.arange(len(PROMPTS), device="cuda")
    decoder.state.fill(rows, rows, rows, torch.full_like(rows, 4))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(engine_decoder.SYNC_EVERY):
            decoder.step(ours, key, 64)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert int(decoder.state.length.sum()) == len(PROMPTS) * engine_decoder.SYNC_EVERY


def test_the_steps_draws_and_token_choice_on_the_gpu_equal_the_cpus():
    """The decode step's draws compiled for the GPU (one kernel) are the CPU's bit for bit, and the two-level
    inverse CDF on the GPU picks the CPU's tokens, at the real vocabulary's size (151,936: 1,187 blocks)."""
    keys, positions = torch.arange(64) * 7 + 3, torch.arange(64) % 13
    seed = torch.tensor(seed_state((5, 2)))
    compiled = kernels.compiled_once(step_uniforms, "inductor")  # as the sampler's step runs it on a GPU
    on_gpu = compiled(seed.cuda(), keys.cuda(), positions.cuda())
    for gpu, cpu in zip(on_gpu, step_uniforms(seed, keys, positions)):
        assert torch.equal(gpu.cpu(), cpu)
    g = torch.Generator().manual_seed(0)
    probs = (torch.randn(64, 151_936, generator=g) * 3).softmax(-1)
    probs[:8, :50_000] = 0  # rows whose first blocks hold nothing
    uniforms = bits_to_uniform(torch.randint(-2**63, 2**63 - 1, (64,), generator=g))
    on_gpu = sample_tokens(probs.cuda(), uniforms.cuda()).cpu()
    assert torch.equal(on_gpu, sample_tokens(probs, uniforms))


def test_the_fused_log_prob_kernels_equal_the_log_softmax_path():
    """On a GPU engine.logprobs.token_logprobs runs compiled kernels (logprob_stats, logits_grad); their log-probs,
    entropies and gradients equal the CPU's log_softmax path on the same numbers (fp32), with a temperature and a
    last chunk shorter than the others."""
    g = torch.Generator().manual_seed(4)
    hidden, weight = torch.randn(3, 70, 32, generator=g), torch.randn(1000, 32, generator=g) * 0.3
    labels, upstream = torch.randint(0, 1000, (3, 70), generator=g), torch.randn(3, 70, generator=g)
    results = []
    for device in ("cpu", "cuda"):
        h, w = (t.to(device, copy=True).requires_grad_() for t in (hidden, weight))
        logp, entropy = token_logprobs(h, w, labels.to(device), temperature=0.7, chunk_tokens=64)
        (logp * upstream.to(device)).sum().backward()
        results.append([t.detach().cpu() for t in (logp, entropy, h.grad, w.grad)])
    for ours, reference in zip(*results):
        torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-4)


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
