"""Reading the value a text in prose states (extract.py decides where in a response to read, and in which
order): the value after a final-answer marker ("the answer is $42$.", "... is 7 (or 8 if ...)": a hedge), the
numbers and math spans of a sentence, numbers written in words ("Seven boxes were shipped."), the value of a
concluding or closing sentence, a tool's output that the closing prose restates, and, for a reference of that kind,
a truth value stated in a sentence ("the series does not converge" -> False) or an option named in prose ("so
option (d)."). Pure functions on text, no processes and no I/O.

>>> concluding_value("Therefore, the probability is 2/3."), word_number("three hundred and two")
('2/3', 302)
>>> truth_verdict("This statement is not true."), closing_option("Hence I would go with option (B).")
('False', '(b)')
"""

import re

from grading.grader import normalize
from grading.numerals import plain_number
from grading.units import UNIT_AFTER_NUMBER

# a $ escaped as \$ is a dollar sign, not a delimiter: "$\$18$"
_MATH_SPAN = re.compile(r"\$\$(.{1,500}?)\$\$|(?<!\\)\$(.{1,500}?)(?<!\\)\$|\\\((.{1,500}?)\\\)"
                        r"|\\\[(.{1,500}?)\\\]", re.S)
_MATH_CLOSERS = (("$$", "$$"), ("$", "$"), ("\\)", "\\("), ("\\]", "\\["))
_HEDGE_WORD = r"(?:(?:possibly|maybe|perhaps|even|else|alternatively)\s+)?"  # "or possibly $16$"
_LIST_SEPARATOR = re.compile(r"\s*(?:,\s*(?:and|or)?|and|or)\s*" + _HEDGE_WORD + r"(?=\$|\\[(\[])")
# Another value offered right after a final answer, on its line: "\boxed{15} or possibly 16", "Answer: 7 (or 8
# if the last day counts)", "20, or 21 with the endpoints". The answer and its alternative are then one answer,
# the list, which a reference of one value never equals (a list of equal values still is one value).
_ALTERNATIVE = re.compile(r"[\s$*_.]*[(,;]?\s*\b(?:or|alternatively|otherwise)\b,?\s*" + _HEDGE_WORD
                          + r"(\$[^$\n]{1,200}\$|\\\(.{1,200}?\\\)|\\(?:boxed|fbox)\{[^{}\n]{1,200}\}"
                          r"|[-−+]?\d[\d,]*(?:\.\d+)?(?:/\d+)?|\([A-Fa-f]\)|\b(?:true|false|yes|no)\b)", re.I)
_REMARK = re.compile(r"\s*\([^()]*(?<![\\a-zA-Z])[a-zA-Z]{3}[^()]*\)$")  # "3 (not 4)": a remark in words
_PERCENT_AFTER = re.compile(r"\s?(?:\\?%|percent\b)")
_ELLIPSIS = re.compile(r"(?<=\d)(?:\.{3}|…)")
SENTENCE_END = re.compile(r"\.(?:\s|$)|[;!?](?:\s|$)| (?:which|since|because|as|so|and so|where)\s")
TRAILER_WINDOW = 300  # the closing stretch of a response: its trailer, its last sentence
_CONCLUSION = re.compile(r"\b(?:therefore|thus|hence|so|finally|in conclusion|in total|in all|altogether)\b",
                         re.I)
_SENTENCE_BREAK = re.compile(r"[.!?](?=\s)|\n")
# numbers in prose: 1,000.99, 2,74, -3, 0.5, 12%, 3.2e5 (a unit or currency may be glued on: 1,000.99€)
# (not a name's part: "helium-4", "a 262-Hz wave")
_PROSE_NUMBER = re.compile(r"(?<![\w.,^_{])(?<![A-Za-z]-)[-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:[.,]\d+)?(?:e[-+]?\d+)?"
                           r"(?:\s?%)?(?![\d,]\d)(?!-[A-Za-z])")
_PROSE_VALUE_OR_SPAN = re.compile(f"{_MATH_SPAN.pattern}|{_PROSE_NUMBER.pattern}", re.S)
_NEGATED = re.compile(r"\b(?:not|no|never|cannot|can't|isn't|aren't|wasn't|won't|neither|nor|except)\s+"
                      r"(?:[a-z]+\s+)?$", re.I)  # "not 10", "cannot be 5": that value is ruled out
_ENDS_AFTER_VALUE = re.compile(r"\s?(?:[$€£¥%]|[a-zA-Z]+[²³]?)?\W*$")  # a unit or currency, punctuation
_LIST_GAP = re.compile(r"\s*(?:,\s*(?:and|or)?|and|or)\s*")
_EMPHASIS = re.compile(r"\*\*|__")
_CURRENCY_BEFORE = r"\s*(?:\\?\$|[€£¥])?\s*$"  # "is $42": the value is 42
# "is about 0.17 V": a sentence's one value, rounded, is still the one it states
_ROUNDED_BEFORE = r"(?:\s+(?:about|approximately|roughly|around|nearly|exactly|precisely|only|just))?"
_COPULA_BEFORE = re.compile(r"(?:\b(?:is|are|was|equals|be)|'s|:)" + _CURRENCY_BEFORE, re.I)
# verbs that state a result, and those of the counts and sums of word problems ("Janet makes $18 every day.")
_RESULT_BEFORE = re.compile(r"(?:\b(?:is|are|was|were|be|equals?|by|to|of|gives?|get|gets|got|obtain|yields?"
                            r"|has|have|had|makes?|made|earns?|earned|pays?|paid|needs?|needed|spends?|spent"
                            r"|costs?|sells?|sold|buys?|bought|saves?|saved|takes?|took|owes?|owed|receives?"
                            r"|received|collects?|collected|uses?|used|weighs?|holds?|contains?|scores?|scored)"
                            r"|'s|[:=])" + _ROUNDED_BEFORE + _CURRENCY_BEFORE, re.I)
# "our answer is correct": what follows the marker is not a value
_NOT_A_VALUE = re.compile(r"(?:correct|incorrect|right|wrong|not|that|as|below|above|given|to|in|of|which"
                          r"|because|since|clearly|indeed|still|also|then)\b", re.I)
_PROSE_VALUE = re.compile(r".*\s(?:is|are|equals|=)\s+(.+)", re.S)
_LEADING_QUOTE = re.compile(r"^\\?[\"“”‘']\s*")  # the final answer is "12 and 13"
_ENVIRONMENT = re.compile(r"\\(?:begin|end)\{[a-zA-Z*]+\}")
_WORD = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}")


def has_words(answer: str) -> bool:
    """Whether an answer still has words once normalised (not a unit, a currency or an environment's name)."""
    return bool(_WORD.search(_ENVIRONMENT.sub("", normalize(answer).text)))


def stated_value(rest: str, sole: str = "any") -> str | None:
    """The value right after a final-answer marker: a math span (with a % that follows it), or the
    rest of the sentence; for a sentence in words, the value after its last "is", else the one value it
    gives (`sole`: "any", "after a verb" or "none"; see _sole_value); None for a sentence that goes on in
    words ("the answer is correct")."""
    rest = _LEADING_QUOTE.sub("", rest.lstrip(" *_:"))
    if _NOT_A_VALUE.match(rest):
        return None
    values, position = [], 0
    while span := _MATH_SPAN.match(rest, position):  # "$x = 2$ or $x = 3$": every span of the list
        value = next(group for group in span.groups() if group is not None).strip()
        percent = _PERCENT_AFTER.match(rest, span.end())
        values.append(value + ("\\%" if percent else ""))
        separator = _LIST_SEPARATOR.match(rest, percent.end() if percent else span.end())
        if not separator:
            break
        position = separator.end()
    if values:
        return ", ".join(values) if all(values) else None
    line = _ELLIPSIS.sub(r"\\ldots", rest.split("\n", 1)[0][:200])  # 0.333... is not a sentence's end
    hedged = _with_alternative(line)
    if hedged:
        return hedged
    line = SENTENCE_END.split(line, maxsplit=1)[0]
    line = _REMARK.sub("", line.strip().rstrip(".,;:")).strip("*_ \"“”").strip()
    if _WORD_NUMBER.fullmatch(line) and word_number(line) is not None:
        return str(word_number(line))  # "The answer is seven."
    if not has_words(line):
        return line or None
    prose = _PROSE_VALUE.fullmatch(line)  # "The volume of $ABCD$ is 120": what follows the last "is"
    value = stated_value(prose.group(1), sole) if prose else None
    if (value and not has_words(value)) or sole == "none":
        return value or line
    return _sole_value(line, after_verb=sole == "after a verb") or value or line


def alternative_to(after: str) -> str | None:
    """The value offered as an alternative at the start of `after` (the text that follows an answer on its
    line), unwrapped from $...$ or a box: " or possibly $16$." -> "16"; None when there is none."""
    alternative = _ALTERNATIVE.match(after.split("\n", 1)[0])
    if not alternative:
        return None
    value = alternative.group(1)
    for opener, closer in (("$", "$"), ("\\(", "\\)"), ("\\boxed{", "}"), ("\\fbox{", "}")):
        if value.startswith(opener) and value.endswith(closer):
            return value[len(opener):len(value) - len(closer)].strip()
    return value.rstrip(",")


_WORD_VALUE = re.compile(r"[\s*_:$]*(?:\b(?:true|false|yes|no)\b|\([A-Fa-f]\))", re.I)  # "True (or False if ...)"


def _with_alternative(line: str) -> str | None:
    """A stated line's value and the alternative it offers after it, as one list ("7 (or 8 if ...)" ->
    "7, 8"), or None when the line offers no alternative after a first value."""
    first = _PROSE_VALUE_OR_SPAN.search(line) or _WORD_VALUE.match(line)
    if not first or line[:first.start()].strip(" *_:$"):
        return None
    alternative = alternative_to(line[first.end():])
    if alternative is None:
        return None
    value = next((group for group in first.groups() if group is not None), first.group()).strip()
    return f"{value}, {alternative}"


def _prose_values(sentence: str, ones: bool = False) -> list[tuple[int, int, str]]:
    """(start, end, value) of the values a sentence in prose gives, in order: its math spans and the
    numbers outside them, less those it rules out ("not 10", "cannot be 5"); in a sentence with none, its
    numbers in words, as digits ("Seven boxes were shipped." -> 7); with `ones`, those too in a sentence with
    digits, and "one" (more often a pronoun: "one of the roots")."""
    values = []
    for match in _PROSE_VALUE_OR_SPAN.finditer(sentence):
        if not _NEGATED.search(sentence[max(0, match.start() - 30):match.start()]):
            span = next((group for group in match.groups() if group is not None), None)
            if span is not None:
                values.append((match.start(), match.end(), span.strip()))
                continue
            unit = UNIT_AFTER_NUMBER.match(sentence, match.end())  # a value carries its unit: "2.4 mm", "-42 m/s"
            if sentence[match.end():match.end() + 1].isalpha() and not unit:
                continue  # a coefficient glued to a name ("8RT") is no value
            end = unit.end() if unit and unit.group()[:1].isspace() else match.end()
            values.append((match.start(), end, sentence[match.start():end].strip()))
    if (values and not ones) or not _WORD_NUMBER.search(sentence):
        return values
    for match in _WORD_NUMBER.finditer(sentence):
        value = word_number(match.group())
        if value is not None and (ones or match.group().lower() != "one") \
                and not _NEGATED.search(sentence[max(0, match.start() - 30):match.start()]):
            percent = _PERCENT_AFTER.match(sentence, match.end())
            values.append((match.start(), percent.end() if percent else match.end(),
                           f"{value}{'%' if percent else ''}"))
    return sorted(values)


# Numbers written in words: a style guide's rule for small numbers and for a number that begins a sentence
# ("Four containers were imported."; Chicago Manual of Style 9.2, 9.5)
_NUMBER_WORD_VALUES = {word: value for value, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen".split())} | {word: 10 * (index + 2) for index, word in enumerate(
        "twenty thirty forty fifty sixty seventy eighty ninety".split())}
_NUMBER_WORD = "(?:" + "|".join(sorted(_NUMBER_WORD_VALUES, key=len, reverse=True)) + "|hundred|thousand|million)"
_WORD_NUMBER = re.compile(rf"\b{_NUMBER_WORD}(?:(?:[ -]|\s+and\s+){_NUMBER_WORD})*\b", re.I)


def word_number(words: str) -> int | None:
    """The value of a number written in words ("Seven" -> 7, "twenty-five" -> 25, "three hundred and two" ->
    302); None for words that are no one number ("two three", "three and four")."""
    total, current, last = 0, 0, ""
    for word in re.split(r"[\s-]+", words.lower()):
        value = _NUMBER_WORD_VALUES.get(word)
        if word == "and":
            continue
        if value is not None:
            kind = "unit" if value < 10 else "teen" if value < 20 else "ten"
            if last in ("unit", "teen") or (last == "ten" and kind != "unit"):
                return None
            current, last = current + value, kind
        elif word == "hundred":
            if not 0 < current < 100 or last == "hundred":
                return None
            current, last = current * 100, "hundred"
        elif current == 0:  # thousand or million with nothing to multiply
            return None
        else:
            total, current, last = total + current * (1000 if word == "thousand" else 1_000_000), 0, ""
    return total + current


def _sole_value(sentence: str, after_verb: bool = False) -> str | None:
    """The one value a sentence in prose gives ("Final Answer: Jane started 3 hours ago"); with after_verb,
    only one that follows a verb of result ("Thus there are 12 ways", "so it increases by 100%"; not "So
    we must check 4 more cases")."""
    values = _prose_values(sentence)
    if len(values) > 1:
        values = _results(sentence, values)
    if len(values) != 1 or (after_verb and not _RESULT_BEFORE.search(sentence[:values[0][0]])):
        return None
    return values[0][2]


# what a sentence gives as the conditions of its result: an opening clause ("With k = 1100 N/m, ...", "At
# t = 3 s, ...") and a named value ("at x = 0.080 m", "v^2 = 0.09")
_GIVEN_CLAUSE = re.compile(r"\W*(?:with|for|at|given|using|taking|since|because|as|if|when|after)\b[^,;]{0,120}[,;]",
                           re.I)
_NAMED_BEFORE = re.compile(r"(?<![A-Za-z])[A-Za-z](?:_\w+|\^\d)?\s*=\s*$")


def _results(sentence: str, values: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """The values of a sentence less those it gives as conditions (_GIVEN_CLAUSE, _NAMED_BEFORE), when that
    leaves one: "With k = 1100 N/m, the cord stretches by 0.602 m." -> 0.602 m; else all of them ("She sold 3
    cups and made 12 dollars.": which one is meant is a guess)."""
    given = _GIVEN_CLAUSE.match(sentence)
    results = [value for value in values if not (given and value[1] <= given.end())
               and not _NAMED_BEFORE.search(sentence[max(0, value[0] - 12):value[0]])]
    return results if len(results) == 1 else values


def _listed(text: str, values: list[tuple[int, int, str]]) -> tuple[int, str]:
    """The run of values that ends `values` as one list ("$2$ and $3$", "2, 3 or 4"): where it starts in
    text, and its values joined with commas."""
    run = values[-1:]
    for value in reversed(values[:-1]):
        if not _LIST_GAP.fullmatch(text, value[1], run[0][0]):
            break
        run.insert(0, value)
    return run[0][0], ", ".join(value for _, _, value in run)


def _last_sentence(text: str) -> tuple[str, bool]:
    """The last sentence of a text (within its last 300 characters, bold marks dropped), and whether it
    ends as a sentence does (a response cut off mid-thought does not)."""
    text = _EMPHASIS.sub("", text[-2 * TRAILER_WINDOW:]).rstrip()
    complete = text.endswith((".", "!", "?", "$", "\\]", "\\)"))
    text = text.rstrip(".!?").rstrip()
    breaks = [match.end() for match in _SENTENCE_BREAK.finditer(text, max(0, len(text) - TRAILER_WINDOW))]
    return text[breaks[-1] if breaks else -TRAILER_WINDOW:].strip(), complete


def final_formula(text: str) -> str | None:
    """A response that ends with one formula: a final $...$ / \\[...\\], or a last line that is a formula
    with no words ("42", "x = 5")."""
    ending = text.rstrip().rstrip(".").rstrip("*").rstrip()
    for closer, opener in _MATH_CLOSERS:
        start = ending.rfind(opener, 0, len(ending) - len(closer)) if ending.endswith(closer) else -1
        if start >= 0:  # "the roots are $2$ and $3$": every span of the list that ends the line
            line = ending[ending.rfind("\n", 0, start) + 1:]
            spans = [value for value in _prose_values(line) if line[value[0]] in "$\\"]
            if len(spans) > 1 and spans[-1][1] == len(line):
                return _listed(line, spans)[1]
            return ending[start + len(opener):len(ending) - len(closer)].strip() or None
    last_line = ending[ending.rfind("\n") + 1:].strip().strip("*").strip()
    if 0 < len(last_line) <= 200 and "\\boxed" not in last_line and normalize(last_line).text \
            and not has_words(last_line):
        return last_line  # a formula with at most a unit, a currency or a percent word after it
    return None


def concluding_value(text: str) -> str | None:
    """The value a concluding last sentence gives: "Therefore, the probability is 2/3." -> "2/3",
    "Thus $x \\geq 5$ is the solution." -> "x \\geq 5"; in words, its one value after a verb of result, when
    the sentence is complete ("Therefore, it increases by 100%." -> "100%"; "Janet makes $18 every day." -> 18,
    with or without a word of conclusion)."""
    sentence, complete = _last_sentence(text)
    if DISOWNED.search(sentence):  # "This gives 3, which is wrong.": an answer and its negation
        return None
    for conclusion in reversed(list(_CONCLUSION.finditer(sentence))):
        value = stated_value(sentence[conclusion.end():], "after a verb" if complete else "none")
        if value and not has_words(value):  # "so we are done": no value
            return value
    return _sole_value(sentence, after_verb=True) if complete else None


def closing_value(text: str) -> str | None:
    """The value that closes the last sentence (or its first clause) right after "is" or ":" ("... not 10,
    it's 1,000.99€"; "The probability is $\\frac{5}{12}$, which is about 0.42."), a unit, a currency or
    punctuation aside."""
    sentence, _ = _last_sentence(text)
    if DISOWNED.search(sentence):
        return None
    for part in (sentence, SENTENCE_END.split(sentence, maxsplit=1)[0]):
        values = _prose_values(part)
        if values and _ENDS_AFTER_VALUE.fullmatch(part, values[-1][1]):
            start, listed = _listed(part, values)  # "The roots are 2 and 3."
            if _COPULA_BEFORE.search(part[:start]):
                return listed
    return None


# an answer and its negation: "3, which is wrong", "x = 3 is not correct"
DISOWNED = re.compile(r"\b(?:is|seems|looks)\s+(?:wrong|incorrect|not\s+(?:right|correct))\b", re.I)
_OUTPUT_BLOCK = "```output"
# prose that doubts the output ("3, which is wrong"; "let me recheck") commits to nothing
_DOUBT = re.compile(r"\b(?:wrong|incorrect|mistake|error|bug|not (?:right|correct|the answer)|let me|recheck|re-check"
                    r"|however|but)\b", re.I)
# what may come before a value that opens a sentence: "Three trucks ...", "So, 5 cars ...", "On the second day,
# four ...", "Only 3 ..."
_SENTENCE_OPENING = re.compile(r"(?:.*[.!?:\n])?\s*(?:(?:so|thus|therefore|hence|finally|in total|altogether)\b,?\s*)?"
                               r"(?:[^,.!?\n]{0,40},\s*|[A-Za-z]+\s+)?[*_\s]*\$?", re.S | re.I)
_OFFERED = re.compile(r"\bor\b", re.I)  # a value offered as another possibility


def restated_output(text: str) -> str | None:
    """The value of a tool's last output that the prose closing the response restates, in digits or words
    (ToRA's format: a program, its ```output block, then a sentence; its parser.py extract_program_output
    reads that last output): "```output\n3.0\n```\nThree trucks will carry the 80 flagstones." -> "3". The
    sentence commits to the value and the output says which of its numbers that is; a value listed with it
    comes along ("3 or 4 trucks": a hedge). None when no code block follows and no value restates it."""
    start = text.rfind(_OUTPUT_BLOCK)
    end = text.find("```", start + len(_OUTPUT_BLOCK)) if start >= 0 else -1
    closing = text[end + 3:] if end >= 0 else ""
    if not closing.strip() or len(closing) > 2 * TRAILER_WINDOW or "```" in closing or _DOUBT.search(closing):
        return None
    output = plain_number(text[start + len(_OUTPUT_BLOCK):end].strip().rsplit("\n", 1)[-1].strip())
    values = _prose_values(closing, ones=True)
    restated = [output is not None and _restates(value, output) for _, _, value in values]
    committed = [index for index, (value_start, _, _) in enumerate(values)
                 if all(restated) or _RESULT_BEFORE.search(closing[:value_start])
                 or _SENTENCE_OPENING.fullmatch(closing[:value_start])]
    if not committed or not restated[committed[-1]]:
        return None  # the last value the prose commits to is another one (the readers before this had their say)
    alternatives = [value for (start, _, value), same in zip(values, restated)
                    if not same and _OFFERED.search(closing[max(0, start - 25):start])]
    return ", ".join([values[committed[-1]][2], *alternatives])  # "Three trucks, or maybe four": a hedge


def _restates(value: str, output) -> bool:
    """Whether a value in prose is a tool's numeric output: 3 for 3.0, 45% for 45 or 0.45."""
    answer = normalize(value)
    number = plain_number(answer.text)
    return number is not None and output in (number, number / 100 if answer.percent else number)


# Truth values and options stated in prose (read only for a reference of that kind: extract.candidate_answers)
_TRUTH_VALUES = {"true": "True", "yes": "True", "false": "False", "no": "False"}
_OPTION_REFERENCE = re.compile(r"\(([A-Ja-j])\)|([A-J])")
_VERDICT_WORD = re.compile(r"\b(?:true|yes|correct|valid|false|no|incorrect|invalid|wrong)\b", re.I)
_NEGATION = re.compile(r"\b(?:not|never|cannot|neither|nor)\b|n[’']t\b", re.I)
# "it is not possible to determine", "not enough information", "it depends": no verdict, whatever the words
_UNDECIDED = re.compile(r"\b(?:determin\w*|sure|know\w*|unclear|depends?|ambiguous|certain\w*|information|insufficient"
                        r"|undecidable|matters?)\b", re.I)
# "no" in an idiom gives no verdict ("no need to", "with no loss of generality"); nor does a negation of what
# the writer does ("we cannot simplify further")
_NO_IDIOM = re.compile(r"\bno\s+(?:need|further|more|longer|loss|matter|doubt|other\s+way)\b", re.I)
_PERSONAL_NEGATION = re.compile(r"\b(?:we|i|you|let's|let\s+us|one)\b[^.;,]{0,20}?"
                                r"(?:\bnot\b|\bcannot\b|\bnever\b|n[’']t\b)", re.I)
_VERDICT_MARKUP = re.compile(r"\\(?:text\w*|mathrm|mbox|boxed)\s*|[{}$*_]")
_OPTION_MENTION = re.compile(r"\b(?:option|choice)\s*(?:\(([A-Ja-j])\)|([A-J])\b)|\(([A-Ja-j])\)", re.I)
_OPTION_GAP = re.compile(r"\s*(?:,|/|\bor\b|\band\b)\s*(?:(?:option|choice)\s*)?", re.I)
_OPTION_CUE_BEFORE = re.compile(r"\b(?:so|thus|therefore|hence|answer|correct|right|choose|pick|go with|select|is|be)"
                                r"\W*$", re.I)
_OPTION_CUE_AFTER = re.compile(r"\s*(?:is|must be)\s+(?:the\s+)?(?:correct|right|answer)", re.I)
_OPTION_REFUSED_AFTER = re.compile(r"\s*(?:is|are)\s+(?:not\b|wrong|incorrect|false|ruled out)", re.I)


def reference_kind(reference: str) -> str:
    """"truth value" (True, False, Yes, No: TheoremQA's bool answers), "option" ((a), B) or ""."""
    if len(reference) > 40:
        return ""
    text = normalize(reference).text
    if text.lower() in _TRUTH_VALUES:
        return "truth value"
    return "option" if _OPTION_REFERENCE.fullmatch(text) else ""


def truth_verdict(text: str, negation: bool = True) -> str | None:
    """"True" / "False", the truth value a statement gives: by its words ("the statement is true", "Yes",
    "this is not correct" -> False), or, with `negation` and none of them, by a negated clause ("the series does
    not converge" -> False). TheoremQA's grader reads yes / true and no / false so (utils.py
    extract_theoremqa_answer); we refuse both values named ("true or false"), a double negation, and a verdict
    left open ("it cannot be determined")."""
    text = _NO_IDIOM.sub(" ", _VERDICT_MARKUP.sub(" ", text[:300]))
    if _UNDECIDED.search(text):
        return None
    verdicts = set()
    for word in _VERDICT_WORD.finditer(text):
        positive = word.group().lower() in ("true", "yes", "correct", "valid")
        verdicts.add(positive != bool(_NEGATION.search(text[max(0, word.start() - 20):word.start()])))
    if not verdicts and negation and len(_NEGATION.findall(text)) == 1 and not _PERSONAL_NEGATION.search(text):
        verdicts.add(False)
    return ("True" if verdicts.pop() else "False") if len(verdicts) == 1 else None


def closing_verdict(response: str) -> list[str]:
    """The verdict of the last sentence, when it gives one as a conclusion: a sentence that starts with yes or
    no, one that concludes ("Therefore, the series does not converge."; a verdict only by negation needs the
    sentence complete), or one that says what is true ("... is false")."""
    after_thinking = response.rpartition("</think>")[2]
    sentence, complete = _last_sentence(after_thinking)
    if re.match(r"\W*(?:yes|no)\b", sentence, re.I):
        verdict = truth_verdict(sentence)
    elif conclusion := _CONCLUSION.search(sentence):
        verdict = truth_verdict(sentence[conclusion.end():], negation=complete)
    else:
        verdict = truth_verdict(sentence, negation=False) if _STATED_TRUTH.search(sentence) else None
    return [verdict] if verdict else []


_STATED_TRUTH = re.compile(r"\b(?:is|are|was|be)\s+(?:not\s+)?(?:true|false|correct|incorrect)\b", re.I)


def closing_option(response: str) -> str | None:
    """The option a closing sentence commits to ("so option (d).", "I would go with choice (B)", "(b) is
    correct"): "(d)"; with the options listed with it ("option (c) or (d)": a hedge). An option named in
    passing ("Option (a) fails.") is none."""
    sentence, _ = _last_sentence(response)
    mentions = list(_OPTION_MENTION.finditer(sentence))
    if not mentions:
        return None
    first = len(mentions) - 1
    while first > 0 and _OPTION_GAP.fullmatch(sentence, mentions[first - 1].end(), mentions[first].start()):
        first -= 1
    if _OPTION_REFUSED_AFTER.match(sentence, mentions[-1].end()) or not (
            _OPTION_CUE_BEFORE.search(sentence[:mentions[first].start()])
            or _OPTION_CUE_AFTER.match(sentence, mentions[-1].end())):
        return None
    letters = [next(letter for letter in mention.groups() if letter).lower() for mention in mentions[first:]]
    return ", ".join(f"({letter})" for letter in dict.fromkeys(letters))
