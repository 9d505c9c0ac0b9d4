"""What a training step's metrics say about exploration, from what the step already has (no model calls, no
second trip to the reward's workers): how different a group's G responses are, and how close the fed mixtures
are to the sampled tokens. docs/experiments.md defines each key.

    group_diversity(texts, scores, group_size, answers=pool.answers, same=FastRules(pool))  -> {"div/...": ...}
    mixture_closeness(embed_weight, cand_ids, cand_weights, response_ids, mixed)  -> (mean distance, mean cos)
    thinking_metrics(response_ids, lengths, mixed, think_end, correct, forced)  -> {"think/...": ...}

research/analysis.py runs the same measures over evaluated runs.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from data import END_THINK
from grading.extract import extract_answer
from strategies import mixed_embeddings

NGRAM_ORDERS = (1, 2, 3, 4)

# ----------------------------------------------------------------------------- group diversity


def _verdicts(pairs: list[tuple[str, str]], same) -> list[bool]:
    """same(a, b) for each pair: `same` is a callable, or a RewardPool-like object whose equal() checks a
    batch in its worker processes (bounded time), or None for equality of the stripped strings."""
    if same is None:
        return [a.strip() == b.strip() for a, b in pairs]
    if hasattr(same, "equal"):
        return same.equal([([a], b) for a, b in pairs], getattr(same, "timeout_s", 5.0))
    return [bool(same(a, b)) for a, b in pairs]


@dataclass
class FastRules:
    """A reward pool's cheap exact rules alone, in this process (RewardPool.fast_verdicts): what a training step
    compares its groups' answers with. An undecided pair is not shown equal; nothing runs that the reward did not."""

    pool: object  # a RewardPool of our grader

    def equal(self, jobs: list[tuple[list[str], str]], timeout_s: float = 0.0) -> list[bool]:
        return [True in verdicts for verdicts in self.pool.fast_verdicts(jobs)]


def count_distinct_answers(groups: list[list[str]], same=None) -> list[int]:
    """Equivalence classes among each group's answers: an answer joins the class of the first earlier
    representative it is the same as, else starts a new one. All pairs a checker must decide are sent in
    one batch (identical strings are the same without asking).

    >>> same_number = lambda a, b: float(eval(a)) == float(eval(b))
    >>> count_distinct_answers([["1/2", "0.5", "2"], ["3", "3"]], same=same_number)
    [2, 1]
    """
    asked = sorted({(a, b) for group in groups for i, a in enumerate(group) for b in group[i + 1:] if a != b})
    known = dict(zip(asked, _verdicts(asked, same)))
    is_same = lambda a, b: a == b or known.get((a, b)) or known.get((b, a))

    counts = []
    for group in groups:
        representatives: list[str] = []
        for answer in group:
            if not any(is_same(rep, answer) for rep in representatives):
                representatives.append(answer)
        counts.append(len(representatives))
    return counts


def ngram_set(text: str, n: int) -> set[tuple[str, ...]]:
    """The distinct n-grams of a text's whitespace-separated words."""
    words = text.split()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def pairwise_distinct_ratio(texts: Sequence[str], n: int) -> list[float]:
    """For each pair of texts: the share of the pair's distinct n-grams that only one of the two uses,
    |S_a ^ S_b| / |S_a | S_b| = 1 - Jaccard(S_a, S_b). 0 = the same n-grams, 1 = none shared. A pair where
    neither text has n words has no value.

    >>> pairwise_distinct_ratio(["a b c", "a b d"], 1), pairwise_distinct_ratio(["a b c", "a b d"], 2)
    ([0.5], [0.6666666666666667])
    """
    sets = [ngram_set(text, n) for text in texts]
    ratios = []
    for i in range(len(sets)):
        for j in range(i + 1, len(sets)):
            union = len(sets[i] | sets[j])
            if union:
                ratios.append(1.0 - len(sets[i] & sets[j]) / union)
    return ratios


def group_diversity(texts: Sequence[str], scores: Sequence[float], group_size: int, *,
                    answers: Sequence[str | None] | None = None, same=None) -> dict:
    """Diversity of one step's groups: rows g*G .. g*G+G-1 of `texts` (decoded responses) and `scores`
    (correctness, 1 / 0: not a shaped reward) are group g. Returns averages over the step's groups:

    - div/distinct_answers: equivalence classes among a group's final answers (`answers`, None for none: as the
      reward read them, RewardPool.answers; else reward.extract_answer's), equal by `same(a, b)` or a RewardPool
      (a step's FastRules(pool): its exact rules here), so 1/2 and 0.5 count once; answerless responses left out
    - div/no_answer: fraction of responses without an extracted answer
    - div/mixed_groups: fraction of groups with at least one correct and one wrong response
    - div/distinct_n (n = 1..4): mean over all pairs of responses within a group of pairwise_distinct_ratio;
      absent when no pair has n words
    """
    if group_size < 1 or len(texts) % group_size or len(texts) != len(scores):
        raise ValueError(f"group_diversity: {len(texts)} texts and {len(scores)} scores do not form groups "
                         f"of {group_size}")
    groups = [list(texts[i : i + group_size]) for i in range(0, len(texts), group_size)]
    answers = [extract_answer(text) for text in texts] if answers is None else answers
    starts = range(0, len(texts), group_size)
    answered = [[a.strip() for a in answers[i : i + group_size] if a is not None] for i in starts]
    group_scores = [scores[i : i + group_size] for i in starts]
    metrics = {
        "div/distinct_answers": sum(count_distinct_answers(answered, same)) / len(groups),
        "div/no_answer": sum(a is None for a in answers) / len(answers),
        "div/mixed_groups": sum(max(g) > 0 >= min(g) for g in group_scores) / len(groups),
    }
    for n in NGRAM_ORDERS:
        ratios = [r for group in groups for r in pairwise_distinct_ratio(group, n)]
        if ratios:
            metrics[f"div/distinct_{n}"] = sum(ratios) / len(ratios)
    return metrics


def mixture_closeness(embed_weight: torch.Tensor, cand_ids: torch.Tensor, cand_weights: torch.Tensor,
                      response_ids: torch.Tensor, mixed: torch.Tensor, *,
                      chunk: int = 4096) -> tuple[float, float] | None:
    """(mean ||e_mixed - E[y]|| / ||E[y]||, mean cos(e_mixed, E[y])) over the mixed steps, in one pass; None
    when no step was mixed. Chunked: a step's mixed positions times K times d would not fit in memory at once.

    embed_weight [V, d]; cand_ids, cand_weights [N, T, K]; response_ids [N, T]; mixed [N, T] bool."""
    where = mixed.nonzero(as_tuple=True)
    if where[0].numel() == 0:
        return None
    ids, weights, actions = cand_ids[where], cand_weights[where], response_ids[where]  # [M, K], [M, K], [M]
    distance, cosine = 0.0, 0.0
    with torch.no_grad():
        for start in range(0, len(actions), chunk):
            part = slice(start, start + chunk)
            fed = mixed_embeddings(embed_weight, ids[part], weights[part]).float()  # [m, d]
            own = embed_weight[actions[part]].float()  # [m, d]
            distance += float(((fed - own).norm(dim=-1) / own.norm(dim=-1).clamp_min(1e-12)).sum())
            cosine += float(torch.nn.functional.cosine_similarity(fed, own, dim=-1).sum())
    return distance / len(actions), cosine / len(actions)


# ----------------------------------------------------------------------------- thinking and answering


def think_end_id(tokenizer) -> int | None:
    """The id of </think> where the tokenizer holds it as one token (R1-Distill's, the tiny one's), else None."""
    ids = tokenizer.encode(END_THINK, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def thinking_lengths(response_ids: torch.Tensor, lengths: torch.Tensor, think_end: int) -> torch.Tensor:
    """[N] each response's thinking tokens: up to its first `think_end` (</think>) and that token included; the
    whole response where it never closes thinking (response_ids [N, T], lengths [N], stop token included). The
    rest of a response is its answer."""
    steps = torch.arange(response_ids.shape[1], device=response_ids.device)
    closes = (response_ids == think_end) & (steps < lengths[:, None])  # [N, T]
    first = torch.where(closes, steps, response_ids.shape[1]).amin(-1)  # [N]: T where it never closes
    return torch.where(closes.any(-1), first + 1, lengths)


def thinking_metrics(response_ids: torch.Tensor, lengths: torch.Tensor, mixed: torch.Tensor, think_end: int,
                     correct: torch.Tensor, forced: torch.Tensor | None = None) -> dict[str, float]:
    """How a step's responses split into thinking and answer (R1's `... </think> answer`), and where they mixed:

    - think/len_mean, think/answer_len_mean: tokens before and after </think> (</think> counts as thinking)
    - think/closed: fraction of responses that wrote </think>
    - think/mixed_frac: the fraction of thinking steps that fed a mixture; think/answer_mixed: mixed steps after
      </think>, a count (0 whenever mixing stops at </think>, as every soft-token method's does)
    - think/correct_len_mean: tokens of the correct responses (tokens to a correct answer; absent when none is)
    - think/correct_per_1k: correct responses per 1,000 thinking tokens spent, all responses' thinking counted
    - think/cold_stop_ends: responses whose </think> Cold Stop forced (`forced` [N, T], where it is recorded)

    correct [N] bool; mixed [N, T] bool."""
    thinking, correct = thinking_lengths(response_ids, lengths, think_end), correct.to(lengths.device)
    steps = torch.arange(response_ids.shape[1], device=response_ids.device)
    in_thinking, in_answer = steps < thinking[:, None], (steps >= thinking[:, None]) & (steps < lengths[:, None])
    metrics = {
        "think/len_mean": float(thinking.float().mean()),
        "think/answer_len_mean": float((lengths - thinking).float().mean()),
        "think/closed": float(((response_ids == think_end) & in_thinking).any(-1).float().mean()),
        "think/mixed_frac": float((mixed & in_thinking).sum()) / max(int(thinking.sum()), 1),
        "think/answer_mixed": int((mixed & in_answer).sum()),
        "think/correct_per_1k": 1000.0 * float(correct.sum()) / max(int(thinking.sum()), 1),
    }
    if correct.any():
        metrics["think/correct_len_mean"] = float(lengths[correct].float().mean())
    if forced is not None:
        metrics["think/cold_stop_ends"] = int((forced & in_thinking).sum())
    return metrics


def token_counts(response_ids: torch.Tensor, lengths: torch.Tensor, think_end: int | None) -> list[dict[str, int]]:
    """Each response's tokens, and its thinking tokens where the tokenizer has </think> (`think_end`): what eval.py
    writes in each sample's record."""
    thinking = None if think_end is None else thinking_lengths(response_ids, lengths, think_end).tolist()
    return [{"tokens": n} if thinking is None else {"tokens": n, "think_tokens": k}
            for n, k in zip(lengths.tolist(), thinking or lengths.tolist())]


def token_efficiency(records: list[dict]) -> dict[str, float]:
    """eval.py's token-efficiency figures of a benchmark's samples (each record's tokens, think_tokens, correct):
    tokens_mean, think_tokens_mean, answer_tokens_mean (after </think>), correct_tokens_mean (the tokens of the
    correct samples: tokens to a correct answer; absent when none is) and correct_per_1k_think (correct samples
    per 1,000 thinking tokens). {} when a record has no counts (samples written before they were kept)."""
    if not records or any("tokens" not in r for r in records):
        return {}
    tokens, right = [r["tokens"] for r in records], [r["tokens"] for r in records if r["correct"]]
    figures = {"tokens_mean": sum(tokens) / len(tokens)}
    if all("think_tokens" in r for r in records):
        thinking = sum(r["think_tokens"] for r in records)
        figures.update(think_tokens_mean=thinking / len(records), answer_tokens_mean=(sum(tokens) - thinking) /
                       len(records), correct_per_1k_think=1000.0 * len(right) / max(thinking, 1))
    if right:
        figures["correct_tokens_mean"] = sum(right) / len(right)
    return figures


# ----------------------------------------------------------------------------- a run that learns nothing


class LearningSignal:
    """Watches a run's steps for the ways a step teaches nothing or the run unlearns, and says so once per cause.

    Nothing to learn, after STEPS steps in a row (one step can be bad luck): almost every group's rewards equal (its
    advantages are all 0: GRPO has nothing to compare), or almost every response cut at --max-new-tokens (it scores
    0 whatever it was going to say). TRL users meet both silently (huggingface/trl#5697, #6263). Unlearning: the
    training accuracy's mean over the last WINDOW steps has stayed DROP below its best such mean for WINDOW steps,
    or the held-out accuracy fell at two evaluations in a row to DROP / 2 below its best (a run that improves
    for a while and then loses it: a learning rate too high for the method's estimator, or a method that does not
    suit the task)."""

    STEPS, WINDOW, DROP = 3, 10, 0.1
    CAUSES = {  # metric -> (the share that counts, what is wrong and what helps)
        "zero_variance_groups": (0.95, "{share:.0%} of the groups had all-equal rewards for {n} steps in a row: their "
                                 "advantages are 0 and the update learns nothing from them (prompts nearer the "
                                 "model's level, a larger --group-size, a higher --temperature, or --filter-groups all "
                                 "with --refill)"),
        "truncated_frac": (0.9, "{share:.0%} of the responses ran to --max-new-tokens for {n} steps in a row: a cut "
                           "response scores 0 whatever it would have answered (a larger --max-new-tokens, or "
                           "--mask-truncated to leave them out of the loss)"),
    }
    UNLEARNING = ("the run is unlearning; a lower --lr, or another --explore (the method may not suit the task: "
                  "docs/experiments.md)")

    def __init__(self):
        self.in_a_row = dict.fromkeys(self.CAUSES, 0)
        self.said: set[str] = set()
        self.__setstate__({})

    def __setstate__(self, state: dict) -> None:  # a checkpoint from before the unlearning watch has none of it
        self.__dict__.update({"accuracies": [], "best_window": None, "below_best": 0, "held_out": [], **state})

    def observe(self, metrics: dict) -> str | None:
        """The warning this step brings (None most steps)."""
        warnings = []
        for key, (threshold, message) in self.CAUSES.items():
            self.in_a_row[key] = self.in_a_row[key] + 1 if metrics.get(key, 0.0) >= threshold else 0
            if self.in_a_row[key] >= self.STEPS and key not in self.said:
                self.said.add(key)
                warnings.append(message.format(share=metrics[key], n=self.STEPS))
        for key, falling in (("accuracy", self.falling_reward), ("held_out_accuracy", self.falling_held_out)):
            if key in metrics and key not in self.said and (warning := falling(metrics["step"], metrics[key])):
                self.said.add(key)
                warnings.append(warning)
        return "; ".join(warnings) or None

    def falling_reward(self, step: int, accuracy: float) -> str | None:
        self.accuracies = (self.accuracies + [(step, accuracy)])[-self.WINDOW:]
        mean = sum(value for _, value in self.accuracies) / self.WINDOW
        if len(self.accuracies) == self.WINDOW and (self.best_window is None or mean > self.best_window[1]):
            self.best_window = (self.accuracies[0][0], mean)
        self.below_best = self.below_best + 1 if self.best_window and mean <= self.best_window[1] - self.DROP else 0
        if self.below_best < self.WINDOW:
            return None
        first, best = self.best_window
        return (f"the training accuracy's mean over {self.WINDOW} steps fell from {best:.3f} (steps {first}-"
                f"{first + self.WINDOW - 1}) to {mean:.3f} and stayed down for {self.WINDOW} steps: {self.UNLEARNING}")

    def falling_held_out(self, step: int, accuracy: float) -> str | None:
        self.held_out.append((step, accuracy))
        best_step, best = max(self.held_out, key=lambda point: point[1])
        a, b, now = ([float("-inf")] * 3 + [value for _, value in self.held_out])[-3:]
        if not (now < b < a and now <= best - self.DROP / 2):
            return None
        return (f"the held-out accuracy fell at two evaluations in a row, from {best:.3f} (step {best_step}) to "
                f"{now:.3f} (step {step}): {self.UNLEARNING}")


@dataclass
class Watch:
    """What train.py's after_step counts from step to step to stop a run that has gone wrong (kept in
    checkpoints: a resumed run warns and stops where an uninterrupted one would)."""

    failed_in_a_row: int = 0  # steps whose every mini-batch was skipped (non-finite loss or gradient)
    scoreless_in_a_row: int = 0  # steps where no answer could be scored
    signal: LearningSignal = field(default_factory=LearningSignal)  # steps that can teach nothing, in a row
