"""tracking.py: what is logged to TensorBoard reads back from the event file; W&B offline writes its run;
bad backend names are clear errors. Each backend's test skips when its package is absent."""

import math

import pytest

import tracking

STEPS = [{"step": 1, "reward_mean": 0.25, "div/distinct_1": 0.5, "skipped_minibatches": 0, "note": "text"},
         {"step": 2, "reward_mean": 0.5, "div/distinct_1": 0.4, "skipped_minibatches": 1, "kl": math.nan},
         {"step": 3, "reward_mean": 0.75, "div/distinct_1": 0.3, "skipped_minibatches": 0}]


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
