"""Numbers written plainly, read exactly: a number's value as a Fraction (plain_number: 12, -.5, 3.2e5,
3\\times10^{5}, -\\frac{1}{2}), the precision a decimal states (its places and significant digits), and the
precision rule of docs/reward.md that decides a rounded decimal against an exact value (precision_matches).
Pure functions, no processes and no I/O; the grader's fast verdicts, units.py and the prose readers stand on them.

>>> plain_number("-.5"), stated_places("2.31e-3"), decimal_matches("0.3333", Fraction(1, 3))
(Fraction(-1, 2), 5, True)
"""

import re
from fractions import Fraction

import sympy

PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?")
# a number written as a decimal, maybe in scientific notation: 0.33, .5, 2.31e-3, 2.31\times10^{-3}
_DECIMAL = re.compile(r"[+-]?(\d*)\.(\d+)(?:[eE]([+-]?\d{1,3})|\\times10\^(?:\{([+-]?\d{1,3})\}|(\d)))?")
_PLAIN_FRACTION = re.compile(r"([+-]?)(?:\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}"
                             r"|\(?([+-]?\d+)\)?/\(?([+-]?\d+)\)?)")
_SCIENTIFIC = re.compile(r"([+-]?\d+(?:\.\d+)?)\\times10\^(?:\{([+-]?\d{1,3})\}|(\d))")


def plain_number(text: str) -> Fraction | None:
    """The exact value of a number written plainly: 12, -.5, 3.2e5, 3\\times10^{5}, -\\frac{1}{2}, 1/-2."""
    if PLAIN_NUMBER.fullmatch(text):
        return Fraction(text)
    scientific = _SCIENTIFIC.fullmatch(text)
    if scientific:
        return Fraction(scientific.group(1)) * Fraction(10) ** int(scientific.group(2) or scientific.group(3))
    fraction = _PLAIN_FRACTION.fullmatch(text)
    if fraction:
        sign, numerator, denominator = fraction.group(1), fraction.group(2) or fraction.group(4), \
            fraction.group(3) or fraction.group(5)
        if int(denominator) != 0:
            return Fraction(int(numerator), int(denominator)) * (-1 if sign == "-" else 1)
    return None


def terminates(value: Fraction) -> bool:
    """Whether value has a finite decimal expansion (its denominator has no prime but 2 and 5)."""
    denominator = value.denominator
    for prime in (2, 5):
        while denominator % prime == 0:
            denominator //= prime
    return denominator == 1


def round_half_away(value, places: int) -> Fraction:
    """value rounded to `places` decimals, halves away from zero (how references round)."""
    scaled = abs(Fraction(value)) * Fraction(10) ** places
    rounded = int(scaled + Fraction(1, 2)) / Fraction(10) ** places
    return rounded if value >= 0 else -rounded


def stated_places(number: str) -> int | None:
    """Decimal places of a number written as a decimal (0.33 -> 2, 2.31e-3 -> 5): the precision it states."""
    decimal = _DECIMAL.fullmatch(number)
    return len(decimal[2]) - int(decimal[3] or decimal[4] or decimal[5] or 0) if decimal else None


def significant_digits(number: str) -> int:
    """Significant digits of a number written as a decimal (0.0833 -> 3, 2.3148e-3 -> 5); 0 for others."""
    decimal = _DECIMAL.fullmatch(number)
    return len((decimal[1] + decimal[2]).lstrip("0")) if decimal else 0


# A decimal prediction of an exact reference (1/3, \sqrt{2}, 8/3) is that value written out when it carries
# this many places, and as many significant digits, correctly rounded (0.3333, 1.4142, 2.6667; not 0.33, 13.29
# or 0.0833), or cut (0.666666).
MIN_PLACES_ROUNDED, MIN_PLACES_CUT = 4, 6


def decimal_matches(decimal: str, exact_value, truncation_too: bool = False) -> bool:
    """Whether `decimal` is exact_value (a Fraction or a sympy number) rounded, halves away from zero, to
    the decimal's places (or, with truncation_too, cut there)."""
    places = stated_places(decimal)
    if places is None:
        return False
    if not isinstance(exact_value, Fraction):
        exact_value = Fraction(str(sympy.N(exact_value, places + 30)))
    written = plain_number(decimal)
    scale = Fraction(10) ** places
    cut = int(abs(exact_value) * scale) / scale * (1 if exact_value >= 0 else -1)
    return round_half_away(exact_value, places) == written or (truncation_too and cut == written)


def precision_matches(pred: str, pred_value, ref: str, ref_value) -> bool:
    """The two precision rules: a reference written as a decimal states its precision (an exact
    prediction such as 1/3, \\sqrt{2}, \\pi matches when it rounds to the reference); a decimal prediction
    with enough places (MIN_PLACES_ROUNDED, MIN_PLACES_CUT) matches the exact reference it rounds or cuts."""
    def exact(text, value):
        terminating = isinstance(value, Fraction) and terminates(value)
        return stated_places(text) is None and not terminating
    if stated_places(ref) is not None and exact(pred, pred_value):
        return decimal_matches(ref, pred_value)
    places = stated_places(pred)
    if places is None or min(places, significant_digits(pred)) < MIN_PLACES_ROUNDED \
            or not exact(ref, ref_value):
        return False
    return decimal_matches(pred, ref_value, truncation_too=places >= MIN_PLACES_CUT)
