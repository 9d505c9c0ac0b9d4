"""Low-rank adapters (runtime/lora.py, train.py --lora-rank), each checked against an independent reference: the
model without adapters, plain autograd through a merged weight, base + scale * B @ A computed here, PEFT and
transformers loading what we save, and an uninterrupted run for resume."""

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

import eval as E
import train
from config import preset
from model import TINY_CONFIG, load_model, random_model, save_model
from runtime import distributed, lora, plan

RANK, ALPHA = 4, 8.0


def adapted(seed: int = 0, *, b_seed: int | None = 1, **settings):
    """The tiny model with adapters on every default target; B drawn at random (as after training) unless b_seed
    is None (fresh: B = 0)."""
    model = random_model(TINY_CONFIG, seed=seed)
    lora.add_adapters(model, lora.LoraSettings(rank=RANK, alpha=ALPHA, **settings), seed=seed)
    if b_seed is not None:
        generator = torch.Generator().manual_seed(b_seed)
        with torch.no_grad():
            for layer in lora.adapted_layers(model).values():
                layer.lora_B.weight.normal_(0.0, 0.1, generator=generator)
    return model


def token_ids(seed: int = 0, shape=(2, 9)) -> torch.Tensor:
    return torch.randint(0, TINY_CONFIG.vocab_size, shape, generator=torch.Generator().manual_seed(seed))


def merged_by_hand(base: dict, adapters: dict, scale: float) -> dict:
    """{weight name: base + scale * B @ A} from a plain state dict and {`...q_proj.lora_A.weight`: A, ...}."""
    merged = dict(base)
    for name in adapters:
        if name.endswith(".lora_A.weight"):
            owner = name.removesuffix(".lora_A.weight")
            merged[owner + ".weight"] = base[owner + ".weight"] + scale * (adapters[owner + ".lora_B.weight"]
                                                                            @ adapters[name])
    return merged


# ----------------------------------------------------------------------------- the module


@torch.no_grad()
def test_fresh_adapters_leave_the_logits_exactly_as_they_were():
    base = random_model(TINY_CONFIG, seed=0)
    model = adapted(b_seed=None)
    ids = token_ids()
    assert torch.equal(model(ids), base(ids))
    assert len(lora.adapted_layers(model)) == 7 * TINY_CONFIG.num_layers


def test_only_the_adapters_train_and_their_gradients_equal_autograd_on_the_merged_weight():
    model = adapted()
    ids = token_ids()
    probe = torch.randn(2, 9, TINY_CONFIG.vocab_size, generator=torch.Generator().manual_seed(3))
    (model(ids) * probe).sum().backward()
    assert all(p.grad is None for name, p in model.named_parameters() if ".lora_" not in name)
    # The reference: a plain model whose projection weights are W + scale * B @ A, differentiated by autograd.
    plain = random_model(TINY_CONFIG, seed=0).requires_grad_(False)
    leaves = {name: p.detach().clone().requires_grad_(True) for name, p in lora.adapter_state(model).items()}
    weights = merged_by_hand(dict(plain.named_parameters()), leaves, ALPHA / RANK)
    (torch.func.functional_call(plain, weights, (ids,)) * probe).sum().backward()
    for name, param in lora.adapter_state(model).items():  # fp32 sums in another order: 1e-5 of the largest
        expected = leaves[name].grad
        torch.testing.assert_close(param.grad, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()), msg=name)
    assert any(leaves[name].grad.abs().sum() > 0 for name in leaves if "lora_A" in name)


@torch.no_grad()
def test_merged_weights_are_base_plus_scaled_BA_and_follow_every_refresh():
    model, base = adapted(), random_model(TINY_CONFIG, seed=0).state_dict()
    sampler = lora.merged_copy(model, dtype=torch.float32, device="cpu")
    for round_ in range(2):
        adapters = {name: p.clone() for name, p in lora.adapter_state(model).items()}
        expected = merged_by_hand(base, adapters, ALPHA / RANK)
        for name, value in sampler.state_dict().items():
            torch.testing.assert_close(value, expected[name], rtol=1e-6, atol=1e-7, msg=name)
        for param in lora.adapter_parameters(model):  # an optimizer step, then the refresh
            param.add_(0.01 * torch.randn(param.shape, generator=torch.Generator().manual_seed(round_)))
        lora.merge_into(model, sampler)
    assert not any(isinstance(m, lora.LoRALinear) for m in sampler.modules())


@torch.no_grad()
def test_adapters_off_is_the_base_model_for_the_kl_reference():
    model, base, ids = adapted(), random_model(TINY_CONFIG, seed=0), token_ids()
    assert not torch.equal(model(ids), base(ids))
    reference = lora.WithoutAdapters(distributed.ModelCall(model))
    assert torch.equal(distributed.run_model(reference, lambda m, x: m(x), ids), base(ids))
    assert not torch.equal(model(ids), base(ids))  # on again after the call


@torch.no_grad()
def test_adapters_load_back_and_refuse_another_shape(tmp_path):
    model, ids = adapted(), token_ids()
    lora.save_adapters(model, tmp_path)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == RANK and config["lora_alpha"] == ALPHA
    assert config["target_modules"] == list(lora.TARGETS) and config["task_type"] == "CAUSAL_LM"
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in load_file(
        tmp_path / "adapter_model.safetensors")
    again = adapted(b_seed=None)
    lora.load_adapters(again, tmp_path)
    assert torch.equal(again(ids), model(ids))
    other = random_model(TINY_CONFIG, seed=0)
    lora.add_adapters(other, lora.LoraSettings(rank=RANK * 2, alpha=ALPHA))
    with pytest.raises(ValueError, match=r"rank 4 \(saved\) vs 8"):
        lora.load_adapters(other, tmp_path)


def test_an_adapter_whose_base_moved_names_the_base_and_the_adapter(tmp_path):
    lora.save_adapters(adapted(base_model=str(tmp_path / "gone" / "base")), tmp_path / "adapter")
    with pytest.raises(FileNotFoundError) as error:
        lora.load_merged(tmp_path / "adapter")
    message = str(error.value)
    assert message.startswith(f"the base model of the adapter in {tmp_path / 'adapter'} (adapter_config.json's ")
    assert f"{tmp_path / 'gone' / 'base'}: no such checkpoint directory ({tmp_path}/ holds: adapter" in message


@torch.no_grad()
def test_saved_adapter_loads_in_peft_with_our_logits(tmp_path):
    peft = pytest.importorskip("peft", reason="peft is not installed (pip install peft): the PEFT format is unchecked")
    from transformers import AutoModelForCausalLM

    save_model(random_model(TINY_CONFIG, seed=0), tmp_path / "base")
    model, ids = adapted(dropout=0.1), token_ids()
    lora.save_adapters(model.eval(), tmp_path / "adapter")
    hf = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "base"),
                                        tmp_path / "adapter").eval()
    assert (hf(ids).logits - model(ids)).abs().max() < 1e-4
    with hf.disable_adapter():  # and PEFT's base is our base
        assert (hf(ids).logits - random_model(TINY_CONFIG, seed=0)(ids)).abs().max() < 1e-4


@torch.no_grad()
def test_merged_export_loads_in_transformers_with_the_same_logits(tmp_path):
    from transformers import AutoModelForCausalLM

    model, ids = adapted(), token_ids()
    lora.export_merged(model, tmp_path)
    assert not (tmp_path / "adapter_config.json").exists()
    hf = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert (hf(ids).logits - model(ids)).abs().max() < 1e-4


# ----------------------------------------------------------------------------- the flags


@pytest.mark.parametrize("overrides, message", [
    (dict(lora_rank=-1), "--lora-rank -1: must be >= 0"),
    (dict(lora_rank=8, lora_alpha=0.0), "--lora-alpha 0.0: must be > 0"),
    (dict(lora_rank=8, lora_dropout=1.0), r"--lora-dropout 1.0: must be in \[0, 1\)"),
    (dict(lora_rank=8, lora_targets="q_proj,qkv_proj"), "--lora-targets q_proj,qkv_proj: names 'qkv_proj', not a "
                                                         "projection adapters can wrap; choose among q_proj"),
    (dict(lora_rank=8, lora_targets="q_proj,"), "names '', not a projection"),
])
def test_bad_lora_settings_are_one_message(overrides, message):
    with pytest.raises(ValueError, match=message):
        replace(preset("tiny"), **overrides)


def test_lora_settings_without_a_rank_are_refused(capsys):
    with pytest.raises(SystemExit):
        train.parse_config(["--preset", "tiny", "--lora-alpha", "32"])
    assert "--lora-alpha 32: has no effect without --lora-rank N" in capsys.readouterr().err


# ----------------------------------------------------------------------------- --plan


@pytest.mark.parametrize("targets", ["q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", "v_proj,q_proj"])
def test_the_plan_counts_the_adapters_that_add_adapters_makes(targets):
    model = random_model(TINY_CONFIG, seed=0)
    names = tuple(t for t in lora.TARGETS if t in targets.split(","))
    params = lora.add_adapters(model, lora.LoraSettings(rank=8, alpha=16.0, targets=names))
    assert plan.adapter_count(TINY_CONFIG, 8, targets) == sum(p.numel() for p in params)


def test_the_7b_with_adapters_fits_one_80_gb_gpu_where_full_fine_tuning_does_not(shared_data):
    mc = plan.model_config(str(shared_data / "configs" / "DeepSeek-R1-Distill-Qwen-7B"))
    full = plan.plan_memory(preset("paper-7b"), mc, gpus=1, gpu_gb=80)
    adapted_7b = plan.plan_memory(replace(preset("paper-7b"), lora_rank=64, lora_alpha=128.0), mc, gpus=1, gpu_gb=80)
    assert not full.fits and adapted_7b.fits
    refusal = plan.refusal(preset("paper-7b"), mc, full)  # what --plan prints: the adapters offered
    assert refusal.endswith("; or on this GPU with low-rank adapters, --lora-rank 64 --lora-alpha 128 (docs/lora.md; "
                            "the paper's results are full fine-tuning)"), refusal
    rows = {row.name.split(",")[0]: row for row in adapted_7b.rows}
    assert rows["frozen base weights"].rollout == 2 * plan.count_params(mc).total  # bf16, the only base copy
    assert "reference model" not in rows and "fp32 weights" not in rows
    assert rows["AdamW moments"].rollout == 8 * plan.adapter_count(mc, 64, preset("paper-7b").lora_targets)
    # under torchrun the base and the adapters are sharded with FSDP2: each of 4 GPUs holds a quarter
    four = plan.plan_memory(replace(preset("paper-7b"), lora_rank=64, lora_alpha=128.0), mc, gpus=4, gpu_gb=80)
    shards = {row.name.split(",")[0]: row for row in four.rows}
    assert shards["frozen base weights"].rollout == 2 * plan.count_params(mc).total // 4
    assert shards["AdamW moments"].rollout == rows["AdamW moments"].rollout // 4
    assert four.peak_bytes < adapted_7b.peak_bytes


# ----------------------------------------------------------------------------- train.py --lora-rank


def tiny_lora(tmp_path, **overrides):
    """The tiny preset with adapters, small and quick, with a gradient that a random model's zero rewards do not
    zero out (the entropy bonus) and a KL reference."""
    base = dict(out_dir=str(tmp_path / "run"), prompts_per_step=4, mini_batch_prompts=2, micro_batch_size=8,
                max_new_tokens=12, max_steps=2, lora_rank=8, lora_alpha=16.0, lora_dropout=0.1, entropy_coef=0.1,
                kl_coef=0.01)
    return replace(preset("tiny"), **{**base, **overrides})


def test_a_lora_run_trains_the_adapters_alone_and_samples_with_merged_weights(tmp_path, one_thread):
    r, start, _ = train.begin(tiny_lora(tmp_path), distributed.World())
    try:
        for step in range(2):
            train.train_on(r, train.collect_groups(r, step), step, 2)
    finally:
        r.pool.close()
    held = {id(p) for group in r.optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for p in lora.adapter_parameters(r.policy)}
    fresh = load_model("tiny", dtype=torch.float32, device="cpu", seed=0).state_dict()
    for name, value in r.policy.state_dict().items():
        if ".lora_" not in name:
            assert torch.equal(value, fresh[name]), name  # the base, bit for bit
    assert any(p.abs().sum() > 0 for name, p in lora.adapter_state(r.policy).items() if "lora_B" in name)
    expected = merged_by_hand(fresh, {n: p.detach() for n, p in lora.adapter_state(r.policy).items()}, 16.0 / 8)
    for name, value in r.sampler.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=1e-6, atol=1e-7, msg=name)
    assert isinstance(r.reference, lora.WithoutAdapters) and r.reference.model.model is r.policy


def test_lora_resume_continues_exactly_and_the_checkpoint_exports_merged(tmp_path, one_thread):
    straight = tiny_lora(tmp_path, out_dir=str(tmp_path / "straight"), max_steps=4, save_every=2)
    train.run(straight)
    cut = tiny_lora(tmp_path, out_dir=str(tmp_path / "cut"), max_steps=2, save_every=2)
    train.run(cut)
    train.run(replace(cut, max_steps=4, resume=True))
    metrics = [[{k: v for k, v in json.loads(line).items() if not k.endswith(("_s", "_per_s"))}
                for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()] for run in ("straight", "cut")]
    assert metrics[0] == metrics[1] and len(metrics[0]) == 4
    step4 = [tmp_path / run / "checkpoints" / "step-4" for run in ("straight", "cut")]
    a, b = (load_file(path / "adapter_model.safetensors") for path in step4)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not list(step4[0].glob("model*.safetensors"))  # the adapters alone, not the base
    # The documented export: the checkpoint merged into its base, as a plain Hugging Face checkpoint.
    lora.main([str(step4[0]), str(tmp_path / "merged")])
    merged = load_model(str(tmp_path / "merged"), dtype=torch.float32, device="cpu").state_dict()
    base = load_model("tiny", dtype=torch.float32, device="cpu", seed=0).state_dict()
    adapters = {k.removeprefix(lora.PEFT_PREFIX): v for k, v in a.items()}
    expected = merged_by_hand(base, adapters, 16.0 / 8)
    for name, value in merged.items():
        torch.testing.assert_close(value, expected[name], rtol=1e-6, atol=1e-7, msg=name)
    # eval.py takes either: the checkpoint itself (merged as it loads) scores exactly as its merged export.
    flags = ["--benchmarks", "arith", "--limit", "3", "--n", "2", "--max-new-tokens", "8", "--instruction", ""]
    for name, model in (("adapter", step4[0]), ("export", tmp_path / "merged")):
        E.main(["--model", str(model), "--tokenizer", "tiny", *flags, "--out-dir", str(tmp_path / f"eval-{name}")])
    for name in ("results.json", "samples.jsonl"):
        assert (tmp_path / "eval-adapter" / name).read_text() == (tmp_path / "eval-export" / name).read_text()
