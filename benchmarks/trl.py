"""`python bench.py trl`: a GRPO step of ours beside TRL's GRPOTrainer (an optional install: pip install trl),
on the same small random Qwen2 model with the real R1-Distill tokenizer's vocabulary, the same prompts and
settings: prompts x group rows, every completion exactly --new-tokens long (no stop: TRL is given
min_new_tokens), lr, KL coefficient (so both replay a reference model), one optimizer step per rollout,
temperature 1, no exploration on our side (plain GRPO), fp32 on CPU, gradient checkpointing on (both
defaults), a stand-in reward (the decoded completion's length is odd) that costs neither side anything.

Each side runs --steps steps in a fresh process (peak RSS only grows within one); the sides alternate
(A B B A ...) so that a change in the machine's load hits both alike. Per side: seconds per step, of which
generation and the rest (reward, reference replay, forward, backward, optimizer step), CPU seconds per step,
peak RSS. The first step of each process is a warm-up and is not counted."""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import BENCH, SHARED_DATA, above_0, at_least_1, dies_with_parent, emit, note
from config import Config
from data import load_tokenizer, math_prompt
from model import ModelConfig, load_model, random_model, save_model
from ngrpo import update
from rollout import Sampling, generate

TOKENIZER = SHARED_DATA / "tokenizers" / "DeepSeek-R1-Distill-Qwen-rebuilt"
PROBLEMS = SHARED_DATA / "train" / "deepscaler_partial_803.jsonl"
SIDES = ("ours", "trl")


def stand_in_reward(text: str) -> float:
    return float(len(text) % 2)


def prompt_messages(count: int) -> list[list[dict]]:
    """The first `count` training problems as one user turn each (the paper's prompt)."""
    rows = [json.loads(line) for line in PROBLEMS.read_text().splitlines()[:count]]
    return [[{"role": "user", "content": math_prompt(row["problem"], final_period=False)}] for row in rows]


def write_model(args, tokenizer, out_dir: Path) -> None:
    """A random Qwen2 of --hidden / --layers with the tokenizer's vocabulary, untied (as R1-Distill), in the
    Hugging Face layout both sides load."""
    config = ModelConfig(family="qwen2", vocab_size=len(tokenizer), hidden_size=args.hidden,
                         intermediate_size=3 * args.hidden, num_layers=args.layers, num_heads=4, num_kv_heads=2,
                         head_dim=args.hidden // 4, qkv_bias=True, max_position_embeddings=4096,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    save_model(random_model(config, seed=0), out_dir, tokenizer)


def ours(args, model_dir: Path) -> dict:
    """Our step as train.py runs it on CPU: generate (rollout.py) -> reward -> ngrpo.update."""
    tokenizer = load_tokenizer(str(model_dir))
    prompts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False)
               for m in prompt_messages(args.prompts)]
    rows = [p for p in prompts for _ in range(args.group)]  # a prompt's G rows side by side
    policy = load_model(str(model_dir), dtype=torch.float32, device="cpu")
    policy.gradient_checkpointing = True
    reference = load_model(str(model_dir), dtype=torch.float32, device="cpu").eval().requires_grad_(False)
    cfg = Config(group_size=args.group, prompts_per_step=args.prompts, mini_batch_prompts=args.prompts,
                 micro_batch_size=args.prompts * args.group, lr=args.lr, kl_coef=args.kl, explore="none",
                 max_new_tokens=args.new_tokens)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sampling = Sampling(temperature=1.0, max_new_tokens=args.new_tokens, pad_id=tokenizer.pad_token_id or 0)
    steps = []
    for step in range(args.steps):
        start, cpu = time.perf_counter(), time.process_time()
        policy.eval()
        with torch.no_grad():
            rollout = generate(policy, rows, sampling, seed=(args.seed, step))
        generated = time.perf_counter()
        texts = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
        rewards = torch.tensor([stand_in_reward(t) for t in texts])
        update(policy, reference, optimizer, rollout, rewards, cfg)
        assert int(rollout.lengths.min()) == args.new_tokens
        steps.append(dict(step_s=time.perf_counter() - start, generate_s=generated - start,
                          cpu_s=time.process_time() - cpu))
    return {"steps": steps}


def theirs(args, model_dir: Path) -> dict:
    """TRL's GRPOTrainer, timed per optimizer step (a callback) and per generation (`_generate`)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    steps, marks = [], {}

    class Timer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            marks.update(start=time.perf_counter(), cpu=time.process_time(), generate_s=0.0)

        def on_step_end(self, *_, **__):
            steps.append(dict(step_s=time.perf_counter() - marks["start"], generate_s=marks["generate_s"],
                              cpu_s=time.process_time() - marks["cpu"]))

    class TimedTrainer(GRPOTrainer):
        def _generate(self, prompts):
            start = time.perf_counter()
            result = super()._generate(prompts)
            marks["generate_s"] += time.perf_counter() - start
            return result

    def reward(completions, **_):
        return [stand_in_reward(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    rows = args.prompts * args.group
    config = GRPOConfig(output_dir=str(model_dir / "trl"), per_device_train_batch_size=rows,
                        gradient_accumulation_steps=1, num_generations=args.group, steps_per_generation=1,
                        num_iterations=1, max_completion_length=args.new_tokens,
                        generation_kwargs={"min_new_tokens": args.new_tokens}, learning_rate=args.lr,
                        weight_decay=0.01, max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0,
                        beta=args.kl, temperature=1.0, top_p=1.0, loss_type="dapo", max_steps=args.steps,
                        logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, bf16=False,
                        gradient_checkpointing=True, seed=args.seed, dataloader_num_workers=0)
    trainer = TimedTrainer(model=model, reward_funcs=reward, args=config, processing_class=tokenizer,
                           train_dataset=Dataset.from_list([{"prompt": m} for m in prompt_messages(args.prompts)]),
                           callbacks=[Timer()])
    trainer.train()
    return {"steps": steps}


def run_side(args, side: str, model_dir: Path) -> dict:
    command = [sys.executable, str(BENCH), "trl", "--side", side, "--model-dir", str(model_dir)]
    for flag in ("prompts", "group", "new_tokens", "steps", "hidden", "layers", "lr", "kl", "seed"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    result = subprocess.run(command, preexec_fn=dies_with_parent, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"the {side} side failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.splitlines()[-1])


def bench_trl(args: argparse.Namespace) -> None:
    if args.side:  # a child: one side's steps in this fresh process
        torch.manual_seed(args.seed)
        result = (ours if args.side == "ours" else theirs)(args, Path(args.model_dir))
        result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        print(json.dumps(result))
        return
    try:
        import trl
    except ImportError:
        note("bench.py trl: TRL is not installed (pip install trl); skipped")
        return
    if not TOKENIZER.is_dir() or not PROBLEMS.is_file():
        note(f"bench.py trl: {TOKENIZER} or {PROBLEMS} not found (../shared is absent); skipped")
        return
    runs = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory() as tmp:
        write_model(args, load_tokenizer(str(TOKENIZER)), Path(tmp))
        for repeat in range(args.repeats):
            for side in SIDES if repeat % 2 == 0 else SIDES[::-1]:
                load = os.getloadavg()[0]
                runs[side].append(run_side(args, side, Path(tmp)) | {"load_1min": load})
                note(f"trl: {side} {[round(s['step_s'], 2) for s in runs[side][-1]['steps']]} s (load {load:.1f})")
    import transformers

    shape = {"prompts": args.prompts, "group": args.group, "new_tokens": args.new_tokens, "hidden": args.hidden,
             "layers": args.layers, "vocab": len(load_tokenizer(str(TOKENIZER))), "threads": torch.get_num_threads()}
    median = {}
    for side in SIDES:
        counted = [s for run in runs[side] for s in run["steps"][1:]]  # each process's first step is a warm-up
        median[side] = {key: statistics.median(s[key] for s in counted) for key in ("step_s", "generate_s", "cpu_s")}
        version = trl.__version__ if side == "trl" else "this repo"
        emit({"bench": "trl", "side": side, "version": version, "transformers": transformers.__version__, **shape,
              "step_s": round(median[side]["step_s"], 3), "generate_s": round(median[side]["generate_s"], 3),
              "update_s": round(median[side]["step_s"] - median[side]["generate_s"], 3),
              "cpu_s_per_step": round(median[side]["cpu_s"], 3), "steps_counted": len(counted),
              "peak_rss_mb": max(run["peak_rss_mb"] for run in runs[side]),
              "load_1min": [round(run["load_1min"], 2) for run in runs[side]]})
    emit({"bench": "trl", **shape, "speedup": round(median["trl"]["step_s"] / median["ours"]["step_s"], 2),
          "cpu_ratio": round(median["trl"]["cpu_s"] / median["ours"]["cpu_s"], 2)})


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("trl", help="a GRPO step of ours beside TRL's GRPOTrainer (pip install trl)")
    p.add_argument("--prompts", type=at_least_1, default=4, help="prompts per step")
    p.add_argument("--group", type=at_least_1, default=4, help="completions per prompt (G)")
    p.add_argument("--new-tokens", type=at_least_1, default=128, help="every completion's length (forced)")
    p.add_argument("--steps", type=at_least_1, default=4, help="steps per process (the first is a warm-up)")
    p.add_argument("--repeats", type=at_least_1, default=2, help="processes per side, alternating")
    p.add_argument("--hidden", type=at_least_1, default=128, help="the random model's hidden size (2 KV heads of 4)")
    p.add_argument("--layers", type=at_least_1, default=2, help="the random model's decoder layers")
    p.add_argument("--lr", type=above_0, default=1e-6, help="learning rate (both)")
    p.add_argument("--kl", type=float, default=0.01, help="KL coefficient (both: a reference model is replayed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--side", choices=SIDES, default=None, help="internal: run one side in this process")
    p.add_argument("--model-dir", default=None, help="internal: with --side, the model both sides load")
    p.set_defaults(run=bench_trl)
