"""HeteroFL: the sub-model slicing and the overlap aggregation by hand, the ledger's bits by hand,
all clients at rate 1 = FedAvg bit for bit, the levels from the seed, the masked loss and static
BatchNorm, `rates: family` at FedHeNN's budgets, bad options refused before training."""

from __future__ import annotations

import json
import math
from functools import partial

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from components import with_yaml
from conftest import REPO, main_in_process
from fedexp.algorithms import heterofl
from fedexp.algorithms import heterofl_levels as levels
from fedexp.algorithms import heterofl_slicing as slicing
from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.heterofl import HeteroFL, MaskedModule, SubModelDelta
from fedexp.core.client_loop import set_client_inputs
from fedexp.core.cohort import RoundResults
from fedexp.core.seeding import client_arch
from fedexp.core.types import ClientResult, ConfigError, RoundContext, ServerState
from fedexp.metrics.comm import stats_bits
from fedexp.models.family import mlp_family
from fedexp.models.mlp import BodyHead, mlp
from handworld import client_cfg, make_ctx, one_round, tiny_federation

FedAvg = with_yaml(FedAvg, "algorithm", "fedavg")
HeteroFL = with_yaml(HeteroFL, "algorithm", "heterofl")
PLAIN = dict(scaler=False, norm="none", masked_loss=False, head_aggregation="all")


def wide_mlp(input_shape=(2,), num_classes=2):
    """2 -> 4 (ReLU) -> 2 classes: 8 + 4 + 8 + 2 = 22 parameters."""
    return BodyHead(nn.Sequential(nn.Flatten(), nn.Linear(2, 4), nn.ReLU()), nn.Linear(4, 2))


def two_levels(data, **options):
    """HeteroFL at rates 1 and 0.5 on `wide_mlp`, client 0 at rate 1, client 1 at 0.5."""
    algo = HeteroFL(
        make_ctx(data, factory=wide_mlp), rates=[1.0, 0.5], proportions=[1, 1], **options
    )
    algo.levels = [0, 1]
    return algo


def upload(values: torch.Tensor, count: int, level: int) -> SubModelDelta:
    return SubModelDelta(values, torch.tensor(count), torch.tensor(level))


# ---- slicing ------------------------------------------------------------------------------------
def test_a_rate_keeps_the_ceiling_of_its_share_of_the_units():
    assert [slicing.kept(200, 0.0625), slicing.kept(3, 0.5), slicing.kept(4, 0.5)] == [13, 2, 2]
    assert 0.07 * 100 > 7 and slicing.kept(100, 0.07) == 7  # float noise is not a unit
    assert slicing.kept(10, 0.01) == 1  # at least one unit


def test_the_sub_model_of_an_mlp_holds_the_first_units_by_hand():
    # 3 -> 4 -> 4 -> 2 at rate 0.5: Linear(3, 2), Linear(2, 2), head Linear(2, 2)
    base = BodyHead(
        nn.Sequential(nn.Flatten(), nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU()),
        nn.Linear(4, 2),
    )
    layers, head = slicing.body_layers(base, (3,))
    whole = slicing.build(slicing.plan(layers, head, 1.0, scaler=True, sbn=False), static=False)
    sub = slicing.build(slicing.plan(layers, head, 0.5, scaler=True, sbn=False), static=True)
    assert [tuple(p.shape) for p in sub.parameters()] == [(2, 3), (2,), (2, 2), (2,), (2, 2), (2,)]
    # layer 1 W [4, 3] at 0: rows 0-1; b at 12; layer 2 W [4, 4] at 16: rows 0-1, columns 0-1;
    # b at 32; head W [2, 4] at 36: both rows (every class), columns 0-1; head b at 44
    assert slicing.positions(whole, sub).tolist() == [
        *range(0, 6), 12, 13, 16, 17, 20, 21, 32, 33, 36, 37, 40, 41, 44, 45,
    ]  # fmt: skip
    assert [type(m).__name__ for m in sub.body] == [
        "Flatten", "Linear", "Scaler", "ReLU", "Linear", "Scaler", "ReLU",
    ]  # fmt: skip
    assert slicing.head_classes(whole).tolist() == [-1] * 36 + [0] * 4 + [1] * 4 + [0, 1]
    # the sub-model computes what the whole network computes with the other units switched off
    torch.manual_seed(0)
    for p in whole.parameters():
        p.data.normal_()
    flat = torch.cat([p.detach().reshape(-1) for p in whole.parameters()])
    index = slicing.positions(whole, sub)
    offset = 0
    for p in sub.parameters():
        p.data.copy_(flat[index[offset : offset + p.numel()]].view(p.shape))
        offset += p.numel()
    with torch.no_grad():
        for layer in (whole.body[1], whole.body[3]):
            layer.weight[2:] = 0
            layer.bias[2:] = 0
    x = torch.randn(5, 3)
    sub.eval()
    torch.testing.assert_close(sub(x), whole(x))


def test_a_flattened_convolution_keeps_the_features_of_its_first_channels():
    base = BodyHead(
        nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten()),
        nn.Linear(16, 2),
    )
    layers, head = slicing.body_layers(base, (1, 4, 4))
    whole = slicing.build(slicing.plan(layers, head, 1.0, scaler=False, sbn=False), static=False)
    sub = slicing.build(slicing.plan(layers, head, 0.5, scaler=False, sbn=False), static=True)
    # conv W [4, 1, 3, 3]: channels 0-1 (0..17); b at 36; head W [2, 16] at 40: each row's first
    # 2 channels x 2 x 2 positions (columns 0-7); head b at 72
    assert slicing.positions(whole, sub).tolist() == [
        *range(0, 18), 36, 37, *range(40, 48), *range(56, 64), 72, 73,
    ]  # fmt: skip
    torch.manual_seed(1)
    for p in whole.parameters():
        p.data.normal_()
    flat = torch.cat([p.detach().reshape(-1) for p in whole.parameters()])
    index, offset = slicing.positions(whole, sub), 0
    for p in sub.parameters():
        p.data.copy_(flat[index[offset : offset + p.numel()]].view(p.shape))
        offset += p.numel()
    with torch.no_grad():
        whole.body[0].weight[2:] = 0
        whole.body[0].bias[2:] = 0
    x = torch.randn(3, 1, 4, 4)
    torch.testing.assert_close(sub(x), whole(x))


def test_the_scaler_divides_by_the_rate_in_training_only():
    scaler, x = slicing.Scaler(0.25), torch.tensor([1.0, -2.0])
    assert torch.equal(scaler(x), torch.tensor([4.0, -8.0]))
    scaler.eval()
    assert torch.equal(scaler(x), x)


def test_a_layer_it_cannot_slice_is_a_config_error():
    model = BodyHead(nn.Sequential(nn.Flatten(), nn.Linear(2, 4), nn.GELU()), nn.Linear(4, 2))
    with pytest.raises(ConfigError, match="cannot slice a GELU layer"):
        slicing.body_layers(model, (2,))


# ---- aggregation --------------------------------------------------------------------------------
def test_the_overlap_is_averaged_over_its_holders_by_hand(two_clients):
    algo = two_levels(two_clients, **PLAIN)
    # client 1's sub-model (rate 0.5): layer W rows 0-1 (0..3), b 8-9, head W columns 0-1
    # (12, 13, 16, 17), head b (20, 21)
    half = [0, 1, 2, 3, 8, 9, 12, 13, 16, 17, 20, 21]
    assert algo.index[1].tolist() == half
    full = upload(torch.ones(22), 22, 0)
    part = torch.full((22,), 100.0)  # what it carries outside its sub-model is never read
    part[half] = 3.0
    results = RoundResults.of(
        [ClientResult(0, 1, full, 0.0, 1), ClientResult(1, 3, upload(part, 12, 1), 0.0, 1)]
    )
    state, ctx = ServerState(params=torch.zeros(22)), RoundContext(1, (0, 1), 0)
    new, metrics = algo.aggregate(state, results, ctx)
    expected = torch.ones(22)
    expected[half] = 2.0  # (1 + 3) / 2 where both hold it; client 0's alone elsewhere
    assert torch.equal(new.params, expected) and metrics["heterofl/updated_fraction"] == 1.0
    assert metrics["heterofl/mean_rate"] == 0.75
    algo.weighting = "samples"  # n = 1 and 3: (1 * 1 + 3 * 3) / 4
    expected[half] = 2.5
    assert torch.equal(algo.aggregate(state, results, ctx)[0].params, expected)
    # both at rate 0.5: the entries neither holds keep their values
    algo.levels, algo.weighting = [1, 1], "uniform"
    new, metrics = algo.aggregate(ServerState(params=torch.full((22,), 7.0)), results, ctx)
    expected = torch.full((22,), 7.0)
    expected[half] = 7.0 + (1 + 3) / 2
    assert torch.equal(new.params, expected)
    assert metrics["heterofl/updated_fraction"] == pytest.approx(12 / 22)


def test_the_head_rows_of_classes_a_client_lacks_are_left_out(two_clients):
    # client 0 holds class 0 only, client 1 class 1 only
    algo = two_levels(two_clients, **{**PLAIN, "head_aggregation": "held_labels"})
    part = torch.zeros(22)
    part[algo.index[1]] = 3.0
    results = RoundResults.of(
        [
            ClientResult(0, 1, upload(torch.ones(22), 22, 0), 0.0, 1),
            ClientResult(1, 1, upload(part, 12, 1), 0.0, 1),
        ]
    )
    new, _ = algo.aggregate(
        ServerState(params=torch.zeros(22)), results, RoundContext(1, (0, 1), 0)
    )
    expected = torch.tensor(
        [2.0] * 4 + [1.0] * 4 + [2.0, 2.0, 1.0, 1.0]  # the hidden layer: as without the rule
        + [1.0] * 4  # head row 0 (class 0): client 0's alone
        + [3.0, 3.0, 0.0, 0.0]  # head row 1 (class 1): client 1's, in its two columns; no one's
        + [1.0, 3.0]  # head bias: class 0 client 0's, class 1 client 1's
    )  # fmt: skip
    assert torch.equal(new.params, expected)


# ---- the reduction to FedAvg --------------------------------------------------------------------
def test_every_client_at_rate_one_is_fedavg_bit_for_bit():
    data = tiny_federation()
    factory = partial(mlp, input_shape=(6,), num_classes=3, hidden=(5,))
    runs = []
    for algo in (
        FedAvg(make_ctx(data, factory=factory, seed=3, batch_size=4)),
        HeteroFL(
            make_ctx(data, factory=factory, seed=3, batch_size=4),
            rates=[1.0], proportions=[1], weighting="samples", **PLAIN,
        ),
    ):  # fmt: skip
        state, bits = None, []
        for t in (1, 2):
            payloads, results, state, _ = one_round(algo, ids=(0, 1, 2), round_idx=t, state=state)
            bits.append((payloads[0].num_bits(), results.upload_bits(stats_bits)))
        runs.append((state.params, bits))
    (fedavg, fedavg_bits), (heterofl, heterofl_bits) = runs
    assert torch.equal(heterofl, fedavg)
    assert heterofl_bits == fedavg_bits == [((30 + 5 + 15 + 3) * 32, 3 * 53 * 32)] * 2


@pytest.mark.slow
def test_the_cli_run_at_rate_one_is_the_fedavg_run(cli_in_process, tmp_path):
    same = ["debug=smoke", "algorithm.weighting=samples"]
    heterofl = ["algorithm=heterofl", "algorithm.rates=[1.0]", "algorithm.proportions=[1]"]
    heterofl += ["algorithm.norm=none", "algorithm.masked_loss=false"]
    heterofl += ["algorithm.head_aggregation=all"]
    for name, args in (("fedavg", ["algorithm=fedavg"]), ("heterofl", heterofl)):
        cli_in_process(*args, *same, f"hydra.run.dir={tmp_path / name}")
    summaries = [
        json.loads((tmp_path / n / "summary.json").read_text()) for n in ("fedavg", "heterofl")
    ]
    keep = lambda m: {k: v for k, v in m.items() if not k.startswith(("time/", "heterofl/"))}  # noqa: E731
    assert keep(summaries[0]["metrics"]) == keep(summaries[1]["metrics"])
    models = [torch.load(tmp_path / n / "model.pt")["state_dict"] for n in ("fedavg", "heterofl")]
    assert models[0].keys() == models[1].keys()
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])


# ---- the ledger ---------------------------------------------------------------------------------
def test_only_the_sub_models_entries_travel_by_hand(two_clients):
    algo = two_levels(two_clients, **PLAIN)
    payloads, results, _, _ = one_round(algo)
    assert [payloads[0].num_bits(), payloads[1].num_bits()] == [22 * 32, 12 * 32]
    assert [results[0].upload.num_bits(), results[1].upload.num_bits()] == [22 * 32, 12 * 32]
    assert results.upload_bits(stats_bits) == (22 + 12) * 32
    assert results.uploads().cohort_bits(2) == (22 + 12) * 32  # rows of two levels, stacked
    # sBN's BatchNorm (weight and bias a unit) travels with its layer: 4 + 4, and 2 + 2 at 0.5
    algo = two_levels(two_clients, **{**PLAIN, "norm": "sbn"})
    payloads, results, _, _ = one_round(algo)
    assert [payloads[0].num_bits(), payloads[1].num_bits()] == [30 * 32, 16 * 32]
    assert results.upload_bits(stats_bits) == (30 + 16) * 32
    described = algo.describe()
    assert described["params/total"] == 30 and described["heterofl/level1_params"] == 16


# ---- levels and determinism ---------------------------------------------------------------------
def test_levels_take_their_share_of_the_clients_from_the_seed():
    assert levels.level_counts(20, [1, 1, 1, 1, 1]) == [4, 4, 4, 4, 4]
    assert levels.level_counts(6, [1, 1, 1, 1, 1]) == [2, 1, 1, 1, 1]  # the rest: lower first
    assert levels.level_counts(7, [1, 2]) == [2, 5]  # 7/3 and 14/3: the larger remainder
    assert levels.level_counts(5, [0, 1]) == [0, 5]
    drawn = levels.assign_levels(0, 20, [1, 1, 1, 1, 1])
    assert sorted(drawn) == [i for i in range(5) for _ in range(4)]
    assert drawn == levels.assign_levels(0, 20, [1, 1, 1, 1, 1])
    assert drawn != levels.assign_levels(1, 20, [1, 1, 1, 1, 1])


def test_dynamic_levels_are_drawn_each_round_from_the_seed(two_clients):
    assert {levels.dynamic_level(0, t, c, [0, 1, 0]) for t in range(5) for c in range(5)} == {1}
    drawn = [levels.dynamic_level(0, t, 0, [1, 1, 1, 1, 1]) for t in range(1, 41)]
    assert len(set(drawn)) == 5 and drawn == [
        levels.dynamic_level(0, t, 0, [1, 1, 1, 1, 1]) for t in range(1, 41)
    ]
    algo = HeteroFL(
        make_ctx(two_clients, factory=wide_mlp), rates=[1.0, 0.5], proportions=[1, 1],
        assignment="dynamic",
    )  # fmt: skip
    seen = []
    for t in range(1, 9):
        payloads = algo.configure_round(algo.init_state(), RoundContext(t, (0, 1), 0))
        expected = [levels.dynamic_level(0, t, c, [1, 1]) for c in (0, 1)]
        assert [algo.level_of(c) for c in (0, 1)] == expected  # kept in the client store
        assert [payloads[c].level for c in (0, 1)] == expected
        assert [algo.client_module(c) for c in (0, 1)] == [algo.level_modules[v] for v in expected]
        seen.append(tuple(expected))
    assert len(set(seen)) > 1


def test_a_seeded_run_is_repeated_exactly():
    data = tiny_federation(num_clients=5)
    factory = partial(mlp, input_shape=(6,), num_classes=3, hidden=(8, 8))
    finals = []
    for _ in range(2):
        algo = HeteroFL(make_ctx(data, factory=factory, seed=5, batch_size=7))  # the defaults
        assert sorted(algo.levels) == [0, 1, 2, 3, 4]
        state = None
        for t in (1, 2):
            _, _, state, _ = one_round(algo, ids=(0, 1, 2, 3, 4), round_idx=t, state=state)
        finals.append(state.params)
    assert torch.equal(finals[0], finals[1]) and torch.isfinite(finals[0]).all()


# ---- the local objective and static BatchNorm ---------------------------------------------------
def test_the_masked_loss_zeroes_the_logits_of_classes_not_held():
    model = BodyHead(nn.Identity(), nn.Linear(3, 3))
    with torch.no_grad():
        model.head.weight.copy_(torch.eye(3))
        model.head.bias.zero_()
    module = MaskedModule(model, client_cfg())
    set_client_inputs(module, {"label_mask": torch.tensor([True, False, True])})
    x, y = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([0])
    expected = -1.0 + math.log(math.e + 1.0 + math.e**3)  # CE of [1, 0, 3] at class 0
    assert module.training_step((x, y), 0).item() == pytest.approx(expected, abs=1e-6)


def test_static_batchnorm_counts_the_real_samples_and_takes_one():
    data = tiny_federation()
    algo = HeteroFL(
        make_ctx(data, factory=partial(mlp, input_shape=(6,), num_classes=3, hidden=(8,)))
    )
    module = algo.level_modules[1]  # rate 0.5, a static BatchNorm of 4 units
    set_client_inputs(module, {"label_mask": torch.ones(3, dtype=torch.bool)})
    torch.manual_seed(0)
    x, y = torch.randn(5, 6), torch.tensor([0, 1, -100, -100, 2])  # two padded rows
    real = y >= 0
    torch.testing.assert_close(module.logits(x, y)[real], module.logits(x[real], y[real]))
    assert torch.isfinite(module.training_step((x[:1], y[:1]), 0))  # a batch of one sample


def test_sbn_statistics_are_the_cumulative_average_over_the_clients_batches():
    data = tiny_federation()  # 3 clients of 24 training samples
    factory = partial(mlp, input_shape=(6,), num_classes=3, hidden=(4,))
    algo = HeteroFL(make_ctx(data, factory=factory, batch_size=23))  # batches of 23 and 1
    state = algo.init_state()
    model = algo.global_model(state)
    linear, norm = model.body[1], model.body[2]
    means, variances = [], []
    with torch.no_grad():
        for cid in range(3):
            z = linear(data.train(cid)[0][:23])  # the batch of one sample is left out
            means.append(z.mean(0))
            variances.append(z.var(0))  # unbiased, as BatchNorm's running variance
    torch.testing.assert_close(norm.running_mean, torch.stack(means).mean(0))
    torch.testing.assert_close(norm.running_var, torch.stack(variances).mean(0))
    assert int(norm.num_batches_tracked) == 3 and not model.training


# ---- rates: family ------------------------------------------------------------------------------
def test_a_rate_matches_a_parameter_budget_by_hand():
    # 4 -> [10] -> 2 keeping k units: 4k + k + 2k + 2 = 7k + 2 parameters
    layers, head = slicing.body_layers(mlp((4,), 2, (10,)), (4,))
    match = partial(slicing.matched_rate, layers, head)
    assert [match(30), match(72), match(1000), match(5)] == [0.4, 1.0, 1.0, 0.1]


def test_rates_family_gives_each_client_its_fedhenn_architectures_budget(two_clients):
    # mlp_family of 3 on 2 inputs, 2 classes: hidden [4] (22 parameters), [4, 8] (70) and
    # [8, 8, 8] (186), the largest, whose sub-model keeping k units a layer has 2k^2 + 7k + 2
    # parameters (sBN's 2 a unit aside): k = 1 fits 22, k = 4 fits 70
    family = partial(mlp_family, input_shape=(2,), num_classes=2, num_archs=3, hidden=(8, 8, 8))
    algo = HeteroFL(make_ctx(two_clients, factory=family, seed=4), rates="family")
    assert [sum(p.numel() for p in family(arch=a).parameters()) for a in range(3)] == [22, 70, 186]
    assert algo.rates == [1 / 8, 4 / 8, 1.0]
    assert algo.levels == [client_arch(4, c, 3) for c in range(2)]  # FedHeNN's draw
    assert algo.dim == 186 + 2 * 8 * 3  # the global network: the largest, with sBN's BatchNorm


# ---- bad options --------------------------------------------------------------------------------
def test_a_bad_option_is_one_line_before_training(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, err = main_in_process(
        monkeypatch, capsys, "algorithm=heterofl", "algorithm.rates=[1,0.0]"
    )
    assert code == 2 and "algorithm.rates: every rate must be in (0, 1], got 0.0" in err
    assert list(tmp_path.glob("outputs/runs/*/*")) == []  # refused before a run dir was made


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("rates", [1.5], "algorithm.rates: every rate must be in (0, 1], got 1.5"),
        ("rates", "wide", "algorithm.rates: a list of rates in (0, 1] or family, got 'wide'"),
        ("rates", [], "algorithm.rates: give at least one rate"),
        ("rates", [0.5, 0.5], "algorithm.rates: each rate once, got [0.5, 0.5]"),
        ("proportions", [1, 1], "algorithm.proportions: one per rate (5), got 2"),
        ("proportions", [1, 1, 1, 1, -1], "algorithm.proportions: numbers >= 0 with a positive"),
        ("proportions", [0, 0, 0, 0, 0], "algorithm.proportions: numbers >= 0 with a positive"),
        ("norm", "bn", "algorithm.norm: must be none or sbn, got 'bn'"),
        ("assignment", "random", "algorithm.assignment: must be fixed or dynamic, got 'random'"),
        ("head_aggregation", "some", "algorithm.head_aggregation: must be held_labels or all"),
        ("aggregator", "median", "aggregator: algorithm=heterofl averages each entry over"),
    ],
)
def test_bad_options_are_refused_by_the_config_check(option, value, message):
    node = OmegaConf.load(REPO / "conf" / "algorithm" / "heterofl.yaml")
    target = "fedexp.aggregators.mean.weighted_mean"
    if option == "aggregator":
        target = "fedexp.aggregators.median.median"
    else:
        node[option] = value
    cfg = OmegaConf.create({"algorithm": node, "aggregator": {"_target_": target}})
    with pytest.raises(ConfigError) as err:
        heterofl.HeteroFL.check_config(cfg)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_options_are_checked_when_built_directly(two_clients):
    with pytest.raises(ConfigError, match="algorithm.head_aggregation"):
        HeteroFL(make_ctx(two_clients, factory=wide_mlp), head_aggregation="some")
