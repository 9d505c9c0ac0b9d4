"""The tests' preloaded interpreter (tests/preloaded.py) against `python` itself: a command forked from it gives what
a fresh interpreter gives (exit status, stdout, stderr), and a command it cannot give that way gets a fresh one."""

import os
import signal
import subprocess
import sys
import time

import preloaded
import pytest

SCRIPT = "import sys; print('argv', sys.argv, 'path0', repr(sys.path[0]), 'name', __name__)\nraise SystemExit(3)\n"

COMMANDS = {
    "status and both streams": ["-c", "import sys; print('out', sys.argv); print('err', file=sys.stderr); sys.exit(3)",
                                "a", "b"],
    "an uncaught exception": ["-c", "def f():\n    raise ValueError('bad')\nf()"],
    "an uncaught KeyboardInterrupt": ["-c", "raise KeyboardInterrupt"],
    "SystemExit with a message": ["-c", "import sys; sys.exit('stopped here')"],
    "stdin": ["-c", "import sys; print(sys.stdin.read().upper(), end='')"],
    "killed by its own SIGTERM": ["-c", "import os, signal; print('x', flush=True); os.kill(os.getpid(), 15)"],
    "atexit and unflushed output": ["-c", "import atexit, sys; atexit.register(print, 'bye'); sys.stdout.write('hi')"],
    "the environment and the working directory": ["-c", "import os; print(os.environ['PRELOADED_TEST'], os.getcwd())"],
    "a script's argv, sys.path[0] and __main__": ["script.py", "x", "--y"],
    "a module's argv and sys.path[0]": ["-m", "script", "z"],
    "torch's threads from OMP_NUM_THREADS": ["-c", "import torch; print(torch.get_num_threads())"],
}


@pytest.mark.parametrize("words", COMMANDS.values(), ids=COMMANDS.keys())
def test_a_forked_command_gives_what_python_gives(tmp_path, words):
    (tmp_path / "script.py").write_text(SCRIPT)
    env = {**os.environ, "PRELOADED_TEST": "value", "OMP_NUM_THREADS": "1"}
    kwargs = dict(cwd=tmp_path, env=env, input="some input\n", capture_output=True, text=True, timeout=60)
    assert preloaded._forkable([sys.executable, *words], {"cwd": tmp_path, "env": env})
    fresh = subprocess.run([sys.executable, *words], **kwargs)
    forked = preloaded.run([sys.executable, *words], **kwargs)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_signals_timeouts_and_sessions_as_popen(tmp_path):
    process = preloaded.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert process.stdout.readline() == "up\n"
    assert os.getpgid(process.pid) == process.pid  # a session (and process group) of its own
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(0.2)
    os.killpg(process.pid, signal.SIGINT)  # as a scheduler signals a group: Python's KeyboardInterrupt, uncaught
    assert process.wait(30) == -signal.SIGINT
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):  # run's timeout kills the command, as subprocess.run's does
        preloaded.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)
    assert time.monotonic() - started < 30


def other_than_ours(name: str) -> str:
    """A value of the environment variable `name` that differs from this process's (a cluster may set it)."""
    return "0" if os.environ.get(name) == "1" else "1"


@pytest.mark.parametrize("args, kwargs", [
    (["-X", "importtime", "-c", "pass"], {}),  # an interpreter option
    (["-c", "pass"], {"env": {**os.environ, "PYTHONHASHSEED": other_than_ours("PYTHONHASHSEED")}}),  # read at start
    (["-c", "pass"], {"env": {**os.environ, "HF_HUB_OFFLINE": other_than_ours("HF_HUB_OFFLINE")}}),  # read when
    # huggingface_hub is imported
    (["-c", "pass"], {"preexec_fn": lambda: None}),  # beyond stdio, cwd, env, text and sessions
])
def test_what_a_fork_cannot_give_gets_a_fresh_interpreter(args, kwargs):
    assert not preloaded._forkable([sys.executable, *args], kwargs)
    process = preloaded.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)
    assert type(process) is subprocess.Popen and process.wait(60) == 0
