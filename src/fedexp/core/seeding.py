"""Seeds derived from (run seed, round, client id): results never depend on execution order."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

SAMPLING, CLIENT, INIT = 1, 2, 3
ARCH_STREAM = 43  # derive_seed tag of the per-client architecture draw (model families)
DROPOUT_STREAM = 53  # derive_seed tag of a round's dropped clients (`dropout`)


def derive_seed(*keys: int) -> int:
    """A 63-bit seed from a tuple of non-negative integers."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(2, np.uint64)[0] >> 1)


def sample_clients(
    seed: int,
    round_idx: int,
    num_clients: int,
    per_round: int,
    rejects: Callable[[tuple[int, ...]], bool] | None = None,
    weights: Sequence[float] | None = None,
    available: Sequence[int] | None = None,
) -> tuple[int, ...]:
    """The round's cohort, a function of (seed, round) alone, in ascending id order. A cohort
    that `rejects` refuses is drawn again from the same generator (its next draw), until one
    passes; without `rejects` (or when the first draw passes) it is the first draw.

    `weights` (one per client, e.g. its training samples): drawn with inclusion probabilities
    proportional to them (`size_sample`); None: uniform. `available`: the ids that may be drawn
    this round (an availability trace; the cohort is all of them where they are fewer than
    `per_round`); None: every client, the draws of a run without a trace."""
    rng = np.random.default_rng(derive_seed(seed, SAMPLING, round_idx))
    pool = np.arange(num_clients) if available is None else np.asarray(available, dtype=np.int64)
    per_round = min(per_round, len(pool))
    if per_round == 0:
        return ()
    probs = (
        None if weights is None else inclusion_probabilities(np.asarray(weights)[pool], per_round)
    )
    while True:
        if probs is not None:
            picked = pool[size_sample(rng, probs, per_round)]
        elif available is None:  # the uniform draw as it always was, bit for bit
            picked = rng.choice(num_clients, per_round, replace=False)
        else:
            picked = pool[rng.choice(len(pool), per_round, replace=False)]
        ids = tuple(int(c) for c in np.sort(picked))
        if rejects is None or not rejects(ids):
            return ids


def inclusion_probabilities(weights: np.ndarray, k: int) -> np.ndarray:
    """pi_i = k w_i / sum(w), summing to k: a client whose pi_i would reach 1 is always drawn
    (pi_i = 1) and the others share the rest in proportion to their weights; where the others
    weigh nothing (no training samples), they share it equally."""
    w = np.asarray(weights, dtype=np.float64)
    pi = np.zeros(len(w))
    certain = np.zeros(len(w), dtype=bool)
    while True:
        rest = ~certain
        left = k - int(certain.sum())
        total = w[rest].sum()
        pi[rest] = left * w[rest] / total if total > 0 else left / int(rest.sum())
        pi[certain] = 1.0
        over = rest & (pi >= 1.0)
        if not over.any():
            return pi
        certain |= over


def size_sample(rng: np.random.Generator, probs: np.ndarray, k: int) -> np.ndarray:
    """k distinct indices, index i drawn with probability exactly probs[i] (probs in [0, 1],
    summing to k): randomised systematic sampling. The indices are put in a random order, laid
    end to end on [0, k) as intervals of lengths probs, and the points u, u+1, ..., u+k-1 (u
    uniform on [0, 1)) pick the intervals they fall in; an interval no longer than 1 holds at
    most one point. (numpy's `choice(p=...)` draws one by one from what is left, so its
    inclusion probabilities are not proportional to p.)"""
    order = rng.permutation(len(probs))
    ends = np.cumsum(probs[order])
    ends *= k / ends[-1]  # exactly k at the end, whatever the rounding
    points = rng.random() + np.arange(k)
    at = np.minimum(np.searchsorted(ends, points, side="right"), len(probs) - 1)
    return order[at]


def dropped_clients(
    seed: int, round_idx: int, cohort: Sequence[int], fraction: float
) -> tuple[int, ...]:
    """The clients of the round's cohort that never return their update (`dropout`):
    round(fraction x cohort size), halves up, drawn uniformly from the cohort on their own
    stream of (seed, round); ascending ids. None for fraction 0."""
    count = math.floor(fraction * len(cohort) + 0.5)
    if count == 0:
        return ()
    rng = np.random.default_rng(derive_seed(seed, DROPOUT_STREAM, round_idx))
    picked = rng.choice(np.asarray(cohort, dtype=np.int64), count, replace=False)
    return tuple(int(c) for c in np.sort(picked))


def client_arch(seed: int, client_id: int, num_archs: int) -> int:
    """The client's architecture in a model family, uniform over it, fixed at its creation."""
    rng = np.random.default_rng(derive_seed(seed, ARCH_STREAM, client_id))
    return int(rng.integers(num_archs))


# numpy's SeedSequence hash (`np.random.SeedSequence`, pool of 4 words) for entropy words below
# 2**32: a client's two seeds share their first four words, so `client_seeds` mixes those once
_M32 = 0xFFFFFFFF
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715


def _pool_of(words: tuple[int, int, int, int]) -> tuple[list[int], int]:
    """SeedSequence's pool after mixing four entropy words, and its running hash constant."""
    h = _INIT_A
    pool = []
    for w in words:
        w ^= h
        h = h * _MULT_A & _M32
        w = w * h & _M32
        pool.append(w ^ w >> 16)
    for src in range(4):
        for dst in range(4):
            if src != dst:
                v = pool[src] ^ h
                h = h * _MULT_A & _M32
                v = v * h & _M32
                r = (_MIX_L * pool[dst] - _MIX_R * (v ^ v >> 16)) & _M32
                pool[dst] = r ^ r >> 16
    return pool, h


def _mix_in(pool: list[int], h: int, word: int) -> int:
    """Mix one more entropy word (past the fourth) into the pool; returns the hash constant."""
    for dst in range(4):
        v = word ^ h
        h = h * _MULT_A & _M32
        v = v * h & _M32
        r = (_MIX_L * pool[dst] - _MIX_R * (v ^ v >> 16)) & _M32
        pool[dst] = r ^ r >> 16
    return h


def _seed_of(pool: list[int]) -> int:
    """`derive_seed`'s value of a mixed pool: generate_state(2, uint64)[0] >> 1."""
    lo = pool[0] ^ _INIT_B
    h = _INIT_B * _MULT_B & _M32
    lo = lo * h & _M32
    hi = pool[1] ^ h
    h = h * _MULT_B & _M32
    hi = hi * h & _M32
    return ((hi ^ hi >> 16) << 32 | lo ^ lo >> 16) >> 1


def client_seeds(seed: int, round_idx: int, client_id: int) -> tuple[int, int]:
    """(derive_seed(seed, CLIENT, round, id), derive_seed(seed, CLIENT, round, id, 1)): the seeds
    of a client's own generator and of torch's global RNG in a round, the same values computed
    together (the client loop pays for one hash instead of two numpy SeedSequences)."""
    words = (int(seed), CLIENT, int(round_idx), int(client_id))
    if not all(0 <= w <= _M32 for w in words):
        return derive_seed(*words), derive_seed(*words, 1)
    pool, h = _pool_of(words)
    own = _seed_of(pool)
    _mix_in(pool, h, 1)
    return own, _seed_of(pool)


def client_generator(seed: int, round_idx: int, client_id: int) -> torch.Generator:
    """The client's own stream for shuffling and sampling in this round."""
    return torch.Generator().manual_seed(derive_seed(seed, CLIENT, round_idx, client_id))


def seed_global_rng(seed: int, device: torch.device) -> None:
    """Seed torch's global RNG on the CPU and on `device`: what `torch.manual_seed` does for
    the devices we use, without its lazy all-CUDA-devices call that records a Python traceback
    (~0.5 ms, paid once per client)."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.init()  # no-op once initialised; fills `default_generators`
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.default_generators[index].manual_seed(seed)


def rng_devices(device: torch.device) -> list[int]:
    """The CUDA devices whose RNG `seed_global_rng` reseeds when training on `device` (none off
    CUDA): with the CPU's, what `torch.random.fork_rng` must save to undo a client's training."""
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]
