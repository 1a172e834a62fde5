"""The vectorized executor's batched round (`Algorithm.cohort_begin` / `cohort_end`): the same
models, client state and metrics as its client-by-client round, and host work that does not grow
with the cohort."""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
from hydra import compose, initialize_config_dir
from torch.profiler import ProfilerActivity, profile

from fedexp.__main__ import find_conf
from fedexp.core.cohort import CohortResults, CohortTraining, unstack
from fedexp.core.types import ConfigError, Ranking, RoundContext, Weights
from fedexp.engine.executors.stacked import StaticStep
from fedexp.engine.functional_optim import GroupSpec
from fedexp.run import Experiment

TINY = [
    "debug=smoke",
    "num_clients=8",
    "clients_per_round=5",
    "client.batch_size=16",
    "rounds=2",
    "executor=vectorized",
    "executor.stack=vmap",  # the form whose host operations these tests count
]
UNEQUAL = ["partition=dirichlet", "partition.min_size=5"]  # short last batches, idle steps
BATCHED = {
    "fedavg": ["client.momentum=0.9"],
    "fedprox": ["algorithm.mu=0.5"],
    "fedrep": ["algorithm.head_epochs=1"],
    "scaffold": [],
    "frl": [],
    "waffle": ["client.local_epochs=1"],
}


def experiment(tmp_path, *overrides: str) -> Experiment:
    with initialize_config_dir(config_dir=find_conf(), version_base="1.3"):
        cfg = compose("config", overrides=[*TINY, f"paths.cache_dir={tmp_path}", *overrides])
    return Experiment(cfg, tmp_path)


def run_rounds(exp: Experiment, rounds: int = 2):
    """(server state, per-round metrics, the executor's results of the last round)."""
    orch = exp.orchestrator()
    state = exp.algorithm.init_state()
    seen = []
    run = exp.executor.run

    def spy(*args):
        out = run(*args)
        seen.append(out)
        return out

    exp.executor.run = spy
    metrics = []
    for t in range(1, rounds + 1):
        state, m = orch.run_round(state, t)
        metrics.append({k: v for k, v in m.items() if not k.startswith("time/")})
    return state, metrics, seen[-1]


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and same(dataclasses.asdict(a), dataclasses.asdict(b))
    return a == b


@pytest.mark.experiment
@pytest.mark.parametrize("algorithm", sorted(BATCHED))
@pytest.mark.parametrize("chunk,stack", [(None, "vmap"), (2, "vmap"), (None, "loop")])
def test_a_batched_round_equals_the_client_by_client_round(
    tmp_path, monkeypatch, algorithm, chunk, stack
):
    overrides = [
        f"algorithm={algorithm}",
        *BATCHED[algorithm],
        f"executor.chunk_size={chunk or 'null'}",
        f"executor.stack={stack}",
    ]
    batched = experiment(tmp_path / "a", *overrides)
    state_b, metrics_b, results_b = run_rounds(batched)
    assert isinstance(results_b, CohortResults)  # the batched path ran

    per_client = experiment(tmp_path / "b", *overrides)
    monkeypatch.setattr(type(per_client.algorithm), "cohort_begin", lambda *a: None)
    state_p, metrics_p, results_p = run_rounds(per_client)
    assert isinstance(results_p, list)

    # bit for bit: the same operations on the same numbers, batched
    assert same(state_b.params, state_p.params) and same(state_b.buffers, state_p.buffers)
    assert metrics_b == metrics_p
    assert same(batched.algorithm.store.state_dict(), per_client.algorithm.store.state_dict())
    assert [r.client_id for r in results_b] == [r.client_id for r in results_p]
    for rb, rp in zip(results_b, results_p):  # a batched result reads as the client's own
        assert same(rb.upload, rp.upload) and rb.num_samples == rp.num_samples
        assert rb.num_steps == rp.num_steps and torch.equal(rb.train_loss, rp.train_loss)


@pytest.mark.experiment
def test_the_round_issues_a_few_operations_per_extra_client(tmp_path):
    """Top-level torch operations of a round (no evaluation), cohort 2 against cohort 6: the
    batched round adds the client's shuffle and a copy of its state per client, not a pass over
    its parameters (98 a client before, on the pfl CNN)."""

    def ops(algorithm: str, cohort: int) -> collections.Counter:
        exp = experiment(
            tmp_path / f"{algorithm}{cohort}",
            f"algorithm={algorithm}",
            *BATCHED[algorithm],
            "partition=iid",  # every client takes the same number of steps
            f"clients_per_round={cohort}",
        )
        orch, state = exp.orchestrator(), exp.algorithm.init_state()
        state, _ = orch.run_round(state, 1)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            orch.run_round(state, 2)
        return collections.Counter(e.name for e in prof.events() if e.cpu_parent is None)

    for algorithm in ("fedavg", "scaffold"):
        small, large = ops(algorithm, 2), ops(algorithm, 6)
        extra = {k: (large[k] - small[k]) / 4 for k in large | small if large[k] != small[k]}
        assert sum(extra.values()) <= 5, extra
        assert extra.get("aten::randperm") == 1  # each client's own shuffle stays its own


def test_cohort_results_read_as_per_client_results():
    training = CohortTraining([7, 3, 5], [10, 4, 6], [2, 1, 1], torch.tensor([0.5, 1.0, 2.0]))
    upload = Weights(torch.arange(6.0).view(3, 2))
    logged = {"acc": torch.tensor([0.25, 0.0, 0.75])}
    counts = {"acc": torch.tensor([2, 0, 1])}
    results = CohortResults(training, upload, logged, counts)
    assert len(results) == 3 and [r.client_id for r in results] == [7, 3, 5]
    middle = results[1]
    assert middle.num_samples == 4 and middle.num_steps == 1 and float(middle.train_loss) == 1.0
    assert middle.upload.vector.tolist() == [2.0, 3.0]
    assert middle.logged == {} and float(results[2].logged["acc"]) == 0.75  # logged nothing
    assert results.upload_bits() == sum(r.upload.num_bits() for r in results) == 3 * 2 * 32
    assert float(results.logged_means()["acc"]) == 0.5  # over the clients that logged it
    ranking = Ranking((torch.tensor([[1, 0, 2], [2, 1, 0]]),))
    assert unstack(ranking, 1).layers[0].tolist() == [2, 1, 0]


@pytest.mark.experiment
def test_an_algorithm_without_batched_hooks_trains_client_by_client(tmp_path):
    exp = experiment(tmp_path, *UNEQUAL, "algorithm=ditto")
    _, _, results = run_rounds(exp, rounds=1)
    assert isinstance(results, list) and len(results) == 5


@pytest.mark.experiment
def test_a_subclass_that_changes_client_begin_is_not_batched_with_its_parents_forms(tmp_path):
    exp = experiment(tmp_path, "algorithm=fedavg")
    alg = exp.algorithm
    calls = []

    class Changed(type(alg)):
        def client_begin(self, module, client_id, payload):
            calls.append(client_id)
            super().client_begin(module, client_id, payload)

    alg.__class__ = Changed
    ctx = RoundContext(1, [0, 1], 0)
    state = alg.init_state()
    results = exp.executor.run(alg, alg.configure_round(state, ctx), ctx, exp.data)
    assert calls == [0, 1] and isinstance(results, list)


@pytest.mark.experiment
@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "fedrep", "frl"])
def test_static_shapes_pad_every_chunk_and_train_the_same(tmp_path, algorithm):
    """Chunks of 2 over a cohort of 5: the last chunk is padded with an inactive row; every step
    of every round runs on one `StaticStep` shape, and the models are those of the plain round
    (a deterministic objective: padding rows change nothing)."""
    overrides = [*UNEQUAL, f"algorithm={algorithm}", *BATCHED[algorithm], "executor.chunk_size=2"]
    plain = experiment(tmp_path / "a", *overrides)
    state_a, metrics_a, _ = run_rounds(plain)
    static = experiment(tmp_path / "b", *overrides, "executor.static_shapes=true")
    shapes = set()
    call = StaticStep.__call__

    def spy(self, x, y, active, batch_idx):
        shapes.add((tuple(x.shape), tuple(y.shape), tuple(active.shape)))
        return call(self, x, y, active, batch_idx)

    StaticStep.__call__ = spy
    try:
        state_b, metrics_b, _ = run_rounds(static)
    finally:
        StaticStep.__call__ = call
    assert len(shapes) == 1 and next(iter(shapes))[2] == (2,)  # [clients] rows: the chunk
    if state_a.params is not None:
        torch.testing.assert_close(state_b.params, state_a.params, rtol=0, atol=1e-6)
    for m_a, m_b in zip(metrics_a, metrics_b):
        assert m_a.keys() == m_b.keys()
        for key, value in m_a.items():
            assert m_b[key] == pytest.approx(value, abs=1e-6), key


@pytest.mark.experiment
@pytest.mark.parametrize("static", [False, True])
def test_a_batched_round_never_syncs_with_the_host_while_it_trains(tmp_path, static):
    exp = experiment(tmp_path, "algorithm=scaffold", f"executor.static_shapes={static}")
    alg, state = exp.algorithm, exp.algorithm.init_state()
    for t in (1, 2):
        ctx = RoundContext(t, [0, 2, 3, 5, 7], 0)
        payloads = alg.configure_round(state, ctx)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            results = exp.executor.run(alg, payloads, ctx, exp.data)
        state, _ = alg.aggregate(state, results, ctx)
    names = collections.Counter(e.name for e in prof.events())
    assert names["aten::_local_scalar_dense"] == 0 and names["aten::item"] == 0
    # the clients' shuffles (one per client and epoch) did run in the profiled call
    epochs = exp.algorithm.ctx.client.local_epochs
    top = collections.Counter(e.name for e in prof.events() if e.cpu_parent is None)
    assert top["aten::randperm"] == 5 * epochs


@pytest.mark.experiment
def test_cuda_graphs_need_cuda_and_sgd_without_dampening(tmp_path):
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"executor.cuda_graphs: needs training on CUDA"):
            experiment(tmp_path, "device=cpu", "executor.cuda_graphs=true")
    adam = {"w": GroupSpec("adam", 0.1)}
    with pytest.raises(ConfigError, match="must be SGD without dampening"):
        StaticStep(None, adam, {}, {}, {}, {}, capture=False)
    dampened = {"w": GroupSpec("sgd", 0.1, momentum=0.9, dampening=0.1)}
    with pytest.raises(ConfigError, match="dampening 0.1"):
        StaticStep(None, dampened, {}, {}, {}, {}, capture=False)
