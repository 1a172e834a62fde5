"""Which clients take part in a round: the sampled cohort (`sampling`: uniform or by data size,
among the clients an availability trace says are there), and those of it that return their
update (`dropout`). Every choice is a function of (seed, round) (`fedexp.core.seeding`), made
by the round loop before any training, so every executor trains the same clients and a resumed
run draws what an uninterrupted one draws.

A dropped client is sampled and sent the round's payload (counted in `comm/down_bits`) but does
not train: its client state stays as it was, and its update never reaches the attack or the
aggregation. A round in which no client returns (every sampled client dropped, or no client
available) leaves the server state as it was (`clients/returned` 0, no `train/loss`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedexp.core.seeding import dropped_clients, inclusion_probabilities, sample_clients
from fedexp.data.availability import KEY as AVAILABILITY
from fedexp.data.availability import Availability, read_availability


@dataclass(frozen=True)
class Cohort:
    """A round's participants: `sampled` (ascending ids), of which `returned` send an update;
    `available`: how many clients could be sampled (None without a trace)."""

    sampled: tuple[int, ...]
    returned: tuple[int, ...]
    available: int | None = None

    def metrics(self) -> dict[str, int]:
        out = {
            "clients/sampled": len(self.sampled),
            "clients/returned": len(self.returned),
            "clients/dropped": len(self.sampled) - len(self.returned),
        }
        if self.available is not None:
            out["clients/available"] = self.available
        return out


@dataclass(frozen=True)
class Participation:
    """How a run's rounds pick their clients (module docstring)."""

    seed: int
    num_clients: int
    per_round: int
    sizes: tuple[int, ...] | None = None  # sampling=size: each client's training samples
    dropout: float = 0.0
    trace: Availability | None = None

    def cohort(self, round_idx: int, rejects=None) -> Cohort:
        """Round `round_idx`'s cohort; `rejects`: the attack's redraw (`NoAttack.rejects`)."""
        available = None if self.trace is None else self.trace.available(round_idx)
        sampled = sample_clients(
            self.seed,
            round_idx,
            self.num_clients,
            self.per_round,
            rejects,
            weights=self.sizes,
            available=available,
        )
        gone = set(dropped_clients(self.seed, round_idx, sampled, self.dropout))
        returned = tuple(c for c in sampled if c not in gone)
        return Cohort(sampled, returned, None if available is None else len(available))

    def empty_rounds(self, rounds: int, rejects=None) -> int:
        """How many of rounds 1..`rounds` have no client returning an update."""
        return self.short_rounds(rounds, 1, rejects)

    def short_rounds(self, rounds: int, need: int, rejects=None) -> int:
        """How many of rounds 1..`rounds` have fewer than `need` clients returning an update
        (only dropout and a trace make a round smaller than `per_round`)."""
        if (self.trace is None and self.dropout == 0) or need <= 0:
            return 0
        return sum(len(self.cohort(t, rejects).returned) < need for t in range(1, rounds + 1))


def participation(cfg, data: Any) -> Participation:
    """The run's `Participation` over the clients the data has (a natural split may have fewer
    than `num_clients`)."""
    n = data.num_clients
    sizes = None
    if cfg.get("sampling", "uniform") == "size":
        sizes = tuple(data.num_train(c) for c in range(n))
    path = cfg.get(AVAILABILITY)
    trace = None if path is None else read_availability(path, n)
    return Participation(
        int(cfg.seed),
        n,
        min(int(cfg.clients_per_round), n),
        sizes,
        float(cfg.get("dropout", 0.0)),
        trace,
    )


def size_probabilities(cfg, data: Any):
    """Each client's inclusion probability under `sampling=size` (`inclusion_probabilities` of
    its training samples), or None under uniform sampling."""
    if cfg.get("sampling", "uniform") != "size":
        return None
    n = data.num_clients
    per_round = min(int(cfg.clients_per_round), n)
    return inclusion_probabilities([data.num_train(c) for c in range(n)], per_round).tolist()
