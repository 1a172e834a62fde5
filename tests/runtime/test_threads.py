"""`threads: auto` picks torch's CPU threads for the machine; an integer overrides."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from fedexp.core.types import ConfigError
from fedexp.run import Experiment
from fedexp.runtime.threads import available_cores, choose_threads

REPO = Path(__file__).resolve().parents[2]
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    return monkeypatch


def test_auto_on_a_cpu_is_one_thread_a_process(clean_env):
    assert choose_threads("auto", CPU)[0] == 1


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
