"""The KV-cached sampler with continuous refill; the exploration strategies it calls are in strategies.py.

One decode step, for every live row at once (the paper's steps 1-5, docs/algorithm.md):

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

from __future__ import annotations

import sys
import warnings
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from tqdm import tqdm

import model as M
from model import KVCache
from strategies import (
    EXPLORERS,
    Exploration,
    RowDraws,
    StepView,
    candidate_table,
    neighbor_candidates,
    seed_state,
    step_uniforms,
)


def length_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """[B, width] bool: position t of row b is True when t < lengths[b]."""
    return torch.arange(width, device=lengths.device)[None] < lengths[:, None]


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
    z = strategies.normal_from_keys(key, d)."""

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


class Decoder:
    """Everything decoding keeps between generate calls on one model: the KV cache of S slots x max_len
    positions, each slot's state, the logits buffer, the step records since the last sync, and, on CUDA, the
    captured graphs. A graph holds a whole step, sampler and model, as a function of these fixed buffers:
    sample each slot's token from `logits`, record it, explore, feed the input at the slot's position,
    leave the next logits in `logits`. The row lengths are data: with FlashAttention's variable-length kernel
    (bf16 on a GPU) one graph serves every length, captured once per (sampling, exploration) and reused by every
    later call; elsewhere (a CPU, fp32) a step attends over a power-of-two window of the cache, one graph per
    window. Nothing in a step waits for the host: the loop syncs once every SYNC_EVERY steps.

    generate() keeps one Decoder per model (decoder_for) and reuses it while the slots and the longest prompt +
    response fit; release_decoder(model) frees its memory (train.py does before each update)."""

    def __init__(self, model, slots: int, max_len: int, *, cuda_graph: bool, compile_backend: str | None):
        embed = model.embed_tokens.weight
        self.device, self.dtype, self.slots, self.cuda_graph = embed.device, embed.dtype, slots, cuda_graph
        self.cache = model.new_cache(slots, max_len)
        self.state = Slots.empty(slots, self.device)
        self.logits = torch.zeros(slots, model.cfg.vocab_size, device=self.device)  # [S, V] fp32
        self.seed = torch.zeros((), dtype=torch.long, device=self.device)  # this call's strategies.seed_state
        self.ring_pos = torch.zeros((), dtype=torch.long, device=self.device)  # steps recorded since the sync
        self.rings: dict[int, StepRing] = {}  # candidates per step -> the step records since the last sync
        self.tables: dict[int, torch.Tensor] = {}  # candidates per step -> the candidate table's buffer
        self.samplers: dict[tuple, Sampler] = {}
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.captures = 0  # graphs captured so far (a reused decoder captures none)
        self.ops = M.decode_ops(compile_backend)
        self.uniforms = step_uniforms_for(compile_backend)  # the step's two draws (compiled: one kernel)
        self.verified = False  # a first step ran (with the compiled functions and FlashAttention, or without)
        self.flash = None  # how FlashAttention's kernel runs the attention (M.FlashDecode), where it can
        self.flash_timings: dict[str, float] = {}  # its two layouts' milliseconds here (the faster is used)
        if M.flash_decode_supported(model.cfg, self.dtype, self.device):
            try:
                shape = (slots, max_len, self.dtype, str(self.device), model.cfg.num_heads, model.cfg.num_kv_heads,
                         model.cfg.head_dim)
                if shape not in _FLASH_LAYOUTS:  # measured once per process and shape, then kept
                    _FLASH_LAYOUTS[shape] = M.fastest_flash_layout(model.cfg, self.cache)
                grouped, self.flash_timings = _FLASH_LAYOUTS[shape]
                self.flash = M.flash_decode(slots, max_len, model.cfg.num_heads // model.cfg.num_kv_heads, grouped,
                                            self.device)
            except RuntimeError as error:  # an old GPU, a build without the kernel: the windowed attention
                warnings.warn(f"the decode step runs without FlashAttention ({str(error)[:200]})", stacklevel=3)
        self.pool = torch.cuda.graph_pool_handle() if cuda_graph else None
        self.fused = self.device.type == "cuda"  # one product for q/k/v and one for gate/up: it pays on a GPU
        if self.fused:
            M.fuse_projections(model)
        self.weights = weight_pointers(model)

    @property
    def max_len(self) -> int:
        return self.cache.max_len

    def fits(self, model, slots: int, max_len: int, cuda_graph: bool) -> bool:
        embed = model.embed_tokens.weight
        return (slots == self.slots and max_len <= self.max_len and cuda_graph == self.cuda_graph
                and embed.device == self.device and embed.dtype == self.dtype)

    def begin(self, model, sampling: Sampling, exploration: Exploration, seed, neighbor_table) -> Sampler:
        """Empties every slot and sets this call's seed and neighbor table; returns the call's sampler."""
        if (self.fused and M.fuse_projections(model)) or weight_pointers(model) != self.weights:
            self.graphs.clear()  # the graphs read the weights where they were at capture
            self.weights = weight_pointers(model)
        self.state.clear()
        self.ring_pos.zero_()
        self.seed.fill_(seed_state(seed))
        K = exploration.num_candidates
        if K not in self.rings:
            self.rings[K] = StepRing.empty(SYNC_EVERY, self.slots, K, self.device)
        cand_table = None
        if neighbor_table is not None and exploration.strategy == "neighbor":
            cand_table = candidate_table(neighbor_table.to(self.device), exploration.num_neighbors)
            if K not in self.tables or self.tables[K].shape != cand_table.shape:
                self.tables[K] = torch.empty_like(cand_table)
            cand_table = self.tables[K].copy_(cand_table)
        key = (sampling, exploration)
        if key not in self.samplers or self.samplers[key].cand_table is not cand_table:
            self.samplers[key] = Sampler(sampling, exploration, model.embed_tokens.weight, cand_table, self.seed,
                                         self.max_len)
            self.graphs = {k: g for k, g in self.graphs.items() if k[:2] != key}
        return self.samplers[key]

    def run_step(self, model, sampler: Sampler, window: int | None) -> None:
        """One step as written (what a graph captures): sample from `logits`, record, feed, new `logits`."""
        inputs, positions = sampler(self.logits, self.state, self.rings[sampler.exploration.num_candidates],
                                    self.ring_pos, self.uniforms)
        hidden = M.decode_hidden(model, inputs, positions, self.cache, ops=self.ops, window=window, flash=self.flash)
        self.logits.copy_(F.linear(hidden, model.output_weight))

    def step(self, model, sampler: Sampler, window: int) -> None:
        """One decode step of every slot; window: the cache slots the live rows need (unused by the
        FlashAttention kernel, which reads each row's own length)."""
        if self.verified:
            return self._step(model, sampler, window)
        # The first step of a decoder is where torch.compile or FlashAttention would fail (no C compiler for
        # Triton, an old GPU): then the step runs without them, slower but the same numbers up to rounding.
        saved = self._saved()
        while True:
            try:
                self._step(model, sampler, window)
                break
            except Exception as error:
                fallback = self._fall_back(error)
                if fallback is None:
                    raise
                warnings.warn(f"the decode step runs without {fallback}: its first step failed with "
                              f"{type(error).__name__}: {str(error)[:300]}", stacklevel=2)
                self._restore(saved)
        self.verified = True

    def _fall_back(self, error: Exception) -> str | None:
        """Turns off what may have caused `error` (torch.compile first, then FlashAttention); None: nothing."""
        self.graphs.clear()
        compile_errors = (torch._dynamo.exc.TorchDynamoException,
                          getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", torch._dynamo.exc.TorchDynamoException))
        if self.ops is not M.decode_ops(None) and isinstance(error, compile_errors):
            self.ops, self.uniforms = M.decode_ops(None), step_uniforms
            return "torch.compile"
        if self.flash is not None and isinstance(error, RuntimeError):
            self.flash = None
            return "FlashAttention (each step attends over a power-of-two window of the cache instead)"
        return None

    def _step(self, model, sampler: Sampler, window: int) -> None:
        window = None if self.flash is not None else window
        if not self.cuda_graph:
            return self.run_step(model, sampler, window)
        key = (sampler.sampling, sampler.exploration, window)
        if key not in self.graphs:
            self.graphs[key] = self._capture(model, sampler, window)
        self.graphs[key].replay()

    def _saved(self) -> list[torch.Tensor]:
        """Copies of what a step changes, but the cache (rewritten at a slot before any row reads it)."""
        return [t.clone() for t in (*self.state.tensors(), self.logits, self.ring_pos)]

    def _restore(self, saved: list[torch.Tensor]) -> None:
        for target, value in zip((*self.state.tensors(), self.logits, self.ring_pos), saved):
            target.copy_(value)

    def _capture(self, model, sampler: Sampler, window: int | None) -> torch.cuda.CUDAGraph:
        # Two warm-up steps on a side stream first (torch.compile compiles, cuBLAS and attention choose and
        # allocate their workspaces outside the capture), then everything they changed is put back, so that the
        # replay right after is the step itself. Cache slots they wrote are rewritten before any row reads them.
        saved = self._saved()
        with torch.cuda.device(self.device):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self.run_step(model, sampler, window)
            torch.cuda.current_stream().wait_stream(stream)
            self._restore(saved)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.run_step(model, sampler, window)
        self.captures += 1
        return graph

    def flush(self, record: "Record", steps: int, K: int) -> None:
        """Moves the last `steps` steps' records into the call's record (at a sync)."""
        if steps:
            self.rings[K].move_to(record, steps)
            self.ring_pos.zero_()


_DECODERS: "weakref.WeakKeyDictionary[object, Decoder]" = weakref.WeakKeyDictionary()
_FLASH_LAYOUTS: dict[tuple, tuple[bool, dict]] = {}  # a decoder's shape -> (grouped is faster, its timings)


def weight_pointers(model) -> tuple[int, ...]:
    return tuple(p.data_ptr() for p in model.parameters())


_STEP_UNIFORMS: dict[object, object] = {}  # compile backend -> strategies.step_uniforms compiled by it


def step_uniforms_for(backend) -> object:
    """step_uniforms as written (backend None) or compiled with dynamic sizes: one per backend and process."""
    if backend is None:
        return step_uniforms
    if backend not in _STEP_UNIFORMS:
        _STEP_UNIFORMS[backend] = M.compiled(step_uniforms, backend)
    return _STEP_UNIFORMS[backend]


def compile_backend(device: torch.device) -> str | None:
    """The backend that compiles the decode step's elementwise functions: inductor on a GPU (fused kernels);
    on a CPU none (compiling costs more than it saves there, and the eager functions are the reference)."""
    return "inductor" if device.type == "cuda" else None


def decoder_for(model, slots: int, max_len: int, cuda_graph: bool) -> Decoder:
    """The model's Decoder, kept from an earlier call when it fits, else a new one (the old one freed first)."""
    decoder = _DECODERS.get(model)
    if decoder is not None and decoder.fits(model, slots, max_len, cuda_graph):
        return decoder
    release_decoder(model)
    # A little room to spare, so that a slightly longer prompt next call reuses the cache and its graphs.
    max_len = -(-max_len // CACHE_ROUND) * CACHE_ROUND
    device = model.embed_tokens.weight.device
    decoder = Decoder(model, slots, max_len, cuda_graph=cuda_graph, compile_backend=compile_backend(device))
    _DECODERS[model] = decoder
    return decoder


def release_decoder(model) -> None:
    """Frees the KV cache, buffers and graphs that generate() keeps for `model` (the next call makes new ones)."""
    if _DECODERS.pop(model, None) is not None and model.embed_tokens.weight.device.type == "cuda":
        torch.cuda.empty_cache()


PREFILL_TOKENS = 16384  # prompt tokens (rows x their longest prompt) per prefill forward
MIN_WINDOW = 64  # the shortest attention window of a decode step
SYNC_EVERY = 8  # decode steps between the loop's host syncs (to retire finished rows and admit waiting ones)
CDF_BLOCK = 128  # tokens per block of sample_tokens' two-level inverse CDF
CACHE_ROUND = 256  # the KV cache's positions per row are rounded up to a multiple of this (runtime/plan.py counts it)


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
        cache.k[:, index, :width], cache.v[:, index, :width] = part.k, part.v
        last = torch.tensor([len(prompts[i]) - 1 for i in chunk], device=device)
        last_hidden = hidden[torch.arange(len(chunk), device=device), last]  # [n, d]
        logits[torch.tensor(chunk, device=device)] = F.linear(last_hidden, model.output_weight).float()
    return logits  # [n, V]


@dataclass
class Slots:
    """Per-slot decode state, on the device. A slot holds one row at a time (row -1: none)."""

    row: torch.Tensor  # [S] long: the row of this generate call, -1 = empty
    key: torch.Tensor  # [S] long: that row's key (generate's row_keys), which its random draws hash
    prompt_len: torch.Tensor  # [S] long
    length: torch.Tensor  # [S] long: tokens sampled so far, i.e. the response position of the next one
    finished: torch.Tensor  # [S] bool: sampled a stop id
    mixing_on: torch.Tensor  # [S] bool: has not sampled stop_mixing_id

    @classmethod
    def empty(cls, S: int, device) -> "Slots":
        zeros = torch.zeros(S, dtype=torch.long, device=device)
        no = torch.zeros(S, dtype=torch.bool, device=device)
        return cls(zeros - 1, zeros.clone(), zeros.clone(), zeros.clone(), no, ~no)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.row, self.key, self.prompt_len, self.length, self.finished, self.mixing_on

    def clear(self) -> None:
        """Every slot empty (in place: a captured graph reads these very tensors)."""
        self.row.fill_(-1), self.key.zero_(), self.prompt_len.zero_(), self.length.zero_()
        self.finished.fill_(False), self.mixing_on.fill_(True)

    def live(self, max_new_tokens: int) -> torch.Tensor:
        """[S] bool: the slot holds a row that has neither sampled a stop id nor reached max_new_tokens."""
        return (self.row >= 0) & ~self.finished & (self.length < max_new_tokens)

    def fill(self, slots: torch.Tensor, rows: torch.Tensor, keys: torch.Tensor, prompt_lens: torch.Tensor) -> None:
        """A fresh row in each of `slots`: nothing of the slot's previous row carries over."""
        self.row[slots], self.key[slots], self.prompt_len[slots] = rows, keys, prompt_lens
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


STEP_FIELDS = ("response_ids", "logprobs", "cand_ids", "cand_weights", "mixed", "noise_keys", "noise_scales")


def step_buffers(lead: tuple[int, ...], K: int, device) -> dict[str, torch.Tensor]:
    """STEP_FIELDS as zero tensors of shape [*lead] (ids, log-probs, flags, noise) or [*lead, K] (candidates)."""
    long, flt = torch.long, torch.float32
    shapes = dict(response_ids=((), long), logprobs=((), flt), cand_ids=((K,), long), cand_weights=((K,), flt),
                  mixed=((), torch.bool), noise_keys=((), long), noise_scales=((), flt))
    return {name: torch.zeros(*lead, *extra, dtype=dtype, device=device) for name, (extra, dtype) in shapes.items()}


@dataclass
class StepRing:
    """The records of the steps since the last sync, [R, S, ...] (R = SYNC_EVERY): a step writes its record at
    the device counter's position, so that it needs neither the host nor the call's own buffers (which a
    graph reused by later calls cannot know); the sync moves them into the call's Record."""

    rows: torch.Tensor  # [R, S] the row each slot's step belongs to (-1: no live row)
    steps: torch.Tensor  # [R, S] its response position
    fields: dict[str, torch.Tensor]  # STEP_FIELDS, [R, S, ...]

    @classmethod
    def empty(cls, R: int, S: int, K: int, device) -> "StepRing":
        rows = torch.zeros(R, S, dtype=torch.long, device=device)
        return cls(rows, rows.clone(), step_buffers((R, S), K, device))

    def write(self, pos: torch.Tensor, rows: torch.Tensor, steps: torch.Tensor, values: dict) -> None:
        index = pos.remainder(self.rows.shape[0]).view(1)  # a device scalar: no host sync, same kernels each step
        self.rows.index_copy_(0, index, rows[None])
        self.steps.index_copy_(0, index, steps[None])
        for name, buffer in self.fields.items():
            buffer.index_copy_(0, index, values[name][None].to(buffer.dtype))

    def move_to(self, record: "Record", n: int) -> None:
        rows = self.rows[:n].flatten()
        rows = torch.where(rows < 0, record.spare_row, rows)
        steps = self.steps[:n].flatten()
        for name, buffer in self.fields.items():
            getattr(record, name).index_put_((rows, steps), buffer[:n].flatten(0, 1))


@dataclass
class Record:
    """The [N + 1, T_max, ...] buffers of one generate call, written row by row at each sync; row N takes what
    empty slots wrote."""

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
        buffers = step_buffers((N + 1, T_max), K, device)
        buffers["response_ids"] += pad_id
        return cls(**buffers, lengths=torch.zeros(N + 1, dtype=torch.long, device=device),
                   finished=torch.zeros(N + 1, dtype=torch.bool, device=device))

    @property
    def spare_row(self) -> int:
        """N: the row that takes what slots without a live row write."""
        return self.lengths.shape[0] - 1

    def end_rows(self, state: Slots, slots: torch.Tensor) -> None:
        rows = state.row[slots]
        self.lengths[rows], self.finished[rows] = state.length[slots], state.finished[slots]
        state.row[slots] = -1

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
    """The per-step rules of one (sampling, exploration): sample each live slot's token, record the step,
    explore. Pure tensor work on fixed buffers, so a CUDA graph captures it with the model's step."""

    sampling: Sampling
    exploration: Exploration
    embed: torch.Tensor  # [V, d] the input embedding
    cand_table: torch.Tensor | None
    seed: torch.Tensor  # [] int64: the call's strategies.seed_state (a buffer: each call writes its own)
    max_len: int  # cache slots per row

    def __post_init__(self):
        self.stop_ids = torch.tensor(self.sampling.stop_ids or [-1], device=self.embed.device)

    def __call__(self, logits: torch.Tensor, state: Slots, ring: StepRing, ring_pos: torch.Tensor,
                 uniforms=step_uniforms) -> tuple[torch.Tensor, torch.Tensor]:
        """One step from each slot's logits [S, V]: the next inputs [S, d] and the cache slots [S] they go to.
        uniforms: strategies.step_uniforms, or the same compiled (Decoder.uniforms)."""
        s, x = self.sampling, self.exploration
        greedy = s.temperature == 0
        tau = 1.0 if greedy else s.temperature
        live = state.live(s.max_new_tokens)
        scaled = filtered_logits(logits, tau, s.top_k, s.top_p)  # [S, V]
        probs = scaled.softmax(-1)
        draws = RowDraws(self.seed, state.key, state.length.clone())
        token_u, coin_u = uniforms(self.seed, state.key, state.length)  # = draws.uniform(TOKEN / COIN, 1)[:, 0]
        token = sample_tokens(probs, None if greedy else token_u)
        token = torch.where(live, token, s.pad_id)  # [S]
        # log of the sampled token's probability: one gather instead of a log_softmax over the vocabulary.
        # In fp32 it differs from log_softmax by ~1e-7; a token is never drawn at p < 1e-38 where log(p)
        # would underflow.
        logprob = torch.where(live, probs.gather(-1, token[:, None])[:, 0].log(), 0.0)
        state.finished |= live & (token[:, None] == self.stop_ids).any(-1)
        if x.stop_mixing_id is not None:  # the step that samples it is not mixed either
            state.mixing_on &= token != x.stop_mixing_id
        view = StepView(x, scaled, probs, token, live & state.mixing_on, coin_u, tau,
                        self.embed, self.cand_table, draws)
        mixture = EXPLORERS[x.strategy](view)
        if x.feed == "replay-only":  # the same record, but the sampled token is fed (docs/algorithm.md, "--mix-feed")
            mixture.inputs = self.embed[token]
        ring.write(ring_pos, torch.where(live, state.row, -1), state.length.clamp(max=s.max_new_tokens - 1),
                   dict(response_ids=token, logprobs=logprob, cand_ids=mixture.cand_ids,
                        cand_weights=mixture.cand_weights, mixed=mixture.mixed, noise_keys=mixture.noise_keys,
                        noise_scales=mixture.noise_scales))
        ring_pos += 1
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
    static batches). A step attends over the cache its rows have written, not the whole cache.
    Randomness: row i's response is a function of (seed, row_keys[i], the model) alone: every draw (token,
    mixing coin, noise) hashes them with the row's response position (strategies.RowDraws), so it depends on no
    batch-mate, slot or order. row_keys: distinct ints, default 0..len-1 (callers pass e.g. a row's index
    among a training step's rows, or eval.sample_key(problem, sample)). The model runs in its own dtype
    (autocast is off; on GPU pass a bf16 model). cuda_graph: replay each step from a CUDA graph (Decoder);
    None = whenever the model is on a CUDA device. The KV cache and graphs stay for the next call
    (release_decoder frees them). progress: a tqdm bar on stderr for rollouts over 2 s."""
    N = len(prompts)
    keys = _check_arguments(model, prompts, exploration, neighbor_table, cuda_graph, row_keys, slots)
    device = model.embed_tokens.weight.device
    S, T_max, K = min(slots or N, N), sampling.max_new_tokens, exploration.num_candidates
    graphed = device.type == "cuda" if cuda_graph is None else cuda_graph
    decoder = decoder_for(model, S, max(map(len, prompts)) + T_max, graphed)
    sampler = decoder.begin(model, sampling, exploration, seed, neighbor_table)
    record = Record.empty(N, T_max, K, sampling.pad_id, device)
    schedule = Schedule(list(map(len, prompts)), S, T_max, refill, cheap_sync=device.type == "cpu")
    bar = tqdm(total=N, desc="rollout", unit="row", leave=False, delay=2, file=sys.stderr,
               disable=None if progress else True)  # None: no bar into a log file
    unsynced = 0  # steps since the last sync
    while True:
        live = decoder.state.live(T_max).tolist()  # the loop's host sync
        decoder.flush(record, unsynced, K)
        unsynced = 0
        ended = schedule.retire(live)
        if ended:
            record.end_rows(decoder.state, torch.tensor(ended, device=device))
            bar.update(len(ended))
        admitted = schedule.admit()
        if admitted:
            free, rows = zip(*admitted)
            prompts_in = [prompts[row] for row in rows]
            free_slots = torch.tensor(free, device=device)
            decoder.logits.index_copy_(0, free_slots, prefill(model, decoder.cache, list(free), prompts_in))
            rows = torch.tensor(rows, device=device)
            decoder.state.fill(free_slots, rows, keys[rows],
                               torch.tensor([len(p) for p in prompts_in], device=device))
        if schedule.done():
            break
        for _ in range(schedule.steps_to_sync()):
            decoder.step(model, sampler, schedule.window(decoder.max_len))
            schedule.step += 1
            unsynced += 1
    bar.close()
    return record.rollout(prompts)


def _check_arguments(model, prompts, exploration: Exploration, neighbor_table, cuda_graph, row_keys,
                     slots) -> torch.Tensor:
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
    if slots is not None and slots < 1:
        raise ValueError(f"slots must be at least 1, not {slots}")
    row_keys = list(range(len(prompts)) if row_keys is None else row_keys)
    if len(row_keys) != len(prompts) or len(set(row_keys)) != len(prompts):
        raise ValueError(f"row_keys must be {len(prompts)} distinct ints, one per prompt")
    return torch.tensor(row_keys, dtype=torch.long, device=device)


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
