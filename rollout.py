"""The KV-cached sampler with continuous refill, and the exploration strategies of N-GRPO and its baselines.

One decode step, for every live row at once (DESIGN.md §3 steps 1-5):

    p   = softmax(filter(logits / tau))           y ~ p is the action: recorded, rewarded, trained on
    m   = Bernoulli(mix_rate), until </think>     (`soft`: every thinking step; or an entropy threshold)
    C   = [argmax p] + its table neighbors         (`soft` / `gaussian`: the top-K tokens of p)
    w   = softmax(p(C) / tau)  or  p(C) / sum p(C)
    e   = sum_c w_c E[c] if m else E[y]           (`gaussian`: + N(0, (sigma * rms)^2) at mixed steps)

and e is the next input (`--mix-feed replay-only`: E[y], the mixture only recorded). Every step records
(C, w), or ([y], [1]) when not mixed, so that training can replay exactly the inputs the sampler fed. Each
strategy is one function (EXPLORERS), the release's others (`topk`, `topk-gumbel`, `gaussian_embed_noise`,
`orthogonal_noise`) included.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from tqdm import tqdm

from draws import COIN, GUMBEL, NOISE, TOKEN, RowDraws, normal_from_keys
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
    strategy: str = "none"  # a key of EXPLORERS: none, neighbor (N-GRPO), soft, gaussian, the release's own
    mix_rate: float = 0.1  # P(a step is mixed); soft mixes every thinking step
    mix_entropy_threshold: float = 0.0  # > 0: mix the steps whose released_entropy is >= this, not by coin
    num_neighbors: int = 1  # neighbor: candidates = anchor + this many table neighbors
    weights: str = "code"  # neighbor: code = softmax(p(C) / tau); renorm = p(C) / sum p(C)
    top_k: int = 10  # soft, gaussian and the release's strategies: candidates = the top-k tokens of p
    mix_temperature: float = 0.0  # soft / gaussian: p(C)^(1/t) renormalised; release's: p / (tau t); 0: t = 1
    noise_sigma: float = 0.33  # gaussian / gaussian_embed_noise: noise std as a fraction of the input's RMS
    feed: str = "sampler"  # sampler: feed the mixture; replay-only: record it but feed E[y] (docs/algorithm.md)
    stop_mixing_id: int | None = None  # no mixing at or after the step that samples this id (</think>)

    def __post_init__(self):
        if self.strategy not in EXPLORERS:
            raise ValueError(f"exploration strategy must be one of {', '.join(EXPLORERS)}, "
                             f"not {self.strategy!r}")
        if self.weights not in ("code", "renorm") or self.feed not in ("sampler", "replay-only"):
            raise ValueError(f"mixing weights must be 'code' or 'renorm' (not {self.weights!r}) and feed "
                             f"'sampler' or 'replay-only' (not {self.feed!r})")
        if not (0.0 <= self.mix_rate <= 1.0 and self.num_neighbors >= 1 and self.top_k >= 1
                and self.noise_sigma >= 0 and self.mix_entropy_threshold >= 0):
            raise ValueError("exploration needs 0 <= mix_rate <= 1, num_neighbors >= 1, top_k >= 1, "
                             "noise_sigma >= 0, mix_entropy_threshold >= 0")
        if self.mix_entropy_threshold > 0 and self.strategy in ("none", "soft"):
            raise ValueError(f"the {self.strategy} strategy has no mixing coin for an entropy threshold "
                             "to replace")

    @property
    def num_candidates(self) -> int:
        fixed = {"none": 1, "neighbor": 1 + self.num_neighbors, "orthogonal_noise": 1}
        return fixed.get(self.strategy, self.top_k)


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
                      top_p: float = 1.0, top_k: int = 0,
                      weights: str = "code") -> tuple[torch.Tensor, torch.Tensor]:
    """The N-GRPO candidates of one decode step from raw logits [B, V]: (cand_ids [B, K], cand_weights
    [B, K]),
    K = 1 + num_neighbors, anchor (the greedy token) first, weights summing to 1."""
    probs = filtered_logits(logits, temperature, top_k, top_p).softmax(-1)
    return neighbor_candidates(probs, candidate_table(table, num_neighbors), temperature=temperature,
                               weights=weights)


def soft_candidates(probs: torch.Tensor, top_k: int,
                    mix_temperature: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft Thinking's mixture: the top-k tokens of p with p renormalised over them (or p^(1/t)
    renormalised)."""
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
    logits: torch.Tensor  # [B, V] the logits / tau whose softmax probs is (-inf: removed by top-k / top-p)
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
    noise_keys: torch.Tensor | None = None  # [B] int64: training replays scale * normal_from_keys(key, d)
    noise_scales: torch.Tensor | None = None  # [B] that noise's std; None = 0 (no replayed noise)

    def __post_init__(self):
        if self.noise_scales is None:
            self.noise_keys = torch.zeros_like(self.mixed, dtype=torch.long)
            self.noise_scales = torch.zeros_like(self.mixed, dtype=torch.float32)


def mix_where(view: StepView, cand_ids: torch.Tensor, cand_weights: torch.Tensor,
              mix: torch.Tensor) -> Mixture:
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


def mix_steps(view: StepView) -> torch.Tensor:
    """[B] bool: the eligible rows whose coin lands (rate mix_rate), or, with mix_entropy_threshold > 0, whose
    released_entropy reaches the threshold (the release's `mix_rate: null` mode)."""
    x = view.exploration
    if x.mix_entropy_threshold > 0:
        return view.eligible & (released_entropy(view) >= x.mix_entropy_threshold)
    return view.eligible & (view.coin < x.mix_rate)


def explore_neighbor(view: StepView) -> Mixture:
    """N-GRPO: at a step whose coin lands (rate mix_rate), the anchor argmax p and its table neighbors."""
    x = view.exploration
    cand_ids, cand_weights = neighbor_candidates(view.probs, view.cand_table, temperature=view.temperature,
                                                 weights=x.weights)
    return mix_where(view, cand_ids, cand_weights, mix_steps(view))


def explore_soft(view: StepView) -> Mixture:
    """Soft Thinking: every thinking step feeds the top-k mixture of p."""
    x = view.exploration
    return mix_where(view, *soft_candidates(view.probs, x.top_k, x.mix_temperature), view.eligible)


def with_noise(mixture: Mixture, where: torch.Tensor, sigma: float, draws: RowDraws) -> Mixture:
    """The mixture with N(0, (sigma * rms)^2) added to the inputs of the rows `where` (rms of each row's
    input), the record unchanged: training replays the noise-free inputs."""
    inputs = mixture.inputs.float()  # [B, d]
    rms = inputs.pow(2).mean(-1, keepdim=True).sqrt()
    noisy = inputs + draws.normal(NOISE, inputs.shape[1]) * sigma * rms
    mixture.inputs = torch.where(where[:, None], noisy, inputs).to(mixture.inputs.dtype)
    return mixture


def explore_gaussian(view: StepView) -> Mixture:
    """STHT-style: at a step whose coin lands, the top-k mixture plus N(0, (sigma * rms)^2) noise. The
    record holds the noise-free mixture, which is what training replays (as the released code does)."""
    x = view.exploration
    clean = mix_where(view, *soft_candidates(view.probs, x.top_k, x.mix_temperature), mix_steps(view))
    return with_noise(clean, clean.mixed, x.noise_sigma, view.draws)


# The release's other strategies (`mix_strategy` in its sglang `layers/sampler.py` and
# `managers/scheduler_output_processor_mixin.py`). Its sampler softmaxes the logits in place before the
# mixing code reads them, so everything below ranks and weighs the already-softmaxed p / tau
# (released_scores), as neighbor's `code` weights do. None needs state beyond the step: the decode step
# (CUDA graph included) takes whatever vector the strategy feeds.


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


def released_topk(view: StepView, perturbation: torch.Tensor | None = None):
    """(s = released_scores / t [B, V], cand_ids [B, K], cand_weights [B, K]): the top-k tokens by s (+ the
    perturbation), weighted by the unperturbed softmax(s(C)) = softmax(p(C) / (tau t))."""
    x = view.exploration
    scores = released_scores(view) / (x.mix_temperature or 1.0)  # [B, V]
    ranked = scores if perturbation is None else scores + perturbation
    cand_ids = ranked.topk(x.top_k, dim=-1).indices  # [B, K]
    return scores, cand_ids, scores.gather(-1, cand_ids).softmax(-1)


def explore_topk(view: StepView) -> Mixture:
    """The release's `topk`: at a mixed step, the top-k tokens of p weighted softmax(p(C) / (tau t)). On
    probabilities that is nearly uniform: at tau t = 1 a sure anchor gets e / (e + k - 1) (23% at k = 10)."""
    _, cand_ids, cand_weights = released_topk(view)
    return mix_where(view, cand_ids, cand_weights, mix_steps(view))


def explore_topk_gumbel(view: StepView) -> Mixture:
    """The release's `topk-gumbel`: `topk` with the candidates ranked by p / (tau t) + Gumbel noise (one
    draw per token, u clamped to [1e-6, 1 - 1e-6] as released), the weights from the unperturbed scores.
    Gumbel noise (std 1.28) swamps scores in [0, 1 / (tau t)]: the candidates are nearly k tokens drawn
    uniformly from the whole vocabulary (Gumbel-top-k samples without replacement from softmax(scores))."""
    u = view.draws.uniform(GUMBEL, view.probs.shape[-1]).clamp(1e-6, 1 - 1e-6)  # [B, V] float64
    _, cand_ids, cand_weights = released_topk(view, perturbation=-(-u.log()).log().float())
    return mix_where(view, cand_ids, cand_weights, mix_steps(view))


def explore_gaussian_embed_noise(view: StepView) -> Mixture:
    """The release's `gaussian_embed_noise`: the `topk` mixture plus N(0, (sigma * rms)^2) noise; the record
    (what training replays, as the release's trainer does) holds the noise-free mixture. Under the entropy
    gate the release adds noise at every thinking step, those the gate leaves unmixed too (E[y] + noise)."""
    x = view.exploration
    mixture = explore_topk(view)
    noisy = view.eligible if x.mix_entropy_threshold > 0 else mixture.mixed
    return with_noise(mixture, noisy, x.noise_sigma, view.draws)


def explore_orthogonal_noise(view: StepView) -> Mixture:
    """The release's `orthogonal_noise`: at a mixed step, E[a] (a = argmax p) plus noise scaled by the other
    top-k tokens c_k: n_k = |E[c_k] minus its projection on E[a]|, w = softmax(scores(c_k) / t) over them
    (p / (tau t^2): the release divides by t twice). The release draws randn_like(unit direction) * w_k n_k,
    an isotropic vector per c_k (the direction lends only its shape), so the sum is N(0, sum_k (w_k n_k)^2)
    per coordinate: drawn here as one normal vector times that std. The record holds [a] and the noise's
    key and std, so training replays the fed vector exactly (the release records the vector itself).
    The release takes its rows from the output matrix (`vocab_embedding_weight` is lm_head's); here E."""
    x = view.exploration
    scores, cand_ids, _ = released_topk(view)
    anchor = view.embed[cand_ids[:, 0]].float()  # [B, d]
    others = view.embed[cand_ids[:, 1:]].float()  # [B, K-1, d]
    along = others @ anchor[:, :, None] / anchor.pow(2).sum(-1).clamp_min(1e-6)[:, None, None]  # [B, K-1, 1]
    orth_norms = (others - along * anchor[:, None]).norm(dim=-1).clamp_min(1e-6)  # [B, K-1]
    noise_weights = (scores.gather(-1, cand_ids[:, 1:]) / (x.mix_temperature or 1.0)).softmax(-1)
    scales = (noise_weights * orth_norms).pow(2).sum(-1).sqrt()  # [B]
    mixture = mix_where(view, cand_ids[:, :1], torch.ones_like(scales)[:, None], mix_steps(view))
    keys = view.draws.keys(NOISE)
    noisy = anchor + scales[:, None] * normal_from_keys(keys, anchor.shape[1])  # [B, d]
    mixture.inputs = torch.where(mixture.mixed[:, None], noisy, mixture.inputs.float()).to(view.embed.dtype)
    mixture.noise_keys, mixture.noise_scales = keys, torch.where(mixture.mixed, scales, 0.0)
    return mixture


EXPLORERS: dict[str, Callable[[StepView], Mixture]] = {
    "none": explore_none, "neighbor": explore_neighbor, "soft": explore_soft, "gaussian": explore_gaussian,
    "topk": explore_topk, "topk-gumbel": explore_topk_gumbel,
    "gaussian_embed_noise": explore_gaussian_embed_noise, "orthogonal_noise": explore_orthogonal_noise,
}
STRATEGIES = tuple(EXPLORERS)


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
