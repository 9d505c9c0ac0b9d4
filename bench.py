"""Benchmarks. Each prints one JSON line per measurement to stdout; notes go to stderr.

    python bench.py grader              # the reward checker (reward.py) on a realistic answer mix
    python bench.py rollout             # the sampler (rollout.py) against transformers' generate
    python bench.py train               # the training log-prob path (ngrpo.py) against full logits
    python bench.py neighbors           # the neighbor table (neighbors.py); --device cuda: the 1.5B shape

Each benchmark is one function `bench_NAME(args)` with its own subcommand in `main()`; add new ones
(rollout, train, ...) the same way.
"""

import argparse
import json
import math
import os
import random
import re
import statistics
import sys
import time
from fractions import Fraction
from pathlib import Path

# ../shared/data beside the repo; NGRPO_SHARED_DATA points elsewhere (e.g. a copy carried to a GPU machine).
SHARED_DATA = Path(os.environ.get("NGRPO_SHARED_DATA") or Path(__file__).resolve().parent.parent / "shared" / "data")
EVAL_DATA = SHARED_DATA / "eval"


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def latency_ms(seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    return {"median_ms": round(1000 * statistics.median(ordered), 3),
            "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3)}


# ----------------------------------------------------------------------------------------------------
# grader

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
    import grader
    import reward

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
        pool.score([("\\boxed{\\sqrt{8}}", "2\\sqrt{2}")] * workers)  # start the workers outside the timings
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


# The format corpus: each benchmark reference against its own rewritings in the formats of README's
# "Rewards" (expected equal), near misses (expected unequal), and inside long responses with and without
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
    import grader

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
    by kind, each grader's accuracy against the expected verdicts, false positives, and every
    disagreement on stderr."""
    import importlib.util

    import reward

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
            pool.score(pairs[:workers])
            start = time.perf_counter()
            scores[name] = pool.score(pairs)
            scores[name + " seconds"] = time.perf_counter() - start
    by_kind = {}
    for (kind, response, reference, expected), ours, theirs in zip(cases, scores["ours"], scores["math-verify"]):
        row = by_kind.setdefault(kind, {"pairs": 0, "agree": 0, "ours_right": 0, "math_verify_right": 0,
                                        "ours_false_positives": 0, "math_verify_false_positives": 0})
        row["pairs"] += 1
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
          "ours_pairs_per_s": round(len(pairs) / scores["ours seconds"], 1),
          "math_verify_pairs_per_s": round(len(pairs) / scores["math-verify seconds"], 1),
          "sets": sorted({problem["set"] for problem in problems}), "workers": workers})


# ----------------------------------------------------------------------------------------------------
# rollout

SHAPES = {"1.5b": "tokenizers/DeepSeek-R1-Distill-Qwen-1.5B/config.json",
          "7b": "configs/DeepSeek-R1-Distill-Qwen-7B/config.json"}


def shape_config(shape: str):
    """The tiny preset's ModelConfig, or the path of a real architecture's config.json in ../shared."""
    from model import TINY_CONFIG

    if shape == "tiny":
        return TINY_CONFIG
    path = SHARED_DATA / SHAPES[shape]
    if not path.is_file():
        sys.exit(f"{path} not found: the {shape} shape needs ../shared/data")
    return path


def transformers_twin(model):
    """transformers' own model of the same architecture holding the same weights (the baseline)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = model.cfg.to_hf()
    config = AutoConfig.for_model(hf_config.pop("model_type"), **hf_config)
    weight = model.embed_tokens.weight
    twin = AutoModelForCausalLM.from_config(config).to(device=weight.device, dtype=weight.dtype).eval()
    state = {(k if k.startswith("lm_head") else "model." + k): v for k, v in model.state_dict().items()}
    twin.load_state_dict(state, strict=not model.cfg.tie_word_embeddings)
    return twin


def peak_mem_mb(device) -> float:
    import resource

    import torch

    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # the process's peak RSS


def bench_rollout(args: argparse.Namespace) -> None:
    import torch

    from model import random_model
    from neighbors import build_neighbor_table
    from rollout import Exploration, Sampling, generate

    device = torch.device(args.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    config = shape_config(args.shape)
    model = random_model(config, dtype=dtype, device=device, seed=0).eval()
    twin = transformers_twin(model)
    vocab = model.cfg.vocab_size
    prompts = torch.randint(0, vocab, (args.batch, args.prompt_len), generator=torch.Generator().manual_seed(0))
    table = build_neighbor_table(model.output_weight, 1)
    sampling = Sampling(max_new_tokens=args.new_tokens)  # no stop ids: every row runs the full length

    cuda_graph = device.type == "cuda" and args.cuda_graph

    def ours(explore):
        exploration = Exploration(explore, mix_rate=0.1)
        return lambda: generate(model, prompts.tolist(), sampling, exploration, neighbor_table=table,
                                seed=0, cuda_graph=cuda_graph)

    def theirs():
        ids = prompts.to(device)
        return twin.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_p=1.0,
                             top_k=0, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, pad_token_id=0)

    runs = [("ours", "none", ours("none")), ("ours", "neighbor", ours("neighbor")), ("transformers", "none", theirs)]
    seconds = {impl_explore: [] for impl_explore in [(impl, explore) for impl, explore, _ in runs]}
    peak = {}
    for impl, explore, run in runs:
        run()  # warm-up
    # Round-robin over the configurations, so that drift in the machine's speed hits all of them alike.
    for _ in range(args.repeats):
        for impl, explore, run in runs:
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            run()
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds[impl, explore].append(time.perf_counter() - start)
            peak[impl, explore] = peak_mem_mb(device)
    for (impl, explore), timings in seconds.items():
        emit({"bench": "rollout", "impl": impl, "explore": explore, "device": device.type, "shape": args.shape,
              "batch": args.batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
              "tokens_per_s": round(args.batch * args.new_tokens / statistics.median(timings), 1),
              "median_s": round(statistics.median(timings), 4), "min_s": round(min(timings), 4),
              "peak_mem_mb": peak[impl, explore], "cuda_graph": cuda_graph and impl == "ours",
              "repeats": args.repeats})


def long_tail_model(args, device):
    """A random model at a shape where attention matters on a CPU: hidden 256, 2 layers, 4 query / 2 KV
    heads, `args.vocab` tokens."""
    from model import ModelConfig, random_model

    config = ModelConfig(family="qwen2", vocab_size=args.vocab, hidden_size=256, intermediate_size=768,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64, qkv_bias=True,
                         max_position_embeddings=8192)
    return random_model(config, dtype=torch_dtype(device), device=device, seed=0).eval()


# The long-tail workload's response lengths, as fractions of max_new_tokens: a log-normal L / max with
# mean LONG_TAIL_MEAN after lengths past the limit are cut to it, where LONG_TAIL_AT_LIMIT of the rows end.
LONG_TAIL_MEAN, LONG_TAIL_AT_LIMIT = 0.4, 0.1


def lognormal_for(mean: float, at_limit: float) -> tuple[float, float]:
    """(mu, sigma) of log X ~ N(mu, sigma^2) with P(X >= 1) = at_limit and E[min(X, 1)] = mean.

    P(X >= 1) = at_limit fixes mu = -z sigma (z: the standard normal's 1 - at_limit quantile), and
    E[min(X, 1)] = exp(mu + sigma^2 / 2) Phi(-(mu + sigma^2) / sigma) + at_limit falls as sigma grows, so
    sigma is found by bisection. For (0.4, 0.1): sigma = 0.924, median exp(mu) = 0.306."""
    normal = statistics.NormalDist()
    z = normal.inv_cdf(1 - at_limit)

    def capped_mean(sigma: float) -> float:
        mu = -z * sigma
        return math.exp(mu + sigma**2 / 2) * normal.cdf(-(mu + sigma**2) / sigma) + at_limit

    if not at_limit < mean < capped_mean(1e-6):
        raise ValueError(f"no log-normal has mean {mean} below the limit with {at_limit} of it at the limit")
    low, high = 1e-6, 20.0
    for _ in range(100):
        sigma = (low + high) / 2
        low, high = (sigma, high) if capped_mean(sigma) > mean else (low, sigma)
    return -z * sigma, sigma


def long_tail_lengths(rows: int, max_new_tokens: int, seed: int) -> list[int]:
    """Response lengths in 1..max_new_tokens from the log-normal of lognormal_for(LONG_TAIL_MEAN,
    LONG_TAIL_AT_LIMIT), drawn by stratified quantiles: row i gets the quantile (k_i + u_i) / rows, k a
    seeded permutation and u_i uniform, so that even 32 rows have the distribution's shape (3-4 of them
    at the limit, not anywhere from 0 to 8) in a seeded random order."""
    rng = random.Random(f"long-tail lengths {seed}")  # not the stream the bench draws its prompts from
    mu, sigma = lognormal_for(LONG_TAIL_MEAN, LONG_TAIL_AT_LIMIT)
    normal = statistics.NormalDist(mu, sigma)
    strata = rng.sample(range(rows), rows)
    return [min(max_new_tokens, max(1, math.ceil(max_new_tokens * math.exp(normal.inv_cdf((k + rng.random())
                                                                                             / rows)))))
            for k in strata]


def forced_lengths_sampler(lengths: list[int], max_new_tokens: int, stop_id: int, device):
    """A rollout.Sampler.__call__ under which row i samples stop_id at response position lengths[i] - 1
    and never before (never at all when lengths[i] = max_new_tokens: the row is truncated at the limit).
    A random model's own stop decisions cannot follow a chosen distribution; this makes every row's length
    the drawn one in every engine, and leaves the rest of the step (forward, sampling, record) as it is."""
    import torch

    from rollout import Sampler

    sample = Sampler.__call__
    # [N + 1]: each row's stop position; the last entry is for empty slots (row N), which are never live.
    stop_at = torch.tensor([n - 1 if n < max_new_tokens else max_new_tokens for n in lengths]
                           + [max_new_tokens], device=device)

    def forced(sampler, logits, state, record):
        at_stop = state.length == stop_at[state.row]  # [S]
        is_stop = torch.arange(logits.shape[1], device=logits.device) == stop_id  # [V]
        stop_logit = torch.where(at_stop, 0.0, float("-inf"))[:, None]  # [S, 1]
        others = torch.where(at_stop[:, None], float("-inf"), logits)  # [S, V]
        return sample(sampler, torch.where(is_stop, stop_logit, others), state, record)

    return forced


def torch_dtype(device):
    import torch

    return torch.float32 if device.type == "cpu" else torch.bfloat16


def run_rollout_bench(args: argparse.Namespace) -> None:
    if args.memory_of:
        memory_case(args.memory_of, args.after)
    elif args.memory:
        bench_rollout_memory(args)
    elif args.long_tail:
        args.repeats = args.repeats or 1  # a run of the three engines at 2,048 tokens takes minutes on a CPU
        bench_rollout_long_tail(args)
        bench_decode_step(args)
        bench_draw_cost(args)
    else:
        args.repeats = args.repeats or 15
        bench_rollout(args)


def bench_rollout_long_tail(args: argparse.Namespace) -> None:
    """Rows with long-tailed lengths (long_tail_lengths), more rows than slots: continuous refill vs static
    batches (the same engine with refill=False) vs static batches attending over the whole cache (the
    engine before refill), one after another in one process. Per-row randomness makes all three produce
    the same rows, which is checked."""
    from unittest import mock

    import torch

    import rollout
    from rollout import DecodeStep, Sampler, Sampling, generate

    device = torch.device(args.device)
    model = long_tail_model(args, device)
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(1, args.vocab) for _ in range(rng.randint(16, args.prompt_len))]
               for _ in range(args.rows)]
    drawn = long_tail_lengths(args.rows, args.new_tokens, args.seed)
    sampling = Sampling(max_new_tokens=args.new_tokens, stop_ids=(0,))
    forced = forced_lengths_sampler(drawn, args.new_tokens, 0, device)
    configs = {"refill": dict(refill=True), "static": dict(refill=False),
               "static_full_cache": dict(refill=False)}
    counts = {name: [0, 0] for name in configs}  # decode steps, KV slots read (sum of slots x window)
    decode_step = DecodeStep.__call__

    def run(name):
        counts[name] = [0, 0]

        def counted(step, inputs, positions, window):  # the machine-independent cost of the run
            counts[name][0] += 1
            counts[name][1] += inputs.shape[0] * window
            return decode_step(step, inputs, positions, window)

        # static_full_cache: every window is the whole cache, as the engine before refill read it.
        min_window = 1 << 30 if name == "static_full_cache" else rollout.MIN_WINDOW
        with (mock.patch.object(rollout, "MIN_WINDOW", min_window),
              mock.patch.object(DecodeStep, "__call__", counted), mock.patch.object(Sampler, "__call__", forced)):
            return generate(model, prompts, sampling, seed=args.seed, slots=args.slots, **configs[name])

    seconds, results = {name: [] for name in configs}, {}
    for _ in range(args.repeats):  # round-robin, so that drift in the machine's speed hits all alike
        for name in configs:
            sync(device)
            start = time.perf_counter()
            results[name] = run(name)
            sync(device)
            seconds[name].append(time.perf_counter() - start)
    lengths = results["refill"].lengths.float()
    if lengths.long().tolist() != drawn:
        raise RuntimeError("the rows' lengths are not the drawn ones: forced_lengths_sampler no longer fits")
    for name, timings in seconds.items():
        same = results[name].responses() == results["refill"].responses()
        emit({"bench": "rollout_long_tail", "engine": name, "device": device.type, "rows": args.rows,
              "slots": args.slots, "new_tokens": args.new_tokens, "vocab": args.vocab, "seed": args.seed,
              "mean_length": round(float(lengths.mean()), 1),
              "at_limit": round(float((lengths == args.new_tokens).float().mean()), 3),
              "tokens_per_s": round(float(lengths.sum()) / statistics.median(timings), 1),
              "median_s": round(statistics.median(timings), 3), "runs_s": [round(t, 3) for t in timings],
              "speedup_vs_this": round(statistics.median(timings) / statistics.median(seconds["refill"]), 2),
              "decode_steps": counts[name][0], "kv_slots_read": counts[name][1],
              "same_rows_as_refill": same})


def bench_decode_step(args: argparse.Namespace) -> None:
    """The time of one decode step of the long-tail model for --slots rows against the attention window
    (the filled cache length it reads), up to the whole cache of prompt_len + new_tokens."""
    import torch

    import rollout
    from rollout import DecodeStep

    device = torch.device(args.device)
    model = long_tail_model(args, device)
    cache = model.new_cache(args.slots, args.prompt_len + args.new_tokens)
    step = DecodeStep(model, cache, cuda_graph=device.type == "cuda" and args.cuda_graph)
    inputs = torch.randn(args.slots, model.cfg.hidden_size, device=device, dtype=torch_dtype(device)) * 0.02
    window = rollout.MIN_WINDOW
    while True:
        window = min(window, cache.max_len)
        positions = torch.full((args.slots,), window - 1, device=device)
        timings = []
        for _ in range(args.step_repeats + 3):
            sync(device)
            start = time.perf_counter()
            step(inputs, positions, window)
            sync(device)
            timings.append(time.perf_counter() - start)
        emit({"bench": "decode_step", "device": device.type, "slots": args.slots, "window": window,
              "cache_len": cache.max_len, **latency_ms(timings[3:])})
        if window == cache.max_len:
            break
        window *= 2


# Peak-memory cases of issue-17 item 5, each run in a fresh process ("before" = how the code did it).
MEMORY_CASES = {
    "prefill": ("[B, 1, P, P] mask, K and V repeated (before)", "causal, no mask, enable_gqa (after)"),
    "gqa_attention": ("repeat_interleave K, V (before)", "enable_gqa (after)"),
    "replay_mixture": ("[.., K, d] gather (before)", "one candidate at a time (after)"),
}


def memory_case(case: str, after: bool) -> None:
    """Runs one case once in this process and prints its peak resident memory above the set-up's."""
    import resource

    import torch
    import torch.nn.functional as F

    from ngrpo import mixed_embeddings

    torch.manual_seed(0)
    if case == "prefill":  # 8 prompts of 2048 tokens into a cache, the long-tail model
        model = long_tail_model(argparse.Namespace(vocab=1024), torch.device("cpu"))
        ids = torch.randint(0, 1024, (8, 2048))
        cache = model.new_cache(8, 2048)
        mask = None if after else torch.ones(8, 2048, dtype=torch.bool)

        def run():
            return model.forward_hidden(ids, attention_mask=mask, cache=cache, cache_pos=0)
    elif case == "gqa_attention":  # one R1-Distill-1.5B layer's attention (12 query, 2 KV heads), 4k tokens
        q, k, v = torch.randn(1, 12, 4096, 128), torch.randn(1, 2, 4096, 128), torch.randn(1, 2, 4096, 128)

        def run():  # before: the copies made inside the measured call, as attend made them
            if after:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return F.scaled_dot_product_attention(q, k.repeat_interleave(6, 1), v.repeat_interleave(6, 1),
                                                  is_causal=True)
    else:  # the replayed soft mixtures (K = 10) of 2 rows of 4k tokens at d = 1536, forward and backward
        embed = torch.randn(4096, 1536, requires_grad=True)
        ids, weights = torch.randint(0, 4096, (2, 4096, 10)), torch.rand(2, 4096, 10).softmax(-1)

        def run():
            if after:
                mixed = mixed_embeddings(embed, ids, weights)
            else:
                mixed = (weights.unsqueeze(-1) * embed[ids]).sum(-2)
            mixed.square().sum().backward()
    before_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with torch.no_grad() if case != "replay_mixture" else torch.enable_grad():
        run()
    emit({"peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before_mb, 1)})


def bench_rollout_memory(args: argparse.Namespace) -> None:
    """Peak memory before and after each item-5 change, one fresh process per measurement (CPU, peak RSS)."""
    import subprocess

    for case, labels in MEMORY_CASES.items():
        for after, label in enumerate(labels):
            command = [sys.executable, __file__, "rollout", "--memory-of", case]
            command += ["--after"] if after else []
            line = subprocess.run(command, capture_output=True, text=True, check=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout.strip().splitlines()[-1]
            emit({"bench": "rollout_memory", "case": case, "version": label, **json.loads(line)})


def bench_draw_cost(args: argparse.Namespace) -> None:
    """One sampling draw per row from p [rows, vocab]: per-row hashed uniforms and the float64 inverse CDF
    (rollout.sample_tokens) against the generator-drawn exponential race the sampler used before."""
    import torch

    from draws import TOKEN, RowDraws
    from rollout import sample_tokens

    device = torch.device(args.device)
    generator = torch.Generator(device).manual_seed(0)
    for rows, vocab in ((args.slots, args.vocab), (64, 151936)):
        probs = torch.rand(rows, vocab, device=device, generator=generator).softmax(-1)
        keys, positions = torch.arange(rows, device=device), torch.full((rows,), 100, device=device)
        draws = RowDraws(0, keys, positions)
        runs = {"row_draws_inverse_cdf": lambda: sample_tokens(probs, draws.uniform(TOKEN, 1)[:, 0]),
                "generator_exponential_race": lambda: (probs / torch.rand(probs.shape, device=device,
                                                                          generator=generator).log_().neg_()
                                                       ).argmax(-1)}
        for name, run in runs.items():
            timings = []
            for _ in range(args.step_repeats + 2):
                sync(device)
                start = time.perf_counter()
                run()
                sync(device)
                timings.append(time.perf_counter() - start)
            emit({"bench": "token_draws", "impl": name, "device": device.type, "rows": rows, "vocab": vocab,
                  **latency_ms(timings[2:])})


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------------------------------
# neighbors


def bench_neighbors(args: argparse.Namespace) -> None:
    """build_neighbor_table over the output matrix of a random model of the given shape, in the dtype the
    sampler holds it (bf16 on CUDA, fp32 on CPU). No disk cache: every run searches."""
    import torch

    from model import random_model
    from neighbors import build_neighbor_table

    device = torch.device(args.device)
    shape = args.shape or ("1.5b" if device.type == "cuda" else "tiny")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    weight = random_model(shape_config(shape), dtype=dtype, device=device, seed=0).output_weight.detach()

    def build():
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        build_neighbor_table(weight, args.k, args.metric)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    first = build()  # includes one-off costs (cuBLAS handles, kernel selection)
    seconds = [build() for _ in range(args.repeats)]
    # peak_mem_mb: on CUDA the allocator's peak during the last build above the matrix itself; on CPU the
    # process's peak RSS.
    weight_mb = weight.numel() * weight.element_size() / 2**20 if device.type == "cuda" else 0.0
    emit({"bench": "neighbors", "device": device.type, "shape": shape, "vocab": weight.shape[0],
          "dim": weight.shape[1], "dtype": str(dtype).removeprefix("torch."), "k": args.k, "metric": args.metric,
          "first_s": round(first, 4), "median_s": round(statistics.median(seconds), 4),
          "min_s": round(min(seconds), 4), "repeats": args.repeats,
          "peak_mem_mb": round(peak_mem_mb(device) - weight_mb, 1)})


# ----------------------------------------------------------------------------------------------------
# train

TRAIN_DEFAULTS = {"cpu": dict(shape="tiny", batch=8, seq_len=512, repeats=10),
                  "cuda": dict(shape="1.5b", batch=1, seq_len=8192, repeats=5)}


def train_setup(args: argparse.Namespace, device):
    """Our fp32 model (the trained weights stay fp32: README.md, "The real run"), its transformers twin holding the very
    same Parameter objects (one copy of the weights and of .grad serves both), and a random batch."""
    import torch

    from model import random_model

    config = shape_config(args.shape)
    model = random_model(config, dtype=torch.float32, device=device, seed=0)
    twin = transformers_twin(model)
    shared = {(k if k.startswith("lm_head") else "model." + k): p for k, p in model.named_parameters()}
    twin.load_state_dict(shared, strict=not model.cfg.tie_word_embeddings, assign=True)
    model.gradient_checkpointing = args.grad_checkpointing
    model.train()  # our blocks are checkpointed only in training mode; neither model has dropout
    twin.train()
    if args.grad_checkpointing:  # non-reentrant, as ours; transformers 5 renamed the method
        enable = getattr(twin, "activation_checkpointing_enable", None) or twin.gradient_checkpointing_enable
        enable({"use_reentrant": False})
    ids = torch.randint(0, model.cfg.vocab_size, (args.batch, args.seq_len), generator=torch.Generator().manual_seed(0))
    return model, twin, ids.to(device)


def ours_logprobs(model, ids, chunk_tokens: int = 1024):
    """log p(ids[:, t+1] | ids[:, :t+1]), [B, T-1], from hidden states in chunks: never [B, T, V] logits."""
    from ngrpo import token_logprobs

    hidden = model.forward_hidden(ids)  # [B, T, d]
    return token_logprobs(hidden[:, :-1], model.output_weight, ids[:, 1:], chunk_tokens=chunk_tokens)[0]


def theirs_logprobs(twin, ids):
    """The same from transformers' full logits [B, T, V], upcast to fp32, log_softmax, gather."""
    logits = twin(input_ids=ids, use_cache=False).logits
    return logits.float().log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]


def train_steps(model, twin, ids, chunk_tokens: int, autocast) -> dict:
    """impl -> a function that runs one forward + backward of sum(log p(next token)) over the batch."""
    import torch

    mask = torch.ones(ids.shape[0], ids.shape[1] - 1, device=ids.device)  # every position scored

    def ours():
        with autocast():
            logp = ours_logprobs(model, ids, chunk_tokens)
        (logp * mask).sum().backward()

    def theirs():
        with autocast():
            logp = theirs_logprobs(twin, ids)
        (logp * mask).sum().backward()

    return {"ours": ours, "transformers": theirs}


def rss_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def cpu_step_memory_mb(args: argparse.Namespace, impl: str) -> float:
    """The memory one forward + backward of `impl` adds on CPU, measured in a fresh process.

    Peak RSS within one process only grows, so the second implementation measured there would inherit the
    first one's high-water mark; and glibc keeps freed memory for reuse, so even a reset mark would
    under-count whichever runs second. So each implementation runs alone in a new `bench.py train
    --memory-of IMPL` process, with MALLOC_MMAP_THRESHOLD_ set so that every large buffer is its own
    mapping, returned to the system when freed (RSS then follows live memory). There, after a warm-up step
    and with .grad freed, it resets the peak RSS (/proc/self/clear_refs) and reports peak minus current
    RSS over one more step: activations, logits and the gradients it allocates."""
    import subprocess

    command = [sys.executable, __file__, "train", "--memory-of", impl, "--device", "cpu", "--shape", args.shape,
               "--batch", str(args.batch), "--seq-len", str(args.seq_len), "--chunk-tokens", str(args.chunk_tokens)]
    if args.grad_checkpointing:
        command.append("--grad-checkpointing")
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"measuring the memory of {impl} failed:\n{result.stderr}")
    return json.loads(result.stdout)["peak_mem_mb"]


def bench_train(args: argparse.Namespace) -> None:
    """One forward + backward of the training log-prob path on the same weights and batch: ours (hidden
    states -> ngrpo.token_logprobs in chunks of --chunk-tokens, never [B, T, V] logits) against
    transformers' model computing full logits + log_softmax + gather. CUDA: fp32 weights under bf16
    autocast, as training runs; CPU: fp32. `peak_mem_mb` is what the step adds at its peak on top of the
    weights and the batch (CUDA: the allocator's peak; CPU: see cpu_step_memory_mb)."""
    import contextlib

    import torch

    device = torch.device(args.device)
    for key, value in TRAIN_DEFAULTS[device.type].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    model, twin, ids = train_setup(args, device)
    if device.type == "cuda":
        autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    else:
        autocast = contextlib.nullcontext
    steps = train_steps(model, twin, ids, args.chunk_tokens, autocast)

    if args.memory_of:  # the child process of cpu_step_memory_mb
        if device.type != "cpu":
            sys.exit("--memory-of measures CPU memory only")
        steps[args.memory_of]()
        model.zero_grad(set_to_none=True)
        Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
        before_mb = rss_mb("VmRSS")
        steps[args.memory_of]()
        print(json.dumps({"peak_mem_mb": round(rss_mb("VmHWM") - before_mb, 1)}))
        return

    # Apples to apples: both compute the same log-probs from the same weights (fp32, no autocast), checked
    # once on at most 1,024 tokens of the first row (full fp32 logits of a real vocabulary are large).
    with torch.no_grad():
        rows = ids[:1, : min(args.seq_len, 1024)]
        gap = float((ours_logprobs(model, rows) - theirs_logprobs(twin, rows)).abs().max())
    # fp32 on CUDA: the two pick different attention kernels, whose sums round differently.
    tolerance = 1e-4 if device.type == "cpu" else 1e-3
    assert gap < tolerance, f"ours and transformers disagree on the log-probs by {gap:.2e}"
    note(f"train: ours and transformers' fp32 log-probs agree to {gap:.1e} (max abs diff)")

    if device.type == "cpu":
        peak = {impl: cpu_step_memory_mb(args, impl) for impl in steps}
    else:
        peak = {impl: 0.0 for impl in steps}
    seconds = {impl: [] for impl in steps}
    for step in steps.values():  # warm-up
        model.zero_grad(set_to_none=True)
        step()
    # Round-robin over the implementations, so that drift in the machine's speed hits both alike.
    for _ in range(args.repeats):
        for impl, step in steps.items():
            model.zero_grad(set_to_none=True)  # each step allocates its own .grad, as a training step does
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(device)
                before = torch.cuda.memory_allocated(device)
            start = time.perf_counter()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize()
                peak[impl] = max(peak[impl], round((torch.cuda.max_memory_allocated(device) - before) / 2**20, 1))
            seconds[impl].append(time.perf_counter() - start)
    for impl, timings in seconds.items():
        emit({"bench": "train", "impl": impl, "device": device.type, "shape": args.shape, "batch": args.batch,
              "seq_len": args.seq_len, "tokens_per_s": round(args.batch * args.seq_len / statistics.median(timings), 1),
              "median_s": round(statistics.median(timings), 4), "min_s": round(min(timings), 4),
              "peak_mem_mb": peak[impl], "grad_checkpointing": args.grad_checkpointing, "fp32_logp_gap": gap})


# ----------------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchmarks = parser.add_subparsers(dest="benchmark", required=True)

    grader = benchmarks.add_parser("grader", help="reward checker: speed, accuracy, agreement with math-verify")
    grader.add_argument("--workers", type=int, default=None, help="RewardPool workers (default: min(8, CPUs))")
    grader.add_argument("--timeout-s", type=float, default=5.0, help="per-check time limit")
    grader.add_argument("--responses", type=int, default=256, help="number of long responses")
    grader.add_argument("--response-chars", type=int, default=8000, help="length of each long response")
    grader.add_argument("--seed", type=int, default=0)
    grader.add_argument("--no-math-verify", dest="math_verify", action="store_false",
                        help="skip the agreement check even when math-verify is installed")
    grader.add_argument("--corpus-every", type=int, default=5,
                        help="format corpus: every N-th reference also goes inside long responses")
    grader.add_argument("--corpus-response-chars", type=int, default=3000,
                        help="format corpus: length of the <think> part of each long response")
    grader.set_defaults(run=bench_grader)

    rollout = benchmarks.add_parser("rollout", help="sampler: ours vs transformers' generate, neighbor mixing vs none")
    rollout.add_argument("--device", default="cpu", help="cpu or cuda")
    rollout.add_argument("--shape", default="tiny", choices=["tiny", *SHAPES],
                         help="tiny preset, or the real R1-Distill config from ../shared with random weights")
    rollout.add_argument("--batch", type=int, default=16, help="prompts decoded together")
    rollout.add_argument("--prompt-len", type=int, default=32, help="tokens per prompt")
    rollout.add_argument("--new-tokens", type=int, default=128, help="tokens generated per prompt (no early stop)")
    rollout.add_argument("--repeats", type=int, default=None,
                         help="timed runs per configuration, median reported (default: 15; --long-tail: 1)")
    rollout.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false",
                         help="on cuda, run our decode step eagerly instead of replaying a CUDA graph")
    rollout.add_argument("--long-tail", action="store_true",
                         help="long-tailed response lengths, rows > slots: continuous refill vs static "
                              "batches, and decode-step time vs attention window (options below)")
    rollout.add_argument("--rows", type=int, default=32, help="--long-tail: rows generated")
    rollout.add_argument("--slots", type=int, default=8, help="--long-tail: rows decoded at once")
    rollout.add_argument("--vocab", type=int, default=896, help="--long-tail: the model's vocabulary size")
    rollout.add_argument("--seed", type=int, default=0,
                         help="--long-tail: seed of the prompts, the response lengths and the sampling draws")
    rollout.add_argument("--step-repeats", type=int, default=20,
                         help="--long-tail: timed decode steps per window")
    rollout.add_argument("--memory", action="store_true",
                         help="peak memory before / after the sampler's and replay's memory changes (CPU)")
    rollout.add_argument("--memory-of", choices=list(MEMORY_CASES), default=None,
                         help="internal: measure one --memory case in this fresh process")
    rollout.add_argument("--after", action="store_true", help="internal: with --memory-of, the new code")
    rollout.set_defaults(run=run_rollout_bench)

    neighbors = benchmarks.add_parser("neighbors", help="the neighbor table over a real-shape output matrix")
    neighbors.add_argument("--device", default="cpu", help="cpu (fp32 matrix) or cuda (bf16 matrix, as the sampler's)")
    neighbors.add_argument("--shape", default=None, choices=["tiny", *SHAPES],
                           help="tiny preset, or the real R1-Distill config from ../shared with random weights "
                                "(default: tiny on cpu, 1.5b on cuda; 1.5b on cpu takes ~11 minutes)")
    neighbors.add_argument("--k", type=int, default=2, help="neighbors per row")
    neighbors.add_argument("--metric", default="cosine", choices=["cosine", "dot", "l2", "l1"])
    neighbors.add_argument("--repeats", type=int, default=3, help="timed builds after a first one (median reported)")
    neighbors.set_defaults(run=bench_neighbors)

    train = benchmarks.add_parser("train", help="forward + backward of the log-prob path: ours (chunked) vs "
                                  "transformers' full logits + log_softmax")
    train.add_argument("--device", default="cpu", help="cpu (fp32) or cuda (fp32 weights, bf16 autocast)")
    train.add_argument("--shape", default=None, choices=["tiny", *SHAPES],
                       help="tiny preset, or the real R1-Distill config from ../shared with random weights "
                            "(default: tiny on cpu, 1.5b on cuda)")
    train.add_argument("--batch", type=int, default=None, help="sequences per step (default: 8 on cpu, 1 on cuda)")
    train.add_argument("--seq-len", type=int, default=None,
                       help="tokens per sequence (default: 512 on cpu, 8192 on cuda)")
    train.add_argument("--chunk-tokens", type=int, default=1024, help="positions per chunk of our log-prob path")
    train.add_argument("--grad-checkpointing", action="store_true", help="recompute each block in backward (both)")
    train.add_argument("--repeats", type=int, default=None, help="timed runs per implementation, median reported "
                       "(default: 10 on cpu, 5 on cuda)")
    train.add_argument("--memory-of", choices=["ours", "transformers"], default=None,
                       help="internal: measure one implementation's memory in this fresh process (see bench_train)")
    train.set_defaults(run=bench_train)

    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
