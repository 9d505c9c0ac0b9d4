"""Answers stated the way models state them outside a box (issue 45; docs/reward.md): references that name
their left-hand side or an approximation, prose after a tool's output, truth values and options in a sentence,
quantities with units in a sentence, and a benchmark's numeric tolerance. Every kind is decided both ways,
with hedges (several answers, an answer then its negation, a list of candidates) among the wrong ones.

The corpus is ours, built from public sources: the facts (questions, reference answers, what a model
answered and how it phrased it) carry over, the sentences are written here. Sources, by the key each case names:
- TheoremQA: github.com/TIGER-AI-Lab/TheoremQA at acfc968, theoremqa_test.json (reference answers, cited by
  question id) and outputs/*.jsonl (Mistral-7B and InternLM2-20B answers: how they state True / False, options,
  quantities); its grader utils.py (extract_theoremqa_answer, compare_answer_with_groundtruth) and number_utils.py
  (within_eps: 4% relative tolerance).
- ToRA: github.com/microsoft/ToRA at 213c1c9, src/outputs/llm-agents/tora-70b-v1.0/gsm8k/
  test_tora_-1_seed0_t0.0_s0_e1319.jsonl (ToRA-70B on GSM8K, cited by idx: a program, its output block, then a
  sentence, some with the number in words) and src/utils/parser.py (extract_program_output).
- OlympiadBench: github.com/OpenBMB/OlympiadBench at ba5b26a, eval/scoring_examples.json (reference answers
  with their left-hand sides and the published verdicts) and inference/code/evaluators/evaluator.py (the physics
  prompt: "So the final answer is \\boxed{answer}(unit)", the unit outside the box).
- issue 45: the examples in the issue's text.
"""

import json
import time

import pytest

import eval as E
from grading.extract import candidate_answers
from grading.grader import equivalent
from reward import RewardPool


def tora(program: str, output: str, closing: str) -> str:
    """A response in ToRA's tool-integrated format: a program, its output block, then the closing prose."""
    return f"```python\n{program}\n```\n```output\n{output}\n```\n{closing}"


TRUCKS = "flagstones = 80\nweight = 75 * flagstones\ntrucks = weight / 2000\nprint(math.ceil(trucks))"
CONTAINERS = "vehicles_day_one = 2 * 5\nprint((30 - vehicles_day_one) / 5)"
SPOOLS = "blue = 15 + 45\nprint(blue / (15 + 45 + 40 + 50) * 100)"

LHS = "reference names its left-hand side or an approximation"
TOOL = "prose after a tool's output"
TRUTH = "true / false, yes / no in a sentence"
UNITS = "quantity with a unit in a sentence"
OPTION = "option in prose"
OLB_PAIRS = "OlympiadBench scoring_examples.json"
RECOIL = "\\Delta p\\approx -\\frac{\\hbar \\omega_{L}}{c}"  # references with a left-hand side or an approximation
SHIFT = "\\Delta E \\approx -\\frac{\\hbar \\omega_0}{2}"
RANGE = "x_{\\max }=\\frac{v^2_0 \\sqrt{2}}{g}"

# (response, reference, expected, kind, source)
CORPUS = [
    # ---- references that name their left-hand side (I_max = ...), an approximation (\Delta E \approx ...)
    ("So the final answer is $\\boxed{\\frac{q_0}{\\sqrt{2CL}}}$.", "$I_{\\max }=\\frac{q_{0}}{\\sqrt{2 L C}}$", True,
     LHS, OLB_PAIRS),
    ("So the final answer is $\\boxed{\\frac{q_0}{\\sqrt{LC}}}$.", "$I_{\\max }=\\frac{q_{0}}{\\sqrt{2 L C}}$", False,
     LHS, OLB_PAIRS),
    ("So the final answer is $\\boxed{-\\frac{\\omega_{L} \\hbar}{c}}$.", RECOIL,
     True, LHS, OLB_PAIRS),
    ("So the final answer is $\\boxed{\\frac{\\omega_{L} \\hbar}{c}}$.", RECOIL,
     False, LHS, OLB_PAIRS),
    ("The recoil is $\\boxed{\\Delta p = -\\frac{\\hbar\\omega_L}{c}}$.", RECOIL,
     True, LHS, OLB_PAIRS),
    ("So the final answer is $\\boxed{\\frac{1}{2} \\hbar \\omega_{L}^{\\prime} \\frac{v}{c}}$.",
     "a = +\\frac{1}{2} \\hbar \\omega_{L}^{\\prime} \\frac{v}{c}", True, LHS, OLB_PAIRS),
    ("So the final answer is $\\boxed{\\frac{1}{2} \\hbar \\omega_{L} \\frac{v}{c}}$.",
     "a = +\\frac{1}{2} \\hbar \\omega_{L}^{\\prime} \\frac{v}{c}", False, LHS, OLB_PAIRS),
    ("So the final answer is $\\boxed{n_{\\gamma}(\\nu) = \\frac{2 \\pi A R_{\\odot}^2}{d_{\\odot}^2} \\left( "
     "\\frac{\\nu^2}{c^2} \\right) e^{ \\frac{-h \\nu}{k_B T_s}}}$.",
     "n_{\\gamma}(\\nu)=A \\frac{R_{\\odot}^{2}}{d_{\\odot}^{2}} \\frac{2 \\pi}{c^{2}} \\nu^{2} "
     "e^{\\frac{-h \\nu}{ k_{\\mathrm{B}} T_{\\mathrm{s}}}}", True, LHS, OLB_PAIRS),
    ("So the final answer is $\\boxed{\\frac{2 \\pi A R_{\\odot}^2 \\nu^2}{d_{\\odot}^2 c^2} e^{-h \\nu / (k_B T)}}$.",
     "n_{\\gamma}(\\nu)=A \\frac{R_{\\odot}^{2}}{d_{\\odot}^{2}} \\frac{2 \\pi}{c^{2}} \\nu^{2} "
     "e^{\\frac{-h \\nu}{ k_{\\mathrm{B}} T_{\\mathrm{s}}}}", False, LHS, OLB_PAIRS),
    ("So the final answer is $\\boxed{(\\frac{v^2_0 \\sqrt{2}}{g}-\\frac{v^2_0}{5g\\pi },\\frac{\\sqrt{2}v^2_0}{g}"
     "+\\frac{v^2_0}{4g},-\\frac{v^2_0}{5g \\pi})}$.",
     "(\\frac{\\sqrt{2}v^2_0}{g}-\\frac{v^2_0}{5\\pi g},\\frac{\\sqrt{2}v^2_0}{g}+\\frac{v^2_0}{4g},"
     "-\\frac{v^2_0}{5\\pi g})", True, LHS, OLB_PAIRS),
    ("So the final answer is $\\boxed{\\sqrt{\\frac{2hg}{3}}}$.", "v_{\\max} = \\sqrt{\\frac{2 g h}{3}}", True, LHS,
     "issue 45"),
    ("So the final answer is $\\boxed{\\sqrt{\\frac{2gh}{5}}}$.", "v_{\\max} = \\sqrt{\\frac{2 g h}{3}}", False, LHS,
     "issue 45"),
    ("Energy conservation gives the top speed, $v_{\\max} = \\sqrt{2gh/3}$.", "v_{\\max} = \\sqrt{\\frac{2 g h}{3}}",
     True, LHS, "issue 45"),
    ("So the final answer is $\\boxed{-\\frac{\\hbar \\omega_0}{2}}$.", SHIFT,
     True, LHS, "issue 45"),
    ("So the final answer is $\\boxed{\\frac{\\hbar \\omega_0}{2}}$.", SHIFT,
     False, LHS, "issue 45"),
    ("So the final answer is $\\boxed{\\frac{1}{2} m r \\omega^{2}}$.", "F = +\\frac{1}{2} m \\omega^2 r", True, LHS,
     "issue 45"),
    ("So the final answer is $\\boxed{\\frac{1}{2} m r \\omega}$.", "F = +\\frac{1}{2} m \\omega^2 r", False, LHS,
     "issue 45"),
    ("So the final answer is $\\boxed{\\frac{3}{2} k_B T}$.", "\\frac{3}{2} k_{\\mathrm{B}} T", True, LHS, "issue 45"),
    ("So the final answer is $\\boxed{\\frac{3}{2} k_{\\mathrm{B}} T}$.", "\\frac{5}{2} k_B T", False, LHS, "issue 45"),
    ("So the final answer is $\\boxed{2 \\pi \\sqrt{\\frac{m}{k}}}$.", "T=2 \\pi \\sqrt{\\frac{m}{k}}", True, LHS,
     "OlympiadBench scoring_examples.json (the form)"),
    ("So the final answer is $\\boxed{2 \\pi \\sqrt{\\frac{m}{k}}}$.", "T=2 \\pi \\sqrt{\\frac{k}{m}}", False, LHS,
     "OlympiadBench scoring_examples.json (the form)"),
    ("So the final answer is $\\boxed{\\frac{\\mu_0 I}{2 \\pi r}}$.", "B=\\frac{\\mu_{0} I}{2 \\pi r}", True, LHS,
     "OlympiadBench scoring_examples.json (the form)"),
    ("So the final answer is $\\boxed{\\frac{\\mu_0 I}{2 r}}$.", "B=\\frac{\\mu_{0} I}{2 \\pi r}", False, LHS,
     "OlympiadBench scoring_examples.json (the form)"),
    ("So the final answer is $\\boxed{\\frac{q}{4 \\pi \\varepsilon_0 r^2}}$.",
     "E=\\frac{q}{4 \\pi \\varepsilon_{0} r^{2}}", True, LHS, "OlympiadBench scoring_examples.json (the form)"),
    ("So the final answer is $\\boxed{\\frac{\\sqrt{2} v_0^2}{g}}$.", RANGE, True, LHS,
     "OlympiadBench scoring_examples.json (v^2_0)"),
    ("So the final answer is $\\boxed{\\frac{\\sqrt{2} v_0}{g}}$.", RANGE, False, LHS,
     "OlympiadBench scoring_examples.json (v^2_0)"),
    ("So the final answer is $\\boxed{0.6400}$ N.", "0.64N", True, LHS, OLB_PAIRS),
    ("So the final answer is $\\boxed{0.64}$.", "0.64N", False, LHS, OLB_PAIRS),

    # ---- prose after a tool's output (ToRA): the output says which of the sentence's numbers is the answer
    (tora(TRUCKS, "3", "So three trucks are enough to carry all 80 flagstones in one trip."), "3", True, TOOL,
     "ToRA gsm8k idx 288"),
    (tora(TRUCKS, "4", "Four trucks are needed to carry the 80 flagstones in one trip."), "3", False, TOOL,
     "ToRA gsm8k idx 288"),
    (tora(TRUCKS, "3", "Either 3 or 4 trucks will do for the 80 flagstones."), "3", False, TOOL,
     "ToRA gsm8k idx 288 (a hedge)"),
    (tora(CONTAINERS, "4.0", "On the second day, four containers came in."), "4", True, TOOL, "ToRA gsm8k idx 118"),
    (tora(CONTAINERS, "4.0", "Four containers arrived on the second day."), "5", False, TOOL, "ToRA gsm8k idx 118"),
    (tora("print(4 * 3 - 5 - 3 + 3 * (4 * 3 - 5) ... )", "19", "19 customers were asked to leave for other reasons."),
     "19", True, TOOL, "ToRA gsm8k idx 367"),
    (tora("guests = 40\nprint(guests - 36 // 2)", "20", "20 guests went without a second hot dog."), "26", False,
     TOOL, "ToRA gsm8k idx 428 (the model's wrong answer)"),
    (tora("riders = 100 * 0.25\nprint(int(riders - riders * 0.6))", "10", "Ten of the men stay on their boards."),
     "10", True, TOOL, "ToRA gsm8k idx 630"),
    (tora("offers = 100 * 0.3 * 0.2\nprint(int(offers / 3))", "2", "Two applicants take the job."), "2", True, TOOL,
     "ToRA gsm8k idx 718"),
    (tora("offers = 100 * 0.3 * 0.2\nprint(int(offers / 3))", "2", "Two applicants take the job."), "3", False, TOOL,
     "ToRA gsm8k idx 718"),
    (tora(SPOOLS, "40.0", "40% of the spools Candy owns are blue."), "40", True, TOOL, "ToRA gsm8k idx 728"),
    (tora(SPOOLS, "40.0", "40% of the spools Candy owns are blue."), "60", False, TOOL, "ToRA gsm8k idx 728"),
    (tora("rest = 20 * 0.8\nprint(rest * 0.75 / 20 * 100)", "60.0", "Hip-hop dance has 60% of the class."), "60",
     True, TOOL, "ToRA gsm8k idx 14"),
    (tora("rest = 50 - 50 * 0.2\nprint(rest - rest * 0.6)", "16.0", "Sixteen people are betting on horse #12."),
     "16", True, TOOL, "ToRA gsm8k idx 760"),
    (tora("rest = 50 - 50 * 0.2\nprint(rest - rest * 0.6)", "16.0", "Sixteen people are betting on horse #12."),
     "12", False, TOOL, "ToRA gsm8k idx 760 (the distractor)"),
    (tora("print(30 - 20 - 5)", "5", "5 cars went through during the first 15 minutes."), "5", True, TOOL,
     "ToRA gsm8k idx 98"),
    (tora("print(30 - 20 - 5)", "5", "After the 5 exits, 20 cars remained in the jam."), "5", False, TOOL,
     "ToRA gsm8k idx 98 (the output restated in passing)"),
    (tora("print(500 + 3 * 500 + 500 / 4)", "2125.0", "Let me double-check the second set.\n```python\nprint(3 * 500"),
     "2125", False, TOOL, "ToRA gsm8k idx 146 (cut off in code)"),
    (tora("print(16 - 3 - 4)", "9", "The output is 9, but that is not the answer: the answer is not 9."), "9", False,
     TOOL, "ToRA gsm8k idx 0 (an answer then its negation)"),
    (tora("print((16 - 3 - 4) * 2)", "18", "So Janet makes $16 every day at the market."), "16", True, TOOL,
     "ToRA gsm8k idx 0 (the prose's value is the one committed to)"),
    (tora("print((16 - 3 - 4) * 2)", "18", "So Janet makes $16 every day at the market."), "18", False, TOOL,
     "ToRA gsm8k idx 0 (the prose's value is the one committed to)"),
    (tora("print(12 * 2 + 1)", "25", "Twenty-five students signed up for the trip."), "25", True, TOOL,
     "ToRA outputs (a compound number in words)"),
    (tora("print(12 * 2 + 1)", "25", "Twenty-five students signed up for the trip."), "52", False, TOOL,
     "ToRA outputs (a compound number in words)"),
    (tora("print(0.45)", "0.45", "45% of the members voted yes."), "45", True, TOOL, "issue 45"),
    (tora("print(0.45)", "0.45", "45% of the members voted yes."), "0.55", False, TOOL, "issue 45"),
    (tora("print(7)", "7", "Seven boxes were shipped."), "7", True, TOOL, "issue 45"),
    (tora("print(7)", "7", "Seven or eight boxes were shipped."), "7", False, TOOL, "issue 45 (a hedge)"),
    (tora("print(3)", "3", "Three students passed the test."), "3", True, TOOL, "issue 45"),
    (tora("print(3)", "3", "Three students passed the test."), "4", False, TOOL, "issue 45"),
    (tora("print(2 * 4)", "8", "The candle ends up 8 centimeters shorter."), "8", True, TOOL, "ToRA gsm8k idx 23"),
    (tora("print(19.5 / 0.75)", "26.0", "So the book originally cost $26."), "26", True, TOOL, "ToRA gsm8k idx 24"),
    (tora(TRUCKS, "3", "Three trucks, or maybe four, are needed."), "3", False, TOOL, "ToRA gsm8k idx 288 (a hedge)"),
    (tora(TRUCKS, "3", "So 3 trucks are needed. Actually, 4 trucks are needed."), "3", False, TOOL,
     "ToRA gsm8k idx 288 (the last committed answer)"),
    (tora(TRUCKS, "3", "This gives 3, which is wrong."), "3", False, TOOL,
     "ToRA gsm8k idx 288 (an answer then its negation)"),

    # ---- truth values stated in a sentence (TheoremQA's bool answers)
    ("W is not closed under multiplication by -1. Therefore, W is not a subspace of R^2.", "False", True, TRUTH,
     "TheoremQA: Is W = {[x, y]: x >= 0, y >= 0} a subspace of R^2?"),
    ("Since (1, 1) is in W but -(1, 1) is not, the claim fails: W is not a subspace of R^2, so the statement is "
     "false.", "True", False, TRUTH, "TheoremQA: Is W = {[x, y]: x >= 0, y >= 0} a subspace of R^2?"),
    ("By Euler's formula a planar graph with 200 vertices has at most 396 faces, so the statement is false: no "
     "such graph exists.", "False", True, TRUTH, "TheoremQA: a planar graph with 200 vertices and 400 faces"),
    ("Yes: (1, 2, 3, ...) = T(0, 1, 2, 3, ...), so the sequence is in the image of T.", "True", True, TRUTH,
     "TheoremQA: Is the sequence (1,2,3,...) in the image of T?"),
    ("The signal is at 500 Hz and the Nyquist frequency is 350 Hz, so aliasing occurs.\nThe answer is Yes.", "True",
     True, TRUTH, "TheoremQA: sampling cos(1000 pi t) at 700 Hz"),
    ("Sampling at 2000 Hz is more than twice 500 Hz, so aliasing does not occur.", "False", True, TRUTH,
     "TheoremQA: sampling cos(1000 pi t) at 2000 Hz"),
    ("Sampling at 2000 Hz is more than twice 500 Hz, so aliasing does not occur.", "True", False, TRUTH,
     "TheoremQA: sampling cos(1000 pi t) at 2000 Hz"),
    ("p(0) = -1 < 0 < 1 = p(1), so the statement is true: such a root exists.", "True", True, TRUTH,
     "TheoremQA: Does p(x) = x^5 + x - 1 have any real roots?"),
    ("A 40 dB increase is a factor of 10^4 in intensity. Therefore, 80 dB is not twice as loud as 40 dB.", "False",
     True, TRUTH, "TheoremQA: Is 80 dB twice as loud as 40 dB?"),
    ("f(1) = 2 + 3 - 5 + 7 = 7, which is not zero, hence x - 1 is not a factor.", "False", True, TRUTH,
     "TheoremQA: Is x-1 a factor of 2*x^4+3*x^2-5x+7?"),
    ("Three vectors in R^2 are always dependent, so no, they are not linearly independent.", "False", True, TRUTH,
     "TheoremQA: Are the vectors [1, 2], [2, 3], and [3, 4] linearly independent?"),
    ("Three vectors in R^2 are always dependent, so no, they are not linearly independent.", "True", False, TRUTH,
     "TheoremQA: Are the vectors [1, 2], [2, 3], and [3, 4] linearly independent?"),
    ("Its derivative is bounded by 1, so f is uniformly continuous on R; the answer is yes.", "True", True, TRUTH,
     "TheoremQA: Is f(x) = x^3 / (1 + x^2) uniformly continuous on R?"),
    ("D_4 is not abelian and Z_4 x Z_2 is, so the two groups are not isomorphic.", "False", True, TRUTH,
     "TheoremQA: Are groups Z_4 * Z_2 and D_4 isomorphic?"),
    ("The function is undefined at x = 0, so the claim is false.", "False", True, TRUTH,
     "TheoremQA: Is f(x) = sin(x) / |x| continuous everywhere?"),
    ("Since 8^2 = 64 = 3 * 19 + 7, the statement is true.", "True", True, TRUTH,
     "TheoremQA: Is 7 a quadratic residue modulo 19?"),
    ("Since 8^2 = 64 = 3 * 19 + 7, the statement is true.", "False", False, TRUTH,
     "TheoremQA: Is 7 a quadratic residue modulo 19?"),
    ("The feedback term makes the impulse response infinite; therefore the system is not an FIR filter.", "False",
     True, TRUTH, "TheoremQA: y[n]+0.5 y[n-1]=x[n]-x[n-2]: Is the system a FIR filter?"),
    ("Both directions follow from the separating hyperplane theorem.\nThe answer is True.", "True", True, TRUTH,
     "TheoremQA: linearly separable iff the convex hulls are disjoint"),
    ("The mutual information between n-blocks is bounded by the entropy, so the statement is false.", "False", True,
     TRUTH, "TheoremQA: the dependence between adjacent n-blocks grows linearly with n"),
    ("The answer is No.", "False", True, TRUTH, "TheoremQA outputs (Mistral-7B: 'The answer is No.')"),
    ("Hence there is an eigenbasis for the identity matrix.\nThe answer is Yes.", "True", True, TRUTH,
     "TheoremQA outputs (Mistral-7B: 'The answer is Yes.')"),
    ("Hence there is an eigenbasis for the identity matrix.\nThe answer is Yes.", "False", False, TRUTH,
     "TheoremQA outputs (Mistral-7B: 'The answer is Yes.')"),
    ("Therefore, it could be true or false depending on the choice of n.", "True", False, TRUTH,
     "TheoremQA (a hedge)"),
    ("The statement is true. Actually, for n = 1 it fails, so the statement is false.", "True", False, TRUTH,
     "TheoremQA (the last committed answer)"),
    ("The statement is true. Actually, for n = 1 it fails, so the statement is false.", "False", True, TRUTH,
     "TheoremQA (the last committed answer)"),
    ("Therefore, it is not possible to determine whether the series converges.", "False", False, TRUTH,
     "TheoremQA outputs (InternLM2: 'it is impossible to say for certain')"),
    ("The answer is True.\nThe answer is not True.", "True", False, TRUTH, "TheoremQA (an answer then its negation)"),
    ("The answer is True.\nThe answer is not True.", "False", True, TRUTH, "TheoremQA (an answer then its negation)"),
    ("Yes and no: it depends on the field.", "True", False, TRUTH, "TheoremQA (a hedge)"),
    ("Therefore, the series does not", "False", False, TRUTH, "TheoremQA outputs (cut off mid-sentence)"),
    ("Therefore, the series does not converge.", "False", True, TRUTH, "issue 45"),
    ("So the statement is not true.", "True", False, TRUTH, "issue 45"),
    ("So the statement is not true.", "False", True, TRUTH, "issue 45"),
    ("The answer is $\\boxed{\\text{No}}$.", "False", True, TRUTH, "TheoremQA (a boxed No)"),
    ("The answer is True (or False if n is even).", "True", False, TRUTH, "TheoremQA (an alternative after)"),
    ("Therefore, the statement is true, but it is also false.", "True", False, TRUTH, "TheoremQA (a hedge)"),
    ("The answer is True, which is wrong.", "True", False, TRUTH, "TheoremQA (an answer then its negation)"),
    ("Therefore, there is no need to go further.", "False", False, TRUTH, "TheoremQA (no verdict: an idiom)"),
    ("Therefore, we cannot simplify further.", "False", False, TRUTH, "TheoremQA (no verdict: what we do)"),

    # ---- quantities with units in a sentence (TheoremQA physics answers; OlympiadBench writes units apart)
    ("lambda = v / f = 1480 / 262. Therefore, the wavelength of the 262-Hz sonar wave in water is 5.65 m.", "5.65",
     True, UNITS, "TheoremQA panlu/wave_length1.json"),
    ("lambda = v / f = 1480 / 262. Therefore, the wavelength of the 262-Hz sonar wave in water is 5.56 m.",
     "5.65 \\mathrm{~m}", False, UNITS, "TheoremQA panlu/wave_length1.json (a wrong value, the right unit)"),
    ("E = hc / lambda = 3.10 eV, so the stopping potential is about 0.17 V.", "0.17", True, UNITS,
     "TheoremQA tonyxia/photoelectric2.json"),
    ("E = hc / lambda = 3.10 eV, so the stopping potential is about 0.17 V.", "0.71", False, UNITS,
     "TheoremQA tonyxia/photoelectric2.json"),
    ("Balancing torques about the top of the ladder, the force on its base has a magnitude of 1020 N.",
     "1020 \\mathrm{~N}", True, UNITS, "TheoremQA panlu/rigid-body1.json"),
    ("The binding energy of the helium-4 nucleus is therefore 28.3 MeV.", "28.3 \\mathrm{~MeV}", True, UNITS,
     "TheoremQA tonyxia/relativity3.json"),
    ("The binding energy of the helium-4 nucleus is therefore 28.3 keV.", "28.3 \\mathrm{~MeV}", False, UNITS,
     "TheoremQA tonyxia/relativity3.json (the wrong unit)"),
    ("With k = 1100 N/m, the bungee cord will have stretched by 0.602 m.", "0.602", True, UNITS,
     "TheoremQA xinyi/potential_energy.json"),
    ("Energy conservation gives v^2 = 0.09, and its x-velocity at x = 0.080 m is -0.3 m/s.", "-0.3", True, UNITS,
     "TheoremQA panlu/work_energy1.json"),
    ("Energy conservation gives v^2 = 0.09, and its x-velocity at x = 0.080 m is 0.3 m/s.", "-0.3", False, UNITS,
     "TheoremQA panlu/work_energy1.json (the sign)"),
    ("v = sqrt(8RT / (pi M)), and the mean molecular speed of radon comes out to 167 m/s.", "167.0", True, UNITS,
     "TheoremQA tonyxia/statisticalphysics4.json"),
    ("The incident radiation must have a wavelength of 0.098 nm.", "0.098", True, UNITS,
     "TheoremQA tonyxia/wave1.json"),
    ("The incident radiation must have a wavelength of 0.098 nm or 0.196 nm.", "0.098", False, UNITS,
     "TheoremQA tonyxia/wave1.json (a hedge)"),
    ("f = (1 / 2 pi) sqrt(k / m), so the oscillation frequency is 0.9 Hz.", "0.9 \\mathrm{~Hz}", True, UNITS,
     "TheoremQA panlu/angular_frequency3.json"),
    ("The coffee and the milk settle at an equilibrium temperature of 66.0 °C.", "66.0", True, UNITS,
     "TheoremQA panlu/molar_heat_capacity1.json"),
    ("With a gap of 1.1 eV, the photon needs a wavelength of 1130 nm.", "1130.0", True, UNITS,
     "TheoremQA tonyxia/semiconductor3.json"),
    ("Thus the rod stretches by 2.4 mm.", "2.4 \\mathrm{~mm}", True, UNITS, "issue 45"),
    ("Thus the rod stretches by 2.4 mm, which is 0.0024 m.", "2.4", True, UNITS, "issue 45 (a restatement after)"),
    ("Thus the rod stretches by 2.4 cm.", "2.4 \\mathrm{~mm}", False, UNITS, "issue 45 (the wrong unit)"),
    ("Thus the rod stretches by 2.4 mm or 2.5 mm.", "2.4", False, UNITS, "issue 45 (a hedge)"),
    ("So the velocity at t = 3 s is -42 m/s.", "-42 \\mathrm{~m} / \\mathrm{s}", True, UNITS, "issue 45"),
    ("So the velocity at t = 3 s is -24 m/s.", "-42 \\mathrm{~m} / \\mathrm{s}", False, UNITS, "issue 45"),
    ("Therefore, the radius of the orbit is 310.5 meters.", "310.5 \\mathrm{~m}", True, UNITS, "issue 45"),
    ("Therefore, the radius of the orbit is 310.5 meters.", "310.5 \\mathrm{~km}", False, UNITS, "issue 45"),
    ("Therefore, the radius of the orbit is not 310.5 meters.", "310.5", False, UNITS, "issue 45 (negated)"),
    ("So the final answer is $\\boxed{6.4 \\times 10^{-5}}$ N.", "6.4 \\times 10^{-5} \\mathrm{~N}", True, UNITS,
     "OlympiadBench evaluator.py (the unit outside the box)"),
    ("So the final answer is $\\boxed{9.8}$ m/s^2.", "9.8 \\mathrm{~m} / \\mathrm{s}^{2}", True, UNITS,
     "OlympiadBench evaluator.py (the unit outside the box)"),
    ("So the final answer is $\\boxed{9.8 \\mathrm{~m/s}}$.", "9.8 \\mathrm{~m} / \\mathrm{s}^{2}", False, UNITS,
     "OlympiadBench evaluator.py (another unit)"),
    ("So the final answer is $\\boxed{2.4}$ cm.", "2.4 \\mathrm{~mm}", False, UNITS,
     "OlympiadBench evaluator.py (the wrong unit outside the box)"),
    ("So the final answer is $\\boxed{2.4}$ mm or cm.", "2.4", False, UNITS, "OlympiadBench evaluator.py (a hedge)"),
    ("So the velocity is -42 m/s or 42 m/s.", "-42", False, UNITS, "issue 45 (a hedge)"),

    # ---- options in prose (TheoremQA's option answers)
    ("Bounded variation equal to f(1) - f(0) forces f to be monotone and increasing. Therefore, the correct answer "
     "is (a) f is increasing on [0,1].", "(a)", True, OPTION, "TheoremQA: bounded variation f(1)-f(0) (option a)"),
    ("The Fisher information for this family is $\\theta^{-2}$, so option (d).", "(d)", True, OPTION,
     "TheoremQA: Fisher information of theta e^{-theta x} (option d)"),
    ("The Fisher information for this family is $\\theta^{-2}$, so option (d).", "(c)", False, OPTION,
     "TheoremQA: Fisher information of theta e^{-theta x} (option d)"),
    ("For N(0, theta) the Fisher information is 0.5 theta^{-2}, which is choice (d).", "(d)", True, OPTION,
     "TheoremQA: Fisher information of N(0, theta) (option d)"),
    ("Cayley's theorem embeds G in a permutation group, and (a) is correct.", "(a)", True, OPTION,
     "TheoremQA: Cayley's theorem (option a)"),
    ("Both (a) and (b) violate Kraft's inequality. The answer is (a) and (b).", "(b)", False, OPTION,
     "TheoremQA outputs (InternLM2: 'The answer is (a) and (b).')"),
    ("Without the coefficients we cannot tell.\nThe answer is (c) or (d)", "(c)", False, OPTION,
     "TheoremQA outputs (InternLM2: 'The answer is (c) or (d)')"),
    ("None of the listed theorems applies directly. Therefore, the correct answer is (d) None of the above.", "(d)",
     True, OPTION, "TheoremQA outputs (InternLM2: '(d) None of the above')"),
    ("The correct choice is (b), or possibly (c).", "(b)", False, OPTION, "TheoremQA (an alternative after)"),
    ("Color 1 has hue pi, nearer to blue, so the answer is (a) Color 1.", "(a)", True, OPTION,
     "TheoremQA outputs (InternLM2: 'The answer is (a) Color 1.')"),
    ("I would go with choice (B).", "(b)", True, OPTION, "TheoremQA (a capital letter)"),
    ("Option (a) fails and option (b) fails, so it must be option (c).", "(c)", True, OPTION,
     "TheoremQA (the option committed to)"),
    ("Option (a) fails and option (b) fails, so it must be option (c).", "(a)", False, OPTION,
     "TheoremQA (the option committed to)"),
    ("Option (a) fails.", "(a)", False, OPTION, "TheoremQA (an option named in passing)"),
    ("so option (c) or option (d).", "(c)", False, OPTION, "TheoremQA (a hedge)"),
    ("The correct choice is (b).", "(b)", True, OPTION, "issue 45"),
    ("Therefore, (a) or (b) is correct.", "(a)", False, OPTION, "TheoremQA (a hedge)"),
    ("Therefore, the answer is either (c) or (d).", "(c)", False, OPTION, "TheoremQA (a hedge)"),
    ("Option (c) is wrong, so the answer is (b).", "(b)", True, OPTION, "TheoremQA (the option committed to)"),
    ("The answer is (b). On reflection, option (c) is correct.", "(c)", True, OPTION,
     "TheoremQA (the last committed answer)"),
    ("The answer is (b). On reflection, option (c) is correct.", "(b)", False, OPTION,
     "TheoremQA (the last committed answer)"),
    ("so option (d)", "(d)", True, OPTION, "issue 45"),
]

# (response, reference, rel_tol, expected, source): TheoremQA's float answers are rounded and its grader allows
# 4% (number_utils.py within_eps); its integer answers are compared exactly here (a count is not rounded)
TOLERANCE = [
    ("The binding energy of the helium-4 nucleus is 28.296 MeV.", "28.3", 0.04, True,
     "TheoremQA tonyxia/relativity3.json"),
    ("The binding energy of the helium-4 nucleus is 28.296 MeV.", "28.3", 0.0, False,
     "TheoremQA tonyxia/relativity3.json"),
    ("Therefore, the volume is 0.96 cubic feet.", "0.955", 0.04, True, "TheoremQA wenhuchen/Fluid_mechanics2.json"),
    ("Therefore, the volume is 0.99 cubic feet.", "0.955", 0.04, True, "TheoremQA wenhuchen/Fluid_mechanics2.json"),
    ("Therefore, the volume is 1.0 cubic feet.", "0.955", 0.04, False, "TheoremQA wenhuchen/Fluid_mechanics2.json"),
    ("The answer is $\\frac{\\pi}{3}$.", "1.047", 0.04, True, "TheoremQA (an exact value of a rounded reference)"),
    ("The answer is $-\\frac{\\pi}{3}$.", "1.047", 0.04, False, "TheoremQA (the sign)"),
    ("The answer is [0.33, 0.25].", "[0.333, 0.25]", 0.04, True, "TheoremQA (a list of floats)"),
    ("The answer is [0.25, 0.33].", "[0.333, 0.25]", 0.04, False, "TheoremQA (a list in another order)"),
    ("Therefore, there are 11700 ways.", "11760", 0.04, False, "TheoremQA jianyu_xu/Lah_number_6.json (a count)"),
    ("Therefore, there are 11760 ways.", "11760", 0.04, True, "TheoremQA jianyu_xu/Lah_number_6.json (a count)"),
    ("The answer is 7.1 \\times 10^{35}.", "7 \\times 10^{35}", 0.04, True, OLB_PAIRS),
    ("The answer is 7.1 \\times 10^{35}.", "7 \\times 10^{35}", 0.0, False, OLB_PAIRS),
    ("The answer is 3.3 or 3.4.", "3.3", 0.04, False, "a hedge stays a hedge"),
]


@pytest.fixture(scope="module")
def pool():
    with RewardPool(num_workers=2, timeout_s=5.0) as shared:
        yield shared


def _ids(cases: list) -> list[str]:
    return [f"{case[3] if len(case) == 5 and isinstance(case[3], str) else 'tolerance'}: {case[0][-40:]!r} vs "
            f"{case[1][:24]!r}" for case in cases]


@pytest.mark.parametrize("response, reference, expected, kind, source", CORPUS, ids=_ids(CORPUS))
def test_the_checker_agrees_with_the_corpus(pool, response, reference, expected, kind, source):
    assert pool.score([(response, reference)]) == [float(expected)], source


def test_the_corpus_covers_every_kind_both_ways():
    kinds = {kind for _, _, _, kind, _ in CORPUS}
    assert kinds == {LHS, TOOL, TRUTH, UNITS, OPTION}
    for kind in kinds:
        verdicts = [expected for _, _, expected, case_kind, _ in CORPUS if case_kind == kind]
        assert set(verdicts) == {True, False} and len(verdicts) >= 15, kind
    assert all(source for *_, source in CORPUS) and len(CORPUS) + len(TOLERANCE) >= 120


@pytest.mark.parametrize("response, reference, rel_tol, expected, source", TOLERANCE, ids=_ids(TOLERANCE))
def test_a_benchmark_tolerance_follows_its_published_rule(response, reference, rel_tol, expected, source):
    with RewardPool(num_workers=1, rel_tol=rel_tol) as pool:
        assert pool.score([(response, reference)]) == [float(expected)], source


def test_the_tolerance_is_off_unless_asked():
    assert equivalent("28.296", "28.3", rel_tol=0.04) and not equivalent("28.296", "28.3")
    assert not equivalent("2.9", "3", rel_tol=0.04)  # an integer reference stays exact


@pytest.mark.parametrize("rel_tol", [-0.01, 1.5, float("nan")])
def test_a_bad_tolerance_is_one_clear_message(rel_tol):
    with pytest.raises(ValueError, match="rel_tol"):
        RewardPool(rel_tol=rel_tol)


@pytest.mark.parametrize("response", [
    tora("print(1)", "1" * 200_000, "One " * 100_000 + "student passed."),
    "Therefore, " + "not " * 200_000 + "true.",
    "so option " + "(a) or " * 100_000 + "(b).",
    "twenty " * 300_000 + "boxes were shipped.",
    "```output\n" * 50_000 + "3\n```\nThree.",
])
def test_prose_readers_stay_fast_on_pathological_input(response):
    start = time.process_time()  # this process's CPU: the readers' work, whatever else the machine runs
    for reference in ("3", "True", "(a)"):
        candidate_answers(response, reference)
    assert time.process_time() - start < 1.0


def test_eval_grades_each_benchmark_by_its_published_rule_and_records_it(tmp_path, monkeypatch):
    """eval.py without --rel-tol: a TheoremQA file is graded within 4%, another benchmark exactly; with --rel-tol
    every benchmark takes it. results.json records what each benchmark was graded with."""
    problems = [{"id": "p1", "problem": "How far?", "answer": "2.5"}]
    for name in ("theoremqa_part.jsonl", "other.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps(p) + "\n" for p in problems))
    benchmarks = f"{tmp_path / 'theoremqa_part.jsonl'},{tmp_path / 'other.jsonl'}"
    monkeypatch.setattr(E, "sampler_fn", lambda *args, **kwargs: lambda prompts, seed, keys: (
        ["so the answer is \\boxed{2.55}"] * len(prompts), len(prompts)))  # 2% off the reference
    for flags, expected in (([], {"theoremqa_part": 1.0, "other": 0.0}),
                            (["--rel-tol", "0.05"], {"theoremqa_part": 1.0, "other": 1.0})):
        out = tmp_path / f"out{len(flags)}"
        E.main(["--model", "tiny", "--benchmarks", benchmarks, "--n", "1", "--out-dir", str(out), *flags])
        results = json.loads((out / "results.json").read_text())
        assert {name: results[name]["mean@1"] for name in expected} == expected
        assert results["scored_by"]["rel_tol"] == {"theoremqa_part": 0.04 if not flags else 0.05,
                                                   "other": 0.0 if not flags else 0.05}
