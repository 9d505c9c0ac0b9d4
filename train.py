"""N-GRPO training: the command line and the step loop. The algorithm lives in ngrpo.py, the sampler
in rollout.py, the reward in reward.py; this file builds a run, moves data between them and keeps
its outputs.

    python train.py --model deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B      # the paper's recipe (paper-1.5b)
    python train.py --preset demo                                          # offline, CPU, 63-84 s (2 threads)

One step (`run_steps`; what runs by default: ngrpo.py's docstring): collect_groups (draw prompts ->
G rollouts each -> rewards, refilled and filtered as --filter-groups says) -> train_on
(ngrpo.update: group advantages -> replayed old / reference log-probs -> clipped mini-batch steps)
-> step_metrics, then after_step (evaluations, the log, checkpoints, stops). Outputs in --out-dir:
config.json, metrics.jsonl, completions.jsonl, checkpoints/step-N/ (Hugging Face layout +
trainer_state.pt), summary.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

import eval as evaluation
from config import Config
from data import (
    DataError,
    HubUnreachable,
    PromptBatcher,
    describe_load_error,
    load_problems,
    load_tokenizer,
    tokenize_problems,
)
from engine.decoder import release_decoder
from estimators import EntropyControl
from model import MODEL_PRESETS, load_model, resolve_checkpoint, resolve_device
from neighbors import table_for
from ngrpo import MISMATCH_METRICS, keep_groups, overlong_penalty, scheduled_lr, shaped_rewards, update
from reward import RewardPool, extract_answer
from rollout import Exploration, Rollout, Sampling, exploration_from_config, generate, sampling_from_config
from runtime import checkpoint, distributed, guard, lora, plan
from runtime.checkpoint import checkpoint_dirs
from runtime.cli import parse_config
from runtime.diagnostics import FastRules, Watch, group_diversity, mixture_closeness, think_end_id, thinking_metrics
from runtime.guard import RunError
from runtime.tracking import END_OF_RUN, Tracker, check_report_to, read_summary, step_line, write_summary
from runtime.warmstart import held_out_accuracy, warm_start

if TYPE_CHECKING:  # a type only: importing transformers costs a second, and a run may need no tokenizer of it
    from transformers import PreTrainedTokenizerBase


@dataclass
class Run:
    """What a training run holds from step to step, built once by `setup`."""

    cfg: Config
    world: distributed.World  # this process under torchrun; a world of one without it
    out_dir: Path
    device: torch.device
    tokenizer: PreTrainedTokenizerBase
    policy: torch.nn.Module  # fp32, trained (the Transformer; under torchrun its parameters are FSDP shards)
    trainer: distributed.ModelCall  # what the update runs the policy through (FSDP's root under torchrun)
    sampler: torch.nn.Module  # the policy itself on one CPU; else a copy (bf16 on GPU), merged with --lora-rank
    optimizer: torch.optim.Optimizer
    problems: list[dict]
    held_out: list[dict]
    batcher: PromptBatcher
    pool: RewardPool
    sampling: Sampling
    exploration: Exploration
    reference: torch.nn.Module | None = None  # the KL term's frozen model (bf16 on GPU)
    table: torch.Tensor | None = None  # the neighbor table in use ([V, k]), for --explore neighbor
    val_sets: list = field(default_factory=list)  # --val-data as eval.py's (name, problems, kind)
    tracker: Tracker | None = None  # --report-to (rank 0 only)
    summary: dict = field(default_factory=dict)
    metrics_path: Path | None = None  # OUT/metrics.jsonl on rank 0 (None elsewhere), set when the run begins
    watch: Watch = field(default_factory=Watch)
    entropy: EntropyControl = field(default_factory=EntropyControl)  # the bonus's coefficient (adaptive: its state)

    def refresh_sampler(self) -> None:  # after every update
        if lora.has_adapters(self.policy):  # the sampler decodes with the merged weights, W + scale B A
            lora.merge_into(self.policy, self.sampler)
        elif self.sampler is not self.policy:
            distributed.copy_weights(self.policy, self.sampler)

    def held_out_accuracy(self) -> float:
        self.sampler.eval()
        return held_out_accuracy(self.sampler, self.held_out, self.tokenizer, self.pool,
                                 max_new_tokens=self.cfg.max_new_tokens, world=self.world)


@dataclass
class Groups:
    """One step's rollouts and rewards: every drawn row, and the rows the update trains on (the
    groups that survive --filter-groups; all of them without it). G consecutive rows are one
    prompt's group."""

    rows: list[dict]  # the problem of each drawn row
    texts: list[str]  # the decoded responses
    answers: list[str | None]  # each response's answer as the reward read it (None: none)
    rollout: Rollout  # every drawn row
    scores: torch.Tensor  # [N] the reward function's verdicts
    rewards: torch.Tensor  # [N] scores + shaping (--overlong-buffer)
    trained: Rollout
    trained_rewards: torch.Tensor
    draws: int  # prompt batches drawn (1 + refills)
    groups_kept: int  # groups with a learning signal among all draws (what --refill counts)
    rollout_s: float
    score_s: float
    reward_errors: int = 0  # checks that failed (a --reward function raised, died or returned no number)
    reward_timeouts: int = 0  # checks that ran past --reward-timeout-s
    judge: dict = field(default_factory=dict)  # --judge: its calls, flips, capped pairs, errors, timeouts


# ----------------------------------------------------------------------------- the step loop


def run(cfg: Config) -> dict:
    """The whole run; returns the summary also written to OUT/summary.json. Under torchrun every
    rank runs this; rank 0 alone writes the outputs and prints."""
    try:
        cfg.check_trainable()
        world = distributed.init_world(cfg.device, cfg.dist_timeout_s)
    except ValueError as error:
        raise RunError(str(error)) from None
    try:
        with guard.exclusive(Path(cfg.out_dir), "train.py") if world.is_main else contextlib.nullcontext():
            summary = run_steps(cfg, world)
        distributed.barrier(world)  # every rank done with its collectives before the group is torn down
        return summary
    except guard.Refused as error:  # another run holds --out-dir, or the OS refused a write
        raise RunError(str(error)) from None
    except OSError as error:  # a write elsewhere in --out-dir (config.json, summary.json, ...)
        if error.errno not in guard.REFUSED_WRITES:
            raise
        out_dir = Path(cfg.out_dir)
        raise RunError(f"cannot write {error.filename or out_dir}: {guard.reason(error, out_dir)}") from None
    finally:
        distributed.close_world(world)


def run_steps(cfg: Config, world: distributed.World) -> dict:
    """`run` in an initialised world: a run begun (or resumed), its steps, the summary. Each step is
    the algorithm, rollouts -> rewards -> update -> metrics; everything else a step does
    (evaluations, the log, checkpoints, stopping on a signal or on failures) is `after_step`'s."""
    r, start_step, max_steps = begin(cfg, world)
    with guard.StopOnSignals() as interrupt:
        for step in tqdm(range(start_step, max_steps), initial=start_step, total=max_steps, desc="train",
                         file=sys.stderr, disable=None if world.is_main else True):
            step_start = time.perf_counter()
            if cfg.explore == "neighbor" and cfg.neighbor_refresh and step > start_step \
                    and step % cfg.neighbor_refresh == 0:
                r.table = shared_table(r)  # --neighbor-refresh: the table of the current weights
            groups = collect_groups(r, step)  # prompts -> G rollouts each -> rewards
            update_start = time.perf_counter()
            result, skipped = train_on(r, groups, step, max_steps)  # advantages -> clipped mini-batch steps
            metrics = step_metrics(r, step + 1, groups, result, skipped, time.perf_counter() - update_start)
            after_step(r, step + 1, max_steps, groups, metrics, interrupt, step_start,
                       failed=bool(skipped and not result))
    if max_steps > start_step:
        checkpoint.save_checkpoint(r, max_steps)
    return finish(r)


def begin(cfg: Config, world: distributed.World) -> tuple[Run, int, int]:
    """(the run, its first step, its last): --out-dir claimed, the run built and resumed or started
    fresh, and on a fresh start the evaluations before RL."""
    out_dir, resume_from = checkpoint.claim_out_dir(cfg) if world.is_main else (Path(cfg.out_dir), None)
    resume_from = distributed.broadcast_object(resume_from, world)  # rank 0's choice, after it has checked
    say(world, f"out dir: {out_dir}" + (f" ({world.size} processes)" if world.distributed else ""))
    r = setup(cfg, world, out_dir)
    start_step = restore_checkpoint(r, resume_from) if resume_from else start_fresh(r)
    max_steps = cfg.max_steps or -(-len(r.problems) // cfg.prompts_per_step)
    r.metrics_path = checkpoint.trim_metrics(out_dir / "metrics.jsonl", start_step) if world.is_main else None
    if r.held_out and start_step == 0:
        r.summary["accuracy_before"] = r.held_out_accuracy()
        say(world, f"held-out accuracy before RL: {r.summary['accuracy_before']:.3f} ({len(r.held_out)} problems)")
    if r.val_sets and cfg.val_before_train and start_step == 0:
        r.summary["val_before"] = validate(r, 0)
        say(world, "validation before RL: " + ", ".join(f"{k} {v:.3f}" for k, v in r.summary["val_before"].items()))
    if world.is_main:  # what the run's start found (a resume keeps what its first start wrote: read_summary)
        write_summary(r.out_dir, r.summary)
    return r, start_step, max_steps


def train_on(r: Run, groups: Groups, step: int, max_steps: int) -> tuple[dict, int]:
    """The update on the groups the step keeps (ngrpo.update) at this step's learning rate, then the sampler
    refreshed: (its metrics, mini-batches skipped for a non-finite loss); ({}, 0) when no group was kept."""
    for group in r.optimizer.param_groups:
        group["lr"] = scheduled_lr(r.cfg, step, max_steps)
    result, skipped = ({}, 0) if not len(groups.trained.prompts) else update(
        r.trainer, r.reference, r.optimizer, groups.trained, groups.trained_rewards, r.cfg, r.world, r.entropy)
    r.refresh_sampler()
    return result, skipped


def after_step(r: Run, step: int, max_steps: int, groups: Groups, metrics: dict, interrupt,
               step_start: float, *, failed: bool) -> None:
    """The bookkeeping of step `step` (1-based) once its metrics are known: held-out accuracy and validation
    when due (and the best checkpoint kept), the log line and metrics.jsonl, the failure counters (failed: every
    mini-batch of the update was skipped), a signal (every rank stops after the same step, with a checkpoint) and
    the periodic checkpoint."""
    cfg, watch = r.cfg, r.watch
    if r.held_out and cfg.eval_every and step % cfg.eval_every == 0:
        metrics["held_out_accuracy"] = r.held_out_accuracy()
    if r.val_sets and ((cfg.val_every and step % cfg.val_every == 0) or step == max_steps):
        metrics.update(validate(r, step))
        keep_if_best(r, step, metrics)
    metrics["step_s"] = time.perf_counter() - step_start
    if warning := watch.signal.observe(metrics):  # once per cause: the line, metrics.jsonl, summary.json
        metrics["warning"] = warning
        r.summary.setdefault("warnings", []).append(f"step {step}: {warning}")
    if r.world.is_main:
        log_step(r, metrics, groups)
    watch.failed_in_a_row = watch.failed_in_a_row + 1 if failed else 0
    watch.scoreless_in_a_row = check_scored(r, groups, step, watch.scoreless_in_a_row)
    if watch.failed_in_a_row >= 3:
        raise RunError(f"3 steps in a row had a non-finite loss or gradient (last: step {step}); "
                       "stopping. Lower --lr, check the data, or inspect metrics.jsonl.")
    stop = distributed.max_across({"signal": float(interrupt.signal_number)}, r.world)["signal"]
    if stop:  # every rank stops after the same step, whichever got the signal
        checkpoint.save_checkpoint(r, step)
        raise KeyboardInterrupt(step, int(stop))
    if cfg.save_every and step % cfg.save_every == 0 and step < max_steps:
        checkpoint.save_checkpoint(r, step)


def collect_groups(r: Run, step: int) -> Groups:
    """Draws a batch of prompts, samples G responses for each (in calls of --rollout-batch-size rows) and
    scores them; with --refill draws more batches until prompts_per_step groups carry a learning signal
    (or --max-refill-draws is reached). Then keeps the groups --filter-groups keeps, at most prompts_per_step.
    Under torchrun the calls are dealt to the ranks and every rank ends with the whole step."""
    cfg = r.cfg
    rows, texts, answers, rollouts, scores, groups_kept, rollout_s, score_s = [], [], [], [], [], 0, 0.0, 0.0
    counted_before = r.pool.counts()
    while True:
        batch_rows = [p for p in r.batcher.next_batch() for _ in range(cfg.group_size)]  # G rows per prompt
        r.sampler.eval()  # bf16 on GPU: generate runs it as it is, without autocast
        sample = dealt_rollouts if r.world.distributed else streamed_rollouts
        rollout, batch_texts, batch_answers, batch_scores, batch_rollout_s, batch_score_s = sample(
            r, batch_rows, step, len(rollouts))
        rollout_s, score_s = rollout_s + batch_rollout_s, score_s + batch_score_s
        rows, texts, scores = rows + batch_rows, texts + batch_texts, scores + [batch_scores]
        answers += batch_answers
        rollouts.append(rollout)
        groups_kept += int(keep_groups(batch_scores, cfg.group_size, cfg.filter_groups).sum())
        if not cfg.refill or groups_kept >= cfg.prompts_per_step or len(rollouts) > cfg.max_refill_draws:
            break
    release_decoder(r.sampler)  # the KV cache and graphs give their memory back to the update
    rollout, scores = Rollout.concat(rollouts), torch.cat(scores)
    rewards = shaped_rewards(scores, rollout.lengths.cpu(), cfg)
    trained, trained_rewards = rollout, rewards
    if cfg.filter_groups != "none":
        kept = keep_groups(scores, cfg.group_size, cfg.filter_groups).nonzero()[:, 0][: cfg.prompts_per_step]
        index = [int(g) * cfg.group_size + j for g in kept for j in range(cfg.group_size)]
        trained, trained_rewards = rollout.select(index), rewards[index]
    counted = distributed.sum_across({k: v - counted_before[k] for k, v in r.pool.counts().items()}, r.world)
    return Groups(rows=rows, texts=texts, answers=answers, rollout=rollout, scores=scores, rewards=rewards,
                  trained=trained, trained_rewards=trained_rewards, draws=len(rollouts), groups_kept=groups_kept,
                  rollout_s=rollout_s, score_s=score_s, reward_errors=int(counted.pop("errors")),
                  reward_timeouts=int(counted.pop("timeouts")), judge={k: int(v) for k, v in counted.items()})


def check_scored(r: Run, groups: Groups, step: int, scoreless_in_a_row: int) -> int:
    """Counts the steps in a row where no answer could be scored and stops the run at --reward-fail-steps of
    them: a reward that always fails would otherwise train on zeros and end as if all were well."""
    scoreless = groups.reward_errors + groups.reward_timeouts >= len(groups.rows)
    scoreless_in_a_row = scoreless_in_a_row + 1 if scoreless else 0
    if r.cfg.reward_fail_steps and scoreless_in_a_row >= r.cfg.reward_fail_steps:
        raise RunError(f"no answer could be scored in {scoreless_in_a_row} steps in a row (last: step {step}); "
                       f"last error: {r.pool.last_error}; fix it (or raise --reward-timeout-s)")
    return scoreless_in_a_row


def streamed_rollouts(r: Run, batch_rows: list[dict], step: int, draw: int):
    """One prompt batch's rollouts in one process: --rollout-batch-size rows decode at once and a finished
    row's slot takes the next waiting row. Every draw is keyed by (seed, step, draw, row), so a row's
    response depends neither on its slot and batch-mates nor on the process that decodes it. Returns
    (rollout, texts, answers, scores, rollout seconds, scoring seconds)."""
    start = time.perf_counter()
    rollout = generate(r.sampler, [p["prompt_ids"] for p in batch_rows], r.sampling, r.exploration,
                       neighbor_table=r.table, seed=(r.cfg.seed, step, draw),
                       slots=r.cfg.rollout_batch_size or None, progress=True)
    rollout_s = time.perf_counter() - start
    texts = r.tokenizer.batch_decode(rollout.responses(), skip_special_tokens=True)
    start = time.perf_counter()
    answers, scores = scored(r, texts, batch_rows)
    return rollout, texts, answers, scores, rollout_s, time.perf_counter() - start


def dealt_rollouts(r: Run, batch_rows: list[dict], step: int, draw: int):
    """One prompt batch's rollouts under torchrun: its calls of --rollout-batch-size rows (0: one
    call per rank) are dealt to the ranks; row i draws from (seed, step, draw, i) as in one process,
    so it comes out the same whichever rank, and however many, decode it. Each rank scores its own
    rows; every rank gets back the whole batch in row order. Returns (rollout, texts, answers,
    scores, rollout seconds, this rank's scoring seconds)."""
    cfg, world = r.cfg, r.world
    start = time.perf_counter()
    per_call = min(cfg.rollout_batch_size or len(batch_rows), -(-len(batch_rows) // world.size))  # every rank busy
    starts = range(0, len(batch_rows), per_call)
    done, score_s = [], 0.0
    for call in distributed.deal(len(starts), world):
        call_rows = batch_rows[starts[call] : starts[call] + per_call]
        rollout = generate(r.sampler, [p["prompt_ids"] for p in call_rows], r.sampling, r.exploration,
                           neighbor_table=r.table, seed=(cfg.seed, step, draw),
                           row_keys=range(starts[call], starts[call] + len(call_rows)), progress=world.is_main)
        call_texts = r.tokenizer.batch_decode(rollout.responses(), skip_special_tokens=True)
        score_start = time.perf_counter()
        call_answers, call_scores = scored(r, call_texts, call_rows)
        score_s += time.perf_counter() - score_start
        # on the CPU to cross ranks: a pickled CUDA tensor would land on the receiving rank's GPU of
        # the same number
        done.append((rollout.to("cpu"), call_texts, call_answers, call_scores))
    calls = distributed.gather_dealt(done, len(starts), world)
    rollout = Rollout.concat([c[0] for c in calls]).to(r.device)
    texts, answers = [t for c in calls for t in c[1]], [a for c in calls for a in c[2]]
    return rollout, texts, answers, torch.cat([c[3] for c in calls]), time.perf_counter() - start - score_s, score_s


def scored(r: Run, texts: list[str], rows: list[dict]) -> tuple[list[str | None], torch.Tensor]:
    """(answers as the reward read them, rewards [n]) of a call's responses; another grader's read here."""
    r.pool.answers = []
    scores = torch.tensor(r.pool.score([(text, row["answer"]) for text, row in zip(texts, rows)]))
    answers = r.pool.answers if len(r.pool.answers) == len(texts) else [extract_answer(t) for t in texts]
    return list(answers), scores


def step_metrics(r: Run, step: int, groups: Groups, result: dict, skipped: int, update_s: float) -> dict:
    """What metrics.jsonl records of a step (README, "The real run", lists each field)."""
    cfg, rollout = r.cfg, groups.rollout
    per_group = groups.scores.view(-1, cfg.group_size)
    num_tokens = int(rollout.lengths.sum())
    closeness = mixture_closeness(r.sampler.embed_tokens.weight, rollout.cand_ids, rollout.cand_weights,
                                  rollout.response_ids, rollout.mixed)  # None when no step was mixed
    metrics = {
        "step": step, "reward_mean": float(groups.rewards.mean()), "accuracy": float(groups.scores.mean()),
        "zero_variance_groups": float((per_group.max(1).values == per_group.min(1).values).float().mean()),
        "response_len_mean": float(rollout.lengths.float().mean()), "response_len_max": int(rollout.lengths.max()),
        "truncated_frac": float((~rollout.finished).float().mean()),
        **result,
        "lr": r.optimizer.param_groups[0]["lr"], "mix_rate": float(rollout.mixed.sum()) / max(num_tokens, 1),
        "mix_distance": 0.0 if closeness is None else closeness[0],
        # The sampler-vs-policy mismatch and what --rollout-is did with it, on every step (0 when none was trained).
        **{key: result.get(key, 0.0) for key in MISMATCH_METRICS},
        "skipped_minibatches": skipped, "prompts_dropped": r.summary["prompts_dropped"],
        "reward_errors": groups.reward_errors, "reward_timeouts": groups.reward_timeouts, **groups.judge,
        # How different a group's responses are (docs/experiments.md): the answers the reward read, compared by our
        # grader's exact rules in this process (no second trip to its workers), or as strings when the reward is
        # math-verify's or the user's.
        **group_diversity(groups.texts, groups.scores.tolist(), cfg.group_size, answers=groups.answers,
                          same=FastRules(r.pool) if cfg.grader == "ours" and not cfg.reward else None),
        "rollout_s": groups.rollout_s, "score_s": groups.score_s, "update_s": update_s,
        "rollout_tokens_per_s": num_tokens / groups.rollout_s,
        "update_tokens_per_s": num_tokens * cfg.ppo_epochs / update_s,
    }
    if closeness is not None:  # mixed steps only: cos(fed mixture, E[y]); the paper reports 0.9985
        metrics["mix_cosine"] = closeness[1]
    if (think_end := think_end_id(r.tokenizer)) is not None:  # R1's `thinking </think> answer`, each part's length
        metrics.update(thinking_metrics(rollout.response_ids, rollout.lengths, rollout.mixed, think_end,
                                        groups.scores > 0, rollout.steps.get("cold_stop")))
    # Each knob of the GRPO family logs what it did, only when it is on.
    trained_rows = len(groups.trained.prompts)
    if cfg.filter_groups != "none":
        metrics.update(groups_filtered=groups.draws * cfg.prompts_per_step - groups.groups_kept,
                       groups_kept=trained_rows // cfg.group_size, prompts_drawn=groups.draws * cfg.prompts_per_step,
                       refill_draws=groups.draws - 1, update_skipped=int(not trained_rows))
    if cfg.adv_estimator == "negative":
        metrics["virtual_samples"] = cfg.virtual_max_count * trained_rows // cfg.group_size
    if cfg.mask_truncated:
        metrics["truncated_masked"] = int((~groups.trained.finished).sum())
    if cfg.overlong_buffer > 0:
        penalty = overlong_penalty(rollout.lengths.cpu(), cfg.max_new_tokens, cfg.overlong_buffer,
                                   cfg.overlong_penalty_factor)
        metrics["overlong_penalty_mean"] = float(penalty.mean())
    return metrics


def log_step(r: Run, metrics: dict, groups: Groups) -> None:
    """Appends the step to metrics.jsonl, prints its line, reports skipped mini-batches at once, and every
    --log-completions-every steps prints two completions and appends them to completions.jsonl."""
    metrics_path = r.metrics_path
    try:
        with metrics_path.open("a") as f:
            f.write(json.dumps(metrics) + "\n")
    except OSError as error:
        raise guard.Refused(f"cannot write {metrics_path}: {guard.reason(error, metrics_path)}") from None
    r.tracker.log(metrics, metrics["step"])
    tqdm.write(step_line(metrics), file=sys.stdout)
    if "warning" in metrics:
        tqdm.write(f"warning: step {metrics['step']}: {metrics['warning']}", file=sys.stderr)
    if metrics["skipped_minibatches"]:
        tqdm.write(f"warning: step {metrics['step']}: {metrics['skipped_minibatches']} mini-batch(es) skipped: "
                   f"non-finite loss or gradient (loss {metrics.get('loss', float('nan'))})", file=sys.stderr)
    if metrics["reward_errors"] or metrics["reward_timeouts"]:
        tqdm.write(f"warning: step {metrics['step']}: {metrics['reward_errors']} reward error(s), "
                   f"{metrics['reward_timeouts']} timeout(s) of {len(groups.rows)} answers, scored 0 "
                   f"(last: {r.pool.last_error})", file=sys.stderr)
    every = r.cfg.log_completions_every
    if not every or metrics["step"] % every:
        return
    logged = []
    with (r.out_dir / "completions.jsonl").open("a") as f:
        for row in range(0, len(groups.rows), max(1, len(groups.rows) // 2))[:2]:
            problem, text = groups.rows[row], groups.texts[row]
            record = {"step": metrics["step"], "prompt": r.tokenizer.decode(problem["prompt_ids"]),
                      "response": text, "extracted": groups.answers[row], "reference": problem["answer"],
                      "reward": float(groups.rewards[row])}
            f.write(json.dumps(record) + "\n")
            logged.append(record)
            tqdm.write(f"  reward {record['reward']:.0f} | reference {problem['answer']!r} | extracted "
                       f"{record['extracted']!r} | response ...{text[-160:]!r}", file=sys.stdout)
    r.tracker.log_completions(logged, metrics["step"])


def validate(r: Run, step: int) -> dict:
    """eval.py's protocol (evaluation.evaluate) on --val-data with the current sampler, no mixing:
    returns {"val/<benchmark>/mean@n" or "pass@k": value}; samples.jsonl and results.json go to
    OUT/val/step-N/."""
    cfg = r.cfg
    sampling = replace(r.sampling, temperature=cfg.val_temperature, top_p=cfg.val_top_p, top_k=0)
    items = sum(len(problems) for _, problems, _ in r.val_sets) * cfg.val_n
    longest = max(len(p["prompt_ids"]) for _, problems, _ in r.val_sets for p in problems)
    batch_size = cfg.rollout_batch_size or plan.auto_batch_size(r.sampler, longest + cfg.max_new_tokens,
                                                                      items)
    batch_size = distributed.broadcast_object(batch_size, r.world)  # rank 0's: the batches must agree
    r.sampler.eval()
    results = evaluation.evaluate(r.val_sets, evaluation.sampler_fn(r.sampler, r.tokenizer, sampling, Exploration()),
                                  n=cfg.val_n, out_dir=r.out_dir / "val" / f"step-{step}", batch_size=batch_size,
                                  seed=cfg.seed, score_fn=lambda pairs, kind, name: r.pool.score(pairs, kind=kind),
                                  progress=False, world=r.world,
                                  scored_by={"grader": cfg.grader, "reward": cfg.reward,
                                             "require_boxed": cfg.require_boxed,
                                             "rel_tol": {name: cfg.rel_tol for name, _, _ in r.val_sets}})
    return {f"val/{name}/{key}": value for name, row in results.items() for key, value in row.items()
            if key.startswith(("mean@", "pass@"))}


def keep_if_best(r: Run, step: int, metrics: dict) -> None:
    """--keep-best METRIC: when this step's validation beats every earlier one, its weights (Hugging
    Face layout) replace OUT/best, with best.json saying which step and value; written aside and
    renamed."""
    name = r.cfg.keep_best
    if not name:
        return
    if name not in metrics:
        found = ", ".join(key for key in metrics if key.startswith("val/"))
        raise RunError(f"--keep-best {name}: validation gives no such metric (it gives {found})")
    best_path = r.out_dir / "best"
    best = json.loads((best_path / "best.json").read_text()) if (best_path / "best.json").exists() else None
    best = distributed.broadcast_object(best, r.world)  # rank 0's view of the file decides, for every rank
    if best is not None and metrics[name] <= best["value"]:
        return
    tmp = Path(tempfile.mkdtemp(prefix=".best-", dir=r.out_dir)) if r.world.is_main else None
    checkpoint.save_weights(r, tmp)
    if r.world.is_main:
        record = {"step": step, "metric": name, "value": metrics[name]}
        (tmp / "best.json").write_text(json.dumps(record) + "\n")
        if best_path.exists():
            old = best_path.rename(r.out_dir / f".best-old-{os.getpid()}")
            os.replace(tmp, best_path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, best_path)
    r.summary["best"] = {"step": step, "metric": name, "value": metrics[name]}


def finish(r: Run) -> dict:
    """The held-out accuracy after training, summary.json, and the final summary line (rank 0 writes
    and prints; every rank returns rank 0's summary)."""
    if r.held_out:
        r.summary["accuracy_after"] = r.held_out_accuracy()
    r.pool.close()
    if r.tracker is not None:
        r.tracker.close()
    if not r.world.is_main:
        return distributed.broadcast_object(None, r.world)
    if (r.out_dir / "best" / "best.json").exists():
        r.summary["best"] = json.loads((r.out_dir / "best" / "best.json").read_text())
    history = [json.loads(line) for line in r.metrics_path.read_text().splitlines()]
    last = history[-5:]
    r.summary.update(steps=len(history), reward_first=history[0]["reward_mean"] if history else None,
                     final_reward_mean=sum(m["reward_mean"] for m in last) / max(len(last), 1))
    write_summary(r.out_dir, r.summary)
    line = f"done: {len(history)} steps"
    if history:
        line += (f", reward {r.summary['reward_first']:.3f} (step 1) -> {r.summary['final_reward_mean']:.3f} "
                 f"(last {len(last)})")
    if "accuracy_after" in r.summary:
        after, before = r.summary["accuracy_after"], r.summary.get("accuracy_before")
        gain = "" if before is None else f" (before: {before:.3f}, {100 * (after - before):+.1f} points)"
        print(f"held-out accuracy after RL: {r.summary['accuracy_after']:.3f}{gain}")
    print(f"{line}; outputs in {r.out_dir}")
    return distributed.broadcast_object(r.summary, r.world)


# ----------------------------------------------------------------------------- setting a run up


def say(world: distributed.World, text: str, file=None) -> None:
    """print, on rank 0 only (to stdout as it is when called: a caller may have redirected it)."""
    if world.is_main:
        print(text, file=file or sys.stdout, flush=True)


def load_policy(cfg: Config, device: torch.device, *, seed: int):
    """The fp32 model to train (the random tiny preset, or a checkpoint) and its tokenizer."""
    flag = f"--model {cfg.model}"
    try:
        policy = load_model(cfg.model, dtype=torch.float32, device=device, seed=seed)
        flag = f"--tokenizer {cfg.tokenizer}" if cfg.tokenizer else flag
        tokenizer = load_tokenizer(cfg.tokenizer or cfg.model)
    except Exception as error:  # OSError, ValueError, a corrupt safetensors file, the hub: one line
        raise RunError(describe_load_error(error, flag)) from None
    return policy, tokenizer


def load_training_data(cfg: Config, tokenizer) -> tuple[list[dict], list[dict], int]:
    """(training problems, held-out problems, prompts dropped for length), prompts rendered."""
    try:
        problems = load_problems(cfg.data, split=cfg.data_split)
    except (DataError, OSError) as error:
        raise RunError(describe_load_error(error, f"--data {cfg.data}")) from None
    problems, dropped = tokenize_problems(problems, tokenizer, max_prompt_tokens=cfg.max_prompt_tokens,
                                          final_period=False, instruction=cfg.instruction)
    if not problems:
        raise RunError(f"every prompt of {cfg.data} is longer than --max-prompt-tokens {cfg.max_prompt_tokens}")
    held_out = []
    source = cfg.eval_data or (cfg.data if cfg.data.startswith("arith") else "")
    if cfg.eval_problems > 0 and source:
        try:
            held_out = load_problems(source, split="test" if source.startswith("arith") else cfg.data_split,
                                     limit=cfg.eval_problems)
        except (DataError, OSError) as error:
            raise RunError(describe_load_error(error, f"--eval-data {source}")) from None
        held_out, _ = tokenize_problems(held_out, tokenizer, max_prompt_tokens=cfg.max_prompt_tokens,
                                        final_period=False, instruction=cfg.instruction)
    return problems, held_out, dropped


def check_memory(cfg: Config, device: torch.device, world: distributed.World) -> None:
    """Refuses, before anything is loaded, a flag the model's vocabulary rules out (--num-neighbors,
    --soft-top-k), then a run whose memory plan (runtime/plan.py: what `--plan` prints) does not fit
    the device: each GPU's memory, or the machine's RAM on the CPU. A model whose config.json cannot
    be read is left to load_policy, which says why."""
    try:  # a hub id is resolved as load_model resolves it (its files come to disk; nothing is loaded yet)
        mc = plan.model_config(cfg.model if cfg.model in MODEL_PRESETS else str(resolve_checkpoint(cfg.model)))
    except HubUnreachable as error:  # said at once: load_policy would only ask the hub again
        raise RunError(describe_load_error(error, f"--model {cfg.model}")) from None
    except Exception:  # a missing or unreadable model: load_policy reports it
        return
    try:  # a flag the vocabulary rules out is the clearer message than the memory it would take
        cfg.check_model(mc, cfg.model)
    except ValueError as error:
        raise RunError(str(error)) from None
    kind = "cpu" if device.type == "cpu" else "cuda"
    have_gb = torch.cuda.mem_get_info(device)[1] / plan.GIB if kind == "cuda" else plan.default_gpu_gb("cpu")
    memory = plan.plan_memory(cfg, mc, gpus=world.size, gpu_gb=have_gb, device=kind)
    if not memory.fits:
        raise RunError(plan.refusal(cfg, mc, memory))
    larger = plan.larger_rollout_batch(cfg, mc, gpus=world.size, gpu_gb=have_gb, device=kind)
    if larger and world.is_main:
        print(f"note: --rollout-batch-size {larger} fits this GPU too ({cfg.rollout_batch_size} is set); more rows "
              "per call decode more tokens per second (--plan shows the memory)", file=sys.stderr)


def setup(cfg: Config, world: distributed.World, out_dir: Path) -> Run:
    """Models, data, sampler settings, optimizer and reward pool of a run, and config.json written.
    Under torchrun the policy is sharded (FSDP2) and AdamW holds the state of this rank's shards
    only."""
    try:
        device = world.device if world.distributed else resolve_device(cfg.device)
    except ValueError as error:
        raise RunError(str(error)) from None
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    check_memory(cfg, device, world)
    policy, tokenizer = load_policy(cfg, device, seed=cfg.seed)
    try:
        cfg.check_model(policy.cfg, cfg.model)
    except ValueError as error:
        raise RunError(str(error)) from None
    policy.gradient_checkpointing = cfg.grad_checkpointing
    if cfg.freeze_embeddings:
        policy.embed_tokens.weight.requires_grad_(False)
    problems, held_out, dropped = load_training_data(cfg, tokenizer)
    try:  # the last checks, before anything in --out-dir is deleted or written
        benchmarks = evaluation.load_benchmarks(cfg.val_data, cfg.val_limit or None, flag="--val-data")  # [] if none
        val_sets = evaluation.render_prompts(benchmarks, tokenizer, cfg.instruction)
        exploration = exploration_from_config(cfg, tokenizer)
        pool = RewardPool.of(cfg)
        check_report_to(cfg.report_to)
    except (ImportError, ValueError) as error:  # a bad --val-data, strategy setting or --reward; a package missing
        raise RunError(str(error)) from None
    if world.is_main:  # the other ranks only read what rank 0 writes
        if cfg.resume and not checkpoint_dirs(out_dir):
            print(f"--resume: no checkpoint in {out_dir / 'checkpoints'}; starting from the beginning",
                  file=sys.stderr)
        if not cfg.resume and checkpoint.run_outputs(out_dir):  # claim_out_dir allowed it: --overwrite, or the preset
            removed = checkpoint.clear_run(out_dir)  # all of it: a later --resume must never pick up the other run's
            why = "--overwrite" if cfg.overwrite else f"the {cfg.preset} preset replaces its own earlier output"
            print(f"{out_dir}: deleted the earlier run ({', '.join(removed)}): {why}", file=sys.stderr)
        out_dir.mkdir(parents=True, exist_ok=True)
        cfg.save_json(out_dir / "config.json")
    tracker = Tracker(cfg.report_to if world.is_main else "", out_dir, config=asdict(cfg))  # only rank 0 reports
    sampling = sampling_from_config(cfg, tokenizer)
    trainer = distributed.shard_model(policy, world)
    optimizer = torch.optim.AdamW([p for p in trainer.parameters() if p.requires_grad], lr=cfg.lr,
                                  weight_decay=cfg.weight_decay)
    return Run(cfg=cfg, world=world, out_dir=out_dir, device=device, tokenizer=tokenizer, policy=policy,
               trainer=trainer, sampler=policy, optimizer=optimizer, problems=problems, held_out=held_out,
               batcher=PromptBatcher(problems, cfg.prompts_per_step, seed=cfg.seed), pool=pool, sampling=sampling,
               exploration=exploration, val_sets=val_sets, tracker=tracker, entropy=EntropyControl.of(cfg),
               summary={"prompts": len(problems), "prompts_dropped": dropped})


def start_fresh(r: Run) -> int:
    """A new run: the warm start (if any), then the reference model, the sampler and the neighbor
    table."""
    if r.cfg.model == "tiny" and r.cfg.sft_steps == 0:  # else the zeros below look like a broken run
        say(r.world, "note: --model tiny is a random model and --sft-steps 0 teaches it nothing first: it cannot "
                     "answer, so its rewards stay at 0 (or near it), and with them every group's advantages and the "
                     "gradient (gn 0.00). Such a run checks the code paths; --preset demo warm-starts it so that RL "
                     "can learn.")
    if r.cfg.sft_steps > 0:
        # The dev checks decode with the policy itself, or under torchrun with an unsharded copy of
        # it.
        dev_model = (lambda: r.policy) if not r.world.distributed else \
            (lambda: distributed.unsharded_copy(r.policy, dtype=torch.float32, device=r.device))
        r.summary.update(warm_start(r.trainer, r.problems, r.tokenizer, r.cfg, r.device, r.pool,
                                    dev_model=dev_model, quiet=not r.world.is_main))
        checkpoint.save_weights(r, r.out_dir / "warm_start")  # the KL term's reference, also on resume
    if r.cfg.lora_rank:
        use_adapters(r)
    prepare_sampling(r, saved_table=None)
    return 0


def prepare_sampling(r: Run, saved_table: torch.Tensor | None) -> None:
    """The reference model (when KL is on), the sampler copy and the neighbor table.

    Under torchrun the reference is sharded like the policy (bf16 shards on GPU): at 7B that is 1.9
    GB per GPU instead of a 15 GB bf16 copy (docs/distributed.md). The sampler is an unsharded copy
    on every rank, since each rank decodes its own rows. With --lora-rank the reference is the
    policy with its adapters off and the sampler a merged copy (runtime/lora.py)."""
    cfg = r.cfg
    if cfg.kl_coef > 0 and lora.has_adapters(r.policy):
        r.reference = lora.WithoutAdapters(r.trainer)  # the frozen base itself: no second copy
    elif cfg.kl_coef > 0:
        source = r.out_dir / "warm_start" if cfg.sft_steps > 0 else None
        distributed.barrier(r.world)  # rank 0 has written warm_start/
        dtype = torch.bfloat16 if r.device.type == "cuda" else torch.float32
        # a random preset's reference is the policy's initial weights, drawn from the same seed
        reference = load_model(str(source or cfg.model), dtype=dtype, device=r.device, seed=cfg.seed)
        reference = reference.eval().requires_grad_(False)
        r.reference = distributed.shard_model(reference, r.world) if r.world.distributed else reference
    if r.device.type != "cpu" or r.world.distributed or lora.has_adapters(r.policy):
        dtype = torch.bfloat16 if r.device.type == "cuda" else torch.float32
        copy = lora.merged_copy if lora.has_adapters(r.policy) else distributed.unsharded_copy
        r.sampler = copy(r.policy, dtype=dtype, device=r.device)
    r.refresh_sampler()
    if cfg.explore == "neighbor":  # a resumed run keeps the table it was using (rebuilt only on refresh)
        r.table = saved_table.to(r.device) if saved_table is not None else shared_table(r)


def use_adapters(r: Run, saved: Path | None = None) -> None:
    """--lora-rank: adapters on the frozen policy (lora.adapt_policy; a resume's from `saved`),
    AdamW over them."""
    r.policy = lora.adapt_policy(r.policy, r.cfg, r.world, saved=saved,
                                 warm_start=r.out_dir / "warm_start" if r.cfg.sft_steps else None)
    if r.world.distributed:  # an adapted copy of the sharded policy: sharded in its turn
        r.trainer = distributed.shard_model(r.policy, r.world)
    r.optimizer = torch.optim.AdamW(lora.adapter_parameters(r.policy), lr=r.cfg.lr, weight_decay=r.cfg.weight_decay)


def shared_table(r: Run) -> torch.Tensor:
    """The neighbor table of the sampler's weights, built on rank 0 (which owns its on-disk cache)
    and broadcast: every rank mixes with the same table."""
    table = table_for(r.sampler, r.cfg, cache_dir=r.out_dir / "neighbors") if r.world.is_main else None
    if not r.world.distributed:
        return table
    return distributed.broadcast_object(table.cpu() if r.world.is_main else None, r.world).to(r.device)


# ----------------------------------------------------------------------------- checkpoints


def restore_checkpoint(r: Run, latest: Path) -> int:
    """Continues from the checkpoint `latest` (claim_out_dir has checked that it is intact and its
    settings): weights (by parameter name), optimizer, data cursor, RNG states and neighbor table.
    Returns its step."""
    state = torch.load(latest / "trainer_state.pt", map_location=r.device, weights_only=False)
    main = r.world.is_main  # rank 0 reads the weights and AdamW state; the others get their shards from it
    if r.cfg.lora_rank:  # the checkpoint holds the adapters alone, on the base the run began from
        use_adapters(r, saved=latest)
    else:
        weights = load_model(str(latest), dtype=torch.float32, device="cpu").state_dict() if main else None
        distributed.load_state_dict(r.policy, weights, r.world)
    optimizer_state = torch.load(latest / "optimizer.pt", map_location="cpu", weights_only=False) if main else None
    distributed.load_optimizer_state(r.trainer, r.optimizer, optimizer_state, r.world)
    r.batcher.load_state_dict(state["batcher"])
    torch.set_rng_state(state["torch_rng"].cpu())
    random.setstate(state["python_rng"])
    r.watch, r.entropy = state.get("watch", r.watch), state.get("entropy", r.entropy)
    if r.world.is_main:  # what the run's first start found (held-out accuracy before RL, the warm start) stays;
        earlier = read_summary(r.out_dir)  # what an earlier end found is found again at this run's end
        r.summary = {**{k: v for k, v in earlier.items() if k not in END_OF_RUN}, **r.summary}
    say(r.world, f"resumed from {latest} (step {state['step']})", sys.stderr)
    written_by = state.get("world_size", 1)
    if written_by != r.world.size:
        say(r.world, f"--resume: the checkpoint was written by {written_by} process(es), this run has "
            f"{r.world.size}: weights, AdamW state and data cursor resume as they were; the update's sums "
            "run in another order (float rounding); rollouts are keyed by row, not by process", sys.stderr)
    prepare_sampling(r, saved_table=state.get("neighbor_table"))
    return state["step"]


# ----------------------------------------------------------------------------- command line


def main(argv=None) -> dict:
    cfg = parse_config(argv, description="N-GRPO training.\n\n" + __doc__.split("\n\n")[1])
    try:
        with guard.sigterm_interrupts():
            return run(cfg)
    except KeyboardInterrupt as interrupt:  # (step, signal) when the loop stopped after a checkpoint
        resume = guard.resume_command(list(argv if argv is not None else sys.argv[1:]))
        if os.environ.get("RANK", "0") != "0":
            pass  # rank 0 says it once
        elif interrupt.args:
            print(f"interrupted: checkpoint of step {interrupt.args[0]} written; continue with: {resume}",
                  file=sys.stderr)
        else:
            latest = checkpoint_dirs(Path(cfg.out_dir))
            print("interrupted" + (f"; the latest checkpoint is {latest[-1]}; continue with: {resume}" if latest
                                   else " before the first checkpoint; nothing to resume"), file=sys.stderr)
        signum = interrupt.args[1] if len(interrupt.args) > 1 else 15 if isinstance(interrupt, guard.Terminated) else 2
        raise SystemExit(128 + signum) from None  # 130, 143


if __name__ == "__main__":
    main()
