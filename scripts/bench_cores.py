"""`python scripts/bench.py --workload cores`: one process (`executor=sequential`) against
`executor=auto` on the cores this machine gives, and Flower's simulation engine where
`flwr[simulation]` is installed (an optional dev extra: `pip install -e .[flower]`, or
`FLOWER_SITE=<dir>` for a copy installed with `pip install --target <dir> 'flwr[simulation]'`).

Two workloads of the issue that asked for it: MNIST-1D, the MLP 200-200, 100 clients on a
Dirichlet split, 20 clients a round x 2 local epochs and 40 clients a round x 5. Each fedexp run
is a `python -m fedexp` process; its mean round time is `summary.json`'s `timing.round_s_mean`
(local training and aggregation, no evaluation), with the median of the rounds after the
first beside it (the first holds one-time costs); its memory, in one more run of each setting
whose times are not used (reading a process's PSS stalls it), the peak over the run of the
proportional set size (PSS: shared pages counted once) of its processes summed. Each rep runs
the settings back to back — one process, `auto`, `torchrun ... executor=distributed` on the same
cores, and as many one-process runs at once as there are cores, each told its share
(OMP_NUM_THREADS, as a parallel sweep's jobs are; the machine's own ceiling: what C busy cores
give over one) — and a speed-up is the median over the reps of the ratio within a
rep, with its range (this machine's speed drifts over minutes; the two runs of a ratio are
seconds apart), the ratio of the medians beside it. Flower's runs come after fedexp's (Ray's
processes outlive a run for a while).
Flower's runs train the same model on the same clients' data with the same local SGD (batch,
lr, epochs), its `FedAvg` strategy sampling the same number of clients a round, one CPU per
virtual client; their mean round time is each round's time from its configuration to its
aggregation (Ray's start-up left out, as fedexp's is).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 12
WORKLOADS = {  # name: (clients a round, local epochs)
    "20x2": (20, 2),
    "40x5": (40, 5),
}
COMMON = [
    "dataset=mnist1d",
    "model=mlp",
    "num_clients=100",
    "partition=dirichlet",
    f"rounds={ROUNDS}",
    f"eval_every={ROUNDS}",
    "checkpoint_every=0",
    "progress=false",
]


def pss_kb(pid: int) -> int:
    """The process's proportional set size (kB), 0 once it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def tree(pid: int) -> list[int]:
    """The process and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            kids = []
        todo.extend(int(k) for k in kids)
    return out


def run_fedexp(
    workload: str, executor: str, cache: str, watch: bool = False, share: int | None = None
) -> dict:
    """One `python -m fedexp` run: its mean round time, processes and, `watch`ed, its peak PSS
    (MB; reading a process's PSS stalls it, so a watched run's times are not used). `share`: the
    cores it is told are its own (OMP_NUM_THREADS, as a parallel sweep's launcher sets it)."""
    per_round, epochs = WORKLOADS[workload]
    run_dir = tempfile.mkdtemp(prefix=f"cores-{workload}-{executor}-")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(FEDEXP_CACHE_DIR=cache, WANDB_MODE="disabled")
    if share is not None:
        env["OMP_NUM_THREADS"] = str(share)
    args = [
        sys.executable, "-m", "fedexp", *COMMON, f"clients_per_round={per_round}",
        f"client.local_epochs={epochs}", f"executor={executor}", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL)
    peak = 0
    while proc.poll() is None:
        if watch:
            peak = max(peak, sum(pss_kb(p) for p in tree(proc.pid)))
        time.sleep(0.05)
    if proc.returncode:
        raise RuntimeError(f"fedexp {workload} {executor}: exit {proc.returncode}")
    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    rows = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    later = [json.loads(row)["time/round_s"] for row in rows[1:]]
    return {
        "round_s": summary["timing"]["round_s_mean"],
        # after the first round, whose one-time costs (the workers' and torch's first steps)
        # a longer run spreads thinner
        "later_round_s": statistics.median(later),
        "processes": summary["metrics"].get("runtime/processes", 1),
        "peak_pss_mb": peak / 1024,
        "metrics": {k: v for k, v in summary["metrics"].items() if k.startswith("eval/")},
    }


def flower_path() -> None:
    """`FLOWER_SITE`: a directory Flower was installed into (`pip install --target DIR
    'flwr[simulation]'`), searched after this environment's packages."""
    extra = os.environ.get("FLOWER_SITE")
    if extra and extra not in sys.path:
        sys.path.append(extra)


def flower_available() -> bool:
    flower_path()
    try:
        import flwr  # noqa: F401
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def run_flower(workload: str, cache: str) -> dict:
    """Flower's simulation engine on the same clients, model and local work (see the module
    docstring); its mean round time."""
    code = FLOWER.format(workload=workload, rounds=ROUNDS, cache=cache)
    path = [str(REPO / "src"), *filter(None, [os.environ.get("FLOWER_SITE")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), FEDEXP_CACHE_DIR=cache)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
    )
    if out.returncode:
        raise RuntimeError(f"flower {workload}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# a Flower simulation of the workload, run in a process of its own; the clients' data is the
# fedexp run's own split (built by fedexp from the same config)
FLOWER = """
import os, sys
if os.environ.get("FLOWER_SITE"):
    sys.path.append(os.environ["FLOWER_SITE"])
import json, time, torch
from hydra import compose, initialize_config_dir
import flwr as fl
from flwr.common import ndarrays_to_parameters
from fedexp.config.build import find_conf
from fedexp.run import Experiment
per_round, epochs = {{"20x2": (20, 2), "40x5": (40, 5)}}["{workload}"]
with initialize_config_dir(config_dir=find_conf(), version_base="1.3"):
    cfg = compose("config", overrides=["dataset=mnist1d", "model=mlp", "num_clients=100",
        "partition=dirichlet", "paths.cache_dir={cache}", f"clients_per_round={{per_round}}",
        f"client.local_epochs={{epochs}}"])
exp = Experiment(cfg, "/tmp/flower-bench")
client_cfg, data, factory = exp.client, exp.data, exp.algorithm.ctx.model_factory

class Client(fl.client.NumPyClient):
    def __init__(self, cid):
        self.cid = int(cid)
        self.model = factory()
    def fit(self, parameters, config):
        torch.set_num_threads(1)
        for p, v in zip(self.model.parameters(), parameters):
            p.data = torch.as_tensor(v).clone()
        x, y = data.train(self.cid)
        opt = torch.optim.SGD(self.model.parameters(), lr=client_cfg.lr)
        g = torch.Generator().manual_seed(self.cid)
        for _ in range(epochs):
            order = torch.randperm(len(y), generator=g)
            for s in range(0, len(y), client_cfg.batch_size):
                idx = order[s:s + client_cfg.batch_size]
                loss = torch.nn.functional.cross_entropy(self.model(x[idx]), y[idx])
                opt.zero_grad(); loss.backward(); opt.step()
        return [p.detach().numpy() for p in self.model.parameters()], len(y), {{}}

class Timed(fl.server.strategy.FedAvg):
    # FedAvg that times each round from its configuration to its aggregation
    rounds = []
    def configure_fit(self, server_round, parameters, client_manager):
        self.start = time.perf_counter()
        return super().configure_fit(server_round, parameters, client_manager)
    def aggregate_fit(self, server_round, results, failures):
        out = super().aggregate_fit(server_round, results, failures)
        self.rounds.append(time.perf_counter() - self.start)
        return out

init = [p.detach().numpy() for p in factory().parameters()]
strategy = Timed(fraction_fit=per_round / data.num_clients,
    min_fit_clients=per_round, fraction_evaluate=0.0, min_evaluate_clients=0,
    min_available_clients=data.num_clients, initial_parameters=ndarrays_to_parameters(init))
fl.simulation.start_simulation(client_fn=lambda cid: Client(cid).to_client(),
    num_clients=data.num_clients, config=fl.server.ServerConfig(num_rounds={rounds}),
    strategy=strategy, client_resources={{"num_cpus": 1}})
print(json.dumps({{"round_s": sum(Timed.rounds) / len(Timed.rounds)}}))
"""


def run_torchrun(workload: str, cache: str, processes: int) -> dict:
    """The same workload under `torchrun --nproc_per_node <processes> ... executor=distributed`
    (the sharded path the pool replaced as the default): its mean round time."""
    per_round, epochs = WORKLOADS[workload]
    run_dir = tempfile.mkdtemp(prefix=f"cores-{workload}-torchrun-")
    env = dict(os.environ, FEDEXP_CACHE_DIR=cache, WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    args = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={processes}", "-m", "fedexp", *COMMON,
        f"clients_per_round={per_round}", f"client.local_epochs={epochs}",
        "executor=distributed", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    subprocess.run(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, check=True)
    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    return {"round_s": summary["timing"]["round_s_mean"]}


def run_side_by_side(workload: str, cache: str, processes: int) -> float:
    """`processes` one-process runs at once, each on the whole workload: the machine's own
    ceiling for that many busy cores (two busy vCPUs may each run slower than one alone). The
    throughput, in rounds a second, of all of them together. Each is told its share of the
    cores, as a parallel sweep's jobs are: none sees a spare core, so none draws its partition
    plot while its rounds run (as `auto`, filling the cores, does not)."""
    from fedexp.runtime.threads import available_cores

    share = max(available_cores() // processes, 1)

    def one(_) -> dict:
        return run_fedexp(workload, "sequential", cache, share=share)

    with ThreadPoolExecutor(processes) as pool:
        runs = list(pool.map(one, range(processes)))
    return sum(1 / r["round_s"] for r in runs)


def bench_cores(reps: int = 5, json_path: Path | None = None) -> list[dict]:
    """Each rep runs, back to back: one process, auto, torchrun on the same cores, and as many
    one-process runs at once as there are cores; a speed-up is the median over the reps of the
    ratio within a rep (the machine's speed drifts over minutes: the two runs of a ratio are
    seconds apart), with its range; the medians of the round times beside it."""
    from fedexp.runtime.threads import available_cores

    cores = available_cores()
    flower = flower_available()
    missing = "not installed (pip install 'flwr[simulation]')"
    print(f"{cores} cores; Flower {'installed' if flower else missing}; {reps} reps")
    results = []
    with tempfile.TemporaryDirectory() as cache:
        run_fedexp("20x2", "sequential", cache)  # untimed: the dataset's cache is written
        for workload in WORKLOADS:
            runs: dict[str, list] = {k: [] for k in ("sequential", "auto", "torchrun", "flower")}
            ceiling = []
            for _ in range(reps):
                for executor in ("sequential", "auto"):
                    runs[executor].append(run_fedexp(workload, executor, cache))
                runs["torchrun"].append(run_torchrun(workload, cache, cores))
                ceiling.append(run_side_by_side(workload, cache, cores))
            watched = {
                e: run_fedexp(workload, e, cache, watch=True) for e in ("sequential", "auto")
            }
            for _ in range(reps if flower else 0):  # after fedexp's: Ray's processes linger
                runs["flower"].append(run_flower(workload, cache))
            results.append(summarise(workload, cores, runs, ceiling, watched))
    if json_path is not None:
        json_path.write_text(json.dumps(results, indent=2))
    return results


def paired(num: list[dict], den: list[dict], key: str = "round_s") -> dict:
    """The ratios num/den rep by rep: their median, smallest and largest."""
    ratios = [a[key] / b[key] for a, b in zip(num, den, strict=True)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def summarise(workload: str, cores: int, runs: dict, ceiling: list[float], watched: dict) -> dict:
    seq, auto = runs["sequential"], runs["auto"]
    med = {k: statistics.median(r["round_s"] for r in v) for k, v in runs.items() if v}
    speedup = paired(seq, auto)
    ceilings = [c * r["round_s"] for c, r in zip(ceiling, seq, strict=True)]  # x one process
    pss = {k: r["peak_pss_mb"] for k, r in watched.items()}
    row = {
        "workload": workload,
        "cores": cores,
        "processes": auto[0]["processes"],
        "reps": len(seq),
        "round_s": med,
        "speedup": speedup,
        "speedup_of_medians": med["sequential"] / med["auto"],
        "later_speedup": paired(seq, auto, "later_round_s"),
        "torchrun_speedup": paired(seq, runs["torchrun"]),
        "machine_ceiling": statistics.median(ceilings),
        "share_of_ceiling": statistics.median(
            [
                s / c
                for s, c in zip([a["round_s"] / b["round_s"] for a, b in zip(seq, auto)], ceilings)
            ]
        ),
        "peak_pss_mb": pss,
        "memory_ratio": pss["auto"] / pss["sequential"],
        "identical_metrics": all(r["metrics"] == seq[0]["metrics"] for r in seq + auto),
    }
    if "flower" in med:
        row["flower_over_auto"] = med["flower"] / med["auto"]
    flower_text = (
        f"; Flower {med['flower']:.3f} s ({row['flower_over_auto']:.2f}x auto's)"
        if "flower" in med
        else ""
    )
    s, t, later = speedup, row["torchrun_speedup"], row["later_speedup"]
    # the speed-ups to three decimals: 1.896x printed as 1.90x would read as a 1.9x target met
    print(
        f"{workload}: one process {med['sequential']:.3f} s/round, auto ({row['processes']} "
        f"processes) {med['auto']:.3f} s/round: {s['median']:.3f}x (median of {row['reps']} "
        f"paired runs, {s['min']:.2f}-{s['max']:.2f}; ratio of the medians "
        f"{row['speedup_of_medians']:.3f}x; rounds after the first {later['median']:.3f}x); "
        f"torchrun {med['torchrun']:.3f} s/round ({t['median']:.2f}x, {t['min']:.2f}-"
        f"{t['max']:.2f}); {cores} one-process runs at once: {row['machine_ceiling']:.2f}x one's "
        f"throughput, auto {row['share_of_ceiling']:.0%} of it; peak PSS "
        f"{pss['sequential']:.0f} MB -> {pss['auto']:.0f} MB ({row['memory_ratio']:.2f}x); "
        f"identical metrics: {row['identical_metrics']}{flower_text}"
    )
    return row
