"""Plain-Python reference computations (lists and floats), written from the papers' equations."""

import math


def mean(xs):
    return sum(xs) / len(xs)


def unbiased_var(xs):
    m = mean(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def whiten(rows, mask):
    """Whiten the masked entries of a list of rows with their mean / unbiased variance."""
    valid = [rows[i][t] for i in range(len(rows)) for t in range(len(rows[i])) if mask[i][t]]
    m, v = mean(valid), unbiased_var(valid)
    return [[(x - m) / math.sqrt(v + 1e-8) if mask[i][t] else 0.0 for t, x in enumerate(row)]
            for i, row in enumerate(rows)]


def action_positions(mask_row):
    return [t for t, m in enumerate(mask_row) if m]


def credited_rewards(reward_row, mask_row):
    """Rewards on observation tokens go to the last action token before them."""
    out = [0.0] * len(reward_row)
    last = None
    for t, r in enumerate(reward_row):
        if mask_row[t]:
            last = t
        if last is not None:
            out[last] += r
    return out
