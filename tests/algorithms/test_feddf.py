"""FedDF: one architecture with distill_steps=0 is FedAvg exactly; the per-group averaging with two
groups by hand; the ensemble is the mean of the received models' logits (by hand); the KL and the
cosine lr by hand; the distillation pulls each group towards the ensemble; early stopping keeps
the best validated model; the ledger by hand; seeded; refusals."""

from __future__ import annotations

import json
from functools import partial

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from tests.algorithms.test_fedmd import pool_world
from torch import nn

from components import with_yaml
from conftest import main_in_process
from fedexp.algorithms import feddf, feddf_fusion
from fedexp.algorithms.distillation import cosine_lr, kl_to_teacher, logits_of
from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.feddf import FedDF
from fedexp.algorithms.feddf_fusion import DistillOptions, distil
from fedexp.core.cohort import RoundResults
from fedexp.core.flat import flat_params
from fedexp.core.seeding import client_arch
from fedexp.core.types import ClientResult, ConfigError, RoundContext, Weights
from fedexp.models.family import mlp_family
from fedexp.models.mlp import mlp
from handworld import make_ctx, one_round

FedDF = with_yaml(FedDF, "algorithm", "feddf", distill_steps=20, distill_batch_size=4)
FedAvg = with_yaml(FedAvg, "algorithm", "fedavg")

SMALL = partial(mlp, input_shape=(3,), num_classes=3, hidden=(5,))
FAMILY = partial(mlp_family, input_shape=(3,), num_classes=3, num_archs=2, hidden=(6,))


def run(algo, rounds, cohorts=((0, 1, 2), (1, 3), (0, 2, 3))):
    state = algo.init_state()
    for t in range(1, rounds + 1):
        ids = cohorts[(t - 1) % len(cohorts)]
        _, _, state, _ = one_round(algo, ids=ids, round_idx=t, state=state)
    return state


def test_one_architecture_without_distillation_is_fedavg_exactly():
    data = pool_world()
    df = FedDF(make_ctx(data, factory=SMALL, batch_size=3), distill_steps=0)
    avg = FedAvg(make_ctx(data, factory=SMALL, batch_size=3))
    state_df, state_avg = run(df, 3), run(avg, 3)
    assert torch.equal(state_df.params, state_avg.params)
    x = data.x[:6]
    assert torch.equal(df.global_model(state_df)(x), avg.global_model(state_avg)(x))
    assert df.has_global_model and not df.has_personal_models
    assert df.personal_model(state_df, 0) is None
    assert df.run_warnings(3) and "distill_steps=0" in df.run_warnings(3)[0]


def ids_of_each_arch(seed=0, count=2):
    """Client ids 0, 1, ... split by their architecture in a family of 2 (`count` of each)."""
    out = {0: [], 1: []}
    cid = 0
    while min(len(v) for v in out.values()) < count:
        arch = client_arch(seed, cid, 2)
        if len(out[arch]) < count:
            out[arch].append(cid)
        cid += 1
    return out


def test_two_groups_average_their_own_uploads_by_hand():
    data = pool_world(clients=12)
    algo = FedDF(make_ctx(data, factory=FAMILY), distill_steps=0)
    state = algo.init_state()
    w0, w1 = (algo.group_state(state, a).params for a in (0, 1))
    assert len(w0) != len(w1)  # two architectures: narrow (3) and wide (6) hidden units
    ids = ids_of_each_arch()
    a, b = ids[0]
    c, d = ids[1]
    uploads = {
        a: (torch.full_like(w0, 1.0), 1),
        b: (torch.full_like(w0, 4.0), 3),
        c: (torch.full_like(w1, 2.0), 5),
        d: (torch.full_like(w1, -1.0), 5),
    }
    order = sorted(uploads)  # a round's results come in client-id order
    results = RoundResults.of(
        [ClientResult(cid, uploads[cid][1], Weights(uploads[cid][0]), 0.0, 1) for cid in order]
    )
    new, metrics = algo.aggregate(state, results, RoundContext(1, tuple(order), 0))
    # samples-weighted: group 0 (1 * 1 + 3 * 4) / 4 = 3.25; group 1 (5 * 2 + 5 * -1) / 10 = 0.5
    torch.testing.assert_close(algo.group_state(new, 0).params, w0 + 3.25, rtol=0, atol=1e-6)
    torch.testing.assert_close(algo.group_state(new, 1).params, w1 + 0.5, rtol=0, atol=1e-6)
    assert metrics == {}
    # each client is sent its group's model, and evaluated with it
    sent = algo.configure_round(new, RoundContext(2, (a, c), 0))
    assert sent[a].arch == 0 and torch.equal(sent[a].values, algo.group_state(new, 0).params)
    assert sent[c].arch == 1 and torch.equal(sent[c].values, algo.group_state(new, 1).params)
    assert algo.has_personal_models and algo.global_model(new) is None
    model = algo.personal_model(new, c)
    assert torch.equal(flat_params(list(model.parameters())), algo.group_state(new, 1).params)


def biased(bias):
    """A linear model whose logits are `bias` whatever the input."""
    model = mlp((3,), 3, ())
    nn.init.zeros_(model.head.weight)
    with torch.no_grad():
        model.head.bias.copy_(torch.tensor(bias))
    return model


def test_the_ensemble_is_the_mean_of_the_received_models_logits_by_hand():
    algo = FedDF(make_ctx(pool_world(), factory=SMALL))
    algo.init_state()
    teachers = []
    size = len(flat_params(list(algo.students[0].parameters())))
    for bias in ([1.0, 2.0, 3.0], [3.0, 0.0, -1.0]):
        # every weight 0 but the head's bias (the last 3 entries): logits = bias on any input
        weights = torch.zeros(size)
        weights[-3:] = torch.tensor(bias)
        teachers.append((0, weights, None))
    targets = algo.ensemble_logits(teachers)
    assert targets.shape == (12, 3)
    torch.testing.assert_close(targets, torch.tensor([[2.0, 1.0, 1.0]]).expand(12, 3))


def test_the_kl_and_the_cosine_lr_by_hand():
    s, t = torch.tensor([[0.0, 0.0]]), torch.tensor([[np.log(3.0), 0.0]])
    # q = (3/4, 1/4), p = (1/2, 1/2): KL(q || p) = 3/4 ln(3/2) + 1/4 ln(1/2)
    expected = 0.75 * np.log(1.5) + 0.25 * np.log(0.5)
    assert float(kl_to_teacher(s, t, 1.0)) == pytest.approx(expected, abs=1e-6)
    # T = 2 halves the teacher's logits: q = (sqrt3, 1) / (sqrt3 + 1)
    q = np.array([np.sqrt(3.0), 1.0]) / (np.sqrt(3.0) + 1)
    assert float(kl_to_teacher(s, t, 2.0)) == pytest.approx(float((q * np.log(2 * q)).sum()))
    assert [cosine_lr(0.1, k, 4) for k in (0, 2, 4)] == pytest.approx([0.1, 0.05, 0.0])


def test_distillation_pulls_every_group_towards_the_ensemble_and_is_seeded():
    data = pool_world(clients=12)
    runs = [FedDF(make_ctx(data, factory=FAMILY, batch_size=3)) for _ in range(2)]
    cohort = tuple(sorted(ids_of_each_arch()[0] + ids_of_each_arch()[1]))
    states = [run(algo, 2, cohorts=(cohort,)) for algo in runs]
    for a in (0, 1):
        assert torch.equal(
            runs[0].group_state(states[0], a).params, runs[1].group_state(states[1], a).params
        )
    # round 3's aggregation, with and without distillation, from the same uploads
    algo = runs[0]
    _, results, _, _ = one_round(algo, ids=cohort, round_idx=3, state=states[0], aggregate=False)
    ctx = RoundContext(3, cohort, 0)
    fused, metrics = algo.aggregate(states[0], results, ctx)
    algo.options = DistillOptions(**{**algo.options.__dict__, "distill_steps": 0})
    averaged, _ = algo.aggregate(states[0], results, ctx)
    teachers = []
    for cid, i in zip(results.client_ids, range(len(results))):
        arch = algo.arch_of(cid)
        teachers.append(
            (arch, algo.group_state(states[0], arch).params + results.upload(i).values, None)
        )
    targets = algo.ensemble_logits(teachers)
    x = torch.cat([algo.val_x, algo.distil_x])

    def kl(state, arch):
        model = algo.personal_model(state, ids_of_each_arch()[arch][0])
        return float(kl_to_teacher(logits_of(model, x, 64), targets, 1.0))

    for a in (0, 1):
        assert kl(fused, a) < kl(averaged, a), a
    assert metrics["feddf/steps"] > 0 and "feddf/arch1_val_loss" in metrics


def test_early_stopping_keeps_the_best_validated_model(monkeypatch):
    # validation losses 5, 3, 4, 4, ... every step, patience 2: the best is step 2, and the run
    # stops at step 4 (4 - 2 >= 2) with the model of step 2 kept
    opts = DistillOptions(10, 4, 0.01, "constant", 1.0, None, 1, 2, 0.5)
    losses = iter([5.0, 3.0, 4.0, 4.0, 4.0])
    monkeypatch.setattr(feddf_fusion, "val_loss", lambda *args: next(losses))
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(1))
    targets = torch.randn(8, 3, generator=torch.Generator().manual_seed(2))
    models = [biased([0.0, 0.0, 0.0]) for _ in range(2)]
    done = distil(models[0], (x, targets), (x, targets), opts, torch.Generator().manual_seed(3))
    assert (done.steps, done.kept_step, done.val_loss) == (4, 2, 3.0)
    two = DistillOptions(2, 4, 0.01, "constant", 1.0, None, 1, None, 0.5)
    distil(models[1], (x, targets), (x, targets), two, torch.Generator().manual_seed(3))
    assert torch.equal(
        flat_params(list(models[0].parameters())), flat_params(list(models[1].parameters()))
    )


def test_the_ledger_by_hand():
    # one group: FedAvg's 3*5 + 5 + 5*3 + 3 = 38 floats each way; two groups: each its own
    algo = FedDF(make_ctx(pool_world(), factory=SMALL))
    payloads, results, _, _ = one_round(algo, ids=(0, 1), round_idx=1, aggregate=False)
    assert [p.num_bits() for p in payloads.values()] == [38 * 32] * 2
    assert results.upload_bits(lambda s: 0) == 2 * 38 * 32
    algo = FedDF(make_ctx(pool_world(clients=12), factory=FAMILY))
    ids = ids_of_each_arch(count=1)
    cohort = (ids[0][0], ids[1][0])
    payloads, results, _, _ = one_round(algo, ids=cohort, round_idx=1, aggregate=False)
    # mlp_family hidden (6,): arch 0 narrow (3 units) 3*3+3+3*3+3 = 24, arch 1 wide 3*6+6+6*3+3 = 45
    assert payloads[ids[0][0]].num_bits() == 24 * 32 and payloads[ids[1][0]].num_bits() == 45 * 32
    assert results.upload_bits(lambda s: 0) == (24 + 45) * 32


def test_bad_options_and_a_missing_pool_are_config_errors():
    with pytest.raises(ConfigError, match="partition.server_pool: 0, but FedDF distils"):
        FedDF(make_ctx(pool_world(pool=0), factory=SMALL))
    for key, value in [
        ("distill_steps", -1),
        ("distill_batch_size", 0),
        ("distill_lr", 0),
        ("distill_lr_schedule", "step"),
        ("temperature", 0),
        ("distill_clip_norm", -1.0),
        ("early_stop_every", 0),
        ("early_stop_patience", 0),
        ("val_fraction", 1.0),
    ]:
        with pytest.raises(ConfigError, match=f"algorithm.{key}"):
            FedDF(make_ctx(pool_world(), factory=SMALL), **{key: value})
    cfg = OmegaConf.create(
        {"partition": {"server_pool": 0}, "model": {}, "algorithm": {"default_family": None}}
    )
    with pytest.raises(ConfigError, match="set partition.server_pool"):
        feddf.FedDF.check_config(cfg)
    cfg = OmegaConf.create(
        {
            "partition": {"server_pool": 100},
            "model": {"num_archs": 5},
            "attack": {"_target_": "fedexp.attacks.crafted.MinMax"},
        }
    )
    with pytest.raises(ConfigError, match="attack: FedDF's uploads differ in length"):
        feddf.FedDF.check_config(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mlp_family", "cnn_family"])
def test_the_cli_runs_heterogeneous_clients_on_digits(model, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    args = ["debug=smoke", "algorithm=feddf", f"model={model}", f"hydra.run.dir={run_dir}"]
    code, err = main_in_process(monkeypatch, capsys, *args, "partition.server_pool=16")
    assert code == 0, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0.0 <= summary["metrics"]["eval/personal/acc_mean"] <= 1.0
    assert "eval/global/acc" not in summary["metrics"]
    assert summary["metrics"]["feddf/steps"] == 10  # debug=smoke's distill_steps


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mlp", "mlp_bn"])
def test_without_distillation_the_cli_run_is_fedavgs(model, monkeypatch, capsys, tmp_path):
    # the whole pipeline, config to summary, on the same clients' data (one pool for both);
    # with BatchNorm the running statistics travel and are averaged as FedAvg's
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    shared = ["debug=smoke", f"model={model}", "partition.server_pool=16"]
    metrics = {}
    for name in ("fedavg", "feddf"):
        extra = ["algorithm.distill_steps=0"] if name == "feddf" else []
        run_dir = tmp_path / name
        code, err = main_in_process(
            monkeypatch, capsys, *shared, f"algorithm={name}", *extra, f"hydra.run.dir={run_dir}"
        )
        assert code == 0, err
        metrics[name] = json.loads((run_dir / "summary.json").read_text())["metrics"]
    keys = [k for k in metrics["fedavg"] if k.startswith(("eval/", "comm/", "train/"))]
    assert keys and all(metrics["feddf"][k] == metrics["fedavg"][k] for k in keys)
