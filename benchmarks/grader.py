"""`python bench.py grader`: the reward checker (reward.py + grading/) on a realistic answer mix: speed,
accuracy on equivalent and wrong rewritings, and agreement with math-verify on a format corpus."""

import argparse
import importlib.util
import json
import math
import os
import random
import re
import statistics
import time
from fractions import Fraction

import reward
from benchmarks.common import EVAL_DATA, above_0, at_least_1, emit, latency_ms, note
from grading import grader

# Used when ../shared/data is absent: answers in the shapes MATH-500 has, with a one-line solution each.
GENERATED_ANSWERS = [
    "204", "025", "-1", "10,\\!080", "\\frac{14}{3}", "\\dfrac{33}{100}", "\\frac 59", "1.25", ".0000672",
    "3\\sqrt{13}", "\\frac{\\sqrt{3}}{3}", "288 \\pi", "-\\frac{\\pi}{6}", "6 - 5i", "1+274i",
    "x^5 - x^4 + x^3 - x^2 + x - 1", "(a+5)(b+2)", "2k+2", "\\left( 3, \\frac{\\pi}{2} \\right)", "(6,31,-1)",
    "1,-2", "3, 5, 7", "1 \\pm \\sqrt{19}", "(3,4]", "(-\\infty, 2) \\cup (3, \\infty)", "x \\in [-2,7]",
    "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}", "\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}",
    "y = 2x + 3", "5x - 7y + 11z + 4 = 0", "90^\\circ", "\\text{Evelyn}", "\\text{(C)}", "52_8",
    "864 \\mbox{ inches}^2", "\\$32,\\!348", "1\\frac{4}{5}", "\\cot x", "p - q", "\\{1\\pm\\sqrt{5},-2\\}",
]
FILLER = [
    "Let me re-read the problem to make sure I have the setup right.",
    "We can check this value by substituting it back into the original equation.",
    "Hmm, wait. Let me reconsider the previous step, since the sign might be off.",
    "Expanding the product and collecting like terms gives a simpler expression.",
    "This matches the constraint given in the problem, so the case is consistent.",
    "Alternatively, we could count the complementary cases and subtract from the total.",
]


def load_problems() -> tuple[str, list[dict]]:
    """("math500", its {answer, solution} rows), or a generated stand-in when ../shared/data is absent."""
    path = EVAL_DATA / "math500.jsonl"
    if path.is_file():
        return "math500", [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    note(f"{path} not found: benchmarking a generated mix of {len(GENERATED_ANSWERS)} MATH-style answers instead")
    return "generated", [{"answer": answer, "solution": f"{FILLER[i % len(FILLER)]} So it is $\\boxed{{{answer}}}$."}
                         for i, answer in enumerate(GENERATED_ANSWERS)]


_INTEGER = re.compile(r"-?\d+")
_FRACTION = re.compile(r"(-?)\\d?frac\{(\d+)\}\{(\d+)\}")
_DECIMAL = re.compile(r"-?\d*\.\d+")
_TERMS = re.compile(r"(?<=[^\s^_{(+\-=,])\s*(?=[+-])")  # a top-level + or - that starts a term


def _depth_zero_split(text: str, pattern: re.Pattern) -> list[str]:
    """Split at pattern matches outside any brackets."""
    depth, start, parts = 0, 0, []
    for match in re.finditer(r"[{(\[]|[})\]]|" + pattern.pattern, text):
        token = match.group()
        if token in "{([":
            depth += 1
        elif token in "})]":
            depth -= 1
        elif depth == 0 and match.start() > start:
            parts.append(text[start:match.start()].strip())
            start = match.end()
    return parts + [text[start:].strip()]


def equivalent_rewriting(answer: str, rng: random.Random) -> str:
    """The same answer written another way a model might write it (one of the rewrites that apply)."""
    text = answer.strip()
    options = []
    if _INTEGER.fullmatch(text):
        n = int(text)
        options += [f"{n}.0", f"\\frac{{{2 * n}}}{{2}}", f"x = {n}", f"{n}\\text{{ units}}",
                    f"{n:,}" if abs(n) >= 1000 else f"00{n}" if n >= 0 else f"-0{-n}"]
    fraction = _FRACTION.fullmatch(text)
    if fraction:
        sign, numerator, denominator = fraction.group(1), int(fraction.group(2)), int(fraction.group(3))
        options += [f"{sign}{numerator}/{denominator}", f"{sign}\\dfrac{{{3 * numerator}}}{{{3 * denominator}}}",
                    f"\\frac{{{sign}{numerator}}}{{{denominator}}}"]
        reduced = denominator // math.gcd(numerator, denominator)
        if reduced == 2 ** _exponent_of(reduced, 2) * 5 ** _exponent_of(reduced, 5):  # a terminating decimal
            options.append(f"{sign}{numerator / denominator:.12g}")
    if _DECIMAL.fullmatch(text):
        value = Fraction(text)
        options += [text + "0", f"{'-' if value < 0 else ''}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"]
    if re.fullmatch(r"(?:\\\$)?\d{1,3}(?:,(?:\\!)?\s*\d{3})+", text):  # 10,\!080
        options.append(text.replace(",", "").replace("\\!", "").replace(" ", ""))
    for pattern, rewrite in _REWRITES:
        match = re.fullmatch(pattern, text)
        if match:
            options.append(rewrite(match))
    if "pmatrix" in text:
        options.append(text.replace("pmatrix", "bmatrix"))
    if text.count("=") == 1 and "\\in" not in text:
        left, right = text.split("=")
        options.append(f"{right.strip()} = {left.strip()}")
    items = _depth_zero_split(text, re.compile(","))
    if len(items) > 1 and not options:
        options.append(", ".join(reversed(items)))  # an unordered list of solutions
    if text[0] in "([" and text[-1] in ")]" and len(items) == 1:
        options.append("\\left" + text[0] + " " + text[1:-1].replace(",", ", ") + " \\right" + text[-1])
    terms = _depth_zero_split(text, _TERMS) if not re.search(r"\\pm|\\cup|=|,|\\\$|\\text|\\begin", text) else []
    if len(terms) > 1:
        signed = [term if term[0] in "+-" else "+" + term for term in terms]
        options.append("".join(reversed(signed)).lstrip("+"))
    if "\\frac" in text:
        options.append(text.replace("\\frac", "\\dfrac"))
    return rng.choice(options or [f"\\displaystyle {text}"])


_REWRITES = [  # (whole-answer pattern, equivalent form)
    (r"(\d+)_\{?(\d+)\}?", lambda m: f"{m.group(1)}_{{{m.group(2)}}}"),
    (r"([\d.]+)\s*\\(?:mbox|text)\{[^{}]*\}(?:\^2)?", lambda m: m.group(1)),
    (r"x \\in (.*)", lambda m: m.group(1)),
    (r"\\\{(.*)\\\}", lambda m: "\\{" + ", ".join(reversed(_depth_zero_split(m.group(1), re.compile(",")))) + "\\}"),
    (r"\\text\{\(([A-E])\)\}", lambda m: m.group(1)),
    (r"\\text\{\(([A-E])\)\}", lambda m: f"\\textbf{{({m.group(1)})}}"),
    (r"\\text\{([A-Za-z ]+)\}", lambda m: m.group(1).lower()),
    (r"(\d+)\s*\^\s*\\circ", lambda m: m.group(1)),
    (r"(\d+)\s*\^\s*\\circ", lambda m: f"{m.group(1)}°"),
    (r"(\d+)\s*\\sqrt\{?(\d+)\}?", lambda m: f"\\sqrt{{{int(m.group(1)) ** 2 * int(m.group(2))}}}"),
    (r"\\sqrt\{(\d+)\}", lambda m: f"{m.group(1)}^{{1/2}}"),
    (r"(\d+)\s*(\\pi|\\sqrt\{\d+\})", lambda m: f"{m.group(2)} \\cdot {m.group(1)}"),
    (r"\\frac\{([^{}]+)\}\{([^{}]+)\}", lambda m: f"({m.group(1)})/({m.group(2)})"),
    (r"-\\frac\{([^{}]+)\}\{([^{}]+)\}", lambda m: f"\\frac{{-{m.group(1)}}}{{{m.group(2)}}}"),
]


def _exponent_of(n: int, p: int) -> int:
    count = 0
    while n % p == 0:
        n, count = n // p, count + 1
    return count


def wrong_rewriting(answer: str) -> str:
    """A different answer of the same shape: the first integer incremented (3\\sqrt{13} -> 4\\sqrt{13})."""
    text = answer.strip()
    match = re.fullmatch(r"\\text\{\(([A-E])\)\}", text)
    if match:
        return f"\\text{{({'ABCDEA'['ABCDE'.index(match.group(1)) + 1]})}}"
    if re.fullmatch(r"\\text\{[A-Za-z ]+\}", text):
        return "\\text{none of these}"
    number = re.search(r"\d+", text)
    if number:
        return text[:number.start()] + str(int(number.group()) + 1) + text[number.end():]
    return f"{text} + 1"


def response_of(solution: str, final_answer: str, padding: list[str], target_chars: int, rng: random.Random) -> str:
    """An R1-style response of about target_chars: reasoning padded with other solutions' text, then the
    answer in a box."""
    think = [solution.replace("\\boxed", "")]
    while sum(map(len, think)) < target_chars - 300:
        think.insert(rng.randrange(len(think) + 1), rng.choice(padding).replace("\\boxed", ""))
        think.insert(rng.randrange(len(think) + 1), rng.choice(FILLER))
    return ("<think>\n" + "\n\n".join(think)[:target_chars - 300] + "\n</think>\n\n"
            f"Putting the steps together, the final answer is $\\boxed{{{final_answer}}}$.")


def accuracy(scores: list[float], expected: list[float]) -> float:
    return round(sum(s == e for s, e in zip(scores, expected)) / len(scores), 4)


def timed_singly(check, pairs: list[tuple]) -> dict:
    """Median / p99 latency of check(a, b) over the pairs, one call at a time."""
    seconds = []
    for a, b, *_ in pairs:
        start = time.perf_counter()
        check(a, b)
        seconds.append(time.perf_counter() - start)
    return latency_ms(seconds)


def bench_grader(args: argparse.Namespace) -> None:
    """Throughput (RewardPool, warm workers) and one-at-a-time latency (is_equiv / math_reward, one shared
    worker) on MATH-500 reference answers against themselves, equivalent rewritings and wrong answers;
    ~8k-character responses; adversarial inputs; agreement with math-verify when it is installed."""
    rng = random.Random(args.seed)
    source, problems = load_problems()
    references = [str(problem["answer"]) for problem in problems]
    cases = {
        "self": [(reference, reference, 1.0) for reference in references],
        "equivalent": [(equivalent_rewriting(reference, rng), reference, 1.0) for reference in references],
        "wrong": [(wrong_rewriting(reference), reference, 0.0) for reference in references],
    }
    padding = [problem["solution"] for problem in problems]
    long_pairs = []  # (response, reference, expected)
    for index in range(args.responses):
        problem = problems[index % len(problems)]
        prediction, reference, expected = list(cases.values())[index % 3][index % len(problems)]
        long_pairs.append((response_of(problem["solution"], prediction, padding, args.response_chars, rng),
                           reference, expected))
    workers = args.workers or min(8, os.cpu_count() or 1)

    def report(case: str, pairs: int, **fields) -> None:
        emit({"bench": "grader", "case": case, "pairs": pairs, "workers": workers, "timeout_s": args.timeout_s,
              **fields})

    start = time.perf_counter()
    with reward.RewardPool(num_workers=workers, timeout_s=args.timeout_s) as pool:
        pool.score([(response, reference) for response, reference, _ in long_pairs])
    cold_s = time.perf_counter() - start

    with reward.RewardPool(num_workers=workers, timeout_s=args.timeout_s) as pool:
        pool.start()  # the workers up outside the timings
        reward.is_equiv("\\sqrt{8}", "2\\sqrt{2}")  # and the shared one behind is_equiv / math_reward
        for case, pairs in cases.items():
            start = time.perf_counter()
            scores = pool.score([(f"So the answer is $\\boxed{{{prediction}}}$.", reference)
                                 for prediction, reference, _ in pairs])
            elapsed_s = time.perf_counter() - start
            in_process = sum(grader.fast_verdict(p, r) is not None for p, r, _ in pairs) / len(pairs)
            report(f"{source} {case}", len(pairs), pairs_per_s=round(len(pairs) / elapsed_s, 1),
                   **timed_singly(lambda p, r: reward.is_equiv(p, r, timeout=args.timeout_s), pairs),
                   accuracy=accuracy(scores, [e for _, _, e in pairs]), decided_in_process=round(in_process, 3))
            for score, (prediction, reference, expected) in zip(scores, pairs):
                if score != expected:
                    note(f"grader {case}: {prediction!r} vs {reference!r} scored {score}, expected {expected}")

        hard = [pair for pairs in cases.values() for pair in pairs if grader.fast_verdict(pair[0], pair[1]) is None]
        start = time.perf_counter()
        scores = pool.score([(f"\\boxed{{{prediction}}}", reference) for prediction, reference, _ in hard])
        elapsed_s = time.perf_counter() - start
        report(f"{source} pairs that need sympy", len(hard), pairs_per_s=round(len(hard) / elapsed_s, 1),
               **timed_singly(lambda p, r: reward.is_equiv(p, r, timeout=args.timeout_s), hard),
               accuracy=accuracy(scores, [e for _, _, e in hard]))

        start = time.perf_counter()
        scores = pool.score([(response, reference) for response, reference, _ in long_pairs])
        elapsed_s = time.perf_counter() - start
        report(f"responses of ~{args.response_chars} chars", len(long_pairs), seconds=round(elapsed_s, 3),
               cold_start_seconds=round(cold_s, 3), pairs_per_s=round(len(long_pairs) / elapsed_s, 1),
               **timed_singly(reward.math_reward, long_pairs), accuracy=accuracy(scores, [e for _, _, e in long_pairs]),
               mean_chars=round(statistics.mean(len(r) for r, _, _ in long_pairs)))

        adversarial = ["\\boxed{9^{9^{9^9}}}", "\\boxed{10^{10^{10^{10}}}}", "\\boxed{1000000!}",
                       "\\boxed{" + "7" * 100_000 + "}", "\\boxed{" + "(" * 2000 + "1" + ")" * 2000 + "}",
                       "x" * 1_000_000 + "\\boxed{5", "\\boxed{" * 5000, "\\boxed{\x00\x1b\x7f}", "\\boxed{}",
                       "\\boxed{(x+y+z+1)^{30}(x-y-z-1)^{30}}"]  # the last: a true identity too slow to expand
        seconds, scores = [], []
        for response in adversarial:
            start = time.perf_counter()
            scores += pool.score([(response, "(x^2-(y+z+1)^2)^{30}")])
            seconds.append(time.perf_counter() - start)
        report("adversarial", len(adversarial), max_ms=round(1000 * max(seconds), 1), **latency_ms(seconds),
               all_zero=scores == [0.0] * len(adversarial))

    if args.math_verify:
        compare_with_math_verify(args, workers)


# The format corpus: each benchmark reference against its own rewritings in the formats of
# docs/reward.md (expected equal), near misses (expected unequal), and inside long responses with and without
# \boxed. Built at run time from ../shared/data's math sets; nothing of them is stored in the repo.

FORMAT_SETS = ("math500", "aime24", "aime25", "amc23")


def _grouped(n: int, separator: str) -> str:
    return f"{n:,}".replace(",", separator)


def _number_forms(value: Fraction, reference: str) -> list[tuple[str, str, bool]]:
    """(kind, prediction, expected) for a reference that is a plain number."""
    forms = []
    if value.denominator == 1:
        n = value.numerator
        if abs(n) >= 1000:
            forms += [("thousands separators", _grouped(n, sep), True) for sep in (",", " ", "\\,", "{,}", "\u2009")]
            forms += [("thousands separators", _grouped(n + 1, ","), False),
                      ("thousands separators", _grouped(n, ", "), False)]  # "1, 000" is a list
            digits = str(abs(n))
            if digits.endswith("0"):
                significant, places = digits.rstrip("0"), len(digits) - 1
                text = ("-" if n < 0 else "") + significant[0] + ("." + significant[1:] if len(significant) > 1 else "")
                forms += [("scientific notation", f"{text} \\times 10^{{{places}}}", True),
                          ("scientific notation", f"{text}e{places}", True),
                          ("scientific notation", f"{text} \\times 10^{{{places + 1}}}", False)]
        forms += [("trailing zeros", f"{n}.0", True), ("trailing zeros", f"{n}.01", False),
                  ("currency and units glued", f"\\${n}", True), ("currency and units glued", f"{n} dollars", True),
                  ("currency and units glued", f"{n}\\text{{ cm}}", True),
                  ("currency and units glued", f"\\${n + 1}", False)]
        if n:
            forms.append(("sign", str(-n), False))
    else:
        p, q = value.numerator, value.denominator
        forms += [("a/b against \\frac", f"{p}/{q}", True), ("a/b against \\frac", f"\\frac{{{p}}}{{{q}}}", True),
                  ("a/b against \\frac", f"{'-' if p < 0 else ''}\\dfrac{{{abs(p)}}}{{{q}}}", True),
                  ("a/b against \\frac", f"{q}/{p}", False), ("a/b against \\frac", f"{-p}/{q}", False)]
        if _terminates(q):
            decimal = f"{float(value):.12g}"
            forms += [("decimals", decimal, True), ("decimals", decimal + "1", False)]
            if 0 < value < 1:
                forms.append(("leading point", decimal.lstrip("0"), True))
            if "e" not in decimal and len(decimal.split(".")[1]) != 3:
                forms += [("decimal comma", decimal.replace(".", ","), True),
                          ("decimal comma", f"{float(value) * 10:.12g}".replace(".", ","), False)]
        else:
            forms += [("decimals written out", f"{float(value):.8f}", True),
                      ("decimals written out", f"{float(value):.2f}", False)]
    return forms


def _terminates(denominator: int) -> bool:
    return denominator == 2 ** _exponent_of(denominator, 2) * 5 ** _exponent_of(denominator, 5)


def format_cases(reference: str) -> list[tuple[str, str, bool]]:
    """(kind, prediction, expected verdict) rewritings of one reference answer in the formats of the issue."""
    answer = grader.normalize(reference)
    value = grader.plain_number(answer.text)
    forms = []
    if value is not None and not answer.percent and not answer.unit:
        forms += _number_forms(value, reference)
    if answer.percent and value is not None:
        number = answer.text
        forms += [("percent", f"{number}{spelling}", True) for spelling in ("%", "\\%", " percent", " pct", "percent")]
        forms += [("percent", f"{number}\\text{{ percent}}", True), ("percent", f"{value + 1}%", False)]
    if answer.unit == "degree" and value is not None:
        forms += [("degrees", f"{answer.text}°", True), ("degrees", f"{answer.text} degrees", True),
                  ("degrees", f"\\frac{{{answer.text}\\pi}}{{180}}", False)]
    elif answer.unit and value is not None:
        forms += [("units", f"{answer.text}", True), ("units", f"{answer.text}\\text{{ km}}", answer.unit == "km"),
                  ("units", f"{value + 1}\\text{{ {answer.unit}}}", False)]
    interval = re.fullmatch(r"([(\[])([^,()\[\]]+),([^,()\[\]]+)([)\]])", answer.text)
    if interval:
        opener, left, right, closer = interval.groups()
        swapped = {"(": "[", "[": "("}[opener] if "infty" not in left else opener
        forms += [("intervals", f"\\left{opener} {left}, {right} \\right{closer}", True),
                  ("intervals", f"{swapped}{left},{right}{closer}", swapped == opener)]
    items = _depth_zero_split(answer.text, re.compile(",")) if not interval else []
    if len(items) > 1 and not re.search(r"\\begin|\\\{", answer.text):
        forms += [("lists", ", ".join(reversed(items)), answer.text[0] not in "(["),
                  ("lists", ", ".join(items[:-1]), False)]
    return forms


def long_response(solution: str, final_part: str, rng: random.Random, padding: list[str], chars: int) -> str:
    """An R1-style response: a <think> block of about `chars` characters (the solution padded with other
    solutions, boxes removed), then `final_part`."""
    think = [solution.replace("\\boxed", "")]
    while sum(map(len, think)) < chars:
        think.insert(rng.randrange(len(think) + 1), rng.choice(padding).replace("\\boxed", ""))
        think.insert(rng.randrange(len(think) + 1), rng.choice(FILLER))
    return "<think>\n" + "\n\n".join(think)[:chars] + "\n</think>\n\n" + final_part


RESPONSE_FORMS = {  # kind -> how the final part of a response states the answer A (or the wrong W in <think>)
    "response: boxed": "Putting the steps together, the final answer is $\\boxed{{{A}}}$.",
    "response: 'the answer is', no box": "Putting the steps together, the answer is ${A}$.",
    "response: 'Final Answer' heading, no box": "**Final Answer**\n\n$${A}$$",
    "response: 'Answer:' line, no box": "So we are done.\n\nAnswer: ${A}$",
    "response: GSM8K ####, no box": "So we are done.\n#### {A}",
}


def response_cases(problems: list[dict], rng: random.Random, chars: int, every: int) -> list[tuple]:
    """(kind, response, reference, expected): every `every`-th reference inside long responses, right and
    wrong, in each of RESPONSE_FORMS, and a box inside <think> against a different final statement."""
    padding = [problem["solution"] for problem in problems if problem.get("solution")]
    cases = []
    for index, problem in enumerate(problems[::every]):
        reference, solution = str(problem["answer"]), problem.get("solution") or rng.choice(padding)
        wrong = wrong_rewriting(reference)
        for kind, template in RESPONSE_FORMS.items():
            for answer, expected in ((reference, True), (wrong, False)):
                cases.append((kind, long_response(solution, template.format(A=answer), rng, padding, chars),
                              reference, expected))
        think = (f"<think>\nSo it is $\\boxed{{{wrong}}}$. Wait, let me recheck.\n</think>\n\n"
                 f"The answer is ${reference}$.")
        cases.append(("response: box in <think>, final statement after", think, reference, True))
        think = (f"<think>\nSo it is $\\boxed{{{reference}}}$. Wait, let me recheck.\n</think>\n\n"
                 f"The answer is ${wrong}$.")
        cases.append(("response: box in <think>, final statement after", think, reference, False))
    return cases


def load_format_problems() -> list[dict]:
    """The reference answers (and solutions) of the math benchmark files in ../shared/data."""
    problems = []
    for name in FORMAT_SETS:
        path = EVAL_DATA / f"{name}.jsonl"
        if path.is_file():
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            problems += [{"set": name, "answer": _answer_string(row["answer"]), "solution": row.get("solution", "")}
                         for row in rows]
    return problems


def _answer_string(answer) -> str:
    return str(int(answer)) if isinstance(answer, float) and answer.is_integer() else str(answer)


def compare_with_math_verify(args: argparse.Namespace, workers: int) -> None:
    """The format corpus scored by ours and by math-verify (in our pool: same timeout); agreement overall and
    by kind, each grader's accuracy against the expected verdicts, false positives, precision and recall (of the
    pairs expected equal), and every disagreement on stderr."""
    if importlib.util.find_spec("math_verify") is None:
        note("math-verify is not installed (pip install math-verify): skipping the agreement check")
        return
    rng = random.Random(args.seed)
    problems = load_format_problems()
    if not problems:
        note(f"no benchmark files under {EVAL_DATA}: skipping the agreement check")
        return
    cases = [(kind, f"So the answer is $\\boxed{{{prediction}}}$.", problem["answer"], expected)
             for problem in problems for kind, prediction, expected in format_cases(problem["answer"])]
    cases += [(kind, f"So the answer is $\\boxed{{{prediction}}}$.", problem["answer"], expected)
              for problem in problems for kind, prediction, expected in
              [("self", problem["answer"], True), ("near miss", wrong_rewriting(problem["answer"]), False)]]
    cases += response_cases(problems, rng, args.corpus_response_chars, every=args.corpus_every)
    pairs = [(response, reference) for _, response, reference, _ in cases]
    scores = {}
    for name in ("ours", "math-verify"):
        with reward.RewardPool(num_workers=workers, timeout_s=args.timeout_s, grader=name) as pool:
            pool.start()
            pool.score(pairs[:workers])  # each worker's first check (a grader's lazy imports) outside the timing
            start = time.perf_counter()
            scores[name] = pool.score(pairs)
            scores[name + " seconds"] = time.perf_counter() - start
    by_kind = {}
    for (kind, response, reference, expected), ours, theirs in zip(cases, scores["ours"], scores["math-verify"]):
        row = by_kind.setdefault(kind, {"pairs": 0, "agree": 0, "ours_right": 0, "math_verify_right": 0,
                                        "ours_false_positives": 0, "math_verify_false_positives": 0, "positives": 0,
                                        "ours_true_positives": 0, "math_verify_true_positives": 0})
        row["pairs"] += 1
        row["positives"] += bool(expected)
        row["ours_true_positives"] += ours == 1.0 and bool(expected)
        row["math_verify_true_positives"] += theirs == 1.0 and bool(expected)
        row["agree"] += ours == theirs
        row["ours_right"] += ours == expected
        row["math_verify_right"] += theirs == expected
        row["ours_false_positives"] += ours == 1.0 and not expected
        row["math_verify_false_positives"] += theirs == 1.0 and not expected
        if ours != theirs:
            note(f"disagreement [{kind}] reference {reference!r}, expected {expected}, ours {ours}, "
                 f"math-verify {theirs}: ...{response[-160:]!r}")
    for kind, row in by_kind.items():
        emit({"bench": "grader", "case": f"corpus: {kind}", **row})
    totals = {key: sum(row[key] for row in by_kind.values()) for key in next(iter(by_kind.values()))}
    emit({"bench": "grader", "case": "corpus: all (agreement with math-verify)", **totals,
          "agreement": round(totals["agree"] / totals["pairs"], 4),
          "ours_accuracy": round(totals["ours_right"] / totals["pairs"], 4),
          "math_verify_accuracy": round(totals["math_verify_right"] / totals["pairs"], 4),
          **{f"{name}_{measure}": round(totals[f"{name}_true_positives"] / max(denominator, 1), 4)
             for name in ("ours", "math_verify") for measure, denominator in (
                 ("precision", totals[f"{name}_true_positives"] + totals[f"{name}_false_positives"]),
                 ("recall", totals["positives"]))},
          "ours_pairs_per_s": round(len(pairs) / scores["ours seconds"], 1),
          "math_verify_pairs_per_s": round(len(pairs) / scores["math-verify seconds"], 1),
          "sets": sorted({problem["set"] for problem in problems}), "workers": workers})


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("grader", help="reward checker: speed, accuracy, agreement with math-verify")
    parser.add_argument("--workers", type=at_least_1, default=None, help="RewardPool workers (default: min(8, CPUs))")
    parser.add_argument("--timeout-s", type=above_0, default=5.0, help="per-check time limit")
    parser.add_argument("--responses", type=at_least_1, default=256, help="number of long responses")
    parser.add_argument("--response-chars", type=at_least_1, default=8000, help="length of each long response")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-math-verify", dest="math_verify", action="store_false",
                        help="skip the agreement check even when math-verify is installed")
    parser.add_argument("--corpus-every", type=at_least_1, default=5,
                        help="format corpus: every N-th reference also goes inside long responses")
    parser.add_argument("--corpus-response-chars", type=at_least_1, default=3000,
                        help="format corpus: length of the <think> part of each long response")
    parser.set_defaults(run=bench_grader)
