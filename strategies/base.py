"""The contract every exploration strategy keeps, and what they share.

A strategy is one function of a decode step. The sampler (rollout.py) samples the action y ~ p and hands the
strategy the step (`StepView`); the strategy returns what the step records and the next input (`Mixture`):
e = sum_k w_k E[c_k] (+ noise, for the noisy ones), or E[y] where it does not mix. Its registry entry
(`Strategy`) declares its facts once: the knobs it reads, whether it draws the mixing coin, what it records
beyond every step's RECORD and keeps per row, how the replay rebuilds what it fed, and how its loss scores a
step. Everything else (the `--explore` choices and help, which flags a method refuses, eval.py's flags, the
checks) is derived from those entries (strategies/__init__.py).

Every setting of a run is declared once with `option`: its default, its help, its allowed values beside it
(config.Config's fields and each strategy's knobs alike); `problems` checks them wherever one is made.

Also here: `mixed_embeddings` (the one formula for a fed mixture, sampler and replay alike), the mixing coin
(`mix_steps`, with the release's entropy gate) and plain GRPO's `none`.
"""

import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F

from engine.draws import RowDraws


def option(default, help: str, *, check: tuple | None = None, choices: tuple | None = None, aliases: tuple = (),
           vocab: str = ""):
    """A setting, declared once: its default, the help its `--flag` shows, and what values it takes: `choices`,
    or `check` = (predicate, what the value must be); vocab: "below" or "at most" the model's vocabulary size
    (a count of tokens, checked once the model is known). aliases: other flags for it (another library's names)."""
    return field(default=default, metadata={"help": help, "check": check, "choices": choices, "aliases": aliases,
                                            "vocab": vocab})


AT_LEAST_1 = (lambda v: v >= 1, "must be at least 1")
AT_LEAST_0 = (lambda v: v >= 0, "must be >= 0")
POSITIVE = (lambda v: v > 0, "must be > 0")
FRACTION = (lambda v: 0 <= v <= 1, "must be in [0, 1]")
OFF_AT_0 = (lambda v: v >= 0, "must be >= 0 (0 = off)")


def zero_is(meaning: str) -> tuple:
    """The check of a count or amount whose 0 means something: >= 0, the message saying what 0 means."""
    return lambda v: v >= 0, f"must be >= 0 (0 = {meaning})"


def listing(names) -> str:
    """'a, b or c'."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def is_text(value: str) -> bool:
    """Whether a string can be written as UTF-8 (a command-line argument in another encoding arrives holding
    lone surrogates, which cannot)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def problems(settings) -> list[tuple[str, str]]:
    """(field, what it must be) for each value of a dataclass of options that its declaration does not allow:
    outside its choices, a float that is not finite, text that is not UTF-8, or failing its check."""
    found = []
    for f in fields(settings):
        value, meta = getattr(settings, f.name), f.metadata
        if meta.get("choices") and value not in meta["choices"]:
            found.append((f.name, f"must be one of {', '.join(meta['choices'])}"))
        elif f.type is float and not math.isfinite(value):
            found.append((f.name, "must be a finite number"))
        elif f.type is str and not is_text(value):
            found.append((f.name, "must be text (UTF-8): it holds bytes that are not"))
        elif meta.get("check") and not meta["check"][0](value):
            found.append((f.name, meta["check"][1]))
    return found


class ConfigError(ValueError):
    """Settings out of range, one message per flag: `--save-every -1: must be >= 0 (0 = only at the
    end)`. parse_config shows each value as it was typed (`describe(typed)`)."""

    def __init__(self, problems: list[tuple[str, object, str]]):  # (field, its value, what it must be)
        self.problems = problems
        super().__init__(self.describe({}))

    def describe(self, typed: dict[str, str]) -> str:
        return "; ".join(f"--{'' if value is not False else 'no-'}{name.replace('_', '-')}"
                         f"{'' if isinstance(value, bool) else ' ' + typed.get(name, shown(value))}: {message}"
                         for name, value, message in self.problems)


def shown(value) -> str:
    """A value as one would type it on a command line (bytes that are not text shown as escapes)."""
    if not isinstance(value, str):
        return str(value)
    return shlex.quote(value.encode("utf-8", "backslashreplace").decode("utf-8"))


# ----------------------------------------------------------------------------- what a step sees, feeds, records


def mixed_embeddings(embed_weight: torch.Tensor, cand_ids: torch.Tensor, cand_weights: torch.Tensor) -> torch.Tensor:
    """sum_c w_c E[c] over the last axis: [..., K] ids and weights -> [..., d] in the embedding's dtype.

    A step that was not mixed holds ([y, y, ...], [1, 0, ...]) and gives exactly E[y]: 1·x and 0·x are
    exact and so is their sum. The sum runs in fp32 so that a bf16 sampler and an fp32 replay round once.
    One candidate at a time: a [..., K, d] gather would hold K embeddings per position at once (K = 10 for
    soft / gaussian: ~2 GB for 4 rows of 8k tokens at d = 1536)."""
    mixed = None
    for k in range(cand_ids.shape[-1]):
        rows = F.embedding(cand_ids[..., k], embed_weight)  # [..., d]
        term = cand_weights[..., k, None].float() * rows.float()
        mixed = term if mixed is None else mixed + term
    return mixed.to(embed_weight.dtype)


@dataclass
class StepView:
    """What an exploration strategy sees at one decode step, for the B rows at once."""

    exploration: Any  # strategies.Exploration: the knobs, read by name (view.exploration.num_neighbors)
    logits: torch.Tensor  # [B, V] the logits / tau whose softmax probs is (-inf: removed by top-k / top-p)
    probs: torch.Tensor  # [B, V] the sampling distribution (temperature, top-k / top-p applied)
    token: torch.Tensor  # [B] the sampled action y
    eligible: torch.Tensor  # [B] bool: live rows that have not yet sampled stop_mixing_id
    coin: torch.Tensor  # [B] uniform in (0, 1): the step's mixing coin is coin < mix_rate
    temperature: float
    embed: torch.Tensor  # [V, d] the input embedding E
    cand_table: torch.Tensor | None  # [V, 1 + num_neighbors] (neighbor.candidate_table), neighbor strategy only
    draws: RowDraws  # this step's per-row random numbers; a strategy takes its own stream (engine.draws.RowDraws)
    state: dict[str, torch.Tensor]  # name -> [B]: the strategy's declared per-row state (Strategy.state), in place
    raw: torch.Tensor  # [B, V] the model's logits as they came: no temperature, no filtering


@dataclass
class Mixture:
    """A step's record and what it feeds: the input is sum_k w_k E[id_k] (+ noise, for noisy strategies)."""

    cand_ids: torch.Tensor  # [B, K]
    cand_weights: torch.Tensor  # [B, K]
    mixed: torch.Tensor  # [B] bool
    inputs: torch.Tensor  # [B, d] in the embedding's dtype
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # the strategy's own record fields, [B] or [B, K]
    token: torch.Tensor | None = None  # [B] the action where the strategy replaces the sampled y (Cold Stop)


def mix_where(view: StepView, cand_ids: torch.Tensor, cand_weights: torch.Tensor, mix: torch.Tensor) -> Mixture:
    """Rows where `mix` feed the candidates' mixture; the others feed their sampled token, recorded as
    [y, y, ...] with weights [1, 0, ...] (exactly E[y])."""
    unit = torch.zeros_like(cand_weights)
    unit[:, 0] = 1.0
    cand_ids = torch.where(mix[:, None], cand_ids, view.token[:, None])  # [B, K]
    cand_weights = torch.where(mix[:, None], cand_weights, unit)
    return Mixture(cand_ids, cand_weights, mix, mixed_embeddings(view.embed, cand_ids, cand_weights))


@dataclass(frozen=True)
class Field:
    """One quantity of a step's record, or of a row's state: its name and dtype, the value it holds where nothing
    was written (past a row's end; a fresh row's state; None = the sampling's pad id), and whether a step holds one
    value per candidate ([K]) rather than one."""

    name: str
    dtype: torch.dtype
    pad: float | int | bool | None = 0
    per_candidate: bool = False


# What every decode step records, whatever the strategy: rollout.Rollout's per-step tensors, [B, T] or [B, T, K].
RECORD = (
    Field("response_ids", torch.long, pad=None),  # y, the sampled action
    Field("logprobs", torch.float32, pad=0.0),  # log p(y) at the sampling temperature, after filtering (an action
    # the strategy chose, Mixture.token: before filtering, as the replay scores it)
    Field("cand_ids", torch.long, pad=None, per_candidate=True),  # the fed input was sum_k w_k E[id_k]; a step
    Field("cand_weights", torch.float32, pad=0.0, per_candidate=True),  # not mixed holds [y, y, ..], [1, 0, ..]
    Field("mixed", torch.bool, pad=False),  # the step fed a mixture
)


def mixture_inputs(embed_weight: torch.Tensor, steps: dict[str, torch.Tensor]) -> torch.Tensor:
    """The input a step fed, from its record: the recorded mixture sum_k w_k E[id_k]. [..., d]."""
    return mixed_embeddings(embed_weight, steps["cand_ids"], steps["cand_weights"])


# ----------------------------------------------------------------------------- the registry entry


@dataclass(frozen=True)
class Strategy:
    """An exploration strategy: its step rule and its facts, each declared once.

    explore(view) -> Mixture is the rule; about: one line for `--explore`'s help. candidates(exploration) -> K, the
    candidates a step records. knobs: the names of the options it reads (each declared with `option` in a KNOBS
    dict of a strategy's module); coin: it mixes where the mixing coin lands, so it also reads COIN's knobs; mixes:
    False for plain GRPO alone (a strategy that mixes also reads FEED's knob and the flags of thinking's end).
    record: the fields it records beyond RECORD (Mixture.extra holds them at each step, rollout.Rollout carries
    them); state: per-row fields the sampler keeps for it in each slot, reset to their pad when a row starts
    (view.state holds them; update them in place). feed(embed, steps) -> inputs: the input a step fed, from the
    step's record: what training replays (replay.py). loss_logp: how its loss scores a step when that is more than
    log p(y): (log p of [y, c_1..c_K] [B, T, 1 + K], the step's record) -> (the loss's log-probs, which of them
    count) (Multiplex Thinking's joint loss, SofT-GRPO's reparameterised one). requires: (field, value, why) of the
    run's settings it cannot do without.
    """

    explore: Callable[[StepView], Mixture]
    about: str
    candidates: Callable[[Any], int]
    knobs: tuple[str, ...] = ()
    coin: bool = False
    mixes: bool = True
    record: tuple[Field, ...] = ()
    state: tuple[Field, ...] = ()
    feed: Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor] = mixture_inputs
    loss_logp: Callable[[torch.Tensor, dict[str, torch.Tensor]], tuple] | None = None
    requires: tuple[tuple[str, Any, str], ...] = ()

    @property
    def reads(self) -> tuple[str, ...]:
        """Every knob this strategy reads."""
        return (*COIN,) * self.coin + self.knobs + (*FEED,) * self.mixes

    def labels(self, steps: dict[str, torch.Tensor]) -> torch.Tensor:
        """The recorded tokens training scores: y [B, T], or [y, c_1..c_K] [B, T, 1 + K] (loss_logp's)."""
        if self.loss_logp is None:
            return steps["response_ids"]
        return torch.cat([steps["response_ids"][..., None], steps["cand_ids"]], -1)

    def loss_terms(self, logp: torch.Tensor, steps: dict[str, torch.Tensor]):
        """(the loss's log-probs, which count or None for all) from the replayed log-probs of `labels`."""
        if self.loss_logp is None:
            return logp, None
        return self.loss_logp(logp, {name: value.to(logp.device) for name, value in steps.items()})


# ----------------------------------------------------------------------------- the mixing coin, and plain GRPO

COIN = dict(
    mix_rate=option(0.1, "probability that a decode step feeds a mixture instead of the sampled token (per "
                    "sequence, per step)", check=FRACTION),
    mix_entropy_threshold=option(0.0, "> 0: mix the steps whose entropy reaches this instead of the --mix-rate "
                                 "coin (the released code's mix_rate: null mode); the entropy is the release's, of "
                                 "softmax(p / temperature) with p already softmaxed, which stays within ~1/V of log "
                                 "V (docs/algorithm.md). 0 = off", check=OFF_AT_0),
)
FEED = dict(
    mix_feed=option("sampler", "sampler = feed the mixture to the next decode step (the method as described); "
                    "replay-only = record the same mixture but feed the sampled token, training still replays the "
                    "mixtures (what the released rollouts did under sglang's CUDA graphs, by reading: "
                    "docs/paper-vs-release.md)", choices=("sampler", "replay-only")),
)
KNOBS = {**COIN, **FEED}


def released_scores(view: StepView) -> torch.Tensor:
    """[B, V] the release's `latent_logits`: p / tau, p already softmaxed; tokens that top-k / top-p
    filtering removed at -inf, as the release's own filtering leaves them (a token whose p underflowed to 0
    keeps its score 0, as there). Greedy decoding (temperature 0) uses p at tau = 1; the release's greedy
    path would hand its mixing code the raw logits."""
    return (view.probs / view.temperature).masked_fill(view.logits == float("-inf"), float("-inf"))


def released_entropy(view: StepView) -> torch.Tensor:
    """[B] the entropy the release gates on (`latent_entropy`): of softmax(released_scores), a second softmax
    over the already-softmaxed p. A softmax of numbers in [0, 1 / tau] is nearly uniform: its entropy stays
    within ~1/V of log V whatever the model's confidence (docs/algorithm.md)."""
    q = released_scores(view).softmax(-1)  # [B, V]
    return -(q * q.clamp_min(1e-9).log()).sum(-1)


def mix_steps(view: StepView) -> torch.Tensor:
    """[B] bool: the eligible rows whose coin lands (rate mix_rate), or, with mix_entropy_threshold > 0, whose
    released_entropy reaches the threshold (the release's `mix_rate: null` mode)."""
    x = view.exploration
    if x.mix_entropy_threshold > 0:
        return view.eligible & (released_entropy(view) >= x.mix_entropy_threshold)
    return view.eligible & (view.coin < x.mix_rate)


def explore_none(view: StepView) -> Mixture:
    """Plain GRPO: feed the sampled token."""
    token = view.token[:, None]  # [B, 1]
    return Mixture(token, torch.ones(token.shape, device=token.device), torch.zeros_like(view.eligible),
                   view.embed[view.token])


STRATEGIES = {"none": Strategy(explore_none, "plain GRPO: the sampled token is fed", candidates=lambda x: 1,
                               mixes=False)}
