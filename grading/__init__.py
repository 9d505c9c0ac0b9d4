"""The answer checker's internals, behind reward.py (its entry: extract_answer, is_equiv, math_reward,
choice_reward): `extract` finds the answer a response gives (the last \\boxed{...}, a final "Answer:" line, a
hedge) and `prose` reads the value a sentence states (numbers in words, truth values, options, a tool's output);
`grader` decides whether two answers are equal (normalisation, then sympy under a time bound), with `units` (the
unit an answer ends with) and `numerals` (plain numbers, exactly, and the precision a decimal states); `latex` is
the LaTeX / plain-text parser they stand on; `pool` runs the checks in killable, time-bounded workers."""
