"""model.py against transformers' own implementation: same weights, same fp32 logits.

transformers is the oracle throughout: its models are built from random-weight configs of each family,
saved with `save_pretrained`, loaded with our `load_model`, and compared logit for logit."""

import copy
import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

import model as M
from engine import kernels

TOL = 1e-4
COMMON = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=4096, rms_norm_eps=1e-6)


def hf_config(family: str):
    if family == "qwen2":  # R1-Distill: q/k/v bias, untied embeddings, grouped KV heads
        return Qwen2Config(**COMMON, num_key_value_heads=2, tie_word_embeddings=False, rope_theta=10000.0)
    if family == "qwen3":  # q/k RMSNorm, head_dim not hidden/heads, tied embeddings
        return Qwen3Config(**COMMON, num_key_value_heads=2, head_dim=24, tie_word_embeddings=True,
                           attention_bias=False, rope_theta=1e6)
    # Llama-3: llama3 RoPE scaling; a short original context puts frequencies in every band of the remap.
    # (Legacy rope_theta / rope_scaling keywords: transformers 4.x and 5.x both take them.)
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}
    return LlamaConfig(**COMMON, num_key_value_heads=1, tie_word_embeddings=True, rope_theta=500000.0,
                       rope_scaling=rope)


FAMILIES = ["qwen2", "qwen3", "llama"]


def make_hf_model(family: str, seed: int = 0):
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(hf_config(family), attn_implementation="eager").eval()
    with torch.no_grad():  # non-trivial norms and biases, so a mixed-up or missing one shows
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if name.endswith("norm.weight") else 0.0))
    return hf


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tmp_path_factory):
    """(transformers model, our model loaded from its save_pretrained directory, directory)."""
    family = request.param
    hf = make_hf_model(family)
    path = tmp_path_factory.mktemp(family)
    # qwen2 is saved in several shards with an index; the others as one file.
    hf.save_pretrained(path, max_shard_size="40KB" if family == "qwen2" else "5GB")
    ours = M.load_model(str(path), dtype=torch.float32, device="cpu").eval()
    return hf, ours, path


def left_padded_batch(lengths, vocab, seed=1):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.zeros(len(lengths), T, dtype=torch.long)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, T - n:] = torch.randint(0, vocab, (n,), generator=g)
        mask[row, T - n:] = 1
    return ids, mask


def hf_positions(mask):
    return (mask.cumsum(-1) - 1).clamp(min=0)


def test_sharded_checkpoint_was_written(pair):
    hf, _, path = pair
    if hf.config.model_type == "qwen2":
        assert (path / "model.safetensors.index.json").exists()
        assert len(list(path.glob("model-*.safetensors"))) > 1


@torch.no_grad()
def test_logits_match_transformers(pair):
    hf, ours, _ = pair
    ids = torch.randint(0, 101, (2, 17), generator=torch.Generator().manual_seed(0))
    expected = hf(ids).logits
    actual = ours(ids)
    assert actual.shape == expected.shape == (2, 17, 101)
    assert (actual - expected).abs().max() < TOL


@torch.no_grad()
def test_left_padded_batch_matches_transformers(pair):
    hf, ours, _ = pair
    ids, mask = left_padded_batch([5, 12, 1, 9], vocab=101)
    expected = hf(ids, attention_mask=mask, position_ids=hf_positions(mask)).logits
    actual = ours(ids, attention_mask=mask)  # positions derived from the mask
    real = mask.bool()
    assert (actual[real] - expected[real]).abs().max() < TOL
    assert torch.isfinite(actual).all()
    # Each row also equals that row run alone, unpadded.
    for row in range(ids.shape[0]):
        alone = hf(ids[row][real[row]][None]).logits[0]
        assert (actual[row][real[row]] - alone).abs().max() < TOL


@torch.no_grad()
def test_explicit_positions_and_embeddings_match_transformers(pair):
    hf, ours, _ = pair
    g = torch.Generator().manual_seed(3)
    embeds = torch.randn(2, 8, 64, generator=g) * 0.05
    positions = torch.arange(8).expand(2, 8) + torch.tensor([[1000], [3000]])  # beyond the llama3 original context
    expected = hf(inputs_embeds=embeds, position_ids=positions).logits
    actual = ours(inputs_embeds=embeds, positions=positions)
    assert (actual - expected).abs().max() < TOL


@torch.no_grad()
def test_forward_hidden_projects_to_the_logits(pair):
    hf, ours, _ = pair
    ids = torch.randint(0, 101, (1, 6), generator=torch.Generator().manual_seed(4))
    hidden = hf(ids, output_hidden_states=True).hidden_states[-1]  # transformers' last entry is post-norm
    assert (ours.forward_hidden(ids) - hidden).abs().max() < TOL


@torch.no_grad()
@pytest.mark.parametrize("feed", ["ids", "embeds"])
def test_kv_cache_decode_matches_full_forward(pair, feed):
    """Prefill a left-padded batch once, then decode one position at a time through the static cache."""
    hf, ours, _ = pair
    prompt_ids, prompt_mask = left_padded_batch([4, 7, 2], vocab=101, seed=5)
    B, P = prompt_ids.shape
    steps = 6
    g = torch.Generator().manual_seed(6)
    new_ids = torch.randint(0, 101, (B, steps), generator=g)
    # The embeddings variant feeds mixtures of embedding rows, as the N-GRPO sampler does.
    weights = torch.softmax(torch.randn(B, steps, 3, generator=g), -1)
    cand = torch.randint(0, 101, (B, steps, 3), generator=g)
    new_embeds = (weights[..., None] * hf.get_input_embeddings().weight[cand]).sum(-2)  # [B, steps, d]

    mask = torch.cat([prompt_mask, torch.ones(B, steps, dtype=torch.long)], 1)
    prompt_embeds = hf.get_input_embeddings()(prompt_ids)
    full_embeds = torch.cat([prompt_embeds, new_embeds if feed == "embeds" else hf.get_input_embeddings()(new_ids)], 1)
    expected = hf(inputs_embeds=full_embeds, attention_mask=mask, position_ids=hf_positions(mask)).logits

    cache = ours.new_cache(B, P + steps + 3)  # longer than needed: unused slots must not matter
    logits = ours(prompt_ids, attention_mask=prompt_mask, cache=cache, cache_pos=0)
    real = prompt_mask.bool()
    assert (logits[real] - expected[:, :P][real]).abs().max() < TOL
    for t in range(steps):
        step_mask = mask[:, : P + t + 1]
        if feed == "ids":
            logits = ours(new_ids[:, t : t + 1], attention_mask=step_mask, cache=cache, cache_pos=P + t)
        else:
            logits = ours(inputs_embeds=new_embeds[:, t : t + 1], attention_mask=step_mask, cache=cache,
                          cache_pos=P + t)
        assert (logits[:, 0] - expected[:, P + t]).abs().max() < TOL


@torch.no_grad()
def test_fixed_shape_decode_step_matches_full_forward(pair):
    """The CUDA-graph form of a step: the mask spans the whole cache and the slot is a tensor."""
    hf, ours, _ = pair
    ids, mask = left_padded_batch([3, 6], vocab=101, seed=7)
    B, T = ids.shape
    expected = hf(ids, attention_mask=mask, position_ids=hf_positions(mask)).logits
    max_len = T + 4
    cache = ours.new_cache(B, max_len)
    key_mask = torch.zeros(B, max_len, dtype=torch.long)
    for t in range(T):
        key_mask[:, t] = mask[:, t]
        positions = (key_mask.cumsum(-1) - 1).clamp(min=0)[:, t : t + 1]
        logits = ours(ids[:, t : t + 1], positions=positions, attention_mask=key_mask, cache=cache,
                      cache_pos=torch.tensor(t))
        real = mask[:, t].bool()
        assert (logits[real, 0] - expected[real, t]).abs().max() < TOL


@torch.no_grad()
def test_decode_step_takes_the_attention_output_in_any_memory_layout(pair, monkeypatch):
    """CUDA's fp32 attention kernel returns its output with the head axes strided (not contiguous); the
    decode step must not assume the layout the CPU kernel happens to return (it did: `.view` failed on an
    H200). Here the kernel's output is handed back in such a layout, and the step still equals transformers."""
    hf, ours, _ = pair
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def strided(*args, **kwargs):  # same values, heads and groups transposed in memory
        out = sdpa(*args, **kwargs)
        return out.transpose(1, 2).contiguous().transpose(1, 2)

    monkeypatch.setattr(M.F, "scaled_dot_product_attention", strided)
    ids = torch.randint(0, 101, (2, 6), generator=torch.Generator().manual_seed(3))
    expected = hf(ids).logits
    cache = ours.new_cache(2, 8)
    ours.forward_hidden(ids[:, :5], cache=cache, cache_pos=0)
    positions = torch.full((2,), 5)
    logits = ours(ids[:, 5:6], positions=positions[:, None], cache=cache, cache_pos=positions, window=8)
    assert (logits[:, 0] - expected[:, 5]).abs().max() < TOL


@torch.no_grad()
def test_per_row_cache_positions_match_each_rows_full_forward(pair):
    """The refill engine's step: unpadded rows of different lengths, each prefilled into its own slot
    (right-padded, causal), then decoding at its own position over a window of the cache. Slots past a
    row's position hold stale values (here: noise) that must not matter."""
    hf, ours, _ = pair
    g = torch.Generator().manual_seed(12)
    lengths, steps, max_len = [2, 5, 3], 4, 16  # positions stay below the window of 12
    rows = [torch.randint(0, 101, (n + steps,), generator=g) for n in lengths]
    cache = ours.new_cache(len(rows), max_len)
    cache.k.normal_(generator=g), cache.v.normal_(generator=g)
    width = max(lengths)
    prompt_ids = torch.stack([torch.cat([r[:n], r.new_zeros(width - n)]) for r, n in zip(rows, lengths)])
    ours.forward_hidden(prompt_ids, cache=cache, cache_pos=0)  # right padding: causal is exact for real tokens
    for t in range(steps):
        positions = torch.tensor(lengths) + t  # [B]: where each row's next token goes
        step_ids = torch.stack([r[n + t] for r, n in zip(rows, lengths)])[:, None]
        logits = ours(step_ids, positions=positions[:, None], cache=cache, cache_pos=positions, window=12)
        for b, (row, n) in enumerate(zip(rows, lengths)):
            expected = hf(row[None, : n + t + 1]).logits[0, -1]
            assert (logits[b, 0] - expected).abs().max() < TOL


def decode_rows(ours, rows, lengths, steps: int, max_len: int, window: int | None, fuse: bool = False):
    """decode_hidden's logits for `steps` steps of each row after its prompt (rows of different lengths, each
    prefilled into its own cache row, stale noise past its position): [steps, B, V]."""
    g = torch.Generator().manual_seed(12)
    cache = ours.new_cache(len(rows), max_len)
    cache.k.normal_(generator=g), cache.v.normal_(generator=g)
    width = max(lengths)
    prompt_ids = torch.stack([torch.cat([r[:n], r.new_zeros(width - n)]) for r, n in zip(rows, lengths)])
    ours.forward_hidden(prompt_ids, cache=cache, cache_pos=0)
    if fuse:
        ours = copy.deepcopy(ours)  # the module's model stays as loaded
        kernels.fuse_projections(ours)
    out = []
    for t in range(steps):
        positions = torch.tensor(lengths) + t
        inputs = ours.embed_tokens(torch.stack([r[n + t] for r, n in zip(rows, lengths)]))
        hidden = kernels.decode_hidden(ours, inputs, positions, cache, ops=kernels.decode_ops(None), window=window)
        out.append(torch.nn.functional.linear(hidden, ours.output_weight))
    return torch.stack(out)


@torch.no_grad()
@pytest.mark.parametrize("fuse", [False, True])
def test_the_samplers_decode_step_matches_each_rows_full_forward(pair, fuse):
    """decode_hidden (the step the sampler's graphs capture): each row at its own position of its own cache row,
    over a window of the cache; with q/k/v and gate/up fused into one matrix each, the same numbers."""
    hf, ours, _ = pair
    g = torch.Generator().manual_seed(13)
    lengths, steps = [2, 5, 3], 4
    rows = [torch.randint(0, 101, (n + steps,), generator=g) for n in lengths]
    logits = decode_rows(ours, rows, lengths, steps, max_len=16, window=12, fuse=fuse)
    for t in range(steps):
        for b, (row, n) in enumerate(zip(rows, lengths)):
            expected = hf(row[None, : n + t + 1]).logits[0, -1]
            assert (logits[t, b] - expected).abs().max() < TOL


@torch.no_grad()
def test_fused_projections_keep_names_and_values_and_follow_in_place_writes():
    """fuse_projections makes the separate layers views of one matrix: the state_dict is the same, a write into a
    layer's weight (the sampler copy's refresh) is a write into the fused matrix, and a replaced parameter is
    noticed and fused again."""
    hf = make_hf_model("qwen2", seed=3)
    ours = M.Transformer(M.ModelConfig.from_hf(hf.config.to_dict()))
    ours.load_state_dict({k.removeprefix("model."): v for k, v in hf.state_dict().items()})
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    assert kernels.fuse_projections(ours) and not kernels.fuse_projections(ours)  # the second call finds it fused
    after = ours.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    attn = ours.layers[1].self_attn
    q, k, v = attn.qkv[0].split(attn.qkv_sizes)
    assert torch.equal(k, before["layers.1.self_attn.k_proj.weight"])
    attn.k_proj.weight.copy_(torch.full_like(attn.k_proj.weight, 0.5))  # an in-place refresh
    assert bool((attn.qkv[0].split(attn.qkv_sizes)[1] == 0.5).all())
    attn.v_proj.weight = torch.nn.Parameter(torch.zeros_like(attn.v_proj.weight))  # a replacement
    assert kernels.fuse_projections(ours)
    assert bool((attn.qkv[0].split(attn.qkv_sizes)[2] == 0).all())
    assert torch.equal(attn.qkv[0].split(attn.qkv_sizes)[0], before["layers.1.self_attn.q_proj.weight"])


@torch.no_grad()
def test_other_transformers_config_spelling_loads_the_same(pair, tmp_path):
    """config.json in the other major version's spelling (4.x: rope_theta / rope_scaling; 5.x: rope_parameters)
    gives the same model."""
    hf, ours, path = pair
    config = json.loads((path / "config.json").read_text())
    if "rope_parameters" in config:  # written by transformers 5.x: rewrite as 4.x would
        rope = config.pop("rope_parameters")
        config["rope_theta"] = rope.pop("rope_theta")
        config["rope_scaling"] = rope if rope["rope_type"] != "default" else None
    else:  # written by 4.x: rewrite as 5.x would
        config["rope_parameters"] = {"rope_type": "default", **(config.pop("rope_scaling") or {}),
                                     "rope_theta": config.pop("rope_theta")}
    for file in path.iterdir():
        (tmp_path / file.name).write_bytes(file.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(config))
    again = M.load_model(str(tmp_path), dtype=torch.float32, device="cpu")
    assert again.cfg == ours.cfg
    ids = torch.randint(0, 101, (1, 9), generator=torch.Generator().manual_seed(8))
    assert (again(ids) - hf(ids).logits).abs().max() < TOL


@torch.no_grad()
@pytest.mark.parametrize("max_shard_bytes", [5 * 2**30, 30_000])
def test_save_model_loads_in_transformers(pair, tmp_path, max_shard_bytes):
    hf, ours, _ = pair
    M.save_model(ours, tmp_path, max_shard_bytes=max_shard_bytes)
    if max_shard_bytes < 2**20:
        assert (tmp_path / "model.safetensors.index.json").exists()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert reloaded.config.model_type == hf.config.model_type
    ids = torch.randint(0, 101, (2, 11), generator=torch.Generator().manual_seed(9))
    assert (reloaded(ids).logits - hf(ids).logits).abs().max() < TOL


@torch.no_grad()
def test_tiny_preset_round_trips_through_transformers(tmp_path):
    ours = M.load_model("tiny", dtype=torch.float32, device="cpu")
    assert ours.cfg.family == "qwen2" and ours.cfg.hidden_size == 64 and ours.cfg.num_layers == 2
    M.save_model(ours, tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, ours.cfg.vocab_size, (2, 10), generator=torch.Generator().manual_seed(10))
    assert (reloaded(ids).logits - ours(ids)).abs().max() < TOL


def test_tiny_preset_is_seeded():
    a = M.load_model("tiny", dtype=torch.float32, device="cpu")
    b = M.load_model("tiny", dtype=torch.float32, device="cpu")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_random_model_built_on_meta_equals_one_built_in_memory(family, dtype):
    # random_model builds on the meta device and then gives the model empty memory: every value must be
    # drawn by init_weights (a missed one would be garbage). Reference: the model built the ordinary way.
    cfg = M.ModelConfig.from_hf(hf_config(family).to_dict())
    reference = M.init_weights(M.Transformer(cfg).to(dtype), seed=3)
    ours = M.random_model(cfg, dtype=dtype, seed=3)
    assert ours.state_dict().keys() == reference.state_dict().keys()
    for name, tensor in reference.state_dict().items():
        assert ours.state_dict()[name].dtype == dtype and torch.equal(ours.state_dict()[name], tensor), name


def test_load_model_casts_to_the_requested_dtype(pair):
    _, _, path = pair
    model = M.load_model(str(path), dtype=torch.bfloat16, device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert all(p.device.type == "cpu" for p in model.parameters())


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel.*Qwen2ForCausalLM.*Qwen3ForCausalLM.*LlamaForCausalLM"):
        M.load_model(str(tmp_path), device="cpu")


def test_missing_weights_are_named(pair, tmp_path):
    from safetensors.torch import load_file, save_file

    _, _, path = pair
    state = {}
    for file in path.glob("*.safetensors"):
        state.update(load_file(file))
    state.pop("model.norm.weight")
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_bytes((path / "config.json").read_bytes())
    with pytest.raises(ValueError, match="norm.weight"):
        M.load_model(str(tmp_path), device="cpu")


def test_hub_id_is_resolved_through_huggingface_hub(pair, monkeypatch):
    import huggingface_hub

    hf, _, path = pair
    asked = []

    def fake_snapshot_download(repo_id, **kwargs):
        asked.append(repo_id)
        return str(path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    model = M.load_model("some-org/some-model", dtype=torch.float32, device="cpu")
    assert asked == ["some-org/some-model"]
    ids = torch.arange(7)[None]
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() < TOL


def test_nonexistent_local_path_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="no such checkpoint directory.*nor a hub id"):
        M.load_model("./no/such/dir", device="cpu")


REAL_CONFIGS = {
    "DeepSeek-R1-Distill-Qwen-1.5B": "tokenizers/DeepSeek-R1-Distill-Qwen-1.5B/config.json",
    "DeepSeek-R1-Distill-Qwen-7B": "configs/DeepSeek-R1-Distill-Qwen-7B/config.json",
    "Llama-3.2-1B": "configs/Llama-3.2-1B/config.json",
    "Qwen3-1.7B-Base": "configs/Qwen3-1.7B-Base/config.json",
}


@pytest.mark.parametrize("name", sorted(REAL_CONFIGS))
def test_real_architectures_have_transformers_parameter_counts(shared_data, name):
    path = shared_data / REAL_CONFIGS[name]
    cfg = M.ModelConfig.from_hf(json.loads(path.read_text()))
    with torch.device("meta"):
        ours = M.Transformer(cfg)
        theirs = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path.parent))
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters())
    if name == "DeepSeek-R1-Distill-Qwen-1.5B":
        assert count == 1_777_088_000


def test_rope_frequencies_match_transformers():
    """Our llama3 remap against transformers' own rope initialisation function (no model in between)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = hf_config("llama")
    config.head_dim = 64
    cfg = M.ModelConfig.from_hf(config.to_dict())
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    assert torch.allclose(M.rope_inv_freq(cfg), expected.float(), rtol=1e-6, atol=0)


def test_gradient_checkpointing_gives_the_same_gradients():
    def grads(checkpointing: bool):
        model = M.load_model("tiny", dtype=torch.float32, device="cpu").train()
        model.gradient_checkpointing = checkpointing
        ids = torch.randint(0, 262, (2, 12), generator=torch.Generator().manual_seed(11))
        model(ids).logsumexp(-1).sum().backward()
        return [p.grad for p in model.parameters()]

    for a, b in zip(grads(False), grads(True)):
        assert torch.allclose(a, b, atol=1e-6)

