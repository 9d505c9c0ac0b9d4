"""The reward: find a response's final answer and decide, in bounded time, whether it equals the
reference.

Every gradient of a run is decided here. A false negative teaches the model that a right answer was
wrong, a false positive rewards nonsense, and one hang stalls the run. So:

- the answer is found by grading/extract.py, in a documented order of preference (candidate_answers;
  docs/reward.md); `require_boxed=True` keeps only boxes (a format-strict reward);
- whether it equals the reference is grading/grader.py's exact check ("ours"), math-verify's ("math-verify", an
  optional dependency), or the user's own function `f(response, reference) -> float` ("module:function");
- everything that may be slow runs in a worker process that is killed and replaced when it runs past the
  timeout (grading/pool.py's RewardPool, what train.py and eval.py score batches with), so a pathological
  answer costs at most the timeout and never hangs or crashes the caller.

>>> extract_answer("so the total is \\\\boxed{\\\\frac{1}{2}}.")
'\\\\frac{1}{2}'
>>> extract_answer("</think> Adding them up, the answer is $42$.")
'42'
"""

import threading

from grading.extract import candidate_answers, gives_choice, reference_answer
from grading.extract import extract_answer as extract_answer  # the public API's names: reward.extract_answer,
from grading.extract import extract_choice as extract_choice  # reward.extract_choice
from grading.pool import GRADERS as GRADERS
from grading.pool import RewardPool as RewardPool  # what train.py and eval.py score with

_shared: RewardPool | None = None
_shared_lock = threading.Lock()


def _shared_pool() -> RewardPool:
    """The one-worker pool behind is_equiv and math_reward, created on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = RewardPool(num_workers=1)
        return _shared


def _answer_of(text: str) -> str:
    """An answer given as a whole response is graded by its final answer; a bare answer is itself."""
    candidates = candidate_answers(text)
    return candidates[0] if candidates else text


def _text(value) -> str:
    return "" if value is None else str(value)


# ----------------------------------------------------------------------------------------------------
# Public API

def is_equiv(prediction: str, reference: str, *, timeout: float = 5.0) -> bool:
    """Whether the answer `prediction` equals the reference answer; False past `timeout` seconds.

    >>> is_equiv("2\\\\frac{1}{2}", "5/2"), is_equiv("0.33", "\\\\frac13"), is_equiv("(-1,4)", "[-1,4)")
    (True, False, False)
    """
    prediction, reference = _text(prediction), _text(reference)
    return _shared_pool().equal([([_answer_of(prediction)], reference_answer(reference))], timeout)[0]


def math_reward(response: str, reference: str) -> float:
    """1.0 if the final answer of the whole decoded response equals the reference, else 0.0."""
    return _shared_pool().score([(response, reference)])[0]


def choice_reward(response: str, reference_letter: str) -> float:
    """1.0 if the last letter the response gives is the reference letter (GPQA-Diamond), else 0.0."""
    return 1.0 if gives_choice(_text(response), _text(reference_letter)) else 0.0
