"""The answer checker's internals, behind reward.py (its entry: extract_answer, is_equiv, math_reward,
choice_reward): `extract` finds the answer a response gives (the last \\boxed{...}, a final "Answer:" line, a
hedge), `grader` decides whether two answers are equal (normalisation, then sympy under a time bound), `latex`
is the LaTeX / plain-text parser both stand on."""
