"""What stands between a run and the world around it: one run per out-dir (a lock the OS releases when the
process dies, however it dies), a stop on Ctrl-C or SIGTERM after the current step, a resume command that
works when pasted, and the OS's refusals told in one line (docs/reliability.md).

    with exclusive(out_dir, "train.py"):            # a second run on out_dir stops at once, naming this pid
        with StopOnSignals() as stop:
            ... if stop.requested: checkpoint and leave
"""

import contextlib
import errno
import fcntl
import os
import shlex
import shutil
import signal
import sys
from pathlib import Path

LOCK_FILE = ".lock"
# What the OS answers when it will not store a file: full disk or quota, read-only, permissions, I/O.
REFUSED_WRITES = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG}


class Refused(Exception):
    """The OS, or another run, said no: the message names the path and why."""


@contextlib.contextmanager
def exclusive(out_dir: Path, program: str):
    """Holds an exclusive flock on OUT/.lock (which records this pid) while the block runs, creating OUT if
    needed. flock belongs to the open file: the OS drops it when the process ends, kill -9 included, so a
    lock is never stale; the file stays and is reused (an out-dir this call created and nothing else wrote to
    is removed again). Nothing is written where OUT lies inside a training run's own outputs (train.py: inside
    any other run; run_owns)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise Refused(f"--out-dir {out_dir} is a file, not a directory; pass another --out-dir")
    if program == "train.py" and (run := enclosing_run(out_dir.parent)) is not None:
        raise Refused(f"--out-dir {out_dir} is inside the run {run}; pass an --out-dir of its own")
    if program != "train.py" and (run := run_owns(out_dir)) is not None:
        raise Refused(f"--out-dir {out_dir} is the training run {run}'s own (its folder, checkpoints or best "
                      "weights); pass a folder of its own (a new one inside the run will do)")
    created = not out_dir.exists()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(out_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise Refused(f"cannot write --out-dir {out_dir}: {reason(error, out_dir)}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown pid"
        os.close(fd)
        raise Refused(f"--out-dir {out_dir} is in use by another run ({holder}); wait for it to end, stop it, or "
                      "pass another --out-dir") from None
    found = os.pread(fd, 4096, 0)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{program}, pid {os.getpid()}\n".encode(), 0)
        yield
    except BaseException:  # a run refused (or failed) leaves the file as it found it: a refusal changes no byte
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, found, 0)
        raise
    finally:
        with contextlib.suppress(OSError):  # a run that stopped before writing anything leaves no out-dir
            if created and [p.name for p in out_dir.iterdir()] == [LOCK_FILE]:
                (out_dir / LOCK_FILE).unlink()
                out_dir.rmdir()
        os.close(fd)  # releases the lock


def reason(error: BaseException, path: Path) -> str:
    """The OS's reason for a failed write, in its words. torch.save reports a full disk only as a failed
    zip write (RuntimeError), so a failure on a filesystem with (almost) no free space left is called so."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    with contextlib.suppress(OSError):
        if shutil.disk_usage(existing).free < 1 << 20:
            return f"No space left on device ({str(error).splitlines()[0] if str(error) else type(error).__name__})"
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}".rstrip(": ")


class StopOnSignals:
    """The first Ctrl-C or SIGTERM (what SLURM and Kubernetes send before they kill a job) asks the loop to
    stop after the current step (`after` says what that means to the user); a second one stops at once
    (SIGTERM: the default, an immediate exit). `signal_number` says which came first."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, after: str = "this step and writing a checkpoint"):
        self.after = after

    def __enter__(self):
        self.requested, self.signal_number = False, 0
        self._previous = {number: signal.signal(number, self._request) for number in self.SIGNALS}
        return self

    def _request(self, signum, frame):
        self.requested, self.signal_number = True, self.signal_number or signum
        for number, previous in self._previous.items():  # the next one is a plain KeyboardInterrupt / SIGTERM
            signal.signal(number, previous)
        name = "interrupt" if signum == signal.SIGINT else signal.Signals(signum).name
        print(f"\n{name}: stopping after {self.after} (a second Ctrl-C or SIGTERM stops at once)", file=sys.stderr,
              flush=True)

    def __exit__(self, *exc_info):
        for number, previous in self._previous.items():
            signal.signal(number, previous)


class Terminated(KeyboardInterrupt):
    """A SIGTERM outside the step loop (loading, the warm start): the program stops at once, as on Ctrl-C, and
    says so (SIGTERM's default ends it without a word)."""


@contextlib.contextmanager
def sigterm_interrupts():
    """SIGTERM raises Terminated while inside (StopOnSignals, inside it, takes over during the steps)."""
    def terminated(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc); elsewhere set and put back."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(root: Path) -> None:
    """Gives root and everything under it the modes a plain mkdir or open gives (0777 / 0666 less the umask).
    tempfile's mkdtemp and mkstemp, through which checkpoints and caches are written to be renamed whole, and
    safetensors make them private (0700 / 0600): others on a shared machine could not read a model."""
    mask, root = umask(), Path(root)
    for path in [root, *root.rglob("*")] if root.is_dir() else [root]:
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def resume_command(argv: list[str], script: str = "train.py") -> str:
    """The command that continues this run, shell-quoted so that it works when pasted (an empty
    --instruction '', a path with spaces); under torchrun, with its launcher and `--` before the script (eval.py's
    --n would otherwise be taken for an abbreviation of one of torchrun's options)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    launcher = ["python"] if world_size == 1 else \
        ["torchrun", f"--nproc_per_node={os.environ.get('LOCAL_WORLD_SIZE', world_size)}", "--"]
    return shlex.join([*launcher, script, *argv, *([] if "--resume" in argv else ["--resume"])])


class RunError(SystemExit):
    """A problem the user can fix (a flag, a file): the run stops with one line, `error: ...`, exit status 1."""

    def __init__(self, message: str):
        super().__init__(f"error: {message}")


# What a run writes in its --out-dir (all of it removed by --overwrite).
RUN_OUTPUTS = ("checkpoints", "config.json", "metrics.jsonl", "metrics.jsonl.partial", "completions.jsonl",
               "summary.json", "warm_start", "best", "val", "neighbors", "tensorboard", "wandb")


def enclosing_run(path: Path) -> Path | None:
    """The run folder that holds `path` (itself or a folder above it holding checkpoints or metrics.jsonl), or None:
    what no other run may write into."""
    for folder in (Path(path).resolve(), *Path(path).resolve().parents):
        if (folder / "checkpoints").is_dir() or (folder / "metrics.jsonl").is_file():
            return folder
    return None


def run_owns(path: Path) -> Path | None:
    """The run folder whose own outputs `path` is or lies in (the run folder itself, its checkpoints, its best
    weights, ...: RUN_OUTPUTS), or None; a new folder beside them in a run is the run's to hold, not its own."""
    run = enclosing_run(path)
    if run is None:
        return None
    inside = Path(path).resolve().relative_to(run).parts
    return run if not inside or inside[0] in RUN_OUTPUTS else None
