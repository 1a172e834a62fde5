"""Seeds derived from (run seed, round, client id): results never depend on execution order."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

SAMPLING, CLIENT, INIT = 1, 2, 3
ARCH_STREAM = 43  # derive_seed tag of the per-client architecture draw (model families)


def derive_seed(*keys: int) -> int:
    """A 63-bit seed from a tuple of non-negative integers."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(2, np.uint64)[0] >> 1)


def sample_clients(
    seed: int,
    round_idx: int,
    num_clients: int,
    per_round: int,
    rejects: Callable[[tuple[int, ...]], bool] | None = None,
) -> tuple[int, ...]:
    """The round's cohort, a function of (seed, round) alone, in ascending id order. A cohort
    that `rejects` refuses is drawn again from the same generator (its next draw), until one
    passes; without `rejects` (or when the first draw passes) it is the first draw."""
    rng = np.random.default_rng(derive_seed(seed, SAMPLING, round_idx))
    while True:
        ids = tuple(int(c) for c in np.sort(rng.choice(num_clients, per_round, replace=False)))
        if rejects is None or not rejects(ids):
            return ids


def client_arch(seed: int, client_id: int, num_archs: int) -> int:
    """The client's architecture in a model family, uniform over it, fixed at its creation."""
    rng = np.random.default_rng(derive_seed(seed, ARCH_STREAM, client_id))
    return int(rng.integers(num_archs))


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
