"""runtime/tracking.py: what is logged to TensorBoard reads back from the event file; W&B offline writes its run;
bad backend names are clear errors. Each backend's test skips when its package is absent."""

import math

import pytest

from runtime import tracking

STEPS = [{"step": 1, "reward_mean": 0.25, "div/distinct_1": 0.5, "skipped_minibatches": 0, "note": "text"},
         {"step": 2, "reward_mean": 0.5, "div/distinct_1": 0.4, "skipped_minibatches": 1, "kl": math.nan},
         {"step": 3, "reward_mean": 0.75, "div/distinct_1": 0.3, "skipped_minibatches": 0}]


@pytest.mark.extra
def test_tensorboard_event_file_reads_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = {"mix_rate": 0.1, "explore": "neighbor"}
    with tracking.Tracker("tensorboard", tmp_path, config=config) as tracker:
        for record in STEPS:
            tracker.log(record, record["step"])
        tracker.log_completions([{"reward": 1.0, "completion": "so \\boxed{4}"}], step=3)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = events.Tags()["scalars"]
    # Numbers only: no text, no NaN, no step.
    assert set(scalars) == {"reward_mean", "div/distinct_1", "skipped_minibatches"}
    assert [(e.step, e.value) for e in events.Scalars("reward_mean")] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert [e.value for e in events.Scalars("div/distinct_1")] == pytest.approx([0.5, 0.4, 0.3])
    texts = {tag: events.Tensors(tag) for tag in events.Tags()["tensors"]}
    completions = texts["completions/text_summary"][0]
    assert completions.step == 3 and b"\\boxed{4}" in completions.tensor_proto.string_val[0]
    assert b"mix_rate" in texts["config/text_summary"][0].tensor_proto.string_val[0]


@pytest.mark.extra
def test_wandb_offline_run_is_written(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    with tracking.Tracker("wandb", tmp_path, config={"mix_rate": 0.1}, run_name="t") as tracker:
        for record in STEPS:
            tracker.log(record, record["step"])
        tracker.log_completions([{"reward": 1.0, "completion": "so \\boxed{4}"}], step=3)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_report_to_names():
    assert tracking.parse_report_to("tensorboard, wandb") == ["tensorboard", "wandb"]
    assert tracking.parse_report_to("none") == [] and tracking.parse_report_to("") == []
    with pytest.raises(ValueError, match="unknown mlflow"):
        tracking.parse_report_to("mlflow")


@pytest.mark.extra
def test_a_tiny_training_run_reports_to_tensorboard(tmp_path):
    """train.py --report-to tensorboard: every step's metrics.jsonl numbers are in the event file."""
    pytest.importorskip("tensorboard")
    import json
    from dataclasses import replace

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import train
    from config import preset

    cfg = replace(preset("tiny"), out_dir=str(tmp_path / "run"), max_steps=2, prompts_per_step=4,
                  mini_batch_prompts=4, max_new_tokens=8, report_to="tensorboard", log_completions_every=1)
    train.run(cfg)
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for key in ("reward_mean", "loss", "mix_rate", "div/distinct_answers", "div/mixed_groups"):
        scalars = events.Scalars(key)  # stored as float32
        assert [e.step for e in scalars] == [m["step"] for m in logged], key
        assert [e.value for e in scalars] == pytest.approx([m[key] for m in logged], rel=1e-6, abs=1e-7), key
    assert "completions/text_summary" in events.Tags()["tensors"]
