"""FedProto: prototypes are class means of the representations; the server's count-weighted
average; the prototype term of the local loss; heterogeneous models from the CLI."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from components import with_yaml
from conftest import main_in_process
from fedexp.algorithms.fedproto import FedProto, Prototypes, class_prototypes
from fedexp.core.types import ClientResult, ConfigError, RoundContext, ServerState
from fedexp.models.mlp import BodyHead
from handworld import begin_one, make_ctx, one_round, small_mlp

FedProto = with_yaml(FedProto, "algorithm", "fedproto")


def identity_body():
    """body(x) = x (a 2x2 identity Linear), head a zero Linear."""
    body = nn.Linear(2, 2)
    with torch.no_grad():
        body.weight.copy_(torch.eye(2))
        body.bias.zero_()
    head = nn.Linear(2, 3)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return BodyHead(body, head)


def test_prototypes_are_exactly_the_class_means_by_hand():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 0.0]])
    y = torch.tensor([0, 0, 1])
    protos, counts = class_prototypes(identity_body(), x, y, num_classes=3, batch_size=2)
    assert torch.equal(protos, torch.tensor([[2.0, 3.0], [5.0, 0.0], [0.0, 0.0]]))
    assert torch.equal(counts, torch.tensor([2.0, 1.0, 0.0]))
    upload = Prototypes(protos, counts)
    assert upload.num_bits() == 2 * (2 + 1) * 32  # two classes present: 2 floats + a count


def test_the_upload_is_the_class_means_of_the_trained_models_representations(two_clients):
    algo = FedProto(make_ctx(two_clients, factory=small_mlp))
    state = algo.init_state()
    _, results, _, _ = one_round(algo, two_clients, state=state, aggregate=False)
    for r in results:
        model = algo.personal_model(state, r.client_id)  # the stored, trained model
        x, y = two_clients.train(r.client_id)
        with torch.no_grad():
            rep = model.body(x)  # one sample: its class mean is its representation
        assert torch.equal(r.upload.protos[int(y[0])], rep[0])
        assert torch.equal(r.upload.counts, torch.eye(2)[int(y[0])])
        assert torch.equal(r.upload.protos[1 - int(y[0])], torch.zeros(4))
    # clients start from different models (seed, client id) and keep their own
    assert not torch.equal(algo.store.get(0), algo.store.get(1))


def test_server_averages_per_class_weighted_by_counts(two_clients):
    algo = FedProto(make_ctx(two_clients, factory=identity_body))
    old = torch.tensor([[9.0, 9.0], [8.0, 8.0], [7.0, 7.0]])
    state = ServerState(None, {"protos": old, "mask": torch.tensor([0.0, 0.0, 1.0])})
    up0 = Prototypes(torch.tensor([[1.0, 0.0], [2.0, 2.0], [0.0, 0.0]]), torch.tensor([1.0, 3, 0]))
    up1 = Prototypes(torch.tensor([[4.0, 3.0], [0.0, 0.0], [0.0, 0.0]]), torch.tensor([2.0, 0, 0]))
    results = [ClientResult(0, 4, up0, 0.0, 1), ClientResult(1, 2, up1, 0.0, 1)]
    new, metrics = algo.aggregate(state, results, RoundContext(1, (0, 1), 0))
    # class 0: (1*[1,0] + 2*[4,3]) / 3 = [3, 2]; class 1: client 0's only; class 2: kept
    expected = torch.tensor([[3.0, 2.0], [2.0, 2.0], [7.0, 7.0]])
    torch.testing.assert_close(new.buffers["protos"], expected, rtol=0, atol=1e-6)
    assert torch.equal(new.buffers["mask"], torch.ones(3))
    assert metrics["fedproto/classes_with_prototype"] == 3.0
    algo.weighting = "uniform"  # the reference code: plain mean over the clients holding j
    new, _ = algo.aggregate(state, results, RoundContext(1, (0, 1), 0))
    torch.testing.assert_close(new.buffers["protos"][0], torch.tensor([2.5, 1.5]))


def test_local_loss_adds_ld_times_the_distance_to_the_class_prototype(two_clients):
    algo = FedProto(make_ctx(two_clients, factory=identity_body), ld=0.5)
    protos = torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    module = begin_one(algo, 0, Prototypes(protos, torch.tensor([1.0, 0.0, 0.0])))
    with torch.no_grad():
        module.model.body.weight.copy_(torch.eye(2))  # body(x) = x
        module.model.body.bias.zero_()
    x = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    y = torch.tensor([0, 1])
    ce = F.cross_entropy(module.model(x), y)
    # class 0 has a prototype: (1-0)^2 + (2-1)^2 = 2; class 1 has none: 0. MSE over 2x2 = 0.5
    loss = module.training_step((x, y), 0)
    assert loss.item() == pytest.approx(ce.item() + 0.5 * 0.5, abs=1e-6)
    module.distance = "sq_l2"  # ||.||^2 averaged over the batch: 2 / 2 = 1
    assert module.training_step((x, y), 0).item() == pytest.approx(ce.item() + 0.5, abs=1e-6)


def test_bad_options_are_config_errors(two_clients):
    with pytest.raises(ConfigError, match="algorithm.ld"):
        FedProto(make_ctx(two_clients, factory=small_mlp), ld=-1.0)
    with pytest.raises(ConfigError, match="algorithm.distance"):
        FedProto(make_ctx(two_clients, factory=small_mlp), distance="l1")


@pytest.mark.experiment
def test_cli_runs_heterogeneous_models_and_refuses_unequal_widths(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    base = ["algorithm=fedproto", "model=cnn_family", "debug=smoke"]
    code, err = main_in_process(monkeypatch, capsys, *base, f"hydra.run.dir={tmp_path}/bad")
    assert code == 2 and "model: FedProto averages representations" in err
    assert not (tmp_path / "bad").exists()
    run = tmp_path / "run"
    args = [*base, "model.min_fc_layers=2", f"hydra.run.dir={run}"]
    code, err = main_in_process(monkeypatch, capsys, *args)
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    metrics = summary["metrics"]
    assert 0.0 <= metrics["eval/personal/acc_mean"] <= 1.0
    assert "eval/global/acc" not in metrics
    described = summary["describe"]
    archs = [k for k in described if k.startswith("fedproto/arch") and k.endswith("_clients")]
    assert len(archs) == 5
