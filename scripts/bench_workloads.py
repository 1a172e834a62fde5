"""The workloads `scripts/bench.py` and its other benchmarks run, and how fedexp runs one: the
config composed by Hydra as the CLI composes it (`fedexp_config`), a run timed through the
Orchestrator (`run_fedexp`). `bench.py`, `bench_threads.py` and `bench_dispatch.py` import them
from here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from fedexp.config.build import find_conf
from fedexp.data.datasets import Dataset
from fedexp.run import Experiment


@dataclass(frozen=True)
class Workload:
    """A fixed FedAvg run. `samples_per_client` set: random data of `input_shape` (CIFAR-shaped)."""

    name: str
    model: str
    num_clients: int
    clients_per_round: int
    rounds: int
    eval_every: int
    local_epochs: int
    batch_size: int
    lr: float
    samples_per_client: int | None = None  # training samples per client (random data)
    local_test_per_client: int = 10  # random data: each client's local test split
    test_size: int = 0  # central test set (random data)
    input_shape: tuple[int, ...] = (3, 32, 32)
    floor_batch: int = 512


# `full` is the size named in issue 7; `cpu` is scaled down to seconds per run on 2 cores.
WORKLOADS = {
    "digits": {
        # issue 2's workload: the defaults of `python -m fedexp`, evaluation only at the end
        "cpu": Workload("digits", "mlp", 20, 10, 20, 20, 1, 32, 0.05, floor_batch=4096),
    },
    "pfl-cifar10": {
        # pfl-research's cross-framework benchmark: 1000 clients x 50 images, 50 per round,
        # central evaluation every 10 rounds
        "full": Workload("pfl-cifar10", "pfl_cnn", 1000, 50, 1500, 10, 1, 10, 0.1, 50, 10, 10000),
        "cpu": Workload(
            "pfl-cifar10", "pfl_cnn", 100, 10, 1, 1, 1, 10, 0.1, 50, 2, 200, floor_batch=64
        ),
    },
    "lenet5": {
        # a typical FedHeNN / WAFFLe run: 100 clients, 10 per round, 5 local epochs, batch 32
        "full": Workload("lenet5", "lenet5", 100, 10, 100, 10, 5, 32, 0.05, 500, 100, 10000),
        "cpu": Workload(
            "lenet5", "lenet5", 100, 10, 2, 2, 5, 32, 0.05, 50, 5, 500, floor_batch=1024
        ),
    },
}


def random_images(
    num_train: int, num_test: int, input_shape: list[int], seed: int = 0, **_
) -> Dataset:
    """Gaussian images with uniform labels: the shape and the cost of CIFAR-10, no download."""
    gen = torch.Generator().manual_seed(seed)
    shape = tuple(input_shape)
    return Dataset(
        "random",
        torch.randn(num_train, *shape, generator=gen),
        torch.randint(0, 10, (num_train,), generator=gen),
        torch.randn(num_test, *shape, generator=gen),
        torch.randint(0, 10, (num_test,), generator=gen),
        10,
        shape,
    )


def fedexp_config(
    w: Workload, executor: str, device: str, cache_dir: str, threads="auto", extra=()
):
    """The run's config, composed by Hydra from conf/ exactly as the CLI would; `extra`
    overrides follow the workload's (an algorithm and its settings)."""
    overrides = [
        f"threads={threads}",
        f"model={w.model}",
        f"executor={executor}",
        f"device={device}",
        f"num_clients={w.num_clients}",
        f"clients_per_round={w.clients_per_round}",
        f"rounds={w.rounds}",
        f"eval_every={w.eval_every}",
        f"client.local_epochs={w.local_epochs}",
        f"client.batch_size={w.batch_size}",
        f"client.lr={w.lr}",
        "progress=false",
        f"paths.cache_dir={cache_dir}",
    ]
    if w.samples_per_client is not None:
        overrides.append("partition=iid")
    overrides.extend(extra)
    with initialize_config_dir(config_dir=find_conf(), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    if w.samples_per_client is not None:
        per_client = w.samples_per_client + w.local_test_per_client
        with open_dict(cfg):
            cfg.dataset = OmegaConf.create(
                {
                    "_target_": f"{random_images.__module__}.random_images",
                    "num_train": w.num_clients * per_client,
                    "num_test": w.test_size,
                    "input_shape": list(w.input_shape),
                }
            )
            cfg.partition.test_fraction = w.local_test_per_client / per_client
    return cfg


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_fedexp(exp: Experiment) -> tuple[float, torch.Tensor, dict]:
    """Time one full run through the Orchestrator; returns (seconds, final params, last eval)."""
    orch = exp.orchestrator()
    sync(exp.device)
    start = time.perf_counter()
    last = orch.run()
    sync(exp.device)
    return time.perf_counter() - start, orch.state.params, last
