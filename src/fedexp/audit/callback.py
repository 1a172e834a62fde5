"""An audit (`privacy=...`, e.g. the membership-inference audit) as a run callback."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from fedexp.core.callbacks import Callback, RoundReport


class AuditView(NamedTuple):
    """What an audit reads of the run besides the round's state: the algorithm it audits and
    the run's last round (audits run at the final evaluation at least)."""

    algorithm: Any
    rounds: int


class AuditCallback(Callback):
    """Calls `audit.on_evaluate(view, state, round)` after each evaluation; the metrics it
    returns (e.g. `privacy/mia_*`) join the round's metrics.

    An audit's own `state_dict` / `load_state_dict`, where it has them, are this callback's,
    so a checkpoint saves them.
    """

    def __init__(self, audit, algorithm) -> None:
        self.audit = audit
        self.algorithm = algorithm

    def on_evaluate(self, report: RoundReport) -> Mapping[str, float] | None:
        view = AuditView(self.algorithm, report.last_round)
        return self.audit.on_evaluate(view, report.state, report.round)

    def __getattr__(self, name: str):
        audit = self.__dict__.get("audit")
        if name in ("state_dict", "load_state_dict") and audit is not None:
            return getattr(audit, name)
        raise AttributeError(name)
