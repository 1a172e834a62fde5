"""FRL's reference-code lr rules (`algorithm.round_lr_decay`, `algorithm.local_lr_schedule`):
hand-checked values, the training they drive, defaults unchanged, exact resume."""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from components import with_yaml
from fedexp.aggregators.rank_vote import rank_vote
from fedexp.algorithms.frl import FRL, cosine_factor, round_lr
from fedexp.core.algorithm import BuildContext
from fedexp.core.client_loop import train_local
from fedexp.core.client_store import ClientStore
from fedexp.core.local import ClientConfig
from fedexp.core.types import ConfigError, RoundContext
from fedexp.engine.executors.select import executor_named
from fedexp.engine.executors.sequential import SequentialExecutor
from fedexp.models.mlp import mlp
from fedexp.models.supermask import supermask_layers
from handworld import begin_one

FRL = with_yaml(FRL, "algorithm", "frl")


def client(epochs: int = 2, optimizer: str = "sgd") -> ClientConfig:
    return ClientConfig(epochs, 4, optimizer, 0.4, 0.9, 1e-4)


def make_frl(epochs: int = 2, **kwargs) -> FRL:
    ctx = BuildContext(
        model_factory=partial(mlp, input_shape=(4,), num_classes=3, hidden=(6,)),
        client=client(epochs),
        aggregator=partial(rank_vote),
        data=None,
        device=torch.device("cpu"),
        seed=0,
        store=ClientStore(),
    )
    return FRL(ctx, **kwargs)


def data(n: int = 10):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def test_round_lr_by_hand():
    # round t (1-based) trains at lr * decay^(t - 1): the reference's lr * lrdc**e, e = t - 1
    assert round_lr(0.4, 0.999, 1) == 0.4
    assert round_lr(0.4, 0.999, 2) == pytest.approx(0.3996, abs=1e-15)
    assert round_lr(0.4, 0.999, 3) == pytest.approx(0.3992004, abs=1e-15)
    assert round_lr(0.4, 0.999, 41) == pytest.approx(0.4 * 0.999**40, rel=1e-15)
    assert round_lr(0.4, 1.0, 500) == 0.4


def test_cosine_factor_by_hand():
    # epoch e (0-based) of E at (1 + cos(pi e / E)) / 2
    assert [cosine_factor(e, 1) for e in range(1)] == [1.0]
    assert [cosine_factor(e, 2) for e in range(2)] == pytest.approx([1.0, 0.5])
    assert [cosine_factor(e, 3) for e in range(3)] == pytest.approx([1.0, 0.75, 0.25])
    five = [1.0, 0.9045084972, 0.6545084972, 0.3454915028, 0.0954915028]
    assert [cosine_factor(e, 5) for e in range(5)] == pytest.approx(five, abs=1e-10)
    # torch's CosineAnnealingLR(T_max=E), stepped once an epoch, as the reference code
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=5)
    seen = []
    for _ in range(5):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx(five, abs=1e-10)


def trained_lrs(frl: FRL, round_idx: int) -> list[tuple[float, ...]]:
    """Each phase's learning rates of client 0 trained in round `round_idx`."""
    state = frl.init_state()
    seen = []
    end = frl.end

    def spy(module, payloads, params, training):
        seen.append([p.lrs for p in training.phases[0]])
        return end(module, payloads, params, training)

    frl.end = spy
    ctx = RoundContext(round_idx, (0,), 0)

    class Data:
        batch_transform = None

        def train(self, client_id):
            return data()

    SequentialExecutor().run(frl, frl.configure_round(state, ctx), ctx, Data())
    return seen[0]


def test_lr_rules_reach_the_optimizer_each_epoch():
    lr3 = 0.4 * 0.999**2  # round 3
    both = trained_lrs(make_frl(round_lr_decay=0.999, local_lr_schedule="cosine"), 3)
    assert both == [pytest.approx((lr3,)), pytest.approx((lr3 * 0.5,))]
    assert both[0][0] == pytest.approx(0.3992004, abs=1e-12)
    decay_only = trained_lrs(make_frl(round_lr_decay=0.999), 3)
    assert decay_only == [pytest.approx((lr3,))]  # one phase of 2 epochs
    cosine_only = trained_lrs(make_frl(epochs=3, local_lr_schedule="cosine"), 7)
    assert cosine_only == [pytest.approx((0.4,)), pytest.approx((0.3,)), pytest.approx((0.1,))]


def test_defaults_train_as_the_plain_client_module():
    frl = make_frl()
    assert (frl.round_lr_decay, frl.local_lr_schedule) == (1.0, "constant")
    assert [p.epochs for p in frl.module.phases()] == [2]
    assert trained_lrs(frl, 40) == [(0.4,)]  # exactly client.lr, whatever the round


def reference_loop(model, x, y, carry: bool) -> None:
    """The reference code's local training by hand: one SGD at round 3's lr (0.4·0.999^2),
    CosineAnnealingLR(T_max=2) stepped once an epoch; `carry=False` restarts the optimizer (its
    momentum) at each epoch instead."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.4 * 0.999**2, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2)
    g = torch.Generator().manual_seed(5)
    for epoch in range(2):
        if epoch and not carry:
            lr = opt.param_groups[0]["lr"]
            opt = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-4)
        order = torch.randperm(len(y), generator=g)
        for start in range(0, len(y), 4):
            idx = order[start : start + 4]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if carry:
            sched.step()


def test_cosine_schedule_trains_as_one_sgd_with_torchs_scheduler():
    """Round 3, E = 2: the scores after local training are the reference loop's (one SGD,
    torch's scheduler, the momentum carried over the epochs)."""
    frl = make_frl(round_lr_decay=0.999, local_lr_schedule="cosine")
    state = frl.init_state()
    payload = frl.configure_round(state, RoundContext(3, (0,), 0))[0]
    module = frl.module
    begin_one(frl, 0, payload)
    carried, restarted = copy.deepcopy(module.model), copy.deepcopy(module.model)
    x, y = data()
    train_local(module, x, y, 4, torch.Generator().manual_seed(5))
    reference_loop(carried, x, y, carry=True)
    reference_loop(restarted, x, y, carry=False)
    pairs = zip(*(supermask_layers(m) for m in (module.model, carried, restarted)))
    moved = False
    for mine, ref, other in pairs:
        torch.testing.assert_close(mine.scores, ref.scores, rtol=0, atol=1e-7)
        moved |= not torch.allclose(mine.scores, other.scores, rtol=0, atol=1e-6)
    assert moved  # restarting the momentum each epoch would train differently


def test_cosine_trains_client_by_client_and_bad_values_are_refused():
    assert make_frl(local_lr_schedule="cosine").vectorizable is False
    assert make_frl(round_lr_decay=0.999).vectorizable is True
    with pytest.raises(ConfigError, match="cannot be vectorized"):
        executor_named("vectorized", "cpu").check_algorithm(make_frl(local_lr_schedule="cosine"), 2)
    for bad in (0, 1.5, -0.1, True, "0.9"):
        with pytest.raises(ConfigError, match="algorithm.round_lr_decay"):
            make_frl(round_lr_decay=bad)
    with pytest.raises(ConfigError, match="algorithm.local_lr_schedule"):
        make_frl(local_lr_schedule="step")


class TwoClients:
    batch_transform = None

    def train(self, client_id):
        return data(10 + client_id)

    def train_many(self, client_ids):
        xs, ys = zip(*(self.train(c) for c in client_ids))
        return torch.cat(xs), torch.cat(ys), [len(y) for y in ys]


def uploads(executor, decay: float) -> list[torch.Tensor]:
    frl = make_frl(round_lr_decay=decay)
    state, ctx = frl.init_state(), RoundContext(3, (0, 1), 0)
    results = executor.run(frl, frl.configure_round(state, ctx), ctx, TwoClients())
    return [layer for r in list(results) for layer in r.upload.layers]


def test_round_decay_trains_alike_on_both_executors():
    """The decayed lr reaches the vectorized executor's batched cohort too (it reads the lr off
    `configure_optimizers` once the round is configured)."""
    sequential = uploads(SequentialExecutor(), 0.5)
    vectorized = uploads(executor_named("vectorized", "cpu"), 0.5)
    assert all(torch.equal(a, b) for a, b in zip(sequential, vectorized))
    undecayed = uploads(SequentialExecutor(), 1.0)
    assert not all(torch.equal(a, b) for a, b in zip(sequential, undecayed))


RULES = ("algorithm.round_lr_decay=0.5", "algorithm.local_lr_schedule=cosine")
BASE = ("algorithm=frl", "rounds=3", "eval_every=1", "checkpoint_every=0", "client.local_epochs=2")


def test_resume_with_the_lr_rules_matches_an_uninterrupted_run(compose_cfg, lifecycle, tmp_path):
    cfg = compose_cfg(*BASE, *RULES)
    ref = lifecycle.run(cfg, tmp_path / "reference")
    run_dir = tmp_path / "stopped"
    stopped = lifecycle.run(cfg, run_dir, callbacks=[lifecycle.SignalAfter(1)])
    assert stopped["rounds_completed"] == 1 and stopped["checkpoint_round"] == 1
    resumed = lifecycle.run(cfg, run_dir, resume=True)
    assert resumed["status"] == "completed" and resumed["resumed_from_round"] == 1
    assert lifecycle.rows(run_dir) == lifecycle.rows(tmp_path / "reference")
    assert lifecycle.final(resumed) == lifecycle.final(ref)
    # the rules change the run: without them it ends elsewhere
    lifecycle.run(compose_cfg(*BASE), tmp_path / "plain")
    assert lifecycle.rows(tmp_path / "plain") != lifecycle.rows(tmp_path / "reference")
