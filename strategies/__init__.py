"""The exploration strategies, one method a file, and their registry: what a decode step feeds the model besides the
sampled token, and how training scores it.

Open neighbor.py first: N-GRPO's rule. Each other method has its own file, opening with how it departs from N-GRPO
and the source it follows:

    base.py        the contract (StepView, Mixture, Field, RECORD, Strategy, option), the mixing coin, none (GRPO)
    neighbor.py    neighbor: N-GRPO
    soft.py        soft: Soft Thinking (Cold Stop, Dirichlet noise); soft-gumbel: Randomized Soft Thinking
    gaussian.py    gaussian: STHT-style noisy mixtures
    released.py    topk, topk-gumbel, gaussian_embed_noise, orthogonal_noise: the released code's others
    mixinputs.py   mixinputs: Mixture of Inputs
    multiplex.py   multiplex: Multiplex Thinking
    soft_grpo.py   soft-grpo, soft-grpo-dirichlet, soft-grpo-gaussian: SofT-GRPO and its variants
    thinkrouter.py thinkrouter: ThinkRouter, Soft Thinking gated by confidence

A method is a module with STRATEGIES (name -> Strategy) and KNOBS (name -> option(...)). Each knob becomes a field
of `Exploration` and of config.Config and a flag of train.py and eval.py, under its one name (`num_neighbors`,
`--num-neighbors`); a flag the chosen method does not read is refused. To add a method, write its module and name
it in METHODS below. A method outside the repo is a module or a .py file named in the environment variable
NGRPO_STRATEGIES (comma-separated), loaded here beside these (import what it needs from strategies.base):

    NGRPO_STRATEGIES=my_method.py python train.py --explore mine --my-knob 2
"""

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, fields, make_dataclass
from pathlib import Path

from strategies import base, gaussian, mixinputs, multiplex, neighbor, released, soft, soft_grpo, thinkrouter
from strategies.base import RECORD, Field, Mixture, StepView, Strategy, mixed_embeddings, mixture_inputs, problems
from strategies.multiplex import multiplex_draws
from strategies.neighbor import candidate_table, neighbor_candidates
from strategies.soft_grpo import soft_grpo_logprob

__all__ = ["RECORD", "STRATEGIES", "Exploration", "Field", "Mixture", "StepView", "Strategy", "candidate_table",
           "mixed_embeddings", "mixture_inputs", "multiplex_draws", "neighbor_candidates", "record_fields", "register",
           "soft_grpo_logprob"]


def load_method(spec: str):
    """A method named in NGRPO_STRATEGIES: a path to a .py file, or an importable module's name."""
    if not spec.endswith(".py"):
        return importlib.import_module(spec)
    path = Path(spec).expanduser().resolve()
    if not path.is_file():
        raise ImportError(f"NGRPO_STRATEGIES names {spec}, which is not a file")
    found = importlib.util.spec_from_file_location(f"ngrpo_methods.{path.stem}", path)
    module = sys.modules[found.name] = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


METHODS = (base, neighbor, soft, gaussian, released, mixinputs, multiplex, soft_grpo, thinkrouter,
           *(load_method(s.strip()) for s in os.environ.get("NGRPO_STRATEGIES", "").split(",") if s.strip()))


def merged(table: str) -> dict:
    """Every method's STRATEGIES (or KNOBS) as one dict; a name two methods declare is an error."""
    out = {}
    for module in METHODS:
        for name, value in getattr(module, table, {}).items():
            if name in out:
                raise ValueError(f"{module.__name__} declares {table} {name!r}, which another method declares too")
            out[name] = value
    return out


# --explore NAME -> its strategy; knob name -> its declaration (the options a strategy reads, by name).
STRATEGIES: dict[str, Strategy] = merged("STRATEGIES")
KNOBS = merged("KNOBS")


def register(name: str, strategy: Strategy) -> None:
    """Makes `strategy` available as Exploration(name) (a new name, or a replacement). Its knobs must be declared
    already: flags and config fields are made when this package loads (a method with knobs of its own is a module
    named in NGRPO_STRATEGIES)."""
    undeclared = [knob for knob in strategy.reads if knob not in KNOBS]
    if undeclared:
        raise ValueError(f"strategy {name!r} reads {', '.join(undeclared)}, which no method declares: a method with "
                         "knobs of its own is a module named in NGRPO_STRATEGIES, with KNOBS beside STRATEGIES")
    STRATEGIES[name] = strategy


for _name, _strategy in STRATEGIES.items():
    register(_name, _strategy)  # checks that every knob a strategy reads is declared

# Every method's knobs as fields: the base of Exploration and of config.Config (a keyword-only argument each).
Knobs = make_dataclass("Knobs", [(name, type(declared.default), declared) for name, declared in KNOBS.items()],
                       frozen=True, kw_only=True)
Knobs.__module__, Knobs.__doc__ = __name__, "Every method's knobs (strategies.KNOBS), one field each."


@dataclass(frozen=True)
class Exploration(Knobs):
    """One run's exploration: the strategy (a key of STRATEGIES), the token that ends thinking (stop_mixing_id:
    no mixing at or after the step that samples it; None = never), and the strategy's knobs by name. A knob the
    strategy does not read keeps its default: another value is refused.

    Exploration("neighbor", mix_rate=0.1, num_neighbors=2, stop_mixing_id=think_end)"""

    strategy: str = "none"
    stop_mixing_id: int | None = None

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"exploration strategy must be one of {', '.join(STRATEGIES)}, not {self.strategy!r}")
        wrong = [f"{name} {getattr(self, name)!r} {message}" for name, message in problems(self)]
        reads = STRATEGIES[self.strategy].reads
        wrong += [f"{f.name} is not read by the {self.strategy} strategy" for f in fields(Knobs)
                  if f.name not in reads and getattr(self, f.name) != f.default]
        if "early_stopping_entropy_threshold" in reads and self.early_stopping_entropy_threshold > 0 \
                and self.stop_mixing_id is None:
            wrong.append("Cold Stop forces stop_mixing_id (</think>): it needs one")
        if wrong:
            raise ValueError(f"Exploration: {'; '.join(wrong)}")

    @classmethod
    def of(cls, strategy: str, stop_mixing_id: int | None = None, **knobs) -> "Exploration":
        """The Exploration of `strategy` with those of `knobs` it reads (settings shared by several strategies: a
        sweep's, a Config's), the others left at their defaults."""
        reads = STRATEGIES[strategy].reads if strategy in STRATEGIES else ()
        return cls(strategy, stop_mixing_id, **{name: value for name, value in knobs.items() if name in reads})

    @property
    def num_candidates(self) -> int:
        return STRATEGIES[self.strategy].candidates(self)


def record_fields(strategy: str) -> tuple[Field, ...]:
    """Everything a step of `strategy` records: RECORD and the strategy's own fields."""
    return RECORD + STRATEGIES[strategy].record
