"""research/plot.py: runs grouped over seeds by their configs, the band's numbers by hand, PNG files from small
metrics.jsonl files (skips without matplotlib), and without matplotlib one line that says what to install."""

import json
import struct
import sys
from pathlib import Path

import pytest

from research import plot


def make_run(path: Path, explore: str, seed: int, rewards: list[float], held_out: dict[int, float]) -> Path:
    path.mkdir(parents=True)
    config = {"explore": explore, "lr": 1e-6, "seed": seed, "out_dir": str(path)}
    (path / "config.json").write_text(json.dumps(config))
    lines = []
    for step, reward in enumerate(rewards, 1):
        record = {"step": step, "reward_mean": reward, "clip_frac_high": 0.01 * step,
                  "entropy": 1.0 - 0.1 * step}
        if step in held_out:
            record["held_out_accuracy"] = held_out[step]
            record["val/aime24/mean@4"] = held_out[step] / 2
        lines.append(json.dumps(record))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    summary = {"accuracy_before": 0.25, "val_before": {"val/aime24/mean@4": 0.1}}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


@pytest.fixture
def runs(tmp_path):
    return [make_run(tmp_path / "n0", "neighbor", 0, [0.1, 0.3, 0.5], {2: 0.4}),
            make_run(tmp_path / "n1", "neighbor", 1, [0.3, 0.5], {2: 0.6}),  # one step fewer
            make_run(tmp_path / "g0", "none", 0, [0.2, 0.2, 0.2], {2: 0.3})]


def test_runs_differing_only_in_seed_form_one_curve(runs):
    curves = plot.group_runs([plot.load_run(r) for r in runs])
    assert [label for label, _ in curves] == ["explore=neighbor (2 seeds)", "explore=none (1 seed)"]
    steps, mean, low, high = plot.curve(curves[0][1], "reward_mean")
    assert steps == [1, 2]  # only the steps both seeds logged
    assert mean == pytest.approx([0.2, 0.4]) and low == [0.1, 0.3] and high == [0.3, 0.5]
    steps, mean, _, _ = plot.curve(curves[0][1], "held_out_accuracy")
    assert steps == [0, 2] and mean == pytest.approx([0.25, 0.5])  # step 0: summary.json's accuracy_before
    steps, mean, _, _ = plot.curve(curves[0][1], "val/aime24/mean@4")
    assert steps == [0, 2] and mean == pytest.approx([0.1, 0.25])  # step 0: summary.json's val_before


@pytest.mark.extra
def test_pngs_are_written_for_the_logged_figures_only(runs, tmp_path):
    pytest.importorskip("matplotlib")
    written = plot.main([str(r) for r in runs] + ["--out", str(tmp_path / "plots")])
    assert sorted(p.name for p in written) == ["clipping.png", "entropy.png", "held_out.png", "reward.png",
                                               "validation.png"]
    for path in written:
        header = path.read_bytes()[:24]
        assert header[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", header[16:24])
        assert width > 300 and height > 200


@pytest.mark.extra
def test_a_directory_without_metrics_is_a_clear_error(tmp_path):
    pytest.importorskip("matplotlib")
    with pytest.raises(SystemExit, match="no metrics.jsonl"):
        plot.main([str(tmp_path), "--out", str(tmp_path / "plots")])


def test_without_matplotlib_one_line_says_what_to_install_and_nothing_is_written(runs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed: its import fails
    with pytest.raises(SystemExit) as stopped:
        plot.main([str(r) for r in runs] + ["--out", str(tmp_path / "plots")])
    assert stopped.value.code == "error: research.plot needs matplotlib: pip install matplotlib"
    assert not (tmp_path / "plots").exists()
