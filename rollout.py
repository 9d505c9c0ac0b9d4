"""The KV-cached batched sampler and the exploration strategies of N-GRPO and its baselines.

One decode step, for every row at once (DESIGN.md §3 steps 1-5):

    p   = softmax(filter(logits / tau))           y ~ p is the action: recorded, rewarded, trained on
    m   = Bernoulli(mix_rate), until </think>     (`soft`: every thinking step)
    C   = [argmax p] + its table neighbors         (`soft` / `gaussian`: the top-K tokens of p)
    w   = softmax(p(C) / tau)  or  p(C) / sum p(C)
    e   = sum_c w_c E[c] if m else E[y]           (`gaussian`: + N(0, (sigma * rms)^2) at mixed steps)

and e is the next input. Every step records (C, w), or ([y], [1]) when not mixed, so that training can
replay exactly the inputs the sampler fed. Per-row state (finished, mixing stopped) lives in tensors and
the loop syncs with the host only every `check_every` steps to see whether every row has finished.

    rollout = generate(model, prompts, Sampling(max_new_tokens=512, stop_ids=(eos,)),
                       Exploration("neighbor", mix_rate=0.1, stop_mixing_id=think_end),
                       neighbor_table=table, generator=torch.Generator("cuda").manual_seed(0))
"""

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from tqdm import tqdm

from draws import COIN, NOISE, TOKEN, RowDraws
from model import KVCache
from ngrpo import length_mask, mixed_embeddings

@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # 0 = greedy (log-probs then at temperature 1)
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 256
    stop_ids: tuple[int, ...] = ()  # a row finishes when it samples one of these (end-of-sentence, ...)
    pad_id: int = 0  # fills prompts on the left and responses after they finish


@dataclass(frozen=True)
class Exploration:
    strategy: str = "none"  # none | neighbor (N-GRPO) | soft (Soft Thinking) | gaussian (STHT-style)
    mix_rate: float = 0.1  # neighbor / gaussian: P(a step is mixed); soft mixes every thinking step
    num_neighbors: int = 1  # neighbor: candidates = anchor + this many table neighbors
    weights: str = "code"  # neighbor: code = softmax(p(C) / tau); renorm = p(C) / sum p(C)
    top_k: int = 10  # soft / gaussian: candidates = the top-k tokens of p
    mix_temperature: float = 0.0  # soft / gaussian: weights p(C)^(1/t) renormalised; 0 = t of 1
    noise_sigma: float = 0.33  # gaussian: noise std as a fraction of the mixture's RMS
    stop_mixing_id: int | None = None  # no mixing at or after the step that samples this id (</think>)

    def __post_init__(self):
        if self.strategy not in EXPLORERS:
            raise ValueError(f"exploration strategy must be one of {', '.join(EXPLORERS)}, "
                             f"not {self.strategy!r}")
        if self.weights not in ("code", "renorm"):
            raise ValueError(f"mixing weights must be 'code' or 'renorm', not {self.weights!r}")
        if not 0.0 <= self.mix_rate <= 1.0 or self.num_neighbors < 1 or self.top_k < 1 or self.noise_sigma < 0:
            raise ValueError("exploration needs 0 <= mix_rate <= 1, num_neighbors >= 1, top_k >= 1, noise_sigma >= 0")

    @property
    def num_candidates(self) -> int:
        return {"none": 1, "neighbor": 1 + self.num_neighbors}.get(self.strategy, self.top_k)


ROW_TENSORS = ("response_ids", "lengths", "finished", "logprobs", "cand_ids", "cand_weights", "mixed")


@dataclass
class Rollout:
    """What a batch of generations returns, row-aligned with the prompts. T = longest response.

    response_ids [B, T] (pad_id after the end), lengths [B] (stop token included), finished [B] (ended by
    a stop id; False = truncated at max_new_tokens), logprobs [B, T] (sampling log-prob of each sampled
    token at the sampling temperature, after filtering), and the replay record: cand_ids / cand_weights
    [B, T, K] (the fed input was sum_k w_k E[id_k]; an unmixed step holds [y, y, ...] and [1, 0, ...])
    and mixed [B, T] (the step fed a mixture)."""

    prompts: list[list[int]]
    response_ids: torch.Tensor
    lengths: torch.Tensor
    finished: torch.Tensor
    logprobs: torch.Tensor
    cand_ids: torch.Tensor
    cand_weights: torch.Tensor
    mixed: torch.Tensor

    def response_mask(self) -> torch.Tensor:
        """[B, T] bool: True at the positions of each row's response (stop token included)."""
        return length_mask(self.lengths, self.response_ids.shape[1])

    def responses(self) -> list[list[int]]:
        return [ids[:n].tolist() for ids, n in zip(self.response_ids, self.lengths.tolist())]

    @staticmethod
    def concat(rollouts: list["Rollout"], pad_id: int) -> "Rollout":
        """The rows of several rollouts as one, in order; responses right-padded to the longest (pad_id in
        response_ids and cand_ids, weight 0, log-prob 0, not mixed)."""
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

    def select(self, index: list[int]) -> "Rollout":
        """The rows `index` (in that order, repeats allowed) as a rollout of their own."""
        rows = torch.tensor(index, dtype=torch.long, device=self.lengths.device)
        return replace(self, prompts=[self.prompts[i] for i in index],
                       **{name: getattr(self, name)[rows] for name in ROW_TENSORS})


def filtered_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
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


def candidate_table(table: torch.Tensor, num_neighbors: int) -> torch.Tensor:
    """[V, 1 + num_neighbors]: row v holds v itself, then its first num_neighbors table neighbors, so one
    gather at the anchor gives the whole candidate list."""
    own = torch.arange(table.shape[0], device=table.device)[:, None]
    return torch.cat([own, table[:, :num_neighbors]], dim=-1)


def neighbor_candidates(probs: torch.Tensor, cand_table: torch.Tensor, *, temperature: float,
                        weights: str = "code") -> tuple[torch.Tensor, torch.Tensor]:
    """From the sampling distribution p [B, V]: candidates [anchor = argmax p, its neighbors] [B, K] and
    their weights [B, K] (DESIGN.md §3 steps 3-4). cand_table comes from candidate_table()."""
    cand_ids = cand_table[probs.argmax(-1)]  # [B, K]
    cand_probs = probs.gather(-1, cand_ids)
    if weights == "code":
        # The released code divides the already-softmaxed probabilities by tau and softmaxes again:
        # at tau = 1 a neighbor the model gives ~0 still gets ~27-43% of the mixture.
        return cand_ids, (cand_probs / temperature if temperature != 1.0 else cand_probs).softmax(-1)
    return cand_ids, cand_probs / cand_probs.sum(-1, keepdim=True)


def mixing_candidates(logits: torch.Tensor, table: torch.Tensor, *, num_neighbors: int, temperature: float,
                      top_p: float = 1.0, top_k: int = 0, weights: str = "code") -> tuple[torch.Tensor, torch.Tensor]:
    """The N-GRPO candidates of one decode step from raw logits [B, V]: (cand_ids [B, K], cand_weights [B, K]),
    K = 1 + num_neighbors, anchor (the greedy token) first, weights summing to 1."""
    probs = filtered_logits(logits, temperature, top_k, top_p).softmax(-1)
    return neighbor_candidates(probs, candidate_table(table, num_neighbors), temperature=temperature, weights=weights)


def soft_candidates(probs: torch.Tensor, top_k: int, mix_temperature: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft Thinking's mixture: the top-k tokens of p with p renormalised over them (or p^(1/t) renormalised)."""
    cand_probs, cand_ids = probs.topk(top_k, dim=-1)  # [B, K]
    if mix_temperature > 0:
        cand_probs = cand_probs.clamp_min(1e-30) ** (1.0 / mix_temperature)
    return cand_ids, cand_probs / cand_probs.sum(-1, keepdim=True)


# ----------------------------------------------------------------------------- exploration strategies
#
# A strategy is one function of the step (`StepView`) returning the step's record and the next input
# (`Mixture`). To add one: write explore_NAME below, register it in EXPLORERS, give Exploration the knobs
# it reads (and num_candidates its K). The decode loop does not change.


@dataclass
class StepView:
    """What an exploration strategy sees at one decode step, for the B rows at once."""

    exploration: Exploration
    probs: torch.Tensor  # [B, V] the sampling distribution (temperature, top-k / top-p applied)
    token: torch.Tensor  # [B] the sampled action y
    eligible: torch.Tensor  # [B] bool: live rows that have not yet sampled stop_mixing_id
    coin: torch.Tensor  # [B] uniform in (0, 1): the step's mixing coin is coin < mix_rate
    temperature: float
    embed: torch.Tensor  # [V, d] the input embedding E
    cand_table: torch.Tensor | None  # [V, 1 + num_neighbors] (candidate_table), neighbor strategy only
    draws: RowDraws  # this step's per-row random numbers; a strategy takes its own stream (draws.py)


@dataclass
class Mixture:
    """A step's record and what it feeds: the input is sum_k w_k E[id_k] (+ noise, for noisy strategies)."""

    cand_ids: torch.Tensor  # [B, K]
    cand_weights: torch.Tensor  # [B, K]
    mixed: torch.Tensor  # [B] bool
    inputs: torch.Tensor  # [B, d] in the embedding's dtype


def mix_where(view: StepView, cand_ids: torch.Tensor, cand_weights: torch.Tensor, mix: torch.Tensor) -> Mixture:
    """Rows where `mix` feed the candidates' mixture; the others feed their sampled token, recorded as
    [y, y, ...] with weights [1, 0, ...] (exactly E[y])."""
    unit = torch.zeros_like(cand_weights)
    unit[:, 0] = 1.0
    cand_ids = torch.where(mix[:, None], cand_ids, view.token[:, None])  # [B, K]
    cand_weights = torch.where(mix[:, None], cand_weights, unit)
    return Mixture(cand_ids, cand_weights, mix, mixed_embeddings(view.embed, cand_ids, cand_weights))


def explore_none(view: StepView) -> Mixture:
    """Plain GRPO: feed the sampled token."""
    token = view.token[:, None]  # [B, 1]
    return Mixture(token, torch.ones(token.shape, device=token.device), torch.zeros_like(view.eligible),
                   view.embed[view.token])


def explore_neighbor(view: StepView) -> Mixture:
    """N-GRPO: at a step whose coin lands (rate mix_rate), the anchor argmax p and its table neighbors."""
    x = view.exploration
    cand_ids, cand_weights = neighbor_candidates(view.probs, view.cand_table, temperature=view.temperature,
                                                 weights=x.weights)
    return mix_where(view, cand_ids, cand_weights, view.eligible & (view.coin < x.mix_rate))


def explore_soft(view: StepView) -> Mixture:
    """Soft Thinking: every thinking step feeds the top-k mixture of p."""
    x = view.exploration
    return mix_where(view, *soft_candidates(view.probs, x.top_k, x.mix_temperature), view.eligible)


def explore_gaussian(view: StepView) -> Mixture:
    """STHT-style: at a step whose coin lands, the top-k mixture plus N(0, (sigma * rms)^2) noise. The
    record holds the noise-free mixture, which is what training replays (as the released code does)."""
    x = view.exploration
    clean = mix_where(view, *soft_candidates(view.probs, x.top_k, x.mix_temperature),
                      view.eligible & (view.coin < x.mix_rate))
    inputs = clean.inputs.float()  # [B, d]
    rms = inputs.pow(2).mean(-1, keepdim=True).sqrt()
    noisy = inputs + view.draws.normal(NOISE, inputs.shape[1]) * x.noise_sigma * rms
    clean.inputs = torch.where(clean.mixed[:, None], noisy, inputs).to(clean.inputs.dtype)
    return clean


EXPLORERS: dict[str, Callable[[StepView], Mixture]] = {
    "none": explore_none, "neighbor": explore_neighbor, "soft": explore_soft, "gaussian": explore_gaussian,
}
STRATEGIES = tuple(EXPLORERS)


# ----------------------------------------------------------------------------- the decode loop


class DecodeStep:
    """The model's one-token decode step as a function of fixed buffers, so that on CUDA it is captured once
    into a CUDA graph and each step is a single replay instead of ~20 kernel launches per layer.

    Buffers: inputs [B, 1, d] (the embedding or mixture fed) and cache_pos [] (the cache slot written),
    overwritten in place before every step; each row's RoPE position follows from the slot (its prompt
    length + the slot's offset past the left-padded prompt width P). The attention mask is the whole
    [B, max_len] key mask, so that shapes never change: slots not yet written are hidden by the causal
    part of the mask (a key slot must not exceed cache_pos). Returns fp32 logits [B, V]; with a
    graph they live in a static buffer that the next step overwrites, so use them before calling again.
    Sampling stays outside the graph: it draws from the caller's torch.Generator, eagerly.
    """

    def __init__(self, model, cache, key_mask: torch.Tensor, prompt_lens: torch.Tensor, prompt_width: int, *,
                 cuda_graph: bool):
        embed = model.embed_tokens.weight
        B, d = key_mask.shape[0], embed.shape[1]
        self.model, self.cache, self.key_mask = model, cache, key_mask
        self.prompt_lens, self.prompt_width = prompt_lens[:, None], prompt_width
        self.inputs = torch.zeros(B, 1, d, dtype=embed.dtype, device=embed.device)
        self.cache_pos = torch.full((), self.prompt_width, dtype=torch.long, device=embed.device)
        self.graph, self.logits = None, None
        if cuda_graph:
            self._capture()

    def _forward(self) -> torch.Tensor:
        positions = self.prompt_lens + (self.cache_pos - self.prompt_width)  # [B, 1]
        hidden = self.model.forward_hidden(inputs_embeds=self.inputs, positions=positions,
                                           attention_mask=self.key_mask, cache=self.cache, cache_pos=self.cache_pos)
        return F.linear(hidden[:, 0], self.model.output_weight).float()  # [B, V]

    def _capture(self) -> None:
        # Warm-up runs on a side stream first (cuBLAS and attention pick and allocate their workspaces
        # outside the capture). They write the cache at slot P, the first decode slot, which the first real
        # step overwrites before anything reads it.
        with torch.cuda.device(self.inputs.device):  # the model's GPU, whichever is current
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._forward()
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = self._forward()

    def __call__(self, inputs: torch.Tensor, cache_pos: int) -> torch.Tensor:
        self.inputs.copy_(inputs)
        self.cache_pos.fill_(cache_pos)
        if self.graph is None:
            return self._forward()
        self.graph.replay()
        return self.logits


def _left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), P), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        ids[row, P - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[row, P - len(prompt):] = True
    return ids.to(device), mask.to(device)


def _prefill(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, cache: KVCache,
             prefill_tokens: int) -> torch.Tensor:
    """Write the left-padded prompts [B, P] into the cache; fp32 logits [B, V] of their last position.
    Row chunks of ~prefill_tokens prompt tokens bound the [rows, 1, P, P] mask and the MLP activations
    (4k-token prompts x 256 rows would need tens of GB at once)."""
    rows = max(1, prefill_tokens // prompt_ids.shape[1])
    last_hidden = [model.forward_hidden(prompt_ids[r : r + rows], attention_mask=prompt_mask[r : r + rows],
                                        cache=KVCache(cache.k[:, r : r + rows], cache.v[:, r : r + rows]),
                                        cache_pos=0)[:, -1] for r in range(0, prompt_ids.shape[0], rows)]
    return F.linear(torch.cat(last_hidden), model.output_weight).float()  # [B, V]: only the last position


def sample_tokens(probs: torch.Tensor, uniforms: torch.Tensor | None) -> torch.Tensor:
    """One token per row from p [B, V]: argmax p (greedy) when uniforms is None, else argmax(p / q) with
    q = -log U ~ Exp(1), U [B, V] in (0, 1): an exact draw from p (the exponential race) with no host sync."""
    if uniforms is None:
        return probs.argmax(-1)
    return (probs / uniforms.log().neg()).argmax(-1)


@dataclass
class Record:
    """The [B, T_max, ...] buffers the loop writes one step at a time; `rollout` trims them."""

    response_ids: torch.Tensor
    logprobs: torch.Tensor
    cand_ids: torch.Tensor
    cand_weights: torch.Tensor
    mixed: torch.Tensor

    @classmethod
    def empty(cls, B: int, T_max: int, K: int, pad_id: int, device) -> "Record":
        return cls(torch.full((B, T_max), pad_id, dtype=torch.long, device=device),
                   torch.zeros(B, T_max, device=device), torch.zeros(B, T_max, K, dtype=torch.long, device=device),
                   torch.zeros(B, T_max, K, device=device), torch.zeros(B, T_max, dtype=torch.bool, device=device))

    def write(self, t: int, token: torch.Tensor, logprob: torch.Tensor, mixture: Mixture) -> None:
        self.response_ids[:, t], self.logprobs[:, t] = token, logprob
        self.cand_ids[:, t], self.cand_weights[:, t], self.mixed[:, t] = (mixture.cand_ids, mixture.cand_weights,
                                                                         mixture.mixed)

    def rollout(self, prompts: list[list[int]], lengths: torch.Tensor, finished: torch.Tensor) -> Rollout:
        T = int(lengths.max())  # trim to the longest response
        return Rollout(prompts=[list(p) for p in prompts], response_ids=self.response_ids[:, :T], lengths=lengths,
                       finished=finished, logprobs=self.logprobs[:, :T], cand_ids=self.cand_ids[:, :T],
                       cand_weights=self.cand_weights[:, :T], mixed=self.mixed[:, :T])


SYNC_EVERY = 8  # decode steps between the loop's host syncs (to see whether every row has finished)


@torch.no_grad()
@torch.autocast("cuda", enabled=False)  # the model's own dtype throughout, inside the CUDA graph too
def generate(model, prompts: list[list[int]], sampling: Sampling, exploration: Exploration = Exploration(), *,
             neighbor_table: torch.Tensor | None = None, seed: int | tuple[int, ...] = 0,
             row_keys: Sequence[int] | None = None, cuda_graph: bool | None = None, prefill_tokens: int = 16384,
             progress: bool = False) -> Rollout:
    """Sample one response per prompt (prompts of any lengths, left-padded into one batch).

    Randomness: row i's response is a function of (seed, row_keys[i], the model) alone: every draw (the
    token, the mixing coin, the noise) hashes them with the row's response position (draws.py), so it
    does not depend on the batch, the slot or the order. row_keys: distinct ints, default 0..len-1
    (callers pass e.g. a row's index among a training step's rows, or problem * n + sample).

    The model runs in its own dtype (autocast is off inside; on GPU pass a bf16 model). cuda_graph: replay
    the decode step from a CUDA graph (DecodeStep); None = whenever the model is on a CUDA device.
    prefill_tokens: prompt tokens (rows x the longest prompt) per prefill forward. progress: a tqdm bar on
    stderr (decoded steps, finished rows) for rollouts that last more than 2 s."""
    _check_arguments(model, prompts, exploration, neighbor_table, cuda_graph)
    row_keys = range(len(prompts)) if row_keys is None else row_keys
    if len(row_keys) != len(prompts) or len(set(row_keys)) != len(prompts):
        raise ValueError(f"row_keys must be {len(prompts)} distinct ints, one per prompt")
    embed = model.embed_tokens.weight  # [V, d]: mixtures are always of input embeddings
    device = embed.device
    B, T_max, K = len(prompts), sampling.max_new_tokens, exploration.num_candidates
    prompt_ids, prompt_mask = _left_pad(prompts, sampling.pad_id, device)
    P = prompt_ids.shape[1]
    stop_ids = torch.tensor(sampling.stop_ids or [-1], device=device)
    greedy = sampling.temperature == 0
    tau = 1.0 if greedy else sampling.temperature
    explore = EXPLORERS[exploration.strategy]
    cand_table = None if neighbor_table is None else candidate_table(neighbor_table, exploration.num_neighbors)

    cache = model.new_cache(B, P + T_max)
    key_mask = torch.cat([prompt_mask, torch.ones(B, T_max, dtype=torch.bool, device=device)], dim=1)
    logits = _prefill(model, prompt_ids, prompt_mask, cache, prefill_tokens)  # [B, V]
    record = Record.empty(B, T_max, K, sampling.pad_id, device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    mixing_on = torch.ones(B, dtype=torch.bool, device=device)  # False once a row sampled stop_mixing_id
    lengths = torch.zeros(B, dtype=torch.long, device=device)
    keys = torch.tensor(list(row_keys), dtype=torch.long, device=device)  # [B]
    step = DecodeStep(model, cache, key_mask, prompt_mask.sum(-1), P,
                      cuda_graph=device.type == "cuda" if cuda_graph is None else cuda_graph)
    bar = tqdm(total=T_max, desc="rollout", unit="tok", leave=False, delay=2, file=sys.stderr, disable=not progress)

    for t in range(T_max):
        probs = filtered_logits(logits, tau, sampling.top_k, sampling.top_p).softmax(-1)  # [B, V]
        draws = RowDraws(seed, keys, lengths.clone())  # a live row's response position: its length so far
        uniforms = None if greedy else draws.uniform(TOKEN, probs.shape[1])
        active = ~finished
        token = torch.where(active, sample_tokens(probs, uniforms), sampling.pad_id)  # [B]
        # log of the sampled token's probability: one gather instead of a log_softmax over the vocabulary.
        # In fp32 it differs from log_softmax by ~1e-7; a token is never drawn at p < 1e-38 where log(p)
        # would underflow.
        logprob = torch.where(active, probs.gather(-1, token[:, None])[:, 0].log(), 0.0)
        lengths += active
        finished |= active & torch.isin(token, stop_ids)
        if exploration.stop_mixing_id is not None:  # the step that samples it is not mixed either
            mixing_on &= token != exploration.stop_mixing_id
        mixture = explore(StepView(exploration, probs, token, active & mixing_on, draws.uniform(COIN, 1)[:, 0],
                                   tau, embed, cand_table, draws))
        record.write(t, token, logprob, mixture)
        if t == T_max - 1:
            break
        if (t + 1) % SYNC_EVERY == 0:
            done = int(finished.sum())  # the loop's one host sync, every SYNC_EVERY steps
            bar.update(SYNC_EVERY)
            bar.set_postfix_str(f"{done}/{B} rows finished", refresh=False)
            if done == B:
                break
        logits = step(mixture.inputs[:, None], P + t)
    bar.close()
    return record.rollout(prompts, lengths, finished)


def _check_arguments(model, prompts, exploration: Exploration, neighbor_table, cuda_graph) -> None:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate needs at least one prompt and no empty prompt")
    if exploration.strategy == "neighbor" and (neighbor_table is None or
                                               neighbor_table.shape[1] < exploration.num_neighbors):
        raise ValueError(f"the neighbor strategy needs a neighbor_table with at least {exploration.num_neighbors} "
                         "columns (neighbors.build_neighbor_table)")
    device = model.embed_tokens.weight.device
    if cuda_graph and device.type != "cuda":
        raise ValueError(f"cuda_graph=True needs a model on a CUDA device; this one is on {device}")
