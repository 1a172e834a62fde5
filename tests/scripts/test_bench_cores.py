"""scripts/bench_cores.py's figures: speed-ups are ratios within a rep, medians over the reps."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from tests.conftest import REPO


@pytest.fixture(scope="module")
def bench_cores():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        spec = importlib.util.spec_from_file_location(
            "bench_cores", REPO / "scripts/bench_cores.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return module


def run(round_s: float, later: float | None = None, acc: float = 0.5) -> dict:
    return {
        "round_s": round_s,
        "later_round_s": later if later is not None else round_s,
        "processes": 2,
        "peak_pss_mb": 0.0,
        "metrics": {"eval/global/acc": acc},
    }


def test_a_speed_up_is_the_median_of_the_ratios_within_each_rep(bench_cores):
    seq = [run(1.0), run(2.0), run(3.0)]
    auto = [run(0.5), run(1.25), run(1.0)]
    # ratios 2.0, 1.6, 3.0; the ratio of the medians would be 2.0 / 1.0 = 2.0 only by chance
    assert bench_cores.paired(seq, auto) == {"median": 2.0, "min": 1.6, "max": 3.0}
    drifting = [run(1.0), run(4.0), run(4.0)]  # the machine slowed down between reps
    assert bench_cores.paired(drifting, [run(0.5), run(2.0), run(2.5)])["median"] == 2.0


def test_the_summary_holds_the_ceiling_and_auto_s_share_of_it(bench_cores, capsys):
    seq, auto, torchrun = [run(1.0), run(2.0)], [run(0.5), run(1.0)], [run(0.8), run(1.6)]
    runs = {"sequential": seq, "auto": auto, "torchrun": torchrun, "flower": []}
    # two one-process runs at once: 1.6 and 3.2 rounds a second = 1.6 x one process's
    ceiling = [1.6, 0.8]
    watched = {"sequential": {"peak_pss_mb": 100.0}, "auto": {"peak_pss_mb": 120.0}}
    row = bench_cores.summarise("20x2", 2, runs, ceiling, watched)
    assert row["speedup"]["median"] == 2.0 and row["torchrun_speedup"]["median"] == 1.25
    assert row["machine_ceiling"] == pytest.approx(1.6)
    assert row["share_of_ceiling"] == pytest.approx(2.0 / 1.6)
    assert row["memory_ratio"] == pytest.approx(1.2) and row["identical_metrics"]
    assert "2.000x (median of 2 paired runs" in capsys.readouterr().out
    auto[1]["metrics"] = {"eval/global/acc": 0.4}  # a run whose results differ is flagged
    assert not bench_cores.summarise("20x2", 2, runs, ceiling, watched)["identical_metrics"]


def test_the_runs_side_by_side_are_each_told_their_share_of_the_cores(bench_cores, monkeypatch):
    from fedexp.runtime import threads

    told = []

    def fake(workload, executor, cache, watch=False, share=None):
        told.append((executor, share))
        return {"round_s": 0.5}

    monkeypatch.setattr(bench_cores, "run_fedexp", fake)
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    assert bench_cores.run_side_by_side("20x2", "cache", 2) == 4.0  # 2 runs x 2 rounds a second
    assert told == [("sequential", 1), ("sequential", 1)]
