"""Benchmark fedexp against a plain PyTorch loop doing the same local training, and the floor.

    python scripts/bench.py                          # every workload at CPU scale (`make bench`)
    python scripts/bench.py --workload digits        # issue 2's fixed FedAvg workload
    python scripts/bench.py --workload pfl-cifar10 --full --device cuda \\
        --executors sequential,vectorized             # the full pfl-research workload on a GPU
    python scripts/bench.py --workload cores         # one process vs executor=auto on the cores
                                                     # (and Flower's simulation where installed)
    python scripts/bench.py --workload threads       # threads=auto vs every fixed thread count,
                                                     # idle and under a background load
    python scripts/bench.py --workload startup       # --help, --cfg job, completion, a config
                                                     # error, a run's first round vs torch
    python scripts/bench.py --workload dispatch      # torch ops the host issues per round as
                                                     # the cohort grows, per algorithm
    python scripts/bench.py --workload scale         # setup, round, evaluation and memory at
                                                     # 1 000, 10 000 and 100 000 clients

Each workload runs through fedexp's real path (config composed by Hydra, `Experiment` building
data, model, algorithm and executor, `Orchestrator` driving the rounds, evaluation only where the
workload says) and through `plain_fedavg` in the same process: the same cohorts, the same data
slices, the same shuffles and steps, plain SGD, the same final evaluation. Repetitions are
interleaved and the median is reported. The floor is the workload's training FLOPs divided by the
FLOP rate the same model reaches when trained at a large batch: no runner can beat it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from fedexp.core.seeding import CLIENT, derive_seed, sample_clients
from fedexp.run import Experiment

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the workloads' module, beside this script, wherever it is run from
    sys.path.insert(0, str(HERE))
from bench_workloads import WORKLOADS, Workload, fedexp_config, run_fedexp, sync  # noqa: E402


@torch.no_grad()
def plain_evaluate(model, data, local: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple:
    """The evaluation fedexp's runs do, written plainly: the pooled test accuracy, then for each
    local split (test, and validation where the clients have it) every client's accuracy and,
    for validation, the pooled one, from one pass over the split."""
    model.eval()

    def hits(x, y, idx=None):
        n = len(y) if idx is None else len(idx)
        out = []
        for i in range(0, n, 4096):
            rows = slice(i, i + 4096) if idx is None else idx[i : i + 4096]
            out.append(model(x[rows]).argmax(1) == y[rows])
        return torch.cat(out).float()

    pooled = float(hits(data.test_x, data.test_y).mean())
    per_split = []
    for idx, owner in local:
        h = hits(data.x, data.y, idx)
        per_client = torch.bincount(owner, weights=h) / torch.bincount(owner)
        per_split.append((float(h.mean()), float(per_client.mean())))
    model.train()
    return pooled, per_split


@torch.no_grad()
def copy_into(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy a flat vector into the parameters (`vector_to_parameters` would alias it)."""
    for p, chunk in zip(params, flat.split([p.numel() for p in params])):
        p.copy_(chunk.view_as(p))


def plain_fedavg(exp: Experiment, init: torch.Tensor) -> tuple[float, torch.Tensor, tuple]:
    """The same FedAvg written as a plain PyTorch loop; returns (seconds, final params, the last
    evaluation as `plain_evaluate` gives it)."""
    cfg, data, device = exp.cfg, exp.data, exp.device
    model = exp.algorithm.ctx.model_factory().to(device)
    params = list(model.parameters())
    weights = init.clone()
    x_all, y_all = data.x, data.y
    train_idx = [
        torch.as_tensor(data.partition.train[c], device=device) for c in range(cfg.num_clients)
    ]
    # each local split's flat indices and owners, as fedexp's evaluation reads them
    splits = ("test", "val") if data.has_val else ("test",)
    local = [(data.local_index(s)[0], data.owners(s)) for s in splits]
    epochs, batch, lr = cfg.client.local_epochs, cfg.client.batch_size, cfg.client.lr
    sync(device)
    start = time.perf_counter()
    for t in range(1, cfg.rounds + 1):
        ids = sample_clients(cfg.seed, t, cfg.num_clients, cfg.clients_per_round)
        deltas, sizes = [], []
        for cid in ids:
            copy_into(params, weights)
            opt = torch.optim.SGD(params, lr=lr)
            idx = train_idx[cid]
            x, y = x_all[idx], y_all[idx]
            gen = torch.Generator().manual_seed(derive_seed(cfg.seed, CLIENT, t, cid))
            for _ in range(epochs):
                order = torch.randperm(len(y), generator=gen).to(device)
                for s in range(0, len(y), batch):
                    b = order[s : s + batch]
                    loss = F.cross_entropy(model(x[b]), y[b])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            deltas.append(torch.nn.utils.parameters_to_vector(params).detach() - weights)
            sizes.append(float(len(y)))
        w = torch.tensor(sizes, device=device)
        weights = weights + (w / w.sum()) @ torch.stack(deltas)
        if t % cfg.eval_every == 0 or t == cfg.rounds:
            copy_into(params, weights)
            last = plain_evaluate(model, data, local)
    sync(device)
    return time.perf_counter() - start, weights, last


def workload_totals(exp: Experiment) -> dict[str, int]:
    """Client steps and training samples the workload processes (for the rates and the floor)."""
    cfg, data = exp.cfg, exp.data
    steps = samples = 0
    for t in range(1, cfg.rounds + 1):
        for cid in sample_clients(cfg.seed, t, cfg.num_clients, cfg.clients_per_round):
            n = data.num_train(cid)
            steps += cfg.client.local_epochs * -(-n // cfg.client.batch_size)
            samples += cfg.client.local_epochs * n
    return {"client_steps": steps, "samples": samples}


def floor_seconds(exp: Experiment, w: Workload, samples: int, timed_steps: int = 3) -> dict:
    """Training FLOPs of the workload / the FLOP rate of the same model at a large batch."""
    device = exp.device
    model = exp.algorithm.ctx.model_factory().to(device)
    x = torch.randn(w.floor_batch, *exp.data.input_shape, device=device)
    y = torch.randint(0, exp.data.num_classes, (w.floor_batch,), device=device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    with FlopCounterMode(display=False) as counter:
        step()
    flops_per_sample = counter.get_total_flops() / w.floor_batch
    step()  # warm-up
    sync(device)
    start = time.perf_counter()
    for _ in range(timed_steps):
        step()
    sync(device)
    rate = flops_per_sample * w.floor_batch * timed_steps / (time.perf_counter() - start)
    return {
        "train_flops_per_sample": flops_per_sample,
        "flop_rate": rate,
        "floor_s": samples * flops_per_sample / rate,
    }


def bench_workload(
    w: Workload,
    executors: list[str],
    device: str,
    reps: int,
    cache: str,
    warmup: int = 1,
    plain: bool = True,
    threads="auto",
) -> dict:
    exps = {
        e: Experiment(fedexp_config(w, e, device, cache, threads), tempfile.mkdtemp())
        for e in executors
    }
    first = exps[executors[0]]
    init = first.algorithm.init_state().params.clone()
    runners = [*executors, "plain"] if plain else list(executors)
    times: dict[str, list[float]] = {e: [] for e in runners}
    finals: dict[str, torch.Tensor] = {}
    # untimed warm-ups, then interleaved repetitions
    for rep in range(warmup + reps):
        for e, exp in exps.items():
            seconds, finals[e], last = run_fedexp(exp)
            if rep >= warmup:
                times[e].append(seconds)
        if plain:
            seconds, finals["plain"], plain_last = plain_fedavg(first, init)
            if rep >= warmup:
                times["plain"].append(seconds)
    totals = workload_totals(first)
    out = {"workload": w.__dict__, "device": str(first.device), **totals}
    out["median_s"] = {k: statistics.median(v) for k, v in times.items()}
    out["times_s"] = times
    if plain:
        # the ratio of each interleaved pair, then the median: robust to load that drifts
        out["ratio_vs_plain"] = {
            e: statistics.median(a / b for a, b in zip(times[e], times["plain"])) for e in executors
        }
        out["max_abs_diff_vs_plain"] = {
            e: float((finals[e] - finals["plain"]).abs().max()) for e in executors
        }
    if "vectorized" in times and "sequential" in times:  # the same pairing, between executors
        out["vectorized_vs_sequential"] = statistics.median(
            a / b for a, b in zip(times["vectorized"], times["sequential"])
        )
    out["final_eval"] = {k: v for k, v in last.items() if k.startswith("eval/")}
    if plain:  # the same evaluation: the plain loop's accuracies next to fedexp's
        pooled, per_split = plain_last
        out["plain_eval"] = {"eval/global/acc": pooled}
        for name, (pooled_split, client_mean) in zip(("", "val/"), per_split):
            if name:
                out["plain_eval"][f"eval/{name}global/acc"] = pooled_split
            out["plain_eval"][f"eval/{name}global/client_acc_mean"] = client_mean
    out.update(floor_seconds(first, w, totals["samples"]))
    return out


def report(r: dict, executors: list[str]) -> None:
    med, w = r["median_s"], r["workload"]
    runners = list(med)
    print(
        f"\n== {w['name']}  ({w['num_clients']} clients, {w['clients_per_round']}/round, "
        f"{w['rounds']} rounds, E={w['local_epochs']}, B={w['batch_size']}, {w['model']}, "
        f"{r['device']})"
    )
    print(
        f"   {'runner':<12}{'median s':>10}{'rounds/s':>10}{'steps/s':>11}{'samples/s':>12}"
        f"{'x floor':>9}"
    )
    for k in runners:
        s = med[k]
        print(
            f"   {k:<12}{s:>10.3f}{w['rounds'] / s:>10.2f}{r['client_steps'] / s:>11.0f}"
            f"{r['samples'] / s:>12.0f}{s / r['floor_s']:>9.1f}"
        )
    for e in executors if "plain" in med else []:
        print(
            f"   fedexp {e} / plain = {r['ratio_vs_plain'][e]:.3f} (median of paired runs)  "
            f"(max |param diff| {r['max_abs_diff_vs_plain'][e]:.1e})"
        )
    if "vectorized" in executors and "sequential" in executors:
        print(
            f"   vectorized / sequential = {r['vectorized_vs_sequential']:.3f} (median of paired "
            "runs; < 1: vectorized faster)"
        )
    print(
        f"   floor {r['floor_s']:.3f} s  ({r['train_flops_per_sample'] / 1e6:.2f} MFLOP/sample "
        f"train, {r['flop_rate'] / 1e9:.1f} GFLOP/s at batch {w['floor_batch']})"
    )


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workload",
        default="all",
        choices=["all", "threads", "startup", "scale", "dispatch", "cores", *WORKLOADS],
    )
    parser.add_argument("--full", action="store_true", help="the full size named in issue 7")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--executors", default="sequential", help="comma list of fedexp executors")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs before them")
    parser.add_argument("--no-plain", action="store_true", help="skip the plain PyTorch loop")
    parser.add_argument("--rounds", type=int, default=None, help="override the workload's rounds")
    parser.add_argument(
        "--threads", default="auto", help="fedexp's `threads` setting (auto or an integer)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--clients", default="1000,10000,100000", help="scale: comma list of populations"
    )
    args = parser.parse_args(argv)
    if args.workload in ("cores", "startup", "threads"):  # each in a module of its own
        module = importlib.import_module(f"bench_{args.workload}")
        reps = {"reps": args.reps} if args.reps else {}  # else the workload's own default
        return getattr(module, f"bench_{args.workload}")(json_path=args.json, **reps)
    if args.workload == "dispatch":
        from bench_dispatch import bench_dispatch

        return bench_dispatch(json_path=args.json)
    if args.workload == "scale":
        from bench_scale import bench_scale

        populations = tuple(int(n) for n in args.clients.split(","))
        return bench_scale(populations, json_path=args.json)
    threads = args.threads if args.threads == "auto" else int(args.threads)
    executors, reps = args.executors.split(","), args.reps or 3
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    print(f"torch {torch.__version__}, threads={threads}, device {args.device}")
    results = []
    with tempfile.TemporaryDirectory() as cache:
        for name in names:
            sizes = WORKLOADS[name]
            w = sizes["full"] if args.full and "full" in sizes else sizes["cpu"]
            if args.rounds is not None:
                w = replace(w, rounds=args.rounds, eval_every=min(w.eval_every, args.rounds))
            r = bench_workload(
                w, executors, args.device, reps, cache, args.warmup, not args.no_plain, threads
            )
            report(r, executors)
            results.append(r)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return results


if __name__ == "__main__":
    sys.exit(main() and 0)
