"""FedHeNN: exact reductions (eta = 0), the RAD's source, eta(t), the alignment term, K_bar, the
two uploads (weights, representations), the ledger, validation."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from components import with_yaml
from conftest import smoke_experiment
from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.fedhenn_alignment import (
    AlignmentOptions,
    AlignmentUpload,
    AlignModule,
    AlignPayload,
    ClientWeights,
    Rad,
    draw_rad,
)
from fedexp.core.client import ClientModule
from fedexp.core.client_loop import train_local
from fedexp.core.client_store import ClientStore
from fedexp.core.cohort import CohortTraining, unstack
from fedexp.core.flat import flat_params
from fedexp.core.seeding import (
    CLIENT,
    INIT,
    client_arch,
    client_generator,
    derive_seed,
    sample_clients,
)
from fedexp.core.types import ClientResult, ConfigError, RoundContext, ServerState, Weights
from fedexp.engine.orchestrator import Orchestrator
from fedexp.loggers.base import Logger
from fedexp.metrics.cka import linear_kernel
from fedexp.models.family import cnn_family
from fedexp.models.mlp import mlp
from fedexp.models.running_stats import state_of_rows
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
    base = AlignmentOptions(
        "linear", 1.0, "cka", 0.1, "constant", 50, 2.0, 8, "noise", "uniform", "weights", "body"
    )
    return dataclasses.replace(base, **changes)


def test_eta_schedules_by_hand():
    # the authors' code: eta = eta0 * sqrt(iter), iter = 0, 1, ...; round t is iter t - 1
    rounds = (1, 2, 3, 5, 10)
    sqrt = options(eta_schedule="sqrt")
    assert [sqrt.eta(t) for t in rounds] == pytest.approx([0, 0.1, 0.1 * 2**0.5, 0.2, 0.3])
    linear = options(eta_schedule="linear")
    assert [linear.eta(t) for t in rounds] == pytest.approx([0, 0.1, 0.2, 0.4, 0.9])
    constant = options(eta_schedule="constant")
    assert [constant.eta(t) for t in rounds] == pytest.approx([0.1] * 5)
    step = options(eta_schedule="step", eta_step_every=10, eta_step_gamma=3.0)
    assert [step.eta(t) for t in (1, 10, 11, 21)] == pytest.approx([0.1, 0.1, 0.3, 0.9])


@pytest.mark.experiment
def test_eta0_homogeneous_is_fedavg_exactly_on_the_same_data(tmp_path):
    henn = experiment(tmp_path, "algorithm=fedhenn", "algorithm.eta0=0")
    orch_henn, _ = run(henn)
    ctx = dataclasses.replace(henn.algorithm.ctx, store=ClientStore())
    orch_avg, _ = run(henn, FedAvg(ctx))
    assert torch.equal(orch_henn.state.params, orch_avg.state.params)
    for key, value in orch_avg.last_eval.items():
        if not key.startswith("time/"):
            assert orch_henn.last_eval[key] == value, key


@pytest.mark.experiment
def test_eta0_homogeneous_is_fedavg_exactly_on_the_default_config_with_the_pool(tmp_path):
    # a comparison sets one integer server pool for every algorithm (`auto` sets it aside only
    # for FedHeNN), so FedAvg, built from its own config, sees the clients' data FedHeNN sees;
    # with FedHeNN's client settings (the authors' SGD: client=fedhenn) the whole pipeline,
    # config to trained weights and summary, is FedAvg's
    pool_of_16 = "partition.server_pool=16"  # what auto gives FedHeNN here (2 x rad_size 8)
    avg = experiment(tmp_path / "a", "algorithm=fedavg", "client=fedhenn", pool_of_16)
    henn = experiment(tmp_path / "h", "algorithm=fedhenn", "algorithm.eta0=0", pool_of_16)
    pool = henn.data.server_x
    assert pool is not None and len(pool) == henn.cfg.partition.server_pool > 0
    assert torch.equal(avg.data.server_x, pool) and torch.equal(avg.data.x, henn.data.x)
    orch_avg, _ = run(avg)
    orch_henn, _ = run(henn)
    assert torch.equal(orch_henn.state.params, orch_avg.state.params)
    avg_summary = experiment(tmp_path / "a2", "algorithm=fedavg", "client=fedhenn", pool_of_16).run(
        []
    )
    henn_summary = experiment(
        tmp_path / "h2", "algorithm=fedhenn", "algorithm.eta0=0", pool_of_16
    ).run([])
    for key, value in avg_summary.metrics.items():
        if not key.startswith("time/"):
            assert henn_summary.metrics[key] == value, key
    assert "eval/personal/acc_mean" in henn_summary.metrics


def rows_in(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """For each row of x: whether it equals one of `rows`."""
    return (x.flatten(1)[:, None, :] == rows.flatten(1)[None, :, :]).all(-1).any(1)


@pytest.mark.experiment
def test_rad_is_drawn_each_round_from_the_server_pool(tmp_path):
    exp = experiment(tmp_path, "algorithm=fedhenn")
    data, opts = exp.data, exp.algorithm.opts
    assert opts.rad_source == "server"
    rads = [draw_rad(opts, data, 0, t) for t in (1, 2)]
    for rad in rads:
        assert rad.x.shape == (opts.rad_size, *data.input_shape)
        assert bool(rows_in(rad.x, data.server_x).all())  # every input from the pool
        assert rad.num_bits() == rad.x.numel() * 32  # the server sends the instances
    assert not torch.equal(rads[0].x, rads[1].x)  # re-drawn every round
    assert torch.equal(draw_rad(opts, data, 0, 1).x, rads[0].x)  # a function of (seed, round)


@pytest.mark.experiment
def test_rad_source_train_draws_the_clients_inputs_and_says_so(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="fedexp.algorithms.fedhenn"):
        exp = experiment(tmp_path, "algorithm=fedhenn", "algorithm.rad_source=train")
    assert "clients' raw training inputs" in caplog.text
    data, opts = exp.data, exp.algorithm.opts
    rad = draw_rad(opts, data, 0, 1).x
    assert bool(rows_in(rad, data.x[data.train_pool()]).all())  # the clients' own inputs


@pytest.mark.experiment
def test_homogeneous_alignment_changes_training_and_personal_models_are_kept(tmp_path):
    henn = experiment(tmp_path, "algorithm=fedhenn", "algorithm.eta0=1.0")
    orch, capture = run(henn)
    ctx = dataclasses.replace(henn.algorithm.ctx, store=ClientStore())
    orch_avg, _ = run(henn, FedAvg(ctx))
    assert not torch.equal(orch.state.params, orch_avg.state.params)
    # eta0 * sqrt(t - 1): no alignment in round 1, eta0 in round 2
    assert [r["fedhenn/eta"] for r in capture.rounds] == [0.0, 1.0]
    trained = set(sample_clients(0, 1, 6, 3)) | set(sample_clients(0, 2, 6, 3))
    assert set(henn.algorithm.store.state_dict()) == trained
    # down: weights, and from round 2 the L RAD inputs (8 x 8 floats each; debug=smoke: L = 8)
    # per client; up: weight deltas
    params, rad = orch.state.params.numel(), henn.algorithm.opts.rad_size
    assert rad == 8
    assert capture.rounds[0]["comm/down_bits"] == 3 * params * 32  # FedAvg's
    assert capture.rounds[1]["comm/down_bits"] == 3 * (params * 32 + rad * 64 * 32)
    assert capture.rounds[0]["comm/up_bits"] == 3 * params * 32


@pytest.mark.experiment
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


@pytest.mark.experiment
@pytest.mark.parametrize(
    "overrides",
    [("algorithm=fedhenn",), (*HETERO, "algorithm.upload=representations")],
    ids=["homo", "hetero"],
)
def test_begin_is_a_value_and_end_stores_and_uploads_a_cohort_stacked(tmp_path, overrides):
    exp = experiment(tmp_path, *overrides, "algorithm.eta0=1")
    algorithm, state = exp.algorithm, exp.algorithm.init_state()
    archs = getattr(algorithm, "archs", [0] * exp.cfg.num_clients)
    ids = [c for c in range(len(archs)) if archs[c] == archs[0]][:2]  # one module's cohort
    payloads = list(algorithm.configure_round(state, RoundContext(2, tuple(ids), 0)).values())
    module = algorithm.client_module(ids[0])
    held = [t.detach().clone() for t in [*module.parameters(), *module.buffers()]]
    rng = torch.get_rng_state()
    start = algorithm.begin(module, ids, payloads, algorithm.broadcast_stats(state))
    assert torch.equal(torch.get_rng_state(), rng)  # a value: nothing drawn, nothing written
    assert all(torch.equal(a, b) for a, b in zip(held, [*module.parameters(), *module.buffers()]))
    names = dict([*module.named_parameters(), *module.named_buffers()])
    assert start.params.keys() == names.keys() and set(start.shared) == {"eta", "rad", "target"}
    assert all(start.params[n].shape == (2, *t.shape) for n, t in names.items())
    g = torch.Generator().manual_seed(0)
    trained = {n: t + 0.01 * torch.randn(t.shape, generator=g) for n, t in start.params.items()}
    trained.update({n: start.params[n] for n, _ in module.named_buffers()})
    data = [exp.data.train(c) for c in ids]
    facts = CohortTraining(ids, [len(y) for _, y in data], [1, 1], torch.zeros(2), (0.1,), data)
    upload = algorithm.end(module, payloads, trained, facts)
    assert all(torch.equal(a, b) for a, b in zip(held, [*module.parameters(), *module.buffers()]))
    assert upload.values.shape[0] == 2 and upload.measured.values.shape == (2, 4)
    if payloads[0].weights is not None:  # homogeneous: `model_state` of the trained model
        rows = state_of_rows(module.model, trained, "model.")
    else:  # heterogeneous: the flat weights
        rows = torch.cat([trained[n].flatten(1) for n, _ in module.named_parameters()], 1)
    for i, c in enumerate(ids):
        assert torch.equal(algorithm.store.get(c), rows[i])
        measured = unstack(upload, i).measured.values
        torch.testing.assert_close(
            measured, upload.measured.values[i], rtol=0, atol=0, equal_nan=True
        )


@pytest.mark.experiment
def test_eta0_heterogeneous_is_isolated_local_training(tmp_path):
    exp = experiment(tmp_path, *HETERO, "algorithm.eta0=0")
    orch, capture = run(exp)
    for c in range(exp.cfg.num_clients):  # client 3 is never sampled: its initial model
        assert torch.equal(exp.algorithm.client_params(c), local_training_replica(exp, c)), c
    assert orch.totals == {"comm/up_bits_total": 0, "comm/down_bits_total": 0}
    assert len(orch.client_accs["personal"]) == 6 and "eval/global/acc" not in orch.last_eval


@pytest.mark.experiment
@pytest.mark.parametrize("upload", ["weights", "representations"])
def test_heterogeneous_alignment_starts_in_round_two_and_is_counted(tmp_path, upload):
    plain = experiment(tmp_path / "p", *HETERO, "algorithm.eta0=0")
    run(plain)
    exp = experiment(tmp_path / "a", *HETERO, "algorithm.eta0=1.0", f"algorithm.upload={upload}")
    orch, capture = run(exp)
    round1, round2 = sample_clients(0, 1, 6, 3), sample_clients(0, 2, 6, 3)
    assert (round1, round2) == ((0, 1, 2), (0, 2, 4))

    def same(c: int) -> bool:
        return torch.equal(exp.algorithm.client_params(c), plain.algorithm.client_params(c))

    assert same(1) and same(3) and same(5)  # round 1 has no K_bar yet; 3, 5 never trained
    assert not same(0) and not same(2) and not same(4)  # aligned to K_bar(1) in round 2
    first, second = capture.rounds
    L, algorithm = exp.algorithm.opts.rad_size, exp.algorithm
    modules = [algorithm.modules[algorithm.archs[c]].model for c in round1]
    if upload == "weights":
        # round 1: nothing down (no K_bar yet); each client's weights up
        assert first["comm/down_bits"] == 0
        assert first["comm/up_bits"] == sum(
            32 * sum(p.numel() for p in m.parameters()) for m in modules
        )
        # round 2: the L RAD inputs (8 x 8 floats) and the L x L K_bar
        assert second["comm/down_bits"] == 3 * (L * 64 * 32 + L * L * 32)
    else:
        # round 1: the L probe inputs down; representations (L x d_j) or kernels (d_j > L) up
        widths = [m.body(exp.data.x[:2]).shape[1] for m in modules]
        assert first["comm/down_bits"] == 3 * L * 64 * 32
        assert first["comm/up_bits"] == sum(L * min(d, L) * 32 for d in widths)
        # round 2: RAD + probe inputs and the L x L K_bar
        assert second["comm/down_bits"] == 3 * (2 * L * 64 * 32 + L * L * 32)


@pytest.mark.experiment
def test_uploading_weights_or_representations_trains_the_same_models(tmp_path):
    # the server runs each uploaded model on the RAD exactly as a client computes its upload
    # (the same module, weights and inputs, the same operations in the same order), so K_bar
    # and every model trained against it are bit-identical, not merely close
    runs = {}
    for upload in ("weights", "representations"):
        exp = experiment(
            tmp_path / upload,
            *HETERO,
            "algorithm.eta0=1.0",
            f"algorithm.upload={upload}",
            "rounds=3",
        )
        orch, capture = run(exp)
        runs[upload] = exp, orch, capture
    (w, w_orch, w_cap), (r, r_orch, r_cap) = runs["weights"], runs["representations"]
    assert torch.equal(w_orch.state.buffers["kernel"], r_orch.state.buffers["kernel"])
    for c in range(w.cfg.num_clients):
        assert torch.equal(w.algorithm.client_params(c), r.algorithm.client_params(c)), c
    assert w_orch.last_eval["eval/personal/acc_mean"] == r_orch.last_eval["eval/personal/acc_mean"]
    assert w_cap.rounds[-1]["comm/up_bits"] != r_cap.rounds[-1]["comm/up_bits"]  # other ledgers


@pytest.mark.experiment
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


@pytest.mark.experiment
def test_the_server_computes_a_clients_kernel_from_its_weights(tmp_path):
    exp = experiment(tmp_path, *HETERO)
    algorithm = exp.algorithm
    arch = algorithm.archs[0]
    model = cnn_family((1, 8, 8), 10, arch=arch)
    params = flat_params(list(model.parameters()))
    probe = algorithm.probe(1)  # round 1's kernels are on round 2's RAD
    assert torch.equal(probe.x, draw_rad(algorithm.opts, exp.data, 0, 2).x)
    reps = model.eval().body(probe.x).flatten(1)
    kernel = algorithm.client_kernel(ClientWeights(params, arch), probe)
    torch.testing.assert_close(kernel, reps @ reps.T)  # the linear kernel, K = A A^T
    results = [ClientResult(0, 10, ClientWeights(params, arch), 0.0, 1)]
    state, _ = algorithm.aggregate(ServerState(), results, RoundContext(1, (0,), 0))
    assert torch.equal(state.buffers["kernel"], kernel)


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
    assert ClientWeights(torch.zeros(7), 3).num_bits() == 7 * 32  # the architecture is free
    assert Weights(torch.zeros(3)).num_bits() == AlignPayload(0.0, torch.zeros(3)).num_bits()


@pytest.mark.experiment
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
        (
            ("algorithm=fedhenn", "algorithm.rad_source=train", "algorithm.rad_size=9000"),
            "algorithm.rad_size",
        ),
        (("algorithm=fedhenn", "partition.server_pool=0"), "partition.server_pool: 0, but"),
        (
            ("algorithm=fedhenn", "algorithm.rad_size=300", "partition.server_pool=16"),
            "partition.server_pool: 16 < algorithm",
        ),
        (("algorithm=fedhenn", "algorithm.rad_source=holdout"), "algorithm.rad_source"),
        (("algorithm=fedhenn", "algorithm.upload=representations"), "algorithm.upload"),
        ((*HETERO, "algorithm.upload=kernels"), "algorithm.upload"),
        (
            ("partition.server_pool=100000", "partition.max_server_pool=null"),
            "partition.server_pool: 100000 >= the",
        ),
        (("partition.server_pool=-1",), "partition.server_pool"),
        (("algorithm=fedhenn", "algorithm.kernel=cosine"), "algorithm.kernel"),
        (("algorithm=fedhenn", "algorithm.eta_schedule=cosine"), "algorithm.eta_schedule"),
        (("algorithm=fedhenn", "algorithm.variant=both"), "algorithm.variant"),
    ],
)
def test_bad_configs_are_config_errors(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        experiment(tmp_path, *overrides)


@pytest.mark.experiment
def test_heterogeneous_on_a_single_model_draws_from_the_default_family(tmp_path):
    algo = experiment(tmp_path, "algorithm=fedhenn", "algorithm.variant=heterogeneous").algorithm
    assert algo.num_archs == 5


@pytest.mark.experiment
def test_eavesdroppers_rebuild_the_local_model_unless_representations_travel(tmp_path):
    cases = [
        (("algorithm=fedhenn",), True),
        (HETERO, True),  # upload=weights: the client's weights themselves
        ((*HETERO, "algorithm.upload=representations"), False),
    ]
    for i, (overrides, rebuilds) in enumerate(cases):
        exp = experiment(tmp_path / str(i), *overrides)
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
