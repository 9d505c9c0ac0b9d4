"""runtime/distributed.py on the CPU with the gloo backend: 2 processes started by the tests themselves give what
one process gives (gradients, metrics, weights after a step, gathered checkpoints, resumed optimizer state);
a failing or hung rank stops the job with that rank's message; without torchrun nothing is distributed.

One 2-process run (`two_ranks`, a few seconds) exercises every building block and saves what each rank saw;
the tests compare that with a one-process computation done here, without FSDP."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from conftest import torch_threads

import eval as E
from config import preset
from model import TINY_CONFIG, random_model, save_model
from ngrpo import LossSettings, policy_loss
from replay import sequence_logprobs
from rollout import Rollout, length_mask
from runtime import distributed

ROOT = Path(__file__).resolve().parents[1]
CFG = replace(preset("tiny"), kl_coef=0.05)  # the KL term on, so the reference log-probs reach the loss
LR = 1e-3  # one AdamW step moves each weight by ~1e-3, far past the 1e-5 tolerance


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, fn, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    world = distributed.init_world(device="cpu", timeout_s=60)
    try:
        fn(world, *args)
    finally:
        distributed.close_world(world)


def run_ranks(fn, world_size: int, *args) -> None:
    """Runs fn(world, *args) in `world_size` fresh processes joined by a gloo process group."""
    mp.spawn(_rank_main, args=(world_size, free_port(), fn, args), nprocs=world_size, join=True)


def fixed_batch(rows: int = 5, T: int = 6, K: int = 2) -> dict:
    """Replay rows with mixed inputs, different prompt and response lengths, and advantages of both signs."""
    g = torch.Generator().manual_seed(7)
    prompt_lens = torch.randint(2, 6, (rows,), generator=g).tolist()
    prompts = [torch.randint(0, 262, (n,), generator=g).tolist() for n in prompt_lens]
    cand_weights = torch.rand(rows, T, K, generator=g)
    return dict(prompts=prompts, cand_ids=torch.randint(0, 262, (rows, T, K), generator=g),
                cand_weights=cand_weights / cand_weights.sum(-1, keepdim=True),
                lengths=torch.tensor([6, 2, 5, 3, 4])[:rows],
                response_ids=torch.randint(0, 262, (rows, T), generator=g),
                advantages=torch.randn(rows, generator=g),
                old_logp=-5.5 + 0.1 * torch.randn(rows, T, generator=g),
                ref_logp=-5.5 + 0.1 * torch.randn(rows, T, generator=g))


def batch_loss(call, batch: dict, rows: list[int], normalizer=None):
    """The policy loss of `rows` of the fixed batch through `call` (a ModelCall, sharded or not)."""
    pick = {k: [v[i] for i in rows] if k == "prompts" else v[rows] for k, v in batch.items()}
    mask = length_mask(pick["lengths"], pick["response_ids"].shape[1])
    rows_, T = pick["response_ids"].shape
    steps = dict(response_ids=pick["response_ids"], logprobs=torch.zeros(rows_, T), cand_ids=pick["cand_ids"],
                 cand_weights=pick["cand_weights"], mixed=torch.ones(rows_, T, dtype=torch.bool))
    record = Rollout(pick["prompts"], pick["lengths"], torch.ones(rows_, dtype=torch.bool), steps, "neighbor")
    logp, _ = call(sequence_logprobs, record)
    return policy_loss(logp, pick["old_logp"], pick["advantages"], mask, ref_logp=pick["ref_logp"],
                       settings=LossSettings.of(CFG),
                       normalizer=normalizer)


def _building_blocks(world, out_dir: Path):
    """Every building block once, on each rank; what the rank saw goes to out_dir/rank-R.pt."""
    model = random_model(TINY_CONFIG, seed=0)
    model.gradient_checkpointing = True  # FSDP blocks recomputed in the backward: the default on GPU
    policy = distributed.shard_model(model, world)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=LR, weight_decay=0.01)
    batch = fixed_batch()
    rows = distributed.deal(5, world)  # unequal shares: 3 rows (14 tokens) and 2 rows (5 tokens)
    # The whole batch's token count, divided by the world size since FSDP averages the ranks' gradients.
    normalizer = length_mask(batch["lengths"], 6).sum() / world.size
    loss, metrics = batch_loss(policy, batch, rows, normalizer)
    loss.backward()
    grads = {n: distributed.full_tensor(p.grad).clone() for n, p in model.named_parameters()}
    seen = {"rows": rows, "grads": grads}
    seen["grad_norm"] = float(distributed.clip_grad_norm(list(policy.parameters()), 1.0))
    optimizer.step()
    seen["metrics"] = distributed.mean_across({k: float(v) for k, v in metrics.items()}, 1.0, world)
    seen["state"] = distributed.gather_state_dict(model, world)
    if world.is_main:
        save_model(distributed.model_from_state(model, seen["state"]), out_dir / "hf")
    seen["optimizer"] = distributed.optimizer_state(policy, optimizer, world)
    sampler = distributed.unsharded_copy(model, dtype=torch.float32, device="cpu")
    seen["sampler"] = {n: p.clone() for n, p in sampler.named_parameters()}
    # Restoring by name: another model's weights, given on rank 0 only, reach every rank's shards.
    other = random_model(TINY_CONFIG, seed=1).state_dict() if world.is_main else None
    distributed.load_state_dict(model, other, world)
    seen["restored"] = distributed.gather_state_dict(model, world)
    distributed.copy_weights(model, sampler)
    seen["sampler_refreshed"] = {n: p.clone() for n, p in sampler.named_parameters()}
    r = world.rank
    seen["sums"] = distributed.sum_across({"tokens": 10.0 * (r + 1)}, world)
    seen["maxima"] = distributed.max_across({"len": [7.0, 3.0][r]}, world)
    seen["means"] = distributed.mean_across({"reward": [0.5, 1.0][r]}, [30.0, 10.0][r], world)
    local = [(i, torch.full((2,), float(i))) for i in distributed.deal(5, world)]
    seen["gathered"] = distributed.gather_dealt(local, 5, world)
    table = torch.arange(6).view(3, 2) if world.is_main else None
    seen["broadcast"] = distributed.broadcast_object(table, world)
    torch.save(seen, out_dir / f"rank-{world.rank}.pt")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    out_dir = tmp_path_factory.mktemp("two_ranks")
    run_ranks(_building_blocks, 2, out_dir)
    return [torch.load(out_dir / f"rank-{r}.pt", weights_only=False) | {"dir": out_dir} for r in range(2)]


def one_process_steps(steps: int):
    """The reference: `steps` AdamW steps on the fixed batch in one process, unsharded, the whole batch at
    once.
    Returns (model, call, optimizer, gradients and clipped norm of the last step, its metrics)."""
    model = random_model(TINY_CONFIG, seed=0)
    call = distributed.ModelCall(model)
    optimizer = torch.optim.AdamW(call.parameters(), lr=LR, weight_decay=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        loss, metrics = batch_loss(call, fixed_batch(), list(range(5)))
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        grad_norm = float(torch.nn.utils.clip_grad_norm_(call.parameters(), 1.0))
        optimizer.step()
    return model, call, optimizer, (grads, grad_norm), {k: float(v) for k, v in metrics.items()}


@pytest.fixture(scope="module")
def one_process() -> dict:
    model, call, optimizer, (grads, grad_norm), metrics = one_process_steps(1)
    return dict(grads=grads, grad_norm=grad_norm, metrics=metrics, call=call, optimizer=optimizer,
                state={n: p.detach().clone() for n, p in model.named_parameters()})


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).detach().abs().max()) for k in a)


def test_without_torchrun_the_world_is_one_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    world = distributed.init_world(device="cpu")
    assert (world.rank, world.size, world.distributed, world.is_main) == (0, 1, False, True)
    model = random_model(TINY_CONFIG)
    assert distributed.shard_model(model, world).model is model  # not sharded: the same parameters
    assert distributed.deal(3, world) == [0, 1, 2]
    assert distributed.mean_across({"x": 2.0}, 5.0, world) == {"x": 2.0}


def test_two_process_gradient_equals_one_process_gradient(two_ranks, one_process):
    assert [seen["rows"] for seen in two_ranks] == [[0, 2, 4], [1, 3]]
    for seen in two_ranks:
        assert max_diff(seen["grads"], one_process["grads"]) < 1e-5
        assert seen["grad_norm"] == pytest.approx(one_process["grad_norm"], abs=1e-5)


def test_two_process_metrics_equal_one_process_metrics(two_ranks, one_process):
    for seen in two_ranks:
        assert seen["metrics"].keys() == one_process["metrics"].keys()
        for key, value in one_process["metrics"].items():
            assert seen["metrics"][key] == pytest.approx(value, abs=1e-6), key


def test_weights_after_a_sharded_adamw_step_equal_one_process(two_ranks, one_process):
    assert two_ranks[1]["state"] is None  # gathered on rank 0 only
    state = two_ranks[0]["state"]
    assert max_diff(state, one_process["state"]) < 1e-5
    assert max_diff(state, {n: p for n, p in random_model(TINY_CONFIG, seed=0).named_parameters()}) > 1e-3


def test_checkpoint_of_gathered_weights_loads_in_transformers_with_our_logits(two_ranks, one_process):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(two_ranks[0]["dir"] / "hf", dtype=torch.float32)
    ours = random_model(TINY_CONFIG, seed=0)
    ours.load_state_dict(one_process["state"])  # the one-process weights after the same step
    ids = torch.tensor([[5, 80, 17, 200, 3, 9]])
    with torch.no_grad():
        assert float((hf(ids).logits - ours(ids)).abs().max()) < 1e-4


def test_sampler_copy_holds_the_gathered_weights_and_refreshes(two_ranks, one_process):
    restored = {n: p.detach() for n, p in random_model(TINY_CONFIG, seed=1).named_parameters()}
    for seen in two_ranks:
        assert max_diff(seen["sampler"], one_process["state"]) < 1e-5
        assert max_diff(seen["sampler_refreshed"], restored) == 0.0


def test_state_given_on_rank_0_restores_every_shard_by_name(two_ranks):
    expected = {n: p.detach() for n, p in random_model(TINY_CONFIG, seed=1).named_parameters()}
    assert max_diff(two_ranks[0]["restored"], expected) == 0.0


def test_optimizer_state_written_by_two_processes_resumes_in_one(two_ranks, one_process):
    """One step under 2 processes, then a second step in one process from the gathered weights and AdamW
    state, equals two steps in one process."""
    saved = two_ranks[0]["optimizer"]
    assert two_ranks[1]["optimizer"] is None
    one = distributed.World()
    reference = distributed.optimizer_state(one_process["call"], one_process["optimizer"], one)
    assert saved["state"].keys() == reference["state"].keys()
    for name, moments in reference["state"].items():
        assert max_diff({k: v for k, v in saved["state"][name].items() if k != "step"},
                        {k: v for k, v in moments.items() if k != "step"}) < 1e-6, name
    model = random_model(TINY_CONFIG, seed=0)
    distributed.load_state_dict(model, two_ranks[0]["state"], distributed.World())
    call = distributed.ModelCall(model)
    optimizer = torch.optim.AdamW(call.parameters(), lr=LR, weight_decay=0.01)
    distributed.load_optimizer_state(call, optimizer, saved, distributed.World())
    batch_loss(call, fixed_batch(), list(range(5)))[0].backward()
    optimizer.step()
    straight = one_process_steps(2)[0]
    assert max_diff(dict(model.named_parameters()), dict(straight.named_parameters())) < 1e-5


def test_metric_reductions_are_sums_maxima_and_count_weighted_means(two_ranks):
    for seen in two_ranks:
        assert seen["sums"] == {"tokens": 30.0}
        assert seen["maxima"] == {"len": 7.0}
        assert seen["means"]["reward"] == pytest.approx((0.5 * 30 + 1.0 * 10) / 40)


def test_dealt_work_is_gathered_in_item_order_on_every_rank(two_ranks):
    for seen in two_ranks:
        assert [i for i, _ in seen["gathered"]] == [0, 1, 2, 3, 4]
        assert all(torch.equal(t, torch.full((2,), float(i))) for i, t in seen["gathered"])


def test_rank_0_object_is_broadcast(two_ranks):
    assert all(torch.equal(seen["broadcast"], torch.arange(6).view(3, 2)) for seen in two_ranks)


@pytest.mark.parametrize("num_items, batch_size, size, calls", [(5, 2, 2, 2), (7, 3, 3, 1), (2, 4, 4, 1),
                                                               (8, 3, 1, 3)])
def test_dealt_batches_cover_every_item_once_with_equal_call_counts(num_items, batch_size, size, calls):
    shares = [distributed.dealt_batches(num_items, batch_size, distributed.World(rank=r, size=size))
              for r in range(size)]
    real = sorted(i for share in shares for items, is_real in share if is_real for i in items)
    assert real == list(range(num_items))
    assert [len(share) for share in shares] == [calls] * size  # the same number of calls on every rank
    assert all(len(items) <= batch_size for share in shares for items, _ in share)


WORKER = """
import sys, time
from runtime import distributed
world = distributed.init_world(device="cpu", timeout_s=float(sys.argv[1]))
if world.rank == 1:
    if sys.argv[2] == "raise":
        raise ValueError("rank 1 could not read its shard")
    time.sleep(120)  # alive but never reaching the collective
distributed.barrier(world)
"""


def torchrun(tmp_path, *args) -> tuple[subprocess.CompletedProcess, float]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    done = subprocess.run([*launch, str(script), *args], env=env, capture_output=True, text=True, timeout=100)
    return done, time.perf_counter() - start


@pytest.fixture(scope="module")
def broken_jobs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, float]]:
    """The two torchrun jobs with a broken rank 1, each in a folder of its own, started at once (threads only
    wait on them; --standalone gives each job its own rendezvous port): a rank that raises, with rank 0 waiting
    in a barrier it never reaches (timeout 600 s), and a rank that hangs, under a 3 s collective timeout. Each
    job spends most of its time starting its processes or waiting."""
    jobs = {"raise": ("600", "raise"), "hang": ("3", "hang")}
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(torchrun, tmp_path_factory.mktemp(name), *args) for name, args in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


def test_a_failing_rank_stops_the_job_with_its_message(broken_jobs):
    done, _ = broken_jobs["raise"]  # rank 0 waits in a barrier rank 1 never reaches
    assert done.returncode != 0
    assert "ValueError: rank 1 could not read its shard" in done.stderr


def test_a_hung_rank_stops_the_job_after_the_collective_timeout(broken_jobs):
    done, seconds = broken_jobs["hang"]
    assert done.returncode != 0
    assert "Timed out" in done.stderr
    assert seconds < 60  # the hung rank sleeps 120 s: the timeout, not the sleep, ended the job


def test_eval_with_two_processes_writes_the_one_process_results(tmp_path):
    benchmark = tmp_path / "toy.jsonl"
    problems = [{"problem": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(7)]
    benchmark.write_text("".join(json.dumps(p) + "\n" for p in problems))
    flags = ["--model", "tiny", "--benchmarks", str(benchmark), "--n", "4", "--max-new-tokens", "12",
             "--batch-size", "5", "--device", "cpu", "--explore", "neighbor", "--mix-rate", "0.5"]
    # `--` ends torchrun's options: without it torchrun reads eval.py's --n as an abbreviation of its own.
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--"]
    # The 2-process job starts first and the reference runs while it starts (the two write different folders).
    process = subprocess.Popen([*launch, "eval.py", *flags, "--out-dir", str(tmp_path / "two")], cwd=ROOT,
                               env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        with torch_threads(1):  # the reference: eval.py in this process
            E.main([*flags, "--out-dir", str(tmp_path / "one")])
    finally:
        stdout, stderr = process.communicate(timeout=120)
    two = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert two.returncode == 0, two.stderr
    for name in ("results.json", "samples.jsonl"):
        assert (tmp_path / "two" / name).read_text() == (tmp_path / "one" / name).read_text()
    assert two.stdout.count("toy") == 1  # the table printed by rank 0 only


# ----------------------------------------------------------------------------- train.py under torchrun

# A tiny run (8 prompts x 4 responses per step, 12-token responses, 3 rollout calls of 12, 8, 12 rows, uneven
# micro-batches of 3 rows, KL on) with a stand-in reward that gives the update a signal (an odd-length
# response scores 1). It records each step's responses in rollouts.jsonl. One job may make several runs, one after
# another (each with its own process group: train.run opens and closes it), as [out, explore, steps, resume,
# overrides] in argv[2]: a job's processes spend most of their CPU starting.
TRAIN = """
import json, sys
from dataclasses import replace
sys.path.insert(0, sys.argv[1])
import train
from config import preset
from reward import RewardPool
from runtime import distributed
RewardPool.score = lambda self, pairs, kind="math": [float(len(text) % 2) for text, _ in pairs]
collect = train.collect_groups
def recorded(r, step):
    groups = collect(r, step)
    if r.world.is_main:
        with open(r.out_dir / "rollouts.jsonl", "a") as f:
            f.write(json.dumps({"step": step + 1, "responses": groups.rollout.responses()}) + "\\n")
    return groups
train.collect_groups = recorded
if len(json.loads(sys.argv[2])) > 1:  # the job's process group, kept from run to run
    distributed.init_world("cpu")
for out, explore, steps, resume, overrides in json.loads(sys.argv[2]):
    train.run(replace(preset("tiny"), out_dir=out, explore=explore, max_steps=steps, resume=resume, save_every=2,
                      prompts_per_step=8, mini_batch_prompts=4, micro_batch_size=3, max_new_tokens=12,
                      rollout_batch_size=12, kl_coef=0.05, mix_rate=0.3, **overrides))
"""
TIMING = ("rollout_s", "score_s", "update_s", "step_s", "rollout_tokens_per_s", "update_tokens_per_s")


def planned(out: Path, explore: str, steps: int, resume: bool = False, **overrides) -> list:
    """One run of TRAIN: Config fields `overrides` changed."""
    return [str(out), explore, steps, resume, overrides]


def train_here(out: Path, explore: str, steps: int, **overrides) -> None:
    """The same run as train_run's, in this process: one plain process, no torchrun and no process group (the
    reference the distributed runs must equal). The script's two replacements are undone afterwards."""
    import reward
    import train

    with pytest.MonkeyPatch.context() as patch, torch_threads(1):
        patch.setattr(reward.RewardPool, "score", reward.RewardPool.score)  # put back on leaving
        patch.setattr(train, "collect_groups", train.collect_groups)
        patch.setattr(sys, "argv", ["train-script", str(ROOT), json.dumps([planned(out, explore, steps, **overrides)])])
        exec(compile(TRAIN, "train-script", "exec"), {"__name__": "__main__"})


def start_train_runs(processes: int, runs: list[list], script: Path) -> subprocess.Popen:
    """TRAIN's `runs` (planned) one after another in one job of `torchrun --nproc-per-node processes`, started;
    finished_run waits for it."""
    script.write_text(TRAIN)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    return subprocess.Popen([*launch, str(script), str(ROOT), json.dumps(runs)],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def start_train_run(out: Path, processes: int, explore: str, steps: int, resume: bool = False,
                    **overrides) -> subprocess.Popen:
    """train.py's run under `torchrun --nproc-per-node processes` (Config fields `overrides` changed), started;
    finished_run waits for it."""
    return start_train_runs(processes, [planned(out, explore, steps, resume, **overrides)],
                            out.parent / f"{out.name}-train.py")


def ended(process: subprocess.Popen) -> subprocess.CompletedProcess:
    """The started run once it has ended."""
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def finished_run(process: subprocess.Popen) -> subprocess.CompletedProcess:
    """The started run once it has ended, which must be with exit status 0."""
    done = ended(process)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def train_run(out: Path, processes: int, explore: str, steps: int, resume: bool = False, **overrides):
    """train.py's run under `torchrun --nproc-per-node processes` (Config fields `overrides` changed);
    returns the finished process."""
    return finished_run(start_train_run(out, processes, explore, steps, resume, **overrides))


@contextmanager
def running(process: subprocess.Popen):
    """Work done here while `process` runs (a one-process reference in another folder, on the core its start
    leaves free); after a failure here the process is waited for before the failure goes on (none is left
    behind)."""
    try:
        yield process
    except BaseException:
        process.communicate(timeout=300)
        raise


def outputs(out: Path, step: int) -> dict:
    """What a run wrote: the recorded responses and metrics per step, and the weights of checkpoint `step`."""
    from model import load_model

    lines = lambda name: [json.loads(line) for line in (out / name).read_text().splitlines()]
    return dict(rollouts=lines("rollouts.jsonl"),
                metrics=[{k: v for k, v in m.items() if k not in TIMING} for m in lines("metrics.jsonl")],
                weights=load_model(str(out / "checkpoints" / f"step-{step}"), dtype=torch.float32,
                                   device="cpu").state_dict())


def assert_same_run(got: dict, expected: dict, steps: int):
    assert [r["responses"] for r in got["rollouts"][:steps]] == \
        [r["responses"] for r in expected["rollouts"][:steps]]  # token for token
    for mine, theirs in zip(got["metrics"][:steps], expected["metrics"][:steps], strict=True):
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            number = isinstance(value, (int, float)) and not isinstance(value, bool)  # a warning is text, which
            # pytest 9.2's approx refuses
            assert mine[key] == (pytest.approx(value, rel=1e-5, abs=1e-6) if number else value), (mine["step"], key)
    assert max_diff(got["weights"], expected["weights"]) < 1e-5


# Every loss-side flag at once (docs/estimators.md): each row's advantage, KL and token mask depend on the whole
# batch (pass@k ranks a group, the KL penalty shapes rewards, the entropy quantile and the adaptive coefficient are
# batch-wide), so each rank must see every row's replay.
LOSS_SIDE = dict(adv_estimator="passk", pass_k=2, kl_estimator="k2", kl_in_reward=True, top_entropy_quantile=0.5,
                 entropy_coef=0.01, entropy_target=50.0, entropy_coef_delta=0.004)

# The soft-token strategies (docs/algorithm.md): Soft Thinking with Cold Stop (a counter per row, kept by the engine
# as rows are dealt to ranks and slots), min-p and Dirichlet noise (gamma draws); Randomized Soft Thinking's
# Gumbel-softmax with Cold Stop; Mixture of Inputs. Cold Stop's threshold is above log V: every row stops thinking
# after 3 steps, so both phases run (and soft's after-thinking top-k switches per row). Multiplex Thinking: 3 draws a
# step (its own counter-based stream) from a Gumbel-softmax of a Dirichlet draw of p, with Cold Stop, and the joint
# loss over them.
# SofT-GRPO: Gumbel draws scaled by a noise factor, the perturbed logits recorded, the reparameterised log-probability;
# its Dirichlet and Gaussian variants: gamma draws and normals, their densities in the loss.
COLD_STOP = dict(early_stopping_entropy_threshold=10.0, early_stopping_length_threshold=3)
SOFT = {"soft": dict(min_p=0.05, dirichlet_alpha=1.0, after_thinking_top_k=8, **COLD_STOP),
        "soft-gumbel": dict(gumbel_temperature=0.5, **COLD_STOP), "mixinputs": dict(mixinputs_beta=2.0),
        "multiplex": dict(multiplex_width=3, multiplex_weights="probs", dirichlet_alpha=1.0, multiplex_gumbel_tau=1.0,
                          **COLD_STOP),
        "soft-grpo": dict(soft_top_k=5, gumbel_temperature=0.1, noise_factor=0.5),
        "soft-grpo-dirichlet": dict(soft_top_k=5), "soft-grpo-gaussian": dict(soft_top_k=5),
        "thinkrouter": dict(router_confidence=0.3, **COLD_STOP)}
ADAPTERS = dict(lora_rank=4, lora_alpha=8.0, lr=1e-3)

# name -> (explore, steps of the 2-process run, steps of the one-process reference (0: none), Config overrides):
# --micro-batch-tokens (rows dealt by balanced tokens, stand-ins padding the calls, the old-policy and reference
# replays gathered by row) is compared with the neighbor reference's fixed 3-row micro-batches (prompts ~160 tokens:
# the budget takes 3 rows of similar length at a time), packed (--pack: each micro-batch's rows end to end); the
# adapters' reference runs the step the resumed job adds.
RUNS = {"neighbor": ("neighbor", 4, 2, {}), "token-budget": ("neighbor", 2, 0, dict(micro_batch_tokens=500, pack=True)),
        "loss-side": ("none", 2, 2, LOSS_SIDE), **{name: (name, 2, 2, flags) for name, flags in SOFT.items()},
        "adapters": ("neighbor", 2, 3, ADAPTERS)}


@pytest.fixture(scope="module")
def job_runs(tmp_path_factory) -> Path:
    """RUNS by 2 processes, one after another in one torchrun job (checkpoints every 2 steps), in NAME/two; and
    their references by one plain process here while the job runs, in NAME/one."""
    root = tmp_path_factory.mktemp("runs")
    job = start_train_runs(2, [planned(root / name / "two", explore, steps, **flags)
                               for name, (explore, steps, _, flags) in RUNS.items()], root / "train.py")
    with running(job):
        for name, (explore, _, steps, flags) in RUNS.items():
            if steps:
                train_here(root / name / "one", explore, steps, **flags)
    finished_run(job)
    return root


@pytest.fixture(scope="module")
def neighbor_runs(job_runs) -> Path:
    """2 processes, 4 steps with --explore neighbor (checkpoints at 2 and 4), and one plain process, 2 steps."""
    return job_runs / "neighbor"


def test_two_processes_train_like_one_with_neighbor_mixing(neighbor_runs):
    one = outputs(neighbor_runs / "one", 2)
    assert sum(m["mix_rate"] for m in one["metrics"]) > 0 and one["metrics"][-1]["grad_norm"] > 0
    assert_same_run(outputs(neighbor_runs / "two", 2), one, steps=2)


def test_two_processes_with_a_token_budget_train_like_one_with_fixed_rows(job_runs, neighbor_runs):
    """--micro-batch-tokens, packed, under torchrun: the metrics and weights of one process with fixed 3-row padded
    micro-batches."""
    assert_same_run(outputs(job_runs / "token-budget" / "two", 2), outputs(neighbor_runs / "one", 2), steps=2)


def test_two_processes_train_like_one_without_exploration_and_with_every_loss_side_flag(job_runs):
    got, expected = outputs(job_runs / "loss-side" / "two", 2), outputs(job_runs / "loss-side" / "one", 2)
    assert_same_run(got, expected, steps=2)
    assert [m["entropy_coef"] for m in expected["metrics"][:2]] == [0.0, 0.004]  # c_0 = 0, then c_0 + delta
    assert all(0.5 <= m["pg_token_frac"] < 0.6 for m in expected["metrics"][:2])
    assert [m["kl_in_reward"] > 0 for m in expected["metrics"][:2]] == [False, True]  # step 1: policy = reference


@pytest.mark.parametrize("explore", SOFT)
def test_two_processes_roll_out_and_train_a_soft_token_strategy_like_one(job_runs, explore):
    one, two = outputs(job_runs / explore / "one", 2), outputs(job_runs / explore / "two", 2)
    assert all(m["grad_norm"] > 0 for m in one["metrics"])
    if explore != "soft-grpo":
        assert_same_run(two, one, steps=2)
        return
    # SofT-GRPO's loss clamps the implied noise to [-1.5, 3], where the rollout clamped ~6% of its Gumbel draws: at
    # the first update such a draw's noise sits on the bound give or take the float rounding of the sampler's
    # logits, which depends on the rows a step decodes together (one process or two), and decides whether it passes
    # a gradient (docs/algorithm.md). So the rollouts of both steps and the first step's metrics are equal; the
    # weights after it are not bit-for-bit the same (tests/test_soft_methods.py checks the loss against theirs).
    assert [r["responses"] for r in two["rollouts"][:2]] == [r["responses"] for r in one["rollouts"][:2]]
    assert_same_run(dict(rollouts=two["rollouts"][:1], metrics=two["metrics"][:1], weights=one["weights"]),
                    dict(rollouts=one["rollouts"][:1], metrics=one["metrics"][:1], weights=one["weights"]), steps=1)


def test_two_processes_train_adapters_like_one_and_resume_them(job_runs):
    """--lora-rank under torchrun: the adapted model sharded by FSDP2 (frozen base and adapters alike), the KL
    reference the policy with its adapters off, the sampler merged from gathered shards after every update, the
    checkpoints' adapters gathered to rank 0; resumed by 2 processes from the step-2 checkpoint they wrote. The
    responses, metrics and adapters of 3 steps equal those of one plain process."""
    from safetensors.torch import load_file

    root = job_runs / "adapters"
    train_run(root / "two", 2, "neighbor", 3, resume=True, **ADAPTERS)
    runs = {}
    for name in ("one", "two"):
        lines = lambda file: [json.loads(line) for line in (root / name / file).read_text().splitlines()]
        runs[name] = dict(rollouts=lines("rollouts.jsonl"),
                          metrics=[{k: v for k, v in m.items() if k not in TIMING} for m in lines("metrics.jsonl")],
                          weights=load_file(root / name / "checkpoints" / "step-3" / "adapter_model.safetensors"))
    one = runs["one"]
    assert all(m["grad_norm"] > 0 for m in one["metrics"]) and sum(m["mix_rate"] for m in one["metrics"]) > 0
    assert any(value.abs().max() > 1e-4 for key, value in one["weights"].items() if "lora_B" in key)  # B moved
    assert_same_run(runs["two"], one, steps=3)


def resumed_copy(neighbor_runs: Path, name: str) -> Path:
    """The 2-process run as it was after step 2: its step-4 checkpoint and later records removed."""
    out = neighbor_runs / name
    shutil.copytree(neighbor_runs / "two", out)
    shutil.rmtree(out / "checkpoints" / "step-4")
    (out / "rollouts.jsonl").write_text("".join(line + "\n" for line in
                                                (out / "rollouts.jsonl").read_text().splitlines()[:2]))
    return out


@pytest.fixture(scope="module")
def resumed_runs(neighbor_runs) -> dict[int, tuple[Path, subprocess.CompletedProcess]]:
    """Processes -> (out-dir, finished run) of the 2-process run resumed from its step-2 checkpoint to step 4
    under 2 processes and under 1, each in a copy of its own; the two jobs are started at once (the 1-process
    one leaves a core free)."""
    copies = {2: resumed_copy(neighbor_runs, "resumed"), 1: resumed_copy(neighbor_runs, "resumed-by-one")}
    started = {processes: start_train_run(out, processes, "neighbor", 4, resume=True)
               for processes, out in copies.items()}
    return {processes: (copies[processes], ended(process)) for processes, process in started.items()}


def test_resume_under_two_processes_equals_the_straight_run(neighbor_runs, resumed_runs):
    out, done = resumed_runs[2]
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_run(outputs(out, 4), outputs(neighbor_runs / "two", 4), steps=4)


def test_resume_with_another_number_of_processes_completes_and_says_so(neighbor_runs, resumed_runs):
    out, done = resumed_runs[1]
    assert done.returncode == 0, done.stderr[-3000:]
    assert "written by 2 process(es), this run has 1" in done.stderr
    # Rollout calls are keyed by (seed, step, draw, call): the same work, in another reduction order.
    assert_same_run(outputs(out, 4), outputs(neighbor_runs / "two", 4), steps=4)


def test_checkpoint_written_by_two_processes_loads_in_transformers(neighbor_runs):
    transformers = pytest.importorskip("transformers")
    from model import load_model

    path = neighbor_runs / "two" / "checkpoints" / "step-4"
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ours = load_model(str(path), dtype=torch.float32, device="cpu")
    ids = torch.tensor([[5, 80, 17, 200, 3, 9]])
    with torch.no_grad():
        assert float((hf(ids).logits - ours(ids)).abs().max()) < 1e-4
