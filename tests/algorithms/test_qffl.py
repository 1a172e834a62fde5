"""q-FedAvg: the q-FFL server step on hand numbers, q = 0 as uniform FedAvg, honest F_k."""

import math
from pathlib import Path

import pytest
import torch

from components import with_yaml
from fedexp.aggregators.median import median
from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.qffl import QFedAvg, QfflUpload, qffl_step
from fedexp.core.cohort import RoundResults
from fedexp.core.types import ClientResult, ConfigError, RoundContext, ServerState
from handworld import make_ctx, one_round, small_mlp

FedAvg = with_yaml(FedAvg, "algorithm", "fedavg")
QFedAvg = with_yaml(QFedAvg, "algorithm", "qffl")


def test_server_step_on_hand_numbers():
    # L = 2, q = 1; deltas w_bar - w = -1 and 2, losses F = 1 and 3:
    # Delta w = L (w - w_bar) = [2, -4]; F^q = [1, 3]; h = q F^0 |Dw|^2 + L F = [6, 22]
    # step = -(1*2 + 3*(-4)) / 28 = 10 / 28
    step = qffl_step(torch.tensor([[-1.0], [2.0]]), torch.tensor([1.0, 3.0]), 1.0, 2.0)
    assert step.item() == pytest.approx(10 / 28, rel=1e-6)
    # q = 2: F^2 = [1, 9], h = 2 F |Dw|^2 + L F^2 = [8 + 2, 96 + 18] = [10, 114]
    step = qffl_step(torch.tensor([[-1.0], [2.0]]), torch.tensor([1.0, 3.0]), 2.0, 2.0)
    assert step.item() == pytest.approx(-(2 - 36) / 124, rel=1e-6)


def test_q_zero_is_the_uniform_mean_of_the_client_models():
    # q = 0: h_k = L, so w - sum_k L (w - w_bar_k) / (m L) = mean_k w_bar_k, whatever the F_k
    deltas = torch.tensor([[1.0, -2.0, 0.5], [3.0, 4.0, -1.5], [0.25, 0.0, 8.0]])
    for losses in (torch.tensor([0.1, 2.0, 7.0]), torch.tensor([5.0, 5.0, 5.0])):
        step = qffl_step(deltas, losses, 0.0, 4.0)
        torch.testing.assert_close(step, deltas.mean(0), rtol=0, atol=1e-6)


def test_q_zero_one_round_equals_uniform_fedavg(two_clients):
    # L = 1/lr = 2 is a power of two, so L (w - w_bar) / (2 L) is exactly the mean here
    avg = FedAvg(make_ctx(two_clients, factory=small_mlp, seed=3, lr=0.5), weighting="uniform")
    _, _, expected, _ = one_round(avg, two_clients)
    q0 = QFedAvg(make_ctx(two_clients, factory=small_mlp, seed=3, lr=0.5), q=0.0)
    _, _, got, _ = one_round(q0, two_clients)
    torch.testing.assert_close(got.params, expected.params, rtol=0, atol=1e-7)


def test_uploaded_loss_is_the_received_models_loss_before_training(two_clients):
    # zero weights: softmax = [1/2, 1/2] on every sample, so F_k = log 2 for both clients
    algo = QFedAvg(make_ctx(two_clients), q=1.0)
    state = algo.init_state()
    _, results, new, _ = one_round(algo, two_clients, state=state)
    for r in results:
        assert isinstance(r.upload, QfflUpload)
        assert r.upload.loss.item() == pytest.approx(math.log(2), abs=1e-7)
        assert r.upload.num_bits() == (6 + 1) * 32
    # the step is the q-FFL step of those uploads (L = 1 / 0.1)
    deltas = torch.stack([r.upload.delta for r in results])
    losses = torch.full((2,), math.log(2))
    torch.testing.assert_close(new.params, state.params + qffl_step(deltas, losses, 1.0, 10.0))


def test_larger_q_weights_the_worse_client_more():
    # equal deltas, F = 1 and 4: the step leans toward the high-loss client's delta as q grows
    deltas = torch.tensor([[1.0], [-1.0]])
    losses = torch.tensor([1.0, 4.0])
    steps = [qffl_step(deltas, losses, q, 1.0).item() for q in (0.0, 1.0, 5.0)]
    assert steps[0] == pytest.approx(0.0, abs=1e-7)
    assert steps[0] > steps[1] > steps[2]


def test_bad_options_are_config_errors(two_clients):
    with pytest.raises(ConfigError, match="algorithm.q: must be a number >= 0"):
        QFedAvg(make_ctx(two_clients), q=-1.0)
    ctx = make_ctx(two_clients)
    ctx.aggregator = median
    with pytest.raises(ConfigError, match="aggregator: q-FedAvg"):
        QFedAvg(ctx, q=1.0)


def test_aggregate_applies_the_step_and_reports_the_start_losses(two_clients):
    algo = QFedAvg(make_ctx(two_clients, lr=0.5), q=1.0)  # L = 2
    state = ServerState(params=torch.ones(6))
    d0, d1 = torch.full((6,), -1.0), torch.full((6,), 2.0)
    results = RoundResults.of(
        [
            ClientResult(0, 1, QfflUpload(d0, torch.tensor(1.0)), 0.0, 1),
            ClientResult(1, 5, QfflUpload(d1, torch.tensor(3.0)), 0.0, 1),  # sizes do not weigh
        ]
    )
    new, metrics = algo.aggregate(state, results, RoundContext(1, (0, 1), 0))
    # per coordinate as in the hand test, but |Dw|^2 sums 6 coordinates: h = [4*6+2, 16*6+6]
    expected = 1.0 - (1 * 2 + 3 * (-4)) / (26 + 102)
    torch.testing.assert_close(new.params, torch.full((6,), expected), rtol=1e-6, atol=0)
    assert metrics["qffl/start_loss_mean"] == pytest.approx(2.0)
    assert metrics["qffl/start_loss_var"] == pytest.approx(1.0)


def multimodal_run(tmp_path, q: float, seed: int) -> dict:
    """The digits defaults on WAFFLe's multimodal split (50 rounds), q-FedAvg at `q`."""
    from hydra import compose, initialize_config_dir

    from fedexp.run import Experiment

    torch.set_num_threads(1)
    conf = Path(__file__).resolve().parents[2] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "algorithm=qffl",
                f"algorithm.q={q}",
                "partition=multimodal",
                f"seed={seed}",
                "eval_every=50",
                "checkpoint_every=0",
                "progress=false",
                f"paths.cache_dir={tmp_path / 'cache'}",
            ],
        )
    run_dir = tmp_path / f"q{q}-s{seed}"
    run_dir.mkdir(parents=True)
    return Experiment(cfg, run_dir).run().metrics


@pytest.mark.experiment
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_larger_q_lowers_the_variance_of_client_accuracy_on_the_multimodal_split(tmp_path, seed):
    # measured (seeds 0, 1, 2): variance 0.122/0.110/0.114 at q = 0, 0.083/0.069/0.093 at q = 15;
    # the minority group's clients, at 0 accuracy under q = 0, are the ones lifted
    fair = multimodal_run(tmp_path, 15, seed)
    plain = multimodal_run(tmp_path, 0, seed)
    assert fair["eval/global/client_acc_var"] < plain["eval/global/client_acc_var"] - 0.01
    assert fair["eval/global/client_acc_p10"] > plain["eval/global/client_acc_p10"]
