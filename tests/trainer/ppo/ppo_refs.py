"""Independent float64 reference implementations (plain Python loops) and random-batch builders for the tests."""

import math
import random

import numpy as np
import torch


def make_batch(group_sizes, max_len=7, seed=0, shuffle=True, sparse_reward=True):
    """Random right-padded batch: rewards (B, L) float64, mask (B, L), uid object array, values (B, L)."""
    rng = random.Random(seed)
    uids = [f"p{g}" for g, n in enumerate(group_sizes) for _ in range(n)]
    if shuffle:
        rng.shuffle(uids)
    B = len(uids)
    lengths = [rng.randint(1, max_len) for _ in range(B)]
    lengths[0] = max_len  # at least one full-length row
    mask = torch.zeros(B, max_len, dtype=torch.float64)
    rewards = torch.zeros(B, max_len, dtype=torch.float64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        if sparse_reward:
            rewards[i, n - 1] = float(rng.choice([0.0, 1.0, 0.5, -1.0]))
        else:
            for t in range(n):
                rewards[i, t] = rng.gauss(0, 1)
    values = torch.tensor([[rng.gauss(0, 1) for _ in range(max_len)] for _ in range(B)], dtype=torch.float64)
    return rewards, mask, np.array(uids, dtype=object), values


def rows(mask):
    """Per-row list of valid positions."""
    return [[t for t in range(mask.shape[1]) if mask[i, t] > 0] for i in range(mask.shape[0])]


def groups(uids):
    out = {}
    for i, u in enumerate(uids):
        out.setdefault(u, []).append(i)
    return out


def mean(xs):
    return sum(xs) / len(xs)


def std_unbiased(xs):
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def whiten_valid(mat, mask):
    """Whiten the valid entries of a list-of-lists matrix over the whole batch (unbiased var, eps 1e-8)."""
    vals = [mat[i][t] for i in range(len(mat)) for t in range(len(mat[i])) if mask[i, t] > 0]
    m = mean(vals)
    var = sum((v - m) ** 2 for v in vals) / (len(vals) - 1)
    return [[(mat[i][t] - m) / math.sqrt(var + 1e-8) if mask[i, t] > 0 else 0.0 for t in range(len(mat[i]))]
            for i in range(len(mat))]


def broadcast(per_seq, mask):
    return [[per_seq[i] if mask[i, t] > 0 else 0.0 for t in range(mask.shape[1])] for i in range(mask.shape[0])]


def agg(loss, mask, mode):
    """Reference loss aggregation over list-of-lists ``loss``; seq-mean modes average over the sequences
    with at least one valid token (0 if there are none), as verl does."""
    B, L = mask.shape
    seq_sums = [sum(loss[i][t] for t in range(L) if mask[i, t] > 0) for i in range(B)]
    counts = [sum(1 for t in range(L) if mask[i, t] > 0) for i in range(B)]
    valid = [i for i in range(B) if counts[i] > 0]
    if mode == "token-mean":
        return sum(seq_sums) / sum(counts) if valid else 0.0
    if not valid:
        return 0.0
    if mode == "seq-mean-token-sum":
        return sum(seq_sums[i] for i in valid) / len(valid)
    if mode == "seq-mean-token-mean":
        return sum(seq_sums[i] / counts[i] for i in valid) / len(valid)
    if mode == "seq-mean-token-sum-norm":
        return sum(seq_sums[i] for i in valid) / len(valid) / L
    raise KeyError(mode)


def masked_avg(mat, mask):
    vals = [mat[i][t] for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t] > 0]
    return sum(vals) / len(vals)


def tolist(t):
    return t.detach().double().tolist()
