"""Fine-tune, then evaluate (`eval.finetune_epochs`): a step computed by hand, a plain torch loop,
training untouched, the algorithm's models, store and RNG left as they were, and refusals."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch.utils._pytree import tree_flatten

from conftest import REPO, smoke_experiment
from fedexp.algorithms.ditto import Ditto
from fedexp.algorithms.fedavg import CONSTANT_SERVER_LR, FedAvg
from fedexp.core.callbacks import RoundFunction
from fedexp.data.datasets import Dataset
from fedexp.data.federated import FederatedData
from fedexp.data.partition import Partition
from fedexp.engine.eval.all_clients import evaluate
from fedexp.engine.eval.finetuned import Finetune, finetune_streams
from fedexp.evaluate import evaluate_run
from handworld import client_cfg, make_ctx, one_round, small_mlp, tiny_federation, zero_linear


def one_sample_world() -> FederatedData:
    """One client: it trains on x=[1,2], y=1 and is tested on x=[1,0], y=1 (also the pooled
    test set)."""
    x, y = torch.tensor([[1.0, 2.0], [1.0, 0.0]]), torch.tensor([1, 1])
    ds = Dataset("hand", x, y, x[1:].clone(), y[1:].clone(), 2, (2,))
    return FederatedData(ds, Partition([np.array([0])], [np.array([1])]), torch.device("cpu"))


def test_one_step_by_hand_flips_the_test_point():
    # the zero linear model: logits 0, p = (1/2, 1/2), argmax class 0 (wrong on the test point).
    # One SGD step (lr 0.1) on (x=[1,2], y=1): the CE gradient is (p - e_1) x^T for W and
    # p - e_1 for b, so W = lr/2 [[-1,-2],[1,2]], b = lr/2 [-1, 1]. On t=[1,0] the logits are
    # (-lr, lr): class 1, right, with loss log(1 + exp(-2 lr)).
    lr = 0.1
    client = client_cfg(lr=lr, batch_size=1)
    algo = FedAvg(
        make_ctx(one_sample_world(), factory=zero_linear, client=client),
        "samples",
        1,
        0,
        **CONSTANT_SERVER_LR,
    )
    state = algo.init_state()
    data = algo.ctx.data
    metrics, per_client = evaluate(algo, state, data, finetune=Finetune(1, client, 1))
    assert metrics["eval/global/client_acc_mean"] == 0.0
    assert metrics["eval/global/client_loss_mean"] == pytest.approx(math.log(2))
    assert metrics["eval/finetuned/acc_mean"] == 1.0 and per_client["finetuned"] == [1.0]
    assert metrics["eval/finetuned/loss_mean"] == pytest.approx(math.log1p(math.exp(-2 * lr)))
    assert metrics["eval/finetuned/acc_std"] == 0.0 and metrics["eval/finetuned/acc_min"] == 1.0
    # the global model itself did not move
    assert not algo.global_model(state).head.weight.any()


def plain_finetune(model, x, y, epochs, batch_size, generator, lr, momentum, weight_decay):
    """K epochs of plain minibatch SGD on (x, y), the batches in `generator`'s order."""
    model = copy.deepcopy(model).train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), batch_size):
            idx = order[start : start + batch_size]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return model.eval()


def test_equals_a_plain_torch_loop_of_k_epochs():
    data = tiny_federation(num_clients=3, per_client=30, dim=2, classes=2)
    settings = dict(batch_size=4, lr=0.3, momentum=0.9, weight_decay=1e-3)
    client = client_cfg(**settings)
    algo = FedAvg(
        make_ctx(data, factory=small_mlp, client=client, seed=5),
        "samples",
        1,
        0,
        **CONSTANT_SERVER_LR,
    )
    _, _, state, _ = one_round(algo, ids=(0, 1, 2), seed=5)
    metrics, per_client = evaluate(algo, state, data, seed=5, finetune=Finetune(3, client, 4))
    expected, losses = [], []
    for cid in range(3):
        generator = finetune_streams(5, 4, cid)[1]  # the client's fine-tuning order, round 4
        model = plain_finetune(
            algo.global_model(state), *data.train(cid), 3, generator=generator, **settings
        )
        tx, ty = data.test(cid)
        with torch.no_grad():
            logits = model(tx)
        expected.append(float((logits.argmax(1) == ty).float().mean()))
        losses.append(float(F.cross_entropy(logits.double(), ty)))
    assert per_client["finetuned"] == pytest.approx(expected, abs=1e-6)
    assert metrics["eval/finetuned/acc_mean"] == pytest.approx(np.mean(expected))
    assert metrics["eval/finetuned/loss_mean"] == pytest.approx(np.mean(losses), rel=1e-5)
    assert per_client["finetuned"] != per_client["global"]


def test_fine_tuning_leaves_models_store_and_rng_as_they_were():
    data = tiny_federation(num_clients=3, dim=2, classes=2)
    client = client_cfg(batch_size=4)
    ctx = make_ctx(data, factory=small_mlp, client=client)
    algo = Ditto(
        ctx, 0.1, 1, weighting="samples", server_lr=1.0, server_momentum=0.0, **CONSTANT_SERVER_LR
    )
    _, _, state, _ = one_round(algo, ids=(0, 1, 2))
    global_before = copy.deepcopy(algo.global_model(state).state_dict())
    store_before = {c: copy.deepcopy(algo.store.get(c)) for c in range(3)}
    without, _ = evaluate(algo, state, data)
    rng = torch.get_rng_state()
    with_ft, per_client = evaluate(algo, state, data, finetune=Finetune(2, client, 1))
    assert torch.equal(torch.get_rng_state(), rng)
    after = algo.global_model(state).state_dict()
    assert all(torch.equal(after[k], v) for k, v in global_before.items())
    for c in range(3):
        now, before = tree_flatten(algo.store.get(c))[0], tree_flatten(store_before[c])[0]
        assert len(now) == len(before) > 0
        assert all(torch.equal(a, b) for a, b in zip(now, before))
    assert {k: v for k, v in with_ft.items() if "/finetuned/" not in k} == without
    assert len(per_client["finetuned"]) == 3 and "eval/val/finetuned/acc_mean" not in with_ft


def record(rounds: dict):
    return RoundFunction(lambda t, metrics: rounds.__setitem__(t, metrics))


@pytest.mark.experiment
@pytest.mark.parametrize("algorithm", ["fedavg", "ditto"])
def test_training_is_bit_identical_with_and_without_fine_tuning(tmp_path, algorithm):
    runs = {}
    for k in (0, 1):
        exp = smoke_experiment(
            tmp_path / str(k), f"algorithm={algorithm}", "rounds=3", f"eval.finetune_epochs={k}"
        )
        runs[k] = {}
        exp.orchestrator(callbacks=[record(runs[k])]).run()
    assert sorted(runs[0]) == sorted(runs[1]) == [1, 2, 3]  # debug=smoke: every round evaluated
    for t in runs[0]:
        off, on = runs[0][t], runs[1][t]
        assert "eval/finetuned/acc_mean" in on and "eval/val/finetuned/acc_mean" in on
        assert not any("finetuned" in k for k in off)
        kept = [k for k in on if "finetuned" not in k and not k.startswith("time/")]
        assert sorted(kept) == sorted(k for k in off if not k.startswith("time/"))
        assert [on[k] for k in kept] == [off[k] for k in kept]  # bit-identical, NaN-free
        assert any(k.startswith("train/") for k in kept)
        assert any(k.startswith("eval/global/") for k in kept)


@pytest.mark.experiment
@pytest.mark.parametrize(
    "overrides,message",
    [
        (("eval.finetune_epochs=-1",), "eval.finetune_epochs: must be >= 0, got -1"),
        (("eval.finetune_epochs=1.5",), "eval.finetune_epochs: must be an int, got 1.5"),
        (("eval.finetune_epochs=two",), "eval.finetune_epochs: must be an int, got 'two'"),
        (("eval.finetune_epochs=true",), "eval.finetune_epochs: must be an int, got True"),
        (
            ("algorithm=fedrep", "eval.finetune_epochs=1"),
            "eval.finetune_epochs: 1, but FedRep has no global model to fine-tune",
        ),
        (
            ("algorithm=local", "eval.finetune_epochs=2"),
            "eval.finetune_epochs: 2, but Local has no global model to fine-tune",
        ),
        (
            ("objective=eval/val/finetuned/acc_mean",),
            "objective: eval/val/finetuned/acc_mean needs eval.finetune_epochs >= 1",
        ),
    ],
)
def test_bad_values_are_one_line_config_errors_before_training(cli_in_process, overrides, message):
    proc = cli_in_process("debug=smoke", *overrides, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not list((cli_in_process.cwd / "outputs").rglob("metrics.jsonl"))


@pytest.mark.experiment
def test_a_finetuned_objective_and_the_final_table(cli_in_process):
    proc = cli_in_process(
        "debug=smoke", "eval.finetune_epochs=1", "objective=eval/val/finetuned/acc_mean"
    )
    assert "test acc, fine-tuned global model, mean over clients" in proc.stdout
    assert "objective: validation acc, fine-tuned global model" in proc.stdout


def test_config_default_is_off():
    cfg = OmegaConf.load(REPO / "conf" / "config.yaml")
    assert cfg.eval.finetune_epochs == 0


@pytest.mark.experiment
def test_evaluating_the_saved_model_fine_tunes_as_the_run_did(tmp_path):
    exp = smoke_experiment(tmp_path, "eval.finetune_epochs=2")
    (exp.run_dir / ".hydra").mkdir()
    OmegaConf.save(exp.cfg, exp.run_dir / ".hydra" / "config.yaml")
    exp.run()
    summary = json.loads((exp.run_dir / "summary.json").read_text())
    metrics, report = evaluate_run(exp.run_dir, "val")
    ran = {k: v for k, v in summary["metrics"].items() if k.startswith("eval/val/finetuned/")}
    assert ran and {k: v for k, v in metrics.items() if k in ran} == ran
    assert len(summary["client_acc"]["finetuned"]) == 6
