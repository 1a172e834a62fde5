"""FedHeNN through the CLI's main (in this process) at tiny size."""

from __future__ import annotations

from conftest import summaries, write_sent140_csv

ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # tiny models on a shared machine


def test_heterogeneous_run_where_all_five_architectures_occur(cli_in_process):
    cli = cli_in_process
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


def test_heterogeneous_sent140_draws_both_lstm_depths(cli_in_process):
    cli = cli_in_process
    data = write_sent140_csv(cli.cwd / "sent140", users=6, per_user=10)
    cli(
        "algorithm=fedhenn",
        "algorithm.variant=heterogeneous",
        "model=lstm_family",
        "dataset=sent140",
        f"dataset.data_dir={data}",
        "partition.server_pool=8",  # 60 tweets: keep most for the clients
        "algorithm.rad_size=8",
        "debug=smoke",
        "seed=1",  # gives clients 0..5 the architectures 1 0 0 1 0 0
        "clients_per_round=6",
        env=ONE_THREAD,
    )
    (summary,) = summaries(cli.cwd)
    assert summary["status"] == "completed"
    counts = [summary["describe"][f"fedhenn/arch{a}_clients"] for a in range(2)]
    assert counts == [4, 2]  # 1- and 2-layer LSTMs both occur
    params = [summary["describe"][f"fedhenn/arch{a}_params"] for a in range(2)]
    # the second LSTM layer: 4 gates x 100 units x (100 inputs + 100 recurrent), two bias vectors
    assert params[1] - params[0] == 4 * 100 * (100 + 100) + 2 * 4 * 100
    assert summary["metrics"]["comm/up_bits_total"] > 0


def test_default_family_auto_picks_the_lstm_family_for_text(cli_in_process):
    cli = cli_in_process
    data = write_sent140_csv(cli.cwd / "sent140", users=6, per_user=10)
    cli(
        "algorithm=fedhenn",
        "algorithm.variant=heterogeneous",
        "dataset=sent140",  # model=lstm: one architecture, so the default family is used
        f"dataset.data_dir={data}",
        "partition.server_pool=8",
        "algorithm.rad_size=8",
        "debug=smoke",
        "rounds=1",
        env=ONE_THREAD,
    )
    (summary,) = summaries(cli.cwd)
    assert "fedhenn/arch1_clients" in summary["describe"]  # the 2-member lstm_family
    assert "fedhenn/arch2_clients" not in summary["describe"]
