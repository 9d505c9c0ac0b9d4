"""Counter-based random draws: every random number of a rollout (the token, the mixing coin, a strategy's noise or
Gumbel perturbation) as a function of what identifies it.

Randomness is counter-based: every random number of a rollout is a hash of (seed, stream, row key, position,
index), computed with int64 tensor ops. A torch.Generator's draws depend on the order in which they are taken, so
a row's sample would depend on its slot, its batch-mates, the refill order and, across processes, on the rank
that generated it. A hash depends only on what it is given: row r's token at response position t is the same
whichever batch, slot or GPU produced it. It needs no state, no host sync, and is safe inside a CUDA graph.

    draws = RowDraws(seed=(run_seed, step), row_keys=keys, positions=t)   # keys, t: [B] int64
    u = draws.uniform(TOKEN, 1)        # [B, 1] float64 in (0, 1)
    z = draws.normal(NOISE, d)         # [B, d] float32 standard normal
    key = draws.keys(NOISE)            # [B] int64: normal_from_keys(key, d) draws z again (training's replay)

The hash is splitmix64 (Steele, Lea, Flood 2014): a stream's state is the mix of (seed, stream, row key,
position), and its n outputs are mix64(state + i * golden) for i = 1..n, as splitmix64 itself steps.
"""

from dataclasses import dataclass
from functools import lru_cache

import torch

# Streams: one per kind of draw, so that the token, the mixing coin, the noise and the Gumbel perturbation of
# a step are independent: a strategy's draws never move the sampled token.
TOKEN, COIN, NOISE, GUMBEL, DIRICHLET, MULTIPLEX = 1, 2, 3, 4, 5, 6

MASK64 = (1 << 64) - 1


def _int64(value: int) -> int:
    """A 64-bit pattern as the signed int64 that torch stores."""
    value &= MASK64
    return value - (1 << 64) if value >> 63 else value


GOLDEN = _int64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: splitmix64's increment
MIX1, MIX2 = _int64(0xBF58476D1CE4E5B9), _int64(0x94D049BB133111EB)


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's >> is arithmetic: it copies the sign bit)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def mix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors; products wrap modulo 2^64 as the algorithm wants."""
    z = (z ^ _shift_right(z, 30)) * MIX1
    z = (z ^ _shift_right(z, 27)) * MIX2
    return z ^ _shift_right(z, 31)


@lru_cache(maxsize=64)
def seed_state(seed: int | tuple[int, ...]) -> int:
    """One 64-bit state from a seed or a tuple of ints (e.g. (run seed, step)), each folded in turn."""
    state = 0
    for part in (seed if isinstance(seed, tuple) else (seed,)):
        while True:  # every 64-bit word of a large int, low word first; at least one word
            word = torch.tensor(_int64(part & MASK64) ^ state)
            state = int(mix64(word + GOLDEN))
            part >>= 64
            if part in (0, -1):
                break
    return state


def bits_to_uniform(bits: torch.Tensor) -> torch.Tensor:
    """float64 uniforms from int64 bits: the top 52 bits k as (k + 0.5) / 2^52, so never 0 and never 1
    (the largest, 1 - 2^-53, is a float64) and fine-grained enough that -log U is exact in its tail."""
    return (_shift_right(bits, 12).double() + 0.5) * 2.0**-52


@dataclass
class RowDraws:
    """The draws of one decode step for B rows: row b's numbers depend on (seed, row_keys[b],
    positions[b]) and the stream, nothing else."""

    seed: int | tuple[int, ...] | torch.Tensor  # a tensor: seed_state(seed) already, [] int64 (a graph's buffer)
    row_keys: torch.Tensor  # [B] int64: each row's identity (e.g. its index among the step's rows)
    positions: torch.Tensor  # [B] int64: each row's response position (the decode step of that row)

    def __post_init__(self):
        self._seed_state = self.seed if torch.is_tensor(self.seed) else seed_state(self.seed)

    def keys(self, stream: int) -> torch.Tensor:
        """[B] int64: each row's key of `stream` at this step; its draws are functions of it alone."""
        if torch.is_tensor(self._seed_state):  # int64 addition wraps modulo 2^64, as _int64 does
            offset = self._seed_state + stream
        else:
            offset = _int64(self._seed_state + stream)
        state = mix64(self.row_keys * GOLDEN + offset)  # [B]
        return mix64(state ^ (self.positions * MIX1))

    def bits(self, stream: int, n: int) -> torch.Tensor:
        """[B, n] int64 random bits."""
        return bits_from_keys(self.keys(stream), n)

    def uniform(self, stream: int, n: int, start: int = 0) -> torch.Tensor:
        """[B, n] float64 in (0, 1): the stream's uniforms start + 1 .. start + n."""
        return bits_to_uniform(bits_from_keys(self.keys(stream), n, start))

    def normal(self, stream: int, n: int) -> torch.Tensor:
        """[B, n] float32 standard normal draws."""
        return normal_from_keys(self.keys(stream), n)


def step_uniforms(seed_state: torch.Tensor, row_keys: torch.Tensor,
                  positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two draws every decode step takes, [B] float64 each: the token's (TOKEN) and the mixing coin's (COIN),
    RowDraws(seed_state, row_keys, positions).uniform(stream, 1)[:, 0]. One function, so that torch.compile makes
    the ~80 small integer operations of their hashing one kernel (rollout.Decoder does on a GPU)."""
    draws = RowDraws(seed_state, row_keys, positions)
    return draws.uniform(TOKEN, 1)[:, 0], draws.uniform(COIN, 1)[:, 0]


def bits_from_keys(keys: torch.Tensor, n: int, start: int = 0) -> torch.Tensor:
    """[..., n] int64 random bits from keys [...]: splitmix64's outputs start + 1 .. start + n from each key."""
    index = torch.arange(start + 1, start + n + 1, device=keys.device) * GOLDEN  # [n]
    return mix64(keys[..., None] + index)


def normal_from_keys(keys: torch.Tensor, n: int) -> torch.Tensor:
    """[..., n] float32 standard normal draws from keys [...] (RowDraws.keys): Box-Muller over two uniforms
    per draw. A recorded key gives the same draws again, so training can replay a step's noise."""
    u = bits_to_uniform(bits_from_keys(keys, 2 * n))
    return ((-2.0 * u[..., :n].log()).sqrt() * torch.cos(2 * torch.pi * u[..., n:])).float()


GAMMA_TRIES = 8  # gamma_log_draws' proposals per draw: all 8 rejected with probability < 0.049^8 < 4e-11


def gamma_log_draws(draws: RowDraws, stream: int, concentration: torch.Tensor) -> torch.Tensor:
    """[B, n] float64: log g, g ~ Gamma(a, 1) for each a of concentration [B, n] (a >= 0; a = 0 gives -inf), from the
    row's uniforms of `stream` alone, a fixed count of them: Marsaglia and Tsang's method (ACM TOMS 2000) for
    Gamma(a + 1), times U^(1/a) (their boost, which torch's sampler uses for a < 1; here for every a, so that one
    formula holds). Element i of a row reads the uniforms at index j n + i (block j of n): j = 0 is U; the
    proposal r = 0 .. GAMMA_TRIES - 1 reads blocks 3r + 1, 3r + 2 (x = sqrt(-2 log u1) cos(2 pi u2), Box-Muller) and
    3r + 3 (u, the acceptance test). The first proposal accepted is kept; if none is, x = 0 (v = 1). In log space,
    so that a ~ 1e-9 (a token p gives ~0) underflows to no 0 / 0."""
    a = concentration.double()
    n = a.shape[-1]
    d = a + 1.0 - 1.0 / 3.0
    c = 1.0 / (9.0 * d).sqrt()
    v_kept = torch.ones_like(a)
    accepted = torch.zeros_like(a, dtype=torch.bool)
    for r in range(GAMMA_TRIES):
        u1, u2, u = (draws.uniform(stream, n, (3 * r + j) * n) for j in (1, 2, 3))
        x = (-2.0 * u1.log()).sqrt() * torch.cos(2 * torch.pi * u2)
        v = (1.0 + c * x) ** 3
        ok = (v > 0) & (u.log() < 0.5 * x * x + d - d * v + d * v.clamp_min(1e-300).log()) & ~accepted
        v_kept = torch.where(ok, v, v_kept)
        accepted |= ok
    return (d * v_kept).log() + draws.uniform(stream, n).log() / a
