"""Every command in README.md and docs/*.md runs as written: the commands are taken from the pages themselves
(each line of a ```bash block, each `$ ` line of a transcript, each `python ...` / `pip ...` / `torchrun ...`
code span, each ```python block) and run in a copy of the repo with ../shared beside it, in document order
within a block. A transcript run as written must print what the page shows. A command of an optional feature
(EXTRAS) whose package is not installed is left out, the rest of its block runs, and the test skips naming it.

Some cannot run here as written: they need a GPU, the Hugging Face hub, the package index, the outputs of a
run that takes minutes, or they name placeholders. NOT_AS_WRITTEN says why for each and what runs instead: a
small variant of it, or PARSE (its flags are parsed by the programs it names and nothing runs). A command a
page gains that needs none of that runs as written; one that does must be added there, and a fenced command
that needs a GPU or the hub must say so in the comments above it. Python commands run in this process (a
run of `python X.py` would spend most of its time importing torch), with the copy's directory on sys.path as
Python would put the script's; the others run in bash, HF_HUB_OFFLINE=1."""

import importlib.util
import json
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch.distributed.run

import eval as E
import strategies
import train

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = ("python ", "torchrun ", "pytest ", "pip ", "bash ", "ruff ", "OMP_NUM_THREADS=")
PARSE = "parse"  # instead of running: the programs the command names parse its flags
# The demo cut to seconds (a few steps of each phase on 100 of its problems): runs/demo as the demo leaves it.
SMALL_DEMO = ("--data arith:max_count=5,n=100 --sft-steps 2 --sft-batch-size 4 --sft-dev-problems 4 --eval-problems 4 "
              "--prompts-per-step 4 --mini-batch-prompts 4 --max-new-tokens 8 --max-steps 1")
PLAN_7B = "--preset paper-7b --model ../shared/data/configs/DeepSeek-R1-Distill-Qwen-7B --plan"
NOT_AS_WRITTEN = {  # the command as written -> (what it needs, what runs instead)
    "pip install -r requirements.txt && python train.py --preset demo":
        ("the package index; the demo takes 63-84 s", ("pip install --dry-run --no-index -r requirements.txt",
                                                       f"python train.py --preset demo {SMALL_DEMO}")),
    "python train.py --preset demo-think": ("its 4 minutes", f"python train.py --preset demo-think {SMALL_DEMO} "
                                                              "--data arith:difficulty=2,max_count=5,think=1,n=100"),
    "pytest tests/": ("8 minutes: it is this suite", "pytest -q -p no:cacheprovider -n 0 tests/test_house.py"),
    "python train.py": ("a GPU and the hub", PARSE),
    "python train.py --model deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": ("a GPU and the hub", PARSE),
    "python train.py --plan": ("the hub", "python train.py --plan --model ../shared/data/tokenizers/"
                                          "DeepSeek-R1-Distill-Qwen-1.5B"),
    "torchrun --nproc-per-node 8 train.py --preset paper-1.5b --rollout-batch-size 32": ("GPUs", PARSE),
    "torchrun --nproc-per-node 8 train.py --preset paper-7b --rollout-batch-size 32": ("GPUs", PARSE),
    "torchrun --nproc-per-node 8 -- eval.py --model runs/ngrpo/checkpoints/step-500 --n 32 --batch-size 64":
        ("GPUs", PARSE),
    "torchrun --nnodes 2 --node-rank R --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 train.py "
    "--preset paper-7b --rollout-batch-size 16": ("GPUs on two nodes", PARSE),
    "python train.py --preset paper-7b --model DIR_OR_HUB_ID --plan [--plan-gpus N] [--plan-gpu-gb G]":
        ("placeholders", f"python train.py {PLAN_7B} --plan-gpus 4 --plan-gpu-gb 141"),
    "python train.py --preset paper-7b --model deepseek-ai/DeepSeek-R1-Distill-Qwen-7B --plan --plan-gpus 8 "
    "--plan-gpu-gb 80": ("the hub", f"python train.py {PLAN_7B} --plan-gpus 8 --plan-gpu-gb 80"),
    "python eval.py --model deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B --benchmarks aime24,aime25,amc23,math500":
        ("a GPU and the hub", PARSE),
    "python eval.py --model runs/demo --benchmarks arith:max_count=5 --instruction '' --n 8 --max-new-tokens 64":
        ("the demo's run (minutes)", "python eval.py --model runs/demo --benchmarks arith:max_count=5 "
                                     "--instruction '' --n 2 --max-new-tokens 16 --limit 4"),
    "python bench.py NAME": ("a placeholder", "python bench.py --help"),
    "python train.py --preset paper-7b --lora-rank 64 --lora-alpha 128 --lr 1e-5": ("a GPU and the hub", PARSE),
    "python train.py --preset tiny --grader math-verify":
        ("40 s (math-verify's checks)", "python train.py --preset tiny --grader math-verify --max-steps 1 "
                                        "--prompts-per-step 4 --mini-batch-prompts 4"),
    "python bench.py rehearsal": ("minutes", "python bench.py rehearsal --help"),
    # tests/test_bench_update.py runs it at a tiny shape, each kind's update in its fresh process
    "python bench.py train --long-tail": ("minutes", "python bench.py train --long-tail --help"),
    "python bench.py manifest": ("minutes and 4 GiB of disk", "python bench.py manifest --gb 0.03 --repeats 1"),
    "bash .ci/gpu-checks STAGE OUT_DIR": ("a GPU", "bash -n .ci/gpu-checks"),
    "bash .ci/gpu-checks plan OUT_DIR": ("a GPU", "bash -n .ci/gpu-checks"),
    "python -m research.analysis diversity EVAL_DIR [EVAL_DIR ...]":
        ("placeholders", "python -m research.analysis diversity evals/a"),
    "python -m research.analysis compare RUN_A RUN_B [--out FILE]":
        ("placeholders", "python -m research.analysis compare evals/a evals/b --out evals/compare.json"),
    "python -m research.analysis compare runs/sweeps/demo-tiny/n-grpo/seed-0/eval-n-grpo "
    "runs/sweeps/demo-tiny/grpo/seed-0/eval-grpo": ("the demo sweep's runs (minutes)",
                                                    "python -m research.analysis compare evals/a evals/b"),
    "python -m research.experiments SWEEP.json":
        ("a placeholder", "python -m research.experiments sweeps/demo-tiny.json --dry-run"),
    "python -m research.experiments sweeps/demo-tiny.json":
        ("minutes", "python -m research.experiments sweeps/demo-tiny.json --dry-run"),
    "python -m research.plot RUN [RUN ...] --out DIR":
        ("placeholders", "python -m research.plot runs/tiny-a runs/tiny-b --out plots"),
    "python -m research.NAME": ("a placeholder", "python -m research.analysis --help"),
    "python -m research.plot runs/sweeps/demo-tiny/*/seed-* --out plots/":
        ("the demo sweep's runs (minutes)", "python -m research.plot runs/tiny-a runs/tiny-b --out plots/"),
    **{f"pip install {name}": ("the package index", f"pip install --dry-run --no-index {name}")
       for name in ("torch==2.13.0", "math-verify", "matplotlib", "tensorboard", "wandb")},
}
# What marks a command of an optional feature -> the module it imports and the package that installs it
# (pyproject.toml's extras): without the package such a command stops in one line, which tests elsewhere check.
EXTRAS = {"python -m research.plot ": ("matplotlib", "matplotlib"),
          "--grader math-verify": ("math_verify", "math-verify")}


@dataclass(frozen=True)
class Block:
    """Commands a page gives together: a fenced block's, or one code span or transcript line."""

    where: str  # page:line of its first command
    commands: tuple[str, ...]
    comments: tuple[str, ...] = ()  # per command: the comments above it in its block
    output: tuple[str, ...] = ()  # a transcript's printed lines
    python: bool = False  # a ```python block: one program


def page_blocks(path: Path) -> list[Block]:
    """The commands of one page, as written (a line ending in a backslash joined with the next)."""
    lines, blocks, index, name = path.read_text().splitlines(), [], 0, path.relative_to(ROOT)
    while index < len(lines):
        line = lines[index]
        if line.startswith("```"):
            end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
            blocks += fenced(lines, index, end, line[3:].strip(), name)
            index = end + 1
            continue
        blocks += [Block(f"{name}:{index + 1}", (span,)) for span in re.findall(r"`([^`]+)`", line)
                   if span.startswith(PROGRAMS) and " " in span]
        index += 1
    return blocks


def fenced(lines: list[str], start: int, end: int, language: str, name) -> list[Block]:
    """The commands of the fenced block lines[start + 1 : end]."""
    body = lines[start + 1 : end]
    if language == "python":
        return [Block(f"{name}:{start + 2}", ("\n".join(body),), (lines[start - 2],), python=True)]
    if language == "":  # a transcript: `$ command`, then what it prints
        starts = [i for i, line in enumerate(body) if line.startswith("$ ")] + [len(body)]
        return [Block(f"{name}:{start + 2 + a}", (body[a][2:],), output=tuple(body[a + 1 : b]))
                for a, b in zip(starts, starts[1:])]
    commands, comments, above, index = [], [], [], 0
    while index < len(body):
        text = body[index].strip()
        if text.startswith("#"):
            above.append(text)
        elif text:
            while text.endswith("\\"):
                index += 1
                text = text[:-1].rstrip() + " " + body[index].strip()
            commands.append(text.split("  #")[0].strip())  # an end-of-line comment is not the command's
            comments.append(" ".join(above))
        index += 1
    return [Block(f"{name}:{start + 2}", tuple(commands), tuple(comments))] if commands else []


def needs_an_extra(block: Block) -> bool:
    """Whether a command of the block, as written, is one of an optional feature (pytest -m extra picks these)."""
    return any(mark in command for command in block.commands for mark in EXTRAS)


def missing_extra(command: str) -> str | None:
    """The package `command` needs that is not installed here, if any."""
    return next((package for mark, (module, package) in EXTRAS.items()
                 if mark in command and importlib.util.find_spec(module) is None), None)


def all_blocks() -> list[Block]:
    """Every page's blocks; a block whose commands earlier ones ran already (README and docs/distributed.md
    give the same torchrun lines) is left out."""
    seen, kept = set(), []
    for block in (b for path in DOCS for b in page_blocks(path)):
        if not seen.issuperset(block.commands) or block.output:
            kept.append(block)
        seen.update(block.commands)
    return kept


# ----------------------------------------------------------------------------- running them


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Path:
    """A copy of the repo (its top-level files copied, its folders linked) with ../shared beside it."""
    if not SHARED.is_dir():
        pytest.skip("../shared is not present")
    root = tmp_path_factory.mktemp("clone")
    (root / "tmp").mkdir()
    (root / "shared").symlink_to(SHARED)
    repo = root / "repo"
    repo.mkdir()
    for entry in ROOT.iterdir():
        if entry.name in (".git", ".pytest_cache", "runs", "OUT") or entry.name.startswith("__"):
            continue
        if entry.is_dir():
            (repo / entry.name).symlink_to(entry)
        else:
            shutil.copy(entry, repo / entry.name)
    return repo


def prepare(repo: Path, command: str, made: set = set()) -> None:  # noqa: B006 (the cache of this process)
    """What a variant reads that a long run would have made: two evaluations, two training runs, the demo's
    run (each made once per process, small)."""
    needs = {"evals/": ["evals/a", "evals/b"], "runs/tiny-": ["runs/tiny-a", "runs/tiny-b"], "runs/demo": ["runs/demo"]}
    for prefix, outputs in needs.items():
        if prefix not in command or (repo, prefix) in made:
            continue
        made.add((repo, prefix))
        for seed, out in enumerate(outputs):
            if prefix == "evals/":
                E.main(["--model", "tiny", "--benchmarks", "arith:n=20", "--n", "2", "--max-new-tokens", "8",
                        "--seed", str(seed), "--out-dir", str(repo / out), "--overwrite"])
            else:
                train.main([*(shlex.split(f"--preset demo {SMALL_DEMO}") if prefix == "runs/demo" else
                              ["--preset", "tiny", "--max-steps", "2", "--max-new-tokens", "8"]),
                            "--seed", str(seed), "--out-dir", str(repo / out)])


def run(command: str, repo: Path, monkeypatch, capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of a command run in the copy at repo; /tmp/ stands for a folder beside it."""
    command = command.replace("/tmp/", f"{repo.parent / 'tmp'}/")
    words = shlex.split(command)
    if words[0] == "python" and not re.search(r"[&|;<>*]", command):
        with monkeypatch.context() as patch:
            patch.chdir(repo)
            patch.setattr(sys, "argv", words[1:])
            patch.setattr(sys, "path", [*sys.path, str(repo)])  # last: the modules already imported stay
            capsys.readouterr()
            if words[1] == "-m":  # python -m package.module: its own argv[0] is the module's path
                patch.setattr(sys, "argv", [words[2], *words[3:]])
            try:
                if words[1] == "-m":
                    runpy.run_module(words[2], run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(str(repo / words[1]), run_name="__main__")
                status = 0
            except SystemExit as stop:
                status = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        printed = capsys.readouterr()
        return status, printed.out, printed.err
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", command], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode and command.startswith("pip ") and "No matching distribution" in done.stdout + done.stderr:
        pytest.skip(f"{command}: not installed here, and the package index needs the network")
    return done.returncode, done.stdout, done.stderr


def parse_only(command: str) -> None:
    """A GPU command's flags parsed as its programs parse them, nothing run: torchrun's own options by
    torchrun's parser, then the script's flags by train.py (--print-config) or eval.py."""
    words = [{"R": "0"}.get(word, word.replace("HOST:", "localhost:")) for word in shlex.split(command)]
    if words[0] == "torchrun":
        launch = torch.distributed.run.get_args_parser().parse_args(words[1:])
        script, args = launch.training_script, launch.training_script_args
    else:
        script, args = words[1], words[2:]
    if script == "train.py":
        with pytest.raises(SystemExit) as printed:
            train.main([*args, "--print-config"])
        assert printed.value.code in (0, None)
    else:
        assert script == "eval.py"
        E.parse_args(args)


@pytest.mark.parametrize("block", [pytest.param(block, id=block.where,
                                                marks=[pytest.mark.extra] if needs_an_extra(block) else [])
                                   for block in all_blocks()])
def test_documented_commands_run_as_written(block, sandbox, monkeypatch, capsys):
    left_out = []  # commands of an optional feature whose package is not installed
    for command, comments in zip(block.commands, block.comments or [""] * len(block.commands)):
        if block.python:
            run_python_block(command, comments, sandbox, monkeypatch)
            continue
        needs, instead = NOT_AS_WRITTEN.get(command, (None, command))
        for mark in ("GPU", "hub"):  # a fenced command that needs one says so
            assert not (needs and mark in needs and block.comments) or mark in comments, (command, comments)
        if instead == PARSE:
            parse_only(command)
            continue
        variants = (instead,) if isinstance(instead, str) else instead
        if missing := next(filter(None, map(missing_extra, variants)), None):
            left_out.append(f"{command!r} needs {missing} (pip install {missing}), which is not installed")
            continue
        for variant in variants:
            prepare(sandbox, variant)
            status, printed, errors = run(variant, sandbox, monkeypatch, capsys)
            assert status == 0, f"{variant}\n{printed[-2000:]}\n{errors[-3000:]}"
        if block.output and instead == command:
            assert printed.splitlines() == list(block.output)
    if left_out:
        pytest.skip("; ".join(left_out))


def run_python_block(code: str, before: str, repo: Path, monkeypatch) -> None:
    """A ```python block runs in the copy; one for a GPU (device="cuda") is compiled only, and the line before
    it must say that it needs one."""
    if 'device="cuda"' in code:
        assert "GPU" in before, before
        compile(code, "<the page's block>", "exec")
        return
    with monkeypatch.context() as patch:
        patch.chdir(repo)
        patch.setattr(strategies, "STRATEGIES", dict(strategies.STRATEGIES))  # a block's register() stays in it
        exec(compile(code.replace("/tmp/", f"{repo.parent / 'tmp'}/"), "<the page's block>", "exec"), {})


def test_the_pages_give_the_commands_this_test_knows():
    """Every entry of NOT_AS_WRITTEN is still on a page (a command changed on its page must change here)."""
    written = {command for block in all_blocks() for command in block.commands}
    assert set(NOT_AS_WRITTEN) - written == set()
    assert all(any(mark in command for command in written) for mark in EXTRAS)
    assert len(written) > 40 and json.dumps(sorted(written))  # the extraction finds the pages' commands
