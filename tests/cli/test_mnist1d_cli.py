"""dataset=mnist1d end to end through the CLI: generated, cached under $FEDEXP_DATA_DIR, trained."""

import pytest

from conftest import summaries


@pytest.mark.slow  # a CLI run; the loader is covered by tests/data/test_mnist1d.py
def test_mnist1d_smoke_run_writes_its_summary_and_cache(cli):
    proc = cli("dataset=mnist1d", "dataset.num_samples=600", "debug=smoke")
    assert "fedavg on mnist1d" in proc.stdout  # the final table
    (summary,) = summaries(cli.cwd / "outputs")
    assert summary["status"] == "completed" and summary["rounds_completed"] == 2
    assert 0.0 <= summary["metrics"]["eval/global/acc"] <= 1.0
    (cached,) = (cli.cwd / "data" / "mnist1d").iterdir()
    assert cached.name.startswith("mnist1d-") and "-n600-seed42-" in cached.name
