"""docs/datasets.md's "Your own dataset" example, as written there: the module is written to a
temp dir and its command line run through `python -m fedexp`'s entry point in this process; the
run is labelled by the target's name, not `custom`."""

from __future__ import annotations

import json
import re
import sys

import pytest
from tests.conftest import REPO, main_in_process

from fedexp.config.build import dataset_label

DOC = (REPO / "docs" / "datasets.md").read_text()


def example() -> tuple[str, list[str]]:
    """(my_data.py's source, the command's overrides) from the docs."""
    source = re.search(r"```python\n# my_data.py\n(.*?)```", DOC, re.S).group(1)
    command = re.search(r"PYTHONPATH=\. python -m fedexp (dataset=custom[^\n]*)", DOC).group(1)
    return source, command.split()


@pytest.mark.experiment
def test_the_documented_custom_dataset_runs_and_labels_the_run(tmp_path, monkeypatch, capsys):
    source, overrides = example()
    (tmp_path / "my_data.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delitem(sys.modules, "my_data", raising=False)
    run_dir = tmp_path / "run"
    try:
        code, err = main_in_process(
            monkeypatch, capsys, *overrides, "debug=smoke", f"hydra.run.dir={run_dir}"
        )
    finally:
        sys.modules.pop("my_data", None)
    assert code == 0, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["choices"]["dataset"] == "two_blobs"
    assert summary["config"]["dataset"]["n"] == 2000
    # centres 2.8 apart, sigma 0.5: FedAvg separates them within the 2 smoke rounds
    assert summary["metrics"]["eval/global/acc"] > 0.9


def test_the_label_is_the_choice_unless_the_target_is_another():
    assert dataset_label("digits", "fedexp.data.datasets.load_digits") == "digits"
    assert dataset_label("shakespeare", "fedexp.data.hub.load_hf") == "shakespeare"  # via hf
    assert dataset_label("custom", "my_data.two_blobs") == "two_blobs"
    assert dataset_label("digits", "my_pkg.data.Blobs") == "Blobs"
