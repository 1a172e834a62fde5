"""`python scripts/bench.py --workload startup`: how long fedexp takes to answer and to start
training, as ratios to importing torch measured in the same run on the same machine.

Each command runs in a fresh interpreter; the repetitions are interleaved (every command once,
then again) and the median wall time is reported. Targets:

- `--help`, `--cfg job`, a TAB completion and a config error: <= 0.5x `python -c "import torch"`
  (they import no torch at all);
- the default run's first round (the progress line printed when round 1 starts, after Hydra,
  the data, the partition, the model and the loggers): <= 1.2x `python -c "import torch"` (a run
  imports torch and Hydra, nothing else that costs seconds).

The default run is timed to its first round's line (round 5 with the default `eval_every=5`:
five rounds of training and an evaluation included) and to its exit, and `debug=smoke` (2 rounds
of 3 clients) to its exit, for information.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
# name -> (argv, extra environment); `fedexp` commands run with the repo's src first on the path
COMMANDS = {
    "import torch": ([PY, "-c", "import torch"], {}),
    "--help": ([PY, "-m", "fedexp", "--help"], {}),
    "--cfg job": ([PY, "-m", "fedexp", "--cfg", "job"], {}),
    "tab completion": (
        [PY, "-m", "fedexp", "-sc", "query=bash"],
        {"COMP_LINE": "fedexp algorithm=fed", "COMP_POINT": "20"},
    ),
    "config error": ([PY, "-m", "fedexp", "rounds=0"], {}),
    "debug=smoke run, whole": ([PY, "-m", "fedexp", "debug=smoke"], {}),
}
# name -> (the reference it is divided by, the largest ratio that meets the target)
TARGETS = {
    "--help": ("import torch", 0.5),
    "--cfg job": ("import torch", 0.5),
    "tab completion": ("import torch", 0.5),
    "config error": ("import torch", 0.5),
    "default run, first round": ("import torch", 1.2),
}


def environment(extra: dict[str, str], cwd: Path) -> dict[str, str]:
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("FEDEXP_CACHE_DIR", str(cwd / "cache"))
    return env


def time_command(argv: list[str], extra: dict[str, str], cwd: Path) -> float:
    """Wall seconds of one run of `argv` (its output discarded)."""
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=environment(extra, cwd), capture_output=True, timeout=600)
    return time.perf_counter() - start


def time_default_run(cwd: Path, rep: int) -> tuple[float, float, float]:
    """Seconds to the first round (the progress line printed when round 1 starts), to the first
    round's own line and to the exit of the default `python -m fedexp`, stdout a pipe."""
    argv = [PY, "-m", "fedexp", f"hydra.run.dir={cwd}/run{rep}"]
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=environment({}, cwd), stdout=subprocess.PIPE, text=True
    )
    first = round_line = None
    try:
        for line in proc.stdout:
            if first is None and " rounds, objective " in line:
                first = time.perf_counter() - start
            if round_line is None and line.startswith("round "):
                round_line = time.perf_counter() - start
        code = proc.wait()
        if code != 0 or first is None or round_line is None:
            raise RuntimeError(f"the default run printed no round line (exit {code})")
        return first, round_line, time.perf_counter() - start
    finally:
        proc.kill()
        proc.wait()


def bench_startup(reps: int = 5, json_path: Path | None = None) -> list[dict]:
    """Median times and ratios; prints a table and returns one dict per measurement."""
    times: dict[str, list[float]] = {name: [] for name in [*COMMANDS, *TARGETS]}
    times["default run, round 5's line"] = []
    times["default run, whole"] = []
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        time_default_run(cwd, -1)  # warm-up: the data and the partition cache are built once
        for rep in range(reps):
            for name, (argv, extra) in COMMANDS.items():
                times[name].append(time_command(argv, extra, cwd))
            first, round_line, whole = time_default_run(cwd, rep)
            times["default run, first round"].append(first)
            times["default run, round 5's line"].append(round_line)
            times["default run, whole"].append(whole)
    median = {name: statistics.median(values) for name, values in times.items()}
    results = []
    print(f"start-up, median of {reps} interleaved runs each (python {sys.version.split()[0]})")
    print(f"{'command':<28} {'median s':>9} {'ratio':>7}  target")
    for name, seconds in median.items():
        row = {"command": name, "median_s": seconds, "runs_s": times[name]}
        line = f"{name:<28} {seconds:9.2f}"
        if name in TARGETS:
            ref, limit = TARGETS[name]
            ratio = seconds / median[ref]
            row.update(reference=ref, ratio=ratio, target=limit, met=ratio <= limit)
            verdict = "met" if ratio <= limit else "NOT met"
            line += f" {ratio:7.2f}  <= {limit} x {ref}: {verdict}"
        print(line)
        results.append(row)
    if json_path is not None:
        json_path.write_text(json.dumps(results, indent=2))
    return results
