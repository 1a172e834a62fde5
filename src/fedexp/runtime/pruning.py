"""Optuna pruning from inside a run: report the per-round objective, stop a hopeless trial.

`TrialPruner` is the run callback an Optuna study's trial gets (see `hydra_plugins.fedexp_optuna`):
after every evaluated round it reports the objective to the trial in the study's storage and,
when the study's pruner says so, records the round (trial user attribute `pruned_round`) and
raises `Pruned`, which ends the run with status `pruned`.
"""

from __future__ import annotations

import math
from typing import Any

from fedexp.core.callbacks import Callback, RoundReport


class Pruned(RuntimeError):
    """The study's pruner stopped this trial after `round_idx`."""

    def __init__(self, round_idx: int, value: float):
        super().__init__(f"trial pruned after round {round_idx} (objective {value:.4g})")
        self.round_idx = round_idx


class TrialPruner(Callback):
    """Report `objective` after every evaluated round to one trial of a stored study.

    Args:
        objective: the metric reported (the run's resolved `objective`).
        storage: the study's storage URL (e.g. `sqlite:///<sweep dir>/optuna.db`).
        study_name: the study.
        trial_number: the trial's number in the study (the sweep job's number).
        pruner: an `optuna.pruners.BasePruner`, or None to report without pruning.
    """

    def __init__(self, objective: str, storage: str, study_name: str, trial_number: int, pruner):
        import optuna

        self.objective = objective
        study = optuna.load_study(study_name=study_name, storage=storage, pruner=pruner)
        trial_id = study._storage.get_trial_id_from_study_id_trial_number(
            study._study_id, trial_number
        )
        self.trial: Any = optuna.trial.Trial(study, trial_id)
        self.prunes = pruner is not None

    def on_round_end(self, report: RoundReport) -> None:
        value = report.metrics.get(self.objective) if report.evaluated else None
        if value is None or not math.isfinite(float(value)):
            return
        self.trial.report(float(value), step=report.round)
        if self.prunes and self.trial.should_prune():
            self.trial.set_user_attr("pruned_round", report.round)
            raise Pruned(report.round, float(value))


STUDY_SWEEPER = "hydra_plugins.fedexp_optuna.optuna_study.OptunaStudySweeper"


def trial_pruner(objective: str) -> TrialPruner | None:
    """The `TrialPruner` of this Hydra job when it is a trial of `OptunaStudySweeper`, else None.

    The sweeper numbers each job by its trial (`hydra.job.num`) and keeps the study in
    `hydra.sweeper.storage` (default: `optuna.db` in the sweep dir).
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import instantiate

    if not HydraConfig.initialized():
        return None
    hydra = HydraConfig.get()
    sweeper = hydra.sweeper
    if sweeper.get("_target_") != STUDY_SWEEPER:
        return None
    storage = sweeper.get("storage") or study_storage(hydra.sweep.dir)
    pruner = instantiate(sweeper.pruner) if sweeper.get("pruner") else None
    return TrialPruner(objective, storage, study_name(sweeper), int(hydra.job.num), pruner)


def study_storage(sweep_dir: str) -> str:
    """The default storage: SQLite `optuna.db` in the sweep dir."""
    from pathlib import Path

    return f"sqlite:///{Path(str(sweep_dir)).resolve() / 'optuna.db'}"


def study_name(sweeper) -> str:
    """The sweeper's `study_name`, or `fedexp` when none is set."""
    return str(sweeper.get("study_name") or "fedexp")
