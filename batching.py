"""How the update splits rows into micro-batches: a fixed number of rows (--micro-batch-size), or a token
budget (--micro-batch-tokens N) that groups rows of similar length so that little of the replay computes
on padding.

A micro-batch is replayed right-padded to its longest row, so its cost is rows x padded length. Taking
consecutive rows, one row at the length limit makes its companions pay for the limit too; with long-tailed
response lengths (mean ~40% of the limit, a tail at it) most of the replay is then padding. Under a token
budget the rows are sorted longest first and cut into runs with rows x longest <= N, so each micro-batch
holds rows of nearly one length. The loss still divides by the whole mini-batch's count (ngrpo.py), so the
gradient is the fixed-row one up to the order of float sums.

    plan = micro_batches(rollout, cfg, world)       # [(row indices, real), ...], the same count on every rank

Under torchrun every rank holds the whole mini-batch (train.py gathers the step's rollouts), so which rank
replays which row changes nothing but the order of sums: rows are given to the ranks longest first, each to
the rank with the fewest tokens so far, so the ranks' token counts are balanced; the rank with fewer
micro-batches pads with stand-ins (its shortest row, masked out of the loss), since FSDP's forward and
backward are collectives every rank must join.
"""

from dataclasses import replace

import distributed
from distributed import World


def replay_tokens(rollout) -> list[int]:
    """Per row, the positions its replay forward computes: prompt + response - 1 (the input after the last
    response token is never needed)."""
    return [len(prompt) + int(length) - 1 for prompt, length in zip(rollout.prompts, rollout.lengths.tolist())]


def budget_batches(rows: list[int], tokens: list[int], budget: int) -> list[list[int]]:
    """`rows` sorted longest first (ties: lower index first) and cut into runs whose count x longest row's
    tokens stays within `budget` (a row longer than the budget is a run of its own): as few runs as
    possible, and of those cuts the one with the fewest padded positions (sum of count x longest).

    Filling each run greedily gives the fewest runs, but may put a row of 300 tokens with rows of 30; a
    dynamic program over the cut points then finds, for that number of runs, the cut that pads least.
    >>> budget_batches([0, 1, 2, 3, 4], [5, 20, 6, 18, 2], 40)    # 20 + 18 (2 x 20); 6, 5, 2 (3 x 6)
    [[1, 3], [2, 0, 4]]
    >>> budget_batches(list(range(6)), [10, 6, 6, 6, 1, 1], 40)    # greedy: 4 x 10 + 2 x 1 = 42 positions
    [[0], [1, 2, 3, 4, 5]]"""
    order = sorted(rows, key=lambda r: (-tokens[r], r))
    s = [tokens[r] for r in order]
    fits = lambda i, j: j - i == 1 or (j - i) * s[i] <= budget  # run order[i:j]
    runs, start = 0, 0
    while start < len(s):  # greedy: the fewest runs
        end = start + 1
        while end < len(s) and fits(start, end + 1):
            end += 1
        runs, start = runs + 1, end
    # least[j]: (padded positions, cut) of order[:j] in the runs so far; one more run per pass.
    least = {0: (0, [])}
    for _ in range(runs):
        longer = {}
        for j in range(1, len(s) + 1):
            for i in range(j - 1, -1, -1):
                if not fits(i, j):
                    break  # fits only gets harder as the run grows to the left
                if i in least and (j not in longer or least[i][0] + (j - i) * s[i] < longer[j][0]):
                    longer[j] = (least[i][0] + (j - i) * s[i], least[i][1] + [j])
        least = longer
    cuts = [0] + least[len(s)][1]
    return [order[i:j] for i, j in zip(cuts, cuts[1:])]


def balanced_shares(tokens: list[int], size: int) -> list[list[int]]:
    """Rows 0..n-1 given to `size` ranks, longest first, each to the rank with the fewest tokens so far (ties:
    the lower rank): every rank's token count within one row of the others'.

    >>> balanced_shares([8, 1, 5, 4, 2], 2)    # 8 -> 0; 5 -> 1; 4 -> 1 (9); 2 -> 0 (10); 1 -> 1 (10)
    [[0, 4], [2, 3, 1]]"""
    shares: list[list[int]] = [[] for _ in range(size)]
    loads = [0] * size
    for row in sorted(range(len(tokens)), key=lambda r: (-tokens[r], r)):
        rank = min(range(size), key=lambda k: (loads[k], k))
        shares[rank].append(row)
        loads[rank] += tokens[row]
    return shares


def micro_batches(rollout, cfg, world: World = World()) -> list[tuple[list[int], bool]]:
    """This rank's micro-batches of the rows of `rollout`, as (row indices, real) pairs, the same number on
    every rank (stand-ins with real = False pad the shorter lists; their outputs must count for nothing).

    cfg.micro_batch_tokens = 0: cfg.micro_batch_size consecutive rows of this rank's `deal` share
    (distributed.dealt_batches). Otherwise a token budget: this rank's share of balanced_shares, cut by
    budget_batches."""
    num_rows = len(rollout.prompts)
    if cfg.micro_batch_tokens <= 0:
        return distributed.dealt_batches(num_rows, cfg.micro_batch_size, world)
    tokens = replay_tokens(rollout)
    plans = [budget_batches(share, tokens, cfg.micro_batch_tokens) for share in balanced_shares(tokens, world.size)]
    calls = max(len(plan) for plan in plans)
    stand_in = min(range(num_rows), key=lambda r: (tokens[r], r))  # the cheapest row to replay for nothing
    return [(rows, True) for rows in plans[world.rank]] + [([stand_in], False)] * (calls - len(plans[world.rank]))


def trimmed(rollout):
    """A micro-batch's rollout with its per-token tensors cut to its longest response, its log-probs then
    computed for those positions only (causal attention: the positions cut off change nothing before them)."""
    width = max(int(rollout.lengths.max()), 1)
    return replace(rollout, **{name: value[:, :width] for name, value in vars(rollout).items()
                               if hasattr(value, "dim") and value.dim() > 1})
