"""The KV-cached sampler with continuous refill; the exploration strategies it calls are in strategies.py.

One decode step, for every live row at once (DESIGN.md §3 steps 1-5):

    p   = softmax(filter(logits / tau))           y ~ p is the action: recorded, rewarded, trained on
    m   = Bernoulli(mix_rate), until </think>     (`soft`: every thinking step; or an entropy threshold)
    C   = [argmax p] + its table neighbors         (`soft` / `gaussian`: the top-K tokens of p)
    w   = softmax(p(C) / tau)  or  p(C) / sum p(C)
    e   = sum_c w_c E[c] if m else E[y]           (`gaussian`: + N(0, (sigma * rms)^2) at mixed steps)

and e is the next input (`--mix-feed replay-only`: E[y], the mixture only recorded). Every step records
(C, w), or ([y], [1]) when not mixed, so that training can replay exactly the inputs the sampler fed. Each
strategy (steps 2-5) is one function of strategies.py, registered in its EXPLORERS.

The engine: `slots` rows decode at once, each at its own position in its own slot of the KV cache (no
left padding); per-row state (position, finished, mixing stopped) lives in tensors. Every SYNC_EVERY steps
(on a CPU, once no row waits, every step) the loop syncs with the host once: rows that ended leave their
slots and waiting rows are prefilled into them (continuous refill). A step attends over the cache window
its rows have written (a power of two the host knows without asking the device), not over the whole cache.
Every random draw is a hash of (seed, row key, position), so a row's response does not depend on its slot,
its batch-mates or the refill order.

    rollout = generate(model, prompts, Sampling(max_new_tokens=512, stop_ids=(eos,)),
                       Exploration("neighbor", mix_rate=0.1, stop_mixing_id=think_end),
                       neighbor_table=table, seed=(run_seed, step), slots=64)
"""

import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from tqdm import tqdm

from draws import COIN, TOKEN, RowDraws
from model import KVCache
from ngrpo import length_mask
from strategies import EXPLORERS, Exploration, Mixture, StepView, candidate_table, neighbor_candidates


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # 0 = greedy (log-probs then at temperature 1)
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 256
    stop_ids: tuple[int, ...] = ()  # a row finishes when it samples one of these (end-of-sentence, ...)
    pad_id: int = 0  # fills prompts on the left and responses after they finish


ROW_TENSORS = ("response_ids", "lengths", "finished", "logprobs", "cand_ids", "cand_weights", "mixed",
               "noise_keys", "noise_scales")


@dataclass
class Rollout:
    """What a batch of generations returns, row-aligned with the prompts. T = longest response.

    response_ids [B, T] (pad_id after the end), lengths [B] (stop token included), finished [B] (ended by
    a stop id; False = truncated at max_new_tokens), logprobs [B, T] (sampling log-prob of each sampled
    token at the sampling temperature, after filtering), and the replay record: cand_ids / cand_weights
    [B, T, K] (the fed input was sum_k w_k E[id_k]; an unmixed step holds [y, y, ...] and [1, 0, ...]),
    mixed [B, T] (the step fed a mixture), and the noise training replays: noise_keys [B, T] (int64 draw
    keys) and noise_scales [B, T] (its std; 0 = none): the input was the mixture + scale * z, with
    z = draws.normal_from_keys(key, d)."""

    prompts: list[list[int]]
    response_ids: torch.Tensor
    lengths: torch.Tensor
    finished: torch.Tensor
    logprobs: torch.Tensor
    cand_ids: torch.Tensor
    cand_weights: torch.Tensor
    mixed: torch.Tensor
    noise_keys: torch.Tensor
    noise_scales: torch.Tensor

    def response_mask(self) -> torch.Tensor:
        """[B, T] bool: True at the positions of each row's response (stop token included)."""
        return length_mask(self.lengths, self.response_ids.shape[1])

    def select(self, index: slice | list[int]) -> "Rollout":
        """The rows `index` (a slice or a list of row numbers), as a rollout."""
        if not isinstance(index, slice):
            prompts = [self.prompts[i] for i in index]
            index = torch.tensor(index, dtype=torch.long, device=self.lengths.device)
        else:
            prompts = self.prompts[index]
        return replace(self, prompts=prompts, **{name: getattr(self, name)[index] for name in ROW_TENSORS})

    def responses(self) -> list[list[int]]:
        return [ids[:n].tolist() for ids, n in zip(self.response_ids, self.lengths.tolist())]

    @staticmethod
    def concat(rollouts: list["Rollout"], pad_id: int) -> "Rollout":
        """The rows of several rollouts as one, in order; responses right-padded to the longest (pad_id in
        response_ids and cand_ids, weight 0, log-prob 0, not mixed, no noise)."""
        if len(rollouts) == 1:
            return rollouts[0]
        T = max(r.response_ids.shape[1] for r in rollouts)
        fill = dict(response_ids=pad_id, cand_ids=pad_id, logprobs=0.0, cand_weights=0.0, mixed=False)

        def padded(x: torch.Tensor, value) -> torch.Tensor:  # [B, T_r, ...] -> [B, T, ...]; [B] stays
            if x.dim() == 1:
                return x
            out = x.new_full((x.shape[0], T, *x.shape[2:]), value)
            out[:, : x.shape[1]] = x
            return out

        return replace(rollouts[0], prompts=[p for r in rollouts for p in r.prompts],
                       **{name: torch.cat([padded(getattr(r, name), fill.get(name, 0)) for r in rollouts])
                          for name in ROW_TENSORS})


def filtered_logits(logits: torch.Tensor, temperature: float, top_k: int = 0,
                    top_p: float = 1.0) -> torch.Tensor:
    """logits / temperature with everything outside the top-k and the top-p nucleus set to -inf. [B, V]."""
    logits = logits.float() / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens above it already cover top_p; the most likely token always stays.
        drop = probs.cumsum(-1) - probs >= top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return logits


def mixing_candidates(logits: torch.Tensor, table: torch.Tensor, *, num_neighbors: int, temperature: float,
                      top_p: float = 1.0, top_k: int = 0,
                      weights: str = "code") -> tuple[torch.Tensor, torch.Tensor]:
    """The N-GRPO candidates of one decode step from raw logits [B, V]: (cand_ids [B, K], cand_weights
    [B, K]), K = 1 + num_neighbors, anchor (the greedy token) first, weights summing to 1."""
    probs = filtered_logits(logits, temperature, top_k, top_p).softmax(-1)
    return neighbor_candidates(probs, candidate_table(table, num_neighbors), temperature=temperature,
                               weights=weights)


# ----------------------------------------------------------------------------- the decode loop


class DecodeStep:
    """The model's one-token decode step for S slots, as a function of fixed buffers, so that on CUDA it is
    captured into CUDA graphs and each step is a single replay instead of ~20 kernel launches per layer.

    Buffers: inputs [S, 1, d] (the embedding or mixture fed) and positions [S] (each slot's cache slot,
    which is also its RoPE position: rows are not padded), overwritten in place before every step. A step
    attends over the first `window` cache slots only, so its cost follows the live length; on CUDA one
    graph is captured per window size the loop uses (powers of two: a handful). Returns fp32 logits [S, V];
    with a graph they live in a static buffer that the next replay overwrites, so use them before calling
    again. Sampling stays outside the graph (eager).
    """

    def __init__(self, model, cache: KVCache, *, cuda_graph: bool):
        embed = model.embed_tokens.weight
        S = cache.k.shape[1]
        self.model, self.cache, self.cuda_graph = model, cache, cuda_graph
        self.inputs = torch.zeros(S, 1, embed.shape[1], dtype=embed.dtype, device=embed.device)
        self.positions = torch.zeros(S, dtype=torch.long, device=embed.device)
        self.graphs: dict[int, tuple] = {}  # window -> (graph, its logits buffer)

    def _forward(self, window: int) -> torch.Tensor:
        hidden = self.model.forward_hidden(inputs_embeds=self.inputs, positions=self.positions[:, None],
                                           cache=self.cache, cache_pos=self.positions, window=window)
        return F.linear(hidden[:, 0], self.model.output_weight).float()  # [S, V]

    def _capture(self, window: int) -> tuple:
        # Warm-up runs on a side stream first (cuBLAS and attention pick and allocate their workspaces
        # outside the capture). They write the cache at the current positions what the replay right after
        # writes again: the same inputs at the same slots.
        with torch.cuda.device(self.inputs.device):  # the model's GPU, whichever is current
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._forward(window)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                logits = self._forward(window)
        return graph, logits

    def __call__(self, inputs: torch.Tensor, positions: torch.Tensor, window: int) -> torch.Tensor:
        self.inputs.copy_(inputs[:, None])
        self.positions.copy_(positions)
        if not self.cuda_graph:
            return self._forward(window)
        if window not in self.graphs:
            self.graphs[window] = self._capture(window)
        graph, logits = self.graphs[window]
        graph.replay()
        return logits


PREFILL_TOKENS = 16384  # prompt tokens (rows x their longest prompt) per prefill forward
MIN_WINDOW = 64  # the shortest attention window of a decode step
SYNC_EVERY = 8  # decode steps between the loop's host syncs (to retire finished rows and admit waiting ones)


def attention_window(needed: int, max_len: int) -> int:
    """The window that covers `needed` cache slots: a power of two, at least MIN_WINDOW, at most max_len.
    A few sizes only, so that CUDA captures a few graphs, and a step reads less than twice the live cache."""
    return min(max_len, max(MIN_WINDOW, 1 << (needed - 1).bit_length()))


def prefill(model, cache: KVCache, slots: list[int], prompts: list[list[int]]) -> torch.Tensor:
    """Write each prompt into its slot's cache at positions 0..len-1; fp32 logits [n, V] of each prompt's
    last position.

    Prompts are right-padded to the longest of their chunk: plain causal attention is then exact for every
    real token (no mask tensor), and the padding's cache entries lie past the row's position, where the row
    writes its own tokens before it reads them. Chunks of ~PREFILL_TOKENS prompt tokens bound the
    activations (4k-token prompts x 256 rows would need tens of GB at once)."""
    device = cache.k.device
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a chunk
    rows = max(1, PREFILL_TOKENS // len(prompts[order[-1]]))
    logits = torch.empty(len(prompts), model.cfg.vocab_size, device=device)
    for start in range(0, len(order), rows):
        chunk = order[start : start + rows]
        width = len(prompts[chunk[-1]])
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        for row, i in enumerate(chunk):
            ids[row, : len(prompts[i])] = torch.tensor(prompts[i])
        part = model.new_cache(len(chunk), width)
        hidden = model.forward_hidden(ids.to(device), cache=part, cache_pos=0)  # [n, width, d]
        index = torch.tensor([slots[i] for i in chunk], device=device)
        cache.k[:, index, :, :width], cache.v[:, index, :, :width] = part.k, part.v
        last = torch.tensor([len(prompts[i]) - 1 for i in chunk], device=device)
        last_hidden = hidden[torch.arange(len(chunk), device=device), last]  # [n, d]
        logits[torch.tensor(chunk, device=device)] = F.linear(last_hidden, model.output_weight).float()
    return logits  # [n, V]


@dataclass
class Slots:
    """Per-slot decode state, on the device. A slot holds one row at a time (num_rows = none)."""

    row: torch.Tensor  # [S] long
    prompt_len: torch.Tensor  # [S] long
    length: torch.Tensor  # [S] long: tokens sampled so far, i.e. the response position of the next one
    finished: torch.Tensor  # [S] bool: sampled a stop id
    mixing_on: torch.Tensor  # [S] bool: has not sampled stop_mixing_id

    @classmethod
    def empty(cls, S: int, num_rows: int, device) -> "Slots":
        zeros = torch.zeros(S, dtype=torch.long, device=device)
        no = torch.zeros(S, dtype=torch.bool, device=device)
        return cls(zeros + num_rows, zeros.clone(), zeros.clone(), no, ~no)

    def live(self, num_rows: int, max_new_tokens: int) -> torch.Tensor:
        """[S] bool: the slot holds a row that has neither sampled a stop id nor reached max_new_tokens."""
        return (self.row < num_rows) & ~self.finished & (self.length < max_new_tokens)

    def fill(self, slots: torch.Tensor, rows: torch.Tensor, prompt_lens: torch.Tensor) -> None:
        """A fresh row in each of `slots`: nothing of the slot's previous row carries over."""
        self.row[slots], self.prompt_len[slots] = rows, prompt_lens
        self.length[slots], self.finished[slots], self.mixing_on[slots] = 0, False, True


class Schedule:
    """The host's view of the slots, kept without reading the device: which row each slot holds and since
    which step. It admits waiting rows into free slots at each sync (continuous refill; with refill=False
    only once every slot is free: static batches) and bounds the cache positions a step writes, which sets
    the attention window."""

    def __init__(self, prompt_lens: list[int], slots: int, max_new_tokens: int, refill: bool,
                 cheap_sync: bool = False):
        self.prompt_lens, self.max_new_tokens, self.refill = prompt_lens, max_new_tokens, refill
        self.cheap_sync = cheap_sync  # a sync waits for no device (a CPU)
        self.waiting = deque(range(len(prompt_lens)))
        self.rows: list[int | None] = [None] * slots
        self.since = [0] * slots  # the step at which each slot's row was admitted
        self.step = 0  # decode steps so far

    def retire(self, live: list[bool]) -> list[int]:
        """Free the slots whose rows have ended; returns them."""
        ended = [s for s, row in enumerate(self.rows) if row is not None and not live[s]]
        for s in ended:
            self.rows[s] = None
        return ended

    def admit(self) -> list[tuple[int, int]]:
        """(slot, row) for each waiting row given a free slot now."""
        free = [s for s, row in enumerate(self.rows) if row is None]
        if not self.refill and len(free) < len(self.rows):
            return []
        pairs = [(s, self.waiting.popleft()) for s in free[: len(self.waiting)]]
        for s, row in pairs:
            self.rows[s], self.since[s] = row, self.step
        return pairs

    def done(self) -> bool:
        return not self.waiting and all(row is None for row in self.rows)

    def steps_to_sync(self) -> int:
        """SYNC_EVERY, or fewer when every row reaches max_new_tokens sooner: no step runs past that. Where
        a sync is cheap and no row waits, 1: the loop then ends with its last row, not up to SYNC_EVERY - 1
        wasted steps later (a fifth of a greedy check's decode steps in the demo); while rows wait, rows
        freed within SYNC_EVERY steps are prefilled together (one prefill per freed row costs more)."""
        if self.cheap_sync and not self.waiting:
            return 1
        left = max(self.max_new_tokens - (self.step - since) for row, since in zip(self.rows, self.since)
                   if row is not None)
        return max(1, min(SYNC_EVERY, left))

    def window(self, max_len: int) -> int:
        """This step writes each row at prompt_len + length, and length <= the steps since admission."""
        needed = max(self.prompt_lens[row] + min(self.step - since, self.max_new_tokens)
                     for row, since in zip(self.rows, self.since) if row is not None)
        return attention_window(needed + 1, max_len)


def sample_tokens(probs: torch.Tensor, uniform: torch.Tensor | None) -> torch.Tensor:
    """One token per row from p [B, V]: argmax p (greedy) when uniform is None, else the inverse CDF at
    uniform [B] (float64 in (0, 1)): the token whose interval of the cumulative sum of p holds u * sum p.
    The sum runs in float64, so every token with p > 0 keeps an interval of its exact width to ~1e-16 and
    a filtered-out token (p = 0) has none. One uniform per row: no [B, V] of random numbers to make."""
    if uniform is None:
        return probs.argmax(-1)
    cdf = probs.double().cumsum(-1)  # [B, V]
    total = cdf[:, -1:]
    target = torch.minimum(uniform[:, None] * total, total.nextafter(torch.zeros_like(total)))  # < total
    return torch.searchsorted(cdf, target, right=True)[:, 0]  # the first token whose cdf exceeds target


@dataclass
class Record:
    """The [N + 1, T_max, ...] buffers the loop writes row by row; row N takes what empty slots write."""

    response_ids: torch.Tensor
    logprobs: torch.Tensor
    cand_ids: torch.Tensor
    cand_weights: torch.Tensor
    mixed: torch.Tensor
    noise_keys: torch.Tensor
    noise_scales: torch.Tensor
    lengths: torch.Tensor  # [N + 1], written when a row ends
    finished: torch.Tensor

    @classmethod
    def empty(cls, N: int, T_max: int, K: int, pad_id: int, device) -> "Record":
        def zeros(*shape, dtype=torch.float32):
            return torch.zeros(N + 1, *shape, dtype=dtype, device=device)

        return cls(zeros(T_max, dtype=torch.long) + pad_id, zeros(T_max), zeros(T_max, K, dtype=torch.long),
                   zeros(T_max, K), zeros(T_max, dtype=torch.bool), zeros(T_max, dtype=torch.long),
                   zeros(T_max), zeros(dtype=torch.long), zeros(dtype=torch.bool))

    @property
    def spare_row(self) -> int:
        """N: the row that takes what slots without a live row write (and the row index of an empty slot)."""
        return self.lengths.shape[0] - 1

    def write(self, rows: torch.Tensor, t: torch.Tensor, token: torch.Tensor, logprob: torch.Tensor,
              mixture: Mixture) -> None:
        """Step t[s] of row rows[s], for every slot s at once."""
        for buffer, value in ((self.response_ids, token), (self.logprobs, logprob),
                              (self.cand_ids, mixture.cand_ids), (self.cand_weights, mixture.cand_weights),
                              (self.mixed, mixture.mixed), (self.noise_keys, mixture.noise_keys),
                              (self.noise_scales, mixture.noise_scales)):
            buffer.index_put_((rows, t), value)

    def end_rows(self, state: Slots, slots: torch.Tensor) -> None:
        rows = state.row[slots]
        self.lengths[rows], self.finished[rows] = state.length[slots], state.finished[slots]
        state.row[slots] = self.spare_row

    def rollout(self, prompts: list[list[int]]) -> Rollout:
        N = len(prompts)
        T = int(self.lengths[:N].max())  # trim to the longest response
        return Rollout(prompts=[list(p) for p in prompts], response_ids=self.response_ids[:N, :T],
                       lengths=self.lengths[:N], finished=self.finished[:N], logprobs=self.logprobs[:N, :T],
                       cand_ids=self.cand_ids[:N, :T], cand_weights=self.cand_weights[:N, :T],
                       mixed=self.mixed[:N, :T], noise_keys=self.noise_keys[:N, :T],
                       noise_scales=self.noise_scales[:N, :T])


@dataclass
class Sampler:
    """The per-step rules of one generate call: sample each live slot's token, record the step, explore."""

    sampling: Sampling
    exploration: Exploration
    embed: torch.Tensor  # [V, d] the input embedding
    cand_table: torch.Tensor | None
    seed: int | tuple[int, ...]
    row_keys: torch.Tensor  # [N + 1] each row's key (the last: empty slots')
    max_len: int  # cache slots per row

    def __post_init__(self):
        self.stop_ids = torch.tensor(self.sampling.stop_ids or [-1], device=self.embed.device)

    def __call__(self, logits: torch.Tensor, state: Slots,
                 record: Record) -> tuple[torch.Tensor, torch.Tensor]:
        """One step from each slot's logits [S, V]: the next inputs [S, d] and the cache slots [S] they go
        to."""
        s, x = self.sampling, self.exploration
        greedy = s.temperature == 0
        tau = 1.0 if greedy else s.temperature
        live = state.live(record.spare_row, s.max_new_tokens)
        scaled = filtered_logits(logits, tau, s.top_k, s.top_p)  # [S, V]
        probs = scaled.softmax(-1)
        draws = RowDraws(self.seed, self.row_keys[state.row], state.length.clone())
        token = sample_tokens(probs, None if greedy else draws.uniform(TOKEN, 1)[:, 0])
        token = torch.where(live, token, s.pad_id)  # [S]
        # log of the sampled token's probability: one gather instead of a log_softmax over the vocabulary.
        # In fp32 it differs from log_softmax by ~1e-7; a token is never drawn at p < 1e-38 where log(p)
        # would underflow.
        logprob = torch.where(live, probs.gather(-1, token[:, None])[:, 0].log(), 0.0)
        state.finished |= live & torch.isin(token, self.stop_ids)
        if x.stop_mixing_id is not None:  # the step that samples it is not mixed either
            state.mixing_on &= token != x.stop_mixing_id
        view = StepView(x, scaled, probs, token, live & state.mixing_on, draws.uniform(COIN, 1)[:, 0], tau,
                        self.embed, self.cand_table, draws)
        mixture = EXPLORERS[x.strategy](view)
        if x.feed == "replay-only":  # the same record, but the sampled token is fed (docs/algorithm.md, "--mix-feed")
            mixture.inputs = self.embed[token]
        record.write(torch.where(live, state.row, record.spare_row),
                     state.length.clamp(max=s.max_new_tokens - 1), token, logprob, mixture)
        positions = (state.prompt_len + state.length).clamp(max=self.max_len - 1)  # where y is fed
        state.length += live
        return mixture.inputs, positions


@torch.no_grad()
@torch.autocast("cuda", enabled=False)  # the model's own dtype throughout, inside the CUDA graph too
def generate(model, prompts: list[list[int]], sampling: Sampling, exploration: Exploration = Exploration(), *,
             neighbor_table: torch.Tensor | None = None, seed: int | tuple[int, ...] = 0,
             row_keys: Sequence[int] | None = None, slots: int | None = None, refill: bool = True,
             cuda_graph: bool | None = None, progress: bool = False) -> Rollout:
    """Sample one response per prompt; the Rollout is row-aligned with the prompts.

    slots rows (default all) decode at once, each at its own position; when a row ends, the next waiting
    row is prefilled into its slot at the next sync (refill=False: only when every slot is free, i.e.
    static batches). A step attends over the cache window its rows have written, not the whole cache.
    Randomness: row i's response is a function of (seed, row_keys[i], the model) alone: every draw (token,
    mixing coin, noise) hashes them with the row's response position (draws.py), so it depends on no
    batch-mate, slot or order. row_keys: distinct ints, default 0..len-1 (callers pass e.g. a row's index
    among a training step's rows, or eval.sample_key(problem, sample)). The model runs in its own dtype
    (autocast is off; on GPU pass a bf16 model). cuda_graph: replay the decode step from CUDA graphs
    (DecodeStep); None = whenever the model is on a CUDA device. progress: a tqdm bar on stderr for
    rollouts over 2 s."""
    N = len(prompts)
    keys = _check_arguments(model, prompts, exploration, neighbor_table, cuda_graph, row_keys, slots)
    device = model.embed_tokens.weight.device
    S, T_max = min(slots or N, N), sampling.max_new_tokens
    cache = model.new_cache(S, max(map(len, prompts)) + T_max)
    cand_table = None
    if neighbor_table is not None:
        cand_table = candidate_table(neighbor_table, exploration.num_neighbors)
    sampler = Sampler(sampling, exploration, model.embed_tokens.weight, cand_table, seed, keys, cache.max_len)
    record = Record.empty(N, T_max, exploration.num_candidates, sampling.pad_id, device)
    state = Slots.empty(S, N, device)
    schedule = Schedule(list(map(len, prompts)), S, T_max, refill, cheap_sync=device.type == "cpu")
    step = DecodeStep(model, cache, cuda_graph=device.type == "cuda" if cuda_graph is None else cuda_graph)
    logits = torch.zeros(S, model.cfg.vocab_size, device=device)
    bar = tqdm(total=N, desc="rollout", unit="row", leave=False, delay=2, file=sys.stderr,
               disable=None if progress else True)  # None: no bar into a log file
    while True:
        ended = schedule.retire(state.live(N, T_max).tolist())  # the loop's host sync
        if ended:
            record.end_rows(state, torch.tensor(ended, device=device))
            bar.update(len(ended))
        admitted = schedule.admit()
        if admitted:
            free, rows = zip(*admitted)
            prompts_in = [prompts[row] for row in rows]
            free_slots = torch.tensor(free, device=device)
            logits = logits.index_copy(0, free_slots, prefill(model, cache, list(free), prompts_in))
            state.fill(free_slots, torch.tensor(rows, device=device),
                       torch.tensor([len(p) for p in prompts_in], device=device))
        if schedule.done():
            break
        for _ in range(schedule.steps_to_sync()):
            inputs, positions = sampler(logits, state, record)
            logits = step(inputs, positions, schedule.window(cache.max_len))
            schedule.step += 1
    bar.close()
    return record.rollout(prompts)


def _check_arguments(model, prompts, exploration: Exploration, neighbor_table, cuda_graph, row_keys,
                     slots) -> torch.Tensor:
    """Raises on bad arguments; returns the row keys as a tensor [N + 1] (the last: empty slots')."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate needs at least one prompt and no empty prompt")
    if exploration.strategy == "neighbor" and (neighbor_table is None or
                                               neighbor_table.shape[1] < exploration.num_neighbors):
        raise ValueError(f"the neighbor strategy needs a neighbor_table with at least "
                         f"{exploration.num_neighbors} columns (neighbors.build_neighbor_table)")
    device = model.embed_tokens.weight.device
    if cuda_graph and device.type != "cuda":
        raise ValueError(f"cuda_graph=True needs a model on a CUDA device; this one is on {device}")
    if slots is not None and slots < 1:
        raise ValueError(f"slots must be at least 1, not {slots}")
    row_keys = list(range(len(prompts)) if row_keys is None else row_keys)
    if len(row_keys) != len(prompts) or len(set(row_keys)) != len(prompts):
        raise ValueError(f"row_keys must be {len(prompts)} distinct ints, one per prompt")
    return torch.tensor([*row_keys, 0], dtype=torch.long, device=device)


def exploration_from_config(cfg, tokenizer) -> Exploration:
    """The Exploration a Config's flags describe (train.py and eval.py alike), with `stop_mixing_token`
    looked up in the tokenizer: a token it does not have is an error, not a silent never-stop."""
    stop_mixing_id = None
    if cfg.stop_mixing_token and cfg.explore != "none":
        stop_mixing_id = tokenizer.convert_tokens_to_ids(cfg.stop_mixing_token)
        if not isinstance(stop_mixing_id, int) or stop_mixing_id < 0 or stop_mixing_id == tokenizer.unk_token_id:
            raise ValueError(f"--stop-mixing-token {cfg.stop_mixing_token!r} is not one token of the tokenizer "
                             "(pass --stop-mixing-token '' to mix until the end of the response)")
    return Exploration(cfg.explore, mix_rate=cfg.mix_rate, mix_entropy_threshold=cfg.mix_entropy_threshold,
                       num_neighbors=cfg.num_neighbors, weights=cfg.mix_weights, top_k=cfg.soft_top_k,
                       mix_temperature=cfg.mix_temperature, noise_sigma=cfg.noise_sigma, feed=cfg.mix_feed,
                       stop_mixing_id=stop_mixing_id)
