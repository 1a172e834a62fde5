"""Weights & Biases: one run per job, step = round, group = the multirun sweep.

Offline when no API key is configured. Any W&B failure is a warning: it never stops a run. An
online `wandb.init` that gets no answer within `init_timeout` seconds (no network, a server down)
goes on offline, with one warning line saying how to upload the run later (`wandb sync`); later
jobs of the same process then go offline at once instead of waiting again.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from fedexp.core.summary import RunSummary
from fedexp.loggers.base import Logger

log = logging.getLogger(__name__)
_unreachable: str | None = None  # why the last online init failed in this process, if it did


class WandbLogger(Logger):
    """Logs evaluated rounds to a W&B run (offline without an API key)."""

    def __init__(
        self,
        run_dir: str | Path,
        project: str,
        entity: str | None,
        mode: str | None,
        tags: list[str] | None,
        init_timeout: float,
    ):
        if init_timeout <= 0:
            from fedexp.core.types import ConfigError

            raise ConfigError(f"logger.wandb.init_timeout: must be > 0, got {init_timeout}")
        self.init_timeout = float(init_timeout)
        self.run_dir = Path(run_dir)
        self.project, self.entity, self.tags = project, entity, list(tags or [])
        self.mode = mode or os.environ.get("WANDB_MODE") or self._default_mode()
        self.run = None
        self.resume_id: str | None = None  # set on resume: continue this W&B run

    def state_dict(self) -> dict:
        """The W&B run id, saved in checkpoints so a resumed run continues the same W&B run."""
        run_id = getattr(self.run, "id", None) or self.resume_id
        return {"run_id": run_id} if run_id else {}

    def load_state_dict(self, state: dict) -> None:
        self.resume_id = state.get("run_id")

    @staticmethod
    def _default_mode() -> str:
        if os.environ.get("WANDB_API_KEY"):
            return "online"
        netrc = Path.home() / ".netrc"
        if netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
            return "online"
        return "offline"

    def _guard(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # W&B must never stop a run
            log.warning("W&B %s failed (%s: %s); the run goes on", what, type(err).__name__, err)
            return None

    def start(self, config: dict, run_name: str, group: str | None) -> None:
        global _unreachable

        def _init(mode: str):
            import wandb

            return wandb.init(
                project=self.project,
                entity=self.entity,
                mode=mode,
                dir=str(self.run_dir),
                config=config,
                name=run_name,
                group=group,
                tags=self.tags,
                reinit="finish_previous",
                settings=wandb.Settings(init_timeout=self.init_timeout),
                # rounds re-run after the checkpoint are logged again with the same values
                **({"id": self.resume_id, "resume": "allow"} if self.resume_id else {}),
            )

        if self.mode != "online":
            self.run = self._guard("init", _init, self.mode)
            return
        reason = _unreachable
        if reason is None:
            try:
                self.run = _init("online")
                return
            except Exception as err:  # W&B must never stop a run
                first = str(err).strip().splitlines()[0] if str(err).strip() else ""
                reason = f"{type(err).__name__}: {first[:160]}"
                _unreachable = f"as earlier in this process: {reason}"
        self.mode = "offline"
        self.run = self._guard("init", _init, "offline")
        if self.run is not None:
            log.warning(
                "W&B: online init failed (%s); logging offline; upload later with: wandb sync %s",
                reason,
                Path(self.run.dir).parent,
            )

    def log_metrics(self, metrics: dict, step: int) -> None:
        if self.run is not None:
            self._guard("log", self.run.log, dict(metrics), step=step)

    def log_artifact(self, path: str | Path, kind: str) -> None:
        if self.run is None:
            return

        def _log():
            import wandb

            if str(path).endswith(".png"):
                self.run.log({kind: wandb.Image(str(path))})
            else:
                self.run.save(str(path), base_path=str(Path(path).parent), policy="now")

        self._guard("artifact", _log)

    def finish(self, summary: RunSummary) -> None:
        if self.run is None:
            return
        final = {k: v for k, v in summary.metrics.items() if isinstance(v, int | float)}
        self._guard("summary", self.run.summary.update, {**final, "status": summary.status})
        self._guard("finish", self.run.finish, exit_code=0 if summary.completed else 1)
        self.run = None
