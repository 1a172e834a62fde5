"""Hydra launcher presets and a joblib sweep."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from tests.conftest import summaries

from fedexp.__main__ import find_conf


def test_launcher_presets_compose():
    with initialize_config_dir(config_dir=find_conf(), version_base="1.3"):
        slurm = compose("config", ["hydra/launcher=slurm_gpu"], return_hydra_config=True)
        local = compose("config", ["hydra/launcher=parallel"], return_hydra_config=True)
    assert slurm.hydra.launcher._target_.endswith("SlurmLauncher")
    assert (slurm.hydra.launcher.gpus_per_node, slurm.hydra.launcher.tasks_per_node) == (1, 1)
    assert local.hydra.launcher._target_.endswith("JoblibLauncher")
    assert local.hydra.launcher.n_jobs == 2


@pytest.mark.slow
def test_two_job_joblib_multirun(cli):
    proc = cli(
        "debug=smoke",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "seed=0,1",
        multirun=True,
        env={"OMP_NUM_THREADS": "1"},
    )
    found = summaries(cli.cwd / "outputs")
    assert len(found) == 2, proc.stdout[-2000:]
    assert sorted(s["config"]["seed"] for s in found) == [0, 1]
    assert all(s["status"] == "completed" for s in found)
