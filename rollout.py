"""The sampler: how each decode step samples the action, records the step, explores and feeds the
next input.

One decode step, for every live row at once (the paper's steps 1-5, docs/algorithm.md):

    p   = softmax(filter(logits / tau))           y ~ p is the action: recorded, rewarded, trained on
    m   = Bernoulli(mix_rate), until </think>     (`soft`: every thinking step; or an entropy threshold)
    C   = [argmax p] + its table neighbors         (`soft` / `gaussian`: the top-K tokens of p)
    w   = softmax(p(C) / tau)  or  p(C) / sum p(C)
    e   = sum_c w_c E[c] if m else E[y]           (`gaussian`: + N(0, (sigma * rms)^2) at mixed steps)

and e is the next input (`--mix-feed replay-only`: E[y], the mixture only recorded).
`Sampler.__call__` is that step; each strategy (steps 2-5) is one function of strategies.py,
registered in its STRATEGIES. Every step records what strategies.RECORD lists (y, log p(y), and (C,
w), or ([y], [1]) when not mixed) and what the strategy adds, so that training replays exactly the
inputs the sampler fed (replay.py).

Every random draw is a hash of (seed, row key, position) (engine.draws.RowDraws), so a row's
response does not depend on its slot, its batch-mates or the refill order. The decode loop that runs
the step (a static KV cache, slots refilled as rows end, CUDA graphs) is the engine's
(engine/decoder.py): it runs whatever step rule it is handed.

    rollout = generate(model, prompts, Sampling(max_new_tokens=512, stop_ids=(eos,)),
                       Exploration("neighbor", mix_rate=0.1, stop_mixing_id=think_end),
                       neighbor_table=table, seed=(run_seed, step), slots=64)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from data import pad_id_of
from engine.decoder import Slots, decoder_for
from engine.draws import RowDraws, seed_state, step_uniforms
from engine.kernels import compiled_once
from model import Transformer
from strategies import STRATEGIES, Exploration, Field, StepView, candidate_table, neighbor_candidates, record_fields

CDF_BLOCK = 128  # tokens per block of sample_tokens' two-level inverse CDF


def length_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """[B, width] bool: position t of row b is True when t < lengths[b]."""
    return torch.arange(width, device=lengths.device)[None] < lengths[:, None]


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # 0 = greedy (log-probs then at temperature 1)
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # drop tokens with p < min_p * max p (after top-k / top-p); 0 = off
    max_new_tokens: int = 256
    stop_ids: tuple[int, ...] = ()  # a row finishes when it samples one of these (end-of-sentence, ...)
    pad_id: int = 0  # fills prompts on the left and responses after they finish
    # Once a row has sampled the exploration's stop_mixing_id (</think>), these replace top_k /
    # top_p / min_p, as Soft Thinking's sampler switches its after_thinking_* filters (None =
    # unchanged).
    after_thinking_top_k: int | None = None
    after_thinking_top_p: float | None = None
    after_thinking_min_p: float | None = None

    @property
    def filters(self) -> tuple[tuple[int, float, float], tuple[int, float, float]]:
        """(top_k, top_p, min_p) while thinking, and after it."""
        after = (self.after_thinking_top_k, self.after_thinking_top_p, self.after_thinking_min_p)
        thinking = (self.top_k, self.top_p, self.min_p)
        return thinking, tuple(t if a is None else a for t, a in zip(thinking, after))


@dataclass
class Rollout:
    """What a batch of generations returns, row-aligned with the prompts. T = longest response.

    lengths [B] (stop token included), finished [B] (ended by a stop id; False = truncated at
    max_new_tokens), and `steps`, the record of every decode step: strategies.RECORD's fields and
    the strategy's own, [B, T] or [B, T, K], each also an attribute (rollout.response_ids). RECORD:
    response_ids (pad_id after the end), logprobs (the sampling log-prob of each sampled token at
    the sampling temperature, after filtering), cand_ids / cand_weights (the fed input was sum_k w_k
    E[id_k]; an unmixed step holds [y, y, ...] and [1, 0, ...]) and mixed (the step fed a mixture).
    `strategy` names what recorded them (its `feed` rebuilds the inputs in the replay)."""

    prompts: list[list[int]]
    lengths: torch.Tensor
    finished: torch.Tensor
    steps: dict[str, torch.Tensor]
    strategy: str = "none"
    pad_id: int = 0

    def __getattr__(self, name: str) -> torch.Tensor:
        steps = self.__dict__.get("steps")  # absent while a pickled rollout is being rebuilt
        if steps is not None and name in steps:
            return steps[name]
        raise AttributeError(f"{type(self).__name__} has no attribute or recorded field {name!r}")

    @property
    def fields(self) -> tuple[Field, ...]:
        return record_fields(self.strategy)

    def response_mask(self) -> torch.Tensor:
        """[B, T] bool: True at the positions of each row's response (stop token included)."""
        return length_mask(self.lengths, self.response_ids.shape[1])

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor], prompts: list[list[int]] | None = None) -> Rollout:
        """The rollout with fn applied to each of its row tensors (lengths, finished and every recorded field)."""
        return replace(self, prompts=self.prompts if prompts is None else prompts, lengths=fn(self.lengths),
                       finished=fn(self.finished), steps={name: fn(value) for name, value in self.steps.items()})

    def select(self, index: slice | list[int]) -> Rollout:
        """The rows `index` (a slice or a list of row numbers), as a rollout."""
        if isinstance(index, slice):
            return self.map(lambda x: x[index], self.prompts[index])
        rows = torch.tensor(index, dtype=torch.long, device=self.lengths.device)
        return self.map(lambda x: x[rows], [self.prompts[i] for i in index])

    def trimmed(self) -> Rollout:
        """The per-step tensors cut to the longest response (a micro-batch's log-probs are then computed for
        those positions only: causal attention, so the positions cut off change nothing before them)."""
        width = max(int(self.lengths.max()), 1)
        return replace(self, steps={name: value[:, :width] for name, value in self.steps.items()})

    def with_fields(self, **steps: torch.Tensor) -> Rollout:
        """The rollout with these recorded fields replaced (rollout.with_fields(logprobs=...))."""
        return replace(self, steps={**self.steps, **steps})

    def to(self, device) -> Rollout:
        return self.map(lambda x: x.to(device))

    def responses(self) -> list[list[int]]:
        return [ids[:n].tolist() for ids, n in zip(self.response_ids, self.lengths.tolist())]

    @staticmethod
    def concat(rollouts: list[Rollout]) -> Rollout:
        """The rows of several rollouts of one strategy as one, in order; their steps right-padded to the longest
        with each field's pad (strategies.Field)."""
        if len(rollouts) == 1:
            return rollouts[0]
        first = rollouts[0]
        T = max(r.response_ids.shape[1] for r in rollouts)

        def padded(x: torch.Tensor, value) -> torch.Tensor:  # [B, T_r, ...] -> [B, T, ...]
            out = x.new_full((x.shape[0], T, *x.shape[2:]), first.pad_id if value is None else value)
            out[:, : x.shape[1]] = x
            return out

        steps = {f.name: torch.cat([padded(r.steps[f.name], f.pad) for r in rollouts]) for f in first.fields}
        return replace(first, prompts=[p for r in rollouts for p in r.prompts], steps=steps,
                       lengths=torch.cat([r.lengths for r in rollouts]),
                       finished=torch.cat([r.finished for r in rollouts]))


def filtered_logits(logits: torch.Tensor, temperature: float, top_k: int = 0,
                    top_p: float = 1.0, min_p: float = 0.0) -> torch.Tensor:
    """logits / temperature with everything outside the top-k, the top-p nucleus and min-p (p >= min_p max p,
    i.e. z >= max z + log min_p, as Soft Thinking's sampler keeps after top-k / top-p) set to -inf. [B, V]."""
    logits = logits.float() if temperature == 1.0 else logits.float() / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens above it already cover top_p; the most likely token always stays.
        drop = probs.cumsum(-1) - probs >= top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    if min_p > 0:
        logits = logits.masked_fill(logits < logits.amax(-1, keepdim=True) + math.log(min_p), float("-inf"))
    return logits


def mixing_candidates(logits: torch.Tensor, table: torch.Tensor, *, num_neighbors: int, temperature: float,
                      top_p: float = 1.0, top_k: int = 0,
                      weights: str = "code") -> tuple[torch.Tensor, torch.Tensor]:
    """The N-GRPO candidates of one decode step from raw logits [B, V]: (cand_ids [B, K],
    cand_weights [B, K]), K = 1 + num_neighbors, anchor (the greedy token) first, weights summing to
    1."""
    probs = filtered_logits(logits, temperature, top_k, top_p).softmax(-1)
    return neighbor_candidates(probs, candidate_table(table, num_neighbors), temperature=temperature,
                               weights=weights)


def sample_tokens(probs: torch.Tensor, uniform: torch.Tensor | None) -> torch.Tensor:
    """One token per row from p [B, V]: argmax p (greedy) when uniform is None, else the inverse CDF at
    uniform [B] (float64 in (0, 1)): the token whose interval of the cumulative sum of p holds u * sum p.
    The sums run in float64, so every token with p > 0 keeps an interval of its exact width to ~1e-16 and
    a filtered-out token (p = 0) has none. One uniform per row: no [B, V] of random numbers to make.

    No scan along V: the blocks of CDF_BLOCK tokens are summed (a reduction, which a GPU runs in parallel), the
    uniform picks a block from the scan of those sums, then a token from the scan of that one block. On an H100 a
    scan along V per row took 0.29-0.49 ms at B = 64 (a GPU scans a row in sequence), and scanning every block
    materialised [B, V] float64 twice."""
    if uniform is None:
        return probs.argmax(-1)
    B, V = probs.shape
    n = -(-V // CDF_BLOCK)
    if n * CDF_BLOCK != V:
        probs = F.pad(probs, (0, n * CDF_BLOCK - V))  # zero mass: never drawn
    blocks = probs.view(B, n, CDF_BLOCK)
    block_cdf = blocks.sum(-1, dtype=torch.float64).cumsum(-1)  # [B, n]
    total = block_cdf[:, -1:]
    target = torch.minimum(uniform[:, None] * total, total.nextafter(torch.zeros_like(total)))  # [B, 1] < total
    block = torch.searchsorted(block_cdf, target, right=True)  # [B, 1]: the first block whose cdf exceeds target
    before = torch.where(block > 0, block_cdf.gather(-1, (block - 1).clamp(min=0)), 0.0)  # [B, 1]
    inside = blocks.gather(1, block[..., None].expand(B, 1, CDF_BLOCK))[:, 0]  # [B, CDF_BLOCK]
    token = torch.searchsorted(before + inside.double().cumsum(-1), target, right=True)  # [B, 1]
    # The block's sum by reduction and by scan may differ in the last bit: a target in that sliver would land
    # past the block; it takes the block's last token with p > 0 (the block holds one: its sum exceeds 0).
    last = torch.where(inside > 0, torch.arange(CDF_BLOCK, device=probs.device), -1).amax(-1, keepdim=True)
    return (block * CDF_BLOCK + torch.minimum(token, last))[:, 0]


# ----------------------------------------------------------------------------- one decode step

MIXING_ON = Field("mixing_on", torch.bool, pad=True)  # per row: has not yet sampled the stop-mixing token


class Sampler:
    """The per-step rule of one (sampling, exploration): sample each live slot's token, record the
    step, explore, feed. Pure tensor work on fixed buffers, so that a CUDA graph captures it with
    the model's step; the engine (engine/decoder.py) calls it and writes the record it returns into
    the fields it declares."""

    def __init__(self, sampling: Sampling, exploration: Exploration, embed: torch.Tensor):
        self.sampling, self.exploration, self.embed = sampling, exploration, embed  # embed: E, [V, d]
        self.strategy = STRATEGIES[exploration.strategy]
        # What the engine reads: the record's fields, the per-row state to keep in each slot, K, T, the pad id.
        self.fields = record_fields(exploration.strategy)
        self.state_fields = (MIXING_ON, *self.strategy.state)
        self.num_candidates, self.max_new_tokens = exploration.num_candidates, sampling.max_new_tokens
        self.pad_id = sampling.pad_id
        self.seed = torch.zeros((), dtype=torch.long, device=embed.device)  # the call's seed_state (a buffer)
        self.stop_ids = torch.tensor(sampling.stop_ids or [-1], device=embed.device)
        self.cand_table: torch.Tensor | None = None  # neighbor: [V, 1 + num_neighbors] (a buffer each call writes)

    def begin(self, seed: int | tuple[int, ...], neighbor_table: torch.Tensor | None) -> None:
        """This call's seed and neighbor table, written into the buffers a captured graph reads."""
        self.seed.fill_(seed_state(seed))
        if neighbor_table is not None and self.exploration.strategy == "neighbor":
            table = candidate_table(neighbor_table.to(self.embed.device), self.exploration.num_neighbors)
            if self.cand_table is None:
                self.cand_table = torch.empty_like(table)
            self.cand_table.copy_(table)

    def __call__(self, logits: torch.Tensor, state: Slots, live: torch.Tensor,
                 backend: str | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One step from each slot's logits [S, V] (live [S]: the slots whose row goes on): the next inputs [S, d]
        and the step's record. backend: what compiles the step's two draws (None: as written)."""
        s, x = self.sampling, self.exploration
        greedy = s.temperature == 0
        tau = 1.0 if greedy else s.temperature
        thinking, after = s.filters
        scaled = filtered_logits(logits, tau, *thinking)  # [S, V]
        if after != thinking:  # the rows past </think> take the after-thinking filters
            scaled = torch.where(state.extra["mixing_on"][:, None], scaled, filtered_logits(logits, tau, *after))
        probs = scaled.softmax(-1)
        draws = RowDraws(self.seed, state.key, state.length.clone())
        # = draws.uniform(TOKEN / COIN, 1)[:, 0], in one kernel where compiled
        token_u, coin_u = compiled_once(step_uniforms, backend)(self.seed, state.key, state.length)
        token = sample_tokens(probs, None if greedy else token_u)
        token = torch.where(live, token, s.pad_id)  # [S]
        mixing_on = state.extra["mixing_on"]
        if x.stop_mixing_id is not None:  # the step that samples it is not mixed either
            mixing_on &= token != x.stop_mixing_id
        view = StepView(x, scaled, probs, token, live & mixing_on, coin_u, tau, self.embed, self.cand_table, draws,
                        state.extra, logits)
        mixture = self.strategy.explore(view)
        if mixture.token is None:  # log p(y) by one gather, not a log_softmax over V (~1e-7 apart in fp32)
            logprob = probs.gather(-1, token[:, None])[:, 0].log()
        else:  # the strategy's own action (Cold Stop's </think>, a draw from a noisy p'), which p did not draw:
            # scored before filtering, as the replay scores it (a filter may have removed it; p may give it ~0)
            token = torch.where(live, mixture.token, s.pad_id)
            logprob = (logits.float() / tau).log_softmax(-1).gather(-1, token[:, None])[:, 0]
            if x.stop_mixing_id is not None:
                mixing_on &= token != x.stop_mixing_id
        logprob = torch.where(live, logprob, 0.0)
        state.finished |= live & (token[:, None] == self.stop_ids).any(-1)
        # --mix-feed replay-only: the same record, but the sampled token is fed (docs/algorithm.md)
        inputs = self.embed[token] if x.mix_feed == "replay-only" else mixture.inputs
        return inputs, dict(response_ids=token, logprobs=logprob, cand_ids=mixture.cand_ids,
                            cand_weights=mixture.cand_weights, mixed=mixture.mixed, **mixture.extra)


@torch.no_grad()
@torch.autocast("cuda", enabled=False)  # the model's own dtype throughout, inside the CUDA graph too
def generate(model: Transformer, prompts: list[list[int]], sampling: Sampling, exploration: Exploration = Exploration(),
             *, neighbor_table: torch.Tensor | None = None, seed: int | tuple[int, ...] = 0,
             row_keys: Sequence[int] | None = None, slots: int | None = None, refill: bool = True,
             cuda_graph: bool | None = None, progress: bool = False) -> Rollout:
    """Sample one response per prompt; the Rollout is row-aligned with the prompts.

    slots rows (default all) decode at once, each at its own position; when a row ends, the next waiting
    row is prefilled into its slot at the next sync (refill=False: only when every slot is free, i.e.
    static batches). Randomness: row i's response is a function of (seed, row_keys[i], the model) alone: every
    draw (token, mixing coin, noise) hashes them with the row's response position (engine.draws.RowDraws), so it
    depends on no batch-mate, slot or order. row_keys: distinct ints, default 0..len-1 (callers pass e.g. a row's
    index among a training step's rows, or eval.sample_key(problem, sample)). The model runs in its own dtype
    (autocast is off; on GPU pass a bf16 model). cuda_graph: replay each step from a CUDA graph; None = whenever
    the model is on a CUDA device. The KV cache and graphs stay for the next call (release_decoder frees them).
    progress: a tqdm bar on stderr for rollouts over 2 s."""
    keys = _check_arguments(model, prompts, sampling, exploration, neighbor_table, cuda_graph, row_keys, slots)
    device = model.embed_tokens.weight.device
    graphed = device.type == "cuda" if cuda_graph is None else cuda_graph
    decoder = decoder_for(model, min(slots or len(prompts), len(prompts)),
                          max(map(len, prompts)) + sampling.max_new_tokens, graphed)
    key = (sampling, exploration)
    sampler = decoder.start(model, key, lambda: Sampler(sampling, exploration, model.embed_tokens.weight))
    sampler.begin(seed, neighbor_table)
    lengths, finished, steps = decoder.run(model, key, prompts, keys, refill=refill, progress=progress)
    return Rollout([list(p) for p in prompts], lengths, finished, steps, exploration.strategy, sampling.pad_id)


def _check_arguments(model, prompts, sampling: Sampling, exploration: Exploration, neighbor_table, cuda_graph,
                     row_keys, slots) -> torch.Tensor:
    """Raises on bad arguments; returns the row keys as a tensor [N]."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate needs at least one prompt and no empty prompt")
    if exploration.strategy == "neighbor" and (neighbor_table is None or
                                               neighbor_table.shape[1] < exploration.num_neighbors):
        raise ValueError(f"the neighbor strategy needs a neighbor_table with at least "
                         f"{exploration.num_neighbors} columns (neighbors.build_neighbor_table)")
    device = model.embed_tokens.weight.device
    if cuda_graph and device.type != "cuda":
        raise ValueError(f"cuda_graph=True needs a model on a CUDA device; this one is on {device}")
    if sampling.filters[0] != sampling.filters[1] and exploration.stop_mixing_id is None:
        raise ValueError("after_thinking_* filters switch once a row samples exploration.stop_mixing_id: give one")
    if slots is not None and slots < 1:
        raise ValueError(f"slots must be at least 1, not {slots}")
    row_keys = list(range(len(prompts)) if row_keys is None else row_keys)
    if len(row_keys) != len(prompts) or len(set(row_keys)) != len(prompts):
        raise ValueError(f"row_keys must be {len(prompts)} distinct ints, one per prompt")
    return torch.tensor(row_keys, dtype=torch.long, device=device)


def sampling_from_config(cfg, tokenizer) -> Sampling:
    """The Sampling a Config's flags describe (train.py's rollouts and eval.py's samples; -1 after
    thinking: the thinking value)."""
    after = {name: None if getattr(cfg, name) == -1 else getattr(cfg, name)
             for name in ("after_thinking_top_k", "after_thinking_top_p", "after_thinking_min_p")}
    return Sampling(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, min_p=cfg.min_p,
                    max_new_tokens=cfg.max_new_tokens, stop_ids=(tokenizer.eos_token_id,),
                    pad_id=pad_id_of(tokenizer), **after)


def exploration_from_config(cfg, tokenizer) -> Exploration:
    """The Exploration a Config's flags describe (train.py and eval.py alike): the knobs its
    strategy reads, under their names, and `stop_mixing_token` looked up in the tokenizer: a token
    it does not have is an error, not a silent never-stop."""
    stop_mixing_id, strategy = None, STRATEGIES[cfg.explore]
    if cfg.stop_mixing_token and strategy.mixes:
        stop_mixing_id = tokenizer.convert_tokens_to_ids(cfg.stop_mixing_token)
        if not isinstance(stop_mixing_id, int) or stop_mixing_id < 0 or stop_mixing_id == tokenizer.unk_token_id:
            raise ValueError(f"--stop-mixing-token {cfg.stop_mixing_token!r} is not one token of the tokenizer "
                             "(pass --stop-mixing-token '' to mix until the end of the response)")
    return Exploration.of(cfg.explore, stop_mixing_id, **{name: getattr(cfg, name) for name in strategy.reads})
