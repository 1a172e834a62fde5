"""FedHeNN through the real CLI at tiny size."""

from __future__ import annotations

from conftest import summaries

ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # tiny models on a shared machine


def test_heterogeneous_run_where_all_five_architectures_occur(cli):
    # seed 1 gives clients 0..7 the architectures 2 0 0 4 1 0 2 3: all five, all trained
    cli(
        "algorithm=fedhenn",
        "algorithm.variant=heterogeneous",
        "model=cnn_family",
        "debug=smoke",
        "seed=1",
        "num_clients=8",
        "clients_per_round=8",
        env=ONE_THREAD,
    )
    (summary,) = summaries(cli.cwd)
    assert summary["status"] == "completed"
    assert [summary["describe"][f"fedhenn/arch{a}_clients"] for a in range(5)] == [3, 1, 2, 1, 1]
    metrics = summary["metrics"]
    assert metrics["eval/personal/acc_mean"] > 0.1  # better than chance over 10 classes
    assert "eval/global/acc" not in metrics  # no global model
    assert metrics["comm/up_bits_total"] > 0 and metrics["fedhenn/eta"] > 0
