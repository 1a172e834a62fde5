"""`python scripts/bench.py --workload threads`: fedexp's `threads: auto` against every fixed
thread count, on an idle machine and under a background load the benchmark starts and stops.

Each of three workloads (the digits MLP, LeNet-5 and the pfl-CIFAR10 CNN, at CPU size) is built
once per setting (auto, 1, ..., the cores this process may use); the timed runs are interleaved
(auto, 1, 2, ..., auto, 1, 2, ...) and the median is reported, with auto / the best fixed count.
The load is one busy process per core, each ending by itself after `LOAD_SECONDS` at most and
killed as soon as the loaded measurements end.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from bench_workloads import WORKLOADS, fedexp_config, run_fedexp
from fedexp.run import Experiment
from fedexp.runtime.threads import available_cores

LOAD_SECONDS = 900
# rounds per workload: a few seconds a run with one thread on 2 cores
ROUNDS = {"digits": 5, "lenet5": 1, "pfl-cifar10": 1}
BUSY = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


def start_load(processes: int, seconds: int = LOAD_SECONDS) -> list[subprocess.Popen]:
    code = BUSY.format(seconds=seconds)
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(processes)]


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def time_settings(name: str, settings: list, reps: int, cache: str) -> dict:
    w = WORKLOADS[name]["cpu"]
    w = replace(w, rounds=ROUNDS[name], eval_every=ROUNDS[name])
    exps = {}
    for s in settings:
        exps[s] = Experiment(fedexp_config(w, "sequential", "cpu", cache, s), tempfile.mkdtemp())
    times: dict = {s: [] for s in settings}
    for rep in range(reps + 1):  # the first pass is an untimed warm-up
        for s, exp in exps.items():
            torch.set_num_threads(exp.threads)
            seconds, _, _ = run_fedexp(exp)
            if rep:
                times[s].append(seconds)
    med = {str(s): statistics.median(v) for s, v in times.items()}
    fixed = {k: v for k, v in med.items() if k != "auto"}
    best = min(fixed, key=fixed.get)
    return {
        "workload": name,
        "auto_threads": exps["auto"].threads,
        "median_s": med,
        "best_fixed": int(best),
        "auto_over_best": med["auto"] / fixed[best],
    }


def bench_threads(reps: int = 3, json_path: Path | None = None) -> list[dict]:
    cores = available_cores()
    settings = ["auto", *range(1, cores + 1)]
    print(f"torch {torch.__version__}, {cores} cores available, settings {settings}")
    results = []
    with tempfile.TemporaryDirectory() as cache:
        for condition in ("idle", "loaded"):
            procs = start_load(cores) if condition == "loaded" else []
            try:
                for name in ROUNDS:
                    r = time_settings(name, settings, reps, cache)
                    r["condition"] = condition
                    results.append(r)
                    cells = "  ".join(f"{k}: {v:.3f}s" for k, v in r["median_s"].items())
                    print(
                        f"{condition:<7}{name:<12} auto={r['auto_threads']} thread(s)  {cells}  "
                        f"auto / best ({r['best_fixed']}) = {r['auto_over_best']:.2f}",
                        flush=True,
                    )
            finally:
                stop_load(procs)
    if json_path is not None:
        json_path.write_text(json.dumps(results, indent=2))
    return results
