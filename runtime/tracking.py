"""Experiment tracking where users already look: TensorBoard and Weights & Biases (`--report-to`, TRL's name), and
progress bars that also speak in a log file (`progress`), and a long evaluation's time to go, told once (`Pace`).

    tracker = Tracker("tensorboard,wandb", out_dir, config=asdict(cfg))
    tracker.log(metrics, step)            # every numeric field of a metrics.jsonl record
    tracker.log_completions(rows, step)   # completions as a table: [{"reward": 1.0, "completion": ...}]
    tracker.close()

metrics.jsonl stays the source of truth; trackers are mirrors. Each backend's package is imported only when it
is chosen (`pip install tensorboard` / `pip install wandb`). TensorBoard writes OUT/tensorboard/; W&B writes
under OUT/wandb/ and syncs to the W&B project $WANDB_PROJECT (default "ngrpo"), or stays on disk with
WANDB_MODE=offline (`wandb sync` uploads it later).
"""

import importlib.util
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

BACKENDS = ("tensorboard", "wandb")
# Where a progress bar cannot redraw itself (a log file, a pipe), it writes a line at most this often.
LOG_EVERY_S = 15.0


class _Lines:
    """tqdm's stream where it cannot redraw its line: each state it draws becomes a line of its own, at most one
    every LOG_EVERY_S seconds (a state drawn sooner waits; `finish` writes the last one)."""

    def __init__(self, stream):
        self.stream, self.pending, self.written, self.last_s = stream, "", "", time.monotonic()

    def write(self, text: str) -> None:
        text = text.replace("\r", "").strip()
        self.pending = text or self.pending
        if time.monotonic() - self.last_s >= LOG_EVERY_S:
            self.finish()

    def finish(self) -> None:
        """Writes the state drawn last unless a line already said as much (the same count before the timings)."""
        if self.pending and self.pending.split("[")[0] != self.written.split("[")[0]:
            self.stream.write(self.pending + "\n")
            self.written, self.last_s = self.pending, time.monotonic()

    def flush(self) -> None:
        self.stream.flush()


class _LogBar(tqdm):
    """tqdm writing to _Lines: its last state is written when it closes."""

    def __init__(self, iterable=None, *, file: _Lines, **kwargs):
        self.lines = file  # tqdm wraps its file in its own class
        super().__init__(iterable, file=file, **kwargs)

    def close(self) -> None:
        super().close()
        self.lines.finish()


def progress(iterable=None, *, disable: bool | None = None, file=None, **kwargs) -> tqdm:
    """A tqdm bar (same arguments) that also speaks where it cannot draw: on a terminal it is tqdm's; in a log
    file or a pipe, where tqdm says nothing, it writes a plain line every LOG_EVERY_S seconds and its last
    state when it ends. disable=True silences it (another rank, a caller's choice)."""
    file = file or sys.stderr
    if disable or (hasattr(file, "isatty") and file.isatty()):
        return tqdm(iterable, disable=bool(disable), file=file, **kwargs)
    kwargs.update(leave=True, mininterval=min(kwargs.get("mininterval", LOG_EVERY_S), LOG_EVERY_S), ascii=True)
    return _LogBar(iterable, file=_Lines(file), ncols=100, **kwargs)


def parse_report_to(report_to: str | Sequence[str]) -> list[str]:
    """"tensorboard,wandb" -> ["tensorboard", "wandb"]; "", "none" -> []."""
    names = report_to.split(",") if isinstance(report_to, str) else list(report_to)
    names = [name.strip() for name in names if name.strip() and name.strip() != "none"]
    unknown = [name for name in names if name not in BACKENDS]
    if unknown:
        raise ValueError(f"report_to: unknown {', '.join(unknown)}; choose from {', '.join(BACKENDS)} "
                         "(or none)")
    return list(dict.fromkeys(names))


def check_report_to(report_to: str | Sequence[str]) -> None:
    """Raises what Tracker would for these backends (an unknown name, a package not installed), writing nothing."""
    for name in parse_report_to(report_to):
        package = {"tensorboard": "tensorboard", "wandb": "wandb"}[name]
        if importlib.util.find_spec(package) is None:
            raise ImportError(f"--report-to {name} needs the {package} package: pip install {package}")


def numeric(metrics: dict) -> dict[str, float]:
    """The fields a chart can show: finite numbers (bools as 0 / 1)."""
    return {key: float(value) for key, value in metrics.items()
            if isinstance(value, (int, float)) and math.isfinite(value) and key != "step"}


def markdown_table(rows: list[dict]) -> str:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    cell = lambda value: str(value).replace("|", "\\|").replace("\n", "<br>")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def step_line(m: dict) -> str:
    """The console line of a step's metrics (train.py prints it after each step)."""
    parts = [f"step {m['step']}", f"reward {m['reward_mean']:.3f}", f"loss {m.get('loss', float('nan')):+.4f}",
             f"len {m['response_len_mean']:.0f}", f"mix {m['mix_rate']:.3f}", f"ent {m.get('entropy', 0.0):.2f}",
             f"gn {m.get('grad_norm', 0.0):.2f}", f"{m['step_s']:.1f}s"]
    if "kl" in m:
        parts.insert(3, f"kl {m['kl']:.4f}")
    if "held_out_accuracy" in m:
        parts.append(f"held-out {m['held_out_accuracy']:.3f}")
    parts += [f"{key[4:]} {value:.3f}" for key, value in m.items() if key.startswith("val/") and "/mean@" in key]
    return " | ".join(parts)


class Tracker:
    """Mirrors a run's metrics, config and sampled completions to the chosen backends."""

    def __init__(self, report_to: str | Sequence[str], out_dir, config: dict | None = None, *,
                 run_name: str | None = None):
        self.backends = parse_report_to(report_to)
        out_dir = Path(out_dir)
        self.tensorboard = self.wandb_run = None
        if "tensorboard" in self.backends:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ImportError("--report-to tensorboard needs the tensorboard package: "
                                  "pip install tensorboard") from None
            self.tensorboard = SummaryWriter(log_dir=str(out_dir / "tensorboard"))
            if config:
                self.tensorboard.add_text("config", markdown_table([{"field": k, "value": json.dumps(v)}
                                                                    for k, v in config.items()]), 0)
        if "wandb" in self.backends:
            try:
                import wandb
            except ImportError:
                raise ImportError("--report-to wandb needs the wandb package: pip install wandb") from None
            out_dir.mkdir(parents=True, exist_ok=True)
            self.wandb_run = wandb.init(project=os.environ.get("WANDB_PROJECT", "ngrpo"), dir=str(out_dir),
                                        name=run_name or out_dir.name, config=config or {})

    def log(self, metrics: dict, step: int) -> None:
        values = numeric(metrics)
        if self.tensorboard is not None:
            for key, value in values.items():
                self.tensorboard.add_scalar(key, value, step)
        if self.wandb_run is not None:
            self.wandb_run.log(values, step=step)

    def log_completions(self, rows: list[dict], step: int) -> None:
        """rows: one dict per completion (e.g. prompt, completion, answer, reward), shown as a table."""
        if not rows:
            return
        if self.tensorboard is not None:
            self.tensorboard.add_text("completions", markdown_table(rows), step)
        if self.wandb_run is not None:
            import wandb

            columns = list(dict.fromkeys(key for row in rows for key in row))
            table = wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])
            self.wandb_run.log({"completions": table}, step=step)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# ----------------------------------------------------------------------------- summary.json

END_OF_RUN = ("accuracy_after", "steps", "reward_first", "final_reward_mean")  # what a run's end adds to its summary


def read_summary(out_dir: Path) -> dict:
    """The summary.json an earlier start of a run wrote ({} if none, or one that does not parse)."""
    try:
        summary = json.loads((Path(out_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def write_summary(out_dir: Path, summary: dict) -> None:
    """OUT/summary.json, written aside and renamed: what the run has found so far."""
    tmp = Path(out_dir) / ".summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, Path(out_dir) / "summary.json")


@dataclass
class Pace:
    """How long the whole evaluation will take, told once (a --n of 100,000 would otherwise run for hours without
    a word), when that is a minute or more: at the mean pace of the batches after the first (its warm-up is not
    the pace), once 3 of them and 5 s or a tenth of the batches have run. One batch is no pace: a row that runs
    to --max-new-tokens makes its batch many times as long as the others."""

    rounds: int  # this rank's batches of the whole evaluation
    samples: int
    told: bool  # or not to be told (another rank, a validation)
    start_s: float = field(default_factory=lambda: time.perf_counter())
    done: int = 0
    timed: int = 0
    timed_s: float = 0.0
    warmed_up: bool = False

    def batch_done(self, seconds: float, *, generated: bool) -> None:
        self.done += 1
        if not generated:  # a batch --resume had already done, or another rank's last round
            return
        if not self.warmed_up:
            self.warmed_up = True
            return
        self.timed, self.timed_s = self.timed + 1, self.timed_s + seconds
        if self.told or self.timed < 3 or (self.timed_s < 5 and self.timed < self.rounds / 10):
            return
        self.told = True
        elapsed_s = time.perf_counter() - self.start_s
        left_s = self.timed_s / self.timed * (self.rounds - self.done)
        if elapsed_s + left_s >= 60:
            print(f"eval: {self.samples} samples in {self.rounds} batches, {self.done} done in {duration(elapsed_s)}; "
                  f"at {self.timed_s / self.timed:.2f} s a batch about {duration(left_s)} to go, "
                  f"{duration(elapsed_s + left_s)} in all (lower --n or --limit to shorten it)",
                  file=sys.stderr, flush=True)


def duration(seconds: float) -> str:
    """74 -> '1 min 14 s', 7200 -> '2.0 h'."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s" if seconds >= 60 else f"{seconds:.0f} s"
