"""Attacks corrupt the data or the uploads of malicious clients. `NoAttack` is the default.

An attack is set up once (`setup`): `fraction` of ALL clients are malicious, drawn from the run
seed. Data poisoning returns a poisoned view of the data (`wrap_data`, called by the round loop);
model poisoning rewrites the uploads of the round's malicious clients after local training
(`apply`, told the round's starting server state), where they have trained benignly on their own
data. Before its first round the round loop hands the attack an aside-trainer (`use_aside`):
`train_aside(state, round, client_ids)` trains other clients benignly from a round's starting
state without a trace on the run (`fedexp.attacks.pool` uses it). Corrupted uploads are flagged
(`ClientResult.malicious`) so that an aggregator may be told the round's true malicious count
(`fedexp.core.types.malicious_count`). `round_metrics` reports `attack/*` every round.

`redraw_majority` (FRL's reference code): the round loop re-draws a cohort in which half or more of
the sampled clients are malicious (`rejects`), from the same (seed, round) generator
(`fedexp.core.seeding.sample_clients`), so the cohorts stay a function of the seed; false leaves
the sampling untouched.

`targets` names the capabilities an attack can corrupt (`fedexp.core.types`: `VECTOR`, a flat
float vector; `SIGNS`; `SPARSE`; `RANKING`), whatever the upload's class: an algorithm's
`upload_type` declares its `capabilities`. `check_target` raises ConfigError before training when
the upload carries none of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch

from fedexp.core.cohort import RoundResults
from fedexp.core.seeding import derive_seed
from fedexp.core.types import (
    ClientResult,
    ConfigError,
    Message,
    RoundContext,
    ServerState,
    capabilities,
    malicious_count,
)

ATTACK = 401  # seed stream of the malicious set (distinct from core.seeding's streams)

# (the round's starting server state, the round, client ids) -> those clients' benign results,
# trained as if sampled in that round and leaving no trace on the run
AsideTrainer = Callable[[ServerState, int, Sequence[int]], list[ClientResult]]


def check_flag(value, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: must be true or false, got {value!r}")
    return value


class NoAttack:
    """Every client is honest."""

    malicious: frozenset[int] = frozenset()
    fraction: float = 0.0
    realised_fraction: float = 0.0  # malicious clients / all clients, once set up
    targets: tuple[str, ...] | None = None  # capabilities; None: any upload (data poisoning)
    test_task: bool = False  # whether `poisoned_test` gives a test-time task (a backdoor)

    def __init__(self, fraction: float, redraw_majority: bool):
        # `fraction` and `redraw_majority` exist so that `attack.fraction=...` composes with
        # every attack option, and a preset may set `attack.redraw_majority` whatever the attack
        if fraction:
            raise ConfigError(f"attack.fraction: {fraction} with attack=none; choose an attack")
        self.redraw_majority = check_flag(redraw_majority, "attack.redraw_majority")

    def setup(self, ctx, num_clients: int) -> None:
        """Called once before training with the BuildContext (seed, aggregator, data...)."""

    def check_cohort(self, num_clients: int, per_round: int, probs=None) -> None:
        """Raise ConfigError when no cohort of `per_round` clients passes `rejects` (a cohort
        larger than the population is the population: `clients_per_round` is capped there).
        `probs`: each client's inclusion probability (`sampling=size`: a client at 1 is in every
        cohort, one at 0 in none); None: uniform."""
        if not self.redraw_majority:
            return
        per_round = min(per_round, num_clients)
        probs = [per_round / num_clients] * num_clients if probs is None else list(probs)
        always = {c for c, p in enumerate(probs) if p >= 1}
        benign_drawable = sum(
            1 for c, p in enumerate(probs) if 0 < p < 1 and c not in self.malicious
        )
        least = len(always & self.malicious) + max(0, per_round - len(always) - benign_drawable)
        if 2 * least >= per_round:
            forced = f" ({least} malicious in every cohort sampling=size draws)" if always else ""
            raise ConfigError(
                f"attack.redraw_majority: {len(self.malicious)} malicious of {num_clients} "
                f"clients leave no round of {per_round} with fewer than half malicious{forced}"
            )

    def rejects(self, client_ids: Sequence[int]) -> bool:
        """Whether the round loop re-draws this cohort: `redraw_majority` and half or more of
        it malicious (FRL's reference code: `len(round_malicious) >= round_nclients / 2`)."""
        bad = sum(1 for c in client_ids if c in self.malicious)
        return self.redraw_majority and 2 * bad >= len(client_ids)

    def check_target(self, algorithm) -> None:
        """Raise ConfigError when this attack cannot corrupt what `algorithm` uploads."""

    def wrap_data(self, data):
        """The data clients train on (data-poisoning attacks return a poisoned view)."""
        return data

    def poisoned_test(self, x: torch.Tensor, y: torch.Tensor):
        """The attack's test-time task on test samples (x, y), where `test_task`: (a bool mask
        of the samples it applies to, their poisoned inputs, the labels the attacker wants for
        them); `fedexp.engine.eval.backdoor` measures the attack's success on it at every
        evaluation. None for attacks without one."""
        return None

    def use_aside(self, train_aside: AsideTrainer) -> None:
        """Called once by the round loop, before its first round: benign training of clients
        outside a round's cohort (`fedexp.engine.executors.sequential.train_aside`, bound to the
        run's algorithm, executor and data). Kept by the attacks that use it."""

    def apply(
        self,
        results: RoundResults,
        ctx: RoundContext,
        state: ServerState | None = None,
    ) -> RoundResults:
        """The round's results after the attack; `state` is the server state the round started
        from (what its clients trained from; None where the caller has none)."""
        return results

    def round_metrics(self, results: Sequence[ClientResult]) -> dict[str, float]:
        """`attack/*` metrics of the round (after `apply`), logged next to the accuracy."""
        return {
            "attack/fraction": self.realised_fraction,  # malicious / all clients, as set up
            "attack/malicious_in_round": malicious_count(results),
        }

    def describe(self) -> dict:
        return {"attack/name": "none", "attack/num_malicious": 0}

    def run_warnings(self, rounds: int) -> list[str]:
        """What the attack's rounds change in what the numbers mean (`Attack`: rounds whose
        cohort was half or more malicious), one line each."""
        return []

    def state_dict(self) -> dict:
        """State that changes during training (saved in checkpoints); none for most attacks."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned (on resume)."""


class Attack(NoAttack):
    """Base of the attacks: the malicious set, the target check, flagging corrupted uploads."""

    name = "attack"
    targets: tuple[str, ...] | None = ()  # the capabilities it corrupts (any one suffices)

    def __init__(self, fraction: float, redraw_majority: bool):
        if not 0 <= fraction < 1:
            raise ConfigError(f"attack.fraction: must be in [0, 1), got {fraction}")
        self.fraction = fraction
        self.redraw_majority = check_flag(redraw_majority, "attack.redraw_majority")
        self.majority_rounds = 0  # rounds whose cohort was half or more malicious

    def setup(self, ctx, num_clients: int) -> None:
        # int(), not round(): FRL's reference code takes int(num_clients * fraction)
        count = int(self.fraction * num_clients)
        self.realised_fraction = count / num_clients
        if abs(count - self.fraction * num_clients) > 1e-9:  # logged as attack/fraction
            logging.getLogger(__name__).warning(
                "attack.fraction: %s of %d clients makes %d malicious (realised fraction %.4g)",
                self.fraction,
                num_clients,
                count,
                self.realised_fraction,
            )
        rng = np.random.default_rng(derive_seed(ctx.seed, ATTACK))
        self.malicious = frozenset(int(c) for c in rng.choice(num_clients, count, replace=False))

    def check_target(self, algorithm) -> None:
        if not algorithm.clients_train:  # e.g. a server-side reference
            raise ConfigError(
                f"attack: {self.name} needs clients that train and upload; "
                f"{type(algorithm).__name__} trains on the server only"
            )
        upload = getattr(algorithm, "upload_type", None)
        if self.targets is None or capabilities(upload) & set(self.targets):
            return
        wanted = " or ".join(self.targets) or "nothing"
        carried = ", ".join(sorted(capabilities(upload))) or "nothing it declares"
        raise ConfigError(
            f"attack: {self.name} cannot target {type(algorithm).__name__}, which uploads "
            f"{getattr(upload, '__name__', 'an undeclared type')} ({carried}; it corrupts {wanted})"
        )

    def apply(
        self,
        results: RoundResults,
        ctx: RoundContext,
        state: ServerState | None = None,
    ) -> RoundResults:
        positions = [i for i, cid in enumerate(results.client_ids) if cid in self.malicious]
        if not positions:
            return results
        uploads = self.corrupt(list(results), positions, ctx, state)
        return results.with_uploads(positions, uploads)

    def corrupt(
        self,
        results: list[ClientResult],
        positions: list[int],
        ctx: RoundContext,
        state: ServerState | None,
    ) -> list[Message]:
        """The uploads of the malicious clients at `positions` (they trained benignly from the
        round's starting `state`)."""
        return [results[i].upload for i in positions]

    def describe(self) -> dict:
        return {"attack/name": self.name, "attack/num_malicious": len(self.malicious)}

    def round_metrics(self, results: Sequence[ClientResult]) -> dict[str, float]:
        """`attack/*` of the round, with `attack/malicious_majority`: 1 when half or more of
        the cohort is malicious (the vote of FRL, the mean of FedAvg, ... are then the
        attackers'; `redraw_majority` re-draws such a cohort), else 0."""
        metrics = super().round_metrics(results)
        ids = results.client_ids
        bad = sum(1 for c in ids if c in self.malicious)
        majority = bool(ids) and 2 * bad >= len(ids)
        self.majority_rounds += majority
        metrics["attack/malicious_majority"] = int(majority)
        return metrics

    def run_warnings(self, rounds: int) -> list[str]:
        lines = []
        if abs(self.realised_fraction - self.fraction) > 1e-9:  # int(): fewer attackers
            lines.append(
                f"attack.fraction={self.fraction} makes {len(self.malicious)} malicious clients, "
                f"a realised fraction of {self.realised_fraction:.4g}"
            )
        if self.majority_rounds:
            lines.append(
                f"{self.majority_rounds} of {rounds} rounds had a malicious majority (half or "
                "more of the cohort): attack.redraw_majority=true re-draws such cohorts"
            )
        return lines

    def state_dict(self) -> dict:
        return {"majority_rounds": self.majority_rounds}

    def load_state_dict(self, state: dict) -> None:
        self.majority_rounds = int(state.get("majority_rounds", 0))


def map_values(upload: Message, fn: Callable[[torch.Tensor], torch.Tensor]) -> Message:
    """The same message with `fn` applied elementwise to what it carries (a vector, signs, the
    kept values of a sparse vector: `Message.map_values`)."""
    return upload.map_values(fn)
