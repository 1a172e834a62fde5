"""A Hydra callback for tests: SIGKILL (or another `signal`) the whole sweep (its process group:
the launcher and its workers) once job `job`'s dir holds `after` (checkpoint.pt: the job is
interrupted after a round; summary.json: the job finished). Added to a sweep with
`+hydra.callbacks.kill._target_=sweep_kill.KillAt +hydra.callbacks.kill.job=2`."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback


class KillAt(Callback):
    def __init__(self, job: int, after: str = "checkpoint.pt", signal: str = "SIGKILL") -> None:
        self.job, self.after, self.signal = int(job), after, signal

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        os.setpgid(0, 0)  # a group of the sweep's own: the launcher and the workers it starts

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        if int(config.hydra.job.num) != self.job:
            return
        target = Path(str(config.hydra.runtime.output_dir)) / self.after

        def watch() -> None:
            while not target.exists():
                time.sleep(0.005)
            os.killpg(os.getpgid(0), signal.Signals[self.signal])

        threading.Thread(target=watch, daemon=True).start()
