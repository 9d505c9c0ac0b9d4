"""Every common way to state an answer (issues 26 and 62; docs/reward.md): the unboxed forms RL and evaluation
data use, repeating decimals, stray trailing marks, and boxes that are not answers. Verdicts are decided
by hand; where a case comes from another framework's format or tests, the comment names it."""

import pytest

from reward import extract_answer, math_reward

# (response, reference, hand verdict); each form has both verdicts
FORMS = {
    "a closing 'A: <number>' line (the few-shot Q:/A: format of grade-school math sets)": [
        ("Natalia sold 48 / 2 = 24 clips in May, 48 + 24 in all.\nA: 1,234", "1234", True),
        ("Natalia sold 48 / 2 = 24 clips in May, 48 + 24 in all.\nA: 1,234", "1243", False),
        ("So she has 5 + 7 = 12 left.\nA: $12", "12", True),
    ],
    # lm-evaluation-harness gsm8k-cot.yaml: strict-match "The answer is (\-?[0-9\.\,]+)." and generation stops
    # at "Q:"; a response that runs on into a question of its own is answered before it
    "few-shot 'The answer is N.' (lm-evaluation-harness gsm8k-cot)": [
        ("There are 15 trees. 21 - 15 = 6. The answer is 6.", "6", True),
        ("He pays 1,200 + 80 = 1,280 dollars. The answer is 1,280.", "1280", True),
        ("2 + 2 = 4. The answer is 4.\n\nQ: What is 3 + 4?\nA: 3 + 4 = 7. The answer is 7.", "4", True),
        ("2 + 2 = 4. The answer is 4.\n\nQ: What is 3 + 4?\nA: 3 + 4 = 7. The answer is 7.", "7", False),
    ],
    # verl reward_score/gsm8k.py ("#### " then the number, commas and $ removed)
    "GSM8K '####'": [
        ("She earns 12 * 90 = 1,080 dollars.\n#### $1,080", "1080", True),
        ("She earns 12 * 90 = 1,080 dollars.\n#### 1,080", "1008", False),
    ],
    # verl reward_score/math_dapo.py: the DAPO prompt's last line "Answer: $Answer", the last such line read
    "DAPO's 'Answer: ...' last line": [
        ("Let me compute.\n... so the sum is 34.\nAnswer: 34", "34", True),
        ("Answer: 12\nWait, I made an error.\nAnswer: 13", "12", False),
        ("... so it is one half.\nAnswer: $\\frac{1}{2}$", "0.5", True),
    ],
    # TinyZero / R1-Zero-style prompts: "<think> ... </think> <answer> ... </answer>"; the last two cases
    # are open-r1's tests/test_rewards.py (its format test's counting response; its accuracy test's 63/400)
    "<answer> tags": [
        ("<think>\nI will count each distinct object in the image:\n1. Purple scooter\n2. Red bicycle\n\n"
         "There are 9 distinct objects in total.\n</think>\n<answer>9</answer>", "9", True),
        ("\\boxed{\\frac{64}{400}}", "\\frac{63}{400}", False),
        ("<think>5 + 37 = 42</think> <answer>42</answer>", "42", True),
        ("<think>5 + 37 = 42</think> <answer>42</answer>", "43", False),
        ("<think>\nok\n</think>\n<answer>\nThe answer is $\\frac{3}{4}$\n</answer>", "0.75", True),
        ("<think>x</think><answer>\\boxed{7}</answer>", "7", True),
        ("<think>I get 41.</think> <answer>42", "42", True),  # cut off before </answer>
        ("<think>I think 41, so \\boxed{41}.</think> <answer>42</answer>", "41", False),
    ],
    # The same format as RL rollouts write it (issue 62): the tag spaced, in capitals, or with HTML emphasis
    # inside; a sentence or a worked computation in numbers ending in the value (the last side is the answer:
    # 2+2=5 answers 5, and an equation in a variable is not a computation)
    "<answer> tags as rollouts write them": [
        ("<think>I count them.</think>\n< answer > 42 </ answer >", "42", True),
        ("<think>I count them.</think>\n< answer > 42 </ answer >", "24", False),
        ("<think>ok</think> <ANSWER>7</ANSWER>", "7", True),
        ("<think>ok</think> <answer> <b>17</b> </answer>", "17", True),
        ("<think>ok</think> <answer>**<strong>17</strong>**</answer>", "71", False),
        ("<think>a_n = 4n - 2</think> <answer>Therefore, the 100th term is 402.</answer>", "402", True),
        ("<think>sum</think> <answer>$8+(-6)=2$</answer>", "2", True),
        ("<think>sum</think> <answer>$8+(-6)=2$</answer>", "14", False),
        ("<think>so</think> <answer>$3/24 = 1/8$</answer>", "\\frac{1}{8}", True),
        ("<think>so</think> <answer>$\\frac{3}{24} = \\frac{1}{8}$</answer>", "0.125", True),
        ("<think>so</think> <answer>$2+2=5$</answer>", "4", False),  # the value given is 5
        ("<think>so</think> <answer>$x+2=5$</answer>", "5", False),  # an equation, not a computation
        ("<think>so</think> <answer>x = 4</answer>", "4", True),
    ],
    # An answer field of a JSON object that closes the response (o1-class models asked to answer in JSON; the
    # closing code fence is not the answer); a field inside code that prose or a box follows is not the answer
    "a JSON object's answer field": [
        ('```json\n{"reasoning": "12 = 3 * 4", "answer": "12"}\n```', "12", True),
        ('```json\n{"reasoning": "12 = 3 * 4", "answer": "12"}\n```', "13", False),
        ('{"answer": 3.5, "confidence": 0.9}', "7/2", True),
        ('{"answer": 3.5, "confidence": 0.9}', "0.9", False),
        ('{"final_answer": "\\\\frac{1}{2}"}', "0.5", True),
        ('Try d = {"answer": 3} in code.\nSo the result is \\boxed{5}.', "3", False),
        ('Try d = {"answer": 3} in code.\nSo the result is \\boxed{5}.', "5", True),
    ],
    # Options up to J (MMLU-Pro's ten, TIGER-Lab/MMLU-Pro), each letter read alike in prose with parentheses;
    # a second letter named is a hedge; a bare F to J after an option's text may be a unit (farad to joule)
    "option letters A to J": [
        *[(f"Comparing them, the answer is ({letter}).", letter, True) for letter in "ABCDEFGHIJ"],
        ("Comparing them, the answer is (F).", "E", False),
        ("Comparing them, the answer is (F).", "(f)", True),
        ("The answer is (A) or (G).", "G", False),
        ("\\boxed{(C) 12 J}", "C", True),
        ("\\boxed{(C) or (H)}", "H", False),
    ],
    "the last sentence or an equation right after 'the answer is'": [
        ("Adding these gives the total. The answer is 18.", "18", True),
        ("So the answer is\n\\[\n\\frac{3}{4}\n\\]", "3/4", True),
        ("So the answer is \\[ x = 7 \\]", "7", True),
        ("So the answer is \\[ x = 7 \\]", "-7", False),
        ("所以答案是 $42$。", "42", True),  # Qwen2.5-Math's evaluation reads "答案是" (the answer is)
        ("The answer is $\\$18$.", "18", True),  # an escaped dollar sign is not a math delimiter
        ("The best answer is option B.", "B", True),  # lm-evaluation-harness mmlu_pro's "answer is (B)" family
        ("Comparing the four, the correct option is (B).", "B", True),
        ("Comparing the four, the correct option is (B).", "C", False),
    ],
    # the closing sentence of a word-problem solution, as chat models write it without a box
    "a closing sentence with one value after a verb of result": [
        ("16 - 3 - 4 = 9 eggs, and 9 * 2 = 18.\nJanet makes $18 every day at the farmers' market.", "18", True),
        ("16 - 3 - 4 = 9 eggs, and 9 * 2 = 18.\nJanet makes $18 every day at the farmers' market.", "9", False),
        ("So, she has 42 apples left.", "42", True),
        ("Adding up the items, the total cost is $42.", "42", True),
        ("That covers the even case. Let me now check 4 more cases.", "4", False),
        ("She sold 3 cups and made 12 dollars.", "12", False),  # two values: which one is meant is a guess
    ],
    "\\fbox": [
        ("So the total is \\fbox{7}.", "7", True),
        ("So the total is \\fbox{7}.", "8", False),
    ],
    "repeating decimals": [
        ("\\boxed{0.\\overline{3}}", "\\frac{1}{3}", True),
        ("\\boxed{0.333...}", "\\frac{1}{3}", True),
        ("The answer is 0.1666....", "\\frac{1}{6}", True),
        ("\\boxed{0.1666\\ldots}", "\\frac{1}{6}", True),
        ("\\boxed{0.3 \\text{ repeating}}", "\\frac{1}{3}", True),
        ("\\boxed{0.16 recurring}", "\\frac{16}{99}", True),
        ("\\boxed{0.(3)}", "\\frac{1}{3}", True),
        ("\\boxed{0.\\dot{3}}", "\\frac{1}{3}", True),
        ("\\boxed{0.\\dot{1}4285\\dot{7}}", "\\frac{1}{7}", True),
        ("\\boxed{0.\\bar{6}}", "\\frac{2}{3}", True),
        ("\\boxed{0.333...}", "\\frac{1}{4}", False),
        ("\\boxed{0.1666...}", "\\frac{1}{3}", False),
        ("\\boxed{0.(16)}", "\\frac{1}{6}", False),  # 0.161616..., not 0.1666...
        ("\\boxed{0.12...}", "\\frac{4}{33}", False),  # no period shown: 0.12 cut off, not 0.1212...
    ],
    "stray trailing backslashes and punctuation": [
        ("\\boxed{5\\\\}", "5", True),
        ("\\boxed{5 \\\\}", "5", True),
        ("So \\boxed{5}\\", "5", True),
        ("\\boxed{5,}", "5", True),
        ("\\boxed{5;}", "5", True),
        ("\\boxed{5\\\\}", "6", False),
        ("So \\boxed{5\\}", "5", True),  # a stray backslash on the closing brace
        ("So \\boxed{\\frac{1}{2}\\}.", "0.5", True),
        ("So \\boxed{5\\}", "6", False),
        ("\\boxed{5!}", "5", False),  # ! is a factorial, not punctuation
    ],
    # verl tests/utils/reward_score/test_numeric_canonicalization_on_cpu.py
    "leading zeros and signs (verl's numeric canonicalisation tests)": [
        ("\\boxed{033}", "33", True),
        ("\\boxed{+033}", "33", True),
        ("\\boxed{-0}", "0", True),
        ("\\boxed{000}", "0", True),
        ("\\boxed{033}", "3.3", False),
    ],
}


@pytest.mark.parametrize("response, reference, expected",
                         [case for cases in FORMS.values() for case in cases],
                         ids=[f"{kind}-{i}" for kind, cases in FORMS.items() for i in range(len(cases))])
def test_an_answer_stated_in_a_common_form_is_read(response, reference, expected):
    assert math_reward(response, reference) == float(expected)


# Boxes that are not answers: an empty box or a template's placeholder after a real answer does not erase it;
# with nothing else, it is no answer (docs/reward.md, "Boxes that are not answers").
@pytest.mark.parametrize("response, reference, expected", [
    ("So the total is \\boxed{5}.\n\nFinal answer: \\boxed{}", "5", True),
    ("So the total is \\boxed{5}. Template: \\boxed{[answer]}", "5", True),
    ("So the total is \\boxed{5}.\n\nAnswer: $\\boxed{\\text{your answer here}}$", "5", True),
    ("So the total is \\boxed{5}. \\boxed{ANSWER}", "5", True),
    ("So the total is \\boxed{5}. \\boxed{...}", "5", True),
    ("<answer>42</answer>\n\\boxed{}", "42", True),
    ("<answer>answer here</answer> so the total is \\boxed{42}", "42", True),
    ("So the total is \\boxed{6}. \\boxed{}", "5", False),
    ("\\boxed{}", "", False),
    ("\\boxed{[answer]}", "answer", False),
])
def test_a_box_with_no_answer_is_not_the_answer(response, reference, expected):
    assert math_reward(response, reference) == float(expected)


@pytest.mark.parametrize("text, expected", [
    ("The total is \\boxed{5}. Put it in \\boxed{}.", "5"),
    ("\\boxed{[answer]}", None),
    ("\\boxed{}", None),
    ("\\boxed{x}", "x"),  # one letter is an answer, not a placeholder
])
def test_extract_answer_skips_placeholder_boxes(text, expected):
    assert extract_answer(text) == expected


# An answer inside <think> followed by a different one after it: the later one is the answer (the thinking is
# a draft), whether boxed or stated. DeepScaleR's reward (verl reward_score/deepscaler_math) grades only the
# text after </think>; we also read the thinking's last box when nothing follows it.
@pytest.mark.parametrize("response, reference, expected", [
    ("<think>\\boxed{5}</think> The answer is \\boxed{6}", "6", True),
    ("<think>\\boxed{5}</think> The answer is \\boxed{6}", "5", False),
    ("<think>So it is \\boxed{5}.</think>\n\nThe answer is 6.", "6", True),
    ("<think>So it is \\boxed{5}.</think>\n\nThe answer is 6.", "5", False),
    ("<think>So it is \\boxed{5}.</think>", "5", True),
])
def test_the_answer_after_the_thinking_wins(response, reference, expected):
    assert math_reward(response, reference) == float(expected)
