"""The demo's supervised warm start: teacher forcing on worked solutions until a random model answers at all
(a competence target checked on dev problems), and the greedy held-out accuracy the demo reports before and
after RL. A real run starts from a trained model and skips it (--sft-steps 0)."""


import torch

from data import PromptBatcher
from engine.logprobs import token_logprobs
from rollout import Sampling, generate
from runtime import distributed
from runtime.tracking import progress


def held_out_accuracy(model, problems: list[dict], tokenizer, pool, *, max_new_tokens: int,
                      batch_size: int = 64, world: distributed.World = distributed.World()) -> float:
    """Greedy accuracy on held-out problems (their prompt_ids already rendered). Under torchrun the batches
    are dealt to the ranks and the counts summed."""
    stop = (tokenizer.eos_token_id,)
    correct = 0
    for batch_index in distributed.deal(-(-len(problems) // batch_size), world):
        batch = problems[batch_index * batch_size : (batch_index + 1) * batch_size]
        rollout = generate(model, [p["prompt_ids"] for p in batch],
                           Sampling(temperature=0, max_new_tokens=max_new_tokens, stop_ids=stop))
        texts = tokenizer.batch_decode(rollout.responses(), skip_special_tokens=True)
        correct += sum(pool.score([(text, p["answer"]) for text, p in zip(texts, batch)]))
    return distributed.sum_across({"correct": correct}, world)["correct"] / len(problems)


def teacher_forced_step(model, optimizer, batch: list[dict], tokenizer, device, chunk_tokens: int) -> None:
    """One step of cross-entropy on the batch's worked solutions (and their EOS), given their prompts."""
    model.train()
    eos = tokenizer.eos_token_id
    answers = [tokenizer.encode(p["solution"], add_special_tokens=False) + [eos] for p in batch]
    sequences = [p["prompt_ids"] + a for p, a in zip(batch, answers)]
    L = max(map(len, sequences))
    ids = torch.tensor([s + [eos] * (L - len(s)) for s in sequences], device=device)  # [B, L], padded
    labels = ids[:, 1:]
    mask = torch.zeros_like(labels, dtype=torch.bool)  # [B, L - 1] the solution's tokens and its EOS
    for row, (p, a) in enumerate(zip(batch, answers)):
        mask[row, len(p["prompt_ids"]) - 1 : len(p["prompt_ids"]) - 1 + len(a)] = True
    with distributed.autocast(device):
        logp, _ = distributed.run_model(model, lambda m: token_logprobs(
            m.forward_hidden(ids[:, :-1]), m.output_weight, labels, chunk_tokens=chunk_tokens))
    loss = -(logp * mask).sum() / mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def warm_start(model, problems: list[dict], tokenizer, cfg, device, pool, *, dev_model=None,
               quiet: bool = False) -> dict:
    """Teacher forcing on worked solutions (`solution` ends in \\boxed{answer}) so that a random model can
    answer at all: cross-entropy on the response tokens, AdamW, at most sft_steps steps. `model` is a
    Transformer or a distributed.ModelCall; under torchrun every rank takes the same batches (a demo-sized warm
    start), so FSDP's averaged gradient is the one-process one.

    With sft_target_accuracy it stops once greedy accuracy on the last sft_dev_problems problems (kept out of
    its batches) has reached the target at two checks in a row, checked every sft_eval_every steps (one check
    on 100 problems can pass on a lucky draw: std ~0.05). A fixed step count hands RL whatever competence the
    CPU's fp32 rounding made of the trajectory; a target hands it the same skill every time. Returns
    {"warm_start_steps": steps run, "warm_start_dev_accuracy": the last check or None}. dev_model() gives
    the plain Transformer the dev checks decode with (default: `model` itself). quiet: no bar and no summary
    line (the other ranks of a torchrun job: rank 0 says it)."""
    usable = [p for p in problems if p.get("solution")]
    dev = usable[-cfg.sft_dev_problems :] if cfg.sft_target_accuracy > 0 else []
    usable = usable[: len(usable) - len(dev)]
    if not usable:
        raise SystemExit("error: --sft-steps needs problems with worked solutions (a 'solution' field)"
                         + (f", more than --sft-dev-problems ({cfg.sft_dev_problems})" if dev else ""))
    batcher = PromptBatcher(usable, cfg.sft_batch_size, seed=cfg.seed + 1)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.sft_lr, weight_decay=0.0)
    dev_accuracy, steps, checks_passed = None, 0, 0
    bar = progress(total=cfg.sft_steps, desc="warm start", unit="step", leave=False, disable=quiet)
    try:
        for steps in range(1, cfg.sft_steps + 1):
            teacher_forced_step(model, optimizer, batcher.next_batch(), tokenizer, device, cfg.logprob_chunk_tokens)
            bar.update()
            if dev and steps % cfg.sft_eval_every == 0:
                model.eval()
                checked = dev_model() if dev_model is not None else model
                dev_accuracy = held_out_accuracy(checked, dev, tokenizer, pool, max_new_tokens=cfg.max_new_tokens)
                bar.set_postfix(dev_accuracy=f"{dev_accuracy:.3f}")
                checks_passed = checks_passed + 1 if dev_accuracy >= cfg.sft_target_accuracy else 0
                if checks_passed == 2:
                    break
        bar.total = steps  # a target reached early ends the bar at 100%, not at steps / sft_steps with a time to go
    finally:
        bar.close()  # its last line before whatever stops the run says so
    model.eval()
    reached = "" if dev_accuracy is None else (f"; greedy accuracy on {len(dev)} dev problems "
                                               f"{dev_accuracy:.3f} (target {cfg.sft_target_accuracy:.2f})")
    if not quiet:
        print(f"warm start: {steps} teacher-forced steps{reached}")
    return {"warm_start_steps": steps, "warm_start_dev_accuracy": dev_accuracy}
