import csv
import json
import math

from fedexp.loggers.files import CSVLogger, write_json_atomic


def test_csv_widens_when_a_metric_first_appears_late(tmp_path):
    logger = CSVLogger(tmp_path)
    logger.log_metrics({"round": 1, "acc": 0.5}, step=1)
    logger.log_metrics({"round": 2, "acc": 0.6, "privacy/mia_acc": 0.55}, step=2)
    with (tmp_path / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows == [
        {"round": "1", "acc": "0.5", "privacy/mia_acc": ""},
        {"round": "2", "acc": "0.6", "privacy/mia_acc": "0.55"},
    ]


def test_summary_json_is_strict_json(tmp_path):
    write_json_atomic(tmp_path / "s.json", {"a": math.nan, "b": [1.0, math.inf], "c": {"d": 2.0}})
    assert json.loads((tmp_path / "s.json").read_text()) == {
        "a": None,
        "b": [1.0, None],
        "c": {"d": 2.0},
    }
