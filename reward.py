"""The reward: find a response's final answer and decide, exactly and in bounded time, whether it equals
the reference.

Every gradient of a run is decided here. A false negative teaches the model that a right answer was
wrong, a false positive rewards nonsense, and one hang stalls the run. So:

- the answer is the content of the last \\boxed{...} (or \\fbox, or "\\boxed x"); a response with no
  box falls back to an explicit final-answer statement ("the answer is ...", "Answer: ...", a final $...$);
- both sides are normalised as strings (spacing, \\left/\\right, \\dfrac, units, \\text{}, currency,
  degrees, thousands separators) and compared by fast exact paths: identical text, plain numbers (as
  exact fractions), words, multiple-choice letters;
- anything else is parsed from LaTeX straight into sympy objects by a small parser of our own (no eval,
  no ANTLR) and compared exactly: no floating tolerance, 0.33 is not 1/3 and 123456788 is not 123456789;
- everything that may call sympy runs in a worker process that is killed and replaced when it runs past
  the timeout (a signal alarm would not work off the main thread nor interrupt sympy's C paths), so a
  pathological answer costs at most the timeout and never hangs or crashes the caller.

Policy where graders disagree:
- percent: when either side carries a %, that side's number matches with or without the % and as its
  fraction of 1 (25\\% matches 25\\%, 25 and 0.25, not 2500); with no % on either side 0.25 is not 25;
- the last box wins, except that a reference with several parts may be matched by the boxes of the
  final answer taken together as a list (\\boxed{1} and \\boxed{-2} for "1,-2");
- bare lists and \\{...\\} sets are unordered; (a, b) tuples and points are ordered; [a, b] and
  half-open or infinite (a, b] are intervals, and an interval equals the same set written as an inequality;
- 1,234 / 1{,}234 / 1\\,234 / 12,\\!345 are numbers when the whole answer is one; "1, 234" is a list;
- x = 5 matches 5; two equations match when one is a nonzero multiple of the other (rearranged lines);
- 2\\frac{1}{2} is the mixed number 5/2 when the fraction is a proper fraction of integers;
- 52_8 (a number in base 8) matches 52: the base is the question's, the digits are the answer.

>>> extract_answer("so the total is \\\\boxed{\\\\frac{1}{2}}.")
'\\\\frac{1}{2}'
"""

import atexit
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from fractions import Fraction
from pathlib import Path

import sympy

MAX_ANSWER_CHARS = 1000  # a longer "answer" only equals an identical reference: no real answer is this long
MAX_LITERAL_DIGITS = 400
MAX_SCI_EXPONENT = 400  # 3.2e5 yes, 1e999999999 no
MAX_POWER_BITS = 100_000  # refuse exact integers beyond ~30,000 digits (9^{9^{9^9}} would never finish)
MAX_EXPONENT = 100_000  # for any base but a bare symbol: x^{10^{100}} is fine, (2x)^{10^{100}} is not
MAX_FACTORIAL = 10_000
MAX_NESTING = 60  # deeper input is garbage; the limit keeps the parser far from Python's recursion limit
WORKER_MEMORY_BYTES = 2 << 30
STARTUP_TIMEOUT_S = 60.0


# ----------------------------------------------------------------------------------------------------
# Finding the answer in a response

_BOX_TOKEN = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])|\\[{}\\]|[{}]")
_SPACES = re.compile(r"[ \t]*")
_UNBRACED_BOX = re.compile(r"[^$\n]{0,200}")


def _box_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every complete box, outermost only, in order: one pass, linear time.

    >>> _box_spans("a \\\\boxed{x^{2}} b \\\\fbox{3} \\\\boxed{")
    [(2, 15, 'x^{2}'), (18, 26, '3')]
    """
    starts = [i for i in (text.find("\\boxed"), text.find("\\fbox")) if i >= 0]
    if not starts:
        return []
    spans = []
    open_boxes = []  # (start of the command, start of its content, brace depth outside it)
    depth = 0
    for match in _BOX_TOKEN.finditer(text, min(starts)):
        token = match.group()
        if token == "{":
            depth += 1
        elif token == "}":
            depth -= 1
            if open_boxes and open_boxes[-1][2] == depth:
                start, content_start, _ = open_boxes.pop()
                while spans and spans[-1][0] > start:  # a box inside this box is not an answer of its own
                    spans.pop()
                spans.append((start, match.end(), text[content_start:match.start()]))
        elif token[1] in "{}\\":  # \{ \} \\ are not grouping braces
            continue
        else:
            after = _SPACES.match(text, match.end()).end()
            if text.startswith("{", after):
                open_boxes.append((match.start(), after + 1, depth))
            elif after > match.end():  # "\boxed 5": TeX takes one token, models mean the rest of the formula
                content = _UNBRACED_BOX.match(text, after).group()
                if content.strip():
                    spans.append((match.start(), after + len(content), content.strip()))
    return spans


def extract_answer(text: str) -> str | None:
    """The content of the last \\boxed{...} (nested braces, \\fbox, \\boxed x); None when there is none."""
    spans = _box_spans(text)
    return spans[-1][2] if spans else None


_STATEMENT_WINDOW = 4000  # a "final answer" statement far from the end is not final
_ANSWER_STATEMENT = re.compile(r"(?i)\bthe\s+(?:final\s+)?answer\s+is\b\s*:?\s*|\b(?:final\s+)?answer\s*:\s*")
_MATH_SPAN = re.compile(r"\$\$(.{1,500}?)\$\$|\$(.{1,500}?)\$|\\\((.{1,500}?)\\\)|\\\[(.{1,500}?)\\\]", re.S)
_MATH_CLOSERS = (("$$", "$$"), ("$", "$"), ("\\)", "\\("), ("\\]", "\\["))


def _final_answer_statement(text: str) -> str | None:
    """The answer a response states without a box: "the answer is X", "Answer: X", or a final $X$."""
    tail = text[-_STATEMENT_WINDOW:]
    statement = None
    for statement in _ANSWER_STATEMENT.finditer(tail):
        pass
    if statement is not None:
        rest = tail[statement.end():]
        span = _MATH_SPAN.match(rest)
        if span:
            return next(group for group in span.groups() if group is not None).strip()
        line = rest.split("\n", 1)[0][:200]
        line = re.split(r"\.\s", line, maxsplit=1)[0].strip().rstrip(".").strip("*").strip()
        if line:
            return line
    ending = tail.rstrip().rstrip(".").rstrip()
    for closer, opener in _MATH_CLOSERS:
        if ending.endswith(closer):
            start = ending.rfind(opener, 0, len(ending) - len(closer))
            if start >= 0 and ending[start + len(opener):len(ending) - len(closer)].strip():
                return ending[start + len(opener):len(ending) - len(closer)].strip()
            return None
    return None


def _candidate_answers(response: str, reference: str) -> list[str]:
    """What a response may be claiming as its answer: its last box, then (for a reference with several
    parts) all boxes of its final answer together as one list."""
    spans = _box_spans(response)
    if not spans:
        stated = _final_answer_statement(response)
        return [stated] if stated else []
    candidates = [spans[-1][2]]
    think_end = response.rfind("</think>")
    final_boxes = list(dict.fromkeys(content.strip() for start, _, content in spans if start > think_end))
    if 1 < len(final_boxes) <= 10 and _has_several_parts(reference):
        candidates.append(", ".join(final_boxes))
    return candidates


def _has_several_parts(reference: str) -> bool:
    text = _normalize(reference)
    return "\\pm" in text or len(_split_top(_tokenize(text), {","})) > 1


# ----------------------------------------------------------------------------------------------------
# String normalisation (cheap, runs in the caller)

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_THOUSANDS_MARK = re.compile(r"(?<=\d)(?:\{,\}|,\\!|\\,|,\\,|,\\ )\s*(?=\d{3}(?!\d))")
_SPACING = re.compile(r"\\\\|\\(?:left|right)\.|\\(?:left|right|[bB]igg?[lr]?|displaystyle|textstyle|quad|qquad)"
                      r"(?![a-zA-Z])|\\[,;:! ]|~")
_TEXT_BLOCK = re.compile(r"\\(text|textbf|textit|textrm|textnormal|textsf|mbox|mathrm|mathbf|mathit|mathsf"
                         r"|operatorname)\s*\{")
_UNIT_TEXT = re.compile(r"[A-Za-z][A-Za-z .\-/]*")
_UNIT_POWER = re.compile(r"\s*\^\s*(?:\{\s*\d\s*\}|\d)")
_REWRITES = [(re.compile(pattern), replacement) for pattern, replacement in [
    (r"\\[dtc]frac(?![a-zA-Z])", r"\\frac"),
    (r"\\[dt]binom(?![a-zA-Z])", r"\\binom"),
    (r"\\(?:le|leqslant)(?![a-zA-Z])", r"\\leq"),
    (r"\\(?:ge|geqslant)(?![a-zA-Z])", r"\\geq"),
    (r"\\ne(?![a-zA-Z])", r"\\neq"),
    (r"\\lt(?![a-zA-Z])", "<"),
    (r"\\gt(?![a-zA-Z])", ">"),
    (r"\\lbrace(?![a-zA-Z])", r"\\{"),
    (r"\\rbrace(?![a-zA-Z])", r"\\}"),
    (r"\\[lr]?vert(?![a-zA-Z])", "|"),
    (r"≤", r"\\leq "), (r"≥", r"\\geq "), (r"≠", r"\\neq "), (r"[−–]", "-"), (r"×", r"\\times "),
    (r"[·⋅]", r"\\cdot "), (r"÷", r"\\div "), (r"π", r"\\pi "), (r"∞", r"\\infty "), (r"√", r"\\sqrt "),
    (r"∪", r"\\cup "),
    (r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![a-zA-Z])|\\circ(?![a-zA-Z])|°|\^?\\degree(?![a-zA-Z])", ""),
    (r"\\%|\bpercent\b", "%"),
    (r"\\\$|\$|\bdollars?\b", ""),
    (r"^[a-zA-Z]\s*\\in(?![a-zA-Z])", ""),
]]
_TRAILING_UNIT = re.compile(
    r"(?<=[\d}).\s])\s*(?:(?:sq(?:uare)?|cubic)\.?\s+)?(?:units?|cm|mm|km|meters?|metres?|inch(?:es)?|feet"
    r"|foot|ft|yards?|miles?|mph|seconds?|minutes?|mins?|hours?|hrs?|days?|weeks?|months?|years?|cents?"
    r"|degrees?|radians?|kg|grams?|pounds?|lbs?|ounces?|liters?|litres?|ml|gallons?)\.?"
    r"(?:\s*\^\s*(?:\{\s*\d\s*\}|\d))?\s*$", re.I)
# Spaces go, except where they separate tokens: "\pi r" is not "\pir", "\log_2 8" is not "\log_28".
_PROTECTED_SPACE = re.compile(r"(\\[a-zA-Z]+|[_^]\d)\s+(?=[a-zA-Z\d])")
_SHORT_ARGS = [(re.compile(pattern), replacement) for pattern, replacement in [
    (r"\\frac(\d)(\d)", r"\\frac{\1}{\2}"),  # TeX reads one character: \frac12 is 1/2
    (r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}"),
    (r"\\frac(\d)\{", r"\\frac{\1}{"),
    (r"\\sqrt(\d)", r"\\sqrt{\1}"),
]]
_GROUPED_NUMBER = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?%?")
_BASE_SUBSCRIPT = re.compile(r"(\d+)_\{?(\d+)\}?")


def _matching_brace(text: str, open_index: int) -> int:
    depth = 0
    for index in range(open_index, len(text)):
        if text[index] == "{" and text[index - 1] != "\\":
            depth += 1
        elif text[index] == "}" and text[index - 1] != "\\":
            depth -= 1
            if depth == 0:
                return index
    return -1


def _unwrap(text: str) -> str:
    """Strip math delimiters and a box around the whole answer: "$\\boxed{5}$" -> "5"."""
    while True:
        text = text.strip()
        for opener, closer in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if len(text) >= len(opener) + len(closer) and text.startswith(opener) and text.endswith(closer):
                text = text[len(opener):len(text) - len(closer)]
                break
        else:
            spans = _box_spans(text)
            if len(spans) == 1 and spans[0][0] == 0 and spans[0][1] == len(text):
                text = spans[0][2]
            else:
                return text


def _rewrite_text_blocks(text: str) -> str:
    """\\text{...} and friends: "and"/"or" separate list items, a trailing one after a value is a unit
    (dropped), otherwise the words themselves."""
    position = 0
    while match := _TEXT_BLOCK.search(text, position):
        close = _matching_brace(text, match.end() - 1)
        if close < 0:
            break
        command, content = match.group(1), text[match.end():close].strip()
        end = close + 1
        unit_power = _UNIT_POWER.match(text, end)
        after_unit = unit_power.end() if unit_power else end
        is_unit = (not text[after_unit:].strip(" .") and text[:match.start()].strip()
                   and _UNIT_TEXT.fullmatch(content) and (not command.startswith("math") or len(content) > 1))
        if command == "operatorname":
            replacement = "\\" + content
        elif content.lower() in ("and", "or", ",", "and/or"):
            replacement = ","
        elif content.lower() in ("%", "\\%", "percent"):
            replacement = "%"
        elif is_unit:
            replacement, end = "", after_unit
        else:
            replacement = f" {content} "
        text = text[:match.start()] + replacement + text[end:]
        position = match.start() + len(replacement)
    return text


def _normalize(answer: str) -> str:
    """A canonical string for an answer: equal strings are equal answers, and the parser reads it.

    >>> _normalize("\\\\$1{,}234.50 \\\\text{ dollars}")
    '1234.50'
    >>> _normalize("\\\\left( \\\\dfrac12, 30^\\\\circ \\\\right)")
    '(\\\\frac{1}{2},30)'
    """
    text = _unwrap(_CONTROL.sub("", answer))
    text = _THOUSANDS_MARK.sub("", text)
    text = _SPACING.sub(lambda match: "\\\\" if match.group() == "\\\\" else " ", text)  # keep \\ rows
    text = _rewrite_text_blocks(text)
    for pattern, replacement in _REWRITES:
        text = pattern.sub(replacement, text)
    text = _TRAILING_UNIT.sub("", text).strip().rstrip(".").strip()
    if _GROUPED_NUMBER.fullmatch(text):  # before spaces go: "1, 234" is a list
        text = text.replace(",", "")
    text = _PROTECTED_SPACE.sub("\\1\x00", text)
    text = re.sub(r"\s+", "", text).replace("\x00", " ")
    for pattern, replacement in _SHORT_ARGS:
        text = pattern.sub(replacement, text)
    return _BASE_SUBSCRIPT.sub(r"\1_\2", text).lstrip("=")


# ----------------------------------------------------------------------------------------------------
# Fast verdicts (no sympy; they decide most pairs of a training batch)

_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?")
_PLAIN_FRACTION = re.compile(r"([+-]?)(?:\\frac\{(\d+)\}\{(\d+)\}|(\d+)/(\d+))")
_CHOICE = re.compile(r"\(([A-Ea-e])\)")
_LEADING_CHOICE = re.compile(r"\(?([A-Ea-e])\)?(?![A-Za-z])")
_WORDS = re.compile(r"[A-Za-z][A-Za-z'\-]*")
_FUNCTION_NAME = re.compile(r"(?:arc)?(?:sin|cos|tan|cot|sec|csc)h?|log|ln|exp|sqrt|pi")


def _plain_number(text: str) -> Fraction | None:
    if _PLAIN_NUMBER.fullmatch(text):
        return Fraction(text)
    fraction = _PLAIN_FRACTION.fullmatch(text)
    if fraction:
        sign, numerator, denominator = fraction.group(1), fraction.group(2) or fraction.group(4), \
            fraction.group(3) or fraction.group(5)
        if int(denominator) != 0:
            return Fraction(int(sign + numerator), int(denominator))
    return None


def _is_words(text: str) -> bool:
    """A word answer (\\text{Thursday}, east, Evelyn), as opposed to a formula in single-letter names."""
    return bool(_WORDS.fullmatch(text) and re.search(r"[A-Za-z]{3,}", text) and not _FUNCTION_NAME.match(text))


def _split_percent(text: str) -> tuple[str, bool]:
    return (text[:-1], True) if text.endswith("%") else (text, False)


def _fast_verdict(prediction: str, reference: str) -> bool | None:
    """True / False when cheap exact rules decide; None when sympy must."""
    if len(prediction) > MAX_ANSWER_CHARS or len(reference) > MAX_ANSWER_CHARS:
        return prediction.strip() == reference.strip()
    pred, ref = _normalize(prediction), _normalize(reference)
    if not pred:
        return False
    if pred == ref:
        return True
    pred_base, ref_base = _BASE_SUBSCRIPT.fullmatch(pred), _BASE_SUBSCRIPT.fullmatch(ref)
    if pred_base and ref_base:  # numbers written in a base: digits and base must both agree
        return [int(n) for n in pred_base.groups()] == [int(n) for n in ref_base.groups()]
    pred, ref = pred_base[1] if pred_base else pred, ref_base[1] if ref_base else ref  # 52_8 matches 52
    choice = _CHOICE.fullmatch(ref)
    if choice:
        leading = _LEADING_CHOICE.match(pred)
        return bool(leading) and leading.group(1).upper() == choice.group(1).upper()
    if _is_words(ref) or _is_words(pred):
        return pred.lower() == ref.lower()
    (pred_core, pred_percent), (ref_core, ref_percent) = _split_percent(pred), _split_percent(ref)
    pred_value, ref_value = _plain_number(pred_core), _plain_number(ref_core)
    if pred_value is None or ref_value is None:
        return None
    if pred_percent == ref_percent or pred_value == ref_value:
        return pred_value == ref_value
    return (pred_value / 100 if pred_percent else ref_value / 100) == (ref_value if pred_percent else pred_value)


# ----------------------------------------------------------------------------------------------------
# LaTeX -> sympy (runs only in worker processes)

class _Reject(Exception):
    """The text is not an answer we can read (or reading it would cost too much)."""


_TOKEN = re.compile(r"""
    (?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+(?![a-zA-Z]))?)
  | (?P<environment>\\(?:begin|end)\{[a-zA-Z*]+\})
  | (?P<command>\\[a-zA-Z]+|\\[^a-zA-Z])
  | (?P<name>(?:arc)?(?:sin|cos|tan|cot|sec|csc)h?|log|ln|exp|sqrt|pi)
  | (?P<letter>[a-zA-Z])
  | (?P<symbol>\S)
""", re.X)
_OPENERS = {"(", "[", "{", "\\{"}
_CLOSERS = {")", "]", "}", "\\}"}
_RELATIONS = {"=": "==", "<": "<", ">": ">", "\\leq": "<=", "\\geq": ">=", "\\neq": "!="}
_CONSTANTS = {"\\pi": sympy.pi, "\\infty": sympy.oo, "\\emptyset": sympy.S.EmptySet,
              "\\varnothing": sympy.S.EmptySet}
_GREEK = {"\\" + name for name in (
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi rho sigma "
    "tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Sigma Phi Psi Omega").split()}
_FUNCTIONS = {
    "\\sin": sympy.sin, "\\cos": sympy.cos, "\\tan": sympy.tan, "\\cot": sympy.cot, "\\sec": sympy.sec,
    "\\csc": sympy.csc, "\\arcsin": sympy.asin, "\\arccos": sympy.acos, "\\arctan": sympy.atan,
    "\\arccot": sympy.acot, "\\arcsec": sympy.asec, "\\arccsc": sympy.acsc, "\\sinh": sympy.sinh,
    "\\cosh": sympy.cosh, "\\tanh": sympy.tanh, "\\coth": sympy.coth, "\\sech": sympy.sech,
    "\\csch": sympy.csch, "\\exp": sympy.exp, "\\ln": sympy.log, "\\log": sympy.log, "\\gcd": sympy.gcd,
    "\\lcm": sympy.lcm, "\\max": sympy.Max, "\\min": sympy.Min, "\\sqrt": sympy.sqrt,
}
_INVERSES = {"\\sin": sympy.asin, "\\cos": sympy.acos, "\\tan": sympy.atan, "\\cot": sympy.acot,
             "\\sec": sympy.asec, "\\csc": sympy.acsc}
_MULTIPLY = {"*", "\\cdot", "\\times", "\\ast"}
_DIVIDE = {"/", "\\div"}
_SIGNS = {"+", "-", "\\pm", "\\mp"}
_MATRICES = {"pmatrix", "bmatrix", "Bmatrix", "matrix", "smallmatrix"}
_BLACKBOARD = {"R": sympy.S.Reals, "Z": sympy.S.Integers, "N": sympy.S.Naturals0, "Q": sympy.S.Rationals,
               "C": sympy.S.Complexes}


def _tokenize(text: str) -> list[str]:
    """LaTeX tokens; a bare function name (sin, log) becomes its command.

    >>> _tokenize("2\\\\frac{x}{3}+sin y")
    ['2', '\\\\frac', '{', 'x', '}', '{', '3', '}', '+', '\\\\sin', 'y']
    """
    return ["\\" + m.group() if m.lastgroup == "name" else m.group() for m in _TOKEN.finditer(text)]


def _is_number(token: str) -> bool:
    return token[:1].isdigit() or (token[:1] == "." and token[1:2].isdigit())


def _bits(value: sympy.Rational) -> int:
    return max(int(value.p).bit_length(), int(value.q).bit_length())


def _power(base, exponent):
    """base^exponent, refusing the exact numbers sympy would spend forever computing (9^{9^{9^9}})."""
    if not (isinstance(base, sympy.Expr) and isinstance(exponent, sympy.Expr)):
        raise _Reject("power of a non-number")
    if exponent.is_Rational and base not in (0, 1, -1):
        if base.is_Rational and abs(exponent.p) * _bits(base) > MAX_POWER_BITS:
            raise _Reject("power too large")
        if not base.is_Symbol and abs(exponent.p) > MAX_EXPONENT:  # (y/9)^n computes 9^n
            raise _Reject("power too large")
    return sympy.Pow(base, exponent)


def _factorial(value):
    if value.is_number and (not value.is_Integer or value > MAX_FACTORIAL):
        raise _Reject("factorial too large")
    return sympy.factorial(value)


def _repeating_decimal(literal: str, repeating: str) -> sympy.Rational:
    """0.1\\overline{6} -> 1/6."""
    whole, fixed = literal.split(".")
    without = int(whole + fixed or "0")
    return sympy.Rational(int(whole + fixed + repeating) - without, 10 ** len(fixed) * (10 ** len(repeating) - 1))


class _Parser:
    """Recursive descent from LaTeX tokens to sympy objects; `pm_sign` picks one reading of \\pm."""

    def __init__(self, tokens: list[str], pm_sign: int = 1):
        self.tokens = list(tokens)
        self.position = 0
        self.depth = 0
        self.abs_depth = 0
        self.pm_sign = pm_sign

    def peek(self) -> str:
        return self.tokens[self.position] if self.position < len(self.tokens) else ""

    def upcoming(self, *pattern: str) -> list[str] | None:
        """The next tokens if they fit the pattern ("#" stands for a run of digits), else None."""
        tokens = self.tokens[self.position:self.position + len(pattern)]
        fits = len(tokens) == len(pattern) and all(
            token.isdigit() if expected == "#" else token == expected for token, expected in zip(tokens, pattern))
        return tokens if fits else None

    def take(self) -> str:
        token = self.peek()
        if not token:
            raise _Reject("unexpected end")
        self.position += 1
        return token

    def expect(self, *options: str) -> str:
        token = self.take()
        if token not in options:
            raise _Reject(f"expected {options}, got {token!r}")
        return token

    def parse(self):
        value = self.relation()
        if self.peek():
            raise _Reject(f"unexpected {self.peek()!r}")
        return value

    def relation(self):
        left = self.sum()
        relations = []
        while self.peek() in _RELATIONS:
            operator = _RELATIONS[self.take()]
            right = self.sum()
            relations.append(sympy.Rel(left, right, operator, evaluate=False))
            left = right
        if len(relations) > 1:
            return sympy.And(*relations)
        return relations[0] if relations else left

    def signed(self, sign: str, value):
        if sign in ("\\pm", "\\mp"):
            return value * (self.pm_sign if sign == "\\pm" else -self.pm_sign)
        return -value if sign == "-" else value

    def sum(self):
        value = self.term()
        while self.peek() in _SIGNS:
            sign = self.take()
            value = value + self.signed(sign, self.term())
        return value

    def term(self):
        value = self.unary()
        while True:
            token = self.peek()
            if token in _MULTIPLY:
                self.take()
                value = value * self.unary()
            elif token in _DIVIDE:
                self.take()
                value = value / self.unary()
            elif self.starts_factor(token):  # implicit multiplication: 2x, 3\sqrt{5}, (a+5)(b+2)
                value = value * self.power()
            else:
                return value

    def unary(self):
        if self.peek() in _SIGNS:
            sign = self.take()
            return self.signed(sign, self.nested(self.unary))
        return self.power()

    def power(self):
        value = self.postfix(self.atom())
        if self.peek() == "^":
            self.take()
            value = self.postfix(_power(value, self.script()))
        return value

    def postfix(self, value):
        while self.peek() in ("!", "%"):
            value = _factorial(value) if self.take() == "!" else value / 100
        return value

    def nested(self, parse, *args):
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise _Reject("nested too deeply")
        try:
            return parse(*args)
        finally:
            self.depth -= 1

    def starts_factor(self, token: str) -> bool:
        if _is_number(token) or (len(token) == 1 and token.isalpha()) or token in ("(", "{"):
            return True
        if token == "|":
            return self.abs_depth == 0
        return token in _CONSTANTS or token in _GREEK or token in _FUNCTIONS or token.startswith("\\begin") \
            or token in ("\\frac", "\\binom", "\\lfloor", "\\lceil", "\\mathbb")

    def group(self, closer: str = "}"):
        self.take()
        value = self.nested(self.relation)
        self.expect(closer)
        return value

    def script(self):
        """The argument of ^ or _: a {group}, a signed script, or one token (a whole number: x^10)."""
        token = self.peek()
        if token == "{":
            return self.group()
        if token in ("-", "+"):
            self.take()
            return self.signed(token, self.script())
        return self.nested(self.atom, True)

    def argument(self):
        """A macro argument: a {group} or one token (\\frac12 is 1/2)."""
        token = self.peek()
        if token == "{":
            return self.group()
        if token.isdigit() and len(token) > 1:
            self.tokens[self.position] = token[1:]
            return sympy.Integer(token[0])
        return self.nested(self.atom, True)

    def atom(self, single: bool = False):
        token = self.take()
        if _is_number(token):
            return self.number(token, single)
        if len(token) == 1 and token.isalpha():
            return self.letter(token, single)
        if token in ("(", "["):
            self.position -= 1
            return self.group(")" if token == "(" else "]")
        if token == "{":
            self.position -= 1
            return self.group()
        if token == "|":
            self.abs_depth += 1
            value = self.nested(self.relation)
            self.abs_depth -= 1
            self.expect("|")
            return sympy.Abs(value)
        return self.nested(self.command, token)

    def number(self, literal: str, single: bool):
        if len(literal) > MAX_LITERAL_DIGITS:
            raise _Reject("number too long")
        mantissa, _, exponent = literal.lower().partition("e")
        if exponent and abs(int(exponent)) > MAX_SCI_EXPONENT:
            raise _Reject("exponent too large")
        value = sympy.Rational(Fraction(literal))
        if single:
            return value
        if "." in literal and (overline := self.upcoming("\\overline", "{", "#", "}")):
            self.position += 4
            return _repeating_decimal(literal, overline[2])
        if not literal.isdigit():
            return value
        if base := self.upcoming("_", "#") or self.upcoming("_", "{", "#", "}"):
            self.position += len(base)  # 52_8: the digits are the answer, the base is the question's
            return value
        mixed = self.upcoming("\\frac", "{", "#", "}", "{", "#", "}")
        if mixed and int(mixed[2]) < int(mixed[5]):
            self.position += 7  # a mixed number: 2\frac{1}{2} is 5/2, not a product
            return value + sympy.Rational(int(mixed[2]), int(mixed[5]))
        return value

    def letter(self, letter: str, single: bool):
        if not single and self.peek() == "_":
            self.take()
            if self.peek() == "{":
                start = self.position
                self.group()
                subscript = "".join(self.tokens[start + 1:self.position - 1])
            else:
                subscript = self.take()
            return sympy.Symbol(f"{letter}_{subscript}")
        return {"e": sympy.E, "i": sympy.I}.get(letter) or sympy.Symbol(letter)

    def command(self, name: str):
        if name in _CONSTANTS:
            return _CONSTANTS[name]
        if name in _GREEK:
            return sympy.Symbol(name[1:])
        if name == "\\frac":
            return self.argument() / self.argument()
        if name == "\\sqrt" and self.peek() == "[":
            index = self.group("]")
            return sympy.root(self.argument(), index)
        if name == "\\sqrt":
            return sympy.sqrt(self.argument())
        if name == "\\binom":
            top, bottom = self.argument(), self.argument()
            if top.is_number and top > MAX_FACTORIAL:
                raise _Reject("binomial too large")
            return sympy.binomial(top, bottom)
        if name in _FUNCTIONS:
            return self.function(name)
        if name in ("\\lfloor", "\\lceil"):
            value = self.relation()
            self.expect("\\rfloor" if name == "\\lfloor" else "\\rceil")
            return sympy.floor(value) if name == "\\lfloor" else sympy.ceiling(value)
        if name == "\\mathbb":
            self.expect("{")
            letter = self.take()
            self.expect("}")
            if letter not in _BLACKBOARD:
                raise _Reject(f"unknown set {letter}")
            return _BLACKBOARD[letter]
        if name.startswith("\\begin{") and name[7:-1] in _MATRICES:
            return self.matrix(name[7:-1])
        raise _Reject(f"unsupported {name}")

    def function(self, name: str):
        base = None
        if name == "\\log" and self.peek() == "_":
            self.take()
            base = self.script()
        exponent = None
        if self.peek() == "^":
            self.take()
            exponent = self.script()
        if self.peek() == "(":
            self.take()
            arguments = [self.nested(self.relation)]
            while self.peek() == ",":
                self.take()
                arguments.append(self.nested(self.relation))
            self.expect(")")
        else:  # \sin 2x is sin(2x); the argument stops at an operator or at the next function
            argument = self.power()
            while self.starts_factor(self.peek()) and self.peek() not in _FUNCTIONS:
                argument = argument * self.power()
            arguments = [argument]
        if name in ("\\gcd", "\\lcm", "\\max", "\\min"):
            value = _FUNCTIONS[name](*arguments)
        elif len(arguments) != 1:
            raise _Reject(f"{name} takes one argument")
        elif base is not None:
            value = sympy.log(arguments[0], base)
        elif exponent == -1 and name in _INVERSES:
            return _INVERSES[name](arguments[0])
        else:
            value = _FUNCTIONS[name](arguments[0])
        return value if exponent is None else _power(value, exponent)

    def matrix(self, environment: str):
        rows = [[]]
        end = f"\\end{{{environment}}}"
        while True:
            if self.peek() == end:
                self.take()
                break
            rows[-1].append(self.nested(self.relation))
            separator = self.expect("&", "\\\\", end)
            if separator == "\\\\" and self.peek() != end:
                rows.append([])
            elif separator == end:
                break
        if len({len(row) for row in rows}) != 1 or not rows[0]:
            raise _Reject("ragged matrix")
        if not all(isinstance(entry, sympy.Expr) for row in rows for entry in row):
            raise _Reject("matrix of non-numbers")
        return sympy.ImmutableMatrix(rows)


def _split_top(tokens: list[str], separators: set[str]) -> list[list[str]]:
    """Split at separators outside any brackets; (3,4] counts as one bracket pair."""
    parts, current, depth = [], [], 0
    for token in tokens:
        if token in _OPENERS or token.startswith("\\begin"):
            depth += 1
        elif token in _CLOSERS or token.startswith("\\end"):
            depth -= 1
        if depth == 0 and token in separators:
            parts.append(current)
            current = []
        else:
            current.append(token)
    parts.append(current)
    return parts


def _closes_at_end(tokens: list[str]) -> bool:
    """Whether the bracket opened by the first token is closed by the last one."""
    depth = 0
    for index, token in enumerate(tokens):
        if token in _OPENERS:
            depth += 1
        elif token in _CLOSERS:
            depth -= 1
            if depth == 0:
                return index == len(tokens) - 1
    return False


def _flatten(items: list) -> list:
    """Splice the two readings of a \\pm item into the list around it."""
    return [value for item in items for value in (item if isinstance(item, list) else [item])]


def _parse_answer(text: str):
    """A normalised answer as sympy: an Expr, a relation, a Set (intervals), a Matrix, a tuple (ordered)
    or a list (unordered: bare lists, \\{...\\} and the two values of a \\pm)."""
    tokens = _tokenize(text)
    if not tokens:
        raise _Reject("empty")
    pieces = _split_top(tokens, {"\\cup"})
    if len(pieces) > 1:
        return sympy.Union(*(_as_set(_parse_item(piece)) for piece in pieces))
    items = _split_top(tokens, {",", ";"})
    if len(items) > 1:
        return _flatten([_parse_item(item) for item in items])
    return _parse_item(tokens)


def _parse_item(tokens: list[str]):
    if not tokens:
        raise _Reject("empty item")
    first, last = tokens[0], tokens[-1]
    if first == "\\{" and last == "\\}" and _closes_at_end(tokens):
        inner = tokens[1:-1]
        return _flatten([_parse_item(item) for item in _split_top(inner, {",", ";"})]) if inner else sympy.S.EmptySet
    if first in ("(", "[") and last in (")", "]") and _closes_at_end(tokens):
        parts = _split_top(tokens[1:-1], {","})
        if len(parts) > 1:
            values = [_parse_item(part) for part in parts]
            infinite = any(value in (sympy.oo, -sympy.oo) for value in values)
            if len(values) == 2 and (first + last != "()" or infinite):
                return sympy.Interval(values[0], values[1], first == "(", last == ")")
            if first + last not in ("()", "[]"):
                raise _Reject("half-open bracket around a tuple")
            return tuple(values)
        if first + last == "()":  # ((1, 2)) or (\{1, 2\}): the answer inside
            return _parse_item(tokens[1:-1])
    value = _Parser(tokens).parse()
    if "\\pm" in tokens or "\\mp" in tokens:  # 1 \pm \sqrt{2}: both readings, as an unordered list
        return [value, _Parser(tokens, pm_sign=-1).parse()]
    return value


def _is_set_like(value) -> bool:
    return isinstance(value, (sympy.Set, sympy.And)) or (
        isinstance(value, sympy.core.relational.Relational) and not isinstance(value, sympy.Equality))


def _as_set(value) -> sympy.Set:
    if isinstance(value, sympy.Set):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return sympy.Interval.open(*value)
    if isinstance(value, list):
        return sympy.Union(*map(_as_set, value))
    if isinstance(value, (sympy.And, sympy.core.relational.Relational)) and not isinstance(value, sympy.Equality):
        symbols = value.free_symbols
        if len(symbols) != 1:
            raise _Reject("not an inequality in one variable")
        variable = symbols.pop()
        parts = value.args if isinstance(value, sympy.And) else [value]
        return sympy.Intersection(*(sympy.solveset(part, variable, sympy.S.Reals) for part in parts))
    raise _Reject("not a set")


def _sets_equal(a: sympy.Set, b: sympy.Set) -> bool:
    if a == b:
        return True
    return sympy.Complement(a, b).is_empty is True and sympy.Complement(b, a).is_empty is True


def _numerically_nonzero(expr: sympy.Expr) -> bool:
    """Whether expr is certainly not identically zero: its value at a generic point, to 30 digits."""
    symbols = sorted(expr.free_symbols, key=str)
    for trial in range(3):
        point = {symbol: sympy.Rational(113 + 37 * k + 19 * trial, 71) for k, symbol in enumerate(symbols)}
        value = sympy.N(expr, 30, subs=point)
        if value.has(sympy.nan, sympy.zoo) or not value.is_number:
            continue
        magnitude = abs(value)
        if magnitude.is_Number:
            return bool(magnitude > sympy.Float("1e-20"))
    return False


def _expr_equal(a, b) -> bool:
    if not (isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr)):
        return a == b
    if a == b:
        return True
    if a.is_Rational and b.is_Rational:
        return False
    difference = a - b
    if difference == 0:
        return True
    if _numerically_nonzero(difference):
        return False
    if sympy.expand(difference) == 0 or sympy.simplify(difference) == 0:
        return True
    return difference.equals(0) is True


def _equations_equal(a, b) -> bool:
    if isinstance(a, sympy.Equality) and isinstance(b, sympy.Equality):
        left, right = a.lhs - a.rhs, b.lhs - b.rhs
        if left == 0 or right == 0:
            return left == right
        ratio = sympy.simplify(sympy.cancel(left / right))
        return not ratio.free_symbols and ratio.is_zero is False and ratio.is_finite is True
    equation, value = (a, b) if isinstance(a, sympy.Equality) else (b, a)
    for side, other in ((equation.lhs, equation.rhs), (equation.rhs, equation.lhs)):
        if isinstance(side, sympy.Symbol) and side not in other.free_symbols:
            return _same(other, value)
    return False


def _relations_equal(a, b) -> bool:
    """Inequalities in several variables: the same strictness and the same side of zero."""
    def canonical(relation):
        if isinstance(relation, (sympy.StrictGreaterThan, sympy.GreaterThan)):
            return relation.rhs - relation.lhs, isinstance(relation, sympy.StrictGreaterThan)
        return relation.lhs - relation.rhs, isinstance(relation, sympy.StrictLessThan)
    (left, strict_a), (right, strict_b) = canonical(a), canonical(b)
    return strict_a == strict_b and _expr_equal(left, right)


def _as_vector(value):
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, sympy.MatrixBase) and 1 in value.shape:
        return list(value)
    return None


def _same(a, b) -> bool:
    """Equivalence of two parsed answers."""
    a = a[0] if isinstance(a, list) and len(a) == 1 else a
    b = b[0] if isinstance(b, list) and len(b) == 1 else b
    inequalities = (sympy.LessThan, sympy.StrictLessThan, sympy.GreaterThan, sympy.StrictGreaterThan)
    if isinstance(a, inequalities) and isinstance(b, inequalities) and len(a.free_symbols | b.free_symbols) > 1:
        return _relations_equal(a, b)
    if _is_set_like(a) or _is_set_like(b):
        return _sets_equal(_as_set(a), _as_set(b))
    if isinstance(a, sympy.MatrixBase) or isinstance(b, sympy.MatrixBase):
        if isinstance(a, sympy.MatrixBase) and isinstance(b, sympy.MatrixBase) and a.shape == b.shape:
            return all(map(_expr_equal, a, b))
        a_vector, b_vector = _as_vector(a), _as_vector(b)
        return a_vector is not None and b_vector is not None and len(a_vector) == len(b_vector) \
            and all(map(_same, a_vector, b_vector))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return False
        if isinstance(a, tuple) or isinstance(b, tuple):
            return all(map(_same, a, b))
        unmatched = list(b)
        for item in a:
            match = next((index for index, other in enumerate(unmatched) if _same(item, other)), None)
            if match is None:
                return False
            del unmatched[match]
        return True
    if isinstance(a, sympy.Equality) or isinstance(b, sympy.Equality):
        return _equations_equal(a, b)
    return _expr_equal(a, b)


def _equivalent(prediction: str, reference: str) -> bool:
    """The whole unbounded check; callers run it in a worker (see RewardPool)."""
    try:
        verdict = _fast_verdict(prediction, reference)
        if verdict is not None:
            return verdict
        pred, pred_percent = _split_percent(_normalize(prediction))
        ref, ref_percent = _split_percent(_normalize(reference))
        pred_value, ref_value = _parse_answer(pred), _parse_answer(ref)
        if _same(pred_value, ref_value):
            return True
        if pred_percent == ref_percent:
            return False
        if pred_percent:  # the side with a % may also be meant as its fraction of 1
            return isinstance(pred_value, sympy.Expr) and _same(pred_value / 100, ref_value)
        return isinstance(ref_value, sympy.Expr) and _same(pred_value, ref_value / 100)
    except Exception:  # sympy raises many kinds on odd input; any of them means "not shown equal"
        return False


# ----------------------------------------------------------------------------------------------------
# Bounded time: worker processes
#
# Workers are plain subprocesses speaking JSON lines over stdin/stdout, not multiprocessing: fork is
# unsafe under torch's threads, and spawn/forkserver re-import the caller's __main__ (train.py, hence
# torch) in every worker and in every replacement of a killed one. A worker here imports only this file
# and sympy (~0.5 s), and killing it (SIGKILL) works whatever C code it is stuck in.

_WORKER_COMMAND = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r});"
                   " import reward; reward._serve()"]


def _serve() -> None:
    """Worker main loop: a JSON job [id, candidates, reference, timeout_s] per stdin line, a JSON
    [id, equal] per stdout line; "ready" first, once sympy is loaded and warm."""
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
    _equivalent("(x+1)^2 \\le 3", "x^2+2x+1 \\leq 3")  # load sympy's lazy modules before the first timed job
    replies.write('"ready"\n')
    replies.flush()
    for line in sys.stdin:
        job_id, candidates, reference, timeout_s = json.loads(line)
        signal.setitimer(signal.ITIMER_REAL, timeout_s + 2.0)
        equal = any(_equivalent(candidate, reference) for candidate in candidates)
        signal.setitimer(signal.ITIMER_REAL, 0)
        replies.write(json.dumps([job_id, equal]) + "\n")
        replies.flush()


class _Worker:
    """One checker process and the job it is on (`job` index, `deadline` on time.monotonic())."""

    def __init__(self):
        self.process = subprocess.Popen(_WORKER_COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        os.set_blocking(self.process.stdout.fileno(), False)
        self.started = time.monotonic()
        self.pending = b""
        self.ready = False
        self.job = None
        self.deadline = None

    def send(self, job: int, candidates: list[str], reference: str, timeout_s: float) -> None:
        message = json.dumps([job, candidates, reference, timeout_s]) + "\n"
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


class RewardPool:
    """Scores batches of (response, reference) pairs in parallel worker processes, each check bounded by
    `timeout_s`: a worker past its deadline is killed and replaced, and that pair scores 0.0. Pairs that
    the fast exact paths decide never leave the calling process. Workers start on first need and live
    until close() (or exit).

    >>> with RewardPool(num_workers=2, timeout_s=5.0) as pool:
    ...     pool.score([("... so \\\\boxed{\\\\frac{1}{2}}", "0.5"), ("... so \\\\boxed{2}", "3")])
    [1.0, 0.0]
    """

    def __init__(self, num_workers: int | None = None, timeout_s: float = 5.0):
        self.num_workers = num_workers or min(8, os.cpu_count() or 1)
        self.timeout_s = timeout_s
        self._workers: list[_Worker] = []
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        _live_pools.add(self)

    def score(self, pairs: list[tuple[str, str]], kind: str = "math") -> list[float]:
        """1.0 / 0.0 per (response, reference): kind "math" (final answer vs reference answer) or
        "choice" (multiple-choice letter, GPQA)."""
        if kind == "choice":
            return [choice_reward(response, letter) for response, letter in pairs]
        if kind != "math":
            raise ValueError(f"kind must be 'math' or 'choice', not {kind!r}")
        jobs = [(_candidate_answers(_text(response), _text(reference)), _text(reference))
                for response, reference in pairs]
        return [1.0 if equal else 0.0 for equal in self.judge(jobs, self.timeout_s)]

    def judge(self, jobs: list[tuple[list[str], str]], timeout_s: float) -> list[bool]:
        """For each (candidate answers, reference): whether any candidate equals the reference."""
        verdicts = [False] * len(jobs)
        hard = []
        for index, (candidates, reference) in enumerate(jobs):
            fast = [_safe_fast_verdict(candidate, reference) for candidate in candidates]
            if True in fast:
                verdicts[index] = True
            elif None in fast:
                hard.append((index, [c for c, verdict in zip(candidates, fast) if verdict is None], reference))
        if hard:
            with self._lock:
                self._run(deque(hard), timeout_s, verdicts)
        return verdicts

    def _run(self, queue: deque, timeout_s: float, verdicts: list[bool]) -> None:
        while len(self._workers) < min(self.num_workers, len(queue)):
            self._start_worker()
        while queue or any(worker.job is not None for worker in self._workers):
            for worker in self._workers:
                if queue and worker.ready and worker.job is None:
                    self._dispatch(worker, *queue.popleft(), timeout_s, verdicts)
            now = time.monotonic()
            deadlines = [worker.deadline for worker in self._workers if worker.job is not None]
            if not deadlines and all(now - w.started > STARTUP_TIMEOUT_S for w in self._workers):
                raise RuntimeError(f"reward workers did not start within {STARTUP_TIMEOUT_S:.0f} s "
                                   f"(command: {' '.join(_WORKER_COMMAND)}); see their stderr above")
            wait_s = min(deadlines) - now if deadlines else 0.5
            for key, _ in self._selector.select(max(0.0, wait_s)):
                self._read(key.data, verdicts)
            now = time.monotonic()
            for worker in list(self._workers):
                if worker.job is not None and now >= worker.deadline:
                    verdicts[worker.job] = False
                    self._replace(worker)

    def _dispatch(self, worker: _Worker, index: int, candidates: list[str], reference: str,
                  timeout_s: float, verdicts: list[bool]) -> None:
        try:
            worker.send(index, candidates, reference, timeout_s)
        except OSError:  # it died while idle
            verdicts[index] = False
            self._replace(worker)

    def _read(self, worker: _Worker, verdicts: list[bool]) -> None:
        messages = worker.receive()
        if messages is None:
            if not worker.ready:
                raise RuntimeError("a reward worker exited while starting (see its stderr above)")
            if worker.job is not None:
                verdicts[worker.job] = False
            self._replace(worker)
            return
        for message in messages:
            if message == "ready":
                worker.ready = True
            else:
                job, equal = message
                verdicts[job] = equal
                worker.job = None

    def _start_worker(self) -> _Worker:
        worker = _Worker()
        self._selector.register(worker.process.stdout, selectors.EVENT_READ, worker)
        self._workers.append(worker)
        return worker

    def _replace(self, worker: _Worker) -> None:
        self._selector.unregister(worker.process.stdout)
        self._workers.remove(worker)
        worker.stop()
        self._start_worker()

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        with self._lock:
            for worker in self._workers:
                self._selector.unregister(worker.process.stdout)
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


_shared: RewardPool | None = None
_shared_lock = threading.Lock()


def _shared_pool() -> RewardPool:
    """The one-worker pool behind is_equiv and math_reward, created on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = RewardPool(num_workers=1)
        return _shared


def _safe_fast_verdict(prediction: str, reference: str) -> bool | None:
    try:
        return _fast_verdict(prediction, reference)
    except Exception:  # let the worker (where every failure means False) decide
        return None


def _text(value) -> str:
    return "" if value is None else str(value)


# ----------------------------------------------------------------------------------------------------
# Public API

def is_equiv(prediction: str, reference: str, *, timeout: float = 5.0) -> bool:
    """Whether the answer `prediction` equals the reference answer; False past `timeout` seconds.

    >>> is_equiv("2\\\\frac{1}{2}", "5/2"), is_equiv("0.33", "\\\\frac13"), is_equiv("(-1,4)", "[-1,4)")
    (True, False, False)
    """
    return _shared_pool().judge([([_text(prediction)], _text(reference))], timeout)[0]


def math_reward(response: str, reference: str) -> float:
    """1.0 if the final answer of the whole decoded response equals the reference, else 0.0."""
    return _shared_pool().score([(response, reference)])[0]


_CHOICE_STATEMENT = re.compile(r"(?i:answer)\s*(?:is)?\s*[:：]?\s*\**\s*\(?([A-Z])\)?(?![A-Za-z0-9])")
_LONE_LETTER = re.compile(r"[\W_]*\(?([A-Z])\)?[\W_]*")


def extract_choice(response: str) -> str | None:
    """The last multiple-choice letter a response gives: "Answer: X", \\boxed{X}, or a final line that is
    just X; None when it gives none."""
    found = []  # (position, letter)
    tail_start = max(0, len(response) - _STATEMENT_WINDOW)
    statement = None
    for statement in _CHOICE_STATEMENT.finditer(response, tail_start):
        pass
    if statement is not None:
        found.append((statement.start(), statement.group(1)))
    spans = _box_spans(response)
    if spans:
        boxed = re.fullmatch(r"\(?([A-Z])\)?", _normalize(spans[-1][2])) if len(spans[-1][2]) < 100 else None
        if boxed:
            found.append((spans[-1][0], boxed.group(1)))
    stripped = response.rstrip()
    last_line_start = stripped.rfind("\n") + 1
    lone = _LONE_LETTER.fullmatch(stripped[last_line_start:])
    if lone:
        found.append((last_line_start, lone.group(1)))
    return max(found)[1] if found else None


def choice_reward(response: str, reference_letter: str) -> float:
    """1.0 if the last letter the response gives is the reference letter (GPQA-Diamond), else 0.0."""
    letter = extract_choice(_text(response))
    return 1.0 if letter is not None and letter == _text(reference_letter).strip().strip("()").upper() else 0.0
