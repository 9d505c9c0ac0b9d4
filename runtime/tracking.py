"""Experiment tracking where users already look: TensorBoard and Weights & Biases (`--report-to`, TRL's name).

    tracker = Tracker("tensorboard,wandb", out_dir, config=asdict(cfg))
    tracker.log(metrics, step)            # every numeric field of a metrics.jsonl record
    tracker.log_completions(rows, step)   # completions as a table: [{"reward": 1.0, "completion": ...}]
    tracker.close()

metrics.jsonl stays the source of truth; trackers are mirrors. Each backend's package is imported only when it
is chosen (`pip install tensorboard` / `pip install wandb`). TensorBoard writes OUT/tensorboard/; W&B writes
under OUT/wandb/ and syncs to the W&B project $WANDB_PROJECT (default "ngrpo"), or stays on disk with
WANDB_MODE=offline (`wandb sync` uploads it later).
"""

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

BACKENDS = ("tensorboard", "wandb")


def parse_report_to(report_to: str | Sequence[str]) -> list[str]:
    """"tensorboard,wandb" -> ["tensorboard", "wandb"]; "", "none" -> []."""
    names = report_to.split(",") if isinstance(report_to, str) else list(report_to)
    names = [name.strip() for name in names if name.strip() and name.strip() != "none"]
    unknown = [name for name in names if name not in BACKENDS]
    if unknown:
        raise ValueError(f"report_to: unknown {', '.join(unknown)}; choose from {', '.join(BACKENDS)} "
                         "(or none)")
    return list(dict.fromkeys(names))


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
