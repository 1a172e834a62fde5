"""The client API: ClientConfig checks, LocalTraining facts on both executors, attacks that
target capabilities rather than classes, and the malicious count reaching `aggregate`."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np
import pytest
import torch
from tests.conftest import smoke_experiment

from components import with_yaml
from fedexp.aggregators.mean import weighted_mean
from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.fedrep import FedRep
from fedexp.attacks import NoAttack
from fedexp.attacks.crafted import LIE, MinMax
from fedexp.attacks.rank_reversal import RankReversal
from fedexp.attacks.transform import Scaling, SignFlip
from fedexp.core.algorithm import BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.client_store import ClientStore
from fedexp.core.cohort import RoundResults
from fedexp.core.local import RULES, ClientConfig, LocalTraining
from fedexp.core.types import (
    FLOAT_BITS,
    ClientResult,
    ConfigError,
    Message,
    RoundContext,
    VectorMessage,
)
from fedexp.data.datasets import Dataset
from fedexp.data.federated import FederatedData
from fedexp.data.partition import Partition
from fedexp.engine.executors.sequential import SequentialExecutor
from fedexp.engine.executors.vectorized import VectorizedExecutor
from fedexp.engine.orchestrator import Orchestrator
from fedexp.models.mlp import mlp
from handworld import client_cfg, make_ctx, two_client_data

NoAttack = with_yaml(NoAttack, "attack", "none")
LIE = with_yaml(LIE, "attack", "lie")
MinMax = with_yaml(MinMax, "attack", "min_max")
SignFlip = with_yaml(SignFlip, "attack", "sign_flip")
Scaling = with_yaml(Scaling, "attack", "scaling")
RankReversal = with_yaml(RankReversal, "attack", "rank_reversal")

GOOD = dict(local_epochs=2, batch_size=3, optimizer="sgd", lr=0.1, momentum=0.0, weight_decay=0.0)


# ---- ClientConfig --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, message",
    [
        ({"lr": 0.0}, "client.lr: must be > 0, got 0.0"),
        ({"lr": 0}, "client.lr: must be > 0, got 0"),  # the value as given
        ({"lr": "fast"}, "client.lr: must be a number, got 'fast'"),
        ({"lr": None}, "client.lr: must be a number, got None"),
        ({"batch_size": 0}, "client.batch_size: must be >= 1, got 0"),
        ({"batch_size": 2.5}, "client.batch_size: must be an int, got 2.5"),
        ({"local_epochs": True}, "client.local_epochs: must be an int, got True"),
        ({"optimizer": "rmsprop"}, "client.optimizer: must be one of ['adam', 'module', 'sgd']"),
        ({"optimizer": 5}, "client.optimizer: must be a string, got 5"),
        ({"momentum": -0.1}, "client.momentum: must be >= 0, got -0.1"),
        ({"weight_decay": -1}, "client.weight_decay: must be >= 0, got -1"),
        # one key after the other, in the order of the fields
        ({"local_epochs": 0, "lr": "fast"}, "client.local_epochs: must be >= 1, got 0"),
        ({"optimizer": "rmsprop", "lr": 0}, "client.optimizer: must be one of"),
    ],
)
def test_client_config_refuses_bad_values_naming_the_key(change, message):
    with pytest.raises(ConfigError) as err:
        ClientConfig(**{**GOOD, **change})
    assert str(err.value).startswith(message)


def test_client_config_states_each_client_rule_once_in_field_order():
    # `rounds` is the run's total, given by the config's checks: no client.* key
    assert list(RULES) == [f.name for f in fields(ClientConfig) if f.name != "rounds"]


def test_client_config_from_mapping_refuses_unknown_and_missing_keys():
    with pytest.raises(ConfigError, match="client.nesterov: not a client setting"):
        ClientConfig.from_mapping({**GOOD, "nesterov": True})
    with pytest.raises(ConfigError, match="client.momentum: missing"):
        ClientConfig.from_mapping({k: v for k, v in GOOD.items() if k != "momentum"})
    with pytest.raises(ConfigError, match="client: must be a mapping of"):
        ClientConfig.from_mapping(None)
    client = ClientConfig.from_mapping({**GOOD, "lr": 1})  # an int lr is a float
    assert client.lr == 1.0 and isinstance(client.lr, float)
    assert client.optimizer_spec == ("sgd", {"lr": 1.0, "weight_decay": 0.0, "momentum": 0.0})
    adam = ClientConfig(**{**GOOD, "optimizer": "adam", "momentum": 0.9})
    assert adam.optimizer_spec == ("adam", {"lr": 0.1, "weight_decay": 0.0})  # no momentum


@pytest.mark.experiment
def test_experiment_builds_the_client_config_once_and_refuses_unknown_keys(tmp_path):
    with pytest.raises(ConfigError, match="client.nesterov: not a client setting"):
        smoke_experiment(tmp_path, "+client.nesterov=true")


# ---- LocalTraining on both executors -------------------------------------------------------------
def uneven_data() -> FederatedData:
    """Client 0 holds 7 training samples, client 1 holds 5 (4 features, 3 classes)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
    partition = Partition(
        [np.arange(0, 7), np.arange(7, 12)], [np.arange(12, 14), np.arange(14, 16)]
    )
    return FederatedData(Dataset("uneven", x, y, x[:4], y[:4], 3, (4,)), partition, "cpu")


class RecordingModule(ClientModule):
    """Keeps every step's loss (sequential executor only: vmap hides them)."""

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.losses.append(float(loss.detach()))
        return loss


class Recording(FedAvg):
    """FedAvg that keeps what each client's `end` was told (and, sequentially, each step's loss)."""

    record_losses = True

    def make_module(self, model):
        if not self.record_losses:
            return super().make_module(model)
        module = RecordingModule(model, self.ctx.client)
        module.losses = []
        return module

    def end(self, module, payloads, params, training):
        record(self.seen, training)
        return super().end(module, payloads, params, training)


def record(seen: dict, training) -> None:
    """Each client's facts of a cohort's training, as one client's `LocalTraining`."""
    for i, cid in enumerate(training.client_ids):
        facts = (training.steps[i], training.samples[i], training.mean_loss[i])
        seen[cid] = LocalTraining(*facts, training.phases[i])


class VectorizedRecording(Recording):
    record_losses = False  # a list attribute of floats would be stacked per client under vmap


def recording_round(executor, algorithm_cls=Recording, **kwargs) -> dict[int, LocalTraining]:
    data = uneven_data()
    ctx = BuildContext(
        lambda: mlp((4,), 3, hidden=(5,)),
        client_cfg(**GOOD),
        weighted_mean,
        data,
        torch.device("cpu"),
        0,
        ClientStore(),
    )
    option = "fedrep" if issubclass(algorithm_cls, FedRep) else "fedavg"
    algorithm = with_yaml(algorithm_cls, "algorithm", option)(ctx, **kwargs)
    algorithm.seen = {}
    state = algorithm.init_state()
    round_ctx = RoundContext(1, (0, 1), 0)
    results = executor.run(algorithm, algorithm.configure_round(state, round_ctx), round_ctx, data)
    for r in results:  # the result repeats the facts `end` was given
        seen = algorithm.seen[r.client_id]
        assert (r.num_samples, r.num_steps) == (seen.samples, seen.steps)
        assert torch.equal(torch.as_tensor(r.train_loss), seen.mean_loss)
    return algorithm.seen, getattr(algorithm.module, "losses", None)


def test_sequential_local_training_facts():
    seen, losses = recording_round(SequentialExecutor())
    # E = 2, B = 3: n = 7 -> 2 * ceil(7/3) = 6 steps; n = 5 -> 2 * ceil(5/3) = 4 steps
    assert [(seen[c].steps, seen[c].samples) for c in (0, 1)] == [(6, 7), (4, 5)]
    assert len(losses) == 10
    assert float(seen[0].mean_loss) == pytest.approx(sum(losses[:6]) / 6, rel=1e-6)
    assert float(seen[1].mean_loss) == pytest.approx(sum(losses[6:]) / 4, rel=1e-6)
    assert seen[0].lr == 0.1 and seen[0].phases[0].lrs == (0.1,)
    assert [(p.name, p.epochs, p.steps) for p in seen[1].phases] == [("all", 2, 4)]


def test_vectorized_local_training_facts_equal_the_sequential_ones():
    sequential, _ = recording_round(SequentialExecutor())
    vectorized, _ = recording_round(
        VectorizedExecutor(None, False, False, "cpu", "vmap"), VectorizedRecording
    )
    for c in (0, 1):
        s, v = sequential[c], vectorized[c]
        assert (v.steps, v.samples, v.phases, v.lr) == (s.steps, s.samples, s.phases, s.lr)
        assert float(v.mean_loss) == pytest.approx(float(s.mean_loss), rel=1e-5)


def test_local_training_phases_of_fedrep_on_both_executors():
    for executor in (SequentialExecutor(), VectorizedExecutor(None, False, False, "cpu", "vmap")):
        seen, _ = recording_round(executor, FedRepRecording, head_epochs=3, body_epochs=1)
        # n = 7, B = 3: 3 steps per epoch; head 3 epochs, body 1
        assert [(p.name, p.epochs, p.steps) for p in seen[0].phases] == [
            ("head", 3, 9),
            ("body", 1, 3),
        ]
        assert seen[0].steps == 12 and seen[0].lr == 0.1


class FedRepRecording(FedRep):
    def end(self, module, payloads, params, training):
        record(self.seen, training)
        return super().end(module, payloads, params, training)


# ---- attacks target capabilities -----------------------------------------------------------------
@dataclass(frozen=True)
class Tagged(VectorMessage):
    """A toy upload: a float vector in a field of its own name, with a label riding along."""

    vector_field = "delta"
    delta: torch.Tensor
    tag: str

    def num_bits(self) -> int:
        return self.delta.numel() * FLOAT_BITS


@dataclass(frozen=True)
class Opaque(Message):
    blob: torch.Tensor

    def num_bits(self) -> int:
        return 0


class Uploads:
    clients_train = True

    def __init__(self, upload_type):
        self.upload_type = upload_type


def flagged(attack, malicious: set[int]):
    attack.malicious = frozenset(malicious)
    return attack


def test_a_new_vector_message_is_accepted_and_corrupted_by_model_poisoning():
    for attack in (LIE(), MinMax(), SignFlip(), Scaling()):
        attack.check_target(Uploads(Tagged))  # no ConfigError: it carries a vector
    with pytest.raises(ConfigError, match="rank_reversal cannot target"):
        RankReversal().check_target(Uploads(Tagged))
    with pytest.raises(ConfigError, match=r"sign_flip cannot target .* Opaque \(nothing"):
        SignFlip().check_target(Uploads(Opaque))
    vectors = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    rows = [Tagged(torch.tensor(v), f"c{c}") for c, v in enumerate(vectors)]
    results = RoundResults.of([ClientResult(c, 1, row, 0.0, 1) for c, row in enumerate(rows)])
    ctx = RoundContext(1, (0, 1, 2), 0)
    # LIE, z = 1, every update known: mean [3, 4] + std [2, 2] = [5, 6], the tag kept
    out = flagged(LIE(knowledge="all", z=1.0), {2}).apply(results, ctx)
    assert isinstance(out[2].upload, Tagged) and out[2].upload.tag == "c2" and out[2].malicious
    assert out[2].upload.delta.tolist() == [5.0, 6.0]
    assert torch.equal(out[0].upload.delta, results[0].upload.delta) and not out[0].malicious
    assert out[0].upload.tag == "c0"
    flipped = flagged(SignFlip(), {0}).apply(results, ctx)[0].upload
    assert flipped.delta.tolist() == [-1.0, -2.0] and flipped.tag == "c0"


# ---- the malicious count reaches aggregate -------------------------------------------------------
class CountingFedAvg(FedAvg):
    def aggregate(self, state, results, ctx):
        self.counts.append(ctx.num_malicious)
        return super().aggregate(state, results, ctx)


@pytest.mark.parametrize("attack, expected", [(NoAttack(), 0), (SignFlip(), 1)])
def test_the_round_loop_tells_aggregate_and_the_aggregator_the_malicious_count(attack, expected):
    two_clients = two_client_data()
    granted = []

    def recording_mean(updates, weights, num_malicious=0):
        granted.append(num_malicious)
        return weighted_mean(updates, weights)

    ctx = make_ctx(two_clients)
    ctx.aggregator = recording_mean
    algorithm = with_yaml(CountingFedAvg, "algorithm", "fedavg")(ctx)
    algorithm.counts = []
    if expected:
        attack.malicious = frozenset({1})
    orch = Orchestrator(
        algorithm,
        SequentialExecutor(),
        two_clients,
        attack,
        seed=0,
        rounds=1,
        clients_per_round=2,
        eval_every=1,
    )
    _, metrics = orch.run_round(algorithm.init_state(), 1)
    assert algorithm.counts == [expected] and granted == [expected]
    assert metrics["attack/malicious_in_round"] == expected
    assert math.isfinite(metrics["train/loss"])
