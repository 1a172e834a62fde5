"""FedHeNN's alignment, measured: the distance and the gradient ratio by hand, measuring leaves
training alone, the metrics in metrics.jsonl under every executor; `align_layer`."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from conftest import smoke_experiment
from fedexp.algorithms import fedhenn_alignment
from fedexp.algorithms.fedhenn_alignment import (
    AlignmentOptions,
    AlignModule,
    AlignPayload,
    ClientWeights,
    Rad,
    alignment_start,
)
from fedexp.algorithms.fedhenn_measures import MEASURE_STREAM, AlignmentMeter
from fedexp.core.callbacks import RoundFunction
from fedexp.core.client_loop import module_rows, training_facts
from fedexp.core.cohort import CohortTraining
from fedexp.core.flat import flat_params, load_flat, named_views
from fedexp.core.seeding import derive_seed
from fedexp.core.types import ConfigError, RoundContext
from fedexp.metrics.cka import linear_cka, linear_kernel
from fedexp.models.mlp import BodyHead
from handworld import UNTRAINED, client_cfg

HETERO = ("algorithm=fedhenn", "algorithm.variant=heterogeneous", "model=cnn_family")
NAMES = (
    "fedhenn/align_dist_first",
    "fedhenn/align_dist_last",
    "fedhenn/grad_ratio_first",
    "fedhenn/grad_ratio",
)
# four RAD inputs whose identity-body representations are A; B keeps A's first column only:
# A^T A = 2 I, B^T B = 2, A^T B = (2, 0), so linear CKA = 4 / (2 sqrt(2) * 2) = 1 / sqrt(2)
A = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
B = A[:, :1].clone()


def options(**changes) -> AlignmentOptions:
    base = dict(
        kernel="linear",
        rbf_sigma=1.0,
        distance="cka",
        eta0=0.5,
        eta_schedule="constant",
        eta_step_every=50,
        eta_step_gamma=2.0,
        rad_size=4,
        rad_source="noise",
        kernel_weighting="uniform",
        upload="weights",
        align_layer="body",
    )
    return AlignmentOptions(**{**base, **changes})


def identity_model() -> BodyHead:
    """body: x -> x (2 -> 2, no bias); head: a 2 -> 3 linear layer."""
    torch.manual_seed(0)
    body = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        body.weight.copy_(torch.eye(2))
    return BodyHead(body, nn.Linear(2, 3))


def module_with_data(model: nn.Module, **changes) -> AlignModule:
    module = AlignModule(model, client_cfg(), options(**changes), target_is_kernel=False)
    x = torch.tensor([[1.0, 2.0], [0.5, -1.0], [-2.0, 0.0]])
    module.set_local_data((x, torch.tensor([0, 1, 2])))
    return module


def measure(module: AlignModule, payload: AlignPayload, client: int = 0) -> list[float]:
    """[d first, d last, ratio first, ratio last] of one client that started from the model it
    holds and trained nothing (a cohort of one, as `end` measures it)."""
    meter = AlignmentMeter(0, torch.device("cpu"))
    module.set_alignment(payload.eta, payload.rad, payload.target)
    facts = training_facts(client, UNTRAINED, *module.local_data)
    params = list(module.model.parameters())
    start = (params, flat_params(params))
    (values,) = meter.end(module, [payload], module_rows(module), facts, start).values
    return values.tolist()


def test_distance_by_hand_and_zero_for_identical_representations():
    module = module_with_data(identity_model())
    rad = Rad(A, 0)
    first, last, _, _ = measure(module, AlignPayload(0.5, rad=rad, target=B, round_idx=2))
    assert first == last == pytest.approx(1 - 1 / math.sqrt(2), abs=1e-6)
    same, _, _, _ = measure(module, AlignPayload(0.5, rad=rad, target=A, round_idx=2))
    assert same == pytest.approx(0.0, abs=1e-6)  # CKA(A, A) = 1


def test_ratio_is_eta_times_the_gradient_norms_and_0_at_eta_0():
    model = identity_model()
    module = module_with_data(model)
    rad = Rad(A, 0)
    _, _, ratio, _ = measure(module, AlignPayload(0.5, rad=rad, target=B, round_idx=2))
    # the same quantity by direct autograd: eta ||grad d|| / ||grad CE over all the data||
    params = list(model.parameters())
    align = torch.autograd.grad(1 - linear_cka(model.body(A), B), params, allow_unused=True)
    x, y = module.local_data
    task = torch.autograd.grad(nn.functional.cross_entropy(model(x), y), params)

    def norm(grads):
        return math.sqrt(sum(float((g**2).sum()) for g in grads if g is not None))

    assert ratio == pytest.approx(0.5 * norm(align) / norm(task), rel=1e-5)
    assert ratio > 0
    # eta = 0 (homogeneous: the RAD measured on is not sent): the distance, and a ratio of 0
    payload = AlignPayload(0.0, round_idx=1, measure_on=(rad, B))
    first, last, ratio_first, ratio_last = measure(module, payload)
    assert first == pytest.approx(1 - 1 / math.sqrt(2), abs=1e-6)
    assert ratio_first == ratio_last == 0.0
    # no target at all (heterogeneous round 1): no distance (NaN, left out), a ratio of 0
    first, _, ratio_first, _ = measure(module, AlignPayload(1.0, round_idx=1))
    assert math.isnan(first) and ratio_first == 0.0


def test_measuring_leaves_the_model_rng_flags_and_log_capture_as_they_were():
    torch.manual_seed(0)
    body = nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Dropout(0.5))
    model = BodyHead(body, nn.Linear(4, 3)).eval()
    module = module_with_data(model)
    frozen = model.head.bias
    frozen.requires_grad_(False)
    module.log_capture.log("mine", 1.0)
    rad = Rad(torch.randn(6, 2), 0)
    payload = AlignPayload(0.5, rad=rad, target=torch.randn(6, 3), round_idx=3)
    params = [p.detach().clone() for p in model.parameters()]
    buffers = [b.clone() for b in model.buffers()]
    rng = torch.get_rng_state()
    values = measure(module, payload)
    assert all(math.isfinite(v) for v in values)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers()))  # running stats
    assert not any(m.training for m in model.modules())
    assert not frozen.requires_grad and all(p.grad is None for p in model.parameters())
    assert set(module.log_capture.take_step()) == {"mine"}
    assert measure(module, payload) == values  # dropout drawn from (seed, round, client)


def test_a_cohort_is_measured_client_by_client_from_its_start_and_the_module_kept():
    torch.manual_seed(0)
    model = BodyHead(nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Dropout(0.3)), nn.Linear(4, 3))
    module = module_with_data(model)
    payload = AlignPayload(0.5, rad=Rad(A, 0), target=B, round_idx=2)
    module.set_alignment(payload.eta, payload.rad, payload.target)
    params = list(model.parameters())
    held = flat_params(params)
    g = torch.Generator().manual_seed(1)
    trained, starts = (held + 0.3 * torch.randn(2, len(held), generator=g) for _ in range(2))
    data = [module.local_data, (torch.randn(4, 2, generator=g), torch.tensor([0, 1, 2, 0]))]
    facts = CohortTraining([3, 5], [3, 4], [1, 1], torch.zeros(2), (0.1,), data)
    meter = AlignmentMeter(0, torch.device("cpu"))
    stacked = named_views(trained, module, params)
    rng = torch.get_rng_state()
    both = meter.end(module, [payload] * 2, stacked, facts, (params, starts)).values
    assert torch.equal(flat_params(params), held)  # the module as it was
    assert torch.equal(torch.get_rng_state(), rng)
    assert both.shape == (2, 4) and bool(torch.isfinite(both).all())
    for i, cid in enumerate((3, 5)):
        # the same client alone (the sequential executor: its trained row in the module)
        load_flat(params, trained[i])
        one = CohortTraining([cid], [len(data[i][1])], [1], torch.zeros(1), (0.1,), [data[i]])
        alone = meter.end(module, [payload], module_rows(module), one, (params, starts[i]))
        assert torch.equal(alone.values[0], both[i])
        assert torch.equal(flat_params(params), trained[i])  # its trained row kept
        # `first` is the distance at its start, `last` at its trained weights (training mode)
        for value, weights, which in ((both[i, 0], starts[i], 0), (both[i, 1], trained[i], 1)):
            load_flat(params, weights)
            with torch.random.fork_rng(), torch.no_grad():
                torch.manual_seed(derive_seed(0, MEASURE_STREAM, 2, cid, which))
                direct = 1 - linear_cka(model.train().body(A), B)
            assert float(value) == pytest.approx(float(direct), abs=1e-6)


def test_a_cohort_with_different_alignments_stacks_them():
    rad, other = Rad(A, 0), Rad(-A, 0)
    payloads = [AlignPayload(0.5, rad=rad, target=B), AlignPayload(0.5, rad=rad, target=B)]
    shared, attrs = alignment_start(payloads)
    assert attrs == {} and shared["eta"] == 0.5 and shared["rad"] is A and shared["target"] is B
    payloads[1] = AlignPayload(0.25, rad=other, target=B)
    shared, attrs = alignment_start(payloads)
    assert shared == {} and attrs["eta"].tolist() == [0.5, 0.25]
    assert torch.equal(attrs["rad"], torch.stack([A, -A])) and attrs["target"].shape == (2, 4, 1)
    off = AlignPayload(0.0, rad=rad, target=B)  # eta = 0: the term is off
    assert alignment_start([off]) == ({"eta": 0.0, "rad": None, "target": None}, {})
    with pytest.raises(ValueError, match="with and without"):
        alignment_start([payloads[0], off])


@pytest.mark.parametrize("layer", ["body", "output"])
def test_align_layer_picks_what_the_distance_sees(monkeypatch, layer):
    seen = []

    def recording(a, b):
        seen.append(a.detach().clone())
        return linear_cka(a, b)

    monkeypatch.setattr(fedhenn_alignment, "linear_cka", recording)
    model = identity_model()
    module = module_with_data(model, align_layer=layer)
    x = torch.randn(5, 2)
    module.set_alignment(0.5, Rad(x, 0), torch.randn(5, 3))
    module.alignment_distance()
    direct = model(x) if layer == "output" else model.body(x)
    assert seen[0].shape == direct.shape == ((5, 3) if layer == "output" else (5, 2))
    assert torch.equal(seen[0], direct)


@pytest.mark.experiment
def test_align_layer_output_sets_the_targets_and_kernels_from_the_logits(tmp_path):
    exp = smoke_experiment(tmp_path / "h", "algorithm=fedhenn", "algorithm.align_layer=output")
    algorithm, state = exp.algorithm, exp.algorithm.init_state()
    payload = algorithm.configure_round(state, RoundContext(2, (0,), 0))[0]
    model = algorithm.global_model(state).eval()
    with torch.no_grad():
        assert torch.equal(payload.target, model(payload.rad.x))  # the global model's logits
    exp = smoke_experiment(tmp_path / "x", *HETERO, "algorithm.align_layer=output")
    algorithm = exp.algorithm
    arch = algorithm.archs[0]
    params = algorithm.initial_params(0)
    probe = algorithm.probe(1)
    kernel = algorithm.client_kernel(ClientWeights(params, arch), probe)
    model = algorithm.modules[arch].model
    load_flat(list(model.parameters()), params)
    with torch.no_grad():
        torch.testing.assert_close(kernel, linear_kernel(model.eval()(probe.x)))


@pytest.mark.experiment
def test_a_bad_align_layer_is_a_one_line_config_error(tmp_path):
    with pytest.raises(ConfigError, match="algorithm.align_layer") as err:
        smoke_experiment(tmp_path, "algorithm=fedhenn", "algorithm.align_layer=logits")
    assert "\n" not in str(err.value) and "'logits'" in str(err.value)


def jsonl(exp) -> list[dict]:
    exp.run([])
    return [json.loads(line) for line in (exp.run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.experiment
def test_the_metrics_are_in_metrics_jsonl(tmp_path):
    # homogeneous: round 1 (eta = 0) is measured on a RAD that is not sent; the client starts
    # from the global model, which gave the target: d = 0 at its first step
    first, second = jsonl(smoke_experiment(tmp_path / "h", "algorithm=fedhenn"))
    assert first["fedhenn/eta"] == 0 and second["fedhenn/eta"] > 0
    for line in (first, second):
        assert set(NAMES) <= line.keys()
        assert line["fedhenn/align_dist_first"] == pytest.approx(0.0, abs=1e-6)
        assert line["fedhenn/align_dist_last"] > 1e-4  # local training moved the geometry
    assert first["fedhenn/grad_ratio"] == first["fedhenn/grad_ratio_first"] == 0.0
    assert second["fedhenn/grad_ratio"] > 0
    # heterogeneous: round 1 has no target, so no distance (absent, not 0) and a ratio of 0
    first, second = jsonl(smoke_experiment(tmp_path / "x", *HETERO))
    assert "fedhenn/align_dist_first" not in first and "fedhenn/align_dist_last" not in first
    assert first["fedhenn/grad_ratio"] == 0.0
    assert set(NAMES) <= second.keys() and second["fedhenn/align_dist_first"] > 0


def rounds_of(exp) -> list[dict]:
    """Every round's metrics."""
    rounds: list[dict] = []
    exp.orchestrator(callbacks=[RoundFunction(lambda t, m: rounds.append(dict(m)))]).run()
    return rounds


# unequal client sizes and short last batches (tests/engine/executors/test_vectorized.py's TINY)
TINY = ("partition=dirichlet", "partition.min_size=5", "client.batch_size=16", "rounds=3")


@pytest.mark.experiment
@pytest.mark.parametrize("variant", [("algorithm=fedhenn",), HETERO], ids=["homo", "hetero"])
def test_the_executors_measure_alike(tmp_path, variant):
    runs = {}
    for executor in ("sequential", "vmap", "loop"):
        chosen = (
            ("executor=sequential",)
            if executor == "sequential"
            else ("executor=vectorized", f"executor.stack={executor}")
        )
        exp = smoke_experiment(tmp_path / executor, *variant, *TINY, "algorithm.eta0=1", *chosen)
        runs[executor] = rounds_of(exp)
    for executor in ("vmap", "loop"):
        for seq, vec in zip(runs["sequential"], runs[executor]):
            measured = {k: v for k, v in seq.items() if k.startswith("fedhenn/")}
            assert measured.keys() == {k for k in vec if k.startswith("fedhenn/")}
            for key, value in measured.items():
                assert vec[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (executor, key)
    assert set(NAMES) <= runs["sequential"][-1].keys()


@pytest.mark.experiment
@pytest.mark.parametrize("variant", [("algorithm=fedhenn",), HETERO], ids=["homo", "hetero"])
def test_measuring_changes_no_training(tmp_path, monkeypatch, variant):
    def trained(path) -> list[torch.Tensor]:
        """Every client's personal model (homogeneous: also the global one)."""
        exp = smoke_experiment(path, *variant, "algorithm.eta0=1", "rounds=3")
        orch = exp.orchestrator()
        orch.run()
        algorithm, clients = exp.algorithm, range(exp.cfg.num_clients)
        models = [algorithm.personal_model(orch.state, c) for c in clients]
        out = [flat_params(list(m.parameters())).clone() for m in models]
        return out if orch.state.params is None else [orch.state.params, *out]

    measured = trained(tmp_path / "m")
    with monkeypatch.context() as patch:
        patch.setattr(AlignmentMeter, "end", lambda *args: None)
        unmeasured = trained(tmp_path / "u")
    assert all(torch.equal(a, b) for a, b in zip(measured, unmeasured, strict=True))
