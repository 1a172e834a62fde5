"""Stop a run cleanly on SIGINT/SIGTERM: the round finishes, a checkpoint is written, the run
stops with `Interrupted`; a second signal stops at once with `StoppedAtOnce` (the CLI exits
128 + the signal's number, naming the checkpoint to resume from).

The handlers stay installed until the run's summary is written: a signal that arrives during
the last round (its evaluation) or after it (the final model, the summary) lets the run
complete; only a second one stops it at once."""

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


class StoppedAtOnce(BaseException):
    """A second SIGINT/SIGTERM arrived during the graceful stop: the run ends where it is (the
    checkpoint on disk, if any, is the last complete one). A BaseException, as
    KeyboardInterrupt is, so that no `except Exception` of a component swallows it."""

    def __init__(self, signum: int):
        super().__init__(f"stopped at once by a second {signal.Signals(signum).name}")
        self.signum = signum


class StopSignals:
    """First SIGINT/SIGTERM: finish the round, checkpoint, stop (after the last round: finish
    the run). Second: stop at once."""

    def __init__(self) -> None:
        self.requested: int | None = None
        self.finishing = False  # the last round is done: the run completes whatever comes
        self._depth = 0  # nested `installed()`: the outermost one sets and restores

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:
            raise StoppedAtOnce(signum)
        self.requested = signum
        if self.finishing:
            what = "the last round is done; finishing the run"
        else:
            what = "stopping after this round with a checkpoint"
        log.warning("%s: %s (again to stop at once)", signal.Signals(signum).name, what)

    @contextmanager
    def installed(self) -> Iterator[StopSignals]:
        if threading.current_thread() is not threading.main_thread() or self._depth:
            yield self  # signal handlers can only be set from the main thread; set already
            return
        previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        self._depth += 1
        try:
            yield self
        finally:
            self._depth -= 1
            for s, handler in previous.items():
                signal.signal(s, handler)
