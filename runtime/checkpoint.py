"""Checkpoints on disk: writing one (weights in the Hugging Face layout, AdamW state, RNG, data cursor, the
neighbor table; into a temporary directory renamed at the end), the metrics kept to a resumed step, and
whether a checkpoint is the one that was written: a manifest of every file's size and SHA-256,
written last (just before the directory is renamed to step-N), and the check --resume runs before using one; and
what a run may do with its --out-dir before any work (`claim_out_dir`: continue it, start over, or refuse).

A kill -9 mid-write never leaves a step-N (the rename is the commit), but a disk can still truncate or lose a
file afterwards (a full disk, a copy cut short, a user's rm). Then --resume falls back to the newest checkpoint
that checks out, and says which it skipped and why:

    write_manifest(tmp)                      # after every other file of the checkpoint is written
    found, skipped = newest_intact(checkpoint_dirs(out_dir))   # skipped: ["step-3: optimizer.pt has 12 ..."]

Hashing reads the checkpoint once more when it is written and once when it is resumed (1.5B: ~21 GB of
weights and AdamW state), in blocks hashed on every core (`tree_digests`); sizes are compared first, so a
truncated file is found without hashing anything.
"""

import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import SafetensorError

from config import REPLACES_ITS_OWN_OUTPUT, RUN_CONTROL_FIELDS, Config
from model import save_model
from runtime import distributed, lora
from runtime.guard import RUN_OUTPUTS, Refused, RunError, follow_umask, reason

MANIFEST = "manifest.json"
# What a checkpoint written before manifests existed must hold (checked by presence and size only).
REQUIRED = ("trainer_state.pt", "optimizer.pt", "config.json.run")


# Files are hashed in blocks, all blocks of a checkpoint in parallel threads (reads and hashlib release the
# GIL): one SHA-256 stream runs at ~1 GB/s on one core, ~20 s for a 1.5B checkpoint and ~90 s for a 7B, each
# write and each resume. A file's digest is the SHA-256 of its blocks' SHA-256 digests, concatenated in order.
BLOCK_BYTES = 64 << 20
READ_BYTES = 16 << 20  # what one thread holds at a time


def _block_digest(path: Path, start: int, size: int) -> bytes:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for offset in range(start, start + size, READ_BYTES):
            digest.update(os.pread(f.fileno(), min(READ_BYTES, start + size - offset), offset))
    return digest.digest()


def tree_digests(paths: list[Path], block_bytes: int = BLOCK_BYTES) -> list[str]:
    """Each file's SHA-256 over its blocks' SHA-256 digests, every block of every file hashed in a thread pool."""
    from concurrent.futures import ThreadPoolExecutor

    sizes = [p.stat().st_size for p in paths]
    jobs = [(i, start, min(block_bytes, size - start)) for i, size in enumerate(sizes)
            for start in range(0, size, block_bytes)]
    with ThreadPoolExecutor(max_workers=min(32, os.cpu_count() or 1)) as pool:
        blocks = list(pool.map(lambda job: _block_digest(paths[job[0]], job[1], job[2]), jobs))
    joined = [b"" for _ in paths]
    for (i, _, _), block in zip(jobs, blocks):
        joined[i] += block
    return [hashlib.sha256(j).hexdigest() for j in joined]


def sha256_of(path: Path) -> str:
    """The whole file's SHA-256 (one stream): how manifests written before tree digests record a file."""
    return _block_digest(path, 0, path.stat().st_size).hex()


def write_manifest(directory: Path) -> None:
    """OUT/checkpoints/.step-N-*/manifest.json: {relative path: {"bytes": size, "sha256_tree": hex, "block_bytes":
    BLOCK_BYTES}} of every file (see tree_digests)."""
    files = sorted(p for p in Path(directory).rglob("*") if p.is_file() and p.name != MANIFEST)
    record = {str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256_tree": digest,
                                              "block_bytes": BLOCK_BYTES}
              for p, digest in zip(files, tree_digests(files, BLOCK_BYTES))}
    (Path(directory) / MANIFEST).write_text(json.dumps(record, indent=1) + "\n")


def damage(directory: Path) -> str | None:
    """Why the checkpoint in `directory` cannot be trusted, in a few words; None when it is intact."""
    manifest = Path(directory) / MANIFEST
    if not manifest.is_file():  # written before manifests: the files must at least be there, not empty
        needed = [*REQUIRED, next((p.name for p in Path(directory).glob("*.safetensors")), "model.safetensors")]
        for name in needed:
            if not (Path(directory) / name).is_file() or not (Path(directory) / name).stat().st_size:
                return f"{name} is missing or empty"
        return None
    try:
        record = json.loads(manifest.read_text())
        sizes = {name: int(entry["bytes"]) for name, entry in record.items()}
    except (ValueError, KeyError, TypeError, AttributeError, OSError):
        return f"{MANIFEST} is unreadable"
    for name, size in sizes.items():
        path = Path(directory) / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} were written"
    try:
        changed = first_changed(Path(directory), record)
    except (KeyError, TypeError, ValueError):
        return f"{MANIFEST} is unreadable"
    return None if changed is None else f"{changed} is not what was written (its SHA-256 differs)"


def first_changed(directory: Path, record: dict) -> str | None:
    """The first file of the manifest `record` whose digest is not the recorded one: block digests (hashed in
    parallel, per block size) or, in a manifest from before them, one whole-file SHA-256."""
    trees = {name: int(entry["block_bytes"]) for name, entry in record.items() if "sha256_tree" in entry}
    if any(block_bytes <= 0 for block_bytes in trees.values()):
        raise ValueError("block_bytes must be positive")
    found = {}
    for block_bytes in set(trees.values()):  # one size in every manifest this code writes
        names = [name for name, size in trees.items() if size == block_bytes]
        found.update(zip(names, tree_digests([directory / name for name in names], block_bytes)))
    for name, entry in record.items():
        digest = found[name] if name in trees else sha256_of(directory / name)
        if digest != entry["sha256_tree" if name in trees else "sha256"]:
            return name
    return None


def newest_intact(checkpoints: list[Path]) -> tuple[Path | None, list[str]]:
    """(the newest of `checkpoints` (oldest first) that is intact or None, ["step-N: why", ...] of the newer
    ones skipped)."""
    skipped = []
    for directory in reversed(checkpoints):
        reason = damage(directory)
        if reason is None:
            return directory, skipped
        skipped.append(f"{directory.name}: {reason}")
    return None, skipped


# ----------------------------------------------------------------------------- writing one


# What train.py writes in its --out-dir (beside the lock): a new run there that starts over (--overwrite, or a
# preset replacing its own output) removes all of it, so that nothing of the earlier run is left beside the new
# one's (its completions, its warm start, a --resume picking up its checkpoints). Anything else stays.
def run_outputs(out_dir: Path) -> list[str]:
    """The names in RUN_OUTPUTS that out_dir holds, and what keep_if_best leaves when killed: an earlier run's."""
    return [name for name in RUN_OUTPUTS if (Path(out_dir) / name).exists()] + \
        sorted(p.name for p in Path(out_dir).glob(".best-*"))


def clear_run(out_dir: Path) -> list[str]:
    """Removes an earlier run's outputs (RUN_OUTPUTS) from out_dir; returns the names removed."""
    removed = run_outputs(out_dir)
    for name in removed:
        path = Path(out_dir) / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    return removed


def checkpoint_dirs(out_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a directory is complete once renamed to step-N)."""
    found = [d for d in (out_dir / "checkpoints").glob("step-*") if d.is_dir() and d.name[5:].isdigit()]
    return sorted(found, key=lambda d: int(d.name[5:]))


def save_weights(r, out_dir: Path) -> None:
    """The policy in the Hugging Face layout, gathered one parameter at a time and written by rank 0; with adapters
    (--lora-rank) the adapters alone, in PEFT's format, and the tokenizer (runtime/lora.py)."""
    if lora.has_adapters(r.policy):
        lora.save_adapters(r.policy, out_dir, r.tokenizer, world=r.world)
        if r.world.is_main:
            follow_umask(out_dir)  # safetensors writes 0600
        return
    state = distributed.gather_state_dict(r.policy, r.world)
    if r.world.is_main:
        save_model(distributed.model_from_state(r.policy, state), out_dir, r.tokenizer)
        follow_umask(out_dir)  # safetensors writes the weights 0600


def save_checkpoint(r, step: int) -> None:
    """HF-layout weights (or --lora-rank's adapters) plus optimizer, RNG, data cursor and the neighbor table in
    use of the run `r` (train.Run), written to a temporary directory and renamed: a crash mid-write leaves the
    previous checkpoints as they were.

    Under torchrun the weights and AdamW state are gathered to rank 0, which alone writes, in the same
    files as one process: a checkpoint resumes under any number of processes. The AdamW state is keyed by
    parameter name (optimizer.pt); gathering it costs rank 0 host memory of twice the fp32 weights (7B:
    61 GB), which an 8-GPU node has; torch.distributed.checkpoint would shard the files instead."""
    if r.world.is_main:
        root = r.out_dir / "checkpoints"
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".step-*"):  # what a killed run was writing
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".step-{step}-", dir=root))
    else:
        tmp = None
    try:
        save_weights(r, tmp)
        optimizer_state = distributed.optimizer_state(r.trainer, r.optimizer, r.world)
        if r.world.is_main:
            torch.save(optimizer_state, tmp / "optimizer.pt")
            torch.save({"step": step, "batcher": r.batcher.state_dict(), "torch_rng": torch.get_rng_state(),
                        "python_rng": random.getstate(), "neighbor_table": r.table, "world_size": r.world.size,
                        "watch": r.watch, "entropy": r.entropy},
                       tmp / "trainer_state.pt")
            r.cfg.save_json(tmp / "config.json.run")
            write_manifest(tmp)  # last: a checkpoint whose files differ from it is skipped by --resume
            follow_umask(tmp)  # mkdtemp made it 0700
            os.replace(tmp, root / f"step-{step}")
    except (OSError, RuntimeError, SafetensorError) as error:  # a full disk: torch.save says RuntimeError
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)  # the earlier checkpoints stay as they were
        target = r.out_dir / "checkpoints" / f"step-{step}"
        raise Refused(f"cannot write checkpoint {target}: {reason(error, target.parent)}; the earlier "
                      "checkpoints are intact") from None
    if r.world.is_main:
        for old in checkpoint_dirs(r.out_dir)[: -r.cfg.keep_last] if r.cfg.keep_last > 0 else []:
            shutil.rmtree(old)
    distributed.barrier(r.world)  # no rank reads checkpoints/ before the rename


def trim_metrics(path: Path, start_step: int) -> Path:
    """metrics.jsonl up to start_step, each step once (the steps after a checkpoint run again); a line that is
    not a record (the torn last line a full disk leaves) is dropped with a note. Empty for a new run."""
    kept, torn = {}, 0
    for line in path.read_text().splitlines() if path.exists() and start_step else []:
        try:
            step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            torn += 1
            continue
        if step <= start_step:
            kept.setdefault(step, line)
    if torn:
        print(f"--resume: dropped {torn} unreadable line(s) of {path} (a write cut short)", file=sys.stderr)
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(line + "\n" for _, line in sorted(kept.items())))
    os.replace(partial, path)  # the kept steps survive a failure while rewriting
    return path


def claim_out_dir(cfg: Config) -> tuple[Path, Path | None]:
    """(--out-dir, the checkpoint --resume continues from or None), checked before any work: not a file; not
    holding another run unless --resume (continue it) or --overwrite (start over there; setup then deletes the
    earlier run), or unless it is the earlier output of this run's own preset where that preset replaces its own
    (REPLACES_ITS_OWN_OUTPUT); a --resume continues from the newest intact checkpoint (newer damaged ones are set
    aside), and one whose settings differ from that checkpoint's in anything but how the run is driven
    (RUN_CONTROL_FIELDS) is refused unless --allow-config-change."""
    out_dir = Path(cfg.out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise RunError(f"--out-dir {out_dir} is a file, not a directory; pass another --out-dir")
    checkpoints, earlier = checkpoint_dirs(out_dir), run_outputs(out_dir)
    if earlier and not cfg.resume and not cfg.overwrite and not own_output(cfg, out_dir):
        if checkpoints:
            raise RunError(f"{out_dir} holds checkpoints of an earlier run (latest: {checkpoints[-1].name}); pass "
                           "--resume to continue it, --overwrite to start over there (deleting that run), or another "
                           "--out-dir")
        raise RunError(f"{out_dir} holds an earlier run ({', '.join(earlier)}; no checkpoint to resume); pass "
                       "--overwrite to start over there (deleting it), or another --out-dir")
    if not checkpoints or not cfg.resume:
        return out_dir, None
    latest = intact_checkpoint(out_dir, checkpoints)
    try:
        saved = Config.load_json(latest / "config.json.run")
    except (ValueError, OSError) as error:
        raise RunError(f"--resume: {error}") from None
    changed = [f"--{name.replace('_', '-')} {value!r} -> {getattr(cfg, name)!r}"
               for name, value in asdict(saved).items()
               if name not in RUN_CONTROL_FIELDS and getattr(cfg, name) != value]
    if changed and not cfg.allow_config_change:
        raise RunError(f"--resume: settings differ from those of {latest} ({', '.join(changed)}); resume "
                       "with the same settings, or pass --allow-config-change to continue with the new ones")
    if changed:
        print(f"--resume: continuing with changed settings: {', '.join(changed)}", file=sys.stderr)
    return out_dir, latest


def own_output(cfg: Config, out_dir: Path) -> bool:
    """Whether out_dir's earlier run was made by this run's preset, one that replaces its own output."""
    if cfg.preset not in REPLACES_ITS_OWN_OUTPUT:
        return False
    try:
        return json.loads((out_dir / "config.json").read_text()).get("preset") == cfg.preset
    except (OSError, ValueError, AttributeError):  # no config.json, or not one of ours: not the preset's
        return False


def intact_checkpoint(out_dir: Path, checkpoints: list[Path]) -> Path:
    """The newest checkpoint whose files are those written (runtime/checkpoint.py); each newer damaged one is named
    with what is wrong and renamed to damaged-step-N, so that the run can write its step again."""
    found, skipped = newest_intact(checkpoints)
    if found is None:
        raise RunError(f"--resume: no intact checkpoint in {out_dir / 'checkpoints'} ({'; '.join(skipped)}); "
                       "start over with --overwrite instead of --resume, or pass another --out-dir")
    for directory, why in zip(reversed(checkpoints), skipped):
        aside = directory.with_name(f"damaged-{directory.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        directory.rename(aside)
        print(f"--resume: skipped {why} (kept as {aside.name}); continuing from {found.name}", file=sys.stderr)
    return found
