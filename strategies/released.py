"""The released code's other strategies (`mix_strategy` in github.com/ZJUSCL/N-GRPO's sglang `layers/sampler.py` and
`managers/scheduler_output_processor_mixin.py`): topk, topk-gumbel, gaussian_embed_noise, orthogonal_noise.

How they depart from N-GRPO: the candidates are the top-k tokens of p, not the anchor's neighbors, and they keep the
release's arithmetic. Its sampler softmaxes the logits in place before the mixing code reads them, so everything
here ranks and weighs the already-softmaxed p / tau (base.released_scores), as neighbor's `code` weights do: on
probabilities a second softmax is nearly uniform. None needs state beyond the step: the decode step (CUDA graph
included) takes whatever vector the strategy feeds. docs/algorithm.md tabulates each.
"""

import torch

from engine.draws import GUMBEL, NOISE, normal_from_keys
from strategies.base import Field, Mixture, StepView, Strategy, mix_steps, mix_where, mixture_inputs, released_scores
from strategies.gaussian import KNOBS as GAUSSIAN
from strategies.gaussian import with_noise
from strategies.soft import TOP_K, top_k_candidates


def released_topk(view: StepView, perturbation: torch.Tensor | None = None):
    """(s = released_scores / t [B, V], cand_ids [B, K], cand_weights [B, K]): the top-k tokens by s (+ the
    perturbation), weighted by the unperturbed softmax(s(C)) = softmax(p(C) / (tau t))."""
    x = view.exploration
    scores = released_scores(view) / (x.mix_temperature or 1.0)  # [B, V]
    ranked = scores if perturbation is None else scores + perturbation
    cand_ids = ranked.topk(x.soft_top_k, dim=-1).indices  # [B, K]
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


NOISE_RECORD = (Field("noise_keys", torch.long), Field("noise_scales", torch.float32, pad=0.0))  # std 0 = none
STRATEGIES = {
    "topk": Strategy(explore_topk, "the release's top tokens weighted by a second softmax",
                     candidates=top_k_candidates, knobs=(*TOP_K,), coin=True),
    "topk-gumbel": Strategy(explore_topk_gumbel, "the release's Gumbel-perturbed choice of the top tokens",
                            candidates=top_k_candidates, knobs=(*TOP_K,), coin=True),
    "gaussian_embed_noise": Strategy(explore_gaussian_embed_noise, "the release's topk + Gaussian noise",
                                     candidates=top_k_candidates, knobs=(*TOP_K, *GAUSSIAN), coin=True),
    "orthogonal_noise": Strategy(explore_orthogonal_noise, "the release's greedy token + noise scaled by the other "
                                 "top tokens", candidates=lambda x: 1, knobs=(*TOP_K,), coin=True,
                                 record=NOISE_RECORD, feed=noisy_mixture_inputs),
}
