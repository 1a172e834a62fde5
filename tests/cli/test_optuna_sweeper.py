"""The Optuna sweeper's ask/tell loop on a stored study, driven in-process with a fake launcher
whose objective is a formula: a continued or extended study proposes new points, a fresh one
with the same seed the same points, and a repeated proposal is not run."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
from omegaconf import OmegaConf
from optuna.storages import InMemoryStorage
from optuna.trial import TrialState

from hydra_plugins.fedexp_optuna.optuna_study import REPEATS, OptunaStudySweeper, trial_seed


class FakeLauncher:
    """Runs each job as `objective(x, k)`, numbering them from `initial_job_idx` as Hydra does."""

    def __init__(self):
        self.jobs: list[tuple[int, dict]] = []

    def launch(self, jobs, initial_job_idx):
        returns = []
        for i, job in enumerate(jobs):
            params = dict(o.split("=", 1) for o in job)
            self.jobs.append((initial_job_idx + i, params))
            value = -((float(params["x"]) - 0.3) ** 2) + 0.01 * int(params.get("k", 0))
            returns.append(SimpleNamespace(return_value=value))
        return returns


def process(storage, n_trials: int, params: dict, seed: int = 0):
    """A sweeper as a new process builds it (a fresh sampler from the same config); the storage
    stands for the sweep dir's SQLite file (in memory: SQLite's set-up costs a second a study)."""
    sampler = {"_target_": "optuna.samplers.TPESampler", "seed": seed, "n_startup_trials": 3}
    sweeper = OptunaStudySweeper(
        sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=3),
        pruner=None,
        direction="maximize",
        study_name="s",
        storage=storage,
        n_trials=n_trials,
        n_jobs=1,
        params=params,
    )
    sweeper.config = OmegaConf.create({"hydra": {"sweeper": {"sampler": sampler}}})
    sweeper.launcher = FakeLauncher()
    study = sweeper._load(storage)
    space, _ = sweeper._space([])
    return sweeper, study, space


def search(storage, n_trials: int, params: dict, seed: int = 0) -> FakeLauncher:
    sweeper, study, space = process(storage, n_trials, params, seed)
    sweeper.optimize(study, space, [])
    return sweeper.launcher


def trials(storage) -> list:
    return optuna.load_study(study_name="s", storage=storage).trials


X = {"x": "interval(0.0, 1.0)"}


def test_a_killed_resumed_and_extended_study_never_proposes_a_point_twice():
    storage = InMemoryStorage()
    search(storage, 2, X)
    sweeper, study, space = process(storage, 2, X)
    study.sampler = sweeper._sampler(2)
    study.ask(space)  # trial 2 starts, then the process is killed: it stays RUNNING
    search(storage, 4, X)  # the same command: trial 2's parameters again (3), then trial 4
    search(storage, 6, X)  # extended: trials 5 and 6
    found = trials(storage)
    assert [t.state for t in found] == [TrialState.COMPLETE] * 2 + [TrialState.FAIL] + [
        TrialState.COMPLETE
    ] * 4
    assert found[2].user_attrs["interrupted"] and found[3].params == found[2].params
    ran = [t.params["x"] for i, t in enumerate(found) if i != 2]  # 6 finished trials
    assert len(set(ran)) == 6


def test_an_extended_study_proposes_what_a_longer_fresh_study_does():
    # the proposal of trial n depends only on the seed and the trials before it
    short, fresh = InMemoryStorage(), InMemoryStorage()
    search(short, 2, X)  # the third trial is still a random start-up one
    search(short, 5, X)
    search(fresh, 5, X)
    assert [t.params for t in trials(short)] == [t.params for t in trials(fresh)]
    assert [t.value for t in trials(short)] == [t.value for t in trials(fresh)]
    other = InMemoryStorage()
    search(other, 2, X, seed=1)  # another seed, other points
    assert trials(other)[0].params != trials(fresh)[0].params


def test_a_proposal_repeating_a_completed_trial_is_recorded_not_run():
    storage = InMemoryStorage()
    launcher = search(storage, 6, {"x": "choice(0.3)", "k": "choice(1, 2)"})
    found = trials(storage)
    assert len(found) == 6 and all(t.state == TrialState.COMPLETE for t in found)
    # two parameter sets: each ran once, under its own trial's number
    runs = {(t.params["x"], t.params["k"]): t for t in found if REPEATS not in t.user_attrs}
    assert sorted(k for _, k in runs) == [1, 2]
    assert sorted(n for n, _ in launcher.jobs) == sorted(t.number for t in runs.values())
    for t in found:
        if REPEATS in t.user_attrs:
            first = found[t.user_attrs[REPEATS]]
            assert first.params == t.params and t.value == first.value == 0.01 * t.params["k"]


def test_the_trial_seeds_depend_on_the_seed_and_the_stored_trials():
    assert trial_seed(0, 3) == trial_seed(0, 3)
    assert len({trial_seed(0, n) for n in range(50)} | {trial_seed(1, n) for n in range(50)}) == 100
    assert 0 <= trial_seed(-1, 0) < 2**32


def test_a_sampler_without_a_seed_is_used_as_given():
    sweeper, _, _ = process(InMemoryStorage(), 1, X)
    assert sweeper._sampler(5) is not sweeper.sampler  # a copy seeded by trial_seed(0, 5)
    sweeper.config.hydra.sweeper.sampler.seed = None
    assert sweeper._sampler(5) is sweeper.sampler
