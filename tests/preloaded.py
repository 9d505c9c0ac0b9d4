"""`python ...` commands for the tests, started from an interpreter that has already imported torch, transformers
and sympy: `run` and `Popen` take subprocess's arguments and give its results.

A test that runs `python train.py ...` spends ~5 s of CPU importing torch, torch._dynamo (AdamW's constructor),
transformers and sympy before the command does anything; the suite runs dozens. Here one server per test process
imports those packages once and forks a child per command (as multiprocessing's forkserver with `preload` does).
The child then becomes the command: its own session if asked, working directory, environment, stdin / stdout /
stderr, sys.argv and sys.path[0] as `python` sets them, its script or `-c` code or `-m` module run as __main__, and
an exit status as the interpreter's (SystemExit's code, 1 for an uncaught exception, death by SIGINT for an uncaught
KeyboardInterrupt, 120 when stdout cannot be flushed at the end; a signal kills it as it kills any process). The
project's own modules are not preloaded: the command imports them from its own sys.path, as `python` would.

What the server cannot give a command, a fresh interpreter does (plain subprocess): an environment that differs from
the suite's in a variable read at start-up or import (PYTHON*, HF_*, OMP_* other than OMP_NUM_THREADS, locale, HOME,
...), interpreter options (`python -X ...`), or Popen arguments beyond stdio, cwd, env, text and
start_new_session. A test of the interpreter's own shutdown (a broken pipe at exit) uses subprocess directly.
"""

import atexit
import inspect
import io
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
import types
import warnings

# Imported by the server before it forks (third-party only: a project module would be the suite's copy, not the
# command's, and would register its torch ops twice).
PRELOAD = ("torch", "torch._dynamo", "torch.distributed", "torch.distributed.checkpoint.state_dict",
           "torch.distributed.fsdp", "torch.utils.checkpoint", "safetensors.torch", "tokenizers", "transformers",
           "transformers.tokenization_utils_tokenizers", "huggingface_hub", "jinja2", "sympy", "tqdm", "numpy")
# Variables read when the interpreter starts or a preloaded package is imported: a command whose environment
# differs from the server's in one of these gets a fresh interpreter.
AT_START = ("PYTHON", "HF_", "HUGGINGFACE", "TRANSFORMERS", "TOKENIZERS", "TORCH", "PYTORCH", "OMP_", "MKL_", "KMP_",
            "GOMP", "CUDA", "LD_", "LC_", "LANG", "HOME", "XDG_", "NGRPO_HIDE_EXTRAS", "SAFETENSORS", "SYMPY", "TQDM")
THREADS = "OMP_NUM_THREADS"  # set in the child with torch.set_num_threads, as torch reads it at start
# Read when used, not at start (torch's inductor writes its default there the first time it needs its cache).
WHEN_USED = ("TORCHINDUCTOR_CACHE_DIR",)
POPEN_ARGS = {"stdin", "stdout", "stderr", "cwd", "env", "text", "universal_newlines", "encoding", "errors",
              "bufsize", "start_new_session", "close_fds"}
BASE_ENV = dict(os.environ)  # the suite's environment before any test changed it (conftest.py sets it again)


def read_at_start(env: dict) -> dict:
    return {key: value for key, value in env.items()
            if key.startswith(AT_START) and key != THREADS and key not in WHEN_USED}


# ----------------------------------------------------------------------------------------------------- the server

def _stream(fd: int, like, mode: str):
    """A text stream on `fd` made as the interpreter made `like` (sys.stdin / stdout / stderr) at its start."""
    raw = io.FileIO(fd, mode, closefd=False)
    unbuffered = isinstance(like.buffer, io.FileIO)
    binary = raw if unbuffered else (io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw))
    return io.TextIOWrapper(binary, encoding=like.encoding, errors=like.errors, write_through=like.write_through,
                            line_buffering=like.line_buffering or (fd != 2 and raw.isatty() and not unbuffered))


def _become(header: dict, fds: list[int]) -> None:
    """In the forked child: become `python *argv` as the header says, then exit with its status. Never returns."""
    code, interrupted = 0, False
    try:
        if header["new_session"]:
            os.setsid()
        os.chdir(header["cwd"])
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, 1 << 16)  # the server's sockets and the received descriptors: close_fds, as subprocess does
        os.environ.clear()
        os.environ.update(header["env"])
        tempfile.tempdir = None  # found again from this environment's TMPDIR
        if header["env"].get(THREADS) != BASE_ENV.get(THREADS):  # a number (_forkable): as torch reads it at start
            sys.modules["torch"].set_num_threads(int(header["env"][THREADS]))  # PRELOAD's (a test file that imports
            # this module, as a reward worker may, does not pay for torch)
        sys.stdin, sys.stdout, sys.stderr = (_stream(0, sys.__stdin__, "r"), _stream(1, sys.__stdout__, "w"),
                                             _stream(2, sys.__stderr__, "w"))
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
        argv = header["argv"]
        sys.orig_argv = [sys.executable, *argv]
        if argv[0] == "-m":
            sys.argv, sys.path[0] = [argv[1], *argv[2:]], os.getcwd()
            runpy._run_module_as_main(argv[1])  # what `python -m` calls
        else:
            main = types.ModuleType("__main__")
            if argv[0] == "-c":
                sys.argv, sys.path[0], source, filename = ["-c", *argv[2:]], "", argv[1], "<string>"
            else:
                filename = os.path.join(os.getcwd(), argv[0])
                with open(filename, "rb") as file:
                    source = file.read()
                sys.argv, sys.path[0], main.__file__ = list(argv), os.path.dirname(os.path.realpath(filename)), filename
            sys.modules["__main__"] = main
            exec(compile(source, filename, "exec"), main.__dict__)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt as stop:  # the traceback from the command's frames on, as the interpreter prints it
        traceback.print_exception(type(stop), stop, stop.__traceback__.tb_next)
        interrupted = True
    except BaseException as error:  # noqa: BLE001 (what the interpreter does with an uncaught exception)
        error = error.with_traceback(error.__traceback__.tb_next)
        sys.excepthook(type(error), error, error.__traceback__)
        code = 1
    try:
        threading._shutdown()  # the interpreter's exit: non-daemon threads, then atexit, then the streams
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _receive(connection: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
    size, _, data = data.partition(b"\n")
    while len(data) < int(size):
        data += connection.recv(1 << 20)
    return json.loads(data), fds


def serve(path: str) -> None:
    """Preload, listen at `path`, say "ready" on stdout; then fork a child per connection and send back its pid,
    and later its wait status. Ends when stdin closes (the test process has gone), killing children left."""
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    children: dict[int, socket.socket] = {}
    while True:
        readable = select.select([listener, sys.stdin], [], [], 0.02 if children else None)[0]
        if sys.stdin in readable and not os.read(0, 1 << 10):
            for pid in children:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            os.unlink(path)
            os.rmdir(os.path.dirname(path))
            return
        if listener in readable:
            connection = listener.accept()[0]
            header, fds = _receive(connection)
            # Python 3.12 warns of a fork in a process with threads: torch's import leaves one, idle.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                _become(header, fds)
            for fd in fds:
                os.close(fd)
            connection.sendall(f"{pid}\n".encode())
            children[pid] = connection
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = children.pop(pid)
            try:
                connection.sendall(f"{status}\n".encode())
            except OSError:
                pass  # nobody waits for it any more
            connection.close()


# ----------------------------------------------------------------------------------------------------- the client

_server = None
_server_lock = threading.Lock()


def _server_path() -> str:
    """The server's socket, starting the server on first use (its environment: the suite's at its start)."""
    global _server
    with _server_lock:
        if _server is None or _server[0].poll() is not None:
            path = os.path.join(tempfile.mkdtemp(prefix="preloaded-"), "socket")
            process = subprocess.Popen([sys.executable, __file__, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       env=BASE_ENV, start_new_session=True)
            if process.stdout.readline().strip() != b"ready":
                raise RuntimeError("the preloaded interpreter did not start")
            _server = (process, path)
        return _server[1]


class _Forked(subprocess.Popen):
    """subprocess.Popen whose child is forked by the server: pipes, communicate, timeouts, signals as Popen's."""

    _connection: socket.socket

    def _execute_child(self, *args):
        given = dict(zip(_EXECUTE_CHILD_PARAMETERS, args))
        stdio = [given["p2cread"], given["c2pwrite"], given["errwrite"]]
        stdio = [fd if fd != -1 else target for target, fd in enumerate(stdio)]  # not redirected: the test's own
        env = os.environ if given["env"] is None else given["env"]
        header = {"argv": [os.fsdecode(word) for word in given["args"][1:]],
                  "cwd": os.fsdecode(given["cwd"] or os.getcwd()), "env": {os.fsdecode(key): os.fsdecode(value)
                                                                         for key, value in env.items()},
                  "new_session": bool(given["start_new_session"])}
        data = json.dumps(header).encode()
        self._connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._connection.connect(_server_path())
            socket.send_fds(self._connection, [f"{len(data)}\n".encode() + data], stdio)
            self._replies = self._connection.makefile("rb")
            self.pid = int(self._replies.readline())
        finally:
            self._close_pipe_fds(given["p2cread"], given["p2cwrite"], given["c2pread"], given["c2pwrite"],
                                 given["errread"], given["errwrite"])

    def _status(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            if timeout is None or select.select([self._connection], [], [], max(timeout, 0))[0]:
                line = self._replies.readline()
                self._connection.close()
                self.returncode = os.waitstatus_to_exitcode(int(line))
        return self.returncode

    def _internal_poll(self, _deadstate=None, **_):
        return self._status(0)

    def _wait(self, timeout):
        if self._status(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode


_EXECUTE_CHILD_PARAMETERS = list(inspect.signature(subprocess.Popen._execute_child).parameters)[1:]


def _forkable(args, kwargs: dict) -> bool:
    if not isinstance(args, (list, tuple)) or len(args) < 2 or args[0] != sys.executable:
        return False
    first = os.fsdecode(args[1])  # a script may be given as a Path
    if first.startswith("-") and not (first in ("-c", "-m") and len(args) >= 3):
        return False  # interpreter options
    if set(kwargs) - POPEN_ARGS or kwargs.get("close_fds", True) is not True:
        return False
    env = os.environ if kwargs.get("env") is None else kwargs["env"]
    threads = env.get(THREADS)
    if threads != BASE_ENV.get(THREADS) and not (threads or "").isdigit():
        return False  # torch's own default (the cores), which the server's torch no longer has
    return read_at_start(env) == read_at_start(BASE_ENV)


def Popen(args, **kwargs) -> subprocess.Popen:  # noqa: N802 (subprocess's name)
    """subprocess.Popen(args, **kwargs); a `[sys.executable, ...]` command forked from the preloaded server."""
    return (_Forked if _forkable(args, kwargs) else subprocess.Popen)(args, **kwargs)


def run(args, *, input=None, capture_output=False, timeout=None, check=False,  # noqa: A002 (subprocess's name)
        **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(args, ...); a `[sys.executable, ...]` command forked from the preloaded server."""
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with Popen(args, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        except BaseException:
            process.kill()
            raise
    if check and process.returncode:
        raise subprocess.CalledProcessError(process.returncode, args, stdout, stderr)
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


if __name__ == "__main__":
    serve(sys.argv[1])
