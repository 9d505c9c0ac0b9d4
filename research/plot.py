"""Training curves of one or several runs, one PNG per figure, from their metrics.jsonl (matplotlib needed).

    python -m research.plot runs/sweeps/demo-tiny/*/seed-* --out plots/

Runs whose config.json agree on everything but the seed (and out_dir, resume, overwrite) are one curve: the
mean over those seeds, with a band from the lowest to the highest seed. A curve is labelled by the config
fields in which the curves differ (e.g. `explore=none`), or by the run directory when there is no config.json.
A figure's panels are the metrics of FIGURES that some run logged ("val/*": every key that starts with
"val/", the validation on --val-data); a figure with none is not written.
"""

import argparse
import json
import math
import sys
from pathlib import Path

# file name -> (title, metrics.jsonl keys, one panel each)
FIGURES = {
    "reward": ("Reward and accuracy of the training rollouts", ["reward_mean", "accuracy"]),
    "held_out": ("Held-out accuracy (greedy; step 0 = before RL)", ["held_out_accuracy"]),
    "validation": ("Validation on --val-data (eval.py's protocol; step 0 = before RL)", ["val/*"]),
    "response_length": ("Response length (tokens)", ["response_len_mean", "truncated_frac"]),
    "entropy": ("Token entropy of the policy: every response token, the mixed steps", ["entropy", "mixed_entropy"]),
    "kl": ("k3 KL to the reference model", ["kl"]),
    "clipping": ("Fraction of tokens clipped", ["clip_frac_high", "clip_frac_low", "dual_clip_frac"]),
    "mixing": ("Mixing", ["mix_rate", "mix_distance", "mix_cosine"]),
    "thinking": ("Thinking and answering (R1's </think>; docs/experiments.md)",
                 ["think/len_mean", "think/answer_len_mean", "think/closed", "think/mixed_frac", "think/answer_mixed",
                  "think/cold_stop_ends", "think/correct_per_1k"]),
    "diversity": ("Group diversity (docs/experiments.md)",
                  ["div/distinct_answers", "div/mixed_groups", "div/distinct_1", "div/distinct_2",
                   "div/distinct_3", "div/distinct_4"]),
}
NOT_A_SETTING = {"seed", "out_dir", "resume", "overwrite", "preset"}


def load_run(run_dir: Path) -> dict:
    """{"dir", "config" (or None), "history": step -> metrics}; what summary.json holds from before RL
    (accuracy_before, val_before) becomes step 0's held_out_accuracy and val/... values."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (pass train.py --out-dir directories)")
    history = {}
    for line_no, line in enumerate(path.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
            history[int(record["step"])] = record
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise ValueError(f"{path}:{line_no}: not a metrics record") from None
    summary = run_dir / "summary.json"
    before = json.loads(summary.read_text()) if summary.is_file() else {}
    at_start = dict(before.get("val_before") or {})
    if before.get("accuracy_before") is not None:
        at_start["held_out_accuracy"] = before["accuracy_before"]
    if at_start:
        history.setdefault(0, {"step": 0}).update(at_start)
    config = run_dir / "config.json"
    return {"dir": run_dir, "config": json.loads(config.read_text()) if config.is_file() else None,
            "history": history}


def group_runs(runs: list[dict]) -> list[tuple[str, list[dict]]]:
    """(label, runs) per curve: runs with equal configs apart from NOT_A_SETTING share one."""
    groups: dict[str, list[dict]] = {}
    for run in runs:
        setting = {k: v for k, v in (run["config"] or {}).items() if k not in NOT_A_SETTING}
        groups.setdefault(json.dumps(setting, sort_keys=True) if setting else str(run["dir"]), []).append(run)
    settings = [json.loads(key) if key.startswith("{") else None for key in groups]
    known = [s for s in settings if s]
    differing = sorted({k for s in known for k in s if any(o.get(k) != s[k] for o in known)})
    curves = []
    for setting, members in zip(settings, groups.values()):
        if setting and differing:
            label = ", ".join(f"{k}={setting.get(k)}" for k in differing)
        else:
            label = str(members[0]["dir"]) if len(members) == 1 else str(members[0]["dir"].parent)
        seeds = {(m["config"] or {}).get("seed") for m in members}
        count = (f"{len(seeds)} seed{'s' * (len(seeds) > 1)}" if len(seeds) == len(members)
                 else f"{len(members)} runs, {len(seeds)} seed{'s' * (len(seeds) > 1)}")  # runs of one seed: repeats
        curves.append((f"{label} ({count})", members))
    return curves


def curve(members: list[dict], key: str) -> tuple[list[int], list[float], list[float], list[float]]:
    """(steps, mean, low, high) over the steps where every member logged `key`."""
    steps = sorted(set.intersection(*[{s for s, m in run["history"].items() if key in m} for run in members]))
    values = [[float(run["history"][s][key]) for run in members] for s in steps]
    return steps, [sum(v) / len(v) for v in values], [min(v) for v in values], [max(v) for v in values]


def expand(patterns: list[str], logged: list[str]) -> list[str]:
    """Figure keys: a pattern ending in * stands for every logged key that starts with the rest."""
    keys = []
    for pattern in patterns:
        keys += [k for k in logged if k.startswith(pattern[:-1])] if pattern.endswith("*") else [pattern]
    return keys


def plot_runs(run_dirs: list[Path], out_dir: Path) -> list[Path]:
    """Writes OUT/<figure>.png for each figure of FIGURES with data; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    curves = group_runs([load_run(Path(d)) for d in run_dirs])
    out_dir.mkdir(parents=True, exist_ok=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    written = []
    logged = sorted({key for _, members in curves for run in members
                     for record in run["history"].values() for key in record})
    for name, (title, patterns) in FIGURES.items():
        present = [k for k in expand(patterns, logged) if any(curve(members, k)[0] for _, members in curves)]
        if not present:
            continue
        columns = min(3, len(present))
        rows = math.ceil(len(present) / columns)
        size = (max(5.2 * columns, 7.0), 3.6 * rows + 1.0)
        figure, axes = plt.subplots(rows, columns, figsize=size, squeeze=False)
        for axis in axes.flat[len(present):]:
            axis.set_visible(False)
        for axis, key in zip(axes.flat, present):
            for index, (label, members) in enumerate(curves):
                steps, mean, low, high = curve(members, key)
                color = colors[index % len(colors)]
                marker = "o" if len(steps) < 12 else None  # a few points: show where they are
                axis.plot(steps, mean, color=color, label=label, marker=marker, ms=3)
                if len(members) > 1:
                    axis.fill_between(steps, low, high, color=color, alpha=0.2, linewidth=0)
            axis.set_xlabel("step")
            axis.set_ylabel(key)
            axis.grid(alpha=0.3)
        handles, labels = axes.flat[0].get_legend_handles_labels()
        several = any(len(members) > 1 for _, members in curves)
        band = "\nline: mean over seeds; band: lowest to highest seed" if several else ""
        figure.suptitle(title + band, fontsize="medium")
        figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 3), fontsize="small",
                      frameon=False)
        figure.tight_layout(rect=(0, 0.06 + 0.03 * math.ceil(len(labels) / 3), 1, 1))
        path = out_dir / f"{name}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written


def plot_gain_by_entropy(points: list[tuple[str, float, float, float, float]], label: str, path: Path) -> Path:
    """One figure: each method's gain (its interval as a bar) against the mean entropy of the steps it mixed;
    points are (method, entropy, gain, low, high). research.experiments draws it under a sweep's table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7.5, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (method, entropy, gain, low, high) in enumerate(points):
        axis.errorbar([entropy], [gain], yerr=[[gain - low], [high - gain]], fmt="o", capsize=3,
                      color=colors[index % len(colors)], label=method)
    axis.axhline(0.0, color="grey", linewidth=0.8)
    axis.set_xlabel("mean entropy of the mixed steps (nats)")
    axis.set_ylabel(label)
    axis.grid(alpha=0.3)
    axis.legend(fontsize="x-small", loc="best")
    figure.suptitle("Gain against the entropy of what each method mixed\n(bar: 95% paired bootstrap interval)",
                    fontsize="medium")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def main(argv=None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="train.py --out-dir directories (each with metrics.jsonl)")
    parser.add_argument("--out", default="plots", help="directory for the PNG files")
    args = parser.parse_args(argv)
    try:
        import matplotlib  # noqa: F401  (an optional dependency: say so before reading anything)
    except ImportError:
        sys.exit("error: research.plot needs matplotlib: pip install matplotlib")
    try:
        written = plot_runs([Path(r) for r in args.runs], Path(args.out))
    except (OSError, ValueError) as error:
        sys.exit(f"error: {error}")
    print("\n".join(map(str, written)))
    return written


if __name__ == "__main__":
    main()
