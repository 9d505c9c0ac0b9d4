"""The exploration strategies: what one decode step feeds the model besides the sampled token.

The sampler (rollout.py) samples the action y ~ p and hands each strategy the step (`StepView`); the strategy
returns the step's record and the next input (`Mixture`, DESIGN.md §3 steps 2-5):

    m   = Bernoulli(mix_rate), until </think>     (`soft`: every thinking step; or an entropy threshold)
    C   = [argmax p] + its table neighbors         (`soft` / `gaussian`: the top-K tokens of p)
    w   = softmax(p(C) / tau)  or  p(C) / sum p(C)
    e   = sum_c w_c E[c] if m else E[y]           (`gaussian`: + N(0, (sigma * rms)^2) at mixed steps)

Each strategy is one function, registered in EXPLORERS: `none` (GRPO), `neighbor` (N-GRPO), `soft` (Soft
Thinking), `gaussian` (STHT-style), and the release's others (`topk`, `topk-gumbel`, `gaussian_embed_noise`,
`orthogonal_noise`). A strategy needs no state beyond the step, so the decode step (CUDA graph included)
takes whatever vector it feeds.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from draws import GUMBEL, NOISE, RowDraws, normal_from_keys
from ngrpo import mixed_embeddings


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



def soft_candidates(probs: torch.Tensor, top_k: int,
                    mix_temperature: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft Thinking's mixture: the top-k tokens of p with p renormalised over them (or p^(1/t)
    renormalised)."""
    cand_probs, cand_ids = probs.topk(top_k, dim=-1)  # [B, K]
    if mix_temperature > 0:
        cand_probs = cand_probs.clamp_min(1e-30) ** (1.0 / mix_temperature)
    return cand_ids, cand_probs / cand_probs.sum(-1, keepdim=True)


# ----------------------------------------------------------------------------- the strategies
#
# A strategy is one function of the step (`StepView`) returning the step's record and the next input
# (`Mixture`). To add one: write explore_NAME below, register it in EXPLORERS, give Exploration the knobs
# it reads (and num_candidates its K). The decode loop (rollout.py) does not change.


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
