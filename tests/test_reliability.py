"""Nothing silent, nothing lost (docs/reliability.md): a reward that fails, a damaged checkpoint, SIGTERM, two
runs on one out-dir, a value out of range, a full or read-only disk. Each fault is made for real where it is
about the command line (subprocesses, signals, truncated files, a small tmpfs) and checked against what the
user sees (exit status, the one line printed) and what is on disk."""

import errno
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import preloaded
import pytest
from conftest import torch_threads

from reward import RewardPool

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--preset", "tiny", "--prompts-per-step", "4", "--mini-batch-prompts", "4", "--max-new-tokens", "8"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

USER_REWARDS = '''
import os, time

def flaky(response, reference):
    """What can go wrong with a user's reward, chosen by the response."""
    if response == "raise":  # slow, so that a later pair's failure comes back first
        time.sleep(0.3)
        return lookup(response)
    if response == "hang":
        time.sleep(60)
    if response == "die":
        os._exit(3)
    return {"nan": float("nan"), "inf": float("inf"), "none": None, "text": "1.0"}.get(response, 0.5)

def lookup(response):
    raise KeyError("no field 'score'")

def always_raises(response, reference):
    raise ValueError("the reference is not a number")
'''


def run_cli(args, **kwargs):
    return preloaded.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV,
                         **kwargs)


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


@pytest.fixture
def user_rewards(tmp_path) -> Path:
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_REWARDS)
    return path


def metrics_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------- 1. a reward that fails


def test_each_way_a_user_reward_fails_is_counted_and_the_first_is_shown(user_rewards, capfd):
    """The first pair's failure is the one shown, although the second worker's "nan" returns before it."""
    responses = ["raise", "nan", "inf", "none", "text", "hang", "die", "ok"]
    with RewardPool(num_workers=2, timeout_s=1.0, reward_fn=f"{user_rewards}:flaky") as pool:
        scores = pool.score([(response, "1") for response in responses])
        assert scores == [0.0] * 7 + [0.5]
        assert (pool.errors, pool.timeouts) == (6, 1)  # raise, nan, inf, None, a string, a dead worker; the hang
    err = capfd.readouterr().err
    first = err[err.index("warning: reward"):]
    assert "KeyError: \"no field 'score'\"" in first.splitlines()[0]
    assert 'in lookup\n    raise KeyError("no field \'score\'")' in first  # the user's own frame, with its line


def test_the_graders_timeouts_are_counted():
    with RewardPool(num_workers=1, timeout_s=0.5) as pool:
        assert pool.score([("\\boxed{(x+y+z+1)^{30}(x-y-z-1)^{30}}", "(x^2-(y+z+1)^2)^{30}")]) == [0.0]
        assert (pool.errors, pool.timeouts) == (0, 1)


def test_a_reward_that_always_fails_stops_the_run_naming_it(tmp_path, user_rewards):
    out = tmp_path / "run"
    result = run_cli(["train.py", *TINY, "--max-steps", "6", "--out-dir", str(out),
                      "--reward", f"{user_rewards}:always_raises", "--reward-fail-steps", "2"])
    assert result.returncode == 1 and "Traceback (most recent call last)" in result.stderr  # the first, in full
    assert last_line(result.stderr) == (
        "error: no answer could be scored in 2 steps in a row (last: step 2); last error: "
        f"{user_rewards}:always_raises: ValueError: the reference is not a number; fix it "
        "(or raise --reward-timeout-s)")
    assert [(m["step"], m["reward_errors"], m["reward_timeouts"]) for m in metrics_of(out)] == [(1, 16, 0), (2, 16, 0)]
    assert "warning: step 1: 16 reward error(s), 0 timeout(s) of 16 answers" in result.stderr


# ----------------------------------------------------------------------------- 2. resume past damage


def test_a_manifest_catches_a_truncated_a_missing_and_a_changed_file(tmp_path, monkeypatch):
    from runtime import checkpoint
    from runtime.checkpoint import damage, write_manifest

    monkeypatch.setattr(checkpoint, "BLOCK_BYTES", 1024)  # several blocks per file, hashed in parallel
    ckpt = tmp_path / "step-1"
    ckpt.mkdir()
    for name, size in (("optimizer.pt", 3000), ("trainer_state.pt", 100), ("model.safetensors", 5000)):
        (ckpt / name).write_bytes(os.urandom(size))
    write_manifest(ckpt)
    assert damage(ckpt) is None
    original = (ckpt / "optimizer.pt").read_bytes()
    (ckpt / "optimizer.pt").write_bytes(original[:1000])
    assert damage(ckpt) == "optimizer.pt has 1000 bytes, 3000 were written"
    (ckpt / "optimizer.pt").write_bytes(bytes([original[0] ^ 1]) + original[1:])  # same size, one bit
    assert damage(ckpt) == "optimizer.pt is not what was written (its SHA-256 differs)"
    (ckpt / "optimizer.pt").write_bytes(original)
    (ckpt / "trainer_state.pt").unlink()
    assert damage(ckpt) == "trainer_state.pt is missing"
    (ckpt / "manifest.json").unlink()  # a checkpoint from before manifests: presence and size only
    assert damage(ckpt) == "trainer_state.pt is missing or empty"


def test_a_files_digest_is_the_sha256_of_its_blocks_sha256s(tmp_path, monkeypatch):
    """The manifest's digests against hashlib by hand: blocks of 1,000 bytes (the last one short), their
    SHA-256s concatenated in order, hashed again; an empty file is the SHA-256 of nothing."""
    from runtime import checkpoint

    monkeypatch.setattr(checkpoint, "BLOCK_BYTES", 1000)
    monkeypatch.setattr(checkpoint, "READ_BYTES", 300)  # reads that do not line up with blocks
    contents = {"a.pt": os.urandom(3500), "b.bin": os.urandom(1000), "empty": b""}
    for name, data in contents.items():
        (tmp_path / name).write_bytes(data)
    checkpoint.write_manifest(tmp_path)
    record = json.loads((tmp_path / "manifest.json").read_text())
    for name, data in contents.items():
        blocks = b"".join(hashlib.sha256(data[i:i + 1000]).digest() for i in range(0, len(data), 1000))
        assert record[name] == {"bytes": len(data), "sha256_tree": hashlib.sha256(blocks).hexdigest(),
                                "block_bytes": 1000}
    assert checkpoint.damage(tmp_path) is None
    record["a.pt"]["block_bytes"] = 0  # a manifest edited by hand: refused, not a division by zero
    (tmp_path / "manifest.json").write_text(json.dumps(record))
    assert checkpoint.damage(tmp_path) == "manifest.json is unreadable"


def test_a_manifest_written_before_block_digests_is_still_checked(tmp_path):
    """Checkpoints written by the previous version record each file's whole-file SHA-256."""
    from runtime.checkpoint import damage

    data = os.urandom(5000)
    (tmp_path / "optimizer.pt").write_bytes(data)
    manifest = {"optimizer.pt": {"bytes": 5000, "sha256": hashlib.sha256(data).hexdigest()}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert damage(tmp_path) is None
    (tmp_path / "optimizer.pt").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert damage(tmp_path) == "optimizer.pt is not what was written (its SHA-256 differs)"


def train_here(args: list[str]) -> None:
    """`python train.py ARGS` as run_cli runs it, in this process: train.main is what the script runs, and one
    thread is what OMP_NUM_THREADS=1 gives the subprocess. For the runs that only make a test's input (the
    checkpoints it then damages); the run under test stays a real process. A failure raises (SystemExit)."""
    import train

    assert args[0] == "train.py"
    with torch_threads(1):
        train.main(args[1:])


def test_resume_skips_damaged_checkpoints_and_a_torn_metrics_line(tmp_path):
    out = tmp_path / "run"
    args = ["train.py", *TINY, "--out-dir", str(out), "--save-every", "1", "--keep-last", "3"]
    train_here([*args, "--max-steps", "3"])  # the checkpoints to damage
    checkpoints = out / "checkpoints"
    optimizer = checkpoints / "step-3" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:100])  # truncated
    for path in (checkpoints / "step-2").iterdir():  # emptied
        path.unlink()
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "reward_me')  # what a full disk leaves
    resumed = run_cli([*args, "--max-steps", "4", "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    notes = [line for line in resumed.stderr.splitlines() if line.startswith("--resume:")]
    assert notes[0].startswith("--resume: skipped step-3: optimizer.pt has 100 bytes, ")
    assert notes[1].startswith("--resume: skipped step-2: trainer_state.pt is missing or empty (kept as "
                               "damaged-step-2-")
    assert notes[2] == f"--resume: dropped 1 unreadable line(s) of {out / 'metrics.jsonl'} (a write cut short)"
    assert f"resumed from {checkpoints / 'step-1'} (step 1)" in resumed.stderr
    assert [m["step"] for m in metrics_of(out)] == [1, 2, 3, 4]
    assert sorted(d.name for d in checkpoints.glob("step-*")) == ["step-2", "step-3", "step-4"]  # --keep-last 3
    assert len(list(checkpoints.glob("damaged-step-*"))) == 2


def test_resume_with_no_intact_checkpoint_stops_with_one_line(tmp_path):
    out = tmp_path / "run"
    args = ["train.py", *TINY, "--out-dir", str(out), "--max-steps", "1"]
    train_here(args)  # the checkpoint to damage
    (out / "checkpoints" / "step-1" / "trainer_state.pt").write_bytes(b"")
    resumed = run_cli([*args, "--resume"])
    assert resumed.returncode == 1 and "Traceback" not in resumed.stderr
    assert resumed.stderr.strip() == (f"error: --resume: no intact checkpoint in {out / 'checkpoints'} (step-1: "
                                      "trainer_state.pt has 0 bytes, ") + resumed.stderr.strip().split(", ", 1)[1]
    assert "start over with --overwrite instead of --resume" in resumed.stderr


# ----------------------------------------------------------------------------- 3, 4. SIGTERM; a resume command to paste


def start(args, **env) -> subprocess.Popen:
    return preloaded.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env={**ENV, **env})


def wait_for_step(process: subprocess.Popen) -> None:
    for line in process.stdout:
        if line.startswith("step 1 "):
            return
    raise AssertionError(process.stderr.read())


def test_sigterm_checkpoints_and_prints_a_resume_command_that_works_when_pasted(tmp_path):
    out = tmp_path / "my run"  # a space, and an empty --instruction: both need quoting
    args = ["train.py", *TINY, "--max-steps", "400", "--out-dir", str(out), "--instruction", ""]
    process = start(args)
    wait_for_step(process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM and "Traceback" not in stderr
    assert "\r" not in stderr  # stderr is a pipe: no progress bar runs into the lines
    interrupted = last_line(stderr)
    step = int(interrupted.split("checkpoint of step ")[1].split()[0])
    assert sorted(d.name for d in (out / "checkpoints").iterdir()) == [f"step-{step}"]
    command = interrupted.split("continue with: ")[1]
    assert shlex.split(command) == ["python", *args, "--resume"]
    path = f"{Path(sys.executable).parent}:{ENV['PATH']}"  # `python` is this interpreter
    resumed = subprocess.run(["bash", "-c", f"{command} --max-steps {step + 1}"], cwd=ROOT, capture_output=True,
                             text=True, timeout=300, env={**ENV, "PATH": path})
    assert resumed.returncode == 0, resumed.stderr
    assert f"(step {step})" in resumed.stderr
    assert [m["step"] for m in metrics_of(out)] == list(range(1, step + 2))


def rank_pids(launcher_pid: int) -> dict[int, int]:
    """{rank: pid} of the worker processes torchrun started."""
    pids = {}
    for child in Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split():
        environ = dict(item.split("=", 1) for item in Path(f"/proc/{child}/environ").read_text().split("\0")
                       if "=" in item)
        if "RANK" in environ:
            pids[int(environ["RANK"])] = int(child)
    return pids


def test_sigterm_to_one_rank_stops_every_rank_after_the_same_step(tmp_path):
    out = tmp_path / "run"
    launch = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    process = start([*launch, "train.py", *TINY, "--max-steps", "400", "--out-dir", str(out), "--device", "cpu"])
    wait_for_step(process)
    os.kill(rank_pids(process.pid)[1], signal.SIGTERM)  # rank 1 only: rank 0 must learn of it and agree
    _, stderr = process.communicate(timeout=120)
    interrupted = [line for line in stderr.splitlines() if line.startswith("interrupted:")]
    assert len(interrupted) == 1 and "continue with: torchrun --nproc_per_node=2 -- train.py " in interrupted[0]
    step = int(interrupted[0].split("checkpoint of step ")[1].split()[0])
    assert sorted(d.name for d in (out / "checkpoints").iterdir()) == [f"step-{step}"]
    assert metrics_of(out)[-1]["step"] == step  # neither rank ran a step past it


# ----------------------------------------------------------------------------- 5. one run per out-dir


def test_a_second_run_on_an_out_dir_stops_at_once_and_a_killed_one_leaves_no_lock(tmp_path):
    import eval as E
    import train

    out = tmp_path / "run"
    first = start(["train.py", *TINY, "--max-steps", "400", "--out-dir", str(out)])
    try:
        wait_for_step(first)
        first.send_signal(signal.SIGSTOP)  # it holds the lock without taking a CPU from the others
        second = run_cli(["train.py", *TINY, "--max-steps", "1", "--out-dir", str(out), "--overwrite"])
        assert second.returncode == 1 and second.stderr.strip() == (
            f"error: --out-dir {out} is in use by another run (train.py, pid {first.pid}); wait for it to end, stop "
            "it, or pass another --out-dir")
        with pytest.raises(SystemExit, match="is the training run .*'s own"):  # an evaluation never writes there
            E.main(["--model", "tiny", "--benchmarks", "x.jsonl", "--out-dir", str(out)])
    finally:
        first.kill()  # SIGKILL: no handler runs, the OS drops the lock
        first.communicate()
    train.main([*TINY, "--max-steps", "1", "--out-dir", str(out)])  # not refused


# ---------------------------------------------------------------------- 6, 8. eval says how long, no bar in a log


def test_a_long_evaluation_says_how_long_it_will_take(tmp_path):
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps({"problem": f"{i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(2)))
    process = start(["eval.py", "--model", "tiny", "--benchmarks", str(bench), "--n", "100000", "--max-new-tokens",
                     "4", "--batch-size", "16", "--out-dir", str(tmp_path / "eval")])
    try:
        line = process.stderr.readline()
    finally:
        process.kill()
        process.communicate()
    assert line.startswith("eval: 200000 samples in 12500 batches, ") and " to go, " in line
    assert line.endswith(" in all (lower --n or --limit to shorten it)\n")
    assert "\r" not in line  # stderr is a pipe here: no progress bar before it


# ----------------------------------------------------------------------------- 7. the OS says no

INJECT_ENOSPC = """
import errno, sys
sys.path.insert(0, {root!r})
import torch, train
from runtime.cli import parse_config
real_save = torch.save
def full_disk(obj, path, *args, **kwargs):
    if "/.step-2-" in str(path):  # the second checkpoint's files
        raise OSError(errno.ENOSPC, "No space left on device")
    real_save(obj, path, *args, **kwargs)
train.torch.save = full_disk
train.main(sys.argv[1:])
"""


def mounted(path: Path, *options: str) -> bool:
    """Mounts a tmpfs at `path` (root only; a sandbox may refuse): True when it did."""
    path.mkdir()
    if os.geteuid() != 0 or os.environ.get("NGRPO_TEST_NO_MOUNT"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)],
                          capture_output=True).returncode == 0


@pytest.fixture
def small_disk(tmp_path):
    """A 2.5 MB tmpfs (room for one tiny checkpoint, not two), or None where mounting is not possible."""
    disk = tmp_path / "disk"
    real = mounted(disk, "size=2600k")
    yield disk if real else None
    if real:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_while_checkpointing_is_one_line_and_the_previous_checkpoint_stays(tmp_path, small_disk):
    from runtime.checkpoint import damage

    out = (small_disk or tmp_path) / "run"
    args = [*TINY, "--max-steps", "3", "--save-every", "1", "--out-dir", str(out)]
    if small_disk is not None:
        result = run_cli(["train.py", *args])
    else:  # no tmpfs: the writes fail with ENOSPC as a full disk makes them
        result = run_cli(["-c", INJECT_ENOSPC.format(root=str(ROOT)), *args])
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert last_line(result.stderr).startswith(f"error: cannot write checkpoint {out / 'checkpoints' / 'step-2'}: "
                                               "No space left on device")
    assert last_line(result.stderr).endswith("; the earlier checkpoints are intact")
    assert [d.name for d in (out / "checkpoints").iterdir()] == ["step-1"]  # no temporary directory left
    assert damage(out / "checkpoints" / "step-1") is None


def test_a_full_disk_while_writing_samples_names_the_file(tmp_path, monkeypatch, capsys):
    import eval as E

    disk = tmp_path / "disk"
    if not mounted(disk, "size=12k"):  # a page each for .lock and settings.json, one for samples
        class FullDisk(__import__("io").FileIO):
            def write(self, data):
                raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(E, "open", lambda path, mode, buffering: FullDisk(path, mode), raising=False)
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps({"problem": f"{i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(3)))
    try:
        with pytest.raises(SystemExit) as stopped:
            E.main(["--model", "tiny", "--benchmarks", str(bench), "--n", "16", "--max-new-tokens", "16",
                    "--batch-size", "16", "--out-dir", str(disk / "eval")])
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
    assert stopped.value.code == f"error: cannot write {disk / 'eval' / 'samples.jsonl'}: No space left on device"


def test_a_read_only_out_dir_is_one_line(tmp_path, capsys):
    import train

    disk = tmp_path / "disk"
    if not mounted(disk, "ro", "size=64k"):
        if os.geteuid() == 0:
            pytest.skip("root, and no read-only mount possible here")
        disk.chmod(0o555)
        expected = "Permission denied"
    else:
        expected = "Read-only file system"
    try:
        with pytest.raises(SystemExit) as stopped:
            train.main([*TINY, "--out-dir", str(disk / "run")])
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
    assert stopped.value.code == f"error: cannot write --out-dir {disk / 'run'}: {expected}"


# ----------------------------------------------------------------------------- 6. every value checked


@pytest.mark.parametrize("flags, message", [
    (["--adv-eps", "-1"], "--adv-eps -1: must be > 0: it keeps a group whose rewards are all equal from dividing "
                          "by zero (a negative one flips the advantages' sign)"),
    (["--clip-low", "2"], "--clip-low 2: must be in [0, 1): the ratio's floor 1 - clip_low must stay above 0"),
    (["--lr", "inf"], "--lr inf: must be a finite number"),
    (["--grad-clip", "-1"], "--grad-clip -1: must be >= 0 (0 = off)"),
    (["--weight-decay", "nan"], "--weight-decay nan: must be a finite number"),
    (["--seed", "99999999999999999999"], "--seed 99999999999999999999: must be in [0, 2^63)"),
    (["--save-every", "-1"], "--save-every -1: must be >= 0 (0 = only at the end)"),
    (["--keep-last=-2"], "--keep-last -2: must be >= 0 (0 = keep all)"),
    (["--lr", "1e-6", "--mix-rate", "1.5"], "--mix-rate 1.5: must be in [0, 1]"),
    (["--reward-timeout-s", "0"], "--reward-timeout-s 0: must be > 0"),
    (["--val-data", ","], "--val-data ,: names benchmarks separated by commas, none of them empty"),
    (["--out-dir", ""], "--out-dir '': must not be empty"),
    (["--eval-data", "x.jsonl"], "--eval-data x.jsonl: has no effect without --eval-problems N (how many of its "
                                 "problems to score)"),
    (["--sft-target-accuracy", "0.5"], "--sft-target-accuracy 0.5: has no effect without --sft-steps N (the warm "
                                       "start it may stop early)"),
    (["--warmup-steps", "5"], "--warmup-steps 5: has no effect without --lr-schedule cosine"),
    (["--explore", "none", "--num-neighbors", "2"], "--num-neighbors 2: has no effect with --explore none (only with "
     "--explore neighbor)"),
    (["--val-n", "4"], "--val-n 4: has no effect without --val-data"),
    (["--after-thinking-top-p", "0"], "--after-thinking-top-p 0: must be in (0, 1], or -1 (= --top-p)"),
    (["--explore", "soft", "--after-thinking-top-k", "5", "--old-logp", "rollout"], "--old-logp rollout: rollout "
     "needs --top-p 1, --top-k 0 and --min-p 0 (and so after thinking): with filtering the sampler's log-probs are "
     "of the filtered distribution and the replayed ones are not"),
    (["--explore", "soft-gumbel", "--noise-factor", "0.5"], "--noise-factor 0.5: has no effect with --explore "
                                                             "soft-gumbel (only with --explore soft-grpo)"),
])
def test_a_value_out_of_range_is_refused_naming_its_flag_as_typed(flags, message, capsys):
    from runtime.cli import parse_config

    with pytest.raises(SystemExit) as stopped:
        parse_config(["--preset", "tiny", *flags])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f": error: {message}")  # prog: error: ...


@pytest.mark.parametrize("flags, message", [
    (["--n", "-3"], "--n -3: must be at least 1"),
    (["--benchmarks", ","], "--benchmarks ,: names benchmarks separated by commas, none of them empty"),
    (["--temperature", "nan"], "--temperature nan: must be a finite number"),
    (["--reward-timeout-s", "-1"], "--reward-timeout-s -1: must be > 0"),
    (["--noise-sigma", "0.5"], "--noise-sigma 0.5: has no effect with --explore none (only with --explore gaussian "
                               "or gaussian_embed_noise)"),
    (["--after-thinking-min-p", "0.1"], "--after-thinking-min-p 0.1: has no effect with --explore none (only with "
                                        "an --explore other than none)"),
    (["--explore", "soft", "--stop-mixing-token", "", "--after-thinking-min-p", "0.1"], "--after-thinking-min-p "
     "0.1: has no effect without a --stop-mixing-token (it ends thinking)"),
])
def test_eval_refuses_a_value_out_of_range_naming_its_flag(flags, message, capsys):
    import eval as E

    with pytest.raises(SystemExit):
        E.parse_args(["--model", "tiny", *flags])
    assert capsys.readouterr().err.strip().endswith(f"error: {message}")


def test_what_needs_the_model_or_the_data_is_refused_in_one_line(tmp_path, capsys):
    import train

    one_object = tmp_path / "one.json"
    one_object.write_text('{"problem": "1 + 1?", "answer": "2"}\n')
    dict_answer = tmp_path / "dict.jsonl"
    dict_answer.write_text('{"problem": "1 + 1?", "answer": {"value": 2}}\n')
    for flags, message in [
        (["--num-neighbors", "100000"], "error: --num-neighbors 100000: must be below the vocabulary size of --model "
                                        "tiny (262)"),
        (["--data", str(one_object)], f"error: cannot load --data {one_object}: {one_object}: a .json file of "
                                      "problems holds one JSON list of objects ([{...}, ...]), this one does not; for "
                                      "one object per line name it .jsonl"),
        (["--data", str(dict_answer)], f"error: cannot load --data {dict_answer}: {dict_answer}:1: the answer is a "
                                       'JSON object ({"value": 2}); a reference answer is a string or a number, or a '
                                       "list of them"),
    ]:
        with pytest.raises(SystemExit) as stopped:
            train.main([*TINY, "--out-dir", str(tmp_path / "run"), *flags])
        assert stopped.value.code == message


# ----------------------------------------------------------------------------- 8. texts


def test_eval_help_speaks_of_evaluation_not_training():
    import eval as E

    text = " ".join(E.build_parser().format_help().split())
    assert "training rollouts" not in text and "checkpoints and summary.json" not in text
    assert "--out-dir OUT_DIR directory for samples.jsonl (one line per sample), results.json and settings.json" in text
    assert "--temperature TEMPERATURE sampling temperature (0 = greedy) (default: 0.6)" in text
    assert "the model to evaluate (required)" in text


def test_the_demo_duration_and_the_torch_pin_agree_with_what_they_are_quoted_by():
    import re

    from runtime.cli import build_parser

    readme = (ROOT / "README.md").read_text()
    seconds = re.search(r"(\d+-\d+) s per run", readme).group(1)  # the demo's measured walls
    assert f"# offline, CPU, {seconds} s" in build_parser(__import__("train").__doc__).format_help()
    requirements = (ROOT / "requirements.txt").read_text()
    pin = re.search(r"^torch>=([\d.]+)$", requirements, re.M).group(1)
    assert re.search(r"any ([\d.]+)\+ works", requirements).group(1) == pin
