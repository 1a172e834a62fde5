"""Aggregators: pure functions (stacked updates [n, d], client weights [n]) -> aggregate [d].

Every aggregator also takes `num_malicious`, the round's true number of malicious uploads: the FRL
paper grants it to the robust baselines, and an aggregator configured with `known` uses it. The
algorithm passes `num_malicious=ctx.num_malicious`, which the round loop fills with
`malicious_count(results)` (`fedexp.engine.aggregation`) after the attack (attacks flag the
uploads they corrupt).

`rank_vote` aggregates FRL rankings (uploads with the `ranking` capability); every other
aggregator aggregates real vectors. An aggregator that accepts rankings carries
`accepts = "rankings"`, and may carry `check(**options)` that raises `ConfigError` for bad
options before training (`fedexp.engine.aggregation.check_aggregator`). The aggregators know
nothing of client results or messages: the adapters between those and tensors live in
`fedexp.engine.aggregation` and in the algorithms.

An aggregator that needs more than the round's uploads declares it in `inputs` (a tuple of names
from `INPUTS`) and takes them as keyword arguments; it stays a function of its arguments:

- `previous`: its own output in the algorithm's previous aggregation (None before the first).
  The algorithm keeps it in its server state (`ServerState.buffers[PREVIOUS_KEY]`), so it is
  checkpointed and a resumed run continues exactly (centered clipping's starting point).
- `reference`: the server's own update of the round, trained on the server pool as a client
  trains (FLTrust's root-dataset update).

The FedAvg family gives both (`FedAvg.aggregator_inputs`); an algorithm that does not give what
an aggregator declares is refused before training (`check_aggregator`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from fedexp.aggregators.mean import weighted_mean
from fedexp.errors import ConfigError

__all__ = ["weighted_mean", "aggregator_name", "inputs_of", "KNOWN", "INPUTS", "PREVIOUS_KEY"]

KNOWN = "known"  # option value: use the round's true number of malicious clients
INPUTS = ("previous", "reference")  # what an aggregator may declare it takes besides the uploads
PREVIOUS_KEY = "aggregator/previous"  # the server-state buffer holding the previous output
log = logging.getLogger(__name__)
_warned: set[str] = set()
_counts: dict[str, list] = {}  # key -> [times, its first message]: this run's (`warn_once`)


def warn_once(key: str, message: str) -> None:
    """A cap or a fallback the aggregator applied (it changes what that round's aggregate
    means): logged the first time `key` is seen in this run (a cap hit every round would
    otherwise flood the log), counted every time; `run_notes()` puts the count beside the
    numbers (the run's warnings: the final table, the sweep table, the report)."""
    if key not in _warned:
        _warned.add(key)
        log.warning("%s (reported once)", message)
    _counts.setdefault(key, [0, message])[0] += 1


def run_notes() -> list[str]:
    """This run's `warn_once` lines, each with the number of aggregations it held for."""
    return [
        message if times == 1 else f"{message} (the first of {times} aggregations so)"
        for times, message in _counts.values()
    ]


def new_run() -> None:
    """Forget the last run's notes (a sweep's jobs may share a process)."""
    _warned.clear()
    _counts.clear()


def round_size(cfg) -> int:
    """Uploads aggregated per round: the round's sampled clients less those that drop out
    (`dropout`: round(fraction x sampled), halves up, as `fedexp.core.seeding.dropped_clients`
    counts them). An availability trace may leave a round fewer."""
    sampled = int(cfg.clients_per_round)
    return sampled - math.floor(float(cfg.get("dropout", 0.0) or 0.0) * sampled + 0.5)


def fixed_count(option: Any, num_clients: int) -> int | None:
    """The count an option resolves to in every round of `num_clients` uploads (an int, or a
    fraction of the round); None for `known`, which varies with the round's malicious clients."""
    if option == KNOWN or isinstance(option, bool) or not isinstance(option, int | float):
        return None
    return resolve_count(option, 0, num_clients, "")


def aggregator_name(aggregator: Callable) -> str:
    """The function name behind an aggregator partial (`trimmed_mean`, `rank_vote`, ...)."""
    return getattr(getattr(aggregator, "func", aggregator), "__name__", type(aggregator).__name__)


def inputs_of(aggregator: Callable) -> tuple[str, ...]:
    """The inputs (`INPUTS`) an aggregator, or a partial of one, declares it takes."""
    return tuple(getattr(getattr(aggregator, "func", aggregator), "inputs", ()))


def resolve_count(option: Any, num_malicious: int, num_clients: int, key: str) -> int:
    """An option that is `known`, a count (int >= 0) or a fraction of the round (0 < float < 1)."""
    if option == KNOWN:
        return int(num_malicious)
    if isinstance(option, bool):
        raise ConfigError(f"aggregator.{key}: must be 'known', an int or a fraction, got {option}")
    if isinstance(option, int):
        return option
    return int(option * num_clients)


def check_count(option: Any, key: str, max_fraction: float = 0.5) -> None:
    """Validate an option accepted by `resolve_count`."""
    ok = (
        option == KNOWN
        or (isinstance(option, int) and not isinstance(option, bool) and option >= 0)
        or (isinstance(option, float) and 0 <= option < max_fraction)
    )
    if not ok:
        raise ConfigError(
            f"aggregator.{key}: must be 'known', an int >= 0 or a fraction in "
            f"[0, {max_fraction}), got {option!r}"
        )
