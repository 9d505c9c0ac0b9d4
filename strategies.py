"""The exploration strategies: what one decode step feeds the model besides the sampled token, and the random
draws they and the sampler take.

The sampler (rollout.py) samples the action y ~ p and hands each strategy the step (`StepView`); the strategy
returns the step's record and the next input (`Mixture`; the paper's mixing, steps 2-5 of docs/algorithm.md):

    m   = Bernoulli(mix_rate), until </think>     (`soft`: every thinking step; or an entropy threshold)
    C   = [argmax p] + its table neighbors         (`soft` / `gaussian`: the top-K tokens of p)
    w   = softmax(p(C) / tau)  or  p(C) / sum p(C)
    e   = sum_c w_c E[c] if m else E[y]           (`gaussian`: + N(0, (sigma * rms)^2) at mixed steps)

`mixed_embeddings` is the one formula for e that the sampler feeds and training replays (replay.py). Each strategy
is one function, registered in STRATEGIES: `none` (GRPO), `neighbor` (N-GRPO), `soft` (Soft Thinking, with Cold
Stop), `soft-gumbel` (Randomized Soft Thinking), `mixinputs` (Mixture of Inputs), `multiplex` (Multiplex Thinking:
K tokens drawn from p, merged), `soft-grpo` (SofT-GRPO), `gaussian` (STHT-style), and the release's others (`topk`,
`topk-gumbel`, `gaussian_embed_noise`, `orthogonal_noise`). Per-row state a strategy keeps (Cold Stop's counter) is a
declared field the engine holds in each slot, so the decode step (CUDA graph included) takes whatever vector it
feeds.

Every random draw is counter-based (engine/draws.py): a hash of (seed, stream, row key, position), so a row's
sample does not depend on its batch, slot or rank.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from engine.draws import DIRICHLET, GUMBEL, MULTIPLEX, NOISE, RowDraws, gamma_log_draws, normal_from_keys


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


# ----------------------------------------------------------------------------- the exploration settings and candidates


@dataclass(frozen=True)
class Exploration:
    strategy: str = "none"  # a key of STRATEGIES: none, neighbor (N-GRPO), soft, gaussian, the release's own
    mix_rate: float = 0.1  # P(a step is mixed); soft mixes every thinking step
    mix_entropy_threshold: float = 0.0  # > 0: mix the steps whose released_entropy is >= this, not by coin
    num_neighbors: int = 1  # neighbor: candidates = anchor + this many table neighbors
    weights: str = "code"  # neighbor: code = softmax(p(C) / tau); renorm = p(C) / sum p(C)
    top_k: int = 10  # soft, gaussian and the release's strategies: candidates = the top-k tokens of p
    mix_temperature: float = 0.0  # soft / gaussian: p(C)^(1/t) renormalised; release's: p / (tau t); 0: t = 1
    noise_sigma: float = 0.33  # gaussian / gaussian_embed_noise: noise std as a fraction of the input's RMS
    feed: str = "sampler"  # sampler: feed the mixture; replay-only: record it but feed E[y] (docs/algorithm.md)
    stop_mixing_id: int | None = None  # no mixing at or after the step that samples this id (</think>)
    mixinputs_beta: float = 1.0  # mixinputs: the sampled token's concentration beta; <= -99: the direct mixture
    gumbel_temperature: float = 0.5  # soft-gumbel: the Gumbel-softmax temperature
    cold_stop_entropy: float = 0.0  # soft / soft-gumbel: Cold Stop's entropy threshold in nats (0 = off)
    cold_stop_steps: int = 256  # ... and the steps in a row under it that end thinking (force stop_mixing_id)
    dirichlet_alpha: float = 0.0  # soft / soft-gumbel: p -> a Dirichlet(alpha p) draw before the top-k (0 = off)
    multiplex_width: int = 3  # multiplex: K, the tokens drawn from p at each thinking step
    multiplex_weights: str = "uniform"  # multiplex: uniform = 1/K each; probs = p(token) renormalised over the K
    multiplex_replacement: bool = True  # multiplex: the K draws with replacement (a token may come twice)
    multiplex_gumbel_tau: float = 0.0  # multiplex: > 0: p -> softmax((log p + g) / tau) over V before the K draws
    multiplex_entropy_mask: float = 0.0  # multiplex: > 0: only thinking steps with H(p) above this are mixed
    noise_factor: float = 1.0  # soft-grpo: the clamped Gumbel noise's scale in g' (SofT-GRPO's rollout.noise_factor)

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"exploration strategy must be one of {', '.join(STRATEGIES)}, "
                             f"not {self.strategy!r}")
        if self.weights not in ("code", "renorm") or self.feed not in ("sampler", "replay-only"):
            raise ValueError(f"mixing weights must be 'code' or 'renorm' (not {self.weights!r}) and feed "
                             f"'sampler' or 'replay-only' (not {self.feed!r})")
        if not (0.0 <= self.mix_rate <= 1.0 and self.num_neighbors >= 1 and self.top_k >= 1
                and self.noise_sigma >= 0 and self.mix_entropy_threshold >= 0):
            raise ValueError("exploration needs 0 <= mix_rate <= 1, num_neighbors >= 1, top_k >= 1, "
                             "noise_sigma >= 0, mix_entropy_threshold >= 0")
        if self.mix_entropy_threshold > 0 and self.strategy in NO_COIN:
            raise ValueError(f"the {self.strategy} strategy has no mixing coin for an entropy threshold "
                             "to replace")
        if not (self.gumbel_temperature > 0 and self.cold_stop_entropy >= 0 and self.cold_stop_steps >= 1
                and (self.mixinputs_beta >= 0 or self.mixinputs_beta <= -99)):
            raise ValueError("exploration needs gumbel_temperature > 0, cold_stop_entropy >= 0, "
                             "cold_stop_steps >= 1, mixinputs_beta >= 0 (or <= -99: the direct mixture)")
        if self.cold_stop_entropy > 0 and (self.strategy not in COLD_STOP or self.stop_mixing_id is None):
            raise ValueError(f"Cold Stop forces stop_mixing_id (</think>): it needs one, and {', '.join(COLD_STOP)}")
        if self.dirichlet_alpha < 0 or (self.dirichlet_alpha > 0 and self.strategy not in COLD_STOP):
            raise ValueError(f"Dirichlet noise needs dirichlet_alpha >= 0 (0 = off), and {', '.join(COLD_STOP)}")
        if min(self.noise_factor, self.multiplex_gumbel_tau, self.multiplex_entropy_mask) < 0:
            raise ValueError("noise_factor, multiplex_gumbel_tau and multiplex_entropy_mask must be >= 0")
        if self.multiplex_width < 1 or self.multiplex_weights not in ("uniform", "probs"):
            raise ValueError(f"multiplex needs multiplex_width >= 1 (not {self.multiplex_width}) and "
                             f"multiplex_weights 'uniform' or 'probs' (not {self.multiplex_weights!r})")

    @property
    def num_candidates(self) -> int:
        return STRATEGIES[self.strategy].candidates(self)


def candidate_table(table: torch.Tensor, num_neighbors: int) -> torch.Tensor:
    """[V, 1 + num_neighbors]: row v holds v itself, then its first num_neighbors table neighbors, so one
    gather at the anchor gives the whole candidate list."""
    own = torch.arange(table.shape[0], device=table.device)[:, None]
    return torch.cat([own, table[:, :num_neighbors]], dim=-1)


def neighbor_candidates(probs: torch.Tensor, cand_table: torch.Tensor, *, temperature: float,
                        weights: str = "code") -> tuple[torch.Tensor, torch.Tensor]:
    """From the sampling distribution p [B, V]: candidates [anchor = argmax p, its neighbors] [B, K] and
    their weights [B, K] (the paper's steps 3-4, docs/algorithm.md). cand_table comes from candidate_table()."""
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
# (`Mixture`), registered in STRATEGIES at the end of this file with what it records beyond every step's RECORD.


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


def cold_stop(view: StepView) -> StepView:
    """Soft Thinking's Cold Stop (its sglang `Req.update_topk_info`): a thinking row counts its steps in a row whose
    entropy H(softmax(z / tau)) (nats, unfiltered) is under cold_stop_entropy; the step that brings the count to
    cold_stop_steps emits stop_mixing_id (</think>) in place of its sample, unmixed, and the count restarts. The
    view with that action and those rows no longer eligible (off: the view itself)."""
    x = view.exploration
    if x.cold_stop_entropy <= 0:
        return view
    probs = (view.raw.float() / view.temperature).softmax(-1)  # [B, V]
    entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1)
    low = view.state["low_entropy_steps"]  # [B], the slot's own counter: updated in place
    counted = torch.where(entropy < x.cold_stop_entropy, low + 1, 0)
    low.copy_(torch.where(view.eligible, counted, low))  # past thinking (or no row): kept, and never read
    stop = view.eligible & (low >= x.cold_stop_steps)
    low.masked_fill_(stop, 0)
    return replace(view, token=torch.where(stop, x.stop_mixing_id, view.token), eligible=view.eligible & ~stop)


def dirichlet_probs(view: StepView) -> torch.Tensor:
    """[B, V] what Soft Thinking's top-k reads: p, or with dirichlet_alpha > 0 a draw of Dirichlet(alpha p) over the
    vocabulary (its sglang sampler's `--add_noise_dirichlet`: Gamma(alpha p_v, 1) draws g_v, g / sum g; a token
    top-k / top-p / min-p removed keeps 0). The Gamma draws come from the row's DIRICHLET stream
    (engine.draws.gamma_log_draws); the record holds the weights they give, so the replay feeds them as they were."""
    alpha = view.exploration.dirichlet_alpha
    if alpha <= 0:
        return view.probs
    return gamma_log_draws(view.draws, DIRICHLET, alpha * view.probs).softmax(-1).to(view.probs.dtype)


def explore_soft(view: StepView) -> Mixture:
    """Soft Thinking: every thinking step feeds the top-k mixture of p, or of its Dirichlet draw (Cold Stop may end
    thinking)."""
    x = view.exploration
    view = cold_stop(view)  # the action: the sample, or Cold Stop's </think>
    mixture = mix_where(view, *soft_candidates(dirichlet_probs(view), x.top_k, x.mix_temperature), view.eligible)
    return replace(mixture, token=view.token if x.cold_stop_entropy > 0 else None)


def explore_soft_gumbel(view: StepView) -> Mixture:
    """Randomized Soft Thinking (arXiv 2508.03440): every thinking step feeds the top-k tokens of p weighted
    w = softmax((log q + g) / tau_g), q = p renormalised over them, g = -log(-log u) a Gumbel draw per candidate
    from the row's GUMBEL stream; the record holds w (Cold Stop may end thinking; Dirichlet noise moves p first).
    """
    x = view.exploration
    view = cold_stop(view)
    cand_ids, q = soft_candidates(dirichlet_probs(view), x.top_k)  # [B, K] each
    gumbel = -(-view.draws.uniform(GUMBEL, x.top_k).log()).log()  # [B, K] float64
    weights = ((q.log() + gumbel.float()) / x.gumbel_temperature).softmax(-1)
    return replace(mix_where(view, cand_ids, weights, view.eligible), token=view.token if x.cold_stop_entropy else None)


MIXINPUTS_CANDIDATES = 20  # the prior's support: vLLM's 20 logprobs the authors' runner asks for by default


def explore_mixinputs(view: StepView) -> Mixture:
    """Mixture of Inputs (arXiv 2505.14827; the authors' vLLM `gpu_model_runner.py`): every eligible step feeds
    H_n sum_c (q_c + beta [c = y]) / (1 + beta) E[c] + (1 - H_n) E[y] over the 20 tokens c of highest raw logit
    (vLLM's logprobs: no temperature, no filter), q = their renormalised p, H_n = H(q) / log 20 (beta <= -99:
    their direct mixture sum_c q_c E[c]). Recorded as [c_1..c_20, y] with those weights."""
    beta = view.exploration.mixinputs_beta
    top_logits, top_ids = view.raw.float().topk(min(MIXINPUTS_CANDIDATES, view.raw.shape[-1]), dim=-1)  # [B, n]
    prior = top_logits.softmax(-1)
    entropy = -(prior * prior.clamp_min(1e-12).log()).sum(-1, keepdim=True) / math.log(prior.shape[-1])  # [B, 1]
    posterior = (prior + beta * (top_ids == view.token[:, None]).float()) / (1 + beta)
    weights, own = (entropy * posterior, 1 - entropy) if beta > -99 else (prior, torch.zeros_like(entropy))
    spare = MIXINPUTS_CANDIDATES - prior.shape[-1]  # > 0 only for a vocabulary under 20: weight-0 copies of y
    cand_ids = torch.cat([top_ids, view.token[:, None].expand(-1, spare + 1)], dim=-1)  # [B, 21]
    cand_weights = torch.cat([weights, torch.zeros_like(prior[:, :1]).expand(-1, spare), own], dim=-1)
    return mix_where(view, cand_ids, cand_weights, view.eligible)


def multiplex_draws(probs: torch.Tensor, first: torch.Tensor | None, uniforms: torch.Tensor,
                    replacement: bool = True) -> torch.Tensor:
    """[B, K] tokens from p [B, V]: `first` [B] (the step's action, already drawn from p; None: none), then one
    inverse-CDF draw per uniform [B, n] (float64 in (0, 1)); without replacement each draw renormalises p over the
    tokens not yet drawn, as torch.multinomial(p, K, replacement=False) draws in turn."""
    drawn, probs = [] if first is None else [first], probs.double()
    for k in range(uniforms.shape[1]):
        if not replacement and drawn:  # the tokens drawn so far are out (a row that drew every token keeps its last)
            left = probs.scatter(-1, torch.stack(drawn, -1), 0.0)
            probs = torch.where(left.sum(-1, keepdim=True) > 0, left, probs)
        cdf = probs.cumsum(-1)  # [B, V]
        total = cdf[:, -1:]
        target = torch.minimum(uniforms[:, k : k + 1] * total, total.nextafter(torch.zeros_like(total)))
        drawn.append(torch.searchsorted(cdf, target, right=True)[:, 0])  # the first token whose cdf exceeds it
    return torch.stack(drawn, -1)


def explore_multiplex(view: StepView) -> Mixture:
    """Multiplex Thinking (arXiv 2601.08808; its sglang sampler, layers/sampler.py): every thinking step draws K =
    multiplex_width tokens from p (after temperature, top-k, top-p, min-p), the first being the step's action y and
    the others from the row's MULTIPLEX stream, with replacement (or without), and feeds sum_k w_k E[i_k], w = 1/K
    (uniform: its enable_unweighting, the released recipe) or p(i_k) renormalised over the K (probs). Answer
    steps feed y. Training scores all K tokens of a thinking step (the joint log-probability; ngrpo.policy_loss).
    As in their sampler, Cold Stop may end thinking; an entropy mask leaves thinking steps with H(p) <= the threshold
    unmixed (enable_entropy_mask); Dirichlet noise, then Gumbel noise (enable_gumbel: softmax((log p + g) / tau), a
    Gumbel g per token from the row's GUMBEL stream) replace p by p' for all K draws: the action too is then the first
    of K draws from p' (scored, like every candidate, under the policy's p)."""
    x = view.exploration
    view = cold_stop(view)
    if x.multiplex_entropy_mask > 0:
        p = view.probs.float()
        entropy = -(p * p.clamp_min(1e-12).log()).sum(-1)  # [B] nats
        view = replace(view, eligible=view.eligible & (entropy > x.multiplex_entropy_mask))
    probs, first = (view.probs, view.token) if x.dirichlet_alpha <= 0 else (dirichlet_probs(view), None)
    if x.multiplex_gumbel_tau > 0:
        gumbel = -(-view.draws.uniform(GUMBEL, probs.shape[-1]).log()).log()  # [B, V] float64
        probs = ((probs.double().clamp_min(1e-20).log() + gumbel) / x.multiplex_gumbel_tau).softmax(-1).to(probs.dtype)
        first = None
    uniforms = view.draws.uniform(MULTIPLEX, x.multiplex_width - (first is not None))  # [B, K - 1] or [B, K]
    cand_ids = multiplex_draws(probs, first, uniforms, x.multiplex_replacement)  # [B, K]
    weights = torch.ones(cand_ids.shape, device=cand_ids.device) if x.multiplex_weights == "uniform" else \
        probs.gather(-1, cand_ids).float()
    if first is None:  # the action: the first draw from p' at a thinking step
        view = replace(view, token=torch.where(view.eligible, cand_ids[:, 0], view.token))
    mixture = mix_where(view, cand_ids, weights / weights.sum(-1, keepdim=True), view.eligible)
    return replace(mixture, token=view.token if x.cold_stop_entropy > 0 or first is None else None)


def explore_soft_grpo(view: StepView) -> Mixture:
    """SofT-GRPO (arXiv 2511.06411; its sglang layers/sampler.py, add_noise_gumbel_softmax): every thinking step
    takes the top-k tokens of p, q = p renormalised over them, the perturbed logits g' = log(q + 1e-6) + g with g a
    Gumbel draw clamped to [-1.5, 3] (the row's GUMBEL stream), and feeds sum_k softmax(g' / tau_g)_k E[c_k]. The
    record keeps g' (`gumbel_logits`): training scores the step by g's Gumbel log-density under the policy being
    trained (soft_grpo_logprob)."""
    x = view.exploration
    cand_ids, q = soft_candidates(view.probs, x.top_k)  # [B, K] each
    gumbel = (-(-view.draws.uniform(GUMBEL, x.top_k).log()).log()).float().clamp(-1.5, 3.0)
    perturbed = (q + 1e-6).log() + x.noise_factor * gumbel  # [B, K]
    mixture = mix_where(view, cand_ids, (perturbed / x.gumbel_temperature).softmax(-1), view.eligible)
    return replace(mixture, extra={"gumbel_logits": torch.where(view.eligible[:, None], perturbed, 0.0)})


def soft_grpo_logprob(logp: torch.Tensor, action_logp: torch.Tensor, steps: dict[str, torch.Tensor]) -> torch.Tensor:
    """[B, T] what SofT-GRPO's loss takes as a step's log-probability, from log p of its K candidates [B, T, K] and of
    its action [B, T] (its verl utils/torch_functional.py, logprobs_from_logits_topk_gumbel): at a thinking step,
    with log q_k = log(p_k / sum_j p_j + 1e-6) under the policy being scored and the recorded g', the Gumbel noise
    that policy would have needed, e_k = clamp(g'_k - log q_k, -1.5, 3), scored by the Gumbel log-density -e_k -
    exp(-e_k), averaged over the candidates with log q_k > -3; at an answer step log p(y)."""
    log_q = (logp - logp.logsumexp(-1, keepdim=True)).exp().add(1e-6).log()
    noise = (steps["gumbel_logits"] - log_q).clamp(-1.5, 3.0)
    kept = (log_q > -3).float()
    reparameterised = ((-noise - (-noise).exp()) * kept).sum(-1) / kept.sum(-1).clamp_min(1.0)
    return torch.where(steps["mixed"], reparameterised, action_logp)


def explore_soft_grpo_dirichlet(view: StepView) -> Mixture:
    """SofT-GRPO's Dirichlet variant (its sampler's add_noise_dirichlet, SofT-GRPO-deepscaler-8k-dir.sh): every
    thinking step takes the top-k tokens of p, q = p renormalised over them, draws g_k ~ Gamma(q_k, 1) (the row's
    DIRICHLET stream) and feeds sum_k g_k / sum_j g_j E[c_k]; the record keeps g (`topk_noise`)."""
    cand_ids, q = soft_candidates(view.probs, view.exploration.top_k)  # [B, K] each
    g = gamma_log_draws(view.draws, DIRICHLET, q).exp().float()
    mixture = mix_where(view, cand_ids, g / g.sum(-1, keepdim=True).clamp_min(1e-30), view.eligible)
    return replace(mixture, extra={"topk_noise": torch.where(view.eligible[:, None], g, 0.0)})


def explore_soft_grpo_gaussian(view: StepView) -> Mixture:
    """SofT-GRPO's Gaussian variant (its sampler's third branch, -gau.sh): s_k ~ N(q_k, 0.05^2) over the top-k's q (the
    row's NOISE stream), fed sum_k s_k / sum_j s_j E[c_k] (a weight may be negative, as theirs); recorded: s."""
    cand_ids, q = soft_candidates(view.probs, view.exploration.top_k)
    noisy = q + 0.05 * view.draws.normal(NOISE, q.shape[-1]).to(q.dtype)
    mixture = mix_where(view, cand_ids, noisy / noisy.sum(-1, keepdim=True), view.eligible)
    return replace(mixture, extra={"topk_noise": torch.where(view.eligible[:, None], noisy, 0.0)})


def topk_noise_logprob(density: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """A SofT-GRPO variant's loss log-probability (its verl logprobs_from_logits_topk_dirichlet / _normal): at a
    thinking step the mean of density(q, recorded noise) over q > 0.05 (q: the policy's p over the top-k)."""
    def log_prob(logp: torch.Tensor, action_logp: torch.Tensor, steps: dict[str, torch.Tensor]) -> torch.Tensor:
        q = (logp - logp.logsumexp(-1, keepdim=True)).exp().clamp_min(1e-20)  # 0 would make lgamma's gradient nan
        kept = (q > 0.05).float()
        value = (density(q, steps["topk_noise"]) * kept).sum(-1) / kept.sum(-1).clamp_min(1.0)
        return torch.where(steps["mixed"], value, action_logp)
    return log_prob


def gamma_density(q: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """log Gamma(g; q, 1) = (q - 1) log g - g - lgamma(q), clamped to [-5, 3] as theirs."""
    return ((q - 1) * g.clamp_min(1e-30).log() - g - torch.lgamma(q)).clamp(-5.0, 3.0)


def normal_density(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """log N(clamp(s, q - 0.15, q + 0.15); q, 0.05^2), as theirs."""
    x = torch.clamp(s, q - 0.15, q + 0.15)
    return -0.5 * ((x - q) / 0.05) ** 2 - math.log(0.05 * math.sqrt(2 * math.pi))


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
    mixture.extra = {"noise_keys": keys, "noise_scales": torch.where(mixture.mixed, scales, 0.0)}
    return mixture


# ----------------------------------------------------------------------------- the record and the registry


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


def noisy_mixture_inputs(embed_weight: torch.Tensor, steps: dict[str, torch.Tensor]) -> torch.Tensor:
    """The recorded mixture plus the noise drawn again from its recorded key: + scale * normal_from_keys(key, d)
    where noise_scales > 0 (what `orthogonal_noise` fed)."""
    inputs = mixture_inputs(embed_weight, steps)
    scales = steps["noise_scales"]
    noisy = scales > 0
    if not bool(noisy.any()):
        return inputs
    noise = torch.zeros(*inputs.shape, device=inputs.device)
    noise[noisy] = scales[noisy, None] * normal_from_keys(steps["noise_keys"][noisy], inputs.shape[-1])
    return (inputs.float() + noise).to(inputs.dtype)


@dataclass(frozen=True)
class Strategy:
    """An exploration strategy: its step rule, and what it adds to what every step records.

    explore(view) -> Mixture is the rule; candidates(exploration) -> K, the candidates a step records. record: the
    fields it records beyond RECORD (Mixture.extra holds them at each step, rollout.Rollout carries them). state:
    per-row fields the sampler keeps for it in each slot, reset to their pad when a row starts (view.state holds
    them; update them in place). feed(embed, steps) -> inputs: the input a step fed, from the step's record: what
    training replays (replay.py). scores: the recorded tokens training scores, response_ids (the action y, [T]) or
    cand_ids (every candidate too, [T, K]); with cand_ids, log_prob(candidates' logp [B, T, K], the action's
    [B, T], steps) -> [B, T] is what the loss takes as each step's log-probability (SofT-GRPO's reparameterised
    one), or, None, the loss sums a ratio per candidate of weight > 0 (Multiplex Thinking's joint log-probability).
    """

    explore: Callable[[StepView], Mixture]
    candidates: Callable[[Exploration], int] = lambda x: x.top_k
    record: tuple[Field, ...] = ()
    state: tuple[Field, ...] = ()
    feed: Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor] = mixture_inputs
    scores: str = "response_ids"
    log_prob: Callable[[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]], torch.Tensor] | None = None


NOISE_RECORD = (Field("noise_keys", torch.long), Field("noise_scales", torch.float32, pad=0.0))  # std 0 = none
COLD_STOP_STATE = (Field("low_entropy_steps", torch.long, pad=0),)  # Cold Stop's count of low-entropy steps
TOPK_NOISE = (Field("topk_noise", torch.float32, pad=0.0, per_candidate=True),)  # SofT-GRPO's variants' noise

NO_COIN = ("none", "soft", "soft-gumbel", "mixinputs", "multiplex", "soft-grpo", "soft-grpo-dirichlet",
           "soft-grpo-gaussian")  # no mixing coin
COLD_STOP = ("soft", "soft-gumbel", "multiplex")  # Cold Stop and Dirichlet noise

# --explore NAME -> its strategy. To add one: write explore_NAME above, register it here (or register() from your
# own module), give Exploration the knobs it reads. The sampler, the engine and the replay do not change.
STRATEGIES: dict[str, Strategy] = {
    "none": Strategy(explore_none, candidates=lambda x: 1),
    "neighbor": Strategy(explore_neighbor, candidates=lambda x: 1 + x.num_neighbors),
    "soft": Strategy(explore_soft, state=COLD_STOP_STATE),
    "gaussian": Strategy(explore_gaussian),
    "topk": Strategy(explore_topk),
    "topk-gumbel": Strategy(explore_topk_gumbel),
    "gaussian_embed_noise": Strategy(explore_gaussian_embed_noise),
    "orthogonal_noise": Strategy(explore_orthogonal_noise, candidates=lambda x: 1, record=NOISE_RECORD,
                                 feed=noisy_mixture_inputs),
    "soft-gumbel": Strategy(explore_soft_gumbel, state=COLD_STOP_STATE),
    "mixinputs": Strategy(explore_mixinputs, candidates=lambda x: MIXINPUTS_CANDIDATES + 1),
    "multiplex": Strategy(explore_multiplex, candidates=lambda x: x.multiplex_width, state=COLD_STOP_STATE,
                          scores="cand_ids"),
    "soft-grpo": Strategy(explore_soft_grpo, record=(Field("gumbel_logits", torch.float32, pad=0.0,
                                                           per_candidate=True),),
                          scores="cand_ids", log_prob=soft_grpo_logprob),
    "soft-grpo-dirichlet": Strategy(explore_soft_grpo_dirichlet, record=TOPK_NOISE, scores="cand_ids",
                                    log_prob=topk_noise_logprob(gamma_density)),
    "soft-grpo-gaussian": Strategy(explore_soft_grpo_gaussian, record=TOPK_NOISE, scores="cand_ids",
                                   log_prob=topk_noise_logprob(normal_density)),
}


def register(name: str, strategy: Strategy) -> None:
    """Makes `strategy` available as Exploration(name) (a new name, or a replacement)."""
    STRATEGIES[name] = strategy


def record_fields(strategy: str) -> tuple[Field, ...]:
    """Everything a step of `strategy` records: RECORD and the strategy's own fields."""
    return RECORD + STRATEGIES[strategy].record
