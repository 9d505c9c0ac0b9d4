"""N-GRPO training: the CLI entry and the loop. The math lives in ngrpo.py; this file moves data around.

    python train.py --model deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B      # the paper's recipe (paper-1.5b)
    python train.py --preset demo                                          # offline, CPU, a few minutes

One step: draw prompts -> G rollouts each (rollout.generate, with the exploration strategy) -> rewards
(RewardPool) -> group advantages -> old-policy and reference log-probs by replaying the recorded inputs
-> mini-batch updates (micro-batches with gradient accumulation, grad-norm clip) -> metrics.
"""

import contextlib
import copy
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from config import Config, parse_config
from data import DataError, PromptBatcher, load_problems, load_tokenizer, tokenize_problems
from model import TINY_CONFIG, load_model, random_model, save_model
from neighbors import build_neighbor_table
from ngrpo import (group_advantages, keep_groups, length_mask, mixed_embeddings, overlong_penalty, policy_loss,
                   sequence_logprobs, token_logprobs)
from reward import RewardPool
from rollout import Exploration, Sampling, generate


@dataclass
class Episodes:
    """Everything the update needs about a set of sampled sequences, row-aligned. T = longest response."""

    prompts: list[list[int]]
    response_ids: torch.Tensor  # [N, T]
    lengths: torch.Tensor  # [N]
    cand_ids: torch.Tensor  # [N, T, K] the inputs the sampler fed (see rollout.Rollout)
    cand_weights: torch.Tensor  # [N, T, K]
    advantages: torch.Tensor  # [N]
    old_logp: torch.Tensor  # [N, T]
    ref_logp: torch.Tensor | None = None  # [N, T], when a KL term is on
    in_loss: torch.Tensor | None = None  # [N] bool, rows whose tokens count (--mask-truncated); None = all

    def __len__(self) -> int:
        return len(self.prompts)

    def rows(self, index: slice) -> "Episodes":
        pick = lambda x: None if x is None else x[index]
        return Episodes(self.prompts[index], self.response_ids[index], self.lengths[index], self.cand_ids[index],
                        self.cand_weights[index], self.advantages[index], self.old_logp[index], pick(self.ref_logp),
                        pick(self.in_loss))

    def response_mask(self) -> torch.Tensor:
        mask = length_mask(self.lengths, self.response_ids.shape[1])
        return mask if self.in_loss is None else mask & self.in_loss[:, None].to(mask.device)


def autocast(device: torch.device):
    """bf16 autocast on GPU (weights and optimizer stay fp32); nothing on CPU, where all is fp32."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def backward_minibatch(model, episodes: Episodes, cfg, *, micro_batch_size: int, temperature: float = 1.0,
                       chunk_tokens: int = 1024) -> dict:
    """Accumulates into .grad the gradient of the loss over all response tokens of `episodes` (aggregated as
    cfg.loss_agg says), `micro_batch_size` sequences per forward/backward. Each micro-batch divides by the
    whole mini-batch's token (or sequence) count, so the gradient does not depend on the split. Returns the
    metrics, or the loss alone with `"finite": False` if a micro-batch's loss was not finite (nothing more is
    accumulated)."""
    full_mask = episodes.response_mask()
    num_tokens = full_mask.sum().clamp_min(1).to(torch.float32)
    normalizer = num_tokens if cfg.loss_agg == "token-mean" else full_mask.any(-1).sum().clamp_min(1).to(torch.float32)
    totals: dict[str, float] = {}
    entropy_sum = 0.0
    device = model.embed_tokens.weight.device
    for start in range(0, len(episodes), micro_batch_size):
        micro = episodes.rows(slice(start, start + micro_batch_size))
        with autocast(device):  # the forward only; backward runs in the dtypes the forward chose
            logp, entropy = sequence_logprobs(model, micro.prompts, micro.cand_ids, micro.cand_weights, micro.lengths,
                                              micro.response_ids, temperature=temperature, chunk_tokens=chunk_tokens)
            mask = micro.response_mask().to(device)
            loss, metrics = policy_loss(logp, micro.old_logp.to(device), micro.advantages.to(device), mask,
                                        ref_logp=None if micro.ref_logp is None else micro.ref_logp.to(device),
                                        cfg=cfg, normalizer=normalizer.to(device))
        if not torch.isfinite(loss):
            return {"loss": float(loss.detach()), "finite": False}
        loss.backward()
        for key, value in metrics.items():
            totals[key] = totals.get(key, 0.0) + float(value)
        entropy_sum += float((entropy * mask).sum())
    totals["entropy"] = entropy_sum / float(num_tokens)
    totals["finite"] = True
    return totals


# ----------------------------------------------------------------------------- the run


ROLLOUT_TENSORS = ("response_ids", "lengths", "finished", "logprobs", "cand_ids", "cand_weights", "mixed")


def join_rollouts(rollouts: list, pad_id: int):
    """Rollouts of several prompt batches as one; responses are right-padded to the longest (pad_id, weight 0)."""
    if len(rollouts) == 1:
        return rollouts[0]
    T = max(r.response_ids.shape[1] for r in rollouts)

    def padded(x, value):  # [B, T_r, ...] -> [B, T, ...]; lengths and finished are [B] and stay
        if x.dim() == 1:
            return x
        out = x.new_full((x.shape[0], T, *x.shape[2:]), value)
        out[:, : x.shape[1]] = x
        return out

    pads = dict(response_ids=pad_id, logprobs=0.0, cand_ids=pad_id, cand_weights=0.0, mixed=False)
    return replace(rollouts[0], prompts=[p for r in rollouts for p in r.prompts],
                   **{name: torch.cat([padded(getattr(r, name), pads.get(name, 0)) for r in rollouts])
                      for name in ROLLOUT_TENSORS})


def rollout_rows(rollout, index: list[int]):
    """The rows `index` of a rollout, as a rollout."""
    return replace(rollout, prompts=[rollout.prompts[i] for i in index],
                   **{name: getattr(rollout, name)[torch.tensor(index, dtype=torch.long,
                                                                device=getattr(rollout, name).device)]
                      for name in ROLLOUT_TENSORS})


def replay_logprobs(model, rollout, *, micro_batch_size: int, temperature: float, chunk_tokens: int, device):
    """No-grad log-probs of every response token by replaying the recorded inputs, in micro-batches."""
    parts = []
    starts = range(0, len(rollout.prompts), micro_batch_size)
    with torch.no_grad(), autocast(device):
        for start in tqdm(starts, desc="replay", leave=False, delay=2, file=sys.stderr):
            rows = slice(start, start + micro_batch_size)
            logp, _ = sequence_logprobs(model, rollout.prompts[rows], rollout.cand_ids[rows], rollout.cand_weights[rows],
                                        rollout.lengths[rows], rollout.response_ids[rows], temperature=temperature,
                                        chunk_tokens=chunk_tokens)
            parts.append(logp.float())
    return torch.cat(parts)


def held_out_accuracy(model, problems: list[dict], tokenizer, pool, *, max_new_tokens: int, batch_size: int = 64) -> float:
    """Greedy accuracy on held-out problems (their prompt_ids already rendered)."""
    stop = (tokenizer.eos_token_id,)
    correct = 0
    for start in range(0, len(problems), batch_size):
        batch = problems[start : start + batch_size]
        rollout = generate(model, [p["prompt_ids"] for p in batch],
                           Sampling(temperature=0, max_new_tokens=max_new_tokens, stop_ids=stop))
        texts = tokenizer.batch_decode(rollout.responses(), skip_special_tokens=True)
        correct += sum(pool.score([(text, p["answer"]) for text, p in zip(texts, batch)]))
    return correct / len(problems)


def warm_start(model, problems: list[dict], tokenizer, cfg, device) -> None:
    """Teacher forcing on worked solutions (`solution` ends in \\boxed{answer}) so that a random model can
    answer at all: cross-entropy on the response tokens, sft_steps AdamW steps."""
    usable = [p for p in problems if p.get("solution")]
    if not usable:
        raise SystemExit("error: --sft-steps needs problems with worked solutions (a 'solution' field)")
    batcher = PromptBatcher(usable, cfg.sft_batch_size, seed=cfg.seed + 1)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.sft_lr, weight_decay=0.0)
    eos = tokenizer.eos_token_id
    model.train()
    for _ in tqdm(range(cfg.sft_steps), desc="warm start", leave=False, file=sys.stderr):
        batch = batcher.next_batch()
        answers = [tokenizer.encode(p["solution"], add_special_tokens=False) + [eos] for p in batch]
        sequences = [p["prompt_ids"] + a for p, a in zip(batch, answers)]
        L = max(map(len, sequences))
        ids = torch.tensor([s + [eos] * (L - len(s)) for s in sequences], device=device)  # right padding
        labels = ids[:, 1:]
        mask = torch.zeros_like(labels, dtype=torch.bool)
        for row, (p, a) in enumerate(zip(batch, answers)):
            mask[row, len(p["prompt_ids"]) - 1 : len(p["prompt_ids"]) - 1 + len(a)] = True
        with autocast(device):
            logp, _ = token_logprobs(model.forward_hidden(ids[:, :-1]), model.output_weight, labels,
                                     chunk_tokens=cfg.logprob_chunk_tokens)
        loss = -(logp * mask).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def make_episodes(policy, reference, rollout, advantages, cfg, device) -> tuple[Episodes, torch.Tensor]:
    """The update's input: old-policy (and reference) log-probs by replaying the recorded inputs, and the
    |rollout - replay| log-prob gap of every response token (it shows sampler/trainer drift)."""
    policy.eval()
    replay = dict(micro_batch_size=cfg.micro_batch_size, temperature=cfg.temperature,
                  chunk_tokens=cfg.logprob_chunk_tokens, device=device)
    replayed = replay_logprobs(policy, rollout, **replay)
    gap = (replayed - rollout.logprobs.float()).abs()[rollout.response_mask()]
    ref_logp = None if reference is None else replay_logprobs(reference, rollout, **replay)
    episodes = Episodes(rollout.prompts, rollout.response_ids, rollout.lengths, rollout.cand_ids,
                        rollout.cand_weights, advantages.to(device),
                        replayed if cfg.old_logp == "replay" else rollout.logprobs.float(), ref_logp,
                        rollout.finished if cfg.mask_truncated else None)
    return episodes, gap


def optimize(policy, optimizer, params, episodes: Episodes, cfg, device) -> tuple[dict, int]:
    """ppo_epochs passes of mini-batch updates (mini_batch_prompts groups each, grad-norm clipped). A mini-batch
    whose loss or gradient is not finite is skipped. Returns (metric name -> values per update, skipped)."""
    policy.train()
    update, skipped = {}, 0
    per_minibatch = cfg.mini_batch_prompts * cfg.group_size
    starts = [start for _ in range(cfg.ppo_epochs) for start in range(0, len(episodes), per_minibatch)]
    for start in tqdm(starts, desc="update", unit="minibatch", leave=False, delay=2, file=sys.stderr):
        optimizer.zero_grad(set_to_none=True)
        result = backward_minibatch(policy, episodes.rows(slice(start, start + per_minibatch)), cfg,
                                    micro_batch_size=cfg.micro_batch_size, temperature=cfg.temperature,
                                    chunk_tokens=cfg.logprob_chunk_tokens)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        if not result.pop("finite") or not torch.isfinite(grad_norm):
            skipped += 1  # a non-finite loss or gradient: no update from this mini-batch
            optimizer.zero_grad(set_to_none=True)
            continue
        optimizer.step()
        result["grad_norm"] = float(grad_norm)
        for key, value in result.items():
            update.setdefault(key, []).append(value)
    return update, skipped


def checkpoint_dirs(out_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a directory is complete once renamed to step-N)."""
    found = [d for d in (out_dir / "checkpoints").glob("step-*") if d.is_dir() and d.name[5:].isdigit()]
    return sorted(found, key=lambda d: int(d.name[5:]))


def save_checkpoint(out_dir: Path, step: int, policy, tokenizer, optimizer, batcher, generator, table, cfg) -> None:
    """HF-layout weights plus optimizer, RNG, data cursor and the neighbor table in use, written to a
    temporary directory and renamed: a crash mid-write leaves the previous checkpoints as they were."""
    root = out_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".step-*"):  # what a killed run was writing
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{step}-", dir=root))
    save_model(policy, tmp, tokenizer)
    torch.save({"step": step, "optimizer": optimizer.state_dict(), "batcher": batcher.state_dict(),
                "generator": generator.get_state(), "torch_rng": torch.get_rng_state(),
                "python_rng": random.getstate(), "neighbor_table": table}, tmp / "trainer_state.pt")
    cfg.save_json(tmp / "config.json.run")
    os.replace(tmp, root / f"step-{step}")
    for old in checkpoint_dirs(out_dir)[: -cfg.keep_last] if cfg.keep_last > 0 else []:
        shutil.rmtree(old)


def mixing_distance(embed_weight, rollout) -> float:
    """Mean ||e_mixed - E[y]|| / ||E[y]|| over the mixed steps (0 when none was mixed)."""
    if not bool(rollout.mixed.any()):
        return 0.0
    with torch.no_grad():
        mixed = mixed_embeddings(embed_weight, rollout.cand_ids[rollout.mixed], rollout.cand_weights[rollout.mixed])
        own = embed_weight[rollout.response_ids[rollout.mixed]]
        return float(((mixed.float() - own.float()).norm(dim=-1) / own.float().norm(dim=-1).clamp_min(1e-12)).mean())


def format_line(m: dict) -> str:
    parts = [f"step {m['step']}", f"reward {m['reward_mean']:.3f}", f"loss {m.get('loss', float('nan')):+.4f}",
             f"len {m['response_len_mean']:.0f}", f"mix {m['mix_rate']:.3f}", f"ent {m.get('entropy', 0.0):.2f}",
             f"gn {m.get('grad_norm', 0.0):.2f}", f"{m['step_s']:.1f}s"]
    if "kl" in m:
        parts.insert(3, f"kl {m['kl']:.4f}")
    if "held_out_accuracy" in m:
        parts.append(f"held-out {m['held_out_accuracy']:.3f}")
    return " | ".join(parts)


def run(cfg: Config) -> dict:
    """The whole run; returns the summary also written to OUT/summary.json."""
    out_dir = Path(cfg.out_dir)
    earlier = [] if cfg.resume else checkpoint_dirs(out_dir)  # checkpoints of another run in the same place
    if earlier and not cfg.overwrite:
        raise SystemExit(f"error: {out_dir} holds checkpoints of an earlier run (latest: {earlier[-1].name}); pass "
                         "--resume to continue it, --overwrite to start over there (deleting them), or another --out-dir")
    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    try:
        if cfg.model == "tiny":
            policy = random_model(TINY_CONFIG, dtype=torch.float32, device=device, seed=cfg.seed)
        else:
            policy = load_model(cfg.model, dtype=torch.float32, device=device)
        tokenizer = load_tokenizer(cfg.tokenizer or cfg.model)
    except (OSError, ValueError) as error:
        raise SystemExit(f"error: cannot load --model {cfg.model!r}: {error}") from None
    policy.gradient_checkpointing = cfg.grad_checkpointing
    if cfg.freeze_embeddings:
        policy.embed_tokens.weight.requires_grad_(False)
    try:
        problems = load_problems(cfg.data, split=cfg.data_split)
    except (DataError, OSError) as error:
        raise SystemExit(f"error: {error}") from None
    problems, prompts_dropped = tokenize_problems(problems, tokenizer, max_prompt_tokens=cfg.max_prompt_tokens,
                                                  final_period=False)
    if not problems:
        raise SystemExit(f"error: every prompt of {cfg.data} is longer than --max-prompt-tokens {cfg.max_prompt_tokens}")
    held_out = []
    eval_source = cfg.eval_data or (cfg.data if cfg.data.startswith("arith") else "")
    if cfg.eval_problems > 0 and eval_source:
        split = "test" if eval_source.startswith("arith") else cfg.data_split
        held_out, _ = tokenize_problems(load_problems(eval_source, split=split, limit=cfg.eval_problems), tokenizer,
                                        max_prompt_tokens=cfg.max_prompt_tokens, final_period=False)

    checkpoints = checkpoint_dirs(out_dir) if cfg.resume else []
    if cfg.resume and not checkpoints:
        print(f"--resume: no checkpoint in {out_dir / 'checkpoints'}; starting from the beginning", file=sys.stderr)
    if earlier:  # --overwrite: a later --resume must never pick up the other run's checkpoints
        shutil.rmtree(out_dir / "checkpoints")
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg.save_json(out_dir / "config.json")

    stop_mixing_id = None
    if cfg.stop_mixing_token and cfg.explore != "none":
        stop_mixing_id = tokenizer.convert_tokens_to_ids(cfg.stop_mixing_token)
        if stop_mixing_id is None or stop_mixing_id == tokenizer.unk_token_id:
            raise SystemExit(f"error: --stop-mixing-token {cfg.stop_mixing_token!r} is not one token of the tokenizer")
    exploration = Exploration(cfg.explore, mix_rate=cfg.mix_rate, num_neighbors=cfg.num_neighbors,
                              weights=cfg.mix_weights, top_k=cfg.soft_top_k, mix_temperature=cfg.mix_temperature,
                              noise_sigma=cfg.noise_sigma, stop_mixing_id=stop_mixing_id)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    sampling = Sampling(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                        max_new_tokens=cfg.max_new_tokens, stop_ids=(tokenizer.eos_token_id,), pad_id=pad_id)
    batcher = PromptBatcher(problems, cfg.prompts_per_step, seed=cfg.seed)
    generator = torch.Generator(device).manual_seed(cfg.seed)
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    pool = RewardPool()
    summary = {"prompts": len(problems), "prompts_dropped": prompts_dropped}

    start_step = 0
    if checkpoints:
        latest = checkpoints[-1]
        state = torch.load(latest / "trainer_state.pt", map_location=device, weights_only=False)
        with torch.no_grad():
            for target, source in zip(policy.state_dict().values(),
                                      load_model(str(latest), dtype=torch.float32, device=device).state_dict().values()):
                target.copy_(source)
        optimizer.load_state_dict(state["optimizer"])
        batcher.load_state_dict(state["batcher"])
        generator.set_state(state["generator"].cpu())  # a generator's state is a CPU byte tensor, CUDA's too
        torch.set_rng_state(state["torch_rng"].cpu())
        random.setstate(state["python_rng"])
        start_step = state["step"]
        print(f"resumed from {latest} (step {start_step})", file=sys.stderr)
    elif cfg.sft_steps > 0:
        warm_start(policy, problems, tokenizer, cfg, device)
        save_model(policy, out_dir / "warm_start", tokenizer)  # the reference of the KL term, also on resume

    reference = None
    if cfg.kl_coef > 0:
        source = out_dir / "warm_start" if cfg.sft_steps > 0 else None
        if source is not None or cfg.model != "tiny":
            reference = load_model(str(source or cfg.model), dtype=torch.float32, device=device)
        else:
            reference = random_model(TINY_CONFIG, dtype=torch.float32, device=device, seed=cfg.seed)
        reference = reference.to(torch.bfloat16 if device.type == "cuda" else torch.float32).eval().requires_grad_(False)
    # The sampler: the policy itself on CPU; on GPU a bf16 copy refreshed after every optimizer step.
    sampler = policy if device.type == "cpu" else copy.deepcopy(policy).to(torch.bfloat16).requires_grad_(False)

    def refresh_sampler():
        if sampler is not policy:
            with torch.no_grad():
                for target, source in zip(sampler.parameters(), policy.parameters()):
                    target.copy_(source)

    def neighbor_table():
        matrix = sampler.output_weight if cfg.neighbor_space == "output" else sampler.embed_tokens.weight
        return build_neighbor_table(matrix.detach(), cfg.num_neighbors, cfg.neighbor_metric,
                                    cache_dir=out_dir / "neighbors")

    refresh_sampler()
    table = None
    if cfg.explore == "neighbor":  # a resumed run keeps the table it was using (rebuilt only on refresh)
        saved = state.get("neighbor_table") if checkpoints else None
        table = saved.to(device) if saved is not None else neighbor_table()
    max_steps = cfg.max_steps or -(-len(problems) // cfg.prompts_per_step)
    metrics_path = out_dir / "metrics.jsonl"
    kept = [line for line in (metrics_path.read_text().splitlines() if metrics_path.exists() else [])
            if start_step and json.loads(line)["step"] <= start_step]  # steps after the checkpoint run again
    metrics_path.write_text("".join(line + "\n" for line in kept))

    if held_out and start_step == 0:
        sampler.eval()
        summary["accuracy_before"] = held_out_accuracy(sampler, held_out, tokenizer, pool,
                                                       max_new_tokens=cfg.max_new_tokens)
        print(f"held-out accuracy before RL: {summary['accuracy_before']:.3f} ({len(held_out)} problems)")

    failures_in_a_row = 0
    bar = tqdm(range(start_step, max_steps), initial=start_step, total=max_steps, desc="train", file=sys.stderr)
    for step in bar:
        step_start = time.perf_counter()
        if cfg.explore == "neighbor" and cfg.neighbor_refresh and step > start_step and step % cfg.neighbor_refresh == 0:
            table = neighbor_table()
        # One prompt batch; with --refill more until prompts_per_step groups survive --filter-groups.
        draws, kept_groups, rollout_s, score_s = [], 0, 0.0, 0.0
        while True:
            batch = batcher.next_batch()
            draw_rows = [p for p in batch for _ in range(cfg.group_size)]  # G consecutive rows per prompt: a group
            rollout_start = time.perf_counter()
            sampler.eval()  # bf16 on GPU: generate runs it as it is, without autocast
            per_call = cfg.rollout_batch_size or len(draw_rows)
            draw = join_rollouts([generate(sampler, [p["prompt_ids"] for p in draw_rows[start : start + per_call]],
                                           sampling, exploration, neighbor_table=table,
                                           seed=(cfg.seed, step, len(draws)),
                                           row_keys=range(start, min(start + per_call, len(draw_rows))),
                                           progress=True)
                                  for start in range(0, len(draw_rows), per_call)], pad_id)
            rollout_s += time.perf_counter() - rollout_start
            draw_texts = tokenizer.batch_decode(draw.responses(), skip_special_tokens=True)
            score_start = time.perf_counter()
            draw_scores = torch.tensor(pool.score([(text, p["answer"]) for text, p in zip(draw_texts, draw_rows)]))
            score_s += time.perf_counter() - score_start
            draws.append((draw_rows, draw, draw_texts, draw_scores))
            kept_groups += int(keep_groups(draw_scores, cfg.group_size, cfg.filter_groups).sum())
            if not cfg.refill or kept_groups >= cfg.prompts_per_step or len(draws) > cfg.max_refill_draws:
                break
        rows = [p for d in draws for p in d[0]]
        texts = [t for d in draws for t in d[2]]
        rollout = join_rollouts([d[1] for d in draws], pad_id)
        scores = torch.cat([d[3] for d in draws])
        rewards = scores
        if cfg.overlong_buffer > 0:
            penalty = overlong_penalty(rollout.lengths.cpu(), cfg.max_new_tokens, cfg.overlong_buffer,
                                       cfg.overlong_penalty_factor)
            rewards = scores + penalty

        update_start = time.perf_counter()
        trained, trained_rewards = rollout, rewards  # the rows the update sees
        if cfg.filter_groups != "none":
            groups_kept = keep_groups(scores, cfg.group_size, cfg.filter_groups).nonzero()[:, 0][: cfg.prompts_per_step]
            index = [int(g) * cfg.group_size + j for g in groups_kept for j in range(cfg.group_size)]
            trained, trained_rewards = rollout_rows(rollout, index), rewards[index]
        virtual_count = cfg.virtual_max_count if cfg.adv_estimator == "negative" else 0
        update, skipped, gap = {}, 0, torch.zeros(0)
        if len(trained.prompts):  # every group filtered out: no update this step
            advantages = group_advantages(trained_rewards, cfg.group_size, scale=cfg.scale_rewards, eps=cfg.adv_eps,
                                          virtual_count=virtual_count, virtual_reward=cfg.virtual_max_reward)
            episodes, gap = make_episodes(policy, reference, trained, advantages, cfg, device)
            update, skipped = optimize(policy, optimizer, params, episodes, cfg, device)
        refresh_sampler()
        update_s = time.perf_counter() - update_start

        groups = scores.view(-1, cfg.group_size)
        lengths = rollout.lengths.float()
        num_tokens = int(rollout.lengths.sum())
        metrics = {
            "step": step + 1, "reward_mean": float(rewards.mean()), "accuracy": float(scores.mean()),
            "zero_variance_groups": float((groups.max(1).values == groups.min(1).values).float().mean()),
            "response_len_mean": float(lengths.mean()), "response_len_max": int(rollout.lengths.max()),
            "truncated_frac": float((~rollout.finished).float().mean()),
            **{key: sum(values) / len(values) for key, values in update.items()},
            "lr": cfg.lr, "mix_rate": float(rollout.mixed.sum()) / max(num_tokens, 1),
            "mix_distance": mixing_distance(sampler.embed_tokens.weight, rollout),
            "logp_gap_mean": float(gap.mean()) if gap.numel() else 0.0,
            "logp_gap_max": float(gap.max()) if gap.numel() else 0.0,
            "skipped_minibatches": skipped, "prompts_dropped": prompts_dropped,
            "rollout_s": rollout_s, "score_s": score_s, "update_s": update_s,
            "rollout_tokens_per_s": num_tokens / rollout_s, "update_tokens_per_s": num_tokens * cfg.ppo_epochs / update_s,
        }
        # Each knob of the GRPO family logs what it did, only when it is on.
        if cfg.filter_groups != "none":
            metrics.update(groups_filtered=len(draws) * cfg.prompts_per_step - kept_groups,
                           groups_kept=len(trained.prompts) // cfg.group_size,
                           prompts_drawn=len(draws) * cfg.prompts_per_step,
                           refill_draws=len(draws) - 1, update_skipped=int(not len(trained.prompts)))
        if virtual_count:
            metrics["virtual_samples"] = virtual_count * len(trained.prompts) // cfg.group_size
        if cfg.mask_truncated:
            metrics["truncated_masked"] = int((~trained.finished).sum())
        if cfg.overlong_buffer > 0:
            metrics["overlong_penalty_mean"] = float(penalty.mean())
        if held_out and cfg.eval_every and (step + 1) % cfg.eval_every == 0:
            sampler.eval()
            metrics["held_out_accuracy"] = held_out_accuracy(sampler, held_out, tokenizer, pool,
                                                             max_new_tokens=cfg.max_new_tokens)
        metrics["step_s"] = time.perf_counter() - step_start
        with metrics_path.open("a") as f:
            f.write(json.dumps(metrics) + "\n")
        tqdm.write(format_line(metrics), file=sys.stdout)
        if cfg.log_completions_every and (step + 1) % cfg.log_completions_every == 0:
            for row in range(0, len(rows), max(1, len(rows) // 2))[:2]:
                tqdm.write(f"  [{rewards[row]:.0f}] answer {rows[row]['answer']!r} <- {texts[row][-200:]!r}",
                           file=sys.stdout)

        failures_in_a_row = failures_in_a_row + 1 if skipped and not update else 0
        if failures_in_a_row >= 3:
            pool.close()
            raise SystemExit(f"error: 3 steps in a row had a non-finite loss or gradient (last: step {step + 1}); "
                             "stopping. Lower --lr, check the data, or inspect metrics.jsonl.")
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < max_steps:
            save_checkpoint(out_dir, step + 1, policy, tokenizer, optimizer, batcher, generator, table, cfg)

    if max_steps > start_step:
        save_checkpoint(out_dir, max_steps, policy, tokenizer, optimizer, batcher, generator, table, cfg)
    if held_out:
        sampler.eval()
        summary["accuracy_after"] = held_out_accuracy(sampler, held_out, tokenizer, pool,
                                                      max_new_tokens=cfg.max_new_tokens)
        before = summary.get("accuracy_before")
        print(f"held-out accuracy after RL: {summary['accuracy_after']:.3f}"
              + (f" (before: {before:.3f})" if before is not None else ""))
    pool.close()
    history = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    summary.update(steps=len(history), final_reward_mean=sum(m["reward_mean"] for m in history[-5:]) / max(len(history[-5:]), 1),
                   reward_first=history[0]["reward_mean"] if history else None)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv=None) -> dict:
    return run(parse_config(argv, description="N-GRPO training (DESIGN.md §3).\n\n" + __doc__.split("\n\n")[1]))


if __name__ == "__main__":
    main()
