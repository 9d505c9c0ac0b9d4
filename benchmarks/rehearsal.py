"""`python bench.py rehearsal`: the DeepSeek-R1-Distill-Qwen-1.5B shape end to end on a CPU, every phase's time
and memory beside what `train.py --plan` predicts for it.

Random bf16 weights of the real width and vocabulary (151,936 x 1,536; depth cut to --layers, default 2, so that
the fp32 policy, reference, gradients and AdamW fit a 24 GB machine) are saved in the Hugging Face layout beside
the rebuilt R1-Distill tokenizer, then train.py runs on them as a user would: `load_model`, the real chat template
and `</think>` / eos / pad ids, the neighbor table (cached on disk after the first build), a mixed rollout,
replay and one update, a checkpoint; then a second run resumes from it for one more step; then eval.py scores one
problem with the checkpoint. One JSON line per phase (stdout): seconds, `measured_mb` (the peak RSS growth of
the phase, see `Meter`) and, for the phases the plan models, `predicted_mb` and their ratio. It fails when a
ratio leaves [0.75, 1.25] where the plan predicts at least COMPARED_FROM_MB.
"""

import gc
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch

import eval as evaluation
import train
from benchmarks import common
from benchmarks.common import BENCH, ROOT, SHARED_DATA, at_least_1, device_arg, dies_with_parent, emit, note, rss_mb
from config import preset
from data import load_tokenizer, pad_id_of, tokenize_problems
from model import ModelConfig, random_model, save_model
from rollout import exploration_from_config
from runtime import checkpoint as checkpoint_module
from runtime import lora, plan

CONFIG = SHARED_DATA / "tokenizers" / "DeepSeek-R1-Distill-Qwen-1.5B" / "config.json"
TOKENIZER = SHARED_DATA / "tokenizers" / "DeepSeek-R1-Distill-Qwen-rebuilt"
TRAIN_DATA = SHARED_DATA / "train" / "deepscaler_partial_803.jsonl"
MATH500 = SHARED_DATA / "eval" / "math500.jsonl"
IDS = {"eos": 151643, "pad": 151643, "</think>": 151649, "generation prompt": [151645, 151648, 198]}
TOLERANCE = 0.25
# Phases the plan puts under this are reported but not held to TOLERANCE: there fixed costs the plan leaves out
# (the tokenizer, Python objects, kernel workspaces: tens of MB) are as large as what it counts.
COMPARED_FROM_MB = 256
# What the rehearsal reprints from each step's metrics.jsonl line: the sampler-vs-replay mismatch (gap, k3 KL,
# perplexity ratio, importance weights and what --rollout-is truncated or masked: ngrpo.MISMATCH_METRICS) and the
# timings.
LOGGED = ("step", "logp_gap_mean", "logp_gap_max", "rollout_kl", "rollout_ppl_ratio", "rollout_is_weight_mean",
          "rollout_is_weight_max", "rollout_is_token_frac", "rollout_is_seq_frac", "mix_rate", "response_len_mean",
          "skipped_minibatches", "rollout_s", "rollout_tokens_per_s", "update_s", "update_tokens_per_s", "step_s")


class Meter:
    """Peak RSS growth of a phase: /proc/self/clear_refs resets the peak (VmHWM) to the current RSS when the
    phase starts; the phase's figure is the peak at its end minus the RSS at its start. The process runs with
    MALLOC_MMAP_THRESHOLD_ low, so every large buffer is its own mapping and RSS follows live memory. Nested
    phases count toward the outermost one only."""

    def __init__(self, device: str = "cpu"):
        self.depth, self.records, self.device = 0, [], device

    def _reset(self) -> float:
        # What an earlier phase left for the collector (a finished run's models) is freed first: freed during
        # the phase, it would hide the phase's own growth.
        gc.collect()
        if self.device == "cuda":  # on a GPU: the caching allocator's peak over what is allocated
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return torch.cuda.memory_allocated() / 2**20
        Path("/proc/self/clear_refs").write_text("5")
        return rss_mb("VmRSS")

    def _peak(self) -> float:
        if self.device == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / 2**20
        return rss_mb("VmHWM")

    @contextmanager
    def phase(self, name: str, predicted_bytes: int | None = None, **extra):
        if self.depth:
            yield
            return
        self.depth += 1
        before, start = self._reset(), time.perf_counter()
        try:
            yield
        finally:
            self.depth -= 1
        record = {"bench": "rehearsal", "phase": name, "device": self.device,
                  "seconds": round(time.perf_counter() - start, 1), "measured_mb": round(self._peak() - before, 1),
                  **extra}
        if predicted_bytes is not None:
            record["predicted_mb"] = round(predicted_bytes / 2**20, 1)
            record["measured_over_predicted"] = round(record["measured_mb"] / record["predicted_mb"], 3)
        self.records.append(record)
        emit(record)

    def wrap(self, module, name: str, phase: str, predict=None):
        """module.name runs as a phase; predict(*args) gives its predicted bytes."""
        real = getattr(module, name)

        def measured(*args, **kwargs):
            with self.phase(phase, None if predict is None else predict(*args, **kwargs)):
                return real(*args, **kwargs)

        setattr(module, name, measured)


def random_checkpoint(work: Path, layers: int, device: str = "cpu") -> Path:
    """The 1.5B architecture at `layers` layers with random bf16 weights and the rebuilt tokenizer, in the
    Hugging Face layout; built once per work directory. The weights are drawn on `device`: on the H200 host, drawing
    and saving the 28 layers on its CPU took 63 s of scarce device time."""
    target = work / f"r1-distill-1.5b-{layers}-layers"
    if (target / "config.json").exists():
        return target
    hf = json.loads(CONFIG.read_text())
    hf["num_hidden_layers"] = layers
    model = random_model(ModelConfig.from_hf(hf), dtype=torch.bfloat16, device=device, seed=0)
    model.hf_config = hf
    tmp = work / (target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(model, tmp, load_tokenizer(str(TOKENIZER)))
    tmp.rename(target)
    return target


def run_config(args, checkpoint: Path, out_dir: Path, **overrides):
    """paper-1.5b at rehearsal size: a few rows x a few dozen tokens, a checkpoint every step, no validation."""
    settings = dict(model=str(checkpoint), tokenizer=str(TOKENIZER), data=str(TRAIN_DATA),
                    prompts_per_step=args.prompts, group_size=args.group_size, mini_batch_prompts=args.prompts,
                    rollout_batch_size=0, micro_batch_size=args.prompts * args.group_size,
                    max_new_tokens=args.new_tokens, max_prompt_tokens=args.max_prompt_tokens,
                    logprob_chunk_tokens=args.chunk_tokens, mix_rate=args.mix_rate, val_data="", keep_best="",
                    val_before_train=False, save_every=1, keep_last=2, log_completions_every=0, device=args.device,
                    out_dir=str(out_dir), overwrite=True, max_steps=1, rollout_is=args.rollout_is,
                    lora_rank=args.lora_rank, lora_alpha=2.0 * args.lora_rank or preset("paper-1.5b").lora_alpha)
    return replace(preset("paper-1.5b"), **{**settings, **overrides})


def check_ids(cfg) -> None:
    """The real chat template and special ids, as train.py gets them."""
    tokenizer = load_tokenizer(cfg.tokenizer)
    (problem,), _ = tokenize_problems([{"problem": "What is 1+1?", "answer": "2"}], tokenizer,
                                      max_prompt_tokens=cfg.max_prompt_tokens, instruction=cfg.instruction)
    got = {"eos": tokenizer.eos_token_id, "pad": pad_id_of(tokenizer),
           "</think>": exploration_from_config(cfg, tokenizer).stop_mixing_id,
           "generation prompt": problem["prompt_ids"][-3:]}
    if got != IDS:
        sys.exit(f"rehearsal: special ids {got}, expected {IDS}")


def predictions(cfg, checkpoint: Path):
    """Per-phase predicted bytes from runtime/plan.py, for the CPU and the prompts as the run renders them."""
    mc = plan.model_config(str(checkpoint))

    def the_plan(prompt_tokens):
        return plan.plan_memory(cfg, mc, gpus=1, gpu_gb=80, device=cfg.device, prompt_tokens=prompt_tokens)

    def row(p, prefix, phase="update"):
        return sum(getattr(r, phase) for r in p.rows if r.name.startswith(prefix))

    def rollout(model, prompts, *args, **kwargs):
        p = the_plan(max(map(len, prompts)))
        return row(p, "KV cache", "rollout") + row(p, "decode logits", "rollout")

    def update(policy, reference, optimizer, rollout_, *args, **kwargs):  # ngrpo.update's first four arguments
        p = the_plan(len(max(rollout_.prompts, key=len)))
        fresh = not optimizer.state  # the first step allocates the AdamW moments (a resumed run has them)
        held = row(p, "fp32 gradients") + (row(p, "AdamW moments") if fresh else 0)
        backward = row(p, "activations held") + row(p, "backward peak")
        return held + max(backward, row(p, "AdamW step"))

    weights = lambda *args, **kwargs: the_plan(None).load_bytes  # the checkpoint read: fp32 weights (+ file)
    # The reference's row, plus on the CPU the file mapped while it is read (as for the policy).
    reference = lambda *args, **kwargs: (row(the_plan(None), "reference model")
                                         + the_plan(None).load_bytes - row(the_plan(None), "fp32 weights"))
    # Host memory: compared on the CPU only (on a GPU the allocator does not see it).
    checkpoint_bytes = lambda *args, **kwargs: the_plan(None).checkpoint if cfg.device == "cpu" else None
    merged = lambda *args, **kwargs: row(the_plan(None), "sampler copy", "rollout")  # --lora-rank's sampler
    return weights, reference, rollout, update, checkpoint_bytes, merged


def rehearse(args) -> None:
    """The inner process: every phase measured (see the module docstring)."""
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    meter = Meter(args.device)
    with meter.phase("random_weights", layers=args.layers):
        checkpoint = random_checkpoint(work, args.layers, args.device)
    cfg = run_config(args, checkpoint, work / "run")
    with meter.phase("chat_template_and_ids"):
        check_ids(cfg)
    weights, reference, rollout, update, checkpoint_bytes, merged = predictions(cfg, checkpoint)
    meter.wrap(train, "load_policy", "load_policy", weights)
    meter.wrap(train, "load_model", "load_reference", reference)
    # The table's disk cache outlives the run directory (which --overwrite clears): the first rehearsal searches
    # (5-13 minutes on 2 cores), later ones load it.
    cache = work / "neighbors"
    table_for = train.table_for
    train.table_for = lambda model, cfg, cache_dir=None: table_for(model, cfg, cache_dir=cache)
    meter.wrap(train, "table_for", "neighbor_table")
    meter.wrap(train, "generate", "rollout", rollout)
    meter.wrap(train, "update", "update", update)
    meter.wrap(checkpoint_module, "save_checkpoint", "checkpoint", checkpoint_bytes)
    meter.wrap(train, "restore_checkpoint", "resume")
    meter.wrap(lora, "merged_copy", "merged_sampler", merged)
    if args.no_resume:  # one run of two steps: a checkpoint written once, never read back (a GPU call's budget)
        train.run(run_config(args, checkpoint, work / "run", max_steps=2, save_every=0))
    else:
        train.run(cfg)
        train.run(run_config(args, checkpoint, work / "run", max_steps=2, resume=True))
    for line in (work / "run" / "metrics.jsonl").read_text().splitlines():  # what the log says of each step
        metrics = json.loads(line)
        emit({"bench": "rehearsal", "phase": "metrics", "device": args.device,
              **{key: metrics[key] for key in LOGGED if key in metrics}})
    latest = train.checkpoint_dirs(work / "run")[-1]
    with meter.phase("eval_one_problem"):
        evaluation.main(["--model", str(latest), "--tokenizer", str(TOKENIZER), "--benchmarks", str(MATH500),
                         "--limit", "1", "--n", "1", "--max-new-tokens", str(args.new_tokens), "--device", args.device,
                         "--out-dir", str(work / "eval"), "--overwrite"])
    off = [r for r in meter.records if r.get("predicted_mb", 0) >= COMPARED_FROM_MB
           and abs(r["measured_over_predicted"] - 1) > TOLERANCE]
    if off:
        sys.exit(f"rehearsal: measured memory is more than {TOLERANCE:.0%} off the plan in {off}")


def bench_rehearsal(args) -> None:
    if args.inner:
        rehearse(args)
        return
    for path in (CONFIG, TOKENIZER, TRAIN_DATA, MATH500):
        if not path.exists():
            sys.exit(f"{path} not found: the rehearsal needs ../shared/data (or NGRPO_SHARED_DATA)")
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    start = time.perf_counter()
    command = [sys.executable, str(BENCH), "rehearsal", "--inner", *sys.argv[sys.argv.index("rehearsal") + 1:]]
    result = subprocess.run(command, preexec_fn=dies_with_parent, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    phases = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"bench": "rehearsal"')]
    for record in phases:
        emit(record)
    note(f"rehearsal: {len(phases)} phases in {time.perf_counter() - start:.0f} s")
    if result.returncode:
        sys.exit(result.returncode)


def add_parser(subparsers) -> None:
    rehearsal = subparsers.add_parser("rehearsal", help="the R1-Distill-1.5B shape end to end on the CPU: time and "
                                      "memory of each phase against train.py --plan")
    rehearsal.add_argument("--layers", type=at_least_1, default=2,
                           help="decoder blocks (the real model has 28; width and vocabulary stay real)")
    rehearsal.add_argument("--prompts", type=at_least_1, default=2, help="prompts per step")
    rehearsal.add_argument("--group-size", type=at_least_1, default=2, help="responses per prompt")
    rehearsal.add_argument("--new-tokens", type=at_least_1, default=32, help="max new tokens per response")
    rehearsal.add_argument("--max-prompt-tokens", type=at_least_1, default=256,
                           help="longer training prompts are dropped")
    rehearsal.add_argument("--chunk-tokens", type=at_least_1, default=64, help="--logprob-chunk-tokens")
    rehearsal.add_argument("--mix-rate", type=float, default=0.5, help="high, so that a short rollout mixes")
    rehearsal.add_argument("--rollout-is", default="none", choices=["none", "token-truncate", "token-mask",
                                                                    "sequence-truncate", "sequence-mask"],
                           help="train.py's --rollout-is (cap 2): the mismatch is logged in every mode; a mode shows "
                           "what it truncates or masks at this shape")
    rehearsal.add_argument("--lora-rank", type=common.at_least_0, default=0, metavar="R",
                           help="train.py's --lora-rank R with --lora-alpha 2R: the frozen base, the adapters and the "
                           "merged sampler measured against the plan's adapter rows (0 = full fine-tuning)")
    rehearsal.add_argument("--device", type=device_arg, default="cpu", help="cpu or cuda; cuda: the allocator's peak "
                           "against the plan's GPU rows (.ci/gpu-checks, full depth)")
    rehearsal.add_argument("--work-dir", default=str(ROOT / "runs" / "rehearsal"),
                           help="the random checkpoint, the neighbor table cache, the runs (kept between runs)")
    rehearsal.add_argument("--no-resume", action="store_true", help="one run of two steps instead of a step, a "
                           "resume and a step: one checkpoint write and no read (a GPU call's time)")
    rehearsal.add_argument("--inner", action="store_true", help="internal: the measured process")
    rehearsal.set_defaults(run=bench_rehearsal)
