"""Benchmarks. Each prints one JSON line per measurement to stdout; notes go to stderr.

    python bench.py grader              # the reward checker (reward.py) on a realistic answer mix
    python bench.py rollout             # the sampler (rollout.py) against transformers' generate
    python bench.py train               # the training log-prob path (ngrpo.py) against full logits
    python bench.py neighbors           # the neighbor table (neighbors.py); --device cuda: the 1.5B shape

Each benchmark is one function `bench_NAME(args)` with its own subcommand in `main()`; add new ones
(rollout, train, ...) the same way.
"""

import argparse
import json
import math
import os
import random
import re
import statistics
import sys
import time
from fractions import Fraction
from pathlib import Path

# ../shared/data beside the repo; NGRPO_SHARED_DATA points elsewhere (e.g. a copy carried to a GPU machine).
SHARED_DATA = Path(os.environ.get("NGRPO_SHARED_DATA") or Path(__file__).resolve().parent.parent / "shared" / "data")
EVAL_DATA = SHARED_DATA / "eval"


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def latency_ms(seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    return {"median_ms": round(1000 * statistics.median(ordered), 3),
            "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3)}


# ----------------------------------------------------------------------------------------------------
# grader

# Used when ../shared/data is absent: answers in the shapes MATH-500 has, with a one-line solution each.
GENERATED_ANSWERS = [
    "204", "025", "-1", "10,\\!080", "\\frac{14}{3}", "\\dfrac{33}{100}", "\\frac 59", "1.25", ".0000672",
    "3\\sqrt{13}", "\\frac{\\sqrt{3}}{3}", "288 \\pi", "-\\frac{\\pi}{6}", "6 - 5i", "1+274i",
    "x^5 - x^4 + x^3 - x^2 + x - 1", "(a+5)(b+2)", "2k+2", "\\left( 3, \\frac{\\pi}{2} \\right)", "(6,31,-1)",
    "1,-2", "3, 5, 7", "1 \\pm \\sqrt{19}", "(3,4]", "(-\\infty, 2) \\cup (3, \\infty)", "x \\in [-2,7]",
    "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}", "\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}",
    "y = 2x + 3", "5x - 7y + 11z + 4 = 0", "90^\\circ", "\\text{Evelyn}", "\\text{(C)}", "52_8",
    "864 \\mbox{ inches}^2", "\\$32,\\!348", "1\\frac{4}{5}", "\\cot x", "p - q", "\\{1\\pm\\sqrt{5},-2\\}",
]
FILLER = [
    "Let me re-read the problem to make sure I have the setup right.",
    "We can check this value by substituting it back into the original equation.",
    "Hmm, wait. Let me reconsider the previous step, since the sign might be off.",
    "Expanding the product and collecting like terms gives a simpler expression.",
    "This matches the constraint given in the problem, so the case is consistent.",
    "Alternatively, we could count the complementary cases and subtract from the total.",
]


def load_problems() -> tuple[str, list[dict]]:
    """("math500", its {answer, solution} rows), or a generated stand-in when ../shared/data is absent."""
    path = EVAL_DATA / "math500.jsonl"
    if path.is_file():
        return "math500", [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    note(f"{path} not found: benchmarking a generated mix of {len(GENERATED_ANSWERS)} MATH-style answers instead")
    return "generated", [{"answer": answer, "solution": f"{FILLER[i % len(FILLER)]} So it is $\\boxed{{{answer}}}$."}
                         for i, answer in enumerate(GENERATED_ANSWERS)]


_INTEGER = re.compile(r"-?\d+")
_FRACTION = re.compile(r"(-?)\\d?frac\{(\d+)\}\{(\d+)\}")
_DECIMAL = re.compile(r"-?\d*\.\d+")
_TERMS = re.compile(r"(?<=[^\s^_{(+\-=,])\s*(?=[+-])")  # a top-level + or - that starts a term


def _depth_zero_split(text: str, pattern: re.Pattern) -> list[str]:
    """Split at pattern matches outside any brackets."""
    depth, start, parts = 0, 0, []
    for match in re.finditer(r"[{(\[]|[})\]]|" + pattern.pattern, text):
        token = match.group()
        if token in "{([":
            depth += 1
        elif token in "})]":
            depth -= 1
        elif depth == 0 and match.start() > start:
            parts.append(text[start:match.start()].strip())
            start = match.end()
    return parts + [text[start:].strip()]


def equivalent_rewriting(answer: str, rng: random.Random) -> str:
    """The same answer written another way a model might write it (one of the rewrites that apply)."""
    text = answer.strip()
    options = []
    if _INTEGER.fullmatch(text):
        n = int(text)
        options += [f"{n}.0", f"\\frac{{{2 * n}}}{{2}}", f"x = {n}", f"{n}\\text{{ units}}",
                    f"{n:,}" if abs(n) >= 1000 else f"00{n}" if n >= 0 else f"-0{-n}"]
    fraction = _FRACTION.fullmatch(text)
    if fraction:
        sign, numerator, denominator = fraction.group(1), int(fraction.group(2)), int(fraction.group(3))
        options += [f"{sign}{numerator}/{denominator}", f"{sign}\\dfrac{{{3 * numerator}}}{{{3 * denominator}}}",
                    f"\\frac{{{sign}{numerator}}}{{{denominator}}}"]
        reduced = denominator // math.gcd(numerator, denominator)
        if reduced == 2 ** _exponent_of(reduced, 2) * 5 ** _exponent_of(reduced, 5):  # a terminating decimal
            options.append(f"{sign}{numerator / denominator:.12g}")
    if _DECIMAL.fullmatch(text):
        value = Fraction(text)
        options += [text + "0", f"{'-' if value < 0 else ''}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"]
    if re.fullmatch(r"(?:\\\$)?\d{1,3}(?:,(?:\\!)?\s*\d{3})+", text):  # 10,\!080
        options.append(text.replace(",", "").replace("\\!", "").replace(" ", ""))
    for pattern, rewrite in _REWRITES:
        match = re.fullmatch(pattern, text)
        if match:
            options.append(rewrite(match))
    if "pmatrix" in text:
        options.append(text.replace("pmatrix", "bmatrix"))
    if text.count("=") == 1 and "\\in" not in text:
        left, right = text.split("=")
        options.append(f"{right.strip()} = {left.strip()}")
    items = _depth_zero_split(text, re.compile(","))
    if len(items) > 1 and not options:
        options.append(", ".join(reversed(items)))  # an unordered list of solutions
    if text[0] in "([" and text[-1] in ")]" and len(items) == 1:
        options.append("\\left" + text[0] + " " + text[1:-1].replace(",", ", ") + " \\right" + text[-1])
    terms = _depth_zero_split(text, _TERMS) if not re.search(r"\\pm|\\cup|=|,|\\\$|\\text|\\begin", text) else []
    if len(terms) > 1:
        signed = [term if term[0] in "+-" else "+" + term for term in terms]
        options.append("".join(reversed(signed)).lstrip("+"))
    if "\\frac" in text:
        options.append(text.replace("\\frac", "\\dfrac"))
    return rng.choice(options or [f"\\displaystyle {text}"])


_REWRITES = [  # (whole-answer pattern, equivalent form)
    (r"(\d+)_\{?(\d+)\}?", lambda m: f"{m.group(1)}_{{{m.group(2)}}}"),
    (r"([\d.]+)\s*\\(?:mbox|text)\{[^{}]*\}(?:\^2)?", lambda m: m.group(1)),
    (r"x \\in (.*)", lambda m: m.group(1)),
    (r"\\\{(.*)\\\}", lambda m: "\\{" + ", ".join(reversed(_depth_zero_split(m.group(1), re.compile(",")))) + "\\}"),
    (r"\\text\{\(([A-E])\)\}", lambda m: m.group(1)),
    (r"\\text\{\(([A-E])\)\}", lambda m: f"\\textbf{{({m.group(1)})}}"),
    (r"\\text\{([A-Za-z ]+)\}", lambda m: m.group(1).lower()),
    (r"(\d+)\s*\^\s*\\circ", lambda m: m.group(1)),
    (r"(\d+)\s*\^\s*\\circ", lambda m: f"{m.group(1)}°"),
    (r"(\d+)\s*\\sqrt\{?(\d+)\}?", lambda m: f"\\sqrt{{{int(m.group(1)) ** 2 * int(m.group(2))}}}"),
    (r"\\sqrt\{(\d+)\}", lambda m: f"{m.group(1)}^{{1/2}}"),
    (r"(\d+)\s*(\\pi|\\sqrt\{\d+\})", lambda m: f"{m.group(2)} \\cdot {m.group(1)}"),
    (r"\\frac\{([^{}]+)\}\{([^{}]+)\}", lambda m: f"({m.group(1)})/({m.group(2)})"),
    (r"-\\frac\{([^{}]+)\}\{([^{}]+)\}", lambda m: f"\\frac{{-{m.group(1)}}}{{{m.group(2)}}}"),
]


def _exponent_of(n: int, p: int) -> int:
    count = 0
    while n % p == 0:
        n, count = n // p, count + 1
    return count


def wrong_rewriting(answer: str) -> str:
    """A different answer of the same shape: the first integer incremented (3\\sqrt{13} -> 4\\sqrt{13})."""
    text = answer.strip()
    match = re.fullmatch(r"\\text\{\(([A-E])\)\}", text)
    if match:
        return f"\\text{{({'ABCDEA'['ABCDE'.index(match.group(1)) + 1]})}}"
    if re.fullmatch(r"\\text\{[A-Za-z ]+\}", text):
        return "\\text{none of these}"
    number = re.search(r"\d+", text)
    if number:
        return text[:number.start()] + str(int(number.group()) + 1) + text[number.end():]
    return f"{text} + 1"


def response_of(solution: str, final_answer: str, padding: list[str], target_chars: int, rng: random.Random) -> str:
    """An R1-style response of about target_chars: reasoning padded with other solutions' text, then the
    answer in a box."""
    think = [solution.replace("\\boxed", "")]
    while sum(map(len, think)) < target_chars - 300:
        think.insert(rng.randrange(len(think) + 1), rng.choice(padding).replace("\\boxed", ""))
        think.insert(rng.randrange(len(think) + 1), rng.choice(FILLER))
    return ("<think>\n" + "\n\n".join(think)[:target_chars - 300] + "\n</think>\n\n"
            f"Putting the steps together, the final answer is $\\boxed{{{final_answer}}}$.")


def accuracy(scores: list[float], expected: list[float]) -> float:
    return round(sum(s == e for s, e in zip(scores, expected)) / len(scores), 4)


def timed_singly(check, pairs: list[tuple]) -> dict:
    """Median / p99 latency of check(a, b) over the pairs, one call at a time."""
    seconds = []
    for a, b, *_ in pairs:
        start = time.perf_counter()
        check(a, b)
        seconds.append(time.perf_counter() - start)
    return latency_ms(seconds)


def bench_grader(args: argparse.Namespace) -> None:
    """Throughput (RewardPool, warm workers) and one-at-a-time latency (is_equiv / math_reward, one shared
    worker) on MATH-500 reference answers against themselves, equivalent rewritings and wrong answers;
    ~8k-character responses; adversarial inputs; agreement with math-verify when it is installed."""
    import reward

    rng = random.Random(args.seed)
    source, problems = load_problems()
    references = [str(problem["answer"]) for problem in problems]
    cases = {
        "self": [(reference, reference, 1.0) for reference in references],
        "equivalent": [(equivalent_rewriting(reference, rng), reference, 1.0) for reference in references],
        "wrong": [(wrong_rewriting(reference), reference, 0.0) for reference in references],
    }
    padding = [problem["solution"] for problem in problems]
    long_pairs = []  # (response, reference, expected)
    for index in range(args.responses):
        problem = problems[index % len(problems)]
        prediction, reference, expected = list(cases.values())[index % 3][index % len(problems)]
        long_pairs.append((response_of(problem["solution"], prediction, padding, args.response_chars, rng),
                           reference, expected))
    workers = args.workers or min(8, os.cpu_count() or 1)

    def report(case: str, pairs: int, **fields) -> None:
        emit({"bench": "grader", "case": case, "pairs": pairs, "workers": workers, "timeout_s": args.timeout_s,
              **fields})

    start = time.perf_counter()
    with reward.RewardPool(num_workers=workers, timeout_s=args.timeout_s) as pool:
        pool.score([(response, reference) for response, reference, _ in long_pairs])
    cold_s = time.perf_counter() - start

    with reward.RewardPool(num_workers=workers, timeout_s=args.timeout_s) as pool:
        pool.score([("\\boxed{\\sqrt{8}}", "2\\sqrt{2}")] * workers)  # start the workers outside the timings
        reward.is_equiv("\\sqrt{8}", "2\\sqrt{2}")  # and the shared one behind is_equiv / math_reward
        verdicts = {}
        for case, pairs in cases.items():
            start = time.perf_counter()
            scores = pool.score([(f"So the answer is $\\boxed{{{prediction}}}$.", reference)
                                 for prediction, reference, _ in pairs])
            elapsed_s = time.perf_counter() - start
            verdicts[case] = scores
            in_process = sum(reward._fast_verdict(p, r) is not None for p, r, _ in pairs) / len(pairs)
            report(f"{source} {case}", len(pairs), pairs_per_s=round(len(pairs) / elapsed_s, 1),
                   **timed_singly(lambda p, r: reward.is_equiv(p, r, timeout=args.timeout_s), pairs),
                   accuracy=accuracy(scores, [e for _, _, e in pairs]), decided_in_process=round(in_process, 3))
            for score, (prediction, reference, expected) in zip(scores, pairs):
                if score != expected:
                    note(f"grader {case}: {prediction!r} vs {reference!r} scored {score}, expected {expected}")

        hard = [pair for pairs in cases.values() for pair in pairs if reward._fast_verdict(pair[0], pair[1]) is None]
        start = time.perf_counter()
        scores = pool.score([(f"\\boxed{{{prediction}}}", reference) for prediction, reference, _ in hard])
        elapsed_s = time.perf_counter() - start
        report(f"{source} pairs that need sympy", len(hard), pairs_per_s=round(len(hard) / elapsed_s, 1),
               **timed_singly(lambda p, r: reward.is_equiv(p, r, timeout=args.timeout_s), hard),
               accuracy=accuracy(scores, [e for _, _, e in hard]))

        start = time.perf_counter()
        scores = pool.score([(response, reference) for response, reference, _ in long_pairs])
        elapsed_s = time.perf_counter() - start
        report(f"responses of ~{args.response_chars} chars", len(long_pairs), seconds=round(elapsed_s, 3),
               cold_start_seconds=round(cold_s, 3), pairs_per_s=round(len(long_pairs) / elapsed_s, 1),
               **timed_singly(reward.math_reward, long_pairs), accuracy=accuracy(scores, [e for _, _, e in long_pairs]),
               mean_chars=round(statistics.mean(len(r) for r, _, _ in long_pairs)))

        adversarial = ["\\boxed{9^{9^{9^9}}}", "\\boxed{10^{10^{10^{10}}}}", "\\boxed{1000000!}",
                       "\\boxed{" + "7" * 100_000 + "}", "\\boxed{" + "(" * 2000 + "1" + ")" * 2000 + "}",
                       "x" * 1_000_000 + "\\boxed{5", "\\boxed{" * 5000, "\\boxed{\x00\x1b\x7f}", "\\boxed{}",
                       "\\boxed{(x+y+z+1)^{30}(x-y-z-1)^{30}}"]  # the last: a true identity too slow to expand
        seconds, scores = [], []
        for response in adversarial:
            start = time.perf_counter()
            scores += pool.score([(response, "(x^2-(y+z+1)^2)^{30}")])
            seconds.append(time.perf_counter() - start)
        report("adversarial", len(adversarial), max_ms=round(1000 * max(seconds), 1), **latency_ms(seconds),
               all_zero=scores == [0.0] * len(adversarial))

    if args.math_verify:
        compare_with_math_verify(cases, verdicts)


def compare_with_math_verify(cases: dict, verdicts: dict) -> None:
    """Agreement with math-verify (the paper's grader) on the same pairs; disagreements go to stderr."""
    try:
        from math_verify import parse, verify
    except ImportError:
        note("math-verify is not installed (pip install math-verify): skipping the agreement check")
        return
    agree, total, seconds = 0, 0, []
    for case, pairs in cases.items():
        for (prediction, reference, expected), ours in zip(pairs, verdicts[case]):
            start = time.perf_counter()
            theirs = 1.0 if verify(parse(f"\\boxed{{{reference}}}"), parse(f"\\boxed{{{prediction}}}")) else 0.0
            seconds.append(time.perf_counter() - start)
            total += 1
            agree += theirs == ours
            if theirs != ours:
                note(f"math-verify disagrees ({case}): {prediction!r} vs {reference!r}: ours {ours}, "
                     f"math-verify {theirs}, expected {expected}")
    emit({"bench": "grader", "case": "math-verify agreement", "pairs": total, "agreement": round(agree / total, 4),
          "disagreements": total - agree,
          **{f"math_verify_{key}": value for key, value in latency_ms(seconds).items()}})


# ----------------------------------------------------------------------------------------------------
# rollout

SHAPES = {"1.5b": "tokenizers/DeepSeek-R1-Distill-Qwen-1.5B/config.json",
          "7b": "configs/DeepSeek-R1-Distill-Qwen-7B/config.json"}


def shape_config(shape: str):
    """The tiny preset's ModelConfig, or the path of a real architecture's config.json in ../shared."""
    from model import TINY_CONFIG

    if shape == "tiny":
        return TINY_CONFIG
    path = SHARED_DATA / SHAPES[shape]
    if not path.is_file():
        sys.exit(f"{path} not found: the {shape} shape needs ../shared/data")
    return path


def transformers_twin(model):
    """transformers' own model of the same architecture holding the same weights (the baseline)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = model.cfg.to_hf()
    config = AutoConfig.for_model(hf_config.pop("model_type"), **hf_config)
    weight = model.embed_tokens.weight
    twin = AutoModelForCausalLM.from_config(config).to(device=weight.device, dtype=weight.dtype).eval()
    state = {(k if k.startswith("lm_head") else "model." + k): v for k, v in model.state_dict().items()}
    twin.load_state_dict(state, strict=not model.cfg.tie_word_embeddings)
    return twin


def peak_mem_mb(device) -> float:
    import resource

    import torch

    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # the process's peak RSS


def bench_rollout(args: argparse.Namespace) -> None:
    import torch

    from model import random_model
    from neighbors import build_neighbor_table
    from rollout import Exploration, Sampling, generate

    device = torch.device(args.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    config = shape_config(args.shape)
    model = random_model(config, dtype=dtype, device=device, seed=0).eval()
    twin = transformers_twin(model)
    vocab = model.cfg.vocab_size
    prompts = torch.randint(0, vocab, (args.batch, args.prompt_len), generator=torch.Generator().manual_seed(0))
    table = build_neighbor_table(model.output_weight, 1)
    sampling = Sampling(max_new_tokens=args.new_tokens)  # no stop ids: every row runs the full length

    cuda_graph = device.type == "cuda" and args.cuda_graph

    def ours(explore):
        exploration = Exploration(explore, mix_rate=0.1)
        return lambda: generate(model, prompts.tolist(), sampling, exploration, neighbor_table=table,
                                generator=torch.Generator(device).manual_seed(0), cuda_graph=cuda_graph)

    def theirs():
        ids = prompts.to(device)
        return twin.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_p=1.0,
                             top_k=0, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, pad_token_id=0)

    runs = [("ours", "none", ours("none")), ("ours", "neighbor", ours("neighbor")), ("transformers", "none", theirs)]
    seconds = {impl_explore: [] for impl_explore in [(impl, explore) for impl, explore, _ in runs]}
    peak = {}
    for impl, explore, run in runs:
        run()  # warm-up
    # Round-robin over the configurations, so that drift in the machine's speed hits all of them alike.
    for _ in range(args.repeats):
        for impl, explore, run in runs:
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            run()
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds[impl, explore].append(time.perf_counter() - start)
            peak[impl, explore] = peak_mem_mb(device)
    for (impl, explore), timings in seconds.items():
        emit({"bench": "rollout", "impl": impl, "explore": explore, "device": device.type, "shape": args.shape,
              "batch": args.batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
              "tokens_per_s": round(args.batch * args.new_tokens / statistics.median(timings), 1),
              "median_s": round(statistics.median(timings), 4), "min_s": round(min(timings), 4),
              "peak_mem_mb": peak[impl, explore], "cuda_graph": cuda_graph and impl == "ours",
              "repeats": args.repeats})


# ----------------------------------------------------------------------------------------------------
# neighbors


def bench_neighbors(args: argparse.Namespace) -> None:
    """build_neighbor_table over the output matrix of a random model of the given shape, in the dtype the
    sampler holds it (bf16 on CUDA, fp32 on CPU). No disk cache: every run searches."""
    import torch

    from model import random_model
    from neighbors import build_neighbor_table

    device = torch.device(args.device)
    shape = args.shape or ("1.5b" if device.type == "cuda" else "tiny")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    weight = random_model(shape_config(shape), dtype=dtype, device=device, seed=0).output_weight.detach()

    def build():
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        build_neighbor_table(weight, args.k, args.metric)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    first = build()  # includes one-off costs (cuBLAS handles, kernel selection)
    seconds = [build() for _ in range(args.repeats)]
    # peak_mem_mb: on CUDA the allocator's peak during the last build above the matrix itself; on CPU the
    # process's peak RSS.
    weight_mb = weight.numel() * weight.element_size() / 2**20 if device.type == "cuda" else 0.0
    emit({"bench": "neighbors", "device": device.type, "shape": shape, "vocab": weight.shape[0],
          "dim": weight.shape[1], "dtype": str(dtype).removeprefix("torch."), "k": args.k, "metric": args.metric,
          "first_s": round(first, 4), "median_s": round(statistics.median(seconds), 4),
          "min_s": round(min(seconds), 4), "repeats": args.repeats,
          "peak_mem_mb": round(peak_mem_mb(device) - weight_mb, 1)})


# ----------------------------------------------------------------------------------------------------
# train

TRAIN_DEFAULTS = {"cpu": dict(shape="tiny", batch=8, seq_len=512, repeats=10),
                  "cuda": dict(shape="1.5b", batch=1, seq_len=8192, repeats=5)}


def train_setup(args: argparse.Namespace, device):
    """Our fp32 model (the trained weights stay fp32: README.md, "The real run"), its transformers twin holding the very
    same Parameter objects (one copy of the weights and of .grad serves both), and a random batch."""
    import torch

    from model import random_model

    config = shape_config(args.shape)
    model = random_model(config, dtype=torch.float32, device=device, seed=0)
    twin = transformers_twin(model)
    shared = {(k if k.startswith("lm_head") else "model." + k): p for k, p in model.named_parameters()}
    twin.load_state_dict(shared, strict=not model.cfg.tie_word_embeddings, assign=True)
    model.gradient_checkpointing = args.grad_checkpointing
    model.train()  # our blocks are checkpointed only in training mode; neither model has dropout
    twin.train()
    if args.grad_checkpointing:  # non-reentrant, as ours; transformers 5 renamed the method
        enable = getattr(twin, "activation_checkpointing_enable", None) or twin.gradient_checkpointing_enable
        enable({"use_reentrant": False})
    ids = torch.randint(0, model.cfg.vocab_size, (args.batch, args.seq_len), generator=torch.Generator().manual_seed(0))
    return model, twin, ids.to(device)


def ours_logprobs(model, ids, chunk_tokens: int = 1024):
    """log p(ids[:, t+1] | ids[:, :t+1]), [B, T-1], from hidden states in chunks: never [B, T, V] logits."""
    from ngrpo import token_logprobs

    hidden = model.forward_hidden(ids)  # [B, T, d]
    return token_logprobs(hidden[:, :-1], model.output_weight, ids[:, 1:], chunk_tokens=chunk_tokens)[0]


def theirs_logprobs(twin, ids):
    """The same from transformers' full logits [B, T, V], upcast to fp32, log_softmax, gather."""
    logits = twin(input_ids=ids, use_cache=False).logits
    return logits.float().log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]


def train_steps(model, twin, ids, chunk_tokens: int, autocast) -> dict:
    """impl -> a function that runs one forward + backward of sum(log p(next token)) over the batch."""
    import torch

    mask = torch.ones(ids.shape[0], ids.shape[1] - 1, device=ids.device)  # every position scored

    def ours():
        with autocast():
            logp = ours_logprobs(model, ids, chunk_tokens)
        (logp * mask).sum().backward()

    def theirs():
        with autocast():
            logp = theirs_logprobs(twin, ids)
        (logp * mask).sum().backward()

    return {"ours": ours, "transformers": theirs}


def rss_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def cpu_step_memory_mb(args: argparse.Namespace, impl: str) -> float:
    """The memory one forward + backward of `impl` adds on CPU, measured in a fresh process.

    Peak RSS within one process only grows, so the second implementation measured there would inherit the
    first one's high-water mark; and glibc keeps freed memory for reuse, so even a reset mark would
    under-count whichever runs second. So each implementation runs alone in a new `bench.py train
    --memory-of IMPL` process, with MALLOC_MMAP_THRESHOLD_ set so that every large buffer is its own
    mapping, returned to the system when freed (RSS then follows live memory). There, after a warm-up step
    and with .grad freed, it resets the peak RSS (/proc/self/clear_refs) and reports peak minus current
    RSS over one more step: activations, logits and the gradients it allocates."""
    import subprocess

    command = [sys.executable, __file__, "train", "--memory-of", impl, "--device", "cpu", "--shape", args.shape,
               "--batch", str(args.batch), "--seq-len", str(args.seq_len), "--chunk-tokens", str(args.chunk_tokens)]
    if args.grad_checkpointing:
        command.append("--grad-checkpointing")
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"measuring the memory of {impl} failed:\n{result.stderr}")
    return json.loads(result.stdout)["peak_mem_mb"]


def bench_train(args: argparse.Namespace) -> None:
    """One forward + backward of the training log-prob path on the same weights and batch: ours (hidden
    states -> ngrpo.token_logprobs in chunks of --chunk-tokens, never [B, T, V] logits) against
    transformers' model computing full logits + log_softmax + gather. CUDA: fp32 weights under bf16
    autocast, as training runs; CPU: fp32. `peak_mem_mb` is what the step adds at its peak on top of the
    weights and the batch (CUDA: the allocator's peak; CPU: see cpu_step_memory_mb)."""
    import contextlib

    import torch

    device = torch.device(args.device)
    for key, value in TRAIN_DEFAULTS[device.type].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    model, twin, ids = train_setup(args, device)
    if device.type == "cuda":
        autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    else:
        autocast = contextlib.nullcontext
    steps = train_steps(model, twin, ids, args.chunk_tokens, autocast)

    if args.memory_of:  # the child process of cpu_step_memory_mb
        if device.type != "cpu":
            sys.exit("--memory-of measures CPU memory only")
        steps[args.memory_of]()
        model.zero_grad(set_to_none=True)
        Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
        before_mb = rss_mb("VmRSS")
        steps[args.memory_of]()
        print(json.dumps({"peak_mem_mb": round(rss_mb("VmHWM") - before_mb, 1)}))
        return

    # Apples to apples: both compute the same log-probs from the same weights (fp32, no autocast), checked
    # once on at most 1,024 tokens of the first row (full fp32 logits of a real vocabulary are large).
    with torch.no_grad():
        rows = ids[:1, : min(args.seq_len, 1024)]
        gap = float((ours_logprobs(model, rows) - theirs_logprobs(twin, rows)).abs().max())
    # fp32 on CUDA: the two pick different attention kernels, whose sums round differently.
    tolerance = 1e-4 if device.type == "cpu" else 1e-3
    assert gap < tolerance, f"ours and transformers disagree on the log-probs by {gap:.2e}"
    note(f"train: ours and transformers' fp32 log-probs agree to {gap:.1e} (max abs diff)")

    if device.type == "cpu":
        peak = {impl: cpu_step_memory_mb(args, impl) for impl in steps}
    else:
        peak = {impl: 0.0 for impl in steps}
    seconds = {impl: [] for impl in steps}
    for step in steps.values():  # warm-up
        model.zero_grad(set_to_none=True)
        step()
    # Round-robin over the implementations, so that drift in the machine's speed hits both alike.
    for _ in range(args.repeats):
        for impl, step in steps.items():
            model.zero_grad(set_to_none=True)  # each step allocates its own .grad, as a training step does
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(device)
                before = torch.cuda.memory_allocated(device)
            start = time.perf_counter()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize()
                peak[impl] = max(peak[impl], round((torch.cuda.max_memory_allocated(device) - before) / 2**20, 1))
            seconds[impl].append(time.perf_counter() - start)
    for impl, timings in seconds.items():
        emit({"bench": "train", "impl": impl, "device": device.type, "shape": args.shape, "batch": args.batch,
              "seq_len": args.seq_len, "tokens_per_s": round(args.batch * args.seq_len / statistics.median(timings), 1),
              "median_s": round(statistics.median(timings), 4), "min_s": round(min(timings), 4),
              "peak_mem_mb": peak[impl], "grad_checkpointing": args.grad_checkpointing, "fp32_logp_gap": gap})


# ----------------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchmarks = parser.add_subparsers(dest="benchmark", required=True)

    grader = benchmarks.add_parser("grader", help="reward checker: speed, accuracy, agreement with math-verify")
    grader.add_argument("--workers", type=int, default=None, help="RewardPool workers (default: min(8, CPUs))")
    grader.add_argument("--timeout-s", type=float, default=5.0, help="per-check time limit")
    grader.add_argument("--responses", type=int, default=256, help="number of long responses")
    grader.add_argument("--response-chars", type=int, default=8000, help="length of each long response")
    grader.add_argument("--seed", type=int, default=0)
    grader.add_argument("--no-math-verify", dest="math_verify", action="store_false",
                        help="skip the agreement check even when math-verify is installed")
    grader.set_defaults(run=bench_grader)

    rollout = benchmarks.add_parser("rollout", help="sampler: ours vs transformers' generate, neighbor mixing vs none")
    rollout.add_argument("--device", default="cpu", help="cpu or cuda")
    rollout.add_argument("--shape", default="tiny", choices=["tiny", *SHAPES],
                         help="tiny preset, or the real R1-Distill config from ../shared with random weights")
    rollout.add_argument("--batch", type=int, default=16, help="prompts decoded together")
    rollout.add_argument("--prompt-len", type=int, default=32, help="tokens per prompt")
    rollout.add_argument("--new-tokens", type=int, default=128, help="tokens generated per prompt (no early stop)")
    rollout.add_argument("--repeats", type=int, default=15, help="timed runs per configuration (median reported)")
    rollout.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false",
                         help="on cuda, run our decode step eagerly instead of replaying a CUDA graph")
    rollout.set_defaults(run=bench_rollout)

    neighbors = benchmarks.add_parser("neighbors", help="the neighbor table over a real-shape output matrix")
    neighbors.add_argument("--device", default="cpu", help="cpu (fp32 matrix) or cuda (bf16 matrix, as the sampler's)")
    neighbors.add_argument("--shape", default=None, choices=["tiny", *SHAPES],
                           help="tiny preset, or the real R1-Distill config from ../shared with random weights "
                                "(default: tiny on cpu, 1.5b on cuda; 1.5b on cpu takes ~11 minutes)")
    neighbors.add_argument("--k", type=int, default=2, help="neighbors per row")
    neighbors.add_argument("--metric", default="cosine", choices=["cosine", "dot", "l2", "l1"])
    neighbors.add_argument("--repeats", type=int, default=3, help="timed builds after a first one (median reported)")
    neighbors.set_defaults(run=bench_neighbors)

    train = benchmarks.add_parser("train", help="forward + backward of the log-prob path: ours (chunked) vs "
                                  "transformers' full logits + log_softmax")
    train.add_argument("--device", default="cpu", help="cpu (fp32) or cuda (fp32 weights, bf16 autocast)")
    train.add_argument("--shape", default=None, choices=["tiny", *SHAPES],
                       help="tiny preset, or the real R1-Distill config from ../shared with random weights "
                            "(default: tiny on cpu, 1.5b on cuda)")
    train.add_argument("--batch", type=int, default=None, help="sequences per step (default: 8 on cpu, 1 on cuda)")
    train.add_argument("--seq-len", type=int, default=None,
                       help="tokens per sequence (default: 512 on cpu, 8192 on cuda)")
    train.add_argument("--chunk-tokens", type=int, default=1024, help="positions per chunk of our log-prob path")
    train.add_argument("--grad-checkpointing", action="store_true", help="recompute each block in backward (both)")
    train.add_argument("--repeats", type=int, default=None, help="timed runs per implementation, median reported "
                       "(default: 10 on cpu, 5 on cuda)")
    train.add_argument("--memory-of", choices=["ours", "transformers"], default=None,
                       help="internal: measure one implementation's memory in this fresh process (see bench_train)")
    train.set_defaults(run=bench_train)

    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
