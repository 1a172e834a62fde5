"""torchrun with 2 CPU processes (gloo) gives the metrics of one process; only rank 0 writes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir
from tests.conftest import REPO, summaries

from fedexp.__main__ import find_conf
from fedexp.run import Experiment

pytestmark = pytest.mark.experiment

# FedRep: heads trained on one rank must reach the others through the round's all-gather
RUN = [
    "debug=smoke",
    "algorithm=fedrep",
    "algorithm.head_epochs=1",
    "partition=dirichlet",
    "partition.min_size=5",
    "num_clients=6",
    "clients_per_round=4",
    "client.batch_size=16",
]


def one_process_metrics(tmp_path) -> dict:
    with initialize_config_dir(config_dir=find_conf(), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[*RUN, "executor=sequential", f"paths.cache_dir={tmp_path / 'cache1'}"],
        )
    exp = Experiment(cfg, tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        orch = exp.orchestrator()
        return orch.run()
    finally:
        torch.set_num_threads(threads)


def test_two_gloo_ranks_match_one_process(tmp_path):
    # Prepare
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        TMPDIR=str(scratch),
        WANDB_MODE="offline",
        FEDEXP_CACHE_DIR=str(tmp_path / "cache"),
        FEDEXP_DATA_DIR=str(tmp_path / "data"),
        PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "fedexp",
        *RUN,
        "executor=distributed",
        "executor.inner=sequential",
    ]
    # Execute
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = one_process_metrics(tmp_path)
    # Assert: one run dir (rank 0's), rank 1's scratch removed, same metrics
    (summary,) = summaries(tmp_path / "outputs")
    assert proc.stdout.count("run dir:") == 1
    assert not list(scratch.glob("fedexp-rank*"))
    for key, value in summary["metrics"].items():
        if key.startswith(("eval/", "train/", "comm/")):
            assert value == pytest.approx(expected[key], abs=1e-6), key
