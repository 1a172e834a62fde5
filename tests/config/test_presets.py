"""Every `experiment=` preset runs end to end at smoke size through the real CLI.

Presets are found by listing conf/experiment, so a preset added later is covered without editing
this file. A preset whose dataset files are not on this machine is skipped with the loader's
message (point FEDEXP_DATA_DIR at a data dir to run those too).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))


def dataset_missing(stderr: str) -> bool:
    """The one-line ConfigError a loader raises when its files are not there."""
    line = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    return line.startswith("fedexp: error: dataset") and ("not found" in line or "missing" in line)


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_preset_runs_at_smoke_size(cli, preset):
    env = {"OMP_NUM_THREADS": "1"}
    if os.environ.get("FEDEXP_DATA_DIR"):  # real data, when the caller has it
        env["FEDEXP_DATA_DIR"] = os.environ["FEDEXP_DATA_DIR"]
    proc = cli(f"experiment={preset}", "debug=smoke", "hydra.run.dir=run", check=False, env=env)
    if proc.returncode == 2 and dataset_missing(proc.stderr):
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((cli.cwd / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 2
    assert summary["choices"]["experiment"] == preset
    if preset.startswith("frl_"):  # the clients' accuracies of FRL's Tables 2 and 4
        assert math.isfinite(summary["metrics"]["eval/global/client_acc_mean"])
