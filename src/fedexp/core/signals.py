"""Stop a run cleanly on SIGINT/SIGTERM: the round finishes, a checkpoint is written, the run
stops with `Interrupted`; a second signal stops at once."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


class Interrupted(RuntimeError):
    """SIGINT/SIGTERM arrived; the run stopped after a round and wrote a checkpoint."""

    def __init__(self, round_idx: int, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name} after round {round_idx}")
        self.round_idx = round_idx
        self.signum = signum


class StopSignals:
    """First SIGINT/SIGTERM: finish the round, checkpoint, stop. Second: stop at once."""

    def __init__(self) -> None:
        self.requested: int | None = None

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt
        self.requested = signum
        log.warning(
            "%s: stopping after this round with a checkpoint (again to stop at once)",
            signal.Signals(signum).name,
        )

    @contextmanager
    def installed(self) -> Iterator[StopSignals]:
        if threading.current_thread() is not threading.main_thread():
            yield self  # signal handlers can only be set from the main thread
            return
        previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
