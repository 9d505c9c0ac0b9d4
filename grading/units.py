"""Units in answers: the units the checker knows (lengths, times, masses, volumes, angles, money's cents, and
physics' SI symbols), and reading the one an answer ends with into a canonical name ("15 \\text{ cm}^2" -> cm^2,
"3 newtons" -> N, "12 apples" -> apples), so that grader.normalize() keeps the value apart from its unit and 5 cm
is not 5 m (docs/reward.md); UNIT_AFTER_NUMBER is the unit a value in prose carries with it (prose.py). Pure
functions on text, no processes and no I/O.

>>> split_unit("15 square centimeters"), split_unit("12 N"), split_unit("n - m")
(('15', 'cm^2'), ('12', 'N'), ('n - m', ''))
"""

import re

from grading.numerals import PLAIN_NUMBER

# Units: canonical name -> spellings (plurals are found by dropping a final "s" / "es").
_UNIT_SPELLINGS = {
    "mm": "mm millimeter millimetre", "cm": "cm centimeter centimetre", "m": "m meter metre",
    "km": "km kilometer kilometre", "in": "in inch", "ft": "ft foot feet", "yd": "yd yard", "mi": "mi mile",
    "mph": "mph", "km/h": "km/h kph kmh", "m/s": "m/s", "s": "s sec second", "min": "min minute",
    "h": "h hr hour", "day": "day", "week": "wk week", "month": "month", "year": "yr year",
    "mg": "mg milligram",
    "g": "g gram", "kg": "kg kilogram", "lb": "lb pound", "oz": "oz ounce", "l": "l liter litre",
    "ml": "ml milliliter millilitre", "gal": "gal gallon", "cent": "cent", "degree": "degree deg",
    "radian": "rad radian", "%": "%",
}
_UNIT_NAMES = {spelling: name for name, spellings in _UNIT_SPELLINGS.items()
               for spelling in spellings.split()}
# Physics' unit symbols (the SI Brochure, 9th ed., 5.2: a symbol's case is part of it, mW is not MW); the names
# after each symbol are spelled in lower case
_SYMBOL_SPELLINGS = {
    "N": "newton", "kN": "kilonewton", "J": "joule", "kJ": "kilojoule", "MJ": "megajoule", "W": "watt",
    "kW": "kilowatt", "MW": "megawatt", "V": "volt", "kV": "kilovolt", "mV": "millivolt", "A": "ampere amp",
    "mA": "milliampere", "C": "coulomb", "T": "tesla", "Pa": "pascal", "kPa": "kilopascal", "MPa": "megapascal",
    "atm": "atmosphere", "Hz": "hertz", "kHz": "kilohertz", "MHz": "megahertz", "GHz": "gigahertz",
    "eV": "electronvolt", "keV": "", "MeV": "", "GeV": "", "K": "kelvin", "degC": "celsius", "mol": "mole",
    "Ω": "\\Omega ohm", "F": "farad", "H": "henry", "M": "molar", "nm": "nanometer nanometre",
    "μm": "\\mum micrometer micrometre micron", "ms": "millisecond", "μs": "\\mus microsecond", "ns": "nanosecond",
}
_SYMBOL_NAMES = {symbol: symbol for symbol in _SYMBOL_SPELLINGS} | {
    spelling: symbol for symbol, spellings in _SYMBOL_SPELLINGS.items() for spelling in spellings.split()
    if spelling.startswith("\\")}
_UNIT_NAMES |= {spelling: symbol for symbol, spellings in _SYMBOL_SPELLINGS.items()
                for spelling in spellings.split() if not spelling.startswith("\\")}
_UNIT_FACTOR = re.compile(r"([^/^]+)(\^\{?(-?\d)\}?)?")
_UNIT_TEXT = re.compile(r"[A-Za-zμΩ\\][A-Za-zμΩ .\-/^{}0-9\\]*")
_UNIT_POWER = re.compile(r"\s*(?:\^\s*(?:\{\s*\d\s*\}|\d)|[²³])")
# Degree marks (see read_degrees)
_DEGREE = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![a-zA-Z])|\\circ(?![a-zA-Z])|°"
                     r"|\^?\\degree(?![a-zA-Z])")
_TRIGONOMETRIC = re.compile(r"(?<![a-zA-Z])(?:sin|cos|tan|cot|sec|csc)(?![a-zA-Z])")


def _unit_spelling_pattern() -> str:
    """A regex of every unit this module knows, as written after a number: words in any case and plural
    (meters, Joules), symbols as written (mm, N, eV; not "in", which is a word), a power and a "/ unit" after."""
    words = sorted({spelling for spelling in _UNIT_NAMES if len(spelling) > 2 and spelling.isalpha()}, key=len,
                   reverse=True)
    symbols = sorted({spelling for spelling in [*_UNIT_NAMES, *_SYMBOL_NAMES] if spelling not in words}
                     - {"in", "%", "l", "h", "day", "week", "month", "year", "cent"}, key=len, reverse=True)
    one = ("(?:(?i:(?:sq(?:uare)?|cubic)\\s+)?(?i:" + "|".join(f"{re.escape(word)}(?:e?s)?" for word in words)
           + ")|" + "|".join(map(re.escape, symbols)) + ")")
    return rf"{one}(?:\^\{{?-?\d\}}?|[²³])?(?:(?:\s?/\s?|\s+per\s+){one}(?:\^\{{?-?\d\}}?|[²³])?)?(?![A-Za-z])"


# a unit right after a number ("2.4 mm", "-42 m/s", "3 newtons"): what a value in prose carries with it
UNIT_AFTER_NUMBER = re.compile(r"\s?(?:" + _unit_spelling_pattern() + ")")
_GENERIC_UNITS = {"unit", "dollar", "usd"}  # say nothing about the answer: no unit
_TRAILING_UNIT = re.compile(
    r"(?<=[\d}).\s])\s*((?:(?:sq(?:uare)?|cubic)\.?\s+)?(?:units?|mm|cm|km|m|meters?|metres?"
    r"|centimet(?:er|re)s?|millimet(?:er|re)s?|kilomet(?:er|re)s?|inch(?:es)?|in|feet|foot|ft|yards?|yd"
    r"|miles?|mi|mph|km/h|m/s"
    r"|seconds?|sec|s|minutes?|mins?|hours?|hrs?|h|days?|weeks?|months?|years?|yrs?|cents?|degrees?|radians?"
    r"|rad|mg|kg|g|grams?|kilograms?|pounds?|lbs?|ounces?|oz|liters?|litres?|l|ml|gallons?|gal))\.?"
    r"((?:\s*\^\s*(?:\{\s*\d\s*\}|\d))|[²³])?\s*$", re.I)
# "12 apples", "7 people": a plain word after a plain number names what is counted (a unit of its own)
_TRAILING_NOUN = re.compile(r"(?<=\d)\s+([a-zA-Z]{3,}(?:\s+[a-zA-Z]{3,})?)()$")
_SPELLED_POWER = re.compile(r"^(?:(sq(?:uare)?)|(cubic))\.?\s+", re.I)
# a unit symbol a space after a plain number ("12 N", "1.2 eV", "300 K"), case-sensitive; only there ("0.64N" may
# be a product with a name N, and "x + 3 N" is no quantity)
_TRAILING_SYMBOL = re.compile(r"(?<=[\d}])\s+((?:[kMG]?(?:N|J|W|V|Pa|Hz|eV)|m[AV]|A|C|T|K|F|H|mol|atm|Ω"
                              r"|\\Omega|[nμ]m|\\mu\s*m)(?:/(?:m|s|K|kg|mol)(?:\^\{?-?\d\}?)?)?)()\s*$")
_QUANTITY = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
                       r"(?:\s*(?:\\times|\\cdot)\s*10\s*\^\s*(?:\{\s*[+-]?\d+\s*\}|\d))?\s*")
# a run of unit blocks that ends an answer is one unit: \mathrm{~m} / \mathrm{s}^{2} -> \text{m/s^{2}}
_UNIT_BLOCK = r"\\(?:mathrm|text|mbox|textrm)\s*\{\s*([A-Za-zμΩ\\][^{}]{0,20})\}\s*(\^\s*(?:\{\s*-?\d\s*\}|-?\d))?"
_UNIT_RUN = re.compile(rf"(?:{_UNIT_BLOCK}\s*(?:/|\\cdot|·)?\s*){{2,5}}$")
_UNIT_RUN_PART = re.compile(rf"{_UNIT_BLOCK}\s*(/|\\cdot|·)?\s*")
_CELSIUS = re.compile(r"(?:\^\s*\{?\s*\\circ\s*\}?|°)\s*(?:\\(?:mathrm|text)\s*\{\s*C\s*\}|C(?![a-zA-Z]))")


def joined_unit_blocks(text: str) -> str:
    """The unit blocks that end an answer as one: "-42 \\mathrm{m} / \\mathrm{s}" -> "-42 \\text{m/s}"; degrees
    Celsius as the unit degC ("20^{\\circ} \\mathrm{C}", "20 °C"), not as degrees of angle."""
    text = _CELSIUS.sub(r"\\text{degC}", text)
    run = _UNIT_RUN.search(text)
    if not run:
        return text
    joined = ""
    for part in _UNIT_RUN_PART.finditer(text, run.start(), run.end()):
        power = re.sub(r"[{}\s]", "", part[2] or "")
        joined += part[1].strip() + power + ("/" if part[3] == "/" else " ")
    return text[:run.start()] + f"\\text{{{joined.strip()}}}"


def _canonical_unit(words: str, power: str = "") -> str:
    """'square centimeters' -> 'cm^2', 'Meters' -> 'm', 'degrees' -> 'degree', 'N / m' -> 'N/m', 'm/s^{2}' ->
    'm/s^2'; unknown words stay as words."""
    words = re.sub(r"\s+per\s+", "/", words.strip().strip("."))  # miles per hour: mi/h
    symbol = _SYMBOL_NAMES.get(words.replace(" ", ""))
    if symbol:
        return _with_power(symbol, power)
    factors = [_UNIT_FACTOR.fullmatch(factor.strip()) for factor in words.split("/")]
    if len(factors) > 1 and all(factors):  # N/m, m/s^{2}: each factor, with its power
        powers = [factor[2] or "" for factor in factors[:-1]] + [factors[-1][2] or power]
        unit = "/".join(_canonical_unit(factor[1], power) for factor, power in zip(factors, powers))
        return "mph" if unit == "mi/h" else unit
    words = words.lower()
    spelled = _SPELLED_POWER.match(words)
    exponent = re.sub(r"\D", "", power.replace("²", "2").replace("³", "3"))
    if spelled:
        words, exponent = words[spelled.end():], "2" if spelled.group(1) else "3"
    name = _UNIT_NAMES.get(words) or _UNIT_NAMES.get(words[:-1] if words.endswith("s") else words) \
        or _UNIT_NAMES.get(words[:-2] if words.endswith("es") else words) or words.rstrip("s")
    if name in _GENERIC_UNITS:
        return ""
    return _with_power(name, exponent)


def _with_power(name: str, power: str) -> str:
    exponent = re.sub(r"[^\d-]", "", power.replace("²", "2").replace("³", "3"))
    return f"{name}^{exponent}" if exponent and exponent != "1" else name


_SHORT_UNITS = {"m", "s", "h", "l", "g", "in", "mi"}  # also names of variables: a unit only after "5 "


def _is_unit_after_value(text: str, trailing: re.Match) -> bool:
    """Whether a trailing unit word follows a value (5 cm, 12 m) rather than ends a formula (n - m, 5m)."""
    before = text[:trailing.start()]
    if not re.search(r"[\d})]\s*$", before):
        return False
    if trailing.re is _TRAILING_NOUN and not PLAIN_NUMBER.fullmatch(before.strip()):
        return False  # "2x + 3 ways"? only a bare number counts things
    return trailing.group(1).lower() not in _SHORT_UNITS or trailing.group(0)[:1].isspace()



def read_degrees(text: str, unit: str) -> tuple[str, str]:
    """A degree mark inside a trigonometric function is pi/180 (kept as ° for the parser: \\sin(90^\\circ - x)
    is \\cos x); otherwise one that ends the answer is its unit (90^\\circ), and others ((1, 30°) in polar
    form) are dropped. Returns (text, unit)."""
    if _TRIGONOMETRIC.search(text):
        return _DEGREE.sub("°", text), unit
    degree_at_end = re.search(f"(?:{_DEGREE.pattern})\\s*$", text)
    if degree_at_end and not unit and text[:degree_at_end.start()].strip():
        unit = "degree"
    return _DEGREE.sub("", text), unit


def split_unit(text: str) -> tuple[str, str]:
    """(text, unit): the unit word, counted noun or unit symbol that ends an answer after its value, taken off
    and canonical ("5 cm" -> ("5", "cm"), "12 apples" -> ("12", "apples"), "0.64 N" -> ("0.64", "N")); the
    text as it is and "" when it ends with none ("n - m", "2x + 3 ways")."""
    unit = ""
    trailing = _TRAILING_UNIT.search(text) or _TRAILING_NOUN.search(text)
    if trailing and _is_unit_after_value(text, trailing):
        unit = _canonical_unit(trailing.group(1), trailing.group(2) or "")
        text = text[:trailing.start()]
    symbol = not unit and _TRAILING_SYMBOL.search(text)
    if symbol and _QUANTITY.fullmatch(text, 0, symbol.start()):
        unit, text = _canonical_unit(symbol.group(1)), text[:symbol.start()]
    return text, unit


def text_block_unit(text: str, start: int, command: str, content: str, end: int) -> tuple[str, int] | None:
    """(unit, where it ends) for a \\text{...}-like block text[start:end] (its `command` and `content`) that is
    the unit ending an answer after a value, with a power after it ("15 \\text{ cm}^2" -> ("cm^2", 15)); None
    for other blocks (words, a name \\mathrm{x})."""
    unit_power = _UNIT_POWER.match(text, end)
    after_unit = unit_power.end() if unit_power else end
    is_unit = (not text[after_unit:].strip(" .") and text[:start].strip()
               and _UNIT_TEXT.fullmatch(content)
               and (not command.startswith("math") or len(content) > 1 or content.lower() in _UNIT_NAMES
                    or content in _SYMBOL_NAMES))
    return (_canonical_unit(content, unit_power.group() if unit_power else ""), after_unit) if is_unit else None


def is_unit_symbol(unit: str) -> bool:
    """Whether a canonical unit is a physics symbol (N, eV, K), which glued to a number may be a name instead."""
    return unit in _SYMBOL_SPELLINGS
