"""The vectorized executor's batched round (`Algorithm.begin` / `end` once for a group): the
client half is row-wise (a cohort's start and uploads are its clients' as cohorts of one), the
round's results read per client, and host work does not grow with the cohort."""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
from hydra import compose, initialize_config_dir
from torch.profiler import ProfilerActivity, profile

from fedexp.__main__ import find_conf
from fedexp.core.client_loop import no_trace
from fedexp.core.cohort import CohortTraining, RoundResults, unstack
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


ROW_WISE = {
    **BATCHED,
    "ditto": [],
    "fedbn": [],
    "fedproto": [],
    "fedmd": [],
    "feddf": [],
    "qffl": [],
    "signsgd": [],
    "topk": [],
    "local": [],
    "fedhenn": ["algorithm.eta0=1.0"],
}


def rows_equal(whole, one, i) -> bool:
    """Row `i` of a cohort's stacked value equals a cohort of one's (`_as_rows` makes a value
    every client shares a stack of rows; a number given to one client alone is its row)."""
    if isinstance(whole, torch.Tensor):
        if not isinstance(one, torch.Tensor):
            return whole[i].item() == one
        return torch.equal(whole[i], one[0])
    if isinstance(whole, (list, tuple)):
        return len(whole) == len(one) and all(rows_equal(w, o, i) for w, o in zip(whole, one))
    if isinstance(whole, dict):
        return whole.keys() == one.keys() and all(rows_equal(whole[k], one[k], i) for k in whole)
    return whole == one


@pytest.mark.experiment
@pytest.mark.parametrize("algorithm", sorted(ROW_WISE))
def test_the_client_half_is_row_wise(tmp_path, algorithm):
    """`begin` for five clients gives row by row what it gives each alone, and `end` on the
    cohort's trained parameters returns row by row the uploads, and stores the state, of five
    cohorts of one (after a round, so clients hold state of their own)."""
    exp = experiment(tmp_path, f"algorithm={algorithm}", *ROW_WISE[algorithm])
    alg = exp.algorithm
    state, _ = exp.orchestrator().run_round(alg.init_state(), 1)
    ids = [0, 2, 3, 5, 7]
    ctx = RoundContext(2, tuple(ids), 0)
    payloads = alg.configure_round(state, ctx)
    sent, stats = [payloads[c] for c in ids], alg.broadcast_stats(state)
    module = alg.client_module(ids[0])
    whole = alg.begin(module, ids, sent, stats)
    starts = [alg.begin(module, [c], [payloads[c]], stats) for c in ids]
    for i, one in enumerate(starts):
        assert whole.params.keys() == one.params.keys()
        assert all(torch.equal(whole.params[n][i], one.params[n][0]) for n in whole.params)
        given = {**whole.shared, **{k: ("row", v) for k, v in whole.attrs.items()}}
        alone = {**one.shared, **{k: ("row", v) for k, v in one.attrs.items()}}
        for name in type(module).per_client_state:
            w, o = given[name], alone[name]
            w = w[1] if isinstance(w, tuple) and w[:1] == ("row",) else _as_rows(w)
            o = o[1] if isinstance(o, tuple) and o[:1] == ("row",) else _as_rows(o)
            assert rows_equal(w, o, i), name
    # "trained": every floating parameter moved by a different amount per client
    trained = {
        n: t + 0.01 * torch.arange(1, len(ids) + 1).view(-1, *[1] * (t.dim() - 1))
        if t.is_floating_point() else t.clone()
        for n, t in whole.params.items()
    }  # fmt: skip
    data = [exp.data.train(c) for c in ids]
    losses = torch.zeros(len(ids))
    training = CohortTraining(ids, [len(y) for _, y in data], [3] * len(ids), losses, (0.1,), data)
    with no_trace(alg, ids):
        upload = alg.end(module, sent, trained, training)
        kept_whole = {c: alg.store.get(c) for c in ids}
    for i, c in enumerate(ids):
        with no_trace(alg, ids):
            row = {n: t[i : i + 1] for n, t in trained.items()}
            facts = CohortTraining([c], [training.samples[i]], [3], losses[:1], (0.1,), [data[i]])
            alone = alg.end(module, [payloads[c]], row, facts)
            assert same(unstack(upload, i), unstack(alone, 0)), c
            assert same(kept_whole[c], alg.store.get(c)), c


def _as_rows(value):
    """A value every client shares, as a stack of one row (compared with any row)."""
    if isinstance(value, torch.Tensor):
        return value.unsqueeze(0).expand(64, *value.shape)
    if isinstance(value, (list, tuple)):
        return type(value)(_as_rows(v) for v in value)
    if isinstance(value, dict):
        return {k: _as_rows(v) for k, v in value.items()}
    return value


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


def test_round_results_read_as_per_client_results():
    training = CohortTraining([7, 3, 5], [10, 4, 6], [2, 1, 1], torch.tensor([0.5, 1.0, 2.0]))
    upload = Weights(torch.arange(6.0).view(3, 2))
    logged = {"acc": torch.tensor([0.25, 0.0, 0.75])}
    counts = {"acc": torch.tensor([2, 0, 1])}
    results = RoundResults(training, upload, logged, counts)
    assert len(results) == 3 and [r.client_id for r in results] == [7, 3, 5]
    middle = results[1]
    assert middle.num_samples == 4 and middle.num_steps == 1 and float(middle.train_loss) == 1.0
    assert middle.upload.vector.tolist() == [2.0, 3.0]
    assert middle.logged == {} and float(results[2].logged["acc"]) == 0.75  # logged nothing
    bits = results.upload_bits(lambda s: 0)
    assert bits == sum(r.upload.num_bits() for r in results) == 3 * 2 * 32
    assert float(results.logged_means()["acc"]) == 0.5  # over the clients that logged it
    ranking = Ranking((torch.tensor([[1, 0, 2], [2, 1, 0]]),))
    assert unstack(ranking, 1).layers[0].tolist() == [2, 1, 0]


def test_round_results_join_reorder_and_take_an_attack():
    def one(cid, value, acc=None):
        facts = CohortTraining([cid], [cid + 1], [1], torch.tensor([float(cid)]))
        logged = {} if acc is None else {"acc": torch.tensor([acc])}
        counts = {} if acc is None else {"acc": torch.tensor([1])}
        return RoundResults(facts, Weights(torch.full((1, 2), value)), logged, counts)

    joined = RoundResults.concat([one(4, 1.0, acc=0.5), one(9, 2.0), one(6, 3.0, acc=1.0)])
    assert joined.client_ids == [4, 9, 6] and joined.num_samples == [5, 10, 7]
    assert joined.uploads().vector.tolist() == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert float(joined.logged_means()["acc"]) == 0.75  # client 9 logged nothing
    assert joined[1].logged == {}
    back = joined.take([6, 4, 9])
    assert back.client_ids == [6, 4, 9] and back.train_loss.tolist() == [6.0, 4.0, 9.0]
    assert back.upload_rows("values").tolist() == [[3.0, 3.0], [1.0, 1.0], [2.0, 2.0]]
    hit = back.with_uploads([1], [Weights(torch.zeros(2))])
    assert hit.malicious == [False, True, False] and hit.malicious_total == 1
    assert hit[1].malicious and hit[1].upload.vector.tolist() == [0.0, 0.0]
    assert hit.uploads().vector[0].tolist() == [3.0, 3.0]
    assert back.malicious_total == 0  # the results the attack was given stay as they were
    assert len(RoundResults.empty()) == 0


@pytest.mark.experiment
def test_a_subclass_that_changes_end_is_batched_with_its_own_end(tmp_path):
    exp = experiment(tmp_path, "algorithm=fedavg")
    alg = exp.algorithm
    calls = []

    class Changed(type(alg)):
        def end(self, module, payloads, params, training):
            calls.append(list(training.client_ids))
            upload = super().end(module, payloads, params, training)
            return Weights(upload.values * 0)

    alg.__class__ = Changed
    ctx = RoundContext(1, [0, 1, 4], 0)
    state = alg.init_state()
    results = exp.executor.run(alg, alg.configure_round(state, ctx), ctx, exp.data)
    assert calls == [[0, 1, 4]]  # one call for the cohort
    assert not results.uploads().vector.any()


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
