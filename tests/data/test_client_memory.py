"""What a client costs in memory: the peak bytes of building the synthetic data, its natural
partition and the federated index tables, measured at two populations (the 100 000-client run
is this cost times 100 000, so a growth per client shows here at a test's size).

The peak counts everything allocated at once while building: numpy arrays and Python objects
(tracemalloc) plus torch's CPU tensors (the profiler's memory events: an op's temporaries too,
which no object holds after it returns); the two peaks are added (an upper bound of the peak of
both together). Allocations only: no timing, no float kernel decides a count.
"""

from __future__ import annotations

import tracemalloc

import pytest
import torch
from torch.autograd.profiler import profile

from fedexp.data.datasets import load_synthetic
from fedexp.data.federated import FederatedData
from fedexp.data.schemes import Natural
from fedexp.run.components import partition_coverage

POPULATIONS = (600, 1200)  # clients: about 175 000 and 350 000 samples of 60 float32 features


def torch_peak(prof) -> int:
    """The most bytes torch's CPU allocator held at once during the profile, above its start."""
    events = prof.kineto_results.events()
    # allocations are positive, frees negative, in the order they happened
    changes = sorted(
        ((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"), key=lambda c: c[0]
    )
    held = peak = 0
    for _, nbytes in changes:
        held += nbytes
        peak = max(peak, held)
    return peak


def peak_bytes(build):
    """(what `build()` returns, the most bytes it held at once: numpy and Python + torch)."""
    tracemalloc.start()
    try:
        # the CPU-only profiler (no Kineto activities: nothing to start but the op callbacks)
        with profile(profile_memory=True, use_kineto=False) as prof:
            out = build()
            traced = tracemalloc.get_traced_memory()[1]  # before the profiler's own objects
    finally:
        tracemalloc.stop()
    return out, traced + torch_peak(prof)


def data_bytes(ds) -> int:
    """What the built data hold: inputs, labels and owners."""
    return ds.train_x.nbytes + ds.train_y.nbytes + ds.train_client_ids.nbytes


def build(num_clients: int):
    """The synthetic data of `num_clients` (`dataset=synthetic`, seed 0), then its partition
    (`partition=natural`, the run's local splits) and the federated index tables: the peak of
    each step, and the data's own bytes."""
    ds, data_peak = peak_bytes(
        lambda: load_synthetic(1.0, 1.0, 60, 10, False, num_clients=num_clients, seed=0)
    )
    scheme = Natural(
        2, num_clients, server_pool=0, test_fraction=0.2, val_fraction=0.1,
        allow_missing_classes=False, reduce_fraction=0.0, reduce_factor=0.5,
    )  # fmt: skip
    labels, owners = ds.train_y.numpy(), ds.train_client_ids

    def partition():
        part = scheme(labels, num_clients, 0, client_ids=owners, num_classes=10)
        return FederatedData(ds, part, torch.device("cpu"))

    fed, split_peak = peak_bytes(partition)
    assert fed.num_clients == num_clients
    partition_coverage(
        ds, fed.partition
    )  # once before: what a first call sets up is not a client's
    coverage, coverage_peak = peak_bytes(lambda: partition_coverage(ds, fed.partition))
    assert coverage["held_by_clients"] == pytest.approx(1.0)
    return data_peak, split_peak, data_bytes(ds), len(labels), coverage_peak


@pytest.fixture(scope="module")
def populations():
    return [build(n) for n in POPULATIONS]


def per_client(populations, column: int) -> float:
    (small, large), (n, m) = populations, POPULATIONS
    return (large[column] - small[column]) / (m - n)


def test_building_the_data_costs_a_client_its_own_data(populations):
    """Generating and checking the data: a client costs its inputs, labels and owners (~76 kB at
    60 features and ~290 samples) and the generating model of its chunk of clients (W_k, b_k,
    v_k: ~8 kB at 60 features, bounded by the chunk at large populations). The finiteness check
    of every Dataset once took |x| and masks of the whole input at once (seven bytes a float32
    value: 275 kB a client here, 19.1 GB at 100 000 clients against 10.3 GB before it)."""
    data = per_client(populations, 2)
    cost = per_client(populations, 0)
    assert data > 50_000  # the populations are large enough to measure a client by
    assert cost <= 1.15 * data, f"{cost:.0f} bytes a client to build {data:.0f} bytes of data"


def test_partitioning_costs_a_client_four_int64_a_sample(populations):
    """The natural partition, its local splits and the index tables: the owners' ordering, the
    split's permuted copy and its sort keys (which become the index tables), three int64 a
    sample beside the data plus each client's offsets; at most four (it was seven)."""
    small, large = (p[3] for p in populations)
    samples = (large - small) / (POPULATIONS[1] - POPULATIONS[0])
    cost = per_client(populations, 1)
    assert cost <= 4 * 8 * samples, f"{cost / samples:.1f} bytes a sample to partition"


def test_the_coverage_of_the_split_costs_a_sample_a_few_bytes(populations):
    """The share of the data the clients hold (`partition_coverage`, logged and in the summary):
    two masks of one byte a sample (the samples held, the training samples whose classes are
    counted a chunk at a time) and the local test splits' labels (6.6 bytes a sample measured
    here). `np.unique` of every index held cost 18 bytes a sample seen here
    (the indices joined, then copied; its hash set, which these counts do not see, about 64
    more at once: the peak of the 100 000-client run), and gathering the training labels held
    eight more."""
    small, large = (p[3] for p in populations)
    samples = (large - small) / (POPULATIONS[1] - POPULATIONS[0])
    cost = per_client(populations, 4)
    assert cost <= 8 * samples, f"{cost / samples:.1f} bytes a sample for the coverage"
