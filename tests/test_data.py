"""data.py: the real problem files load with the right counts, bad input names file and line, prompts render
as docs/algorithm.md says, the arith set is right by an independent re-derivation, and the batch cursor resumes."""

import json
import re
import sys

import pytest

import data
from model import TINY_CONFIG

BENCHMARKS = {"aime24": 30, "aime25": 30, "amc23": 40, "math500": 500, "gpqa_diamond": 198}
R1_TOKENIZER = "tokenizers/DeepSeek-R1-Distill-Qwen-rebuilt"


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_benchmark_files_load_with_their_counts(shared_data, name):
    problems = data.load_problems(str(shared_data / "eval" / f"{name}.jsonl"))
    assert len(problems) == BENCHMARKS[name]
    assert len({p["id"] for p in problems}) == len(problems)
    assert all(p["problem"].strip() and p["answer"].strip() for p in problems)


def test_answers_are_normalised_to_text(shared_data):
    amc = data.load_problems(str(shared_data / "eval" / "amc23.jsonl"))
    assert amc[0]["answer"] == "27"  # stored as the float 27.0
    aime = data.load_problems(str(shared_data / "eval" / "aime24.jsonl"))
    assert "025" in [p["answer"] for p in aime]  # zero padding is the grader's business, kept as written
    gpqa = data.load_problems(str(shared_data / "eval" / "gpqa_diamond.jsonl"))
    assert {p["answer"] for p in gpqa} == {"A", "B", "C", "D"}


def test_deepscaler_subset_loads(shared_data):
    problems = data.load_problems(str(shared_data / "train" / "deepscaler_partial_803.jsonl"))
    assert len(problems) == 803
    assert problems[0]["problem"].startswith("The operation $\\otimes$")


def test_json_list_gives_the_same_records_as_jsonl(shared_data, tmp_path):
    source = shared_data / "train" / "deepscaler_partial_803.jsonl"
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    as_list = tmp_path / "deepscaler.json"
    as_list.write_text(json.dumps(rows, indent=2))
    from_list = data.load_problems(str(as_list))
    from_lines = data.load_problems(str(source))
    assert [(p["problem"], p["answer"]) for p in from_list] == [(p["problem"], p["answer"]) for p in from_lines]


@pytest.mark.extra
def test_parquet_loads_when_pyarrow_is_there(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"question": "1+1?", "answer": 2}, {"question": "2+2?", "answer": 4}]),
                   tmp_path / "train.parquet")
    problems = data.load_problems(str(tmp_path / "train.parquet"))
    assert [(p["problem"], p["answer"]) for p in problems] == [("1+1?", "2"), ("2+2?", "4")]


def test_a_parquet_file_without_pyarrow_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed: its import fails
    (tmp_path / "train.parquet").write_bytes(b"PAR1")
    with pytest.raises(data.DataError) as refused:
        data.load_problems(str(tmp_path / "train.parquet"))
    assert str(refused.value) == f"{tmp_path / 'train.parquet'}: reading parquet needs pyarrow (pip install pyarrow)"


def write(path, text):
    path.write_text(text)
    return str(path)


def test_field_name_variants_are_normalised(tmp_path):
    path = write(tmp_path / "mixed.jsonl", "\n".join(json.dumps(r) for r in [
        {"question": "Q1", "answer": 3},
        {"problem": "Q2", "solution": "so $x = \\boxed{\\frac{1}{2}}$ and we are done", "unique_id": "u2"},
        {"problem": "Q3", "reward_model": {"ground_truth": "7"}},
        {"Problem": "Q4", "final_answer": 2.5, "idx": 9},
    ]) + "\n")
    problems = data.load_problems(path)
    assert [(p["problem"], p["answer"]) for p in problems] == [("Q1", "3"), ("Q2", "\\frac{1}{2}"), ("Q3", "7"),
                                                               ("Q4", "2.5")]
    assert [p["id"] for p in problems] == ["mixed-0", "u2", "mixed-2", "9"]


@pytest.mark.parametrize("name, content, message", [
    ("bad.jsonl", '{"problem": "a", "answer": "1"}\n\n{"problem": "b", "answer": \n', "3: invalid JSON"),
    ("noanswer.jsonl", '{"problem": "a", "answer": "1"}\n{"problem": "b", "solution": "no box"}\n',
     "2: no usable answer"),
    ("noproblem.jsonl", '{"problem": "a", "answer": "1"}\n{"text": "b", "answer": "2"}\n', "2: no problem text"),
    ("list.jsonl", '{"problem": "a", "answer": "1"}\n[1, 2]\n', "2: expected a JSON object"),
], ids=["malformed-json", "no-answer", "no-problem", "not-an-object"])
def test_a_bad_record_names_file_and_line(tmp_path, name, content, message):
    path = write(tmp_path / name, content)
    with pytest.raises(data.DataError, match=re.escape(f"{path}:{message}")):
        data.load_problems(path)


def test_json_list_errors_name_the_line_of_the_item(tmp_path):
    good = '  {"problem": "a", "answer": "1"}'
    path = write(tmp_path / "list.json", f'[\n{good},\n{good},\n  {{"problem": "c"}}\n]\n')
    with pytest.raises(data.DataError, match=re.escape(f"{path}:4: no usable answer")):
        data.load_problems(path)
    path = write(tmp_path / "broken.json", f'[\n{good},\n{good}\n{good}\n]\n')
    with pytest.raises(data.DataError, match=re.escape(f"{path}:4: invalid JSON")):
        data.load_problems(path)


def test_empty_file_is_an_error(tmp_path):
    with pytest.raises(data.DataError, match="no problems"):
        data.load_problems(write(tmp_path / "empty.jsonl", "\n"))


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(data.DataError, match="no such file"):
        data.load_problems(str(tmp_path / "nope.jsonl"))


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    """Replaces the hub download: snapshot_download returns a local directory and records what was asked."""
    import huggingface_hub

    calls = []
    root = tmp_path / "hub"
    root.mkdir()

    def snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs.get("repo_type")))
        return str(root)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return root, calls


def test_hub_dataset_id_is_downloaded_and_read(shared_data, fake_hub):
    root, calls = fake_hub
    lines = (shared_data / "train" / "deepscaler_partial_803.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    (root / "deepscaler.json").write_text(json.dumps(rows))  # DeepScaleR's layout: one JSON list
    problems = data.load_problems("agentica-org/DeepScaleR-Preview-Dataset")
    assert calls == [("agentica-org/DeepScaleR-Preview-Dataset", "dataset")]
    assert len(problems) == 803


def test_hub_dataset_split_picks_its_files(fake_hub):
    root, _ = fake_hub
    (root / "data").mkdir()
    (root / "data" / "train-00000-of-00001.jsonl").write_text('{"problem": "train q", "answer": "1"}\n')
    (root / "data" / "test-00000-of-00001.jsonl").write_text('{"problem": "test q", "answer": "2"}\n')
    assert [p["problem"] for p in data.load_problems("math-ai/aime24", split="test")] == ["test q"]
    assert [p["problem"] for p in data.load_problems("math-ai/aime24", split="train")] == ["train q"]
    with pytest.raises(data.DataError, match="no data file for split 'validation'"):
        data.load_problems("math-ai/aime24", split="validation")


# ----------------------------------------------------------------------------- arith


def solve_by_reading(problem: str) -> int:
    """An independent reading of the generated text: apply each sentence's operation in order."""
    count = int(re.match(r"\w+ has (\d+) ", problem).group(1))
    for sentence in problem.split(". ")[1:]:
        if m := re.search(r"gets (\d+) more", sentence):
            count += int(m.group(1))
        elif m := re.search(r"gives away (\d+)", sentence):
            count -= int(m.group(1))
        elif m := re.search(r"with (\d+) times as many", sentence):
            count *= int(m.group(1))
        elif m := re.search(r"into (\d+) equal piles", sentence):
            assert count % int(m.group(1)) == 0
            count //= int(m.group(1))
    return count


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_arith_answers_are_exact_integers(difficulty):
    problems = data.arith_problems(200, difficulty=difficulty, seed=1)
    assert len(problems) == 200
    for p in problems:
        assert p["answer"] == str(solve_by_reading(p["problem"]))
        assert int(p["answer"]) >= 0
        assert p["solution"].endswith(f"\\boxed{{{p['answer']}}}")
        # The difficulty knob is the number of operations.
        assert len(p["problem"].split(". ")) == difficulty + 2


def test_arith_is_seeded_and_splits_are_disjoint():
    assert data.arith_problems(50, seed=4) == data.arith_problems(50, seed=4)
    assert data.arith_problems(50, seed=4) != data.arith_problems(50, seed=5)
    train = {p["problem"] for p in data.arith_problems(2000, difficulty=2)}
    test = {p["problem"] for p in data.arith_problems(200, difficulty=2, split="test")}
    assert len(test) == 200 and not train & test


def test_arith_max_count_bounds_the_counts_and_the_distinct_facts():
    problems = data.load_problems("arith:max_count=5,n=500")
    facts = {(*map(int, re.findall(r"\d+", p["problem"])), "gets" in p["problem"]) for p in problems}
    assert all(1 <= a <= 5 and 1 <= b <= 5 for a, b, _ in facts)
    assert all(p["answer"] == str(solve_by_reading(p["problem"])) for p in problems)
    assert len(facts) >= 38  # of the 25 sums and 15 differences (1 <= b <= a <= 5) there are
    with pytest.raises(data.DataError, match="max_count"):
        data.arith_problems(5, max_count=-1)


def test_arith_source_string_options():
    problems = data.load_problems("arith:difficulty=2,n=30,seed=7", split="test")
    assert problems == data.arith_problems(30, difficulty=2, seed=7, split="test")
    with pytest.raises(data.DataError, match="arith option"):
        data.load_problems("arith:level=3")


# ----------------------------------------------------------------------------- batching


def test_batcher_visits_every_item_once_per_epoch():
    items = list(range(10))
    batcher = data.PromptBatcher(items, batch_size=5, seed=0)
    epoch0 = batcher.next_batch() + batcher.next_batch()
    epoch1 = batcher.next_batch() + batcher.next_batch()
    assert sorted(epoch0) == sorted(epoch1) == items
    assert epoch0 != epoch1  # reshuffled


def test_batcher_fills_a_batch_across_the_epoch_boundary():
    batcher = data.PromptBatcher(list(range(7)), batch_size=3, seed=1)
    seen = [batcher.next_batch() for _ in range(7)]  # 21 items = 3 epochs exactly
    assert all(len(b) == 3 for b in seen)
    flat = [x for b in seen for x in b]
    assert all(sorted(flat[i : i + 7]) == list(range(7)) for i in (0, 7, 14))


def test_batcher_order_depends_on_the_seed():
    a = data.PromptBatcher(list(range(100)), 10, seed=0).next_batch()
    assert a == data.PromptBatcher(list(range(100)), 10, seed=0).next_batch()
    assert a != data.PromptBatcher(list(range(100)), 10, seed=1).next_batch()


def test_batcher_cursor_restores_exactly():
    items = [f"p{i}" for i in range(23)]
    original = data.PromptBatcher(items, batch_size=4, seed=3)
    for _ in range(9):  # past the first epoch boundary
        original.next_batch()
    state = json.loads(json.dumps(original.state_dict()))  # as a checkpoint would store it
    expected = [original.next_batch() for _ in range(12)]
    resumed = data.PromptBatcher(items, batch_size=4, seed=3)
    resumed.load_state_dict(state)
    assert [resumed.next_batch() for _ in range(12)] == expected


def test_batcher_refuses_a_cursor_from_other_data():
    state = data.PromptBatcher(list(range(10)), 2, seed=0).state_dict()
    with pytest.raises(ValueError, match="10 problems"):
        data.PromptBatcher(list(range(11)), 2, seed=0).load_state_dict(state)


# ----------------------------------------------------------------------------- tokenizers and prompts


def test_r1_tokenizer_renders_the_paper_prompt(shared_data):
    tokenizer = data.load_tokenizer(str(shared_data / R1_TOKENIZER))
    ids = data.encode_prompt(tokenizer, data.math_prompt("What is 1+1?"))
    expected = ("<｜begin▁of▁sentence｜><｜User｜>What is 1+1? Let's think step by step and output the final answer "
                "within \\boxed{}.<｜Assistant｜><think>\n")
    assert tokenizer.decode(ids) == expected
    assert ids.count(151646) == 1 and ids[0] == 151646  # one BOS, from the template
    assert ids[-3:] == [151645, 151648, 198]  # <｜Assistant｜> <think> \n
    assert tokenizer.encode("</think>", add_special_tokens=False) == [151649]


def space_dropping(path):
    """The R1 tokenizer as transformers 5.x before ~5.2x loads it (huggingface/transformers#45488): tokenizer.json's
    byte-level pipeline replaced by LlamaTokenizer's SentencePiece one, which drops every space."""
    from tokenizers import decoders, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", split=False)
    tokenizer.backend_tokenizer.decoder = decoders.Metaspace(replacement="\u2581")
    return tokenizer


def test_a_tokenizer_that_drops_spaces_is_loaded_again_from_its_tokenizer_json(shared_data, monkeypatch, capsys):
    import tokenizers
    import transformers

    path = str(shared_data / R1_TOKENIZER)
    broken = space_dropping(path)
    assert broken.decode(broken.encode("a b", add_special_tokens=False)) != "a b"  # the fault is reproduced
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *args, **kwargs: space_dropping(path))
    monkeypatch.setattr(data, "_NOTED", set())
    tokenizer = data.load_tokenizer(path)
    text = "Let's think step by step: 12 + 30 = 42.\n\\boxed{42}"
    reference = tokenizers.Tokenizer.from_file(str(shared_data / R1_TOKENIZER / "tokenizer.json"))
    assert tokenizer.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False).ids
    assert data.encode_prompt(tokenizer, data.math_prompt("What is 1+1?"))[-3:] == [151645, 151648, 198]
    assert "loaded as PreTrainedTokenizerFast" in capsys.readouterr().err
    data.load_tokenizer(path)  # a run loads its tokenizer several times (policy, checks, eval): one note
    assert "loaded as PreTrainedTokenizerFast" not in capsys.readouterr().err


def test_a_tokenizer_that_cannot_give_back_its_text_is_refused(shared_data, monkeypatch):
    import transformers

    broken = space_dropping(str(shared_data / R1_TOKENIZER))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *args, **kwargs: broken)
    monkeypatch.setattr(transformers.PreTrainedTokenizerFast, "from_pretrained", lambda *args, **kwargs: broken)
    with pytest.raises(ValueError, match="does not give back the text it encodes"):
        data.load_tokenizer(str(shared_data / R1_TOKENIZER))


def test_training_prompts_drop_the_final_period():
    assert data.math_prompt("Find x.", final_period=False) == (
        "Find x. Let's think step by step and output the final answer within \\boxed{}")
    assert data.gpqa_prompt("Which?\n\nA) 1\nB) 2") == (
        "Which?\n\nA) 1\nB) 2\n\nLet's think step by step and output the final answer in the last line as:\n"
        "Answer: <A/B/C/D>")


def test_instruction_setting_replaces_the_papers_or_leaves_the_problem_alone():
    assert data.math_prompt("Find x.", instruction="") == "Find x."
    assert data.math_prompt("Find x.", instruction="Box it.", final_period=False) == "Find x. Box it"
    kept, _ = data.tokenize_problems([{"problem": "2+3?", "answer": "5"}], data.tiny_tokenizer(),
                                     max_prompt_tokens=100, instruction="")
    assert data.tiny_tokenizer().decode(kept[0]["prompt_ids"]) == (
        "<｜begin▁of▁sentence｜><｜User｜>2+3?<｜Assistant｜><think>\n")


def test_tiny_tokenizer_loads_back_with_autotokenizer(tmp_path):
    from transformers import AutoTokenizer

    data.tiny_tokenizer().save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    ids = data.encode_prompt(tokenizer, "2+3?")
    assert tokenizer.decode(ids) == "<｜begin▁of▁sentence｜><｜User｜>2+3?<｜Assistant｜><think>\n"
    assert ids == [256, 258, *b"2+3?", 259, 260, 10]
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == 257
    assert tokenizer.encode("</think>", add_special_tokens=False) == [261]
    assert len(tokenizer) == TINY_CONFIG.vocab_size


def test_tiny_tokenizer_round_trips_any_text():
    tokenizer = data.tiny_tokenizer()
    text = "x² + √2 ≈ 3.41, 答案 \\boxed{42} 🙂</think>\n\t done"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    # End-of-sentence is dropped with special tokens skipped; </think> stays, as with R1-Distill.
    assert tokenizer.decode(ids + [257], skip_special_tokens=True) == text


def test_tokenizer_without_template_gets_plain_text():
    tokenizer = data.tiny_tokenizer()
    tokenizer.chat_template = None
    assert data.encode_prompt(tokenizer, "1+1?") == [256, *b"1+1?"]


def test_long_prompts_are_dropped_and_counted():
    problems = [{"id": "a", "problem": "1+1?", "answer": "2"}, {"id": "b", "problem": "9" * 300, "answer": "9"}]
    kept, dropped = data.tokenize_problems(problems, data.tiny_tokenizer(), max_prompt_tokens=100)
    assert dropped == 1 and [p["id"] for p in kept] == ["a"]
    text = b"1+1? Let's think step by step and output the final answer within \\boxed{}."
    assert kept[0]["prompt_ids"] == [256, 258, *text, 259, 260, 10]
