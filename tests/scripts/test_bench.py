"""scripts/bench.py: fedexp and the plain loop do the same training (bit for bit), at tiny size."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from tests.conftest import REPO

# the script's command line, on whole benchmark workloads
pytestmark = pytest.mark.cli


def load_bench():
    spec = importlib.util.spec_from_file_location("bench", REPO / "scripts" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = module  # dataclasses and Hydra's `_target_` look it up by name
    spec.loader.exec_module(module)
    return module


def test_bench_digits_plain_loop_is_the_same_training(capsys):
    threads = torch.get_num_threads()
    try:
        (result,) = load_bench().main(
            ["--workload", "digits", "--rounds", "2", "--reps", "1", "--warmup", "0"]
        )
    finally:
        torch.set_num_threads(threads)
    assert result["max_abs_diff_vs_plain"]["sequential"] == 0.0
    assert result["client_steps"] > 0 and result["floor_s"] > 0
    # the same evaluation on both sides: test and validation splits, the same accuracies
    plain, fedexp = result["plain_eval"], result["final_eval"]
    assert "eval/val/global/acc" in plain and "eval/val/global/client_acc_mean" in plain
    for key, value in plain.items():
        assert fedexp[key] == pytest.approx(value, abs=1e-6), key
    assert "fedexp sequential / plain" in capsys.readouterr().out


@pytest.mark.slow  # a process per (algorithm, population): make test-full
def test_bench_scale_reports_every_population_and_algorithm(capsys):
    """`--workload scale` at tiny populations: one child process per run, its figures sane."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        results = load_bench().main(["--workload", "scale", "--clients", "8,16"])
    finally:
        sys.path.remove(str(REPO / "scripts"))
    assert [(r["clients"], r["algorithm"]) for r in results] == [
        (8, "fedavg"), (8, "fedrep"), (16, "fedavg"), (16, "fedrep")
    ]  # fmt: skip
    for r in results:
        assert r["samples"] >= 50 * r["clients"]  # Synthetic's clients hold >= 50 samples
        assert r["data_bytes"] == r["samples"] * (60 * 4 + 8)  # float32 features, int64 labels
        assert 0 < r["stats_s"] < r["setup_s"] and r["round_s"] > 0 and r["eval_s"] > 0
        assert r["peak_bytes"] > r["base_bytes"] > 0
    assert results[1]["personal_acc_mean"] is not None and results[0]["global_acc"] is not None
    assert "B/client" in capsys.readouterr().out
