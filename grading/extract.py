"""Finding the answer in a response: what a model claims as its final answer, in a documented order of
preference (candidate_answers; docs/reward.md), and the letter of a multiple-choice answer (extract_choice).
Pure functions on text, no processes and no I/O; reward.py grades what they return.

The order: the last \\boxed{...} after </think>, else the last final-answer statement after it ("the answer
is ...", "Answer: ...", "#### ..."), else a final line that is one formula, else the value of a concluding
sentence or one that closes the response after "is", else the last box inside <think>; `require_boxed=True`
keeps only boxes (a format-strict reward).

>>> extract_answer("so the total is \\\\boxed{\\\\frac{1}{2}}.")
'\\\\frac{1}{2}'
>>> extract_answer("</think> Adding them up, the answer is $42$.")
'42'
"""

import itertools
import re

from grading.grader import normalize, undouble_backslashes, unwrap
from grading.latex import box_spans, split_top, tokenize

_STATEMENT_WINDOW = 4000  # a "final answer" statement far from the end is not final
_ANSWER_STATEMENT = re.compile(
    r"\b(?:final\s+)?answer\s+(?:is|should\s+be|would\s+be)\b[\s*_]*:?"  # (the) (final) answer is
    r"|^[\s*_#>]*(?:final\s+)?answer[\s*_]*[:：=]"  # "Answer: 5" on a line of its own
    r"|\bfinal\s+answer[\s*_]*[:：]"  # "... Final Answer: 5"
    r"|\bfinal\s+answer\b[\s*_#:]*\n"  # a "Final Answer" heading
    r"|^#{4}(?!#)", re.I | re.M)  # GSM8K's #### 5
_RARER_STATEMENT = re.compile(r"\b(?:option|choice)\s+is\b[\s*_]*:?"  # "The correct option is (B)"
                              r"|答案[是为][:：]?", re.I)  # "the answer is" in Chinese (Qwen2.5-Math reads it too)
_CLOSING_A_LINE = re.compile(r"[\s*_]*A[:：]", re.I)  # the few-shot "Q: ... A: 5" as the closing line
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
                          r"|[-−+]?\d[\d,]*(?:\.\d+)?(?:/\d+)?)", re.I)
_REMARK = re.compile(r"\s*\([^()]*(?<![\\a-zA-Z])[a-zA-Z]{3}[^()]*\)$")  # "3 (not 4)": a remark in words
_PERCENT_AFTER = re.compile(r"\s?(?:\\?%|percent\b)")
_NEXT_QUESTION = re.compile(r"\n(?:Q|Question)[:：]")
_ELLIPSIS = re.compile(r"(?<=\d)(?:\.{3}|…)")
_SENTENCE_END = re.compile(r"\.(?:\s|$)|[;!?](?:\s|$)| (?:which|since|because|as|so|and so|where)\s")
_TRAILER_WINDOW = 300
_TRAILER = re.compile(r"(?:\s*(?:<\|[a-z_]+\|>\s*\w*|I hope (?:it|this) is correct\.?))+\s*$", re.I)
_CONCLUSION = re.compile(r"\b(?:therefore|thus|hence|so|finally|in conclusion|in total|in all|altogether)\b",
                         re.I)
_SENTENCE_BREAK = re.compile(r"[.!?](?=\s)|\n")
# numbers in prose: 1,000.99, 2,74, -3, 0.5, 12%, 3.2e5 (a unit or currency may be glued on: 1,000.99€)
_PROSE_NUMBER = re.compile(r"(?<![\w.,^_{])[-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:[.,]\d+)?(?:e[-+]?\d+)?(?:\s?%)?"
                           r"(?![\d,]\d)")
_PROSE_VALUE_OR_SPAN = re.compile(f"{_MATH_SPAN.pattern}|{_PROSE_NUMBER.pattern}", re.S)
_NEGATED = re.compile(r"\b(?:not|no|never|cannot|can't|isn't|aren't|wasn't|won't|neither|nor|except)\s+"
                      r"(?:[a-z]+\s+)?$", re.I)  # "not 10", "cannot be 5": that value is ruled out
_ENDS_AFTER_VALUE = re.compile(r"\s?(?:[$€£¥%]|[a-zA-Z]+[²³]?)?\W*$")  # a unit or currency, punctuation
_TEXT_COMMAND = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\b")
_LIST_GAP = re.compile(r"\s*(?:,\s*(?:and|or)?|and|or)\s*")
_EMPHASIS = re.compile(r"\*\*|__")
_CURRENCY_BEFORE = r"\s*(?:\\?\$|[€£¥])?\s*$"  # "is $42": the value is 42
_COPULA_BEFORE = re.compile(r"(?:\b(?:is|are|was|equals|be)|'s|:)" + _CURRENCY_BEFORE, re.I)
# verbs that state a result, and those of the counts and sums of word problems ("Janet makes $18 every day.")
_RESULT_BEFORE = re.compile(r"(?:\b(?:is|are|was|were|be|equals?|by|to|of|gives?|get|gets|got|obtain|yields?"
                            r"|has|have|had|makes?|made|earns?|earned|pays?|paid|needs?|needed|spends?|spent"
                            r"|costs?|sells?|sold|buys?|bought|saves?|saved|takes?|took|owes?|owed|receives?"
                            r"|received|collects?|collected|uses?|used|weighs?|holds?|contains?|scores?|scored)"
                            r"|'s|[:=])" + _CURRENCY_BEFORE, re.I)
# "our answer is correct": what follows the marker is not a value
_NOT_A_VALUE = re.compile(r"(?:correct|incorrect|right|wrong|not|that|as|below|above|given|to|in|of|which"
                          r"|because|since|clearly|indeed|still|also|then)\b", re.I)
_PROSE_VALUE = re.compile(r".*\s(?:is|are|equals|=)\s+(.+)", re.S)
_LEADING_QUOTE = re.compile(r"^\\?[\"“”‘']\s*")  # the final answer is "12 and 13"
_ENVIRONMENT = re.compile(r"\\(?:begin|end)\{[a-zA-Z*]+\}")
_WORD = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}")
_WORD_OR_SHORT = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}")


def _has_words(answer: str) -> bool:
    """Whether an answer still has words once normalised (not a unit, a currency or an environment's name)."""
    return bool(_WORD.search(_ENVIRONMENT.sub("", normalize(answer).text)))


def _stated_value(rest: str, sole: str = "any") -> str | None:
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
    line = _SENTENCE_END.split(line, maxsplit=1)[0]
    line = _REMARK.sub("", line.strip().rstrip(".,;:")).strip("*_ \"“”").strip()
    if not _has_words(line):
        return line or None
    prose = _PROSE_VALUE.fullmatch(line)  # "The volume of $ABCD$ is 120": what follows the last "is"
    value = _stated_value(prose.group(1), sole) if prose else None
    if (value and not _has_words(value)) or sole == "none":
        return value or line
    return _sole_value(line, after_verb=sole == "after a verb") or value or line


def _alternative_to(after: str) -> str | None:
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


def _with_alternative(line: str) -> str | None:
    """A stated line's value and the alternative it offers after it, as one list ("7 (or 8 if ...)" ->
    "7, 8"), or None when the line offers no alternative after a first value."""
    first = _PROSE_VALUE_OR_SPAN.search(line)
    if not first or line[:first.start()].strip(" *_:$"):
        return None
    alternative = _alternative_to(line[first.end():])
    if alternative is None:
        return None
    value = next((group for group in first.groups() if group is not None), first.group()).strip()
    return f"{value}, {alternative}"


def _prose_values(sentence: str) -> list[tuple[int, int, str]]:
    """(start, end, value) of the values a sentence in prose gives, in order: its math spans and the
    numbers outside them, less those it rules out ("not 10", "cannot be 5")."""
    values = []
    for match in _PROSE_VALUE_OR_SPAN.finditer(sentence):
        if not _NEGATED.search(sentence[max(0, match.start() - 30):match.start()]):
            span = next((group for group in match.groups() if group is not None), match.group())
            values.append((match.start(), match.end(), span.strip()))
    return values


def _sole_value(sentence: str, after_verb: bool = False) -> str | None:
    """The one value a sentence in prose gives ("Final Answer: Jane started 3 hours ago"); with after_verb,
    only one that follows a verb of result ("Thus there are 12 ways", "so it increases by 100%"; not "So
    we must check 4 more cases")."""
    values = _prose_values(sentence)
    if len(values) != 1 or (after_verb and not _RESULT_BEFORE.search(sentence[:values[0][0]])):
        return None
    return values[0][2]


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
    text = _EMPHASIS.sub("", text[-2 * _TRAILER_WINDOW:]).rstrip()
    complete = text.endswith((".", "!", "?", "$", "\\]", "\\)"))
    text = text.rstrip(".!?").rstrip()
    breaks = [match.end() for match in _SENTENCE_BREAK.finditer(text, max(0, len(text) - _TRAILER_WINDOW))]
    return text[breaks[-1] if breaks else -_TRAILER_WINDOW:].strip(), complete


def _final_formula(text: str) -> str | None:
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
            and not _has_words(last_line):
        return last_line  # a formula with at most a unit, a currency or a percent word after it
    return None


def _statement_ends(text: str, start: int, end: int) -> list[int]:
    """Where each final-answer statement in text[start:end] ends (its value follows), in order. The regex
    runs only where one of its words occurs (it costs ~0.15 µs a character)."""
    lowered = text[start:end].lower()
    ends = []
    if "answer" in lowered or "####" in lowered:
        ends = [statement.end() for statement in _ANSWER_STATEMENT.finditer(text, start, end)]
    if "option" in lowered or "choice" in lowered or "答案" in lowered:
        ends = sorted(ends + [statement.end() for statement in _RARER_STATEMENT.finditer(text, start, end)])
    content_end = start + len(lowered.rstrip())
    last_line = _CLOSING_A_LINE.match(text, max(start, text.rfind("\n", start, content_end) + 1), content_end)
    if last_line and (not ends or ends[-1] <= last_line.start()):
        ends.append(last_line.end())
    return ends


def _last_statement(text: str, start: int = 0) -> str | None:
    """The value of the last final-answer statement in text[start:] (within its last 4,000 characters)."""
    tail = text[max(start, len(text) - _STATEMENT_WINDOW):]
    for statement_end in reversed(_statement_ends(tail, 0, len(tail))):
        value = _stated_value(tail[statement_end:])
        if value and (_DIGIT.search(value) or not _is_placeholder(unwrap(value))):
            return value
    return None


def _concluding_value(text: str) -> str | None:
    """The value a concluding last sentence gives: "Therefore, the probability is 2/3." -> "2/3",
    "Thus $x \\geq 5$ is the solution." -> "x \\geq 5"; in words, its one value after a verb of result, when
    the sentence is complete ("Therefore, it increases by 100%." -> "100%"; "Janet makes $18 every day." -> 18,
    with or without a word of conclusion)."""
    sentence, complete = _last_sentence(text)
    for conclusion in reversed(list(_CONCLUSION.finditer(sentence))):
        value = _stated_value(sentence[conclusion.end():], "after a verb" if complete else "none")
        if value and not _has_words(value):  # "so we are done": no value
            return value
    return _sole_value(sentence, after_verb=True) if complete else None


def _closing_value(text: str) -> str | None:
    """The value that closes the last sentence (or its first clause) right after "is" or ":" ("... not 10,
    it's 1,000.99€"; "The probability is $\\frac{5}{12}$, which is about 0.42."), a unit, a currency or
    punctuation aside."""
    sentence, _ = _last_sentence(text)
    for part in (sentence, _SENTENCE_END.split(sentence, maxsplit=1)[0]):
        values = _prose_values(part)
        if values and _ENDS_AFTER_VALUE.fullmatch(part, values[-1][1]):
            start, listed = _listed(part, values)  # "The roots are 2 and 3."
            if _COPULA_BEFORE.search(part[:start]):
                return listed
    return None


def _before_next_question(text: str, start: int) -> str:
    """A few-shot answer that runs on into a question of its own ("... The answer is 4.\n\nQ: ...") ends
    where that question begins (evaluation harnesses stop generating at "Q:" for this reason)."""
    start = max(start, len(text) - _STATEMENT_WINDOW)  # as for statements: the end of the response
    if text.find("\nQ", start) < 0:
        return text
    for question in itertools.islice(_NEXT_QUESTION.finditer(text, start), 3):
        if _statement_ends(text, start, question.start()):
            return text[:question.start()]
    return text


def _without_trailer(text: str) -> str:
    """The response without a chat template's next-turn marker or a closing pleasantry."""
    head, tail = text[:-_TRAILER_WINDOW], text[-_TRAILER_WINDOW:]
    return head + _TRAILER.sub("", tail)


def _unboxed_answer(text: str) -> str | None:
    """What a text without a box states (order of preference in candidate_answers): a formula that ends
    it, else the value of a concluding sentence, else a value that closes it after "is"."""
    return _final_formula(text) or _concluding_value(text) or _closing_value(text)


def stated_answer(text: str) -> str | None:
    """The answer a text states without a box: its last final-answer statement, else _unboxed_answer;
    None when it states none."""
    text = _without_trailer(text)
    return _last_statement(text) or _unboxed_answer(text[-_STATEMENT_WINDOW:])


def candidate_answers(response: str, reference: str = "", require_boxed: bool = False) -> list[str]:
    """What a response may be claiming as its answer, best first. The order of preference (docs/reward.md),
    all after </think> when the response has one:
    0. the content of the last <answer>...</answer> tag, read by these same rules (R1-Zero-style prompts);
    1. a final-answer statement after the last box ("... \\boxed{5}. Final answer: 6" answers 6);
    2. the last box (and, for a reference with several parts, all those boxes together as one list); boxes
       that hold no answer (\\boxed{}, \\boxed{[answer]}) are not boxes;
    3. a formula that ends the response, else the value of a concluding sentence ("Therefore, the
       probability is 2/3."), else a value that closes it after "is" ("... which is 1,000.99€");
    4. the last box inside the thinking.
    With require_boxed only boxes count (2, then 4). Boxes of different values listed at the end
    ("\\boxed{3} or \\boxed{4}") are one answer, the list, which a reference of one value never equals.
    """
    response = _single_backslashes(_without_trailer(response))
    think_end = response.rfind("</think>")
    answer_start = think_end + len("</think>") if think_end >= 0 else 0
    response = _before_next_question(response, answer_start)
    if not require_boxed:
        tagged = _answer_tag(response, answer_start)
        candidates = candidate_answers(tagged, reference) if tagged else []
        if candidates:
            return candidates
    spans = [span for span in box_spans(response) if not _is_placeholder(span[2])]
    final_spans = [span for span in spans if span[0] > think_end]
    if not require_boxed:
        statement = _last_statement(response, final_spans[-1][1] if final_spans else answer_start)
        if statement and not (final_spans and _has_words(statement)):
            return [statement]  # after a box, only a formula overrides it: "Answer: see above" does not
        if not final_spans:
            unboxed = _unboxed_answer(response[answer_start:][-_STATEMENT_WINDOW:])
            if unboxed:
                return [unboxed]
    if not spans:
        return []
    alternative = _alternative_to(response[spans[-1][1]:])
    if alternative is not None:
        return [f"{spans[-1][2]}, {alternative}"]  # "\boxed{15} or possibly 16": a hedge
    candidates = [spans[-1][2]]
    if len(spans) == 1:
        return candidates
    last_boxes = _last_box_list(response, final_spans or spans)
    final_boxes = list(dict.fromkeys(content.strip() for _, _, content in final_spans))
    if (len(last_boxes) > 1 or 1 < len(final_boxes) <= 10) and _has_several_parts(reference):
        if 1 < len(final_boxes) <= 10:
            candidates.append(", ".join(final_boxes))
    elif len(last_boxes) > 1:
        return [", ".join(last_boxes)]  # a hedge: several values where one is asked for
    return candidates


def _last_box_list(text: str, spans: list[tuple[int, int, str]]) -> list[str]:
    """The distinct contents of the boxes that end `spans` as one list: "\\boxed{3} or \\boxed{4}",
    "$\\boxed{3}$, $\\boxed{4}$", "x = \\boxed{3} \\text{ or } x = \\boxed{4}" (no word between them but
    "or", "and" and the like; "\\boxed{3}. Hmm, no: \\boxed{4}" is a correction, not a list)."""
    start = len(spans) - 1
    while start > 0 and _joins_alternatives(text[spans[start - 1][1]:spans[start][0]]):
        start -= 1
    return list(dict.fromkeys(content.strip() for _, _, content in spans[start:]))


def _joins_alternatives(between: str) -> bool:
    if len(between) > 100:
        return False
    words = {word.lower() for word in _WORD_OR_SHORT.findall(_TEXT_COMMAND.sub("", between))}
    return words <= _ALTERNATIVE_WORDS


_ALTERNATIVE_WORDS = {"or", "and", "either", "also", "maybe", "perhaps", "possibly"}
_ANSWER_TAG = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S | re.I)
# what a template writes where the answer goes: \boxed{}, \boxed{[answer]}, \boxed{\text{your answer here}}
_PLACEHOLDER = re.compile(r"(?:(?:your|the|my|final|insert|put|write|enter|correct)\s*)*answer(?:\s*here)?"
                          r"|(?:\.|…|\?|_|\\_|\\[lc]?dots|\\,|\s)*", re.I)
_DIGIT = re.compile(r"\d")
_PLACEHOLDER_MARKS = re.compile(r"\\(?:text\w*|mathrm|mathbf|mbox)\s*|[{}\[\]()<>\"'*$\s]+")


def _is_placeholder(content: str) -> bool:
    """Whether a box's content is where an answer would go rather than an answer."""
    if len(content) >= 60 or _DIGIT.search(content):
        return False
    return bool(_PLACEHOLDER.fullmatch(_PLACEHOLDER_MARKS.sub(" ", content).strip()))


def _answer_tag(text: str, start: int) -> str | None:
    """The content of the last <answer>...</answer> in text[start:] (to the end when it is left open)."""
    opening = text.rfind("<answer>", start)
    if opening < 0:
        return None
    content = _ANSWER_TAG.match(text, opening).group(1).strip()
    return None if _is_placeholder(content) else content


def reference_answer(reference: str) -> str:
    """A reference that is a whole solution is graded by its final answer (its last box or stated answer);
    a bare answer is itself."""
    reference = _single_backslashes(reference)
    spans = box_spans(reference)
    gaps = [reference[left[1]:right[0]] for left, right in zip(spans, spans[1:])]  # between consecutive boxes
    if gaps and all(map(_joins_a_list, gaps)):  # \boxed{1} and \boxed{-2}: the list
        return ", ".join(dict.fromkeys(content.strip() for _, _, content in spans))
    if spans:
        return spans[-1][2]
    if len(reference) > 100 or _ANSWER_STATEMENT.search(reference):
        return stated_answer(reference) or reference
    return reference


def _joins_a_list(between: str) -> bool:
    """Whether the text between two boxes makes them one list: no words, or a comma, "and" or "or"
    in a few words ("\\boxed{1} papers and \\boxed{2} bins"; not "\\boxed{1} no no no \\boxed{2}", nor a
    paragraph)."""
    if len(between) > 200:
        return False
    words = [word.lower() for word in _WORD_OR_SHORT.findall(between)]
    return not words or (len(words) <= 4 and ("," in between or "and" in words or "or" in words))


def _single_backslashes(text: str) -> str:
    """Text escaped twice ("\\\\boxed{\\\\frac12}", from a JSON dump) with its backslashes single."""
    return undouble_backslashes(text) if "\\\\boxed" in text else text


def _has_several_parts(reference: str) -> bool:
    text = normalize(reference).text
    return "\\pm" in text or len(split_top(tokenize(text), {","})) > 1


def extract_answer(text: str, require_boxed: bool = False) -> str | None:
    """The answer the checker grades in a response (see candidate_answers); None when it gives none."""
    candidates = candidate_answers(text, require_boxed=require_boxed)
    return candidates[0] if candidates else None



_CHOICE_STATEMENT = re.compile(r"(?i:answer)\s*(?:is)?\s*[:：]?\s*\**\s*\(?([A-Z])\)?(?![A-Za-z0-9])")
_LONE_LETTER = re.compile(r"[\W_]*\(?([A-Z])\)?[\W_]*")
# more letters after the first: "Answer: A, C", "B or C", "(A) and (B)", "\boxed{A/B}" name several options
_MORE_LETTERS = re.compile(r"(?:\s*\**\s*(?:[,/&+]|\bor\b|\band\b)\s*\**\s*\(?([A-Z])\)?(?![A-Za-z0-9]))+")
_LETTER_LIST = re.compile(rf"[\W_]*\(?([A-Z])\)?{_MORE_LETTERS.pattern}[\W_]*")


def _several_letters(first: str, more: re.Match | None) -> bool:
    """Whether a list of letters names another option than its first (a hedge)."""
    return bool(more) and bool(set(re.findall(r"\b[A-Z]\b", more.group())) - {first})


def gives_choice(response: str, reference_letter: str) -> bool:
    """Whether the last multiple-choice letter the response gives (extract_choice) is the reference letter."""
    letter = extract_choice(response)
    return letter is not None and letter == reference_letter.strip().strip("()").upper()


def extract_choice(response: str) -> str | None:
    """The last multiple-choice letter a response gives: "Answer: X", \\boxed{X}, or a final line that is
    just X; None when it gives none, or when the last of these names several options ("Answer: A, C",
    "\\boxed{A, B}", a last line "(A) and (B)": a hedge earns nothing)."""
    found = []  # (position, letter, or None for a hedge)
    tail_start = max(0, len(response) - _STATEMENT_WINDOW)
    statement = None
    for statement in _CHOICE_STATEMENT.finditer(response, tail_start):
        pass
    if statement is not None:
        hedged = _several_letters(statement.group(1), _MORE_LETTERS.match(response, statement.end()))
        found.append((statement.start(), None if hedged else statement.group(1)))
    spans = [span for span in box_spans(response) if not _is_placeholder(span[2])]
    if len(_last_box_list(response, spans)) > 1:  # \\boxed{C} or \\boxed{D}
        found.append((spans[-1][0], None))
    elif spans:
        content = spans[-1][2]
        text = normalize(content).text if len(content) < 100 else ""
        boxed = re.fullmatch(r"\(?([A-Z])\)?", text)
        if boxed:
            found.append((spans[-1][0], boxed.group(1)))
        elif _LETTER_LIST.fullmatch(_TEXT_COMMAND.sub("", content)):
            found.append((spans[-1][0], None))
    stripped = response.rstrip()
    last_line_start = stripped.rfind("\n") + 1
    last_line = stripped[last_line_start:]
    lone = _LONE_LETTER.fullmatch(last_line)
    if lone:
        found.append((last_line_start, lone.group(1)))
    elif len(last_line) < 40 and _LETTER_LIST.fullmatch(last_line):
        found.append((last_line_start, None))
    return max(found, key=lambda item: item[0])[1] if found else None
