"""Finding the answer in a response: what a model claims as its final answer, in a documented order of
preference (candidate_answers; docs/reward.md), and the letter of a multiple-choice answer (extract_choice).
Pure functions on text, no processes and no I/O; reward.py grades what they return. This module decides where
in a response to look and in which order; prose.py reads the value a sentence there states.

The order: the last \\boxed{...} after </think>, else the last final-answer statement after it ("the answer
is ...", "Answer: ...", "#### ..."), else a final line that is one formula, else the value of a concluding
sentence or one that closes the response after "is", else the last box inside <think>; `require_boxed=True`
keeps only boxes (a format-strict reward).

>>> extract_answer("so the total is \\\\boxed{\\\\frac{1}{2}}.")
'\\\\frac{1}{2}'
>>> extract_answer("</think> Adding them up, the answer is $42$.")
'42'
"""

import contextlib
import itertools
import json
import re

from grading.grader import normalize, undouble_backslashes, unwrap
from grading.latex import box_spans, split_top, tokenize
from grading.prose import (
    DISOWNED,
    SENTENCE_END,
    TRAILER_WINDOW,
    alternative_to,
    closing_option,
    closing_value,
    closing_verdict,
    concluding_value,
    final_formula,
    has_words,
    reference_kind,
    restated_output,
    stated_value,
    truth_verdict,
)

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
_RETRACTED = re.compile(r"[\s*_:]*(?:not|never)\b", re.I)
_CORRECTION = re.compile(r"\b(?:but|rather|instead|it is|it's)\b[\s,:]*", re.I)
_NEXT_QUESTION = re.compile(r"\n(?:Q|Question)[:：]")
_TRAILER = re.compile(r"(?:\s*(?:<\|[a-z_]+\|>\s*\w*|I hope (?:it|this) is correct\.?))+\s*$", re.I)
_TEXT_COMMAND = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\b")
_WORD_OR_SHORT = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}")


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
        if _RETRACTED.match(tail, statement_end):  # "The answer is not 5.": no answer, and no earlier one stands
            retracted = SENTENCE_END.split(tail[statement_end:].split("\n", 1)[0], maxsplit=1)[0].strip(" *_:.")
            correction = _CORRECTION.search(retracted)  # "... is not 42 but 41": the correction
            return (stated_value(retracted[correction.end():]) if correction else None) or retracted
        line = tail[statement_end:statement_end + 300].split("\n", 1)[0]
        if DISOWNED.search(line):  # "The answer is 3, which is wrong.": that line, which equals nothing
            return line.strip(" *_:.")
        value = stated_value(tail[statement_end:])
        if value and (_DIGIT.search(value) or not _is_placeholder(unwrap(value))):
            return value
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
    head, tail = text[:-TRAILER_WINDOW], text[-TRAILER_WINDOW:]
    return head + _TRAILER.sub("", tail)


def _unboxed_answer(text: str) -> str | None:
    """What a text without a box states (order of preference in candidate_answers): a formula that ends
    it, else the value of a concluding sentence, else a value that closes it after "is"."""
    return final_formula(text) or concluding_value(text) or closing_value(text)


def stated_answer(text: str) -> str | None:
    """The answer a text states without a box: its last final-answer statement, else _unboxed_answer;
    None when it states none."""
    text = _without_trailer(text)
    return _last_statement(text) or _unboxed_answer(text[-_STATEMENT_WINDOW:])


def candidate_answers(response: str, reference: str = "", require_boxed: bool = False) -> list[str]:
    """What a response may be claiming as its answer, best first (_candidates); for a reference that is a
    truth value (True / False / Yes / No), each read as the verdict it states ("the statement is not true" ->
    False), or the verdict of a concluding sentence when nothing else is stated; for an option letter, the
    option a closing sentence names ("so option (d)")."""
    candidates = _candidates(response, reference, require_boxed)
    if require_boxed:
        return candidates
    kind = reference_kind(reference)
    if kind == "truth value":
        verdicts = [truth_verdict(candidate) for candidate in candidates]
        if any(verdicts):
            return [verdict or candidate for verdict, candidate in zip(verdicts, candidates)]
        return closing_verdict(response) or candidates
    if kind == "option":  # the option the last sentence commits to is the last answer; else the candidates
        option = closing_option(response)
        return [option] if option else candidates
    return candidates


def _candidates(response: str, reference: str = "", require_boxed: bool = False) -> list[str]:
    """What a response may be claiming as its answer, best first. The order of preference (docs/reward.md),
    all after </think> when the response has one:
    0. the content of the last <answer>...</answer> tag, read by these same rules (R1-Zero-style prompts);
    1. a final-answer statement after the last box ("... \\boxed{5}. Final answer: 6" answers 6);
    2. the last box (and, for a reference with several parts, all those boxes together as one list); boxes
       that hold no answer (\\boxed{}, \\boxed{[answer]}) are not boxes;
    3. a formula that ends the response, else the value of a concluding sentence ("Therefore, the
       probability is 2/3."), else a value that closes it after "is" ("... which is 1,000.99€"), else the value
       of a tool's last output that the closing prose restates ("```output\n3.0\n```\nThree trucks are needed.");
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
        candidates = [_computed_value(c) for c in _candidates(tagged, reference)] if tagged else []
        if candidates:
            return candidates
    spans = [span for span in box_spans(response) if not _is_placeholder(span[2])]
    final_spans = [span for span in spans if span[0] > think_end]
    if not require_boxed:
        statement = _last_statement(response, final_spans[-1][1] if final_spans else answer_start)
        if statement and not (final_spans and has_words(statement)):
            return [statement]  # after a box, only a formula overrides it: "Answer: see above" does not
        if not final_spans:
            tail = response[answer_start:][-_STATEMENT_WINDOW:]
            unboxed = _unboxed_answer(tail) or restated_output(tail)
            if unboxed:
                return [unboxed]
    if not spans:
        return []
    alternative = alternative_to(response[spans[-1][1]:])
    if alternative is not None:
        return [f"{spans[-1][2]}, {alternative}"]  # "\boxed{15} or possibly 16": a hedge
    candidates = [spans[-1][2] + _unit_after(response, spans[-1][1], spans[-1][2])]
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


_AFTER_BOX = re.compile(r"(?:\$|\\\)|\\\])?([^\n$]{1,30}?)(?:\.?\s*$|\.\s|[,;]|\$|\n)")


def _unit_after(text: str, end: int, content: str) -> str:
    """The unit written right after a box of a number, which belongs to its answer: "\\boxed{2.4} mm." -> " mm"
    (OlympiadBench's physics prompt asks for the unit outside the box: inference/code/evaluators/evaluator.py);
    "" for none."""
    after = _AFTER_BOX.match(text, end)
    if not after or not after.group(1).strip() or content.rstrip()[-1:] not in tuple("0123456789}"):
        return ""
    tail = after.group(1).strip()
    unit = normalize("1 " + re.split(r"\s+or\s+", tail, maxsplit=1)[0])
    return " " + tail if unit.unit and unit.text == "1" else ""  # "\\boxed{2.4} mm or cm": the hedge comes along


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
# <answer>, as R1-Zero-style prompts ask, also spaced or in capitals (< answer >, <ANSWER>); open, it runs to the end
_ANSWER_OPENING = re.compile(r"<\s*answer\s*>", re.I)
_ANSWER_CLOSING = re.compile(r"<\s*/\s*answer\s*>", re.I)
_MARKUP = re.compile(r"</?(?:b|strong|em|i|u|p|code|span|div|br|mark)\b[^<>]{0,40}>", re.I)  # <b>17</b>: 17
# "answer": value, a JSON object's answer field (o1-class models asked for JSON); a string or a number
_JSON_ANSWER = re.compile(r'"(?:final_answer|answer)"\s*:\s*("(?:[^"\\\n]|\\.){0,500}"'
                          r'|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)')
# what may close a response after its JSON answer field: the object's other plain fields, its closing, a code fence
_JSON_END = re.compile(r'(?:\s*,\s*"[^"\n]{1,40}"\s*:\s*(?:"(?:[^"\\\n]|\\.){0,200}"|[-+.\deE]+|true|false|null))*'
                       r'[\s,}\]`]*$')
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
    """The content of the last <answer>...</answer> in text[start:] (to the end when it is left open), without
    the HTML emphasis around it; else the value of the last JSON "answer" field there. None for a placeholder."""
    openings = list(_ANSWER_OPENING.finditer(text, start))
    if openings:
        closing = _ANSWER_CLOSING.search(text, openings[-1].end())
        content = _MARKUP.sub("", text[openings[-1].end():closing.start() if closing else len(text)]).strip()
    else:
        content = _json_answer(text, start)
    return None if content is None or _is_placeholder(content) else content


# 8+(-6) = 2, 3/24 = 1/8: a computation in numbers alone; where it is what a response gives as its answer (an answer
# tag or field holds it), its value is the last side (a check of an answer stated elsewhere is not one)
_ARITHMETIC = re.compile(r"(?=.*\d)(?:[\d\s+\-*/^().,{}]|\\(?:[dt]?frac|cdot|times|div|sqrt|left|right))+")


def _computed_value(answer: str) -> str:
    """The last side of a computation given as the answer ("8+(-6)=2" -> "2"); any other answer as it is."""
    sides = [side for side in (part.strip() for part in answer.split("=")) if side]
    if len(sides) > 1 and len(sides) == answer.count("=") + 1 and all(map(_ARITHMETIC.fullmatch, sides[:-1])):
        return sides[-1]
    return answer


def _json_answer(text: str, start: int) -> str | None:
    """The value of a JSON "answer" field that closes text[start:] (only the object's own closing may follow it:
    a field inside code, followed by more prose or a box, is not the response's answer)."""
    fields = list(_JSON_ANSWER.finditer(text, start))
    if not fields or not _JSON_END.fullmatch(text, fields[-1].end()):
        return None
    content = fields[-1].group(1)
    with contextlib.suppress(ValueError):  # a string's escapes ("\\frac" is \frac), or the number itself
        content = str(json.loads(content))
    return content.strip()


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
