"""FedAvg on a generated Sentiment140 CSV with the LSTM, through the real CLI."""

from __future__ import annotations

import csv

from conftest import run_dirs, summaries


def test_fedavg_sent140_lstm_cli(cli_in_process):
    cli = cli_in_process
    data = cli.cwd / "sent140"
    data.mkdir()
    with open(data / "training.1600000.processed.noemoticon.csv", "w", encoding="latin-1") as fh:
        writer = csv.writer(fh, quoting=csv.QUOTE_ALL)
        for user in range(8):
            for i in range(6):
                label = (user + i) % 2
                words = "great happy" if label else "awful sad"
                text = f"@friend{user} so {words} today #{i} café"
                writer.writerow([4 * label, i, "Mon Apr 06 2009", "NO_QUERY", f"u{user}", text])
    cli("debug=smoke", "dataset=sent140", "model=lstm", f"dataset.data_dir={data}")
    (summary,) = summaries(cli.cwd / "outputs")
    assert summary["status"] == "completed"
    assert summary["config"]["partition"]["_target_"].endswith(".Natural")
    assert 0.0 <= summary["metrics"]["eval/global/acc"] <= 1.0
    (run_dir,) = run_dirs(cli.cwd / "outputs")
    assert len((run_dir / "partition_stats.csv").read_text().splitlines()) == 1 + 6  # clients
    assert (run_dir / "partition_labels.png").exists()
