"""executor=vectorized: same results as the sequential executor; padding and stacking rules."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from tests.conftest import REPO
from torch import nn

from fedexp.__main__ import find_conf
from fedexp.algorithms import topk
from fedexp.algorithms.fedavg import CONSTANT_SERVER_LR, payload_rows
from fedexp.core.flat import flat_params, load_flat
from fedexp.core.seeding import sample_clients
from fedexp.core.types import ConfigError
from fedexp.engine.executors.schedule import schedule
from fedexp.engine.executors.select import AutoExecutor
from fedexp.engine.executors.sequential import SequentialExecutor
from fedexp.engine.executors.stacked import check_vmappable
from fedexp.engine.executors.vectorized import (
    VectorizedExecutor,
    stack_form,
)
from fedexp.engine.stacking import split_attrs
from fedexp.run import Experiment
from near_ties import (
    CLEAR_SUPERMASK,
    MASK_MARGIN,
    MASKED,
    Tolerance,
    check_choices,
    watch_choices,
    watch_mask_margins,
)

# unequal client sizes (Dirichlet) and a batch that leaves short last batches
TINY = [
    "debug=smoke",
    "partition=dirichlet",
    "partition.min_size=5",
    "num_clients=6",
    "clients_per_round=4",
    "client.batch_size=16",
]


def experiment(tmp_path, *overrides: str) -> Experiment:
    with initialize_config_dir(config_dir=find_conf(), version_base="1.3"):
        cfg = compose("config", overrides=[*TINY, f"paths.cache_dir={tmp_path}", *overrides])
    return Experiment(cfg, tmp_path)


def train(exp: Experiment) -> tuple[torch.Tensor, dict]:
    orch = exp.orchestrator()
    last = orch.run()
    return orch.state.params, {k: v for k, v in last.items() if not k.startswith("time/")}


ALGORITHMS = sorted(
    p.stem for p in (REPO / "conf" / "algorithm").glob("*.yaml") if not p.stem.startswith("_")
)
# objectives that draw random numbers inside training_step (Concrete samples): the vectorized
# executor draws them from one stream per chunk (both forms), the sequential executor from one
# per client, so only "trains and stays finite" is comparable
STOCHASTIC = {"waffle"}
VARIANTS = {
    "fedprox": ["algorithm.mu=0.5"],
    "fedrep": ["algorithm.head_epochs=2"],
    # a supermask whose kept edges stay clear of ties (`near_ties.MASK_MARGIN`)
    "frl": CLEAR_SUPERMASK,
    "supermask_fedavg": CLEAR_SUPERMASK,
}
CASES = [[f"algorithm={a}", *VARIANTS.get(a, [])] for a in ALGORITHMS] + [
    ["algorithm=fedavg", "client.momentum=0.9", "client.weight_decay=0.01"],
    # system heterogeneity: each client's drawn epochs, or steps (its last epoch cut short)
    ["algorithm=fedavg", "client.local_work=epochs", "client.local_work_range=[1,3]"],
    ["algorithm=fednova", "client.local_work=steps", "client.local_work_range=[1,7]"],
]


# how far the executors' floats may part: the vmap form trains with batched kernels whose
# reduction order differs from the per-client ones (and from CPU to CPU). Discrete choices made
# from such floats are compared on what they promise (`near_ties`).
RTOL, ATOL = 1e-4, 1e-5
TOLERANCE = Tolerance(RTOL, ATOL)


# ---- TopK: what each upload promises ------------------------------------------------------------


@dataclass
class TopKState:
    """A TopK client's state around one upload."""

    raw: torch.Tensor  # the trained model minus the received one
    residual: torch.Tensor | None  # what the client kept from its earlier rounds
    kept: torch.Tensor  # the residual stored for its next round


def watch_topk(monkeypatch) -> dict[tuple[int, int], TopKState]:
    """Each TopK client's state around its uploads, under (client, its number of uploads before)."""
    records: dict[tuple[int, int], TopKState] = {}
    end = topk.TopK.end

    def watched(self, module, payloads, params, training):
        ids = list(training.client_ids)
        raw = (self.cohort_flat(module, params) - payload_rows(payloads)).clone()
        before = {c: self.store.get(c) for c in ids}
        before = {c: None if r is None else r.clone() for c, r in before.items()}
        sent = end(self, module, payloads, params, training)
        for i, c in enumerate(ids):
            key = (c, sum(k == c for k, _ in records))
            records[key] = TopKState(raw[i], before[c], self.store.get(c).clone())
        return sent

    monkeypatch.setattr(topk.TopK, "end", watched)
    return records


def check_topk_uploads(states: dict, choices: dict, fraction: float) -> None:
    """What TopK promises of each upload, exactly (one run, one set of kernels): the
    round(fraction * d) largest-|value| coordinates of the update, the update being the trained
    delta plus the client's residual, and the residual what was not sent."""
    assert states.keys() == {(c, v) for c, v, _ in choices}
    for (client, visit), state in states.items():
        choice = choices[client, visit, 0]
        update, own, sent = choice.key, choice.own, choice.sent
        d = update.numel()
        chosen = torch.zeros(d, dtype=torch.bool)
        chosen[own.indices] = True
        assert len(own.indices) == round(fraction * d) == int(chosen.sum())
        assert torch.equal(own.values, update[own.indices])
        assert update.abs()[chosen].min() >= update.abs()[~chosen].max()  # by magnitude
        if visit == 0:
            assert state.residual is None and torch.equal(update, state.raw)
        else:
            assert torch.equal(state.residual, states[client, visit - 1].kept)
            assert torch.equal(update, state.raw + state.residual)
        chosen = torch.zeros(d, dtype=torch.bool)
        chosen[sent.indices] = True
        assert torch.equal(sent.values, update[sent.indices])
        assert torch.equal(state.kept[chosen], torch.zeros(int(chosen.sum())))
        assert torch.equal(state.kept[~chosen], update[~chosen])
    assert any(visit > 0 for _, visit in states)  # error feedback is exercised


@pytest.mark.experiment
@pytest.mark.parametrize("algorithm", CASES, ids=lambda c: "-".join(c).replace("algorithm=", ""))
def test_vectorized_matches_sequential(tmp_path, monkeypatch, algorithm):
    # Prepare
    name = algorithm[0].removeprefix("algorithm=")
    seq = experiment(tmp_path, "executor=sequential", *algorithm)
    cohort = sample_clients(0, 1, 6, 4)
    sizes = {seq.data.num_train(c) for c in cohort}
    assert len(sizes) > 1 and any(n % 16 for n in sizes)  # padding and masks are exercised
    with monkeypatch.context() as watch:
        choices = watch_choices(watch, name)
        states = watch_topk(watch) if name == "topk" else None
        margins = watch_mask_margins(watch) if name in MASKED else None
        p_seq, m_seq = train(seq)
    if margins is not None:
        assert min(margins) > MASK_MARGIN  # the vectorized run keeps the same edges
    if states is not None:
        check_topk_uploads(states, choices, seq.algorithm.fraction)
    for stack in ("vmap", "loop"):
        vec = experiment(tmp_path, "executor=vectorized", f"executor.stack={stack}", *algorithm)
        assert isinstance(vec.executor, VectorizedExecutor) and vec.executor.stack == stack
        # Execute
        with monkeypatch.context() as watch:
            vec_choices = watch_choices(watch, name, choices)
            vec_states = watch_topk(watch) if name == "topk" else None
            p_vec, m_vec = train(vec)
        # Assert
        assert m_seq.keys() == m_vec.keys()
        if name in STOCHASTIC:
            assert all(math.isfinite(v) for v in m_vec.values() if isinstance(v, float))
            continue
        replaced = check_choices(vec_choices, choices, TOLERANCE)
        assert replaced == 0 or stack == "vmap"  # the loop form: the same floats
        if vec_states is not None:
            check_topk_uploads(vec_states, vec_choices, vec.algorithm.fraction)
        if p_seq is not None:
            torch.testing.assert_close(p_vec, p_seq, rtol=RTOL, atol=ATOL)
            if stack == "loop":
                # the loop form runs the sequential executor's operations on the same batches,
                # and both run the one client half (`begin`/`end`): SCAFFOLD included
                assert torch.equal(p_vec, p_seq)
        for key, value in m_seq.items():
            assert m_vec[key] == pytest.approx(value, abs=1e-5), key


@pytest.mark.experiment
def test_runs_that_part_on_a_near_tie_are_compared_on_the_reference_choice(tmp_path, monkeypatch):
    # another CPU's kernels, emulated: the same run but for the first client's trained model,
    # one weight of which moves by less than the executors' tolerance, enough that its delta's
    # (k+1)-th largest magnitude now outranks the k-th: the two runs' own choices differ there
    reference = experiment(tmp_path, "executor=sequential", "algorithm=topk")
    with monkeypatch.context() as watch:
        choices = watch_choices(watch, "topk")
        p_ref, m_ref = train(reference)
    other = experiment(tmp_path, "executor=sequential", "algorithm=topk")
    records = watch_choices(monkeypatch, "topk", choices)
    states = watch_topk(monkeypatch)
    end, moved = topk.TopK.end, []

    def near_tie(self, module, payloads, params, training):
        if not moved:  # sequential: a cohort of one, whose params are the module's own
            weights = flat_params(self.shared(module.model))
            vector = payloads[0].vector
            delta = weights - vector
            top = delta.abs().topk(round(self.fraction * len(delta)) + 1)
            i, j = top.indices[-2:]
            weights[j] = vector[j] + delta[j].sign() * delta[i].abs() * (1 + 1e-4)
            moved.append(float((weights[j] - vector[j]).abs() - delta[j].abs()))
            load_flat(self.shared(module.model), weights)
        return end(self, module, payloads, params, training)

    monkeypatch.setattr(topk.TopK, "end", near_tie)
    p_other, m_other = train(other)
    assert 0 < moved[0] < ATOL
    check_topk_uploads(states, records, other.algorithm.fraction)
    assert check_choices(records, choices, TOLERANCE) == 1  # where the runs would have parted
    torch.testing.assert_close(p_other, p_ref, rtol=RTOL, atol=ATOL)
    for key, value in m_ref.items():
        assert m_other[key] == pytest.approx(value, abs=1e-5), key


def test_schedule_pads_short_batches_and_masks_finished_clients():
    # client 0: 5 samples -> batches [3], [2]; client 1: 2 samples -> one batch, then idle
    orders = [[np.array([4, 0, 2, 1, 3])], [np.array([1, 0])]]
    idx, valid, active, everyone = schedule(orders, [5, 2], 3).to(torch.device("cpu"))
    assert idx.tolist() == [[[4, 0, 2], [1, 3, 0]], [[6, 5, 5], [6, 5, 5]]]
    assert valid.tolist() == [
        [[True, True, True], [True, True, False]],
        [[True, True, False], [True, True, False]],
    ]
    assert active.tolist() == [[True, True], [True, False]]
    assert everyone == [True, False]  # on the host: no device sync per step


def test_padded_labels_leave_the_gradient_of_the_real_batch():
    # the padding convention: label -100 is ignored by F.cross_entropy's mean
    torch.manual_seed(0)
    layer = nn.Linear(4, 3)
    x, y = torch.randn(2, 4), torch.tensor([0, 2])
    real = torch.autograd.grad(nn.functional.cross_entropy(layer(x), y), layer.weight)[0]
    xp, yp = torch.cat([x, torch.randn(3, 4)]), torch.cat([y, torch.full((3,), -100)])
    padded = torch.autograd.grad(nn.functional.cross_entropy(layer(xp), yp), layer.weight)[0]
    torch.testing.assert_close(padded, real)


def test_attributes_shared_stay_and_per_client_ones_are_stacked():
    anchor = [torch.ones(2)]
    attrs = [
        {"mu": 0.1, "anchor": anchor, "num_train": 10, "target": torch.zeros(3)},
        {"mu": 0.1, "anchor": anchor, "num_train": 20, "target": torch.ones(3)},
    ]
    shared, batched = split_attrs(attrs, torch.device("cpu"))
    assert shared == {"mu": 0.1, "anchor": anchor}
    assert batched["num_train"].tolist() == [10, 20]
    assert batched["target"].tolist() == [[0.0] * 3, [1.0] * 3]
    with pytest.raises(ConfigError, match="'target'"):
        split_attrs([{"target": torch.zeros(3)}, {"target": torch.zeros(4)}], "cpu")


def test_batchnorm_running_stats_are_refused():
    with pytest.raises(ConfigError, match="BatchNorm"):
        check_vmappable(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))


def test_stack_auto_is_vmap_on_cuda_or_static_shapes_and_loop_on_a_cpu():
    assert stack_form("auto", cuda=True, static_shapes=False) == "vmap"
    assert stack_form("auto", cuda=False, static_shapes=True) == "vmap"
    assert stack_form("auto", cuda=False, static_shapes=False) == "loop"
    assert stack_form("vmap", cuda=False, static_shapes=False) == "vmap"
    assert VectorizedExecutor(None, False, False, "cpu", "auto").stack == "loop"
    with pytest.raises(ConfigError, match="executor.stack: must be auto, vmap or loop"):
        VectorizedExecutor(None, False, False, "cpu", stack="grouped")
    with pytest.raises(ConfigError, match="need executor.stack=vmap"):
        VectorizedExecutor(None, True, False, "cpu", stack="loop")


def test_auto_is_sequential_on_cpu_and_vectorized_on_cuda():
    assert isinstance(AutoExecutor(device="cpu", chunk_size=None).inner, SequentialExecutor)
    assert isinstance(AutoExecutor(device="cuda", chunk_size=None).inner, VectorizedExecutor)


def test_auto_falls_back_to_sequential_for_modules_vmap_cannot_train():
    from fedexp.algorithms.fedavg import FedAvg
    from handworld import make_ctx, two_client_data

    def bn_model(input_shape=(2,), num_classes=2):
        return nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))

    algo = FedAvg(
        make_ctx(two_client_data(), factory=bn_model), "samples", 1.0, 0.0, **CONSTANT_SERVER_LR
    )
    auto = AutoExecutor(device="cuda", chunk_size=None)
    auto.check_algorithm(algo, 2)  # no error: BatchNorm statistics train sequentially
    assert isinstance(auto.inner, SequentialExecutor)
    plain = FedAvg(make_ctx(two_client_data()), "samples", 1.0, 0.0, **CONSTANT_SERVER_LR)
    auto = AutoExecutor(device="cuda", chunk_size=None)
    auto.check_algorithm(plain, 2)
    assert isinstance(auto.inner, VectorizedExecutor)
