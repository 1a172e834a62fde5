"""FedHeNN: exact reductions (eta = 0), the alignment term, K_bar, the ledger, validation."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from components import with_yaml
from conftest import smoke_experiment
from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.fedhenn import client_arch
from fedexp.algorithms.fedhenn_alignment import (
    AlignmentOptions,
    AlignmentUpload,
    AlignModule,
    AlignPayload,
    Rad,
    draw_rad,
)
from fedexp.core.algorithm import flat_params
from fedexp.core.client import ClientModule
from fedexp.core.client_store import ClientStore
from fedexp.core.executors import train_local
from fedexp.core.orchestrator import Orchestrator
from fedexp.core.seeding import CLIENT, INIT, client_generator, derive_seed, sample_clients
from fedexp.core.types import ClientResult, ConfigError, RoundContext, ServerState, Weights
from fedexp.loggers.base import Logger
from fedexp.metrics.cka import linear_kernel
from fedexp.models.family import cnn_family
from fedexp.models.mlp import mlp
from fedexp.run import Experiment
from handworld import client_cfg

FedAvg = with_yaml(FedAvg, "algorithm", "fedavg")
cnn_family = with_yaml(cnn_family, "model", "cnn_family")
mlp = with_yaml(mlp, "model", "mlp")

REPO = Path(__file__).resolve().parents[2]
HETERO = ("algorithm=fedhenn", "algorithm.variant=heterogeneous", "model=cnn_family")


experiment = smoke_experiment  # an in-process run of the real config at smoke size


class Capture(Logger):
    """A logger that keeps every evaluated round's metrics."""

    def __init__(self) -> None:
        self.rounds: list[dict] = []

    def log_metrics(self, metrics: dict, step: int) -> None:
        self.rounds.append(dict(metrics))


def run(exp: Experiment, algorithm=None) -> tuple[Orchestrator, Capture]:
    capture = Capture()
    orch = exp.orchestrator(algorithm, callbacks=[capture])
    orch.run()
    return orch, capture


def options(**changes) -> AlignmentOptions:
    base = AlignmentOptions("linear", 1.0, "cka", 0.1, "constant", 50, 2.0, 8, "noise", "uniform")
    return dataclasses.replace(base, **changes)


def test_eta_schedules_by_hand():
    assert options(eta_schedule="constant").eta(9) == pytest.approx(0.1)
    assert options(eta_schedule="linear").eta(9) == pytest.approx(0.9)
    assert options(eta_schedule="sqrt").eta(9) == pytest.approx(0.3)
    step = options(eta_schedule="step", eta_step_every=10, eta_step_gamma=3.0)
    assert [step.eta(t) for t in (1, 10, 11, 21)] == pytest.approx([0.1, 0.1, 0.3, 0.9])


def test_eta0_homogeneous_is_fedavg_exactly_on_the_same_data(tmp_path):
    # the default RAD (rad_source=train) takes nothing from the clients: the same client data
    henn = experiment(tmp_path, "algorithm=fedhenn", "algorithm.eta0=0")
    orch_henn, _ = run(henn)
    ctx = dataclasses.replace(henn.algorithm.ctx, store=ClientStore())
    orch_avg, _ = run(henn, FedAvg(ctx))
    assert torch.equal(orch_henn.state.params, orch_avg.state.params)
    for key, value in orch_avg.last_eval.items():
        if not key.startswith("time/"):
            assert orch_henn.last_eval[key] == value, key


def test_eta0_homogeneous_summary_equals_fedavg_summary(tmp_path):
    # on the defaults the whole pipeline, config to summary, is FedAvg's: the same client data
    # (the RAD takes nothing from the clients) and the same local training (FedHeNN's client
    # settings are the authors' SGD, so FedAvg is run with them: client=fedhenn)
    avg = experiment(tmp_path / "a", "algorithm=fedavg", "client=fedhenn").run([])
    henn = experiment(tmp_path / "h", "algorithm=fedhenn", "algorithm.eta0=0").run([])
    for key, value in avg.metrics.items():
        if not key.startswith("time/"):
            assert henn.metrics[key] == value, key
    assert "eval/personal/acc_mean" in henn.metrics


def test_rad_is_drawn_from_the_clients_training_inputs(tmp_path):
    exp = experiment(tmp_path, "algorithm=fedhenn")
    data, opts = exp.data, exp.algorithm.opts
    assert opts.rad_source == "train" and data.dataset.server_x is None  # nothing held back
    pool = data.x[data.train_pool()]
    rads = [draw_rad(opts, data, 0, t).x for t in (1, 2)]
    for rad in rads:
        assert rad.shape == (opts.rad_size, *data.input_shape)
        # every RAD input is one of the clients' training inputs
        match = (rad.flatten(1)[:, None, :] == pool.flatten(1)[None, :, :]).all(-1)
        assert bool(match.any(1).all())
    assert not torch.equal(rads[0], rads[1])  # re-drawn every round
    assert torch.equal(draw_rad(opts, data, 0, 1).x, rads[0])  # a function of (seed, round)


def test_homogeneous_alignment_changes_training_and_personal_models_are_kept(tmp_path):
    henn = experiment(tmp_path, "algorithm=fedhenn", "algorithm.eta0=1.0")
    orch, capture = run(henn)
    ctx = dataclasses.replace(henn.algorithm.ctx, store=ClientStore())
    orch_avg, _ = run(henn, FedAvg(ctx))
    assert not torch.equal(orch.state.params, orch_avg.state.params)
    assert capture.rounds[-1]["fedhenn/eta"] == pytest.approx(math.sqrt(2))
    trained = set(sample_clients(0, 1, 6, 3)) | set(sample_clients(0, 2, 6, 3))
    assert set(henn.algorithm.store.state_dict()) == trained
    # down: weights + the L RAD inputs (8 x 8 floats each; debug=smoke: L = 8) per client;
    # up: weight deltas
    params, rad = orch.state.params.numel(), henn.algorithm.opts.rad_size
    assert rad == 8
    assert capture.rounds[0]["comm/down_bits"] == 3 * (params * 32 + rad * 64 * 32)
    assert capture.rounds[0]["comm/up_bits"] == 3 * params * 32


@pytest.mark.parametrize("changes", [("kernel=rbf", "eta_schedule=step"), ("distance=procrustes",)])
def test_homogeneous_variants_run(tmp_path, changes):
    exp = experiment(tmp_path, "algorithm=fedhenn", *(f"algorithm.{c}" for c in changes))
    orch, _ = run(exp)
    assert orch.last_eval["eval/global/acc"] > 0.1  # better than chance over 10 classes
    assert orch.last_eval["eval/personal/acc_mean"] > 0.1


def local_training_replica(exp: Experiment, client_id: int) -> torch.Tensor:
    """Client `client_id` trained alone: its own initial model, its rounds, plain task loss."""
    cfg, factory = exp.cfg, exp.algorithm.ctx.model_factory
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(cfg.seed, INIT, client_id))
        model = factory(arch=client_arch(cfg.seed, client_id, 5))
    module = ClientModule(model, exp.client)
    for t in range(1, cfg.rounds + 1):
        if client_id in sample_clients(cfg.seed, t, cfg.num_clients, cfg.clients_per_round):
            torch.manual_seed(derive_seed(cfg.seed, CLIENT, t, client_id, 1))
            x, y = exp.data.train(client_id)
            generator = client_generator(cfg.seed, t, client_id)
            train_local(module, x, y, cfg.client.batch_size, generator)
    return flat_params(list(model.parameters()))


def test_eta0_heterogeneous_is_isolated_local_training(tmp_path):
    exp = experiment(tmp_path, *HETERO, "algorithm.eta0=0")
    orch, capture = run(exp)
    for c in range(exp.cfg.num_clients):  # client 3 is never sampled: its initial model
        assert torch.equal(exp.algorithm.client_params(c), local_training_replica(exp, c)), c
    assert orch.totals == {"comm/up_bits_total": 0, "comm/down_bits_total": 0}
    assert len(orch.client_accs["personal"]) == 6 and "eval/global/acc" not in orch.last_eval


def test_heterogeneous_alignment_starts_in_round_two_and_is_counted(tmp_path):
    plain = experiment(tmp_path / "p", *HETERO, "algorithm.eta0=0")
    run(plain)
    exp = experiment(tmp_path / "a", *HETERO, "algorithm.eta0=1.0")
    orch, capture = run(exp)
    round1, round2 = sample_clients(0, 1, 6, 3), sample_clients(0, 2, 6, 3)
    assert (round1, round2) == ((0, 1, 2), (0, 2, 4))

    def same(c: int) -> bool:
        return torch.equal(exp.algorithm.client_params(c), plain.algorithm.client_params(c))

    assert same(1) and same(3) and same(5)  # round 1 has no K_bar yet; 3, 5 never trained
    assert not same(0) and not same(2) and not same(4)  # aligned to K_bar(1) in round 2
    # round 1: the L probe inputs (8 x 8 floats) down; representations (L x d_j) or
    # kernels (d_j > L) up
    widths = [
        exp.algorithm.modules[exp.algorithm.archs[c]].model.body(exp.data.x[:2]).shape[1]
        for c in round1
    ]
    first, second = capture.rounds
    L = exp.algorithm.opts.rad_size
    assert first["comm/down_bits"] == 3 * L * 64 * 32
    assert first["comm/up_bits"] == sum(L * min(d, L) * 32 for d in widths)
    # round 2: RAD + probe inputs and the L x L K_bar
    assert second["comm/down_bits"] == 3 * (2 * L * 64 * 32 + L * L * 32)


def test_kernel_bar_is_the_weighted_mean_of_client_kernels(tmp_path):
    exp = experiment(tmp_path, *HETERO, "algorithm.kernel_weighting=samples")
    algorithm = exp.algorithm
    reps_a, reps_b = torch.arange(6.0).view(3, 2), torch.tensor([[1.0], [0.0], [2.0]])
    results = [
        ClientResult(0, 10, AlignmentUpload(reps_a, False), 0.0, 1),
        ClientResult(1, 30, AlignmentUpload(linear_kernel(reps_b), True), 0.0, 1),
    ]
    state, _ = algorithm.aggregate(ServerState(), results, RoundContext(4, (0, 1), 0))
    expected = (10 * reps_a @ reps_a.T + 30 * reps_b @ reps_b.T) / 40
    torch.testing.assert_close(state.buffers["kernel"], expected)
    assert state.buffers["kernel_round"] == 5


@pytest.mark.parametrize(
    ("target_is_kernel", "changes"),
    [
        (False, {}),
        (False, {"kernel": "rbf"}),
        (False, {"distance": "procrustes"}),
        (True, {}),
        (True, {"kernel": "rbf"}),
    ],
)
def test_alignment_gradient_is_finite(target_is_kernel, changes):
    torch.manual_seed(0)
    opts = options(**changes)
    model = cnn_family((1, 8, 8), 10, arch=2) if target_is_kernel else mlp((1, 8, 8), 10)
    module = AlignModule(model, client_cfg(), opts, target_is_kernel)
    rad = Rad(torch.randn(8, 1, 8, 8), 64)
    target_reps = torch.randn(8, 5)
    if target_is_kernel or opts.kernel == "rbf":
        from fedexp.metrics.cka import kernel_matrix

        target = kernel_matrix(target_reps, opts.kernel)
    else:
        target = target_reps
    module.set_alignment(0.5, rad, target)
    module.alignment_distance().backward()
    grads = [p.grad for p in model.body.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum() for g in grads) > 0
    module.set_alignment(0.0, rad, target)  # eta = 0 switches the term off entirely
    assert module.rad is None


def test_message_bits_by_hand():
    assert Rad(torch.zeros(5, 3), 5 * 32).num_bits() == 160
    payload = AlignPayload(0.1, weights=torch.zeros(7), rad=Rad(torch.zeros(5, 3), 160))
    assert payload.num_bits() == 7 * 32 + 160
    derived = AlignPayload(0.1, rad=Rad(torch.zeros(5, 3), 64), target=torch.zeros(5, 5))
    assert derived.num_bits() == 64  # the homogeneous target is derived by the client
    sent = dataclasses.replace(derived, target_sent=True, probe=Rad(torch.zeros(5, 3), 64))
    assert sent.num_bits() == 64 + 64 + 25 * 32
    assert AlignmentUpload(torch.zeros(5, 4), False).num_bits() == 20 * 32
    assert Weights(torch.zeros(3)).num_bits() == AlignPayload(0.0, torch.zeros(3)).num_bits()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("algorithm=fedhenn", "model=cnn_family"), "model: algorithm.variant=homogeneous"),
        (
            (
                "algorithm=fedhenn",
                "algorithm.variant=heterogeneous",
                "algorithm.default_family=nope",
            ),
            "algorithm.default_family",
        ),
        ((*HETERO, "algorithm.distance=procrustes"), "algorithm.distance"),
        (("algorithm=fedhenn", "algorithm.rad_size=100000"), "algorithm.rad_size"),
        (
            ("algorithm=fedhenn", "algorithm.rad_source=holdout", "algorithm.rad_size=300"),
            "algorithm.server_pool",
        ),
        (("algorithm=fedhenn", "algorithm.kernel=cosine"), "algorithm.kernel"),
        (("algorithm=fedhenn", "algorithm.eta_schedule=cosine"), "algorithm.eta_schedule"),
        (("algorithm=fedhenn", "algorithm.variant=both"), "algorithm.variant"),
    ],
)
def test_bad_configs_are_config_errors(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        experiment(tmp_path, *overrides)


def test_heterogeneous_on_a_single_model_draws_from_the_default_family(tmp_path):
    algo = experiment(tmp_path, "algorithm=fedhenn", "algorithm.variant=heterogeneous").algorithm
    assert algo.num_archs == 5


def test_eavesdroppers_rebuild_the_homogeneous_local_model_and_nothing_heterogeneous(tmp_path):
    for overrides, rebuilds in ((("algorithm=fedhenn",), True), (HETERO, False)):
        exp = experiment(tmp_path / str(rebuilds), *overrides)
        algorithm = exp.algorithm
        state = algorithm.init_state()
        ctx = RoundContext(1, (0,), exp.cfg.seed)
        payloads = algorithm.configure_round(state, ctx)
        (result,) = exp.executor.run(algorithm, payloads, ctx, exp.data)
        rebuilt = algorithm.eavesdropped_model(payloads[0], result.upload)
        if rebuilds:  # the local model the client keeps, up to (w + delta) - w rounding
            local = algorithm.store.get(0)
            assert torch.allclose(flat_params(list(rebuilt.parameters())), local, atol=1e-6)
        else:
            assert rebuilt is None
