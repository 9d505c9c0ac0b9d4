"""Problems in, prompt token ids out: loading problem sets, rendering prompts, seeded resumable
batching.

Every problem set, whatever its field names, becomes a list of records {id, problem, answer}:

    load_problems("../shared/data/eval/aime24.jsonl")[0] -> {"id": "60", "problem": "Every morning
    Aya goes for a $9$-kilometer-long walk ...", "answer": "204"}

Sources: a local .jsonl / .json (a list) / .parquet file, a hub dataset id (downloaded through
huggingface_hub), or the built-in `arith` set of generated arithmetic word problems. A record is
turned into a prompt exactly as docs/algorithm.md says: one user turn rendered with the tokenizer's
chat template. The built-in `tiny` tokenizer (bytes + the DeepSeek chat tokens) lets all of this run
offline.
"""

import hashlib
import json
import os
import random
import re
import sys
from pathlib import Path

from grading.extract import extract_answer

MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
GPQA_INSTRUCTION = "Let's think step by step and output the final answer in the last line as:\nAnswer: <A/B/C/D>"

PROBLEM_FIELDS = ("problem", "question", "Problem", "Question")
ANSWER_FIELDS = ("answer", "final_answer", "Answer", "ground_truth")
ID_FIELDS = ("id", "unique_id", "idx", "problem_id", "ID")
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")


class DataError(ValueError):
    """A problem set that cannot be used; the message names the file and line."""


class HubUnreachable(DataError):
    """A hub id whose files are neither reachable (no network, HF_HUB_OFFLINE) nor in the local
    cache; the message says what to pass instead."""


def is_hub_id(name: str) -> bool:
    """Whether a --model / --tokenizer / --data value names a hub repository (owner/name) rather
    than a local path: it is of that form, no such path exists, and its owner is not a local folder
    (runs/dmeo is a mistyped run)."""
    path = Path(name).expanduser()
    return name.count("/") == 1 and not path.exists() and not path.parent.is_dir() and not name.startswith(".")


def no_such_path(name: str, what: str) -> str:
    """The message for a local path that does not exist, naming what its folder holds (a typo
    shows)."""
    path = Path(name).expanduser()
    folder = next((p for p in path.parents if p.is_dir()), Path("."))
    held = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))[:8] if folder.is_dir() else []
    shown = str(folder).rstrip("/") + "/"  # "runs/", and "/" rather than "//"
    return f"{name}: no such {what}" + (f" ({shown} holds: {', '.join(held)})" if held else "")


def hub_snapshot(repo_id: str, *, allow_patterns: list[str], instead: str, repo_type: str = "model") -> Path:
    """The files of a hub repository matching allow_patterns, downloaded or found in the local
    cache, in one attempt. snapshot_download asks the hub once and falls back to the cache
    (hf_hub_download and transformers retry an unreachable hub for 27-50 s first); a hub that does
    not answer, with nothing cached, is one HubUnreachable line ending in `instead`, what to pass in
    its place."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    try:
        return Path(snapshot_download(repo_id, repo_type=repo_type, allow_patterns=allow_patterns))
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as error:
        cause = error.__cause__ or error.__context__
        if isinstance(error, OfflineModeIsEnabled) or isinstance(cause, OfflineModeIsEnabled):
            switch = "TRANSFORMERS_OFFLINE" if os.environ.get("TRANSFORMERS_OFFLINE") and not \
                os.environ.get("HF_HUB_OFFLINE") else "HF_HUB_OFFLINE"
            why = f"{switch} keeps the hub off"
        else:  # the library's message starts "Got: ConnectError: ..." when the network failed
            first = str(cause or error).strip().splitlines()[0] if str(cause or error).strip() else ""
            reason = f"{type(cause).__name__}: {first}" if cause is not None else first.removeprefix("Got: ")
            why = f"the hub did not answer ({reason})" if reason else "the hub did not answer"
        raise HubUnreachable(f"{repo_id} is a Hugging Face hub id, but {why} and the local cache does not hold "
                             f"it; pass {instead} instead") from None


# ----------------------------------------------------------------------------- tokenizers

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT, THINK, END_THINK = "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"

# R1-Distill's template reduced to what a problem set needs (system, user and assistant turns); the
# same shape: BOS, system text, <｜User｜>..., and a generation prompt ending in
# <｜Assistant｜><think>\n.
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}{% endif %}{% endfor %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ '<｜User｜>' + m['content'] }}"
    "{% elif m['role'] == 'assistant' %}{{ '<｜Assistant｜>' + m['content'].split('</think>')[-1] + eos_token }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{% endif %}"
)


def _byte_chars() -> list[str]:
    """The printable stand-in character of each byte in byte-level BPE vocabularies (GPT-2's
    mapping)."""
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    stand_ins = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(stand_ins)) for b in range(256)]


def tiny_tokenizer():
    """A transformers tokenizer that needs no download: token id b < 256 is the byte b, then the
    DeepSeek chat tokens (ids 256-261: BOS, EOS, <｜User｜>, <｜Assistant｜>, <think>, </think>). BOS is
    prepended and EOS doubles as padding, and <think> / </think> are ordinary (non-special) tokens,
    all as in R1-Distill."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(_byte_chars())}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (BOS, EOS)])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in (USER, ASSISTANT, THINK, END_THINK)])
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 256)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=BOS, eos_token=EOS, pad_token=EOS,
                                   chat_template=TINY_CHAT_TEMPLATE)


ROUND_TRIP_PROBE = "What is 1+1?\nLet's think step by step: 1 + 1 = 2."


def round_trip(tokenizer) -> str:
    """ROUND_TRIP_PROBE encoded and decoded again: the probe itself when the tokenizer keeps text
    (spaces included)."""
    return tokenizer.decode(tokenizer.encode(ROUND_TRIP_PROBE, add_special_tokens=False))


_NOTED: set[str] = set()  # tokenizers load_tokenizer has said it reloaded (a run loads one several times)


def load_tokenizer(name_or_path: str):
    """'tiny' -> the built-in tokenizer; anything else through transformers' AutoTokenizer, checked
    to give back the text it encodes. transformers 5.x before ~5.2x loads a byte-level
    tokenizer.json whose tokenizer_config names LlamaTokenizerFast (DeepSeek-R1-Distill-Qwen's does)
    with a SentencePiece pipeline that drops every space from the prompts
    (huggingface/transformers#45488); such a tokenizer is loaded again as the generic
    PreTrainedTokenizerFast, which follows tokenizer.json (same ids as transformers 4)."""
    if name_or_path == "tiny":
        return tiny_tokenizer()
    import transformers

    if is_hub_id(name_or_path):  # fetched once
        name_or_path = str(hub_snapshot(name_or_path, allow_patterns=["*.json", "*.txt", "*.model", "*.jinja"],
                                        instead="a local directory holding the tokenizer's files"))
    elif not Path(name_or_path).expanduser().exists():
        raise FileNotFoundError(no_such_path(name_or_path, "tokenizer directory") + " (nor a hub id: owner/name)")
    tokenizer = transformers.AutoTokenizer.from_pretrained(name_or_path)
    decoded = round_trip(tokenizer)
    if decoded == ROUND_TRIP_PROBE:
        return tokenizer
    try:
        generic = transformers.PreTrainedTokenizerFast.from_pretrained(name_or_path)
    except (OSError, ValueError):  # no tokenizer.json to follow
        generic = None
    if generic is not None and round_trip(generic) == ROUND_TRIP_PROBE:
        if os.environ.get("RANK", "0") == "0" and name_or_path not in _NOTED:  # once per path and job
            _NOTED.add(name_or_path)
            print(f"note: {name_or_path}: transformers {transformers.__version__} loads it as "
                  f"{type(tokenizer).__name__}, which drops or changes text; loaded as PreTrainedTokenizerFast, "
                  "following its tokenizer.json", file=sys.stderr)
        return generic
    raise ValueError(f"the tokenizer of {name_or_path} does not give back the text it encodes ({ROUND_TRIP_PROBE!r} "
                     f"-> {decoded!r}) under transformers {transformers.__version__}, whether loaded by AutoTokenizer "
                     "or as PreTrainedTokenizerFast; prompts would not say what the data says")


# ----------------------------------------------------------------------------- prompts


def math_prompt(problem: str, *, final_period: bool = True, instruction: str = MATH_INSTRUCTION) -> str:
    """The paper's math prompt: the problem, then the instruction ('' = the problem alone). The
    released preprocessing of the DeepScaleR training set drops the final period
    (final_period=False); evaluation prompts keep it."""
    if not instruction:
        return problem
    text = f"{problem} {instruction}"
    return text if final_period else text.removesuffix(".")


def gpqa_prompt(question: str) -> str:
    return f"{question}\n\n{GPQA_INSTRUCTION}"


def encode_prompt(tokenizer, text: str) -> list[int]:
    """One user turn rendered with the tokenizer's chat template and a generation prompt (R1-Distill
    ends with `<｜Assistant｜><think>\\n`); a tokenizer without a template gets the plain text."""
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=False)
        return tokenizer(rendered, add_special_tokens=False)["input_ids"]  # the template already holds BOS
    return tokenizer(text)["input_ids"]


def pad_id_of(tokenizer) -> int:
    """The id that pads prompts and finished responses: the tokenizer's pad token, else its end of
    sequence."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def tokenize_problems(problems: list[dict], tokenizer, *, max_prompt_tokens: int, style: str = "math",
                      final_period: bool = True, instruction: str = MATH_INSTRUCTION) -> tuple[list[dict], int]:
    """Adds `prompt_ids` to each problem (style "math" with `instruction`, or "gpqa") and drops
    those longer than max_prompt_tokens. Returns (kept problems, number dropped)."""
    kept = []
    for problem in problems:
        text = gpqa_prompt(problem["problem"]) if style == "gpqa" else math_prompt(
            problem["problem"], final_period=final_period, instruction=instruction)
        ids = encode_prompt(tokenizer, text)
        if len(ids) <= max_prompt_tokens:
            kept.append({**problem, "prompt_ids": ids})
    return kept, len(problems) - len(kept)


# ----------------------------------------------------------------------------- problem sets


def load_problems(source: str, *, split: str = "train", limit: int | None = None) -> list[dict]:
    """Problems {id, problem, answer} from a local file, a hub dataset id or a built-in set.

    Built-in: `arith` or `arith:difficulty=2,n=500,seed=1,max_count=5,think=1` (see arith_problems);
    its train and test splits never share a problem."""
    if source == "arith" or source.startswith("arith:"):
        problems = arith_problems(split=split, first=limit, **_parse_options(source.partition(":")[2]))
    else:
        path = Path(source).expanduser()
        if path.is_file():
            problems = read_problem_file(path)
        elif path.is_dir():
            raise DataError(f"{source} is a directory: pass one .jsonl / .json / .parquet file of problems")
        elif path.exists() or not is_hub_id(source) or path.suffix in DATA_SUFFIXES:
            raise DataError(no_such_path(source, "file") + ", and not a built-in set (arith) or a hub dataset id "
                            "(owner/name)")
        else:
            problems = [p for f in _split_files(download_dataset(source), split, source) for p in read_problem_file(f)]
    if not problems:
        raise DataError(f"{source}: no problems")
    return problems[:limit] if limit is not None else problems


def download_dataset(repo_id: str) -> Path:
    """The data files of a hub dataset repository, downloaded (or found in the local HF cache)."""
    return hub_snapshot(repo_id, repo_type="dataset", allow_patterns=[f"*{s}" for s in DATA_SUFFIXES],
                        instead="the path of a local .jsonl / .json / .parquet file of its problems")


def _split_files(root: Path, split: str, source: str) -> list[Path]:
    """The files of one split: those whose name mentions it (train-00000-of-00002.parquet,
    data/test.jsonl), else the only data file there is (DeepScaleR ships a single deepscaler.json)."""
    files = sorted(f for f in root.rglob("*") if f.suffix in DATA_SUFFIXES and not f.name.startswith("dataset_")
                   and not any(part.startswith(".") for part in f.relative_to(root).parts))
    matching = [f for f in files if split in re.split(r"[^a-zA-Z0-9]+", str(f.relative_to(root)))]
    if matching:
        return matching
    if len(files) == 1:
        return files
    names = ", ".join(str(f.relative_to(root)) for f in files) or "none"
    raise DataError(f"{source}: no data file for split {split!r} (files: {names})")


def read_problem_file(path: Path) -> list[dict]:
    """A .jsonl, .json (a list of objects) or .parquet file, normalised record by record."""
    path = Path(path)
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DataError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
        rows = pq.read_table(path).to_pylist()
        return [normalise_record(row, f"{path}: row {i + 1}", default_id=f"{path.stem}-{i}")
                for i, row in enumerate(rows)]
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error})") from None
    if path.suffix == ".json" and not text.lstrip().startswith("["):
        raise DataError(f"{path}: a .json file of problems holds one JSON list of objects ([{{...}}, ...]), this "
                        "one does not; for one object per line name it .jsonl")
    records = _json_list(text, path) if text.lstrip().startswith("[") else _json_lines(text, path)
    return [normalise_record(record, f"{path}:{line}", default_id=f"{path.stem}-{i}")
            for i, (line, record) in enumerate(records)]


def _json_lines(text: str, path: Path) -> list[tuple[int, object]]:
    records = []
    # split("\n"), not splitlines(): JSON strings may hold U+2028 or U+0085, which splitlines()
    # breaks on.
    for line_no, line in enumerate(text.split("\n"), 1):
        if line.strip():
            try:
                records.append((line_no, json.loads(line)))
            except json.JSONDecodeError as error:
                raise DataError(f"{path}:{line_no}: invalid JSON ({error.msg} at column {error.colno})") from None
    return records


def _json_list(text: str, path: Path) -> list[tuple[int, object]]:
    """Decodes a JSON list item by item, so that each record keeps the line it starts on."""
    decoder = json.JSONDecoder()
    records, pos = [], text.index("[") + 1
    while True:
        pos = _skip_space(text, pos)
        if pos < len(text) and text[pos] == "]" and not records:
            break
        try:
            record, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{error.lineno}: invalid JSON ({error.msg} at column {error.colno})") from None
        records.append((text.count("\n", 0, pos) + 1, record))
        pos = _skip_space(text, end)
        if pos < len(text) and text[pos] == ",":
            pos += 1
        elif pos < len(text) and text[pos] == "]":
            break
        else:
            line = text.count("\n", 0, pos) + 1
            raise DataError(f"{path}:{line}: invalid JSON (expected ',' or ']' after a list item)")
    if _skip_space(text, pos + 1) != len(text):
        raise DataError(f"{path}:{text.count(chr(10), 0, pos) + 1}: invalid JSON (text after the closing ']')")
    return records


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def normalise_record(record, where: str, *, default_id: str) -> dict:
    """{id, problem, answer} from the field names problem sets use. The answer is an `answer`-like
    field or, failing that, the last \\boxed{} of a `solution`; `where` ("file:line") prefixes every
    error."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    problem = next((record[k] for k in PROBLEM_FIELDS if isinstance(record.get(k), str) and record[k].strip()), None)
    if problem is None:
        raise DataError(f"{where}: no problem text (expected a non-empty '{PROBLEM_FIELDS[0]}' or "
                        f"'{PROBLEM_FIELDS[1]}' field; fields: {', '.join(record) or 'none'})")
    answer = next((record[k] for k in ANSWER_FIELDS if record.get(k) not in (None, "", [])), None)
    if answer is None and isinstance(record.get("reward_model"), dict):  # verl's parquet layout
        answer = record["reward_model"].get("ground_truth")
    if isinstance(answer, dict) or (isinstance(answer, (list, tuple)) and any(isinstance(a, dict) for a in answer)):
        raise DataError(f"{where}: the answer is a JSON object ({json.dumps(answer)[:80]}); a reference answer is a "
                        "string or a number, or a list of them")
    answer = _answer_text(answer)
    if not answer and isinstance(record.get("solution"), str):
        answer = (extract_answer(record["solution"], require_boxed=True) or "").strip()
    if not answer:
        raise DataError(f"{where}: no usable answer (no non-empty 'answer' field and no \\boxed{{}} in 'solution')")
    for name, text in (("problem", problem), ("answer", answer)):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:  # a lone surrogate such as "\ud800", legal in JSON, not in UTF-8
            bad = text[error.start : error.end].encode("unicode_escape").decode()
            raise DataError(f"{where}: the {name} holds {bad}, half of a UTF-16 surrogate pair, which is not text; "
                            "fix or drop this record") from None
    found_id = next((record[k] for k in ID_FIELDS if record.get(k) not in (None, "")), default_id)
    return {**({"solution": record["solution"]} if isinstance(record.get("solution"), str) else {}),
            "id": str(found_id), "problem": problem, "answer": answer}


def _answer_text(answer) -> str:
    """27.0 -> "27", 2.5 -> "2.5", ["1", "2"] -> "1, 2", "025" stays "025" (the grader decides
    equality)."""
    if answer is None:
        return ""
    if isinstance(answer, float) and answer.is_integer():
        return str(int(answer))
    if isinstance(answer, (list, tuple)):
        return ", ".join(_answer_text(a) for a in answer)
    return str(answer).strip()


def _parse_options(text: str) -> dict:
    """'difficulty=2,n=500' -> {"difficulty": 2, "n": 500}."""
    names = ("difficulty", "n", "seed", "max_count", "think")
    options = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key.strip() not in names or not value.strip().isdigit():
            raise DataError(f"arith option {item!r}: expected {', '.join(f'{name}=INT' for name in names)}")
        options[key.strip()] = int(value)
    return options


# ----------------------------------------------------------------------------- the built-in arithmetic set

NAMES = ("Ava", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea", "Milo", "Nia")
ITEMS = ("apples", "marbles", "stickers", "coins", "shells", "pencils", "stamps", "cards", "beads", "books")


def arith_problems(n: int = 1000, difficulty: int = 1, seed: int = 0, split: str = "train",
                   max_count: int = 0, first: int | None = None, think: int = 0) -> list[dict]:
    """Seeded arithmetic word problems with exact non-negative integer answers and a worked
    solution.

    difficulty d: d operations (+, -, x, exact /) on counts up to max_count (0 = 10·d). A problem
    belongs to the test split when a hash of its text falls in the lowest tenth, so train and test
    never share a problem. A smaller max_count means fewer distinct sums to learn (the demo's
    max_count=5: 25 sums and 15 differences), so that a short RL run meets each of them many times.
    first: stop after that many, the first problems of the whole set (a held-out set of 200 need not
    draw the rest). think=1: the worked solution is R1's shape, a thinking block closed by </think>
    then the answer (`9+4=13. 13-2=11.\n</think>\n\n\\boxed{11}`; the prompt opens the block), the
    same problems as think=0.

    >>> arith_problems(1, seed=3)[0]["problem"]
    'Jun has 9 books. Jun gets 4 more books. How many books does Jun have now?'
    """
    if split not in ("train", "test"):
        raise DataError(f"arith has the splits train and test, not {split!r}")
    if difficulty < 1 or n < 1 or max_count < 0:
        raise DataError("arith needs difficulty >= 1, n >= 1 and max_count >= 0")
    rng = random.Random(f"arith:{difficulty}:{seed}" + (f":{max_count}" if max_count else ""))
    problems, seen = [], set()
    for _ in range(200 * n):  # small sets run out of distinct problems: stop rather than loop forever
        # A draw is its choices; the text is written (and hashed for the split) only the first time
        # they come up: a small set draws mostly repeats (the demo's: 200,000 draws, ~5,600 distinct
        # problems).
        draw = _arith_draw(rng, difficulty, max_count or 10 * difficulty)
        if draw in seen:
            continue
        seen.add(draw)
        problem = _arith_text(*draw, think=bool(think))
        digest = int(hashlib.sha256(problem["problem"].encode()).hexdigest(), 16)
        if (digest % 10 == 0) != (split == "test"):
            continue
        problems.append({"id": f"arith-{split}-{len(problems)}", **problem})
        if len(problems) == min(n, first or n):
            break
    return problems


def _arith_draw(rng: random.Random, difficulty: int, top: int) -> tuple:
    """One problem's random choices: (name, item, starting count, ((op, k), ...)). Two draws are the
    same problem exactly when they are equal (the text is a function of them)."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    count = start = rng.randint(1, top)
    ops = []
    for _ in range(difficulty):
        op = rng.choice("+-*/") if difficulty > 1 else rng.choice("+-")
        divisors = [k for k in range(2, 6) if count % k == 0]
        if op == "-" and count == 0 or op == "/" and not divisors:
            op = "+"
        if op == "+":
            k = rng.randint(1, top)
            count += k
        elif op == "-":
            k = rng.randint(1, count)
            count -= k
        elif op == "*":
            k = rng.randint(2, 4)
            count *= k
        else:
            k = rng.choice(divisors)
            count //= k
        ops.append((op, k))
    return name, item, start, tuple(ops)


def _arith_text(name: str, item: str, count: int, ops: tuple, think: bool = False) -> dict:
    """The problem, its answer and a worked solution of one draw."""
    sentences, steps = [f"{name} has {count} {item}."], []
    for op, k in ops:
        new = {"+": count + k, "-": count - k, "*": count * k, "/": count // (k or 1)}[op]
        sentences.append({"+": f"{name} gets {k} more {item}.", "-": f"{name} gives away {k} {item}.",
                          "*": f"{name} ends up with {k} times as many {item}.",
                          "/": f"{name} splits the {item} into {k} equal piles and keeps one pile."}[op])
        steps.append(f"{count}{op}{k}={new}.")
        count = new
    sentences.append(f"How many {item} does {name} have now?")
    answer = f"\n{END_THINK}\n\n\\boxed{{{count}}}" if think else f" \\boxed{{{count}}}"
    return {"problem": " ".join(sentences), "answer": str(count), "solution": " ".join(steps) + answer}


# ----------------------------------------------------------------------------- batching


class PromptBatcher:
    """Endless batches of problems in a seeded order that changes every epoch, with a cursor.

    The order of epoch e is a function of (seed, e) alone, so `state_dict()` (epoch, index) is all a
    checkpoint needs: a resumed run sees exactly the prompts it would have seen. A batch that runs
    past the end of an epoch is completed from the next one."""

    def __init__(self, items: list, batch_size: int, seed: int = 0):
        if not items:
            raise DataError("cannot batch an empty problem set")
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.items, self.batch_size, self.seed = items, batch_size, seed
        self.epoch, self.index = 0, 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.items)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def next_batch(self) -> list:
        batch = []
        while len(batch) < self.batch_size:
            if self.index == len(self.items):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._epoch_order(self.epoch)
            take = min(self.batch_size - len(batch), len(self.items) - self.index)
            batch += [self.items[i] for i in self._order[self.index : self.index + take]]
            self.index += take
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed, "num_items": len(self.items)}

    def load_state_dict(self, state: dict) -> None:
        if state["seed"] != self.seed or state["num_items"] != len(self.items):
            raise ValueError(f"data cursor was saved for {state['num_items']} problems with seed {state['seed']}, "
                             f"but this run has {len(self.items)} problems with seed {self.seed}")
        self.epoch, self.index = state["epoch"], state["index"]
        self._order = self._epoch_order(self.epoch)


def describe_load_error(error: Exception, flag: str) -> str:
    """A loading failure as one line that names the flag it came from, with what to do when it
    needed the network (these machines may not reach the Hugging Face hub)."""
    if isinstance(error, HubUnreachable):  # says itself what to pass instead
        return f"cannot load {flag}: {error}"
    text = f"{type(error).__name__}: {str(error).splitlines()[0]}" if str(error).strip() else type(error).__name__
    if isinstance(error, (DataError, FileNotFoundError)) and str(error).strip():
        text = str(error).splitlines()[0]
    if any(word in text for word in ("Connect", "Timeout", "resolve", "offline", "HTTP", "Network", "LocalEntry")):
        text += (f" ({flag} needed the Hugging Face hub, which did not answer: pass a local file or directory, or "
                 "set HF_HUB_OFFLINE=1 to use only what is in the local cache)")
    return f"cannot load {flag}: {text}"
