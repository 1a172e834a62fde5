"""A researcher's LightningModule as the task loss: logging, optimizers, refusals, laziness."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from functools import partial

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from components import with_yaml
from conftest import REPO
from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.fedprox import FedProx
from fedexp.algorithms.fedrep import FedRep
from fedexp.core import client as client_module
from fedexp.core.client import ClientModule
from fedexp.core.types import ConfigError
from fedexp.core.user_module import factory_arguments
from fedexp.data.datasets import Dataset
from fedexp.data.federated import FederatedData
from fedexp.data.partition import Partition
from fedexp.engine.executors.sequential import SequentialExecutor
from fedexp.engine.executors.vectorized import VectorizedExecutor
from fedexp.engine.orchestrator import logged_means
from fedexp.models.mlp import mlp
from handworld import client_cfg, make_ctx, one_round
from lightning_docs_model import LitBodyHead, LitModel

FedAvg = with_yaml(FedAvg, "algorithm", "fedavg")
FedProx = with_yaml(FedProx, "algorithm", "fedprox")
FedRep = with_yaml(FedRep, "algorithm", "fedrep")


class Counting(L.LightningModule):
    """Logs what can be counted by hand: the batch's real samples, a constant, the loss."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return self.lin(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("n", (y >= 0).sum().float())  # padded samples (label -100) do not count
        self.log("one", 1.0)
        self.log_dict({"loss_again": loss})
        return loss


def sized_clients(sizes=(5, 3)) -> FederatedData:
    n = sum(sizes)
    x = torch.linspace(-1, 1, 2 * n).reshape(n, 2)
    y = torch.arange(n) % 2
    ds = Dataset("hand", x, y, x.clone(), y.clone(), 2, (2,))
    bounds = np.cumsum([0, *sizes])
    train = [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    return FederatedData(ds, Partition(train, train), torch.device("cpu"))


@pytest.mark.parametrize(
    "executor", [SequentialExecutor(), VectorizedExecutor(None, False, False, "cpu", "vmap")]
)
def test_logged_values_are_each_clients_mean_over_its_steps(executor):
    # clients of 5 and 3 samples, batches of 2: steps of 2, 2, 1 and of 2, 1 real samples
    data = sized_clients()
    algo = FedAvg(make_ctx(data, factory=Counting, batch_size=2))
    results = one_round(algo, data, executor=executor, aggregate=False)[1]
    assert [r.num_steps for r in results] == [3, 2]
    assert [float(r.logged["n"]) for r in results] == pytest.approx([5 / 3, 3 / 2])
    assert [float(r.logged["one"]) for r in results] == [1.0, 1.0]
    for r in results:  # the logged loss is the loss the executor averaged, bit for bit
        assert torch.equal(r.logged["loss_again"], r.train_loss)
    means = logged_means(results)
    assert means["client/n"] == pytest.approx((5 / 3 + 3 / 2) / 2)
    assert means.keys() == {"client/n", "client/one", "client/loss_again"}


def test_fedprox_adds_its_term_around_the_users_loss():
    data = sized_clients()
    runs = {}
    for mu in (None, 0.0, 0.5):
        torch.manual_seed(0)
        ctx = make_ctx(data, factory=Counting, batch_size=2, seed=3)
        algo = FedAvg(ctx) if mu is None else FedProx(ctx, mu=mu)
        assert algo.shared(algo.module.model) == list(algo.module.model.parameters())
        runs[mu] = one_round(algo, data, aggregate=False)[1]
    for avg, prox0 in zip(runs[None], runs[0.0]):  # mu = 0 is FedAvg exactly
        assert torch.equal(avg.upload.values, prox0.upload.values)
        assert torch.equal(avg.logged["loss_again"], prox0.logged["loss_again"])
    for r in runs[0.5]:  # the user's loss is logged; the trained loss adds mu/2 ||w - w0||^2
        assert r.train_loss > r.logged["loss_again"]


def test_fedrep_shares_the_users_body_and_refuses_a_model_without_one():
    data = sized_clients()
    rep = FedRep(make_ctx(data, factory=lambda: LitBodyHead(num_classes=2, hidden=3)))
    assert rep.shared(rep.module.model) == list(rep.module.model.body.parameters())
    with pytest.raises(ConfigError, match="model: FedRep trains a personal `head`"):
        FedRep(make_ctx(data, factory=LitModel))

    class Extra(LitBodyHead):
        def __init__(self):
            super().__init__(num_classes=2, hidden=3)
            self.scale = nn.Parameter(torch.ones(()))

    with pytest.raises(ConfigError, match="outside `head` and `body`.*scale"):
        FedRep(make_ctx(data, factory=Extra))


def _with_optimizers(result):
    class Mod(LitModel):
        def configure_optimizers(self):
            return result(self)

    return Mod()


def adam(m):
    return torch.optim.Adam(m.parameters(), lr=0.02)


@pytest.mark.parametrize(
    "form",
    [adam, lambda m: [adam(m)], lambda m: {"optimizer": adam(m)}, lambda m: ([adam(m)], [])],
    ids=["optimizer", "list", "dict", "lists"],
)
def test_client_optimizer_module_honours_configure_optimizers(form):
    module = ClientModule(_with_optimizers(form), client_cfg(optimizer="module"))
    optimizer = module.configure_optimizers()
    assert isinstance(optimizer, torch.optim.Adam) and optimizer.param_groups[0]["lr"] == 0.02
    # the default: client.optimizer, whatever the model's own configure_optimizers says
    sgd = ClientModule(LitModel(), client_cfg(lr=0.3)).configure_optimizers()
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["lr"] == 0.3


def _sched(opt):
    return torch.optim.lr_scheduler.StepLR(opt, 1)


@pytest.mark.parametrize(
    "form, problem",
    [
        (lambda m: {"optimizer": (o := adam(m)), "lr_scheduler": _sched(o)}, "LR scheduler"),
        (lambda m: ([o := adam(m)], [_sched(o)]), "LR scheduler"),
        (lambda m: [adam(m), adam(m)], "returned 2 optimizers"),
        (lambda m: None, "must return a torch optimizer, got NoneType"),
        (lambda m: {"lr": 1}, "without 'optimizer'"),
    ],
)
def test_unsupported_optimizer_forms_are_refused_when_built(form, problem):
    with pytest.raises(ConfigError, match=f"client.optimizer: Mod.configure_optimizers.*{problem}"):
        ClientModule(_with_optimizers(form), client_cfg(optimizer="module"))


def test_refusals_of_models_that_cannot_be_the_objective():
    with pytest.raises(ConfigError, match="client.optimizer: module needs a model with its own"):
        ClientModule(nn.Linear(2, 2), client_cfg(optimizer="module"))

    class OwnDataTerm(ClientModule):
        uses_task_loss = False

    with pytest.raises(ConfigError, match="model: OwnDataTerm has its own data term"):
        OwnDataTerm(LitModel(), client_cfg())


def test_client_modules_are_lightning_modules_and_steps_return_dicts_or_tensors():
    module = ClientModule(LitBodyHead(num_classes=2, hidden=3), client_cfg())
    assert isinstance(module, L.LightningModule) and isinstance(module, ClientModule)
    assert type(ClientModule(LitModel(), client_cfg())) is type(module)  # one class, made once
    batch = (torch.zeros(4, 1, 28, 28), torch.tensor([0, 1, 1, 0]))
    loss = module.training_step(batch, 0)  # LitBodyHead returns {"loss": ...}
    assert loss.shape == () and module.log_capture.take_step().keys() == {"train_loss", "train_acc"}


@pytest.mark.parametrize(
    "executor", [SequentialExecutor(), VectorizedExecutor(None, False, False, "cpu", "vmap")]
)
def test_plain_and_lightning_client_modules_train_bit_identically(monkeypatch, executor):
    # without Lightning imported, a client module is a plain nn.Module of its own class
    data = sized_clients()
    factory = partial(mlp, input_shape=(2,), num_classes=2, hidden=(4,))
    algorithms = {"fedavg": FedAvg, "fedprox": partial(FedProx, mu=0.5), "fedrep": FedRep}
    uploads = {}
    for in_play in (True, False):
        monkeypatch.setattr(client_module, "lightning_in_play", lambda in_play=in_play: in_play)
        for name, make in algorithms.items():
            torch.manual_seed(0)
            algo = make(make_ctx(data, factory=factory, batch_size=2, seed=3))
            assert isinstance(algo.module, L.LightningModule) is in_play
            assert isinstance(algo.module, ClientModule)
            uploads[in_play, name] = one_round(algo, data, executor=executor, aggregate=False)[1]
    for name in algorithms:
        for a, b in zip(uploads[True, name], uploads[False, name]):
            assert torch.equal(a.upload.values, b.upload.values) and a.train_loss == b.train_loss


def test_a_lightning_factory_gets_only_the_data_arguments_it_names():
    args = {"input_shape": (1, 28, 28), "num_classes": 10}
    assert factory_arguments(LitModel, args) == {}
    assert factory_arguments(LitBodyHead, args) == {"num_classes": 10}
    assert factory_arguments(make_ctx, args) == args  # fedexp's own factories: unchanged


SCRIPT = """
import sys
from fedexp.__main__ import main
from hydra.core.global_hydra import GlobalHydra
for args in {cases!r}:
    sys.argv = ["fedexp", *args]
    try:
        main()
    except SystemExit as exit_:
        print("exit", args[0], exit_.code, file=sys.stderr)
    GlobalHydra.instance().clear()
    assert "lightning" not in sys.modules, args
print("lightning not imported")
"""


@pytest.mark.cli
def test_help_config_printing_completion_and_config_errors_never_import_lightning(tmp_path):
    cases = [
        ["--help"],
        ["--cfg", "job"],
        ["--shell-completion", "install=bash"],
        ["client.optimizer=bogus", "debug=smoke"],
        ["algorithm=fedavg", "algorithm.weighting=bogus", "debug=smoke"],
    ]
    env = {"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT.format(cases=cases))],
        cwd=tmp_path,
        env={**env, "FEDEXP_CACHE_DIR": str(tmp_path / "c"), "FEDEXP_DATA_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "lightning not imported" in proc.stdout
    assert "exit client.optimizer=bogus 2" in proc.stderr  # the config errors were reached
    assert "exit algorithm=fedavg 2" in proc.stderr
    assert "weighting: must be samples or uniform" in proc.stderr
