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
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from tqdm import tqdm

from model import KVCache
from ngrpo import length_mask, mixed_embeddings

STRATEGIES = ("none", "neighbor", "soft", "gaussian")
# The row-aligned tensors of a Rollout, [B] or [B, T, ...].
ROW_TENSORS = ("response_ids", "lengths", "finished", "logprobs", "cand_ids", "cand_weights", "mixed")


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
        if self.strategy not in STRATEGIES:
            raise ValueError(f"exploration strategy must be one of {', '.join(STRATEGIES)}, not {self.strategy!r}")
        if self.weights not in ("code", "renorm"):
            raise ValueError(f"mixing weights must be 'code' or 'renorm', not {self.weights!r}")
        if not 0.0 <= self.mix_rate <= 1.0 or self.num_neighbors < 1 or self.top_k < 1 or self.noise_sigma < 0:
            raise ValueError("exploration needs 0 <= mix_rate <= 1, num_neighbors >= 1, top_k >= 1, noise_sigma >= 0")

    @property
    def num_candidates(self) -> int:
        return {"none": 1, "neighbor": 1 + self.num_neighbors}.get(self.strategy, self.top_k)


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
    logits: torch.Tensor | None = None  # [B, T, V] fp32 raw logits of each step, when asked for (tests)

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

    @staticmethod
    def concat(rollouts: list["Rollout"], pad_id: int) -> "Rollout":
        """Several rollouts as one, rows in order; responses right-padded to the longest (pad_id, weight 0)."""
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
                          for name in ROW_TENSORS})

    def responses(self) -> list[list[int]]:
        return [ids[:n].tolist() for ids, n in zip(self.response_ids, self.lengths.tolist())]


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


@torch.no_grad()
@torch.autocast("cuda", enabled=False)  # the model's own dtype throughout, inside the CUDA graph too
def generate(model, prompts: list[list[int]], sampling: Sampling, exploration: Exploration = Exploration(), *,
             neighbor_table: torch.Tensor | None = None, generator: torch.Generator | None = None,
             check_every: int = 8, keep_logits: bool = False, cuda_graph: bool | None = None,
             prefill_tokens: int = 16384, progress: bool = False) -> Rollout:
    """Sample one response per prompt (prompts of any lengths, left-padded into one batch).

    The model runs in its own dtype (autocast is off inside; on GPU pass a bf16 model). cuda_graph: replay
    the decode step from a CUDA graph (DecodeStep); None = whenever the model is on a CUDA device.
    prefill_tokens: prompt tokens (rows x the longest prompt) per prefill forward. progress: a tqdm bar on
    stderr (decoded steps, finished rows) for rollouts that last more than 2 s."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate needs at least one prompt and no empty prompt")
    if exploration.strategy == "neighbor" and (neighbor_table is None or
                                               neighbor_table.shape[1] < exploration.num_neighbors):
        raise ValueError(f"the neighbor strategy needs a neighbor_table with at least {exploration.num_neighbors} "
                         "columns (neighbors.build_neighbor_table)")
    embed = model.embed_tokens.weight  # [V, d]: mixtures are always of input embeddings
    device = embed.device
    if cuda_graph and device.type != "cuda":
        raise ValueError(f"cuda_graph=True needs a model on a CUDA device; this one is on {device}")
    B, T_max, K = len(prompts), sampling.max_new_tokens, exploration.num_candidates
    prompt_ids, prompt_mask = _left_pad(prompts, sampling.pad_id, device)
    P = prompt_ids.shape[1]
    prompt_lens = prompt_mask.sum(-1)  # [B]
    stop_ids = torch.tensor(sampling.stop_ids or [-1], device=device)
    greedy = sampling.temperature == 0
    tau = 1.0 if greedy else sampling.temperature
    explore = exploration.strategy

    cache = model.new_cache(B, P + T_max)
    key_mask = torch.cat([prompt_mask, torch.ones(B, T_max, dtype=torch.bool, device=device)], dim=1)
    # Prefill in row chunks of ~prefill_tokens prompt tokens: bounds the [rows, 1, P, P] mask and the MLP
    # activations when prompts are long (4k-token prompts x 256 rows would need tens of GB at once).
    rows = max(1, prefill_tokens // P)
    last_hidden = [model.forward_hidden(prompt_ids[r : r + rows], attention_mask=prompt_mask[r : r + rows],
                                        cache=KVCache(cache.k[:, r : r + rows], cache.v[:, r : r + rows]),
                                        cache_pos=0)[:, -1] for r in range(0, B, rows)]
    logits = F.linear(torch.cat(last_hidden), model.output_weight).float()  # [B, V]: only the last position

    response_ids = torch.full((B, T_max), sampling.pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros(B, T_max, device=device)
    cand_ids_out = torch.zeros(B, T_max, K, dtype=torch.long, device=device)
    cand_weights_out = torch.zeros(B, T_max, K, device=device)
    mixed_out = torch.zeros(B, T_max, dtype=torch.bool, device=device)
    logits_out = torch.zeros(B, T_max, logits.shape[-1], device=device) if keep_logits else None
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    mixing_on = torch.ones(B, dtype=torch.bool, device=device)  # False once a row sampled stop_mixing_id
    lengths = torch.zeros(B, dtype=torch.long, device=device)
    unit = torch.zeros(B, K, device=device)
    unit[:, 0] = 1.0  # the weights of a step that feeds its sampled token
    cand_table = None if neighbor_table is None else candidate_table(neighbor_table, exploration.num_neighbors)
    # The Bernoulli(mix_rate) coin of every (step, row), drawn up front: one kernel instead of two per step.
    coins = torch.rand(T_max, B, device=device, generator=generator) < exploration.mix_rate  # [T_max, B]
    step = DecodeStep(model, cache, key_mask, prompt_lens, P,
                      cuda_graph=device.type == "cuda" if cuda_graph is None else cuda_graph)
    # Shown only when a rollout takes more than 2 s (long responses), and only when asked for.
    bar = tqdm(total=T_max, desc="rollout", unit="tok", leave=False, delay=2, file=sys.stderr, disable=not progress)

    for t in range(T_max):
        if keep_logits:
            logits_out[:, t] = logits
        scores = filtered_logits(logits, tau, sampling.top_k, sampling.top_p)  # [B, V]
        probs = scores.softmax(-1)
        if greedy:
            token = probs.argmax(-1)
        else:  # argmax(p / q) with q ~ Exp(1) = -log U is an exact draw from p, with no host sync
            token = (probs / torch.rand(probs.shape, device=device, generator=generator).log_().neg_()).argmax(-1)
        active = ~finished
        token = torch.where(active, token, sampling.pad_id)
        response_ids[:, t] = token
        # log of the sampled token's probability: one gather instead of a log_softmax over the vocabulary.
        # In fp32 it differs from log_softmax by ~1e-7; a token is never drawn at p < 1e-38 where log(p)
        # would underflow.
        logprobs[:, t] = torch.where(active, probs.gather(-1, token[:, None])[:, 0].log(), 0.0)
        lengths += active
        finished |= active & torch.isin(token, stop_ids)
        if exploration.stop_mixing_id is not None:  # the step that samples it is not mixed either
            mixing_on &= token != exploration.stop_mixing_id

        if explore == "none":
            cand_ids, cand_weights = token[:, None], unit
        else:
            if explore == "neighbor":
                ids, weights = neighbor_candidates(probs, cand_table, temperature=tau, weights=exploration.weights)
                mix = coins[t] & active & mixing_on
            else:
                ids, weights = soft_candidates(probs, exploration.top_k, exploration.mix_temperature)
                mix = active & mixing_on
                if explore == "gaussian":
                    mix &= coins[t]
            # An unmixed step records [y, y, ...] with weights [1, 0, ...]: it feeds exactly E[y].
            cand_ids = torch.where(mix[:, None], ids, token[:, None])
            cand_weights = torch.where(mix[:, None], weights, unit)
            mixed_out[:, t] = mix
        cand_ids_out[:, t], cand_weights_out[:, t] = cand_ids, cand_weights

        if t == T_max - 1:
            break
        if (t + 1) % check_every == 0:
            done = int(finished.sum())  # the loop's one host sync, every check_every steps
            bar.update(check_every)
            bar.set_postfix_str(f"{done}/{B} rows finished", refresh=False)
            if done == B:
                break
        inputs = mixed_embeddings(embed, cand_ids, cand_weights)  # [B, d]
        if explore == "gaussian":
            rms = inputs.float().pow(2).mean(-1, keepdim=True).sqrt()
            noise = torch.randn(inputs.shape, device=device, generator=generator) * exploration.noise_sigma * rms
            inputs = torch.where(mix[:, None], inputs.float() + noise, inputs.float()).to(inputs.dtype)
        logits = step(inputs[:, None], P + t)

    bar.close()
    T = int(lengths.max())  # trim to the longest response
    return Rollout(
        prompts=[list(p) for p in prompts], response_ids=response_ids[:, :T], lengths=lengths, finished=finished,
        logprobs=logprobs[:, :T], cand_ids=cand_ids_out[:, :T], cand_weights=cand_weights_out[:, :T],
        mixed=mixed_out[:, :T], logits=logits_out[:, :T] if keep_logits else None,
    )


def exploration_from_config(cfg, tokenizer) -> Exploration:
    """The Exploration a Config's flags describe (train.py and eval.py alike), with `stop_mixing_token`
    looked up in the tokenizer: a token it does not have is an error, not a silent never-stop."""
    stop_mixing_id = None
    if cfg.stop_mixing_token and cfg.explore != "none":
        stop_mixing_id = tokenizer.convert_tokens_to_ids(cfg.stop_mixing_token)
        if not isinstance(stop_mixing_id, int) or stop_mixing_id < 0 or stop_mixing_id == tokenizer.unk_token_id:
            raise ValueError(f"--stop-mixing-token {cfg.stop_mixing_token!r} is not one token of the tokenizer "
                             "(pass --stop-mixing-token '' to mix until the end of the response)")
    return Exploration(cfg.explore, mix_rate=cfg.mix_rate, num_neighbors=cfg.num_neighbors, weights=cfg.mix_weights,
                       top_k=cfg.soft_top_k, mix_temperature=cfg.mix_temperature, noise_sigma=cfg.noise_sigma,
                       stop_mixing_id=stop_mixing_id)
