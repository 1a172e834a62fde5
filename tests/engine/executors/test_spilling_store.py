"""Vectorized executor with a spilling client store; Hydra launcher presets and a joblib sweep."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir
from tests.conftest import summaries

from fedexp.__main__ import find_conf
from fedexp.run import Experiment

RUN = ["debug=smoke", "algorithm=fedrep", "algorithm.head_epochs=1", "client.batch_size=16"]


def in_process_metrics(tmp_path, *overrides: str) -> dict:
    with initialize_config_dir(config_dir=find_conf(), version_base="1.3"):
        cfg = compose("config", overrides=[*RUN, f"paths.cache_dir={tmp_path}", *overrides])
    exp = Experiment(cfg, tmp_path)
    orch = exp.orchestrator()
    metrics = orch.run()
    if cfg.client_store.max_bytes:  # the budget held and states went to disk and back
        assert exp.store.num_spilled > 0 and exp.store.resident_bytes <= 10 * 1024
    return metrics


@pytest.mark.experiment
def test_vectorized_with_spilling_store_matches_sequential(tmp_path):
    # FedRep heads (8 kB each) under a 10 kB budget: one head in memory, the others on disk
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        spilled = in_process_metrics(
            tmp_path / "a", "executor=vectorized", "client_store.max_bytes=10KB"
        )
        expected = in_process_metrics(tmp_path / "b", "executor=sequential")
    finally:
        torch.set_num_threads(threads)
    for key, value in expected.items():
        if key.startswith(("eval/", "train/")):
            assert spilled[key] == pytest.approx(value, abs=1e-5), key


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
