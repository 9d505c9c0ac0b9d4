"""Reading LaTeX: the bracket scanner (boxes, groups) and the LaTeX / plain-text -> sympy parser, a small
recursive descent of our own (no eval, no ANTLR). Pure functions, no processes and no I/O; grader.py decides
equivalence on what parse_answer returns, extract.py finds boxes with box_spans.

Reading is bounded in size, not in time (the limits below refuse what sympy would spend forever on; reward.py
runs the whole check in a time-bounded worker).

>>> parse_answer("2\\\\frac{1}{2}"), parse_answer("(1, 2]")
(5/2, Interval.Lopen(1, 2))
"""

import re
from fractions import Fraction
from itertools import accumulate

import sympy

MAX_LITERAL_DIGITS = 400
MAX_SCI_EXPONENT = 400  # 3.2e5 yes, 1e999999999 no
MAX_POWER_BITS = 100_000  # refuse exact integers beyond ~30,000 digits (9^{9^{9^9}} would never finish)
MAX_EXPONENT = 100_000  # for any base but a bare symbol: x^{10^{100}} is fine, (2x)^{10^{100}} is not
MAX_FACTORIAL = 10_000
MAX_NESTING = 60  # deeper input is garbage; the limit keeps the parser far from Python's recursion limit

# ----------------------------------------------------------------------------------------------------
# Brackets: the one scanner (boxes, \text{} blocks and the parser's top-level splits all use it)

_BRACE_SPLIT = re.compile(r"(\\(?:boxed|fbox)(?![a-zA-Z])|\\[{}\\]|[{}])")  # the group keeps the tokens
_SPACES = re.compile(r"[ \t]*")
_UNBRACED_BOX = re.compile(r"[^$\n]{0,200}")


def bracket_pairs(tokens: list[str], openers: set[str], closers: set[str]) -> dict[int, int]:
    """Index of each opening token -> index of the token that closes it, in one pass. Any closer closes the
    innermost open bracket (so the half-open interval (3,4] is one pair); unclosed openers are left out.

    >>> bracket_pairs(list("(a[b]c)("), {"(", "["}, {")", "]"})
    {2: 4, 0: 6}
    """
    pairs, open_indices = {}, []
    for index, token in enumerate(tokens):
        if token in openers:
            open_indices.append(index)
        elif token in closers and open_indices:
            pairs[open_indices.pop()] = index
    return pairs


def _brace_tokens(text: str, start: int) -> tuple[list[str], list[int]]:
    """The brace-level tokens of text[start:] and where each starts (split + accumulate run in C: a
    megabyte of braces takes well under a second)."""
    parts = _BRACE_SPLIT.split(text[start:] if start else text)
    offsets = list(accumulate(map(len, parts), initial=start))  # offsets[k]: where parts[k] starts
    return parts[1::2], offsets[1::2]


def box_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every complete \\boxed{...} / \\fbox{...} (and "\\boxed x"), outermost only,
    in order; linear time.

    >>> box_spans("a \\\\boxed{x^{2}} b \\\\fbox{3} \\\\boxed{")
    [(2, 15, 'x^{2}'), (18, 26, '3')]
    """
    first_box = min((i for i in (text.find("\\boxed"), text.find("\\fbox")) if i >= 0), default=-1)
    if first_box < 0:
        return []
    tokens, starts = _brace_tokens(text, first_box)
    pairs = bracket_pairs(tokens, {"{"}, {"}"})
    spans = []
    boxes = [i for i, token in enumerate(tokens) if token in ("\\boxed", "\\fbox")]
    for index in boxes:
        start, brace = starts[index], index + 1
        if spans and start < spans[-1][1]:
            continue  # a box inside a box is not an answer of its own
        command_end = start + len(tokens[index])
        if brace == len(tokens) or starts[brace] != command_end:  # "\boxed {x}" or "\boxed x"
            command_end = _SPACES.match(text, command_end).end()
        if brace < len(tokens) and starts[brace] == command_end and tokens[brace] == "{":
            close = pairs.get(brace)
            if close is None and index == boxes[-1]:  # "\boxed{5\}": a stray backslash on the closing brace
                close = _escaped_close(tokens, brace)
            if close is not None:
                spans.append((start, starts[close] + len(tokens[close]), text[command_end + 1:starts[close]]))
        elif command_end > start + len(tokens[index]):  # "\boxed 5": models mean the rest of the formula
            content = _UNBRACED_BOX.match(text, command_end).group()
            if content.strip():
                spans.append((start, command_end + len(content), content.strip()))
    return spans


def _escaped_close(tokens: list[str], open_index: int) -> int | None:
    """The \\} that closes the unclosed { at open_index when nothing else does, or None: the first closer at
    its depth, counting \\{ \\} as brackets too ("\\boxed{\\{1, 2\\}" stays unclosed). Looks 200 tokens ahead."""
    depth = 0
    for index in range(open_index + 1, min(len(tokens), open_index + 200)):
        if tokens[index] in ("{", "\\{"):
            depth += 1
        elif tokens[index] in ("}", "\\}"):
            if depth == 0:
                return index if tokens[index] == "\\}" else None
            depth -= 1
    return None


def matching_brace(text: str, open_index: int) -> int:
    """Index of the } that closes the { at open_index, or -1."""
    tokens, starts = _brace_tokens(text, open_index)
    pairs = bracket_pairs(tokens, {"{"}, {"}"})
    return starts[pairs[0]] if 0 in pairs else -1



# ----------------------------------------------------------------------------------------------------
# LaTeX -> sympy (runs only in worker processes)

class Reject(Exception):
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
CONSTANTS = {"\\pi": sympy.pi, "\\infty": sympy.oo, "\\emptyset": sympy.S.EmptySet,
              "\\varnothing": sympy.S.EmptySet}
# commands that are names: Greek letters, and physics' \\hbar (h / 2 pi) and \\ell (a length)
_NAME_COMMANDS = {"\\" + name for name in (
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi rho sigma "
    "tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Sigma Phi Psi Omega hbar ell").split()}
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
UNKNOWN_LOG_BASE = sympy.Symbol("log_base", positive=True)
_MULTIPLY = {"*", "\\cdot", "\\times", "\\ast"}
_DIVIDE = {"/", "\\div", ":"}  # a ratio 7:32 is the number 7/32
_SIGNS = {"+", "-", "\\pm", "\\mp"}
_MATRICES = {"pmatrix", "bmatrix", "Bmatrix", "matrix", "smallmatrix"}
_BLACKBOARD = {"R": sympy.S.Reals, "Z": sympy.S.Integers, "N": sympy.S.Naturals0, "Q": sympy.S.Rationals,
               "C": sympy.S.Complexes}


def tokenize(text: str) -> list[str]:
    """LaTeX tokens; a bare function name (sin, log) becomes its command.

    >>> tokenize("2\\\\frac{x}{3}+sin y")
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
        raise Reject("power of a non-number")
    if exponent.is_Rational and base not in (0, 1, -1):
        if base.is_Rational and abs(exponent.p) * _bits(base) > MAX_POWER_BITS:
            raise Reject("power too large")
        if not base.is_Symbol and abs(exponent.p) > MAX_EXPONENT:  # (y/9)^n computes 9^n
            raise Reject("power too large")
    return sympy.Pow(base, exponent)


def _factorial(value):
    if value.is_number and (not value.is_Integer or value > MAX_FACTORIAL):
        raise Reject("factorial too large")
    return sympy.factorial(value)


def _repeating_decimal(literal: str, repeating: str) -> sympy.Rational:
    """0.1\\overline{6} -> 1/6."""
    whole, fixed = literal.split(".")
    without = int(whole + fixed or "0")
    denominator = 10 ** len(fixed) * (10 ** len(repeating) - 1)
    return sympy.Rational(int(whole + fixed + repeating) - without, denominator)


class _Parser:
    """Recursive descent from LaTeX tokens to sympy objects; `pm_sign` picks one reading of \\pm."""

    def __init__(self, tokens: list[str], pm_sign: int = 1):
        self.tokens = list(tokens)
        self.position = 0
        self.depth = 0
        self.abs_depth = 0
        self.trig_depth = 0  # inside a trigonometric function's argument, where 30° means pi/6
        self.pm_sign = pm_sign

    def peek(self) -> str:
        return self.tokens[self.position] if self.position < len(self.tokens) else ""

    def upcoming(self, *pattern: str) -> list[str] | None:
        """The next tokens if they fit the pattern ("#" stands for a run of digits), else None."""
        tokens = self.tokens[self.position:self.position + len(pattern)]
        fits = len(tokens) == len(pattern) and all(token.isdigit() if expected == "#" else token == expected
                                                   for token, expected in zip(tokens, pattern))
        return tokens if fits else None

    def take(self) -> str:
        token = self.peek()
        if not token:
            raise Reject("unexpected end")
        self.position += 1
        return token

    def expect(self, *options: str) -> str:
        token = self.take()
        if token not in options:
            raise Reject(f"expected {options}, got {token!r}")
        return token

    def parse(self):
        value = self.relation()
        if self.peek():
            raise Reject(f"unexpected {self.peek()!r}")
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
        while self.peek() in ("!", "%", "°"):
            token = self.take()
            if token == "!":
                value = _factorial(value)
            else:
                value = value / 100 if token == "%" else value * (sympy.pi / 180 if self.trig_depth else 1)
        return value

    def nested(self, parse, *args):
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise Reject("nested too deeply")
        try:
            return parse(*args)
        finally:
            self.depth -= 1

    def starts_factor(self, token: str) -> bool:
        if _is_number(token) or (len(token) == 1 and token.isalpha()) or token in ("(", "{"):
            return True
        if token == "|":
            return self.abs_depth == 0
        return token in CONSTANTS or token in _NAME_COMMANDS or token in _FUNCTIONS or token.startswith("\\begin") \
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
            raise Reject("number too long")
        mantissa, _, exponent = literal.lower().partition("e")
        if exponent and abs(int(exponent)) > MAX_SCI_EXPONENT:
            raise Reject("exponent too large")
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
        if single or self.peek() not in ("_", "'"):
            constant = {"e": sympy.E, "i": sympy.I}.get(letter)
            if constant is not None:
                return constant
        return self.name(letter, single)

    def name(self, name: str, single: bool = False) -> sympy.Symbol:
        """A name with what completes it: a subscript, read as part of the name and not computed (v_{\\max},
        k_B = k_{B}, \\omega_0, T_{s}), and primes (v')."""
        if not single and self.peek() == "_":
            self.take()
            name += "_" + self.subscript()
        while not single and self.peek() == "'":
            name += self.take()
        return sympy.Symbol(name)

    def subscript(self) -> str:
        """A subscript's text: one token or a {group}, its commands' backslashes dropped (v_{\\max} = v_max)."""
        if self.peek() != "{":
            return self.take().lstrip("\\")
        start, depth = self.position, 0
        while True:
            token = self.take()
            depth += (token == "{") - (token == "}")
            if depth == 0:
                return "".join(self.tokens[start + 1:self.position - 1]).replace("\\", "")

    def command(self, name: str):
        if name in CONSTANTS:
            return CONSTANTS[name]
        if name in _NAME_COMMANDS:
            return self.name(name[1:])
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
                raise Reject("binomial too large")
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
                raise Reject(f"unknown set {letter}")
            return _BLACKBOARD[letter]
        if name.startswith("\\begin{") and name[7:-1] in _MATRICES:
            return self.matrix(name[7:-1])
        raise Reject(f"unsupported {name}")

    def function(self, name: str):
        base = None
        if name == "\\log" and self.peek() == "_":
            self.take()
            base = self.script()
        exponent = None
        if self.peek() == "^":
            self.take()
            exponent = self.script()
        self.trig_depth += name in _INVERSES  # the six trigonometric functions
        try:
            arguments = self.arguments()
        finally:
            self.trig_depth -= name in _INVERSES
        if name in ("\\gcd", "\\lcm", "\\max", "\\min"):
            value = _FUNCTIONS[name](*arguments)
        elif len(arguments) != 1:
            raise Reject(f"{name} takes one argument")
        elif base is not None:
            value = sympy.log(arguments[0], base)
        elif name == "\\log":  # no base written: equal only where equal in every base (see docs/reward.md)
            value = sympy.log(arguments[0]) / sympy.log(UNKNOWN_LOG_BASE)
        elif exponent == -1 and name in _INVERSES:
            return _INVERSES[name](arguments[0])
        else:
            value = _FUNCTIONS[name](arguments[0])
        return value if exponent is None else _power(value, exponent)

    def arguments(self) -> list:
        if self.peek() == "(":
            self.take()
            arguments = [self.nested(self.relation)]
            while self.peek() == ",":
                self.take()
                arguments.append(self.nested(self.relation))
            self.expect(")")
            return arguments
        argument = self.power()  # \sin 2x is sin(2x): the argument stops at an operator or the next function
        while self.starts_factor(self.peek()) and self.peek() not in _FUNCTIONS:
            argument = argument * self.power()
        return [argument]

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
            raise Reject("ragged matrix")
        if not all(isinstance(entry, sympy.Expr) for row in rows for entry in row):
            raise Reject("matrix of non-numbers")
        return sympy.ImmutableMatrix(rows)


def _bracket_kind(token: str) -> str:
    """Brackets of every kind as "(" or ")" for the scanner: (), [], {}, \\{\\}, \\begin...\\end."""
    if token in _OPENERS or token.startswith("\\begin"):
        return "("
    if token in _CLOSERS or token.startswith("\\end"):
        return ")"
    return token


def split_top(tokens: list[str], separators: set[str]) -> list[list[str]]:
    """Split at separators outside any brackets; (3,4] counts as one bracket pair."""
    pairs = bracket_pairs([_bracket_kind(token) for token in tokens], {"("}, {")"})
    parts, current, index = [], [], 0
    while index < len(tokens):
        if tokens[index] in separators:
            parts.append(current)
            current = []
        else:
            end = pairs.get(index, index) + 1  # a bracketed group goes whole into the current part
            current.extend(tokens[index:end])
            index = end - 1
        index += 1
    parts.append(current)
    return parts


def _closes_at_end(tokens: list[str]) -> bool:
    """Whether the bracket opened by the first token is closed by the last one."""
    return bracket_pairs([_bracket_kind(token) for token in tokens], {"("}, {")"}).get(0) == len(tokens) - 1


def _flatten(items: list) -> list:
    """Splice the two readings of a \\pm item into the list around it."""
    return [value for item in items for value in (item if isinstance(item, list) else [item])]


def parse_answer(text: str):
    """A normalised answer as sympy: an Expr, a relation, a Set (intervals), a Matrix, a tuple (ordered)
    or a list (unordered: bare lists, \\{...\\} and the two values of a \\pm)."""
    tokens = tokenize(text)
    if not tokens:
        raise Reject("empty")
    pieces = split_top(tokens, {"\\cup"})
    if len(pieces) > 1:
        return sympy.Union(*(as_set(_parse_item(piece)) for piece in pieces))
    items = split_top(tokens, {",", ";"})
    if len(items) > 1:
        return _flatten([_parse_item(item) for item in items])
    return _parse_item(tokens)


def _parse_item(tokens: list[str]):
    if not tokens:
        raise Reject("empty item")
    opener, closer = tokens[0], tokens[-1]
    if opener == "\\{" and closer == "\\}" and _closes_at_end(tokens):
        inner = tokens[1:-1]
        if not inner:
            return sympy.S.EmptySet
        return _flatten([_parse_item(item) for item in split_top(inner, {",", ";"})])
    if opener in ("(", "[") and closer in (")", "]") and _closes_at_end(tokens):
        parts = split_top(tokens[1:-1], {","} if "," in tokens else {";"})  # (0;-2;6) is a triple
        if len(parts) > 1:
            values = [_parse_item(part) for part in parts]
            infinite = any(value in (sympy.oo, -sympy.oo) for value in values)
            if len(values) == 2 and (opener + closer != "()" or infinite):
                if (values[0] > values[1]) is sympy.true:
                    if opener + closer == "[]":
                        return tuple(values)  # [0.333, 0.25]: a list of two numbers (TheoremQA writes lists so)
                    raise Reject("an interval from a larger number to a smaller one")  # [15,-29) is no set
                return sympy.Interval(values[0], values[1], opener == "(", closer == ")")
            if opener + closer not in ("()", "[]"):
                raise Reject("half-open bracket around a tuple")
            return tuple(values)
        if opener + closer == "()":  # ((1, 2)) or (\{1, 2\}): the answer inside
            return _parse_item(tokens[1:-1])
    value = _Parser(tokens).parse()
    if "\\pm" in tokens or "\\mp" in tokens:  # 1 \pm \sqrt{2}: both readings, as an unordered list
        return [value, _Parser(tokens, pm_sign=-1).parse()]
    return value



INEQUALITIES = (sympy.LessThan, sympy.StrictLessThan, sympy.GreaterThan, sympy.StrictGreaterThan)


def is_set_like(value) -> bool:
    return isinstance(value, (sympy.Set, sympy.And)) or (
        isinstance(value, sympy.core.relational.Relational) and not isinstance(value, sympy.Equality))


def as_set(value) -> sympy.Set:
    if isinstance(value, sympy.Set):
        return value
    if isinstance(value, tuple) and len(value) == 2 and (value[0] < value[1]) is sympy.true:
        return sympy.Interval.open(*value)
    if isinstance(value, list):
        return sympy.Union(*map(as_set, value))
    if is_set_like(value):
        symbols = value.free_symbols
        if len(symbols) != 1:
            return _range_between(value)
        variable = symbols.pop()
        parts = value.args if isinstance(value, sympy.And) else [value]
        return sympy.Intersection(*(sympy.solveset(part, variable, sympy.S.Reals) for part in parts))
    raise Reject("not a set")


def _range_between(chain) -> sympy.Interval:
    """The values a chain between two numbers allows, whatever it bounds: 0 < f(x) < 1 is (0, 1)."""
    if not (isinstance(chain, sympy.And) and len(chain.args) == 2
            and all(isinstance(part, INEQUALITIES) for part in chain.args)):
        raise Reject("not an inequality in one variable")
    bounds = []  # (lower?, number, strict?) of each part, read as "middle > number" or "middle < number"
    for part in chain.args:
        number, middle = (part.lhs, part.rhs) if part.lhs.is_number else (part.rhs, part.lhs)
        if not number.is_number or middle.is_number:
            raise Reject("not a chain between two numbers")
        below = isinstance(part, (sympy.LessThan, sympy.StrictLessThan)) == (number is part.lhs)
        bounds.append((below, number, isinstance(part, (sympy.StrictLessThan, sympy.StrictGreaterThan))))
    (low_below, low, low_strict), (high_below, high, high_strict) = sorted(bounds, key=lambda b: not b[0])
    if not low_below or high_below:
        raise Reject("not a chain between two numbers")
    return sympy.Interval(low, high, low_strict, high_strict)
