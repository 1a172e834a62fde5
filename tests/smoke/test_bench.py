"""scripts/bench.py: fedexp and the plain loop do the same training (bit for bit), at tiny size."""

from __future__ import annotations

import importlib.util
import sys

import torch
from tests.conftest import REPO


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
    assert "fedexp sequential / plain" in capsys.readouterr().out
