"""Hedging earns nothing (issue 26; docs/reward.md, "Hedging"): where the reference is one value, a final
answer that names more than one distinct candidate scores 0, and a letter reference matches a letter
answer with nothing added. Adversarial responses written for this rule, with hand verdicts; each kind has a
control that must still score 1 (the rule must not cost right answers)."""

import pytest

from reward import choice_reward, math_reward

# (response, reference): every one names several candidates for a one-letter (multiple-choice) reference
LETTER_HEDGES = [
    ("So the answer is \\boxed{A, B}.", "A"),
    ("So the answer is \\boxed{A+1}.", "A"),
    ("Answer: A, C", "A"),
    ("Answer: A, C", "C"),
    ("The answer is (A) and (B).", "A"),
    ("The answer is B or C.", "B"),
    ("The answer is B or C.", "C"),
    ("\\boxed{B \\text{ or } C}", "B"),
    ("\\boxed{A/B}", "A"),
    ("\\boxed{AB}", "A"),
    ("Either \\boxed{A} or \\boxed{B}.", "A"),
    ("Either \\boxed{A} or \\boxed{B}.", "B"),
    ("\\boxed{(A)} \\boxed{(B)}", "B"),
    ("\\boxed{A, B, C, D}", "C"),
    ("The answer is (A), (B) or (C).", "C"),
    ("\\boxed{\\text{(A) and (B)}}", "A"),
    ("\\boxed{(A) 3 (B) 4}", "B"),
]

# (response, reference): several candidates for a reference of one value
VALUE_HEDGES = [
    ("So \\boxed{3} or \\boxed{4}.", "4"),
    ("So \\boxed{3} or \\boxed{4}.", "3"),
    ("\\boxed{3} \\boxed{4}", "4"),
    ("The value is $\\boxed{3}$, $\\boxed{4}$", "3"),
    ("x = \\boxed{3} \\text{ or } x = \\boxed{4}", "4"),
    ("\\boxed{4} or \\boxed{-4}", "4"),
    ("</think>\n\\boxed{3}\n\nor maybe \\boxed{4}", "4"),
    ("\\boxed{3, 4}", "4"),
    ("\\boxed{3 \\text{ or } 4}", "4"),
    ("\\boxed{\\frac{1}{2} \\text{ or } \\frac{1}{3}}", "\\frac{1}{2}"),
    ("The answer is 3 or 4.", "4"),
    ("The answer is $3$ or $4$.", "3"),
    ("Answer: 3, 4, or 5", "4"),
    ("#### 3 or 4", "4"),
    ("<answer>3 or 4</answer>", "4"),
    ("\\boxed{1, 2, 3, 4, 5, 6, 7, 8, 9}", "4"),
    ("\\boxed{x = 4, y = 5}", "4"),
    ("\\boxed{\\pm 4}", "4"),
    ("\\boxed{4 \\pm 1}", "4"),
    # ranges and sets that contain the answer
    ("\\boxed{\\{3, 4\\}}", "4"),
    ("\\boxed{[3, 5]}", "4"),
    ("\\boxed{(3, 5)}", "4"),
    ("\\boxed{3 \\le x \\le 5}", "4"),
    ("\\boxed{x > 3}", "4"),
    ("\\boxed{x \\in \\mathbb{R}}", "4"),
    ("\\boxed{\\mathbb{R}}", "4"),
    ("\\boxed{(-\\infty, \\infty)}", "4"),
    ("\\boxed{\\text{any real number}}", "4"),
    ("The answer is any real number.", "4"),
    ("\\boxed{\\text{all integers}}", "4"),
    # another value offered after the final answer, on its line
    ("So the count is $\\boxed{9}$, or possibly $10$.", "9"),
    ("\\boxed{9}. Or maybe 10.", "9"),
    ("\\boxed{9} (or \\boxed{10} if the last one counts)", "9"),
    ("Final answer: 9 (or 10 if we include both ends)", "9"),
    ("Answer: 9, or 10 with the endpoints.", "9"),
    ("The answer is $9$ or perhaps $10$.", "9"),
    ("#### 9 or else 10", "9"),
    ("The answer is \\(\\frac{1}{2}\\), alternatively \\(\\frac{1}{3}\\).", "\\frac{1}{2}"),
]


@pytest.mark.parametrize("response, reference", LETTER_HEDGES + VALUE_HEDGES)
def test_a_hedge_scores_nothing(response, reference):
    assert math_reward(response, reference) == 0.0


@pytest.mark.parametrize("response, reference", [
    ("Answer: A, C", "A"),
    ("Answer: B or C", "B"),
    ("Answer: (A) and (B)", "A"),
    ("Answer: A/B", "A"),
    ("After all that, I pick\nA or B", "A"),
    ("So \\boxed{A, B}", "A"),
    ("Answer: A\n\nOn reflection: \\boxed{\\text{A or C}}", "A"),
    ("So \\boxed{C} and \\boxed{D}", "D"),
])
def test_a_multiple_choice_hedge_scores_nothing(response, reference):
    assert choice_reward(response, reference) == 0.0


@pytest.mark.parametrize("response, reference", [
    ("So the answer is \\boxed{(C)}.", "C"),
    ("So the answer is \\boxed{\\text{C}}.", "C"),
    ("So the answer is \\boxed{\\textbf{(C)}}.", "C"),
    ("So the answer is \\boxed{(C) 12}.", "C"),  # the option's text after its letter adds no candidate
    ("**Answer: C**", "C"),
    ("\\boxed{C}", "(C)"),
])
def test_a_letter_alone_still_scores(response, reference):
    assert math_reward(response, reference) == 1.0


@pytest.mark.parametrize("response, reference", [
    ("Answer: **C**", "C"),
    ("Answer: (C)", "C"),
    ("Answer: C, because the others fail.", "C"),
    ("\\boxed{C} \\boxed{C}", "C"),
])
def test_a_multiple_choice_letter_alone_still_scores(response, reference):
    assert choice_reward(response, reference) == 1.0


@pytest.mark.parametrize("response, reference", [
    # one value written twice is one candidate (MATH-500's own solution for \frac{639}{40} does this)
    ("$d = \\boxed{15\\frac{39}{40}},$ or $\\boxed{\\frac{639}{40}}$ inches.", "\\frac{639}{40}"),
    ("\\boxed{4} and again \\boxed{4}", "4"),
    # list, set and tuple references are compared as lists, as before
    ("\\boxed{3} and \\boxed{4}", "3, 4"),
    ("\\boxed{3 \\text{ or } 4}", "3, 4"),
    ("The roots are \\boxed{-4} and \\boxed{4}.", "\\pm 4"),
    ("\\boxed{[3, 5]}", "[3, 5]"),
    # a correction is not a hedge: words other than "or"/"and" between the boxes
    ("\\boxed{3}. Hmm, no: I dropped a sign, so \\boxed{4}", "4"),
    # an alternative that is the same value, or no value at all, is no hedge
    ("Answer: 9 (or 9.0 as a decimal)", "9"),
    ("\\boxed{\\frac{1}{2}}, or equivalently $0.5$.", "\\frac{1}{2}"),
    ("\\boxed{9} or more precisely exactly nine.", "9"),
    ("\\boxed{100} or more", "100"),
])
def test_one_value_or_a_list_reference_still_scores(response, reference):
    assert math_reward(response, reference) == 1.0
