"""What keeps a training run going, beside the algorithm: processes under torchrun and FSDP2 (`distributed`),
checkpoints and their manifests (`checkpoint`), the out-dir lock and the signals (`guard`), the memory plan
(`plan`, `train.py --plan`), metrics trackers (`tracking`, `--report-to`) and the demo's supervised warm start
(`warmstart`)."""
