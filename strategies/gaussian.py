"""STHT-style noisy soft tokens: at a step whose mixing coin lands, the soft top-k mixture plus Gaussian noise.

How it departs from N-GRPO: the candidates are the top-k tokens of p (as Soft Thinking's, strategies/soft.py), not
the anchor's neighbors, and the fed vector gets N(0, (sigma * rms)^2) noise per coordinate (rms of the fed vector).
Training replays the noise-free mixture, as the released code's `gaussian_embed_noise` does (strategies/released.py
adds the same noise to its own mixture).
"""

import torch

from engine.draws import NOISE, RowDraws
from strategies.base import AT_LEAST_0, Mixture, StepView, Strategy, mix_steps, mix_where, option
from strategies.soft import TOP_K, soft_candidates, top_k_candidates

KNOBS = dict(noise_sigma=option(0.33, "noise std as a fraction of the fed input's RMS", check=AT_LEAST_0))


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
    clean = mix_where(view, *soft_candidates(view.probs, x.soft_top_k, x.mix_temperature), mix_steps(view))
    return with_noise(clean, clean.mixed, x.noise_sigma, view.draws)


STRATEGIES = {
    "gaussian": Strategy(explore_gaussian, "STHT-style noisy mixtures of the top tokens",
                         candidates=top_k_candidates, knobs=(*TOP_K, *KNOBS), coin=True),
}
