"""--judge: a second opinion after the rules (issue 62), with scripted judges: asked only where the rules said 0
(unless asked), within its deadline and cap, in both orders when asked, counted, and loud when it fails."""

import json
import time
from dataclasses import replace

import pytest

import eval as E
import train
from config import preset
from grading.pool import RewardPool
from runtime.cli import parse_config

# A judge that writes each call to a file (its workers are other processes) and says equal where the two texts
# hold the same word of SYNONYMS, or where the reference text is "yes-one-way" and comes second.
JUDGE = '''
import os, time
SYNONYMS = [{"quarante-deux", "42"}, {"sept", "7"}]  # French: not a number to the rules

def judge(response, reference):
    with open(os.environ["JUDGE_LOG"], "a") as log:
        log.write(repr((response, reference)) + "\\n")
    if "sleep" in response:
        time.sleep(30)
    if "raise" in response:
        raise RuntimeError("the judge's server is down")
    if reference == "one-way":
        return 1
    words = set(response.replace("$", " ").split()) | set(reference.split())
    return int(any(len(words & pair) == 2 for pair in SYNONYMS))
'''


@pytest.fixture
def judge_file(tmp_path, monkeypatch):
    path = tmp_path / "judge.py"
    path.write_text(JUDGE)
    monkeypatch.setenv("JUDGE_LOG", str(tmp_path / "calls.log"))
    return f"{path}:judge"


def calls(tmp_path) -> list[tuple[str, str]]:
    log = tmp_path / "calls.log"
    return [eval(line) for line in log.read_text().splitlines()] if log.exists() else []  # noqa: S307 - our repr


def test_the_judge_is_asked_only_where_the_rules_said_wrong_and_its_yes_counts(tmp_path, judge_file):
    pairs = [("so \\boxed{42}", "42"),  # the rules: 1, never asked
             ("The answer is quarante-deux", "42"),  # the rules: 0; the judge: equal
             ("The answer is 41", "42")]  # the rules: 0; the judge: not equal
    with RewardPool(num_workers=1, judge=judge_file) as pool:
        assert pool.score(pairs) == [1.0, 1.0, 0.0]
        assert pool.counts() == {"errors": 0, "timeouts": 0, "judge_calls": 2, "judge_flips": 1, "judge_capped": 0,
                                 "judge_errors": 0, "judge_timeouts": 0}
    assert sorted(calls(tmp_path)) == sorted(pairs[1:])
    with RewardPool(num_workers=1) as pool:  # no judge: the rules alone, as before
        assert pool.score(pairs) == [1.0, 0.0, 0.0] and "judge_calls" not in pool.counts()


def test_a_rule_positive_changes_only_when_asked_and_both_orders_must_agree(tmp_path, judge_file):
    pairs = [("so \\boxed{42}", "42"), ("The answer is sept", "7"), ("The answer is 3", "one-way")]
    with RewardPool(num_workers=1, judge=judge_file, judge_positives=True) as pool:
        # the judge says no to the boxed 42 ("42" and "42" are not a pair of synonyms): asked, it may say 0
        assert pool.score(pairs) == [0.0, 1.0, 1.0] and pool.judge_flips == 3
    with RewardPool(num_workers=1, judge=judge_file, judge_both_orders=True) as pool:
        # "one-way" is equal only when it comes second: asked both ways, the two do not agree
        assert pool.score(pairs) == [1.0, 1.0, 0.0] and pool.judge_calls == 4
    assert ("7", "The answer is sept") in calls(tmp_path)


def test_a_cap_leaves_the_rest_to_the_rules(tmp_path, judge_file):
    pairs = [("The answer is quarante-deux", "42"), ("The answer is sept", "7"), ("The answer is 9", "7")]
    with RewardPool(num_workers=1, judge=judge_file, judge_max_calls=1) as pool:
        assert pool.score(pairs) == [1.0, 0.0, 0.0]
        assert (pool.judge_calls, pool.judge_capped) == (1, 2)


def test_a_judge_past_its_deadline_or_raising_leaves_the_rules_verdict_and_says_so_once(tmp_path, judge_file,
                                                                                           capfd):
    pairs = [("raise on quarante-deux", "42"), ("sleep, then sept", "7"), ("raise on sept", "7"),
             ("so \\boxed{3}", "3")]
    with RewardPool(num_workers=1, judge=judge_file, judge_timeout_s=1.0, judge_positives=True) as pool:
        start = time.perf_counter()
        assert pool.score(pairs) == [0.0, 0.0, 0.0, 0.0]  # the boxed 3 asked too: the judge says no
        assert time.perf_counter() - start < 15  # the sleeper was cut at its deadline
        counts = pool.counts()
    assert (counts["judge_timeouts"], counts["judge_errors"], counts["judge_flips"]) == (1, 2, 1)
    err = capfd.readouterr().err
    assert err.count("warning: judge") == 1 and "the rules' verdict stands" in err
    assert "the judge's server is down" in err


def test_judge_flags_need_the_judge_and_a_bad_judge_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_config(["--preset", "tiny", "--judge-max-calls", "4"])
    assert "--judge-max-calls 4: has no effect without --judge" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--judge: .*has no function 'nope'"):
        RewardPool(judge="grading.pool:nope")


def test_a_run_logs_the_judges_calls_per_step_and_eval_writes_them(tmp_path, judge_file):
    cfg = replace(preset("tiny"), out_dir=str(tmp_path / "run"), max_steps=1, prompts_per_step=4,
                  mini_batch_prompts=4, max_new_tokens=8, judge=judge_file, judge_max_calls=5)
    train.run(cfg)
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    # the random tiny model answers nothing right: every one of the 16 responses is a rule negative, 5 asked
    assert (metrics["judge_calls"], metrics["judge_capped"], metrics["judge_errors"]) == (5, 11, 0)
    assert len(calls(tmp_path)) == 5
    results = E.main(["--model", "tiny", "--benchmarks", "arith:n=3", "--n", "2", "--max-new-tokens", "4",
                      "--out-dir", str(tmp_path / "eval"), "--judge", judge_file])
    written = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert written["judge"]["judge_calls"] == 6 and written["scored_by"]["judge"] == judge_file
    assert "judge" not in results  # the table's rows stay benchmarks
