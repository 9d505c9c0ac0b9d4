"""Whether a checkpoint on disk is the one that was written: a manifest of every file's size and SHA-256,
written last (just before the directory is renamed to step-N), and the check --resume runs before using one.

A kill -9 mid-write never leaves a step-N (the rename is the commit), but a disk can still truncate or lose a
file afterwards (a full disk, a copy cut short, a user's rm). Then --resume falls back to the newest checkpoint
that checks out, and says which it skipped and why:

    write_manifest(tmp)                      # after every other file of the checkpoint is written
    found, skipped = newest_intact(checkpoint_dirs(out_dir))   # skipped: ["step-3: optimizer.pt has 12 ..."]

Hashing reads the checkpoint once more when it is written and once when it is resumed (1.5B: ~18 GB of
weights and AdamW state, seconds at SHA-256's GB/s); sizes are compared first, so a truncated file is found
without hashing anything.
"""

import hashlib
import json
from pathlib import Path

MANIFEST = "manifest.json"
# What a checkpoint written before manifests existed must hold (checked by presence and size only).
REQUIRED = ("trainer_state.pt", "optimizer.pt", "config.json.run")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path) -> None:
    """OUT/checkpoints/.step-N-*/manifest.json: {relative path: {"bytes": size, "sha256": hex}} of every file."""
    files = sorted(p for p in Path(directory).rglob("*") if p.is_file() and p.name != MANIFEST)
    record = {str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256": sha256_of(p)} for p in files}
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
    for name, entry in record.items():
        if sha256_of(Path(directory) / name) != entry["sha256"]:
            return f"{name} is not what was written (its SHA-256 differs)"
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
