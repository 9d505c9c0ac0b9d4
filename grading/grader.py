"""The answer checker: whether two final answers are the same, decided exactly. Pure functions, no
processes and no I/O (reward.py runs them in time-bounded workers).

Two stages:
- normalize() turns an answer into a canonical string (spacing, \\left/\\right, \\dfrac, \\text{},
  currency, thousands separators, percent spellings) and its unit (units.py); fast_verdict() decides most pairs
  from those strings without sympy (identical text, plain numbers as exact fractions (numerals.py), words,
  multiple-choice letters);
- what is left is parsed from LaTeX straight into sympy objects (latex.py's parse_answer) and compared
  exactly by answers_equal(): no floating tolerance, except for a reference written as a rounded decimal
  (see docs/reward.md for every policy).

equivalent() is the whole check; it never raises, but it may take unbounded time on hostile input.

>>> equivalent("2\\\\frac{1}{2}", "5/2"), equivalent("0.33", "\\\\frac13")
(True, False)
"""

import functools
import re
from dataclasses import dataclass
from fractions import Fraction

import sympy

from grading.latex import (
    CONSTANTS,
    INEQUALITIES,
    Reject,
    as_set,
    box_spans,
    is_set_like,
    matching_brace,
    parse_answer,
    split_top,
    tokenize,
)
from grading.numerals import PLAIN_NUMBER, plain_number, precision_matches
from grading.units import is_unit_symbol, joined_unit_blocks, read_degrees, split_unit, text_block_unit

MAX_ANSWER_CHARS = 1000  # a longer "answer" only equals an identical reference: no real answer is this long


# ----------------------------------------------------------------------------------------------------
# Normalisation (cheap, runs in the caller): an answer -> canonical text, unit and percent flag

@dataclass(frozen=True)
class Answer:
    """An answer in canonical form: equal `text` means equal answers, and the parser reads `text`."""
    text: str
    unit: str = ""  # canonical unit ("cm", "cm^2", "degree"); "" for none (a bare number)
    percent: bool = False


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_THOUSANDS_MARK = re.compile(r"(?<=\d)(?:\s*\{\s*,\s*\}|,\\!|\\,|,\\,|,\\ |\\ |[\u00a0\u2009\u202f\u2007'])"
                             r"\s*(?=\d{3}(?!\d))")
_SPACE_GROUPED = re.compile(r"[+-]?\d{1,3}(?: \d{3})+(?:\.\d+)?")  # 1 000 000, when it is the whole answer
_MIXED_NUMBER = re.compile(r"(?<![\d.,/])(\d+)\s+(\d+)/(\d+)(?![\d/])")  # 1 1/2: one and a half, not 11/2
# \\\\frac from a doubly escaped string is \\frac: a row break never comes right before a letter
_DOUBLED_BACKSLASH = re.compile(r"(?<!\\)\\\\(?=[a-zA-Z])")
_SINGLE_BACKSLASH_COMMAND = re.compile(r"(?<!\\)\\[a-zA-Z]")
# (11,7) or (7,11); 1, 2, and 3; x = 5 or x = -5
_LIST_WORD = re.compile(r"(?<=[)\]}\d,])\s*\b(?:or|and)\b\s*(?=[-(\[\\\d]|[a-zA-Z]\s*=)")
_REPEATED_COMMA = re.compile(r",(?:\s*,)+")
_SPACING = re.compile(r"\\\\|\\(?:left|right)\.|\\(?:left|right|[bB]igg?[lr]?|displaystyle|textstyle|quad"
                      r"|qquad)(?![a-zA-Z])|\\[,;:! ]|~")
_TEXT_BLOCK = re.compile(r"\\(text|textbf|textit|textrm|textnormal|textsf|mbox|mathrm|mathbf|mathit|mathsf"
                         r"|operatorname)\s*\{")
# One pass for the many one-for-one spellings: a command (not followed by a letter) or a symbol -> ours.
_SPELLINGS = {
    "\\dfrac": "\\frac", "\\tfrac": "\\frac", "\\cfrac": "\\frac", "\\dbinom": "\\binom",
    "\\tbinom": "\\binom",
    "\\le": "\\leq", "\\leqslant": "\\leq", "\\ge": "\\geq", "\\geqslant": "\\geq", "\\ne": "\\neq",
    "\\lt": "<", "\\gt": ">", "\\lbrace": "\\{", "\\rbrace": "\\}", "\\vert": "|", "\\lvert": "|",
    "\\rvert": "|", ">=": "\\geq ", "<=": "\\leq ", "!=": "\\neq ", "≤": "\\leq ", "≥": "\\geq ",
    "≠": "\\neq ", "−": "-", "–": "-", "×": "\\times ", "·": "\\cdot ", "⋅": "\\cdot ",
    "÷": "\\div ",
    "π": "\\pi ", "∞": "\\infty ", "√": "\\sqrt ", "∪": "\\cup ", "∩": "\\cap ", "∈": "\\in ",
    "∅": "\\emptyset ", "≈": "\\approx ", "\\%": "%",
    "^{\\prime}": "'", "^\\prime": "'", "^{\\prime\\prime}": "''",  # v^{\prime} is v'
}
_SPELLING = re.compile("|".join(
    re.escape(key) + ("(?![a-zA-Z])" if key[0] == "\\" and key[-1].isalpha() else "")
    for key in sorted(_SPELLINGS, key=len, reverse=True)))
_REWRITES = [(re.compile(pattern), replacement) for pattern, replacement in [
    (r"\\(?:mathrm|mathit)\{d\}", "d"),
    (r"\\begin\{array\}\{[^{}]*\}", r"\\begin{matrix}"), (r"\\end\{array\}", r"\\end{matrix}"),
    (r"(?<=\d)\s*(?:x|\\times|\\cdot|\*)\s*10\s*\^", r"\\times10^"),  # 3.2 x 10^5
    (r"(?<![a-zA-Z])(?:per\s?cent(?:age)?|pct)\b", "%"),
    (r"\\\$|\$|\bdollars?\b|\bUSD\b|US\$|[€£¥]|\\euro\b|\\pounds\b", ""),
    (r"^[a-zA-Z]\s*\\in(?![a-zA-Z])", ""),
    (r"(?i)\bmiles?\s+(?:per|an?)\s+hour\b", "mph"), (r"(?i)\bkilomet(?:er|re)s?\s+(?:per|an?)\s+hour\b", "km/h"),
    (r"(?i)\bmet(?:er|re)s?\s+(?:per|a)\s+second\b", "m/s"),
    # v^2_0 is v_0^2: TeX takes a name's two scripts in either order
    (r"((?<![\\a-zA-Z])[a-zA-Z]|\\[a-zA-Z]+)\^(\{[^{}]*\}|[a-zA-Z0-9])_(\{[^{}]*\}|[a-zA-Z0-9])", r"\1_\3^\2"),
]]
_APPROX = re.compile(r"\\approx(?![a-zA-Z])")
# Spaces go, except where they separate tokens: "\pi r" is not "\pir", "\log_2 8" is not "\log_28".
_PROTECTED_SPACE = re.compile(r"(\\[a-zA-Z]+|[_^]\d)\s+(?=[a-zA-Z\d])")
_SHORT_ARGS = [(re.compile(pattern), replacement) for pattern, replacement in [
    (r"\\frac(\d)(\d)", r"\\frac{\1}{\2}"),  # TeX reads one character: \frac12 is 1/2
    (r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}"),
    (r"\\frac(\d)\{", r"\\frac{\1}{"),
    (r"\\sqrt(\d)", r"\\sqrt{\1}"),
]]
_GROUPED_NUMBER = re.compile(r"[+-]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?")  # 0,111 is a decimal comma
_BASE_SUBSCRIPT = re.compile(r"(\d+)_(\d+)")  # 52_8 once normalised
_WRITTEN_BASE = re.compile(r"(?<![\^\d])(\d+)_(?:\{(\d+)\}|(\d+))")  # 52_8, 52_{8}; not v^2_0


def _mixed_number(match: re.Match) -> str:
    """1 1/2 -> 1\\frac{1}{2} (a mixed number, which the parser reads as 3/2); 1 3/2 stays as it is."""
    whole, numerator, denominator = match.groups()
    if int(numerator) >= int(denominator):
        return match.group()
    return rf"{whole}\frac{{{numerator}}}{{{denominator}}}"


def _without_approximation(text: str) -> str:
    """What an answer with \\approx states exactly: "x = 1/3 \\approx 0.33" -> "x = 1/3"; the approximate
    value only when nothing exact precedes it ("x \\approx 11" -> "11")."""
    parts = [part.strip() for part in _APPROX.split(text)]
    exact = parts[0].replace(" ", "")
    if exact and (not _NAME_LIKE.fullmatch(exact) or exact in CONSTANTS):
        return parts[0]
    return parts[-1]


_TRAILING_BACKSLASHES = re.compile(r"(?<!\\)(?:\\\\|\\)+\s*$")  # "5 \\\\" (a row break) or a stray "5\\"
_REPEATING_HINT = re.compile(r"\.{3}|…|dots|repeat|recurr|\\dot|\\bar|\d\.\d*\(")
_ELLIPSIS_DECIMAL = re.compile(r"(\d+\.)(\d+)\s*(?:\.{3}|…|\\[lc]?dots(?![a-zA-Z]))")
_WORDED_DECIMAL = re.compile(r"(\d+\.)(\d+)\s*(?:\\text\{\s*)?(?:repeating|recurring)\b(?:\s*\})?", re.I)
_BRACKETED_DECIMAL = re.compile(r"(\d+\.\d*)\((\d+)\)(?![\d(])")
_DOTTED_DECIMAL = re.compile(r"(?<=[\d.])\\dot\{?(\d)\}?(?:(\d*)\\dot\{?(\d)\}?)?")
_BARRED_DECIMAL = re.compile(r"(?<=[\d.])\\bar\{(\d+)\}")


def _repeat_of(digits: str) -> tuple[str, str] | None:
    """(fixed, repeating) of digits that end in a period written out at least twice ("1666" -> ("1", "6"),
    "121212" -> ("", "12")); None when they do not ("14159")."""
    for length in range(1, 7):
        unit, count = digits[-length:], 0
        while digits.endswith(unit * (count + 1)):
            count += 1
        if count >= 2 and len(unit) == length:
            return digits[:len(digits) - count * length], unit
    return None


def _repeating_decimals(text: str) -> str:
    """Repeating decimals in the forms people write them, as 0.1\\overline{6} (which the parser reads):
    0.1666..., 0.333\\ldots, "0.3 repeating", 0.(3), 0.\\dot{3}, 0.\\dot{1}4285\\dot{7}, 0.\\bar{3}. A
    decimal cut off with ... that shows no period (3.14159...) is its digits."""
    def ellipsis(match: re.Match) -> str:
        repeat = _repeat_of(match.group(2))
        if not repeat:  # a decimal cut off: its digits (3.14159... is 3.14159, which precision then judges)
            return match.group(1) + match.group(2)
        return f"{match.group(1)}{repeat[0]}\\overline{{{repeat[1]}}}"

    def worded(match: re.Match) -> str:
        fixed, unit = _repeat_of(match.group(2)) or ("", match.group(2))
        return f"{match.group(1)}{fixed}\\overline{{{unit}}}"
    text = _ELLIPSIS_DECIMAL.sub(ellipsis, text)
    text = _WORDED_DECIMAL.sub(worded, text)
    text = _BRACKETED_DECIMAL.sub(r"\1\\overline{\2}", text)
    text = _DOTTED_DECIMAL.sub(lambda m: f"\\overline{{{m.group(1)}{m.group(2) or ''}{m.group(3) or ''}}}", text)
    return _BARRED_DECIMAL.sub(r"\\overline{\1}", text)


def undouble_backslashes(text: str) -> str:
    """\\\\frac from a doubly escaped string is \\frac (a row break \\\\ never comes right before a
    letter); in a text escaped twice throughout (no command with one backslash) every \\\\ is one."""
    if not _DOUBLED_BACKSLASH.search(text):
        return text
    if not _SINGLE_BACKSLASH_COMMAND.search(text):
        return text.replace("\\\\", "\\")
    return _DOUBLED_BACKSLASH.sub(r"\\", text)


def unwrap(text: str) -> str:
    """Strip math delimiters and a box around the whole answer: "$\\boxed{5}$" -> "5"."""
    while True:
        text = text.strip()
        for opener, closer in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if len(text) >= len(opener) + len(closer) and text.startswith(opener) and text.endswith(closer):
                text = text[len(opener):len(text) - len(closer)]
                break
        else:
            spans = box_spans(text)
            if len(spans) == 1 and spans[0][0] == 0 and spans[0][1] == len(text):
                text = spans[0][2]
            else:
                return text


def _rewrite_text_blocks(text: str) -> tuple[str, str]:
    """\\text{...} and friends: "and"/"or" separate list items, a trailing one after a value is a unit
    (removed and returned), otherwise the words themselves. Returns (text, unit)."""
    position, unit = 0, ""
    while match := _TEXT_BLOCK.search(text, position):
        close = matching_brace(text, match.end() - 1)
        if close < 0:
            break
        command, content = match.group(1), text[match.end():close].strip()
        end = close + 1
        if command == "operatorname":
            replacement = "\\" + content
        elif content.lower() in ("and", "or", ",", "and/or"):
            replacement = ","
        elif content.lower() in ("%", "\\%", "percent"):
            replacement = "%"
        elif (block_unit := text_block_unit(text, match.start(), command, content, end)) is not None:
            replacement, (unit, end) = "", block_unit
        else:
            replacement = f" {content} "
        text = text[:match.start()] + replacement + text[end:]
        position = match.start() + len(replacement)
    return text, unit


@functools.lru_cache(maxsize=8192)  # a reference is normalised once per group of responses, not G times
def normalize(answer: str) -> Answer:
    """The canonical form of an answer (a plain number is its own).

    >>> normalize("\\\\$1{,}234.50 \\\\text{ dollars}")
    Answer(text='1234.50', unit='', percent=False)
    >>> normalize("\\\\left( \\\\dfrac12, 30^\\\\circ \\\\right)")
    Answer(text='(\\\\frac{1}{2},30)', unit='', percent=False)
    >>> normalize("15 \\\\text{ cm}^2"), normalize("12.5 \\\\%").percent
    (Answer(text='15', unit='cm^2', percent=False), True)
    """
    if PLAIN_NUMBER.fullmatch(answer):
        return Answer(answer)
    text = unwrap(undouble_backslashes(_CONTROL.sub("", answer)))
    if text.startswith("{") and matching_brace(text, 0) == len(text) - 1:
        text = text[1:-1]  # {1,2,3}: a TeX group around a list, not a set (that is \\{...\\})
    text = _MIXED_NUMBER.sub(_mixed_number, _THOUSANDS_MARK.sub("", text))
    if _SPACE_GROUPED.fullmatch(text.strip()):
        text = text.replace(" ", "")
    text = _SPACING.sub(lambda match: "\\\\" if match.group() == "\\\\" else " ", text)  # keep \\ rows
    if _REPEATING_HINT.search(text):
        text = _repeating_decimals(text)
    if "\\" in text or "°" in text:
        text = joined_unit_blocks(text)
    text, unit = _rewrite_text_blocks(text)
    if text.rstrip().endswith("\\"):
        text = _TRAILING_BACKSLASHES.sub("", text)
    text = _SPELLING.sub(lambda match: _SPELLINGS[match.group()], text)
    for pattern, replacement in _REWRITES:
        text = pattern.sub(replacement, text)
    text = _REPEATED_COMMA.sub(",", _LIST_WORD.sub(",", text)).strip().rstrip(".").strip()
    if "\\approx" in text:
        text = _without_approximation(text)
    if not unit:
        text, unit = split_unit(text)
    text, unit = read_degrees(text, unit)
    text = text.strip().rstrip(".,;:").strip()
    percent = text.endswith("%")
    text = text.rstrip("%").strip()
    if _GROUPED_NUMBER.fullmatch(text):  # before spaces go: "1, 234" is a list
        text = text.replace(",", "")
    text = _PROTECTED_SPACE.sub("\\1\x00", text)
    text = re.sub(r"\s+", "", text).replace("\x00", " ")
    for pattern, replacement in _SHORT_ARGS:
        text = pattern.sub(replacement, text)
    text = _WRITTEN_BASE.sub(lambda match: f"{match[1]}_{match[2] or match[3]}", text)
    return Answer(text.lstrip("="), unit, percent)


# ----------------------------------------------------------------------------------------------------
# Fast verdicts (no sympy; they decide most pairs of a training batch)

_DECIMAL_COMMA = re.compile(r"([+-]?\d+),(\d+)")  # 1,000 never gets here: normalize() read it as 1000
_TIME = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?(?:([aApP])[mM])?")
# (b) or B: a multiple-choice letter, A to J (MMLU-Pro's ten options; GPQA's four, AQuA's five)
_CHOICE = re.compile(r"\(([A-Ja-j])\)|([A-J])")
# A letter answer: the letter alone ("C", "(c)", "**C**"), or labelled and followed by its option's text
# ("(C) 12", "C: 12"); the text may name no other option ("(A),(B)" is two answers; a bare F to J in it may be
# a unit, farad to joule, and is not read as an option).
_CHOICE_ANSWER = re.compile(r"(?i:option|choice)?\**(?:\(([A-Ja-j])\)|([A-Ja-j]))\**"
                            r"|(?:\(([A-Ja-j])\)|([A-J])[:)])(?![-+*/^,;=])(.+)")
_OTHER_CHOICE = re.compile(r"(?<![A-Za-z\\])(?:\(?[A-E]\)?|\([F-J]\))(?![A-Za-z])")
_WORDS = re.compile(r"[A-Za-z][A-Za-z'\-]*")
_TRUTH_WORDS = {"yes": "true", "no": "false"}
_FUNCTION_NAME = re.compile(r"(?:arc)?(?:sin|cos|tan|cot|sec|csc)h?|log|ln|exp|sqrt|pi")


def _read_decimal_commas(pred: str, ref: str) -> tuple[str, str]:
    """2,74 against 2.74 or 137/50: a comma between digits is a decimal comma when the other side is one
    plain number (a list "2, 74" has a space; 1,000 was already read as one thousand)."""
    if _DECIMAL_COMMA.fullmatch(pred) and plain_number(ref) is not None:
        return pred.replace(",", "."), ref
    if _DECIMAL_COMMA.fullmatch(ref) and plain_number(pred) is not None:
        return pred, ref.replace(",", ".")
    return pred, ref


def _numbers_agree(pred: Answer, pred_value: Fraction, ref: Answer, ref_value: Fraction, rel_tol: float = 0.0) -> bool:
    """Percent policy, stated precision and the benchmark's tolerance on two exact numbers (see docs/reward.md)."""
    if pred.percent == ref.percent:
        pred_values, ref_values = [pred_value], [ref_value]
    else:  # the side with a % may be meant with or without it, or as its fraction of 1
        pred_values = [pred_value, pred_value / 100] if pred.percent else [pred_value]
        ref_values = [ref_value, ref_value / 100] if ref.percent else [ref_value]
    if any(p == r for p in pred_values for r in ref_values):
        return True
    if rel_tol and not _INTEGER.fullmatch(ref.text) \
            and any(abs(p - r) <= Fraction(rel_tol) * abs(r) for p in pred_values for r in ref_values):
        return True
    return precision_matches(pred.text, pred_value, ref.text, ref_value)


def fast_verdict(prediction: str, reference: str, rel_tol: float = 0.0) -> bool | None:
    """True / False when cheap exact rules decide; None when sympy must. rel_tol: the benchmark's relative
    tolerance on numbers (0: exact; see _within_tolerance)."""
    if len(prediction) > MAX_ANSWER_CHARS or len(reference) > MAX_ANSWER_CHARS:
        return prediction.strip() == reference.strip()
    pred, ref = normalize(prediction), normalize(reference)
    if not pred.text:
        return False
    pred_time, ref_time = _time_of_day(pred), _time_of_day(ref)
    if pred_time is not None and ref_time is not None:
        return pred_time == ref_time
    if pred.unit and ref.unit and pred.unit != ref.unit:
        return False  # 5 cm is not 5 m; a unit on one side only is the question's, not the answer's
    if pred.text == ref.text:
        return True
    pred_base, ref_base = _BASE_SUBSCRIPT.fullmatch(pred.text), _BASE_SUBSCRIPT.fullmatch(ref.text)
    if pred_base and ref_base:  # numbers written in a base: digits and base must both agree
        return [int(n) for n in pred_base.groups()] == [int(n) for n in ref_base.groups()]
    pred_text = pred_base[1] if pred_base else pred.text  # 52_8 matches 52
    ref_text = ref_base[1] if ref_base else ref.text
    choice = _CHOICE.fullmatch(ref_text)
    if choice:
        return _choice_of(pred_text) == (choice.group(1) or choice.group(2)).upper()
    if _is_words(ref_text) or _is_words(pred_text):  # yes is true and no is false (TheoremQA's utils.py)
        return _TRUTH_WORDS.get(pred_text.lower(), pred_text.lower()) == _TRUTH_WORDS.get(ref_text.lower(),
                                                                                          ref_text.lower())
    pred_text, ref_text = _read_decimal_commas(pred_text, ref_text)
    pred_value, ref_value = plain_number(pred_text), plain_number(ref_text)
    if pred_value is None or ref_value is None:
        return None
    return _numbers_agree(Answer(pred_text, pred.unit, pred.percent), pred_value,
                          Answer(ref_text, ref.unit, ref.percent), ref_value, rel_tol)


def _choice_of(text: str) -> str | None:
    """The one option letter an answer gives (upper case), or None: none, or more than one ("A, C",
    "(A) or (B)", "A+1": a hedge earns nothing)."""
    answer = _CHOICE_ANSWER.fullmatch(text)
    if not answer or (answer.group(5) and _OTHER_CHOICE.search(answer.group(5))):
        return None
    return next(letter for letter in answer.groups() if letter).upper()


def _time_of_day(answer: Answer) -> int | None:
    """Seconds after midnight of an answer written as a time of day (20:34, 8:34:00, 08:34 p.m.), else None;
    a time is not the ratio 20:34."""
    time = _TIME.fullmatch(answer.text + answer.unit.replace(".", "").replace(" ", ""))
    if not time:
        return None
    hours, minutes, seconds = int(time[1]), int(time[2]), int(time[3] or 0)
    if hours > (12 if time[4] else 23) or minutes > 59 or seconds > 59:
        return None
    if time[4]:
        hours = hours % 12 + (12 if time[4].lower() == "p" else 0)
    return (hours * 60 + minutes) * 60 + seconds


def _is_words(text: str) -> bool:
    """A word answer (\\text{Thursday}, east, Evelyn), as opposed to a formula in single-letter names."""
    return bool(_WORDS.fullmatch(text) and re.search(r"[A-Za-z]{3,}", text) and not _FUNCTION_NAME.match(text))



def _sets_equal(a: sympy.Set, b: sympy.Set) -> bool:
    """Intervals, unions of them and finite sets piece by piece (fast, and exact on symbolic endpoints);
    anything else by the two set differences."""
    if a == b:
        return True
    if isinstance(a, sympy.Interval) and isinstance(b, sympy.Interval):
        return (a.left_open, a.right_open) == (b.left_open, b.right_open) \
            and _expr_equal(a.start, b.start) and _expr_equal(a.end, b.end)
    if isinstance(a, sympy.FiniteSet) and isinstance(b, sympy.FiniteSet):
        return answers_equal(list(a), list(b))
    if isinstance(a, sympy.Union) and isinstance(b, sympy.Union) and len(a.args) == len(b.args) \
            and all(isinstance(piece, sympy.Interval) for piece in a.args + b.args):
        return all(map(_sets_equal, a.args, b.args))  # sympy orders numeric pieces
    numeric_sets = {sympy.Interval, sympy.FiniteSet, sympy.Union}
    if {type(a), type(b)} <= numeric_sets and not (a.free_symbols or b.free_symbols):
        return False  # different kinds of numeric sets that sympy did not make identical
    return sympy.Complement(a, b).is_empty is True and sympy.Complement(b, a).is_empty is True


def _numerically_nonzero(expr: sympy.Expr) -> bool:
    """Whether expr is certainly not identically zero: its value at a generic point, to 30 digits."""
    symbols = sorted(expr.free_symbols, key=str)
    if not symbols:  # a number: evalf certifies the digits it returns, however small (2^{2^{-1000}} - 1)
        value = sympy.N(expr, 30, maxn=2000)
        if isinstance(value, sympy.Float):
            return value != 0 and value._prec > 1  # 0.e-2000 (no digit known) is what a true zero gives
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
    if a.has(sympy.zoo, sympy.nan) or b.has(sympy.zoo, sympy.nan):
        return False  # 12:00 read as 12/0 is no number, and not 1:00 either
    if a == b:
        return True
    if a.is_Rational and b.is_Rational:
        return False
    difference = a - b
    if difference == 0:
        return True
    if _numerically_nonzero(difference):
        return False
    if sympy.expand(difference) == 0 or sympy.expand(sympy.expand_log(difference, force=True)) == 0 \
            or sympy.simplify(difference) == 0:  # force: names in answers are positive lengths and counts
        return True
    if difference.free_symbols and not difference.has(sympy.Abs) \
            and sympy.simplify(sympy.posify(difference)[0]) == 0:
        return True  # the same assumption for powers: (a/b)^{1/2} = a^{1/2} / b^{1/2}; but |x| is not x
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
            return answers_equal(other, value)
    return False


def _relations_equal(a, b) -> bool:
    """Inequalities in several variables: the same strictness and the same side of zero."""
    def canonical(relation):
        if isinstance(relation, (sympy.StrictGreaterThan, sympy.GreaterThan)):
            return relation.rhs - relation.lhs, isinstance(relation, sympy.StrictGreaterThan)
        return relation.lhs - relation.rhs, isinstance(relation, sympy.StrictLessThan)
    (left, left_strict), (right, right_strict) = canonical(a), canonical(b)
    return left_strict == right_strict and _expr_equal(left, right)


def _as_vector(value):
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, sympy.Interval) and not (value.left_open or value.right_open):
        return [value.start, value.end]  # [0.5, 1] against a column vector: its two entries
    if isinstance(value, sympy.MatrixBase) and 1 in value.shape:
        return list(value)
    return None


def _lists_equal(a: list | tuple, b: list | tuple) -> bool:
    """Tuples in order; lists (solutions, set elements) in any order."""
    if len(a) != len(b):
        return False
    if isinstance(a, tuple) or isinstance(b, tuple):
        return all(map(answers_equal, a, b))
    unmatched = list(b)
    for item in a:
        match = next((index for index, other in enumerate(unmatched) if answers_equal(item, other)), None)
        if match is None:
            return False
        del unmatched[match]
    return True




def answers_equal(a, b) -> bool:
    """Equivalence of two parsed answers (see parse_answer for the kinds)."""
    a = a[0] if isinstance(a, list) and len(a) == 1 else a
    b = b[0] if isinstance(b, list) and len(b) == 1 else b
    if isinstance(a, list) and isinstance(b, sympy.Expr):  # several values for one: each must be it, or
        return all(answers_equal(item, b) for item in a)  # it is a hedge (15\frac{39}{40} or \frac{639}{40}: one)
    if isinstance(a, INEQUALITIES) and isinstance(b, INEQUALITIES) \
            and len(a.free_symbols | b.free_symbols) > 1:
        return _relations_equal(a, b)
    if isinstance(a, sympy.MatrixBase) or isinstance(b, sympy.MatrixBase):
        if isinstance(a, sympy.MatrixBase) and isinstance(b, sympy.MatrixBase) and a.shape == b.shape:
            return all(map(_expr_equal, a, b))
        a_vector, b_vector = _as_vector(a), _as_vector(b)
        return None not in (a_vector, b_vector) and _lists_equal(tuple(a_vector), tuple(b_vector))
    if is_set_like(a) or is_set_like(b):
        return _sets_equal(as_set(a), as_set(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return _lists_equal(a, b)
    if isinstance(a, sympy.Equality) or isinstance(b, sympy.Equality):
        return _equations_equal(a, b)
    return _expr_equal(a, b)


def _numbers_at_precision(pred: str, pred_value, ref: str, ref_value) -> bool:
    """precision_matches for parsed values: real numbers only."""
    def as_number(value):
        if isinstance(value, sympy.Rational):
            return Fraction(int(value.p), int(value.q))
        return value if isinstance(value, sympy.Expr) and value.is_number and value.is_real else None
    pred_number, ref_number = as_number(pred_value), as_number(ref_value)
    return pred_number is not None and ref_number is not None \
        and precision_matches(pred, pred_number, ref, ref_number)


_NAME_SUBSCRIPT = r"(?:_(?:\{[\\A-Za-z0-9]+\}|\\[a-zA-Z]+|[A-Za-z0-9]+))?'*"  # v_{\max}, k_B, \omega_0, v'
_NAME_LIKE = re.compile(rf"(?:[A-Za-z]{_NAME_SUBSCRIPT}|\\[a-zA-Z]+{_NAME_SUBSCRIPT}|[(),:;|]"
                        r"|\\frac\{[A-Za-z]+\}\{[A-Za-z]+\})+")


_FUNCTION_VALUE = re.compile(r"y|[a-zA-Z]\([a-z]\)")  # y = 2x + 3 and f(x) = 2x + 3 define one function


def _defined_value(text: str) -> tuple[str, str] | None:
    """(name, value) of "name = value" where the name is a variable, a tuple of them, f(x), |AB| or a
    ratio of names (x = 5, (p,q) = (3,2), AB:CD = 1:2); a chain x = 2+3 = 5 (or 1 + 4 = 2 + 3 = 5) gives
    its last side."""
    sides = ["".join(part) for part in split_top(tokenize(text), {"="})]
    if len(sides) < 2 or not all(sides) or not (len(sides) > 2 or _NAME_LIKE.fullmatch(sides[0])):
        return None
    return sides[0], sides[-1]


def _defined_values(text: str) -> tuple[str, str] | None:
    """_defined_value for one definition or a list of them: "AB=4, CD=5" -> ("AB,CD", "4,5"); groups of
    them, one solution each, are a list of tuples: "p=5,q=2; p=7,q=2" -> ("(p,q)", "(5,2),(7,2)")."""
    groups = ["".join(group) for group in split_top(tokenize(text), {";"})]
    solutions = [_definition_list(group, {","}) for group in groups] if len(groups) > 1 else [None]
    if all(solutions) and len({names for names, _ in solutions}) == 1:
        return f"({solutions[0][0]})", ",".join(f"({values})" for _, values in solutions)
    return _definition_list(text, {",", ";"})


def _definition_list(text: str, separators: set[str]) -> tuple[str, str] | None:
    items = ["".join(item) for item in split_top(tokenize(text), separators)]
    definitions = [_defined_value(item) for item in items]
    if len(items) == 1 or not all(definitions):
        return _defined_value(text)
    return ",".join(name for name, _ in definitions), ",".join(value for _, value in definitions)


def _compare_defined_values(pred: Answer, ref: Answer, rel_tol: float = 0.0) -> bool:
    """x = 5 against 5: the value is the answer; two definitions of the same name compare values."""
    pred_defined, ref_defined = _defined_values(pred.text), _defined_values(ref.text)
    if pred_defined and ref_defined:
        same_name = pred_defined[0] == ref_defined[0] or (_FUNCTION_VALUE.fullmatch(pred_defined[0])
                                                          and _FUNCTION_VALUE.fullmatch(ref_defined[0]))
        if not same_name or (pred_defined[1], ref_defined[1]) == (pred.text, ref.text):
            return False
        pred = Answer(pred_defined[1], pred.unit, pred.percent)
        ref = Answer(ref_defined[1], ref.unit, ref.percent)
    elif pred_defined and "=" not in ref.text:
        pred = Answer(pred_defined[1], pred.unit, pred.percent)
    elif ref_defined and "=" not in pred.text:
        ref = Answer(ref_defined[1], ref.unit, ref.percent)
    else:
        return False
    return _compare(pred, ref, rel_tol)


def _compare(pred: Answer, ref: Answer, rel_tol: float = 0.0) -> bool:
    """Two normalised answers by sympy: values, then the percent and precision policies, then the benchmark's
    tolerance (rel_tol > 0)."""
    pred_value, ref_value = parse_answer(pred.text), parse_answer(ref.text)
    if answers_equal(pred_value, ref_value):
        return True
    if pred.percent != ref.percent:  # the side with a % may also be meant as its fraction of 1
        if pred.percent and isinstance(pred_value, sympy.Expr) and answers_equal(pred_value / 100, ref_value):
            return True
        if ref.percent and isinstance(ref_value, sympy.Expr) and answers_equal(pred_value, ref_value / 100):
            return True
    if rel_tol and _within_tolerance(pred_value, ref_value, ref.text, rel_tol):
        return True
    return _numbers_at_precision(pred.text, pred_value, ref.text, ref_value)


_INTEGER = re.compile(r"[+-]?\d+")


def _compare_symbol_as_name(pred: Answer, ref: Answer) -> bool:
    """A unit symbol on one side only may be a name on the other: "0.6400 N" against "0.64N" (OlympiadBench's
    eval/scoring_examples.json: equal)."""
    if is_unit_symbol(pred.unit) == is_unit_symbol(ref.unit) or not (pred.unit or ref.unit) \
            or (pred.unit and ref.unit):
        return False
    pred = Answer(f"{pred.text}{pred.unit}", "", pred.percent) if pred.unit else pred
    ref = Answer(f"{ref.text}{ref.unit}", "", ref.percent) if ref.unit else ref
    return bool(re.search(r"[A-Za-z]", pred.text + ref.text)) and _compare(pred, ref)


def _real_numbers(value) -> list | None:
    """The real numbers an answer lists (itself, a tuple's or a list's items, a closed interval's two ends), or
    None when it is anything else."""
    if isinstance(value, sympy.Interval) and not (value.left_open or value.right_open):
        value = [value.start, value.end]
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(item, sympy.Expr) and item.is_number and item.is_real for item in items):
        return None
    return items


def _within_tolerance(pred_value, ref_value, ref_text: str, rel_tol: float) -> bool:
    """The benchmark-level tolerance (docs/reward.md): each number within rel_tol of the reference's,
    |p - r| <= rel_tol |r|, as TheoremQA's grader allows (number_utils.py within_eps); a list item by item in
    sorted order (its compare_two_list), a tuple in its order. A reference number written as an integer stays
    exact: a count is not rounded."""
    pred_numbers, ref_numbers = _real_numbers(pred_value), _real_numbers(ref_value)
    if not pred_numbers or not ref_numbers or len(pred_numbers) != len(ref_numbers):
        return False
    texts = split_top(tokenize(ref_text[1:-1] if ref_text[:1] in "([" and len(ref_numbers) > 1 else ref_text), {","})
    exact = ["".join(text) for text in texts] if len(texts) == len(ref_numbers) else [""] * len(ref_numbers)
    pairs = list(zip(pred_numbers, ref_numbers, exact))
    if isinstance(ref_value, list) and isinstance(pred_value, list):  # unordered: compare in sorted order
        order = [sorted(numbers, key=lambda number: float(sympy.N(number))) for numbers in (pred_numbers, ref_numbers)]
        pairs = [(p, r, "") for p, r in zip(*order)]
    for pred_number, ref_number, ref_item in pairs:
        if _INTEGER.fullmatch(ref_item) or (ref_item == "" and ref_number.is_Integer and "." not in ref_text):
            if sympy.simplify(pred_number - ref_number) != 0:
                return False
        elif abs(float(sympy.N(pred_number - ref_number, 30))) > rel_tol * abs(float(sympy.N(ref_number, 30))):
            return False
    return True


def equivalent(prediction: str, reference: str, rel_tol: float = 0.0) -> bool:
    """Whether two final answers are the same; never raises, but unbounded in time: callers run it in a
    worker (see reward.RewardPool). rel_tol: a benchmark's relative tolerance on numbers (0, the default and
    the training reward: exact; docs/reward.md)."""
    try:
        verdict = fast_verdict(prediction, reference, rel_tol)
        if verdict is not None:
            return verdict
        pred, ref = normalize(prediction), normalize(reference)
        try:
            if _compare(pred, ref, rel_tol):
                return True
        except Reject:
            pass  # "(p,q) = (3,2)" does not parse as a whole; its value may
        return _compare_defined_values(pred, ref, rel_tol) or _compare_symbol_as_name(pred, ref)
    except Exception:  # sympy raises many kinds on odd input; any of them means "not shown equal"
        return False
