"""What every benchmark shares: where ../shared/data is, one JSON line per measurement, latency
summaries, the real model shapes and their transformers twins, peak memory, device syncs."""

import argparse
import ctypes
import json
import os
import resource
import signal
import statistics
import sys
from pathlib import Path

import torch

from engine.decoder import decoder_for
from model import TINY_CONFIG, resolve_device
from rollout import Exploration, Sampler, Sampling

# The repo root; bench.py there is the one entry (benchmarks that measure in a fresh process run it again).
ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench.py"
# ../shared/data beside the repo; NGRPO_SHARED_DATA points elsewhere (e.g. a copy carried to a GPU machine).
SHARED_DATA = Path(os.environ.get("NGRPO_SHARED_DATA") or ROOT.parent / "shared" / "data")
EVAL_DATA = SHARED_DATA / "eval"


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def latency_ms(seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    return {"median_ms": round(1000 * statistics.median(ordered), 3),
            "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3)}


SHAPES = {"1.5b": "tokenizers/DeepSeek-R1-Distill-Qwen-1.5B/config.json",
          "7b": "configs/DeepSeek-R1-Distill-Qwen-7B/config.json"}


def shape_config(shape: str):
    """The tiny preset's ModelConfig, or the path of a real architecture's config.json in ../shared."""
    if shape == "tiny":
        return TINY_CONFIG
    path = SHARED_DATA / SHAPES[shape]
    if not path.is_file():
        sys.exit(f"{path} not found: the {shape} shape needs ../shared/data")
    return path


def transformers_twin(model):
    """transformers' own model of the same architecture holding the same weights (the baseline)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = model.cfg.to_hf()
    config = AutoConfig.for_model(hf_config.pop("model_type"), **hf_config)
    weight = model.embed_tokens.weight
    twin = AutoModelForCausalLM.from_config(config).to(device=weight.device, dtype=weight.dtype).eval()
    state = {(k if k.startswith("lm_head") else "model." + k): v for k, v in model.state_dict().items()}
    twin.load_state_dict(state, strict=not model.cfg.tie_word_embeddings)
    return twin


def peak_mem_mb(device) -> float:
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # the process's peak RSS


def torch_dtype(device):
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rss_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def busy_decoder(model, slots: int, max_len: int, *, cuda_graph: bool, exploration=None):
    """(engine.decoder.Decoder, the key of its rollout.Sampler) with every slot holding a live row that never stops
    (plain sampling at temperature 1): what a decode-step measurement steps, `decoder.step(model, key, window)`.
    Set state.prompt_len / state.length to place the rows; each step advances length by one."""
    decoder = decoder_for(model, slots, max_len, cuda_graph)
    sampling, exploration = Sampling(max_new_tokens=max_len), exploration or Exploration()
    key = (sampling, exploration)
    sampler = decoder.start(model, key, lambda: Sampler(sampling, exploration, model.embed_tokens.weight))
    sampler.begin(0, None)
    rows = torch.arange(slots, device=decoder.device)
    decoder.state.fill(rows, rows, rows, torch.ones_like(rows))
    return decoder, key


def device_arg(value: str) -> str:
    """argparse type of --device: the name of a device this machine has, or one line saying what to pass instead."""
    try:
        resolve_device(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def _number(value: str, cast, kind: str, ok, must: str):
    """`value` as cast(value), or one argparse line: not a `kind`, or `must` when ok(number) fails."""
    try:
        number = cast(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a {kind}") from None
    if not ok(number):
        raise argparse.ArgumentTypeError(f"{number}: must {must}")
    return number


def at_least_1(value: str) -> int:
    """argparse type of a count (rows, steps, repeats, tokens, layers): an int of at least 1."""
    return _number(value, int, "whole number", lambda n: n >= 1, "be at least 1")


def at_least_0(value: str) -> int:
    """argparse type of a count where 0 means none (an adapter rank): an int of at least 0."""
    return _number(value, int, "whole number", lambda n: n >= 0, "be at least 0")


def above_0(value: str) -> float:
    """argparse type of a size or a time (GiB, seconds, a learning rate): a finite number above 0."""
    return _number(value, float, "number", lambda n: 0 < n < float("inf"), "be a finite number above 0")


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def dies_with_parent() -> None:
    """preexec_fn of a benchmark's inner process: on Linux it is killed when the benchmark dies, however it dies
    (kill -9 included), instead of running on alone; elsewhere nothing."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
