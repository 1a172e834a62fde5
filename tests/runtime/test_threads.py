"""`threads: auto` picks torch's CPU threads for the machine; an integer overrides."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from fedexp.core.types import ConfigError
from fedexp.models.mlp import mlp
from fedexp.run import Experiment
from fedexp.runtime.threads import (
    PARALLEL_STEP_FLOPS,
    apply_threads,
    available_cores,
    choose_threads,
    idle_cores,
    spare_core,
    step_flops,
)

REPO = Path(__file__).resolve().parents[2]
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    return monkeypatch


def test_auto_on_a_cpu_is_one_thread_a_process_for_a_step_of_unknown_size(clean_env):
    assert choose_threads("auto", CPU)[0] == 1


@pytest.mark.parametrize(
    ("flops", "idle", "expected"),
    [
        (10e6, 8.0, 1),  # the digits MLP's step: one thread even on an idle machine
        (60e6, 8.0, 2),  # LeNet-5 at batch 32: one thread per 30 MFLOP of the step
        (1e9, 2.0, 2),  # the pfl CNN on two idle cores
        (1e9, 0.4, 1),  # ... and on busy ones
        (1e9, 7.6, 8),  # one thread per idle core
        (1e9, 16.0, 8),  # at most the cores this process may use (8)
    ],
)
def test_auto_on_a_cpu_counts_the_step_and_the_idle_cores(clean_env, flops, idle, expected):
    threads, why = choose_threads("auto", CPU, flops, idle)
    assert threads == expected
    if flops >= PARALLEL_STEP_FLOPS:
        assert f"{flops / 1e6:.0f} MFLOP a step, {idle:.1f} of 8 cores idle" in why


def test_the_step_is_counted_by_hand_for_an_mlp():
    # 64 -> 200 -> 200 -> 10: 2 FLOPs per multiply-add, forward and twice that backward
    factory = partial(mlp, input_shape=(64,), num_classes=10, hidden=[200, 200])
    macs = 64 * 200 + 200 * 200 + 200 * 10
    assert step_flops(factory, torch.zeros(5, 64), batch_size=32) == 3 * 2 * macs * 32
    before = torch.random.get_rng_state()
    step_flops(factory, torch.zeros(5, 64), 32)
    assert torch.equal(torch.random.get_rng_state(), before)  # the run's RNG is untouched
    assert step_flops(lambda: 1 / 0, torch.zeros(5, 64), 32) is None


def test_idle_cores_reads_a_sane_count():
    assert 0.0 <= idle_cores(0.02) <= (os.cpu_count() or 1) + 0.5


def test_a_resumed_run_keeps_its_count_under_auto_only(clean_env):
    before = torch.get_num_threads()
    try:
        assert apply_threads("auto", CPU, 1e9, resumed=2) == (
            2,
            "the count the resumed run started with",
        )
        assert apply_threads(3, CPU, None, resumed=2)[0] == 3  # a set count is the user's
    finally:
        torch.set_num_threads(before)


@pytest.mark.experiment
def test_an_auto_run_on_a_large_step_takes_the_idle_cores_and_records_them(clean_env, tmp_path):
    clean_env.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    clean_env.setattr("fedexp.runtime.threads.idle_cores", lambda: 2.0)
    clean_env.setattr("fedexp.runtime.threads.PARALLEL_STEP_FLOPS", 1e6)  # the MLP counts large
    before = torch.get_num_threads()
    try:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose(
                "config",
                [
                    "debug=smoke",
                    "checkpoint_every=1",
                    "executor=sequential",  # one process (auto would shard over the 2 cores)
                    f"paths.cache_dir={tmp_path / 'c'}",
                ],
            )
        exp = Experiment(cfg, tmp_path)
        assert exp.threads == 2 and torch.get_num_threads() == 2
        exp.run([])
        saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
        assert saved["threads"] == 2
    finally:
        torch.set_num_threads(before)


def test_auto_follows_omp_num_threads_capped_by_the_cores_this_process_may_use(clean_env):
    clean_env.setenv("OMP_NUM_THREADS", "3")
    assert choose_threads("auto", CPU) == (3, "OMP_NUM_THREADS")
    clean_env.setenv("OMP_NUM_THREADS", "64")
    assert choose_threads("auto", CPU)[0] == 8  # the affinity mask has 8 cores
    clean_env.setenv("SLURM_CPUS_PER_TASK", "2")
    assert available_cores() == 2
    assert choose_threads("auto", CPU)[0] == 2


def test_auto_on_a_gpu_keeps_a_few_host_threads(clean_env):
    assert choose_threads("auto", CUDA)[0] == 4
    clean_env.setenv("SLURM_CPUS_PER_TASK", "2")
    assert choose_threads("auto", CUDA)[0] == 2


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "many"])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ConfigError, match="threads: must be auto or an integer >= 1"):
        choose_threads(bad, CPU)


@pytest.mark.experiment
def test_the_chosen_count_is_applied_and_reported(tmp_path):
    before = torch.get_num_threads()
    try:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose(
                "config", ["debug=smoke", "threads=2", f"paths.cache_dir={tmp_path / 'c'}"]
            )
        exp = Experiment(cfg, tmp_path)
        assert torch.get_num_threads() == 2 and exp.threads == 2
        summary = exp.run([])
        assert summary.metrics["runtime/threads"] == 2
    finally:
        torch.set_num_threads(before)


def test_a_spare_core_is_one_the_runs_processes_and_threads_leave(clean_env):
    # 8 cores by affinity (clean_env)
    assert spare_core(1, 1) and spare_core(7, 1) and spare_core(2, 3)
    assert not spare_core(8, 1) and not spare_core(2, 4) and not spare_core(1, 8)
    clean_env.setenv("OMP_NUM_THREADS", "2")  # a parallel sweep's share: two cores
    assert spare_core(1, 1) and not spare_core(2, 1)
    clean_env.setenv("SLURM_CPUS_PER_TASK", "1")
    assert not spare_core(1, 1)
