"""A Hydra sweeper around a persistent Optuna study, with pruning on the per-round objective.

`hydra/sweeper=optuna_study` (conf/hydra/sweeper/optuna_study.yaml) keeps the study in SQLite
(`<sweep dir>/optuna.db` unless `storage` names another database), so a search killed midway
continues where it stopped when run again with the same `hydra.sweep.dir`: finished trials stay,
a trial the kill interrupted is marked failed and its parameters are tried again. Each trial is
proposed by the sampler seeded with a seed derived from the sampler's `seed` and the number of
trials already stored (`trial_seed`), so a fresh study is reproducible, while a resumed or
extended one (a larger `n_trials`) proposes new points rather than replaying its first ones. A
proposal equal to the parameters of a completed trial is not run again: it is recorded with that
trial's value and the user attribute `repeats` (the earlier trial's number). Each trial is
one job whose number is the trial's number (its run dir is `<sweep dir>/<trial number>`); the run
reports its `objective` after every evaluated round (`fedexp.runtime.pruning.TrialPruner`) and the
study's `pruner` may stop it there. The search space uses the Hydra sweep syntax:
`interval(a, b)`, `tag(log, interval(a, b))` (ints when both ends are ints), `choice(...)`,
`range(...)`. A search needs an objective measured on validation data (`auto` or `eval/val/...`
with `partition.val_fraction` > 0, or another metric named by `objective`): without one it is
refused before its first trial (`fedexp.config.validation.check_search_objective`).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from fedexp.runtime.pruning import study_name, study_storage

if TYPE_CHECKING:  # optuna is imported when a search runs: Hydra imports every plugin at start-up
    import optuna
    from optuna.distributions import BaseDistribution

log = logging.getLogger(__name__)
INTERRUPTED = "interrupted"  # user attribute of a trial a killed sweep left running
REPEATS = "repeats"  # user attribute of a proposal that repeats a completed trial (its number)


def distribution(override: Override) -> BaseDistribution:
    """The Optuna distribution of one sweep override (`interval`, `choice`, `range`)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    value = override.value()
    if isinstance(value, IntervalSweep):
        log_scale = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log_scale)
        return FloatDistribution(float(value.start), float(value.end), log=log_scale)
    return CategoricalDistribution(list(override.sweep_iterator()))


class OptunaStudySweeper(Sweeper):
    """Hydra sweeper: ask a stored Optuna study for trials, run them, tell it the results.

    Args:
        sampler: an `optuna.samplers.BaseSampler` (instantiated by Hydra from its config); with
            a `seed` in its config, each proposal comes from a copy seeded by `trial_seed`.
        pruner: an `optuna.pruners.BasePruner`, or None: no trial is stopped early.
        direction: `maximize` or `minimize` the runs' `objective`.
        study_name: the study's name in the storage (null: `fedexp`).
        storage: an Optuna storage URL; null: SQLite `optuna.db` in the sweep dir.
        n_trials: trials to finish, counting those of earlier runs of the same study.
        n_jobs: trials launched at once (the launcher runs them, e.g. hydra/launcher=parallel).
        params: the search space, `{key: "interval(a, b)"}` and the like.
    """

    def __init__(
        self,
        sampler: Any,
        pruner: Any,
        direction: str,
        study_name: str | None,
        storage: str | None,
        n_trials: int,
        n_jobs: int,
        params: dict | None,
        **_: Any,
    ) -> None:
        self.sampler, self.pruner, self.direction = sampler, pruner, direction
        self.study_name = study_name
        self.storage = storage
        self.n_trials, self.n_jobs = int(n_trials), max(1, int(n_jobs))
        self.params = dict(params or {})
        self.config: DictConfig | None = None  # the run's config (`setup`)

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def _space(self, arguments: list[str]) -> tuple[dict[str, BaseDistribution], list[str]]:
        parser = OverridesParser.create()
        space: dict[str, BaseDistribution] = {}
        fixed: list[str] = []
        lines = [f"{k}={v}" for k, v in self.params.items()]
        for override in parser.parse_overrides(lines) + parser.parse_overrides(arguments):
            key = override.get_key_element()
            if override.is_sweep_override():
                space[key] = distribution(override)
            else:
                space.pop(key, None)
                fixed.append(override.input_line)
        return space, fixed

    def _load(self, storage: str) -> optuna.Study:
        import optuna
        from optuna.trial import TrialState

        study = optuna.create_study(
            study_name=self.study_name or study_name({}),
            storage=storage,
            sampler=self.sampler,
            pruner=self.pruner,
            direction=self.direction,
            load_if_exists=True,
        )
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            # left running by a killed sweep: failed, and its parameters tried again
            study._storage.set_trial_user_attr(trial._trial_id, INTERRUPTED, True)
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
            study.enqueue_trial(trial.params, skip_if_exists=False)
            log.info("trial %d was interrupted; its parameters are queued again", trial.number)
        return study

    def sweep(self, arguments: list[str]) -> None:
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        space, fixed = self._space(arguments)
        refuse_without_objective(self.config, list(space), sweep_dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        storage = self.storage or study_storage(str(sweep_dir))
        study = self._load(storage)
        name = study.study_name
        # every job finds its study whatever `${now:}` gives in its process
        fixed += [f"hydra.sweeper.storage='{storage}'", f"hydra.sweeper.study_name='{name}'"]
        self.optimize(study, space, fixed)
        write_results(study, sweep_dir)

    def optimize(self, study: optuna.Study, space: dict, fixed: list[str]) -> None:
        """Ask, run and tell until `n_trials` trials have finished (those stored included)."""
        while finished(study) < self.n_trials:
            trials = self._ask_batch(study, space)
            if not trials:  # every proposal repeated a completed trial
                continue
            jobs = [[*fixed, *(override(k, v) for k, v in t.params.items())] for t in trials]
            returns = self.launcher.launch(jobs, initial_job_idx=trials[0].number)
            for trial, ret in zip(trials, returns):
                tell(study, trial, ret)

    def _ask_batch(self, study: optuna.Study, space: dict) -> list[optuna.Trial]:
        """Up to `n_jobs` new trials with consecutive numbers (a job's number is its trial's).
        A proposal repeating a completed trial is told that trial's value at once and ends a
        started batch (the next trial's number would not follow on)."""
        trials: list[optuna.Trial] = []
        while len(trials) < self.n_jobs and finished(study) + len(trials) < self.n_trials:
            study.sampler = self._sampler(len(study.get_trials(deepcopy=False)))
            trial = study.ask(space)
            earlier = completed_with(study, trial.params)
            if earlier is None:
                trials.append(trial)
                continue
            trial.set_user_attr(REPEATS, earlier.number)
            study.tell(trial, earlier.value)
            log.info(
                "trial %d proposes the parameters of trial %d: its value %.6g is recorded, no run",
                trial.number,
                earlier.number,
                earlier.value,
            )
            if trials:
                break
        return trials

    def _sampler(self, stored: int) -> Any:
        """The sampler of the next proposal: the configured one, its seed derived from the
        configured seed and the `stored` trials; the sampler as given when its config has no
        seed (or there is no config, as when built by hand)."""
        from hydra.utils import instantiate

        conf = self.config.hydra.sweeper.get("sampler") if self.config is not None else None
        if conf is None or conf.get("seed") is None:
            return self.sampler
        return instantiate(conf, seed=trial_seed(int(conf.seed), stored))


def override(key: str, value: Any) -> str:
    """`key=value` as a Hydra override (strings quoted)."""
    return f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}"


def trial_seed(seed: int, stored: int) -> int:
    """The sampler seed of the proposal made when `stored` trials are in the study: a fresh
    study with the same `seed` proposes the same points; a continued one, new ones."""
    import numpy as np

    return int(np.random.SeedSequence([seed % 2**63, stored]).generate_state(1)[0])


def completed_with(study: optuna.Study, params: dict) -> optuna.trial.FrozenTrial | None:
    """The first completed trial with exactly these parameters, if any."""
    from optuna.trial import TrialState

    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if trial.params == params:
            return trial
    return None


def refuse_without_objective(config: DictConfig, searched: list[str], sweep_dir: Path) -> None:
    """Before any trial: a search without an objective on validation data is refused in one line
    (exit 2), and the sweep dir it claimed is left as it was (`check_search_objective`)."""
    # start-up: Hydra imports every plugin at every start; fedexp's modules load when a search runs
    from fedexp.config.validation import check_search_objective
    from fedexp.errors import ConfigError
    from fedexp.runtime import run_dir as run_dir

    try:
        check_search_objective(config, searched)
    except ConfigError as err:
        run_dir.discard(sweep_dir)
        run_dir.refuse(err)


def finished(study: optuna.Study) -> int:
    """Trials that ran to an end (complete, pruned or failed; not those a kill interrupted)."""
    from optuna.trial import TrialState

    done = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return sum(
        1 for t in study.get_trials(deepcopy=False, states=done) if INTERRUPTED not in t.user_attrs
    )


def tell(study: optuna.Study, trial: optuna.Trial, ret: Any) -> None:
    """Record one job's end: pruned (the run said so), failed (no finite value), or its value."""
    from optuna.trial import TrialState

    attrs = study._storage.get_trial(trial._trial_id).user_attrs
    if "pruned_round" in attrs:
        study.tell(trial, state=TrialState.PRUNED)
        return
    try:
        value = ret.return_value
    except Exception:  # the job raised; Hydra keeps the exception in its return
        value = None
    if value is None or not math.isfinite(float(value)):
        study.tell(trial, state=TrialState.FAIL)
    else:
        study.tell(trial, float(value))


def write_results(study: optuna.Study, sweep_dir: Path) -> None:
    """`<sweep dir>/optimization_results.yaml`: the best trial's parameters and value."""
    from optuna.trial import TrialState

    results: dict[str, Any] = {"name": "optuna", "study_name": study.study_name}
    try:
        best = study.best_trial
        results.update(best_params=dict(best.params), best_value=float(best.value))
    except ValueError:  # no trial completed
        results.update(best_params={}, best_value=None)
    counts = {s.name.lower(): len(study.get_trials(states=(s,))) for s in TrialState}
    results["trials"] = {k: v for k, v in counts.items() if v}
    repeats = sum(REPEATS in t.user_attrs for t in study.get_trials(deepcopy=False))
    if repeats:  # complete trials that repeated an earlier one's parameters: not run
        results["trials"]["repeats"] = repeats
    (sweep_dir / "optimization_results.yaml").write_text(yaml.safe_dump(results, sort_keys=False))
    log.info("best: %s", results)
