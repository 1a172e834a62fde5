"""Every callback of a run, built here and nowhere else, in the order the round loop calls them:

1. the experiment's own: the audits' adapters (`AuditCallback`, one per `privacy=` audit), then
   any a script adds to `Components.callbacks`;
2. `RunRecorder` (`metrics.jsonl`, `summary.json`);
3. the loggers: on the command line those the config names (`logger.*`: CSV, W&B, ...) and, in a
   trial of `hydra/sweeper=optuna_study`, the trial's pruner (`config_loggers`); from a script,
   the ones it passes;
4. the progress bar or lines (command line);
5. the checkpointer, last: it saves the state of the attack, the executor, 1 and 2-4.

Under torchrun only rank 0 gets 3 and 4. `build_callbacks` logs the list it built.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from fedexp.audit.callback import AuditCallback
from fedexp.config.build import build
from fedexp.core.callbacks import Callback
from fedexp.loggers.files import RunRecorder
from fedexp.loggers.progress import ProgressBar, progress_callbacks
from fedexp.run.components import Components, saved_components
from fedexp.runtime.pruning import trial_pruner
from fedexp.runtime.resume import Checkpointer

log = logging.getLogger(__name__)


@dataclass
class RunCallbacks:
    """A run's callbacks by role; `all` is the order the round loop calls them in."""

    own: list[Callback]  # the audits' adapters and the experiment's added callbacks
    watchers: list[Callback]  # the recorder, the loggers, the progress display
    checkpointer: Checkpointer
    bar: ProgressBar | None = None  # the progress bar, taken down on an exception

    @property
    def all(self) -> list[Callback]:
        return [*self.own, *self.watchers, self.checkpointer]


def config_loggers(
    cfg: DictConfig, run_dir: str | Path, objective: str, multirun: bool
) -> list[Callback]:
    """The loggers the config names (`logger.<key>`, built with the run dir), and in a trial of
    an Optuna study its pruner; a bad logger option is a one-line ConfigError."""
    loggers = [
        build(node, f"logger.{key}", run_dir=Path(run_dir))
        for key, node in (cfg.get("logger") or {}).items()
    ]
    if multirun:  # a trial of hydra/sweeper=optuna_study reports each round to its study
        loggers += [p for p in [trial_pruner(objective)] if p is not None]
    return loggers


def build_callbacks(
    c: Components,
    loggers: Sequence[Callback] = (),
    *,
    progress: bool = False,
    output_rank: bool = True,
) -> RunCallbacks:
    """The run's callbacks (the module docstring's order); `progress`: add the progress bar or
    lines (`progress=` and `progress_every_s` of the config); `output_rank`: this process writes
    the outputs (torchrun's rank 0, or the only process)."""
    cfg = c.cfg
    own = [*(AuditCallback(audit, c.algorithm) for audit in c.audits), *c.callbacks]
    shown: list[Callback] = []
    if progress and output_rank:
        every_s = OmegaConf.select(cfg, "progress_every_s", default=None)  # an older run dir
        shown = progress_callbacks(cfg.rounds, c.objective, bool(cfg.progress), every_s)
    watchers = [RunRecorder(c.run_dir), *(loggers if output_rank else ()), *shown]
    every = int(cfg.get("checkpoint_every", 0) or 0)
    checkpointer = Checkpointer(
        c.run_dir, every, cfg, c.store, c.data, saved_components(c), watchers
    )
    bar = shown[0] if shown and isinstance(shown[0], ProgressBar) else None
    built = RunCallbacks(own, watchers, checkpointer, bar)
    log.info("callbacks: %s", ", ".join(type(cb).__name__ for cb in built.all))
    return built
