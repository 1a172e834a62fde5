"""`python scripts/bench.py --workload dispatch`: torch operations the host issues per round, as
the cohort grows, for every algorithm that vectorizes.

The pfl-CIFAR10 CPU workload shrunk to 20 samples a client (two batches of 10, one local epoch,
100 clients): for each algorithm, executor and cohort size, one round runs unmeasured, then
`ROUNDS` rounds (`Orchestrator.run_round`: configure, local training, attack, aggregation; no
evaluation) run under torch's profiler. A top-level operation is a profiler event with no parent:
one call the host makes into torch (an operator, or the autograd engine's work for one
`backward`). Per extra client is the least-squares slope over the cohort sizes: the host work
that grows with the cohort. The vectorized executor runs its `vmap` form (`executor.stack=vmap`,
its form on CUDA, where a round is host-bound); on a CPU its `auto` form is `loop`, whose host
work grows with the cohort as the sequential executor's does.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
from omegaconf import open_dict
from torch.profiler import ProfilerActivity, profile

from bench_workloads import WORKLOADS, fedexp_config
from fedexp.core.types import ConfigError
from fedexp.run import Experiment

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # the profiler's start/stop lines, silenced

COHORTS = (10, 20, 40)
ROUNDS = 2
# FedAvg's family and the three papers' methods first; the rest of the algorithms that vectorize
ALGORITHMS = (
    "fedavg",
    "fedprox",
    "fedrep",
    "scaffold",
    "frl",
    "waffle",
    "fedper",
    "ditto",
    "fedopt",
    "qffl",
    "signsgd",
    "topk",
    "supermask_fedavg",
    "dp_fedavg",
    "fedhenn",
    "fedproto",
    "local",
)
TARGETS = ("fedavg", "fedprox", "fedrep", "scaffold", "frl", "waffle")
# FedRep with one local epoch would leave the heads none: one epoch of head, one of body
EXTRA = {"fedrep": ["algorithm.head_epochs=1"]}


def workload():
    w = WORKLOADS["pfl-cifar10"]["cpu"]
    return replace(w, samples_per_client=20, rounds=1 + ROUNDS, eval_every=1000)


def experiment(algorithm: str, executor: str, cohort: int, cache: str) -> Experiment:
    w = replace(workload(), clients_per_round=cohort)
    extra = [f"algorithm={algorithm}", "client.local_epochs=1", "client.batch_size=10"]
    extra += EXTRA.get(algorithm, [])
    if executor == "vectorized":  # the form a GPU runs (auto's choice on CUDA), counted here
        extra.append("executor.stack=vmap")
    cfg = fedexp_config(w, executor, "cpu", cache, threads=1, extra=extra)
    with open_dict(cfg):
        cfg.eval.personal_clients = 1
    return Experiment(cfg, tempfile.mkdtemp())


def top_level_ops(exp: Experiment) -> float:
    """Top-level profiler events per round over `ROUNDS` rounds after one unmeasured round."""
    orch = exp.orchestrator()
    state = exp.algorithm.init_state()
    state, _ = orch.run_round(state, 1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for t in range(2, 2 + ROUNDS):
            state, _ = orch.run_round(state, t)
    return sum(e.cpu_parent is None for e in prof.events()) / ROUNDS


def slope(xs, ys) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def bench_dispatch(
    algorithms=ALGORITHMS, executors=("vectorized", "sequential"), json_path: Path | None = None
) -> list[dict]:
    torch.set_num_threads(1)
    rows = []
    print(f"top-level torch ops per round (pfl CNN, 20 samples a client, {ROUNDS} rounds)")
    print(
        f"{'algorithm':<18}{'executor':<12}" + "".join(f"{c:>8}" for c in COHORTS) + "  per extra"
    )
    with tempfile.TemporaryDirectory() as cache:
        for algorithm in algorithms:
            for executor in executors:
                try:
                    ops = [
                        top_level_ops(experiment(algorithm, executor, c, cache)) for c in COHORTS
                    ]
                except ConfigError as err:
                    print(f"{algorithm:<18}{executor:<12}  not run: {err}")
                    continue
                per = slope(COHORTS, ops)
                rows.append(
                    {"algorithm": algorithm, "executor": executor, "ops": ops, "per_client": per}
                )
                print(
                    f"{algorithm:<18}{executor:<12}"
                    + "".join(f"{o:>8.0f}" for o in ops)
                    + f"{per:>11.1f}",
                    flush=True,
                )
    if json_path is not None:
        json_path.write_text(json.dumps(rows, indent=2))
    return rows
