"""The vectorized executor with a spilling client store gives the sequential executor's metrics."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir

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
