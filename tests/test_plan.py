"""runtime/plan.py, the memory plan: against hand counts of a small config, against memory measured on the CPU at two
shapes, and as train.py's `--plan` and its check before loading."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import train
from config import Config, preset
from engine.decoder import decoder_for, release_decoder
from model import ModelConfig, Transformer
from runtime import plan

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20

# A small R1-Distill-shaped config (q/k/v bias, untied output). By hand: embedding and output matrix 1,000 x 64
# each; a block: q 64x64+64, k and v 64x32+32 each, o 64x64, gate/up/down 3 x 64x128, two norms of 64: 37,120;
# two blocks and the final norm: 128,000 + 74,240 + 64 = 202,304 parameters.
SMALL = ModelConfig(family="qwen2", vocab_size=1000, hidden_size=64, intermediate_size=128, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=16, qkv_bias=True)
SMALL_PARAMS = 202_304
SMALL_BLOCK = 37_120


def small_cfg(**overrides) -> Config:
    values = dict(model="tiny", prompts_per_step=8, mini_batch_prompts=8, group_size=4, rollout_batch_size=16,
                  max_prompt_tokens=100, max_new_tokens=156, kl_coef=0.01, freeze_embeddings=False, micro_batch_size=2)
    return replace(Config(), **{**values, **overrides})


def rows_of(p: plan.Plan) -> dict:
    return {row.name.split(",")[0].split(" (")[0].split(":")[0]: row for row in p.rows}


def test_parameter_counts_equal_a_hand_count():
    counted = plan.count_params(SMALL)
    assert (counted.total, counted.block, counted.embed) == (SMALL_PARAMS, SMALL_BLOCK, 64_000)
    assert counted.root == 64_000 + 64_000 + 64


def test_one_gpu_holds_everything_whole():
    rows = rows_of(plan.plan_memory(small_cfg(), SMALL, gpus=1, device="cuda"))
    assert rows["fp32 weights"].rollout == 4 * SMALL_PARAMS
    assert rows["fp32 gradients"].update == 4 * SMALL_PARAMS
    assert rows["AdamW moments"].update == 8 * SMALL_PARAMS
    assert rows["sampler copy"].rollout == 2 * SMALL_PARAMS  # bf16
    assert rows["reference model"].rollout == 2 * SMALL_PARAMS
    # K and V, 2 layers x 2 KV heads x 16 dims, bf16, for 16 rows of 100 + 156 tokens.
    assert rows["KV cache"].rollout == 2 * 2 * 2 * 16 * 2 * 16 * 256
    assert rows["KV cache"].update == 0


def test_sharded_state_divides_by_the_gpus_and_the_sampler_does_not():
    rows = rows_of(plan.plan_memory(small_cfg(freeze_embeddings=True), SMALL, gpus=4, device="cuda"))
    trainable = SMALL_PARAMS - 64_000  # the input embedding frozen
    assert rows["fp32 weights"].rollout == 4 * SMALL_PARAMS // 4
    assert rows["fp32 gradients"].update == 4 * trainable // 4
    assert rows["fp32 gradients"].rollout == 0  # freed when the update ends (ngrpo.optimize)
    assert rows["AdamW moments"].rollout == 8 * trainable // 4
    assert rows["reference model"].rollout == 2 * SMALL_PARAMS // 4  # sharded like the policy
    assert rows["sampler copy"].rollout == 2 * SMALL_PARAMS  # each rank decodes with a whole bf16 copy


def test_one_cpu_samples_with_the_policy_and_keeps_the_reference_in_fp32():
    rows = rows_of(plan.plan_memory(small_cfg(), SMALL, gpus=1, device="cpu"))
    assert "sampler copy" not in rows
    assert rows["reference model"].rollout == 4 * SMALL_PARAMS
    assert rows["KV cache"].rollout == 2 * 2 * 2 * 16 * 4 * 16 * 256  # fp32


def test_kv_cache_row_is_what_the_sampler_allocates():
    p = plan.plan_memory(small_cfg(), SMALL, gpus=1, device="cpu", prompt_tokens=40)
    with torch.device("meta"):
        model = Transformer(SMALL)
    cache = decoder_for(model, 16, 40 + 156, cuda_graph=False).cache  # as generate allocates it
    release_decoder(model)
    allocated = cache.k.numel() * cache.k.element_size() + cache.v.numel() * cache.v.element_size()
    assert rows_of(p)["KV cache"].rollout == allocated


def test_no_checkpointing_holds_every_block():
    on = plan.activation_bytes(small_cfg(), SMALL, "cpu", False, 100)
    off = plan.activation_bytes(small_cfg(grad_checkpointing=False), SMALL, "cpu", False, 100)
    assert off > 5 * on


MEASURE = r"""
import json, sys
from dataclasses import replace
from pathlib import Path
import torch
torch.set_num_threads(2)
from config import Config
from model import ModelConfig, random_model
from replay import sequence_logprobs
from rollout import Rollout
from runtime import lora, plan
from benchmarks.common import rss_mb

d, inter, layers, V, rows, P, T, checkpointing, chunk, rank = json.loads(sys.argv[1])
mc = ModelConfig(family="qwen2", vocab_size=V, hidden_size=d, intermediate_size=inter, num_layers=layers,
                 num_heads=d // 64, num_kv_heads=2, head_dim=64, qkv_bias=True)
cfg = replace(Config(), model="tiny", micro_batch_size=rows, max_prompt_tokens=P, max_new_tokens=T,
              grad_checkpointing=checkpointing, logprob_chunk_tokens=chunk, freeze_embeddings=True, lora_rank=rank)
model = random_model(mc).train()
model.gradient_checkpointing = checkpointing
model.embed_tokens.weight.requires_grad_(False)
if rank:  # --lora-rank: every weight frozen, the output matrix included; B drawn non-zero so that A gets a gradient
    lora.add_adapters(model, lora.LoraSettings(rank=rank, alpha=2.0 * rank))
    for p in lora.adapter_parameters(model):
        torch.nn.init.normal_(p, std=0.02)
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(0, V, (P,), generator=g).tolist() for _ in range(rows)]
cand_ids = torch.randint(0, V, (rows, T, 2), generator=g)
weights = torch.softmax(torch.randn(rows, T, 2, generator=g), -1)

steps = dict(response_ids=cand_ids[..., 0], logprobs=torch.zeros(rows, T), cand_ids=cand_ids, cand_weights=weights,
             mixed=torch.ones(rows, T, dtype=torch.bool))
record = Rollout(prompts, torch.full((rows,), T), torch.ones(rows, dtype=torch.bool), steps, "neighbor")

def step():
    logp, _ = sequence_logprobs(model, record, chunk_tokens=chunk)
    (-logp.mean()).backward()

step()  # .grad exists from here on, as in every micro-batch after a mini-batch's first
Path("/proc/self/clear_refs").write_text("5")
before = rss_mb("VmRSS")
step()
print(json.dumps({"measured": (rss_mb("VmHWM") - before) * 2**20,
                  "predicted": plan.activation_bytes(cfg, mc, "cpu", False, P)
                  + plan.backward_peak_bytes(cfg, mc, "cpu", False, P)}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to measure peak RSS")
@pytest.mark.parametrize("shape", [
    [256, 1024, 2, 4096, 2, 64, 448, False, 256, 0],  # every block's tensors held: ~70 MB
    [512, 2048, 2, 8192, 2, 128, 896, True, 512, 0],  # checkpointed: the log-prob chunk's backward dominates, ~140 MB
    [1024, 2048, 1, 32768, 2, 32, 128, True, 256, 16],  # rank-16 adapters: no gradient of the [V, d] output matrix
])
def test_update_memory_matches_the_peak_measured_on_the_cpu(shape):
    """One forward + backward of the update's replay path in a fresh process whose large buffers are each their
    own mapping (RSS follows live memory): the peak RSS it adds agrees with the plan within 25%."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="2", PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(shape)], env=env, cwd=ROOT,
                            capture_output=True, text=True, check=True)
    figures = json.loads(result.stdout)
    assert figures["measured"] > 20 * MiB
    assert 0.75 < figures["measured"] / figures["predicted"] < 1.25, figures


def test_a_hub_id_downloads_only_its_config(monkeypatch, tmp_path):
    import huggingface_hub

    (tmp_path / "config.json").write_text(json.dumps(SMALL.to_hf()))
    asked = []

    def fake_snapshot(repo_id, **kwargs):  # one request, then the cache (hf_hub_download retried for 27 s)
        asked.append((repo_id, kwargs["allow_patterns"]))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("retrying download"))
    assert plan.model_config("some-org/some-model") == SMALL
    assert asked == [("some-org/some-model", ["config.json"])]


def test_model_accepts_a_directory_or_a_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMALL.to_hf()))
    assert plan.model_config(str(tmp_path)) == plan.model_config(str(tmp_path / "config.json")) == SMALL


def plan_exit(capsys, argv) -> tuple[int, str]:
    with pytest.raises(SystemExit) as stop:
        train.main(argv)
    return stop.value.code, capsys.readouterr().out


def test_paper_presets_fit_and_the_7b_on_one_gpu_is_refused_with_what_would_fit(shared_data, capsys):
    one_five = shared_data / "tokenizers" / "DeepSeek-R1-Distill-Qwen-1.5B"
    seven = shared_data / "configs" / "DeepSeek-R1-Distill-Qwen-7B"
    code, out = plan_exit(capsys, ["--model", str(one_five), "--plan", "--plan-gpus", "1", "--plan-gpu-gb", "80"])
    assert code == 0 and "fits" in out and "KV cache: 64 rows" in out
    code, out = plan_exit(capsys, ["--preset", "paper-7b", "--model", str(seven), "--plan", "--plan-gpus", "8",
                                   "--plan-gpu-gb", "80"])
    assert code == 0 and "(1/8 shard)" in out
    code, out = plan_exit(capsys, ["--preset", "paper-7b", "--model", str(seven), "--plan", "--plan-gpus", "1",
                                   "--plan-gpu-gb", "80"])
    assert code == 1 and "does NOT fit" in out and "it would fit under torchrun --nproc-per-node" in out


def test_a_suggestion_fits_and_changes_the_least():
    cfg = small_cfg(rollout_batch_size=0, prompts_per_step=64)
    tight = plan.plan_memory(cfg, SMALL, gpus=1, gpu_gb=0.02, device="cpu")
    assert not tight.fits
    changes, gpus = plan.suggest(cfg, SMALL, gpus=1, gpu_gb=0.02, device="cpu")
    assert gpus == 1 and changes
    assert plan.plan_memory(replace(cfg, **changes), SMALL, gpus=1, gpu_gb=0.02, device="cpu").fits


def test_a_run_that_cannot_fit_stops_before_loading_anything(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train, "load_policy", lambda *a, **k: pytest.fail("loaded the model"))
    with pytest.raises(SystemExit) as stop:
        train.main(["--preset", "tiny", "--max-new-tokens", str(10**9), "--out-dir", str(tmp_path / "run")])
    message = str(stop.value.code)
    assert message.startswith("error: the run needs") and "KV cache" in message and "--max-new-tokens" in message


def test_paper_presets_decode_the_rows_the_plan_assumes():
    assert preset("paper-1.5b").rollout_batch_size == 64 and preset("paper-7b").rollout_batch_size == 32


def test_a_larger_rollout_batch_that_fits_is_named_and_the_next_one_does_not_fit():
    cfg = small_cfg(rollout_batch_size=2, prompts_per_step=64, max_new_tokens=2000)  # 256 rows, KV-heavy
    roomy = plan.larger_rollout_batch(cfg, SMALL, gpus=1, gpu_gb=1000, device="cuda")
    assert roomy == 256  # every row at once
    needed = {rows: plan.plan_memory(replace(cfg, rollout_batch_size=rows), SMALL, gpus=1, gpu_gb=1000,
                                     device="cuda").peak_bytes / plan.GIB for rows in (2, 4, 8, 16, 32, 64, 128, 256)}
    budget = (needed[16] + needed[32]) / 2  # 16 rows fit, 32 do not
    assert plan.larger_rollout_batch(cfg, SMALL, gpus=1, gpu_gb=budget, device="cuda") == 16
    assert needed[16] < needed[32]  # by then the KV cache sets the peak (at 2 rows the update does)
    assert plan.larger_rollout_batch(replace(cfg, rollout_batch_size=16), SMALL, gpus=1, gpu_gb=budget,
                                     device="cuda") is None  # 16 is already the largest that fits
    assert plan.larger_rollout_batch(cfg, SMALL, gpus=1, gpu_gb=1000, device="cpu") is None  # the CPU: all rows
    assert plan.larger_rollout_batch(replace(cfg, rollout_batch_size=0), SMALL, gpus=1, gpu_gb=1000) is None
    assert plan.larger_rollout_batch(cfg, SMALL, gpus=4, gpu_gb=1000, device="cuda") == 64  # a rank's share


def test_plan_names_the_larger_rollout_batch_the_paper_preset_could_use(shared_data, capsys):
    one_five = shared_data / "tokenizers" / "DeepSeek-R1-Distill-Qwen-1.5B"
    for gpu_gb, rows in ((80, 128), (139.8, 256)):  # an H100, an H200
        code, out = plan_exit(capsys, ["--model", str(one_five), "--plan", "--plan-gpus", "1", "--plan-gpu-gb",
                                       str(gpu_gb)])
        assert code == 0 and f"--rollout-batch-size {rows} fits too" in out
    code, out = plan_exit(capsys, ["--model", str(one_five), "--plan", "--plan-gpus", "8", "--plan-gpu-gb", "80"])
    assert code == 0 and "fits too" not in out  # 8 ranks: 32 rows each, under the preset's 64


def test_a_run_is_told_when_its_gpu_holds_a_larger_rollout_batch(monkeypatch, capsys):
    from runtime import distributed

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1000 * plan.GIB, 1000 * plan.GIB))
    cfg = replace(preset("tiny"), rollout_batch_size=2)  # 16 prompts x 4 responses a step
    train.check_memory(cfg, torch.device("cuda"), distributed.World())
    assert "note: --rollout-batch-size 64 fits this GPU too (2 is set)" in capsys.readouterr().err
    train.check_memory(replace(cfg, rollout_batch_size=0), torch.device("cuda"), distributed.World())
    assert capsys.readouterr().err == ""  # all rows already decode together
