"""The answer checker, round two, as a spec: every kind of answer format a math model writes, each decided
both ways (equal and not equal) against verdicts decided by hand; the explicit policies (units, degrees,
log base, 1,000, <think>); intervals decided fast; and the pool's other graders (math-verify, a user's
reward function) running in the same time-bounded workers."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import preloaded
import pytest

from grading import grader
from reward import RewardPool, candidate_answers, extract_answer, is_equiv

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent

# (whole response, reference answer, hand verdict) by kind; every kind has both verdicts.
RESPONSES = {
    "no box: final-answer statements": [
        ("Adding the parts gives 12 + 30. The answer is 42.", "42", True),
        ("So the final answer is $\\frac{3}{4}$. Let me know if you need more.", "0.75", True),
        ("Work...\n\n**Final Answer**\n\n$$ 17 $$", "17", True),
        ("Work...\nAnswer: $x = 5$", "5", True),
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72", True),
        ("Final Answer: The final answer is $10,455$. I hope it is correct.", "10455", True),
        ("The area is $5\\cdot 6 = 30$.\n\n30", "30", True),
        ("Final Answer: The largest $n$ is 34.", "34", True),
        ("So, the final answer is 12 apples.", "12", True),
        ("The final answer is $x = 2$ or $x = 3$.", "2, 3", True),
        ("The final answer is $x = 2$ or $x = 3$.", "2, 4", False),
        ("The answer is 3 (not 4).", "3", True),
        ("The answer is 41, not 42.", "42", False),
        ("I think it is 5, but let me check the other case first", "5", False),
        ("We may check our answer: $17 \\cdot 44 = 748$, so our answer is correct.", "748", False),
        ("Work...\n\n**Final Answer**\n\n$$ 18 $$", "17", False),
        ("Final Answer: The final answer is \"$12 $ and $13 $\". I hope it is correct.", "12, 13", True),
        ("Natalia sold them all.\n#### \\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})", True),
    ],
    "no box: the one value of a final-answer statement in words": [
        ("Final Answer: Jane started growing Sphere 3 hours ago. I hope it is correct.", "3", True),
        ("Final Answer: Jane started growing Sphere 3 hours ago. I hope it is correct.", "8", False),
        ("Final Answer: Jane started 3 hours before Rod, who started 8 hours ago.", "3", False),  # two values
    ],
    "no box: a concluding sentence": [
        ("... P(A) = 2/3 Therefore, the probability that Alice wins is 2/3. <|im_start|>user", "2/3", True),
        ("Therefore, there are 12 distinct arithmetic sequences that meet the conditions.", "12", True),
        ("Thus, the error in the position increases by 100%.", "100\\%", True),
        ("Thus $x <= 2$ is our answer.", "x \\leq 2", True),
        ("Therefore $x \\geq 5$ is the solution.", "x > 5", False),
        ("Therefore, we must check 4 more cases.", "4", False),  # a value, but not a result
        ("Therefore, there are 12 distinct arithmetic sequences that", "12", False),  # cut off mid-sentence
        ("Thus x cannot be 5.", "5", False),
    ],
    "no box: a value that closes the response": [
        ("the number is not 10 which is 1,000.99€", "1000.99", True),
        ("not it's not 10 it's 1,000.99m²", "1000.99", True),
        ("The probability is $\\frac{5}{12}$, which is about 0.42.", "\\frac{5}{12}", True),
        ("the number is not 10 which is 1,000.99€", "10", False),
        ("I think it is 5, but I still have to check the other case", "5", False),
        ("The smallest such number is **1024**.", "1024", True), ("The roots are 2 and 3.", "2, 3", True),
        ("Therefore, the roots are $2$ and $3$.", "2, 3", True),
        ("Therefore, the roots are $2$ and $3$.", "3", False), ("The roots are 2 and 3.", "2, 4", False),
    ],
    "<think>: the final statement after it wins": [
        ("<think>maybe \\boxed{3}</think>\nThe answer is 4.", "4", True),
        ("<think>maybe \\boxed{3}</think>\nThe answer is 4.", "3", False),
        ("<think>it is \\boxed{3}</think>\nSo we are done.", "3", True),  # nothing stated after: the box
        ("\\boxed{5}. Final answer: 6", "6", True),
        ("\\boxed{5}. Final answer: 6", "5", False),
    ],
    "references that are whole solutions": [
        ("\\boxed{14916}", "the smallest is $14{,}912$, not a multiple of 3; next $\\boxed{14{,}916}$ is.", True),
        ("\\boxed{14912}", "the smallest is $14{,}912$, not a multiple of 3; next $\\boxed{14{,}916}$ is.", False),
        ("\\boxed{-2, 1}", "The roots are \\(\\boxed{1}\\) and \\(\\boxed{-2}\\).", True),
        ("\\boxed{-2}", "The roots are \\(\\boxed{1}\\) and \\(\\boxed{-2}\\).", False),
        ("the answer is 8", "Counting the cases one by one, the answer is 8.", True),
        ("the answer is 9", "Counting the cases one by one, the answer is 8.", False),
        ("\\boxed{1, 2}", "\\boxed{1} papers and \\boxed{2} bins", True),
        ("\\boxed{1, 2}", "\\boxed{1} no no no no no \\boxed{2}", False),  # no connective: the last box
        ("\\boxed{840}", "so \\boxed{840}.,but let me explain.\n\n**Final Answer**\n\\boxed{840}", True),
        ("\\boxed{35 cm, 4}", "$\\\\boxed{35 cm} ++++++ \\\\boxed{4}$", True),  # escaped twice
        ("\\boxed{4}", "$\\\\boxed{35 cm} ++++++ \\\\boxed{4}$", False),
        ("\\begin{matrix} x \\\\ \\frac12 \\end{matrix}", "\\\\begin{matrix} x \\\\\\\\ 0.5 \\\\end{matrix}", True),
    ],
}

# (answer, reference answer, hand verdict) by kind.
ANSWERS = {
    "thousands separators": [
        ("7,425,000", "7425000", True), ("1 000", "1000", True), ("1\\,000", "1000", True),
        ("1{,}000", "1000", True), ("1\u2009000", "1000", True), ("1,000.99", "1000.99", True),
        ("1,000", "1000", True),  # one number, not the list 1, 000 (policy: a list has a space)
        ("14 {, }916", "14916", True),
        ("1, 000", "1000", False), ("7,425,000", "742500", False), ("1 000", "100", False),
        ("14 {, }916", "14, 916", False),
    ],
    "mixed numbers written with a space": [
        ("1 1/2", "1.5", True), ("2 3/4", "\\frac{11}{4}", True),
        ("1 1/2", "\\frac{11}{2}", False), ("1 1/2", "0.5", False),
    ],
    "decimal comma, leading point, trailing zeros": [
        ("1000,99", "1000.99", True), ("2,74", "2.74", True), ("0,111", "0.111", True), (".4", "0.4", True),
        ("1000.0", "1000", True), ("4.50", "4.5", True),
        ("2,74", "27.4", False), (".4", "4", False), ("1000.01", "1000", False), ("3,5", "35", False),
    ],
    "currency and units glued to numbers": [
        ("\\$1,000.99", "1000.99", True), ("1,000.99$", "1000.99", True), ("€25", "25", True),
        ("25 dollars", "25", True), ("5cm", "5", True), ("12 meters", "12\\text{ m}", True),
        ("\\$26", "25", False), ("5cm", "6", False),
    ],
    "scientific notation": [
        ("3.2 \\times 10^5", "320000", True), ("3.2 x 10^5", "320000", True), ("3.2e5", "320000", True),
        ("1.5E-3", "0.0015", True), ("3.2 \\times 10^{-5}", "0.000032", True),
        ("3.2 \\times 10^5", "32000", False), ("3.2e5", "3.2", False),
    ],
    "percent in every spelling": [
        ("28\\%", "28\\%", True), ("28%", "28\\%", True), ("28 percent", "28\\%", True), ("28 pct", "28\\%", True),
        ("28percent", "28\\%", True), ("28 per cent", "28\\%", True), ("28\\text{ percent}", "28", True),
        ("0.28", "28\\%", True), ("28", "28\\%", True),
        ("2800", "28\\%", False), ("0.28", "28", False), ("27 percent", "28\\%", False), ("28\\%", "0.28\\%", False),
    ],
    "a/b against \\frac{a}{b}, with signs": [
        ("-1/2", "-\\frac{1}{2}", True), ("-1/2", "\\frac{-1}{2}", True), ("1/-2", "-0.5", True),
        ("\\frac{1}{-2}", "-\\frac12", True), ("-(3/4)", "-\\frac{3}{4}", True), ("(-3)/4", "-0.75", True),
        ("1/2", "-\\frac{1}{2}", False), ("\\frac{-1}{-2}", "-\\frac{1}{2}", False), ("2/1", "\\frac12", False),
    ],
    "intervals and sets": [
        ("(1,2)", "(1,2)", True), ("[-2, 7]", "-2 \\leq x \\leq 7", True), ("x \\in [-2,7]", "[-2,7]", True),
        ("(-\\infty, 2) \\cup (3, \\infty)", "x<2 \\text{ or } x>3", True), ("\\{1, 2\\}", "\\{2, 1\\}", True),
        ("[1,2] \\cup [3,4]", "[3,4] \\cup [1,2]", True),
        ("(1,2)", "(1,3)", False), ("[1,2)", "[1,2]", False), ("[1,2] \\cup [3,4]", "[1,2] \\cup [3,5]", False),
        ("\\{1, 2\\}", "\\{1, 3\\}", False),
    ],
    "stated precision (docs/reward.md: a decimal reference states its precision)": [
        ("\\frac{1}{3}", "0.33", True), ("\\pi", "3.14", True), ("\\sqrt{2}", "1.414", True),
        ("0.333333", "\\frac13", True), ("0.0833333333333333", "\\frac{1}{12}", True),
        ("0.3333", "\\frac13", True), ("1.4142", "\\sqrt{2}", True), ("0.66666666", "\\frac{2}{3}", True),
        ("2.314814814815 \\times 10^{-3}", "\\frac{1}{432}", True), ("2.3148e-3", "\\frac{1}{432}", True),
        ("0.33", "\\frac{1}{3}", False), ("\\frac{9}{20}", "0.5", False), ("4.51", "4.5", False),
        ("\\frac{1}{3}", "0.34", False), ("0.3334", "\\frac13", False), ("13.29", "\\frac{3840}{289}", False),
        ("0.6666", "\\frac{2}{3}", False), ("2.31e-3", "\\frac{1}{432}", False),
    ],
    "units (docs/reward.md: compared when both sides give one; no conversion)": [
        ("5\\text{ cm}", "5", True), ("5", "5\\text{ cm}", True), ("5 centimeters", "5\\text{ cm}", True),
        ("15 \\text{ cm}^2", "15 square centimeters", True), ("125\\textnormal{ miles}", "125 miles", True),
        ("5\\text{ cm}", "5\\text{ m}", False), ("5 m", "5 cm", False), ("15 \\text{ cm}^2", "15 \\text{ cm}", False),
        ("500\\text{ cm}", "5\\text{ m}", False),
    ],
    "degrees and radians (docs/reward.md: 90^\\circ is 90, not \\pi/2)": [
        ("90^\\circ", "90", True), ("90°", "90^{\\circ}", True), ("90 degrees", "90^\\circ", True),
        ("\\frac{\\pi}{2}", "\\frac{\\pi}{2}\\text{ radians}", True),
        ("90^\\circ", "\\frac{\\pi}{2}", False), ("\\frac{\\pi}{2}", "90^\\circ", False),
        ("90^\\circ", "90 radians", False),
    ],
    "degrees inside trigonometric functions (pi/180 there)": [
        ("\\sin(90^{\\circ}-x)", "\\cos(x)", True), ("\\sin 30^\\circ", "\\frac12", True),
        ("(1, 30^\\circ)", "(1, 30)", True),
        ("\\sin 30", "\\frac12", False), ("\\cos 60^\\circ", "\\frac{\\sqrt3}{2}", False),
    ],
    "log base (docs/reward.md: \\log without a base is equal only where equal in every base)": [
        ("\\log 8", "3\\log 2", True), ("\\log_2 8", "3", True), ("\\ln e^2", "2", True),
        ("\\log(ab)", "\\log a + \\log b", True),
        ("\\log 100", "2", False), ("\\ln 8", "\\log 8", False), ("\\log_{10} 100", "\\log 100", False),
    ],
    "definitions and equations": [
        ("x = 5", "5", True), ("(p,q) = (3,2)", "(3,2)", True), ("V_1:V_2 = 11:21", "11:21", True),
        ("AB=4, CD=5", "4, 5", True), ("x = 5+5+1 = 11", "11", True), ("y = 2x + 3", "2x - y + 3 = 0", True),
        ("1 = \\zzz = x = 0", "0", True), ("f(x) = 2x + 3", "y = 2x + 3", True),
        ("(5,2),(7,2)", "p=5,q=2;p=7,q=2", True),
        ("x = 5", "6", False), ("(p,q) = (3,2)", "(2,3)", False), ("y = 2x + 3", "x = 2y + 3", False),
        ("a + b = 2 + 3 = 5", "6", False), ("f(x) = 2x + 4", "y = 2x + 3", False),
        ("(5,2),(7,3)", "p=5,q=2;p=7,q=2", False),
    ],
    "approximations (the exact value before \\approx is the answer)": [
        ("x = 5+5+1 = 1/3 \\approx 11", "x = 1/3", True), ("x \\approx 11", "11", True),
        ("x=1/3\\approx0.33", "\\frac13", True),
        ("x \\approx 0.333", "\\frac13", False), ("x = \\frac{1}{4} \\approx 0.33", "\\frac13", False),
    ],
    "times of day (not ratios)": [
        ("20:34", "20:34:00", True), ("20:34", "08:34 \\text{P.M.}", True), ("8:34 am", "08:34", True),
        ("12:00", "1:00", False), ("8:34 am", "20:34", False), ("10:30", "10:30 \\text{ p.m.}", False),
    ],
    "ranges and vectors": [
        ("(0,1)", "0<f(x)<1", True), ("(0,1]", "1 \\geq f(x) > 0", True),
        ("\\begin{pmatrix} \\frac12 \\\\ 1 \\end{pmatrix}", "[0.5, 1]", True),
        ("(0,1)", "0<f(x)\\leq 1", False),
        ("\\begin{pmatrix} \\frac12 \\\\ 1 \\end{pmatrix}", "[0.5, 2]", False),
    ],
    "powers of positive names, numbers that are not numbers": [
        ("\\sqrt{\\frac{a}{b}}", "\\frac{\\sqrt a}{\\sqrt b}", True),
        ("\\frac{v_0}{r_0} \\frac{1}{(1+r/r_0)^{3/2}}",
         "\\frac{v_0 (\\frac{r_0}{r+r_0})^{0.5}}{r+r_0}", True),
        ("|x|", "x", False), ("1/0", "2/0", False), ("\\sqrt{\\frac{a}{b}}", "\\frac{\\sqrt a}{b}", False),
    ],
    "multiple-choice letters": [
        ("\\text{(B) } 5", "B", True), ("(C) 12", "C", True), ("\\textbf{(C)}", "C", True), ("b", "(b)", True),
        ("(A)", "B", False), ("5", "B", False),
    ],
    "counted things after a number": [
        ("7 people", "7", True), ("12", "12 \\text{ apples}", True), ("7 people", "8", False),
        ("12 apples", "12 oranges", False),
    ],
    "lists: and / or, several boxes": [
        ("(11,7)or(7,11)", "(7,11), (11,7)", True), ("1 and 2 and 3", "1, 2, 3", True),
        ("{1,2,3}", "1, 2, 3", True),
        ("19, 46, \\text{ and } 82", "19, 46, and 82", True), ("7, -2, \\text{ and } -5", "-5,-2,7", True),
        ("(11,7)or(7,12)", "(7,11), (11,7)", False), ("1 and 2", "1, 2, 3", False),
        ("x = 5 or x = -5", "\\pm 5", True),
        ("19, 46, and 83", "19, 46, and 82", False), ("x = 5 or x = -4", "\\pm 5", False),
    ],
}


def _cases(table: dict) -> list:
    return [pytest.param(*case, id=f"{kind}: {case[0][:40]!r} vs {case[1][:30]!r}")
            for kind, cases in table.items() for case in cases]


@pytest.fixture(scope="module")
def pool():
    with RewardPool(num_workers=2, timeout_s=5.0) as shared:
        yield shared


def test_every_kind_has_both_verdicts():
    for kind, cases in {**RESPONSES, **ANSWERS}.items():
        assert {expected for _, _, expected in cases} == {True, False}, kind


@pytest.mark.parametrize("response, reference, expected", _cases(RESPONSES))
def test_responses(pool, response, reference, expected):
    assert pool.score([(response, reference)]) == [float(expected)]


@pytest.mark.parametrize("answer, reference, expected", _cases(ANSWERS))
def test_answers(answer, reference, expected):
    assert is_equiv(answer, reference) is expected


@pytest.mark.parametrize("answer, reference, expected", _cases(ANSWERS))
def test_answers_inside_a_long_response(pool, answer, reference, expected):
    response = "<think>\n" + "Let me reconsider the previous step.\n" * 200 + "</think>\n\nSo the answer is " \
        f"$\\boxed{{{answer}}}$."
    assert pool.score([(response, reference)]) == [float(expected)]


def test_require_boxed_keeps_the_strict_reward(pool):
    with RewardPool(num_workers=1, require_boxed=True) as strict:
        pairs = [("The answer is 42.", "42"), ("The answer is \\boxed{42}.", "42"),
                 ("<think>\\boxed{3}</think> The answer is 4.", "3")]
        assert strict.score(pairs) == [0.0, 1.0, 1.0]
    assert pool.score(pairs) == [1.0, 1.0, 0.0]


def test_two_small_intervals_are_decided_fast():
    start = time.process_time()  # this process's CPU: the grader's work, whatever else the machine runs
    for prediction, reference in [("(1,2)", "(1,3)"), ("[-1, 4)", "(-1, 4]"), ("(0, \\sqrt{2})", "(0, 1.414)"),
                                  ("[1,2] \\cup [3,4]", "[1,2] \\cup [3,5]"), ("(-\\infty, 2]", "(-\\infty, 3]")]:
        assert grader.equivalent(prediction, reference) is False
    assert time.process_time() - start < 1.0


def test_a_tiny_difference_of_numbers_is_decided_fast_whatever_the_hash_seed():
    """2^{2^{-1000}} is not 1: decided by a certified evaluation, not by sympy's simplify (whose path, and
    time, depended on the hash seed: seed 1 ran past the 5 s timeout)."""
    code = ("from grading import grader; grader.equivalent('(x+1)^2 \\\\le 3', 'x^2+2x+1 \\\\leq 3'); "
            "print(grader.equivalent('[1,+\\\\infty)', '[2^{\\\\frac{1}{2^{1000}}}, \\\\infty)'))")
    for seed in ("0", "1"):
        finished = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                  timeout=30, env={**os.environ, "PYTHONHASHSEED": seed})
        assert finished.stdout.strip() == "False", finished.stderr


def test_extraction_order_of_preference():
    assert candidate_answers("\\boxed{5}. Final answer: 6") == ["6"]
    assert candidate_answers("<think>\\boxed{3}</think> so $4$") == ["4"]
    assert candidate_answers("<think>\\boxed{3}</think> done") == ["3"]
    assert extract_answer("Therefore, the probability that Alice wins is 2/3. <|im_start|>user") == "2/3"
    assert extract_answer("no statement at all here") is None


# ---- the pool's other graders: a user's reward function and math-verify

def length_reward(response: str, reference: str) -> float:
    """A user's reward: the response length / 1000; logs each response when NGRPO_TEST_REWARD_LOG is set."""
    if os.environ.get("NGRPO_TEST_REWARD_LOG"):
        with open(os.environ["NGRPO_TEST_REWARD_LOG"], "a") as log:
            log.write(json.dumps(response) + "\n")
    return len(response) / 1000


def hanging_reward(response: str, reference: str) -> float:
    if response == "hang":
        time.sleep(60)
    if response == "raise":
        raise RuntimeError("a bug in the user's reward")
    return float("nan") if response == "nan" else 0.5


def test_a_user_reward_function_runs_in_the_workers():
    with RewardPool(num_workers=2, reward_fn="test_grader:length_reward") as pool:
        assert pool.score([("abcd", "x"), ("", "y")]) == [0.004, 0.0]
    with RewardPool(num_workers=1, reward_fn=f"{HERE / 'test_grader.py'}:length_reward") as pool:
        assert pool.score([("a" * 250, "x")]) == [0.25]


def test_a_user_reward_function_is_bounded_and_never_raises():
    with RewardPool(num_workers=2, timeout_s=1.0, reward_fn="test_grader:hanging_reward") as pool:
        start = time.perf_counter()
        assert pool.score([("hang", ""), ("raise", ""), ("nan", ""), ("ok", "")]) == [0.0, 0.0, 0.0, 0.5]
        assert time.perf_counter() - start < 10.0


@pytest.mark.parametrize("spec, message", [("no_colon", "module:function"), ("nowhere_module:f", "cannot import"),
                                           ("test_grader:missing", "no function"), ("/no/such.py:f", "no file")])
def test_a_bad_reward_spec_is_one_clear_message(spec, message):
    with pytest.raises(ValueError, match=message):
        RewardPool(reward_fn=spec)


def test_unknown_grader_is_one_clear_message():
    with pytest.raises(ValueError, match="grader must be one of"):
        RewardPool(grader="sympy")


def _math_verify():
    return pytest.importorskip("math_verify", reason="math-verify is optional (pip install math-verify)")


def direct_math_verify(response: str, reference: str) -> float:
    """math-verify called directly, the way the released code asks it."""
    math_verify = _math_verify()
    gold = math_verify.parse(f"\\boxed{{{reference}}}")
    return 1.0 if math_verify.verify(gold, math_verify.parse(response)) else 0.0


@pytest.mark.extra
def test_math_verify_grader_equals_math_verify_called_directly():
    _math_verify()
    pairs = [("so \\boxed{\\frac{1}{2}}", "0.5"), ("The answer is $x = 5$", "5"), ("\\boxed{2}", "3"),
             ("\\boxed{90^\\circ}", "\\frac{\\pi}{2}"), ("\\boxed{5 cm}", "5 m"), ("\\boxed{(1,2)}", "(1,3)")]
    with RewardPool(num_workers=2, grader="math-verify") as pool:
        assert pool.score(pairs) == [direct_math_verify(*pair) for pair in pairs]


@pytest.mark.extra
def test_eval_with_math_verify_matches_math_verify_on_its_samples(shared_data, tmp_path):
    _math_verify()
    out = tmp_path / "out"
    math500 = str(shared_data / "eval" / "math500.jsonl")
    command = [sys.executable, "eval.py", "--model", "tiny", "--benchmarks", math500,
               "--limit", "6", "--n", "4", "--max-new-tokens", "16", "--out-dir", str(out), "--device", "cpu",
               "--grader", "math-verify"]
    finished = preloaded.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert finished.returncode == 0, finished.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["scored_by"] == {"grader": "math-verify", "reward": "", "require_boxed": False,
                                    "rel_tol": {"math500": 0.0}}
    import data
    answers = {p["id"]: p["answer"] for p in data.load_problems(str(shared_data / "eval" / "math500.jsonl"))}
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    direct = [direct_math_verify(sample["response"], answers[sample["problem_id"]]) for sample in samples]
    assert [sample["correct"] for sample in samples] == [score == 1.0 for score in direct]
    assert len(samples) == 24 and results["math500"]["mean@4"] == pytest.approx(sum(direct) / len(direct))


def test_a_user_reward_is_the_training_reward(tmp_path):
    log = tmp_path / "responses.jsonl"
    out = tmp_path / "run"
    command = [sys.executable, "train.py", "--preset", "tiny", "--max-steps", "1", "--out-dir", str(out),
               "--reward", "test_grader:length_reward", "--prompts-per-step", "8", "--mini-batch-prompts", "4",
               "--max-new-tokens", "16"]
    environment = {**os.environ, "NGRPO_TEST_REWARD_LOG": str(log), "PYTHONPATH": str(HERE)}
    finished = preloaded.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=environment)
    assert finished.returncode == 0, finished.stderr
    responses = [json.loads(line) for line in log.read_text().splitlines()]
    step = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert len(responses) == 8 * 4 and step["reward_mean"] > 0
    assert step["reward_mean"] == pytest.approx(sum(len(r) / 1000 for r in responses) / len(responses), abs=1e-6)
