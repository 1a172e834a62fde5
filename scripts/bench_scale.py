"""`python scripts/bench.py --workload scale`: fedexp's cost against the population size.

FedAvg and FedRep on `dataset=synthetic` (FedProx's Synthetic(1, 1), one natural client per
generating model), 100 clients per round, one round, one thread, at 1 000, 10 000 and 100 000
clients (`--clients` picks others). FedRep trains 5 head epochs and 1 body epoch
(`algorithm.head_epochs=5`: the workload docs/BENCHMARKS.md's table was measured with). Each
(algorithm, population) runs in its own process, so its peak resident memory is its own.
Reported per run:

- setup: building the experiment (data generation, partition, index tables, model, algorithm)
  plus the partition statistics (CSV and plot), as the CLI does before the first round;
- round: the one round's local training and aggregation (evaluation excluded);
- eval: the round's evaluation (global and personal models on every client's local split);
- peak RSS of the process, the training data it holds (float32 features + labels), and the
  bytes per client beyond the data: (peak - RSS before setup - data) / clients.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POPULATIONS = (1000, 10000, 100000)
ALGORITHMS = ("fedavg", "fedrep")
OWN = {"fedrep": ["algorithm.head_epochs=5"]}  # a fixed local workload, whatever the default


def rss_bytes() -> int:
    """The process's current resident set size."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_bytes() -> int:
    """The process's peak resident set size so far (Linux reports kB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def scale_config(clients: int, algorithm: str, cache: str):
    """The run's config, composed by Hydra from conf/ as the CLI composes it."""
    from hydra import compose, initialize_config_dir

    from fedexp.config.build import find_conf

    overrides = [
        "threads=1",
        "dataset=synthetic",
        f"algorithm={algorithm}",
        *OWN.get(algorithm, []),
        "executor=sequential",
        f"num_clients={clients}",
        f"clients_per_round={min(100, clients)}",
        "rounds=1",
        "eval_every=1",
        "progress=false",
        f"paths.cache_dir={cache}",
    ]
    with initialize_config_dir(config_dir=find_conf(), version_base="1.3"):
        return compose("config", overrides=overrides)


def measure_one(clients: int, algorithm: str, cache: str, run_dir: str) -> dict:
    """One run in this process: setup, one round, its evaluation; times and memory."""
    import torch

    import fedexp.engine.orchestrator as orchestrator_module
    from fedexp.data.partition_report import write_partition_stats
    from fedexp.run import Experiment

    torch.set_num_threads(1)
    cfg = scale_config(clients, algorithm, cache)
    base = rss_bytes()
    start = time.perf_counter()
    exp = Experiment(cfg, run_dir)
    built = time.perf_counter()
    write_partition_stats(exp.data, run_dir, "scale")
    setup = time.perf_counter() - start
    stats = setup - (built - start)

    evaluated = [0.0]
    evaluate = orchestrator_module.evaluate

    def timed_evaluate(*args, **kwargs):
        t0 = time.perf_counter()
        out = evaluate(*args, **kwargs)
        evaluated[0] += time.perf_counter() - t0
        return out

    orchestrator_module.evaluate = timed_evaluate
    orch = exp.orchestrator()
    start = time.perf_counter()
    last = orch.run()
    total = time.perf_counter() - start
    ds = exp.data.dataset
    data_bytes = ds.train_x.nbytes + ds.train_y.nbytes
    peak = peak_bytes()
    return {
        "clients": clients,
        "algorithm": algorithm,
        "samples": len(ds.train_y),
        "setup_s": setup,
        "stats_s": stats,
        "round_s": total - evaluated[0],
        "eval_s": evaluated[0],
        "peak_bytes": peak,
        "base_bytes": base,
        "data_bytes": data_bytes,
        "bytes_per_client": (peak - base - data_bytes) / clients,
        "personal_acc_mean": last.get("eval/personal/acc_mean"),
        "global_acc": last.get("eval/global/acc"),
    }


def run_child(clients: int, algorithm: str) -> dict:
    """`measure_one` in a fresh process (its own peak memory); returns its JSON line."""
    here = Path(__file__).resolve().parent
    # the checkout's own src first, as the parent process sees it with PYTHONPATH=src
    path = os.pathsep.join(p for p in (str(here.parent / "src"), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline", PYTHONPATH=path)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, str(here / "bench_scale.py"), str(clients), algorithm, tmp]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{algorithm} at {clients} clients failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(r: dict) -> None:
    gb = 1024**3
    print(
        f"{r['algorithm']:<8}{r['clients']:>8}{r['samples']:>11}{r['setup_s']:>9.2f}"
        f"{r['stats_s']:>8.2f}{r['round_s']:>9.2f}{r['eval_s']:>9.2f}"
        f"{r['peak_bytes'] / gb:>9.2f}{r['data_bytes'] / gb:>9.2f}"
        f"{r['bytes_per_client']:>11.0f}",
        flush=True,
    )


def bench_scale(
    populations: tuple[int, ...] = POPULATIONS,
    algorithms: tuple[str, ...] = ALGORITHMS,
    json_path: Path | None = None,
) -> list[dict]:
    print(
        f"{'algo':<8}{'clients':>8}{'samples':>11}{'setup s':>9}{'stats s':>8}{'round s':>9}"
        f"{'eval s':>9}{'peak GB':>9}{'data GB':>9}{'B/client':>11}"
    )
    results = []
    for clients in populations:
        for algorithm in algorithms:
            r = run_child(clients, algorithm)
            report(r)
            results.append(r)
    if json_path is not None:
        json_path.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    # the child: bench_scale.py CLIENTS ALGORITHM TMPDIR -> one JSON line
    n, algo, tmp = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    os.makedirs(f"{tmp}/run", exist_ok=True)
    print(json.dumps(measure_one(n, algo, f"{tmp}/cache", f"{tmp}/run")))
