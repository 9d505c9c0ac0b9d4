"""The reward's worker pool: every check that may be slow runs in a worker process, killed and replaced when it runs
past its deadline, so that a pathological answer costs at most the timeout and never hangs or crashes the caller.

A signal alarm would not work off the main thread nor interrupt sympy's C paths, so the workers are processes; and
plain subprocesses speaking JSON lines over stdin/stdout, not multiprocessing: fork is unsafe under torch's threads,
and spawn/forkserver re-import the caller's __main__ (train.py, hence torch) in every worker and in every replacement
of a killed one. A worker imports only grading/ and sympy (~0.5 s), and killing it (SIGKILL) works whatever C code
it is stuck in. Pairs that our fast exact paths decide never leave the calling process.

What a worker computes is ours (grading/grader.py), math-verify's, or the user's own function
`f(response, reference) -> float` ("module:function" or "path/to/file.py:function", TRL's reward_funcs). A judge
(`--judge`, the same kind of function, a model grader behind it) is asked after the rules in workers of its own.
"""

import atexit
import importlib
import importlib.util
import json
import logging
import math
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
import weakref
from collections import deque
from pathlib import Path

from grading.extract import candidate_answers, gives_choice, reference_answer
from grading.grader import equivalent, fast_verdict
from grading.latex import box_spans

GRADERS = ("ours", "math-verify")
WORKER_MEMORY_BYTES = 2 << 30
STARTUP_TIMEOUT_S = 60.0
# A pool starts one worker at its first batch and one more (up to num_workers) each time work has waited this long
# with a worker up: most batches of a small run or evaluation are graded by one worker in milliseconds, and each
# start costs ~1 s of CPU; a long batch, or one stuck behind a slow answer, gets every worker within seconds.
GROW_AFTER_S = 0.5


# ----------------------------------------------------------------------------------------------------
# What a worker computes: ours, math-verify, or the user's function

def load_reward_function(spec: str, flag: str = "--reward"):
    """The function named by "package.module:function" or "path/to/file.py:function" (flag: the option that named
    it, for the messages)."""
    location, _, name = spec.rpartition(":")
    if not location or not name:
        raise ValueError(f"{flag} must be 'module:function' or 'path/to/file.py:function', not {spec!r}")
    if location.endswith(".py"):
        path = Path(location).resolve()
        if not path.is_file():
            raise ValueError(f"{flag}: no file {path}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as error:  # noqa: BLE001 - a syntax error, an import that fails: the file's, in one line
            where = f"{path}:{error.lineno}" if isinstance(error, SyntaxError) and error.lineno else str(path)
            raise ValueError(f"{flag}: {where}: {type(error).__name__}: {error}") from None
    else:
        try:
            module = importlib.import_module(location)
        except ImportError as error:
            raise ValueError(f"{flag}: cannot import {location!r} ({error}); run from the directory that "
                             "holds it or give a path/to/file.py") from error
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"{flag}: {location!r} has no function {name!r}")
    return function


def math_verify_reward(response: str, reference: str) -> float:
    """math-verify's verdict, as the released N-GRPO code asks it: the reference parsed as a boxed
    answer, the response with math-verify's own extraction. Its own timeouts are off (they use SIGALRM,
    which our worker keeps): the worker's deadline bounds it."""
    from math_verify import parse, verify
    gold = parse(reference if "\\boxed" in reference else f"\\boxed{{{reference}}}", parsing_timeout=None)
    return 1.0 if verify(gold, parse(response, parsing_timeout=None), timeout_seconds=None) else 0.0


def _scorer(settings: dict):
    """The worker's job -> score function for these pool settings."""
    if settings["reward_fn"]:
        user_function = load_reward_function(settings["reward_fn"])
        return lambda response, reference: _finite(user_function(response, reference))
    if settings["grader"] == "math-verify":
        logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled": ours bounds it
        return math_verify_reward
    rel_tol = settings["rel_tol"]
    return lambda candidates, reference: float(any(equivalent(c, reference, rel_tol) for c in candidates))


class BadScore(ValueError):
    """A reward function returned something that is not a finite number (NaN, inf, None, a string)."""


def _finite(value) -> float:
    """A user's score as a float; anything but a finite number is an error, never a silent 0."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__") or not math.isfinite(float(value)):
        raise BadScore(f"returned {value!r:.60} ({type(value).__name__}); a score must be a finite number")
    return float(value)


# ----------------------------------------------------------------------------------------------------
# Bounded time: worker processes

def _failure(error: Exception) -> list[str]:
    """[one-line message, the traceback from the user's own code down] of a user's function's failure."""
    if isinstance(error, BadScore):
        return [str(error), ""]
    frame = error.__traceback__
    while frame is not None and frame.tb_frame.f_code.co_filename == __file__:  # our frames say nothing
        frame = frame.tb_next
    return [f"{type(error).__name__}: {error}", "".join(traceback.format_exception(type(error), error, frame))]


def _worker_command(settings: dict) -> list[str]:
    root = str(Path(__file__).resolve().parents[1])  # the repo: `grading` is a package there
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {root!r}); from grading import pool; pool._serve()",
            json.dumps(settings)]


def _serve() -> None:
    """Worker main loop: settings as argv[1]; a JSON job [id, payload, reference, timeout_s] per stdin line,
    a JSON [id, score] per stdout line; "ready" first, once everything is loaded and warm."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr  # a stray print from a library must not corrupt the protocol
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    # If the parent dies while we hang, nobody kills us: SIGALRM's default action ends the process.
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    warnings.simplefilter("ignore")  # sympy deprecation chatter on odd input would flood the training log
    try:
        import resource
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = WORKER_MEMORY_BYTES if hard == resource.RLIM_INFINITY else min(WORKER_MEMORY_BYTES, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))  # a memory bomb raises MemoryError here
    except (ImportError, ValueError, OSError):
        pass
    settings = json.loads(sys.argv[1])
    sys.path.extend(path for path in settings["sys_path"] if path not in sys.path)
    score = _scorer(settings)
    equivalent("(x+1)^2 \\le 3", "x^2+2x+1 \\leq 3")  # load sympy's lazy modules before the first timed job
    try:
        replies.write('"ready"\n')
        replies.flush()
        for line in sys.stdin:
            job_id, payload, reference, timeout_s = json.loads(line)
            signal.setitimer(signal.ITIMER_REAL, timeout_s + 2.0)
            reply = [job_id, 0.0]
            try:
                reply[1] = score(payload, reference)
            except Exception as error:  # the grader's failures mean "not equal"; a user's function's are reported
                if settings["reward_fn"]:
                    reply.append(_failure(error))
            signal.setitimer(signal.ITIMER_REAL, 0)
            replies.write(json.dumps(reply) + "\n")
            replies.flush()
    except BrokenPipeError:
        # The program has gone (it finished or was stopped while this worker started or graded): nobody reads the
        # answer, and the worker shares the program's stderr, so it ends without a word (os._exit: the buffered
        # reply would fail again, and be reported, as the interpreter closes it).
        os._exit(0)


class _Worker:
    """One checker process and the job it is on (`job` index, `deadline` on time.monotonic())."""

    def __init__(self, command: list[str]):
        # A session of its own: a signal to the program's process group (a scheduler's SIGTERM, Ctrl-C) does not
        # kill the answers being graded; the worker ends with the program all the same (its input closes).
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                                        start_new_session=True)
        os.set_blocking(self.process.stdout.fileno(), False)
        self.started = time.monotonic()
        self.pending = b""
        self.ready_at = math.inf  # time.monotonic() when it said "ready"
        self.job = None
        self.deadline = None

    @property
    def ready(self) -> bool:
        return self.ready_at < math.inf

    def send(self, job: int, payload, reference: str, timeout_s: float) -> None:
        message = json.dumps([job, payload, reference, timeout_s]) + "\n"
        self.process.stdin.write(message.encode())
        self.job, self.deadline = job, time.monotonic() + timeout_s

    def receive(self) -> list | None:
        """Messages that have arrived; None once the process has exited."""
        data = os.read(self.process.stdout.fileno(), 1 << 16)
        if not data:
            return None
        *lines, self.pending = (self.pending + data).split(b"\n")
        return [json.loads(line) for line in lines]

    def stop(self, wait_s: float = 0.0) -> None:
        try:
            self.process.stdin.close()  # a worker exits on end of input
            self.process.wait(wait_s)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.process.kill()
        self.process.wait()
        self.process.stdout.close()


_live_pools = weakref.WeakSet()
# Idle workers a closed pool left for the next pool of the same settings (its worker command) in this process: a
# worker costs ~1 s of CPU to start (Python, sympy, a warm-up check), and a program that evaluates or trains more
# than once (eval.py's benchmarks, a sweep's steps, a test session) would pay it per pool. Stopped at exit.
_spare_workers: dict[tuple[str, ...], list["_Worker"]] = {}
_spares_lock = threading.Lock()  # pools in several threads share them


class RewardPool:
    """Scores batches of (response, reference) pairs in parallel worker processes, each check bounded by
    `timeout_s`: a worker past its deadline is killed and replaced, and that pair scores 0.0. Workers start as the
    work needs them, one at the first batch and one more each time work has waited GROW_AFTER_S (or come from a
    closed pool of the same settings), and serve until close(). Failures are never
    silent: `timeouts` counts the checks that ran out of time (any grader), `errors` those a user's function
    failed (it raised, killed its worker, or returned no finite number), `last_error` says the latest; the first
    one is printed to stderr with its traceback (the earliest pair of its batch, whichever worker finished first).

    grader: "ours" (grading/grader.py: exact, sympy-based; pairs its fast paths decide never leave this process)
    or "math-verify" (pip install math-verify). reward_fn: "module:function" or "path/to/file.py:function",
    a function f(response, reference) -> float that replaces the grader (TRL's reward_funcs). require_boxed:
    only \\boxed answers count (a format-strict reward). rel_tol: our grader's relative tolerance on numbers,
    a benchmark's published rule (0.0, exact, unless an evaluation asks; docs/reward.md).

    judge: a second opinion after the rules, "module:function" or "path/to/file.py:function", f(response,
    reference) -> 1 / 0 (a verdict >= 0.5 says equal), asked only where the rules said 0 (and where they said 1
    with judge_positives), at most judge_max_calls pairs a batch (0 = all), each call within judge_timeout_s in
    its own workers; judge_both_orders also asks f(reference, response), and a pair is judged equal only when both
    say so (NeMo Gym's math_with_judge asks both orders). A call that fails leaves the rules' verdict. Counted in
    judge_calls, judge_flips (verdicts changed), judge_capped (pairs left to the rules by the cap), judge_errors,
    judge_timeouts (`counts()`); its first failure is printed, as a reward function's is.

    >>> with RewardPool(num_workers=2, timeout_s=5.0) as pool:
    ...     pool.score([("... so \\\\boxed{\\\\frac{1}{2}}", "0.5"), ("... so \\\\boxed{2}", "3")])
    [1.0, 0.0]
    """

    def __init__(self, num_workers: int | None = None, timeout_s: float = 5.0, grader: str = "ours",
                 reward_fn: str = "", require_boxed: bool = False, rel_tol: float = 0.0, judge: str = "",
                 judge_timeout_s: float = 30.0, judge_max_calls: int = 0, judge_both_orders: bool = False,
                 judge_positives: bool = False, role: str = "reward"):
        if grader not in GRADERS:
            raise ValueError(f"grader must be one of {GRADERS}, not {grader!r}")
        if not (math.isfinite(rel_tol) and 0.0 <= rel_tol < 1.0):
            raise ValueError(f"rel_tol must be a relative tolerance in [0, 1) (TheoremQA's is 0.04), not {rel_tol!r}")
        if grader == "math-verify" and not reward_fn and importlib.util.find_spec("math_verify") is None:
            raise ValueError("--grader math-verify needs the math-verify package: pip install math-verify")
        if reward_fn:
            load_reward_function(reward_fn, f"--{role}")  # a bad spec fails here, with its message, not in workers
            if reward_fn.partition(":")[0].endswith(".py"):
                path, _, name = reward_fn.rpartition(":")
                reward_fn = f"{Path(path).resolve()}:{name}"
        self.num_workers = num_workers or min(8, os.cpu_count() or 1)
        self.timeout_s = timeout_s
        self.grader, self.reward_fn, self.require_boxed, self.rel_tol = grader, reward_fn, require_boxed, rel_tol
        self.role = role
        self.judge = RewardPool(num_workers, judge_timeout_s, reward_fn=judge, role="judge") if judge else None
        self.judge_max_calls, self.judge_both_orders, self.judge_positives = (judge_max_calls, judge_both_orders,
                                                                              judge_positives)
        self.judge_calls = self.judge_flips = self.judge_capped = 0
        # the workers import a user's module from wherever this process can
        self._command = _worker_command({"grader": grader, "reward_fn": reward_fn, "rel_tol": rel_tol,
                                         "sys_path": sys.path})
        self._workers: list[_Worker] = []
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self.errors, self.timeouts, self.last_error = 0, 0, ""
        self.answers: list[str | None] = []  # of the last batch scored (score)
        self._failures: list[tuple] = []  # (pair index, message, traceback, timed out) of the batch running
        self._grown_at = 0.0  # when the batch running began, or the pool last started a worker for it
        _live_pools.add(self)

    @classmethod
    def of(cls, cfg, **overrides) -> "RewardPool":
        """The pool a run's settings describe (a config.Config: --grader, --reward, --require-boxed, --rel-tol,
        --reward-timeout-s and --judge's); overrides: eval.py's rel_tol per benchmark."""
        settings = dict(grader=cfg.grader, reward_fn=cfg.reward, require_boxed=cfg.require_boxed,
                        timeout_s=cfg.reward_timeout_s, rel_tol=cfg.rel_tol, judge=cfg.judge,
                        judge_timeout_s=cfg.judge_timeout_s, judge_max_calls=cfg.judge_max_calls,
                        judge_both_orders=cfg.judge_both_orders, judge_positives=cfg.judge_positives)
        return cls(**{**settings, **overrides})

    def score(self, pairs: list[tuple[str, str]], kind: str = "math") -> list[float]:
        """A reward per (response, reference): kind "math" (final answer vs reference answer) or "choice"
        (multiple-choice letter, GPQA; always ours unless reward_fn is set). `answers`: each answer our grader read."""
        if kind not in ("math", "choice"):
            raise ValueError(f"kind must be 'math' or 'choice', not {kind!r}")
        pairs = [(_text(response), _text(reference)) for response, reference in pairs]
        self.answers = []  # where another grader scores, nobody read them here
        if self.reward_fn or (kind == "math" and self.grader == "math-verify"):
            jobs = [(index, response, reference) for index, (response, reference) in enumerate(pairs)]
            scores = self._run_all(jobs, self.timeout_s, [0.0] * len(pairs))
        elif kind == "choice":
            scores = [float(gives_choice(response, letter)) for response, letter in pairs]
        else:
            candidates = [candidate_answers(response, reference, self.require_boxed) for response, reference in pairs]
            self.answers = [found[0] if found else None for found in candidates]
            jobs = [(found, reference_answer(reference)) for found, (_, reference) in zip(candidates, pairs)]
            scores = [float(equal) for equal in self.equal(jobs, self.timeout_s)]
        if self.judge is not None:
            scores = self._judged(pairs, scores)
        if self.require_boxed:  # whoever grades, an answer without a box scores 0
            scores = [score if box_spans(response) else 0.0 for score, (response, _) in zip(scores, pairs)]
        return scores

    def _judged(self, pairs: list[tuple[str, str]], scores: list[float]) -> list[float]:
        """The scores after the judge's second opinion (see the class)."""
        asked = [index for index, score in enumerate(scores) if score <= 0 or self.judge_positives]
        if self.judge_max_calls and len(asked) > self.judge_max_calls:
            self.judge_capped += len(asked) - self.judge_max_calls
            asked = asked[: self.judge_max_calls]
        jobs = [pairs[index] for index in asked]
        jobs += [(reference, response) for response, reference in jobs] * self.judge_both_orders
        if not jobs:
            return scores
        verdicts = self.judge.score(jobs)
        failed = {failure[0] % len(asked) for failure in self.judge._failures}  # either order's call
        self.judge_calls += len(jobs)
        scores = list(scores)
        for k, index in enumerate(asked):
            if k not in failed:
                equal = all(verdicts[j] >= 0.5 for j in range(k, len(jobs), len(asked)))
                self.judge_flips += float(equal) != scores[index]
                scores[index] = float(equal)
        return scores

    def counts(self) -> dict[str, int]:
        """What the pool has counted so far: errors, timeouts and, with a judge, its calls, flips, capped pairs,
        errors and timeouts (a step or an evaluation reports the difference)."""
        counts = {"errors": self.errors, "timeouts": self.timeouts}
        if self.judge is not None:
            counts.update(judge_calls=self.judge_calls, judge_flips=self.judge_flips, judge_capped=self.judge_capped,
                          judge_errors=self.judge.errors, judge_timeouts=self.judge.timeouts)
        return counts

    def equal(self, jobs: list[tuple[list[str], str]], timeout_s: float) -> list[bool]:
        """For each (candidate answers, reference answer): whether any candidate equals the reference by
        our grader (a pool with grader "ours" and no reward_fn)."""
        if self.reward_fn or self.grader != "ours":
            raise ValueError(f"equal() is our grader's; this pool scores with {self.reward_fn or self.grader}")
        scores = [0.0] * len(jobs)
        hard = []
        for index, ((candidates, reference), fast) in enumerate(zip(jobs, self.fast_verdicts(jobs))):
            if True in fast:
                scores[index] = 1.0
            elif None in fast:
                undecided = [candidate for candidate, verdict in zip(candidates, fast) if verdict is None]
                hard.append((index, undecided, reference))
        if hard:
            self._run_all(hard, timeout_s, scores)
        return [verdict == 1.0 for verdict in scores]

    def fast_verdicts(self, jobs: list[tuple[list[str], str]]) -> list[list[bool | None]]:
        """Our grader's cheap exact rules here, per candidate of each (candidates, reference): True, False, or None
        where sympy must decide (judge's workers); a candidate they cannot parse is undecided."""
        return [[_safe_fast_verdict(candidate, reference, self.rel_tol) for candidate in candidates]
                for candidates, reference in jobs]

    def _run_all(self, jobs: list[tuple], timeout_s: float, scores: list[float]) -> list[float]:
        """Run (index, payload, reference) jobs in the workers; each score lands in scores[index]."""
        with self._lock:
            self._run(deque(jobs), timeout_s, scores)
        return scores

    def _run(self, queue: deque, timeout_s: float, scores: list[bool]) -> None:
        self._failures = []
        try:
            self._drain(queue, timeout_s, scores)
        finally:  # counted in the order of the pairs, not of the racing workers: the same batch prints the same
            for failure in sorted(self._failures, key=lambda failure: failure[0]):
                self._count_failure(*failure[1:])

    def _drain(self, queue: deque, timeout_s: float, scores: list[bool]) -> None:
        if not self._workers:
            self._start_worker()
        self._grown_at = time.monotonic()
        while queue or any(worker.job is not None for worker in self._workers):
            for worker in self._workers:
                if queue and worker.ready and worker.job is None:
                    self._dispatch(worker, *queue.popleft(), timeout_s, scores)
            now = time.monotonic()
            if queue and now >= self._grow_at():  # work has waited GROW_AFTER_S with a worker up
                self._start_worker()
                self._grown_at = now
            deadlines = [worker.deadline for worker in self._workers if worker.job is not None]
            if not deadlines and all(now - w.started > STARTUP_TIMEOUT_S for w in self._workers):
                raise self._not_started()
            wait_s = min(deadlines) - now if deadlines else 0.5
            if queue:
                wait_s = min(wait_s, self._grow_at() - now)
            for key, _ in self._selector.select(max(0.0, wait_s)):
                self._read(key.data, scores)
            now = time.monotonic()
            for worker in list(self._workers):
                if worker.job is not None and now >= worker.deadline:
                    scores[worker.job] = 0.0
                    self._failed(worker.job, f"timed out after {timeout_s:g} s", timed_out=True)
                    self._replace(worker)

    def _grow_at(self) -> float:
        """When the batch running may start one more worker (inf: none: all are started, or none is up yet)."""
        if len(self._workers) >= self.num_workers:
            return math.inf
        first_up = min((worker.ready_at for worker in self._workers), default=math.inf)
        return max(self._grown_at, first_up) + GROW_AFTER_S  # inf + s = inf

    def start(self, workers: int | None = None) -> None:
        """Starts workers (up to `workers`, default num_workers) and returns once they are ready: before timing
        batches, say. Otherwise a pool starts them as its batches need them (GROW_AFTER_S)."""
        with self._lock:
            while len(self._workers) < min(workers or self.num_workers, self.num_workers):
                self._start_worker()
            while not all(worker.ready for worker in self._workers):
                if all(time.monotonic() - w.started > STARTUP_TIMEOUT_S for w in self._workers if not w.ready):
                    raise self._not_started()
                for key, _ in self._selector.select(0.5):
                    self._read(key.data, [])

    def _not_started(self) -> RuntimeError:
        return RuntimeError(f"reward workers did not start within {STARTUP_TIMEOUT_S:.0f} s (command: "
                            f"{' '.join(self._command)}); see their stderr above")

    def _dispatch(self, worker: _Worker, index: int, payload, reference: str,
                  timeout_s: float, scores: list[float]) -> None:
        try:
            worker.send(index, payload, reference, timeout_s)
        except OSError:  # it died while idle
            scores[index] = 0.0
            self._failed(index, f"its worker process died (exit status {worker.process.poll()})")
            self._replace(worker)

    def _read(self, worker: _Worker, scores: list[bool]) -> None:
        messages = worker.receive()
        if messages is None:
            if not worker.ready:
                raise RuntimeError("a reward worker exited while starting (see its stderr above)")
            if worker.job is not None:
                scores[worker.job] = 0.0
                self._failed(worker.job, f"its worker process died (exit status {worker.process.poll()})")
            self._replace(worker)
            return
        for message in messages:
            if message == "ready":
                worker.ready_at = time.monotonic()
            else:
                job, score, *failure = message
                scores[job] = score
                worker.job = None
                if failure:
                    self._failed(job, *failure[0])

    def _failed(self, index: int, message: str, detail: str = "", timed_out: bool = False) -> None:
        """Notes that pair `index` of the batch gave no score; counted when the batch ends."""
        self._failures.append((index, message, detail, timed_out))

    def _count_failure(self, message: str, detail: str = "", timed_out: bool = False) -> None:
        """Counts a check that gave no score; prints the first failure of a user's function in full."""
        name = self.reward_fn or f"grader {self.grader}"
        if self.reward_fn and not self.errors + self.timeouts:
            outcome = "the rules' verdict stands" if self.role == "judge" else "scored 0"
            print(f"warning: {self.role} {name}: {message} ({outcome}; further failures are counted, not "
                  f"printed)\n{detail}".rstrip(), file=sys.stderr, flush=True)
        self.errors, self.timeouts = self.errors + (not timed_out), self.timeouts + timed_out
        self.last_error = f"{name}: {message}"

    def _start_worker(self) -> _Worker:
        with _spares_lock:
            spares = _spare_workers.get(tuple(self._command), [])
            while spares and spares[-1].process.poll() is not None:  # one that died while it waited
                spares.pop().stop()
            worker = spares.pop() if spares else None
        worker = worker or _Worker(self._command)
        self._selector.register(worker.process.stdout, selectors.EVENT_READ, worker)
        self._workers.append(worker)
        return worker

    def _replace(self, worker: _Worker) -> None:
        self._selector.unregister(worker.process.stdout)
        self._workers.remove(worker)
        worker.stop()
        self._start_worker()

    def close(self) -> None:
        """Release the workers (idempotent): the idle ones of a grader (not of a user's reward_fn) wait for the
        next pool of the same settings in this process (up to num_workers of them), the others are stopped; all
        end at exit, or when this process dies (their input closes)."""
        if self.judge is not None:
            self.judge.close()
        with self._lock:
            for worker in self._workers:
                self._selector.unregister(worker.process.stdout)
                # not a user's function's: its file may change before the next pool (a notebook's edit)
                handed_on = not self.reward_fn and worker.job is None and worker.process.poll() is None
                with _spares_lock:
                    spares = _spare_workers.setdefault(tuple(self._command), [])
                    if handed_on and len(spares) < self.num_workers:
                        spares.append(worker)
                        continue
                worker.stop(wait_s=1.0)
            self._workers = []

    def __enter__(self) -> "RewardPool":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


@atexit.register
def _close_live_pools() -> None:
    for pool in list(_live_pools):
        pool.close()
    stop_spare_workers()


def stop_spare_workers() -> None:
    """Stops the idle workers closed pools left (at exit; or to free their memory sooner)."""
    with _spares_lock:
        stopping = [worker for spares in _spare_workers.values() for worker in spares]
        _spare_workers.clear()
    for worker in stopping:
        worker.stop(wait_s=1.0)


def _safe_fast_verdict(prediction: str, reference: str, rel_tol: float = 0.0) -> bool | None:
    try:
        return fast_verdict(prediction, reference, rel_tol)
    except Exception:  # let the worker (where every failure means False) decide
        return None


def _text(value) -> str:
    return "" if value is None else str(value)
