"""The decode loop: S slots of a static KV cache decoding at once, a step rule run on each, the step records kept.

    decoder = decoder_for(model, slots=S, max_len=P + T, cuda_graph=True)
    rule = decoder.start(model, key, build)          # the rule of this (sampling, exploration), kept between calls
    lengths, finished, steps = decoder.run(model, rule, prompts, row_keys)   # steps: name -> [N, T, ...]

The engine knows nothing of sampling or exploration. A step rule (rollout.Sampler is the one the repo has) is a
callable `rule(logits [S, V], slots, live [S], backend) -> (inputs [S, d], record)` that reads each slot's logits,
updates the slots' state in place (`finished`, and its own declared per-row fields in `slots.extra`), and returns
the next input of every slot and the step's record, one tensor per field it declares (`rule.fields`: name, dtype,
pad, per_candidate). The engine allocates, writes, moves and pads exactly what those fields list.

How it is fast: `slots` rows decode at once, each at its own position in its own slot of the KV cache (no left
padding); per-row state (position, finished, the rule's own fields) lives in tensors. Every SYNC_EVERY steps (on a
CPU, once no row waits, every step) the loop syncs with the host once: rows that ended leave their slots and waiting
rows are prefilled into them (continuous refill). A step writes its record into a ring at a device counter's
position, so that nothing in it waits for the host; a sync moves the ring into the call's buffers. On CUDA a step,
rule and model together, is one captured graph over these fixed buffers; the row lengths are data, so with
FlashAttention's variable-length kernel one graph serves every length (elsewhere a step attends over a power-of-two
window of the cache, one graph per window).
"""

import sys
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from engine import kernels
from model import KVCache, Transformer

PREFILL_TOKENS = 16384  # prompt tokens (rows x their longest prompt) per prefill forward
MIN_WINDOW = 64  # the shortest attention window of a decode step
SYNC_EVERY = 8  # decode steps between the loop's host syncs (to retire finished rows and admit waiting ones)
CACHE_ROUND = 256  # the KV cache's positions per row are rounded up to a multiple of this (runtime/plan.py counts it)


def field_buffers(fields, lead: tuple[int, ...], K: int, pad_id: int, device) -> dict[str, torch.Tensor]:
    """One tensor per field, [*lead] or [*lead, K] (per_candidate), filled with its pad (None: pad_id)."""
    return {f.name: torch.full((*lead, *((K,) if f.per_candidate else ())), pad_id if f.pad is None else f.pad,
                               dtype=f.dtype, device=device) for f in fields}


@dataclass
class Slots:
    """Per-slot decode state, on the device. A slot holds one row at a time (row -1: none); `extra` holds the
    per-row fields step rules declare (`rule.state_fields`), each reset to its pad when a row starts."""

    row: torch.Tensor  # [S] long: the row of this generate call, -1 = empty
    key: torch.Tensor  # [S] long: that row's key, which its random draws hash
    prompt_len: torch.Tensor  # [S] long
    length: torch.Tensor  # [S] long: tokens sampled so far, i.e. the response position of the next one
    finished: torch.Tensor  # [S] bool: sampled a stop id
    extra: dict[str, torch.Tensor]  # name -> [S]: the rules' own per-row state
    initial: dict[str, float | int | bool]  # name -> the value a fresh row starts with

    @classmethod
    def empty(cls, S: int, device) -> "Slots":
        zeros = torch.zeros(S, dtype=torch.long, device=device)
        return cls(zeros - 1, zeros.clone(), zeros.clone(), zeros.clone(),
                   torch.zeros(S, dtype=torch.bool, device=device), {}, {})

    def declare(self, fields) -> None:
        """Adds the per-row fields a rule declares (kept: a graph captured earlier reads the tensors it saw)."""
        for f in fields:
            if f.name not in self.extra:
                self.extra[f.name] = torch.full_like(self.row, f.pad, dtype=f.dtype)
                self.initial[f.name] = f.pad

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.row, self.key, self.prompt_len, self.length, self.finished, *self.extra.values()

    def clear(self) -> None:
        """Every slot empty (in place: a captured graph reads these very tensors)."""
        self.row.fill_(-1), self.key.zero_(), self.prompt_len.zero_(), self.length.zero_(), self.finished.fill_(False)
        for name, value in self.extra.items():
            value.fill_(self.initial[name])

    def live(self, max_new_tokens: int) -> torch.Tensor:
        """[S] bool: the slot holds a row that has neither sampled a stop id nor reached max_new_tokens."""
        return (self.row >= 0) & ~self.finished & (self.length < max_new_tokens)

    def fill(self, slots: torch.Tensor, rows: torch.Tensor, keys: torch.Tensor, prompt_lens: torch.Tensor) -> None:
        """A fresh row in each of `slots`: nothing of the slot's previous row carries over."""
        self.row[slots], self.key[slots], self.prompt_len[slots] = rows, keys, prompt_lens
        self.length[slots], self.finished[slots] = 0, False
        for name, value in self.extra.items():
            value[slots] = self.initial[name]


@dataclass
class StepRing:
    """The records of the steps since the last sync, [R, S, ...] (R = SYNC_EVERY): a step writes its record at
    the device counter's position, so that it needs neither the host nor the call's own buffers (which a
    graph reused by later calls cannot know); the sync moves them into the call's Record."""

    rows: torch.Tensor  # [R, S] the row each slot's step belongs to (-1: no live row)
    steps: torch.Tensor  # [R, S] its response position
    fields: dict[str, torch.Tensor]  # the rule's fields, [R, S, ...]

    @classmethod
    def empty(cls, R: int, S: int, rule, device) -> "StepRing":
        rows = torch.zeros(R, S, dtype=torch.long, device=device)
        return cls(rows, rows.clone(), field_buffers(rule.fields, (R, S), rule.num_candidates, 0, device))

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
            record.steps[name].index_put_((rows, steps), buffer[:n].flatten(0, 1))


@dataclass
class Record:
    """The [N + 1, T_max, ...] buffers of one generate call, written row by row at each sync; row N takes what
    empty slots wrote."""

    steps: dict[str, torch.Tensor]  # the rule's fields
    lengths: torch.Tensor  # [N + 1], written when a row ends
    finished: torch.Tensor

    @classmethod
    def empty(cls, N: int, rule, device) -> "Record":
        lengths = torch.zeros(N + 1, dtype=torch.long, device=device)
        return cls(field_buffers(rule.fields, (N + 1, rule.max_new_tokens), rule.num_candidates, rule.pad_id, device),
                   lengths, torch.zeros(N + 1, dtype=torch.bool, device=device))

    @property
    def spare_row(self) -> int:
        """N: the row that takes what slots without a live row write."""
        return self.lengths.shape[0] - 1

    def end_rows(self, state: Slots, slots: torch.Tensor) -> None:
        rows = state.row[slots]
        self.lengths[rows], self.finished[rows] = state.length[slots], state.finished[slots]
        state.row[slots] = -1

    def result(self) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """(lengths [N], finished [N], steps: name -> [N, T, ...]) with T the longest response."""
        N = self.spare_row
        T = int(self.lengths[:N].max())
        return self.lengths[:N], self.finished[:N], {name: value[:N, :T] for name, value in self.steps.items()}


class Decoder:
    """Everything decoding keeps between calls on one model: the KV cache of S slots x max_len positions, each
    slot's state, the logits buffer, the rules it has run with their step rings, and, on CUDA, the captured graphs.
    A graph holds a whole step, rule and model, as a function of these fixed buffers: the rule reads `logits` and
    returns each slot's input and record, the record goes into the ring, the model's step leaves the next logits in
    `logits`. Nothing in a step waits for the host: the loop syncs once every SYNC_EVERY steps.

    decoder_for keeps one Decoder per model and reuses it while the slots and the longest prompt + response fit;
    release_decoder(model) frees its memory (train.py does before each update)."""

    def __init__(self, model: Transformer, slots: int, max_len: int, *, cuda_graph: bool, backend: str | None):
        embed = model.embed_tokens.weight
        self.device, self.dtype, self.slots, self.cuda_graph = embed.device, embed.dtype, slots, cuda_graph
        self.cache = model.new_cache(slots, max_len)
        self.state = Slots.empty(slots, self.device)
        self.logits = torch.zeros(slots, model.cfg.vocab_size, device=self.device)  # [S, V] fp32
        self.ring_pos = torch.zeros((), dtype=torch.long, device=self.device)  # steps recorded since the sync
        self.rules: dict[Hashable, tuple[Callable, StepRing]] = {}  # a rule's key -> the rule and its ring
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.captures = 0  # graphs captured so far (a reused decoder captures none)
        self.backend = backend  # what compiles the step's elementwise functions (None: eager)
        self.ops = kernels.decode_ops(backend)
        self.verified = False  # a first step ran (with the compiled functions and FlashAttention, or without)
        self.flash, self.flash_timings = _flash_decode(model, self.cache, self.dtype, self.device)
        self.pool = torch.cuda.graph_pool_handle() if cuda_graph else None
        self.fused = self.device.type == "cuda"  # one product for q/k/v and one for gate/up: it pays on a GPU
        if self.fused:
            kernels.fuse_projections(model)
        self.weights = weight_pointers(model)

    @property
    def max_len(self) -> int:
        return self.cache.max_len

    def fits(self, model: Transformer, slots: int, max_len: int, cuda_graph: bool) -> bool:
        embed = model.embed_tokens.weight
        return (slots == self.slots and max_len <= self.max_len and cuda_graph == self.cuda_graph
                and embed.device == self.device and embed.dtype == self.dtype)

    def start(self, model: Transformer, key: Hashable, build: Callable[[], Callable]) -> Callable:
        """Empties every slot for a new call; returns the rule kept under `key` (build() makes it the first time,
        and again once the model's weights have moved: graphs and rules read the weights where they were)."""
        if (self.fused and kernels.fuse_projections(model)) or weight_pointers(model) != self.weights:
            self.graphs.clear()
            self.rules.clear()
            self.weights = weight_pointers(model)
        if key not in self.rules:
            rule = build()
            self.state.declare(rule.state_fields)
            self.rules[key] = rule, StepRing.empty(SYNC_EVERY, self.slots, rule, self.device)
            self.graphs = {k: g for k, g in self.graphs.items() if k[0] != key}
        self.state.clear()
        self.ring_pos.zero_()
        return self.rules[key][0]

    def run(self, model: Transformer, key: Hashable, prompts: list[list[int]], row_keys: torch.Tensor, *,
            refill: bool = True, progress: bool = False):
        """Decodes one response per prompt with the rule `start` returned for `key`: (lengths [N], finished [N],
        steps: the rule's fields [N, T, ...]). refill=False: a waiting row is admitted only when every slot is free
        (static batches). progress: a tqdm bar on stderr for calls over 2 s."""
        rule, ring = self.rules[key]
        N, T_max, device = len(prompts), rule.max_new_tokens, self.device
        record = Record.empty(N, rule, device)
        schedule = Schedule(list(map(len, prompts)), self.slots, T_max, refill, cheap_sync=device.type == "cpu")
        bar = tqdm(total=N, desc="rollout", unit="row", leave=False, delay=2, file=sys.stderr,
                   disable=None if progress else True)  # None: no bar into a log file
        unsynced = 0  # steps since the last sync
        while True:
            live = self.state.live(T_max).tolist()  # the loop's host sync
            if unsynced:
                ring.move_to(record, unsynced)
                self.ring_pos.zero_()
                unsynced = 0
            ended = schedule.retire(live)
            if ended:
                record.end_rows(self.state, torch.tensor(ended, device=device))
                bar.update(len(ended))
            admitted = schedule.admit()
            if admitted:
                free, rows = zip(*admitted)
                prompts_in = [prompts[row] for row in rows]
                free_slots = torch.tensor(free, device=device)
                self.logits.index_copy_(0, free_slots, prefill(model, self.cache, list(free), prompts_in))
                rows = torch.tensor(rows, device=device)
                self.state.fill(free_slots, rows, row_keys[rows], torch.tensor([len(p) for p in prompts_in],
                                                                                device=device))
            if schedule.done():
                break
            for _ in range(schedule.steps_to_sync()):
                self.step(model, key, schedule.window(self.max_len))
                schedule.step += 1
                unsynced += 1
        bar.close()
        return record.result()

    def run_step(self, model: Transformer, key: Hashable, window: int | None) -> None:
        """One step as written (what a graph captures): the rule on `logits`, its record into the ring, the
        model's step on the inputs it returned, the next `logits`."""
        rule, ring = self.rules[key]
        state = self.state
        live = state.live(rule.max_new_tokens)
        inputs, record = rule(self.logits, state, live, self.backend)
        ring.write(self.ring_pos, torch.where(live, state.row, -1), state.length.clamp(max=rule.max_new_tokens - 1),
                   record)
        self.ring_pos += 1
        positions = (state.prompt_len + state.length).clamp(max=self.max_len - 1)  # where each input goes
        state.length += live
        hidden = kernels.decode_hidden(model, inputs, positions, self.cache, ops=self.ops, window=window,
                                       flash=self.flash)
        self.logits.copy_(F.linear(hidden, model.output_weight))

    def step(self, model: Transformer, key: Hashable, window: int) -> None:
        """One decode step of every slot; window: the cache slots the live rows need (unused by the
        FlashAttention kernel, which reads each row's own length)."""
        if self.verified:
            return self._step(model, key, window)
        # The first step of a decoder is where torch.compile or FlashAttention would fail (no C compiler for
        # Triton, an old GPU): then the step runs without them, slower but the same numbers up to rounding.
        saved = self._saved(key)
        while True:
            try:
                self._step(model, key, window)
                break
            except Exception as error:
                fallback = self._fall_back(error)
                if fallback is None:
                    raise
                warnings.warn(f"the decode step runs without {fallback}: its first step failed with "
                              f"{type(error).__name__}: {str(error)[:300]}", stacklevel=2)
                self._restore(key, saved)
        self.verified = True

    def _fall_back(self, error: Exception) -> str | None:
        """Turns off what may have caused `error` (torch.compile first, then FlashAttention); None: nothing."""
        self.graphs.clear()
        compile_errors = (torch._dynamo.exc.TorchDynamoException,
                          getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", torch._dynamo.exc.TorchDynamoException))
        if self.backend is not None and isinstance(error, compile_errors):
            self.backend, self.ops = None, kernels.decode_ops(None)
            return "torch.compile"
        if self.flash is not None and isinstance(error, RuntimeError):
            self.flash = None
            return "FlashAttention (each step attends over a power-of-two window of the cache instead)"
        return None

    def _step(self, model: Transformer, key: Hashable, window: int) -> None:
        window = None if self.flash is not None else window
        if not self.cuda_graph:
            return self.run_step(model, key, window)
        if (key, window) not in self.graphs:
            self.graphs[key, window] = self._capture(model, key, window)
        self.graphs[key, window].replay()

    def _changed_by_a_step(self, key: Hashable) -> list[torch.Tensor]:
        """What a step changes but the cache (rewritten at a slot before any row reads it): the slots' state, the
        logits, the ring and its counter (two warm-up steps from the ring's last entry wrap round to its first,
        which holds a step not yet moved to the call's record)."""
        ring = self.rules[key][1]
        return [*self.state.tensors(), self.logits, self.ring_pos, ring.rows, ring.steps, *ring.fields.values()]

    def _saved(self, key: Hashable) -> list[torch.Tensor]:
        return [t.clone() for t in self._changed_by_a_step(key)]

    def _restore(self, key: Hashable, saved: list[torch.Tensor]) -> None:
        for target, value in zip(self._changed_by_a_step(key), saved):
            target.copy_(value)

    def _capture(self, model: Transformer, key: Hashable, window: int | None) -> torch.cuda.CUDAGraph:
        # Two warm-up steps on a side stream first (torch.compile compiles, cuBLAS and attention choose and
        # allocate their workspaces outside the capture), then everything they changed is put back, so that the
        # replay right after is the step itself. Cache slots they wrote are rewritten before any row reads them.
        saved = self._saved(key)
        with torch.cuda.device(self.device):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self.run_step(model, key, window)
            torch.cuda.current_stream().wait_stream(stream)
            self._restore(key, saved)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.run_step(model, key, window)
        self.captures += 1
        return graph


_DECODERS: "weakref.WeakKeyDictionary[Transformer, Decoder]" = weakref.WeakKeyDictionary()
_FLASH_LAYOUTS: dict[tuple, tuple[bool, dict]] = {}  # a decoder's shape -> (grouped is faster, its timings)


def _flash_decode(model: Transformer, cache: KVCache, dtype, device) -> tuple[kernels.FlashDecode | None, dict]:
    """(how FlashAttention's kernel runs a step's attention, its two layouts' milliseconds here), where it can;
    (None, {}) elsewhere. The faster layout is measured once per process and shape, then kept."""
    cfg = model.cfg
    if not kernels.flash_decode_supported(cfg, dtype, device):
        return None, {}
    try:
        slots, max_len = cache.k.shape[1], cache.max_len
        shape = (slots, max_len, dtype, str(device), cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        if shape not in _FLASH_LAYOUTS:
            _FLASH_LAYOUTS[shape] = kernels.fastest_flash_layout(cfg, cache)
        grouped, timings = _FLASH_LAYOUTS[shape]
        return kernels.flash_decode(slots, max_len, cfg.num_heads // cfg.num_kv_heads, grouped, device), timings
    except RuntimeError as error:  # an old GPU, a build without the kernel: the windowed attention
        warnings.warn(f"the decode step runs without FlashAttention ({str(error)[:200]})", stacklevel=4)
        return None, {}


def weight_pointers(model: Transformer) -> tuple[int, ...]:
    return tuple(p.data_ptr() for p in model.parameters())


def compile_backend(device: torch.device) -> str | None:
    """The backend that compiles the decode step's elementwise functions: inductor on a GPU (fused kernels);
    on a CPU none (compiling costs more than it saves there, and the eager functions are the reference)."""
    return "inductor" if device.type == "cuda" else None


def decoder_for(model: Transformer, slots: int, max_len: int, cuda_graph: bool) -> Decoder:
    """The model's Decoder, kept from an earlier call when it fits, else a new one (the old one freed first)."""
    decoder = _DECODERS.get(model)
    if decoder is not None and decoder.fits(model, slots, max_len, cuda_graph):
        return decoder
    release_decoder(model)
    # A little room to spare, so that a slightly longer prompt next call reuses the cache and its graphs.
    max_len = -(-max_len // CACHE_ROUND) * CACHE_ROUND
    device = model.embed_tokens.weight.device
    decoder = Decoder(model, slots, max_len, cuda_graph=cuda_graph, backend=compile_backend(device))
    _DECODERS[model] = decoder
    return decoder


def release_decoder(model: Transformer) -> None:
    """Frees the KV cache, buffers and graphs that decoding keeps for `model` (the next call makes new ones)."""
    if _DECODERS.pop(model, None) is not None and model.embed_tokens.weight.device.type == "cuda":
        torch.cuda.empty_cache()


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
