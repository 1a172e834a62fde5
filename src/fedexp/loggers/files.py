"""File loggers: metrics.jsonl + summary.json always; metrics.csv with `logger=csv`."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Any

from fedexp.core.summary import RunSummary
from fedexp.loggers.base import Logger


def _clean(value: Any) -> Any:
    """Non-finite floats become null (JSON has no NaN), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write strict JSON via a temp file + rename, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(obj), indent=2, sort_keys=True, default=str, allow_nan=False))
    os.replace(tmp, path)


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _jsonl_round(line: str) -> float:
    """The line's round; a malformed (half-written) line sorts after every round."""
    try:
        return int(json.loads(line).get("round", 0))
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return float("inf")


def _csv_round(line: str, col: int) -> float:
    """The row's round; a malformed (half-written) row sorts after every round."""
    try:
        return int(line.split(",")[col])
    except (IndexError, ValueError):
        return float("inf")


class RunRecorder(Logger):
    """metrics.jsonl (one line per round; the evaluation's metrics on evaluated rounds) and
    summary.json."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"

    def truncate(self, last_round: int) -> None:
        """Keep the lines of rounds up to `last_round`; a half-written last line goes too."""
        if self.path.exists():
            lines = self.path.read_text().splitlines()
            keep = [line for line in lines if _jsonl_round(line) <= last_round]
            write_text_atomic(self.path, "".join(line + "\n" for line in keep))

    def log_metrics(self, metrics: dict, step: int) -> None:
        try:
            with self.path.open("a") as f:
                f.write(json.dumps({k: _clean(v) for k, v in metrics.items()}) + "\n")
        except OSError as err:  # a full disk: a failed write names no file by itself
            err.filename = err.filename or str(self.path)
            raise

    def finish(self, summary: RunSummary) -> None:
        self.write_summary(summary)

    def write_summary(self, summary: RunSummary) -> None:
        write_json_atomic(self.run_dir / "summary.json", summary.to_dict())


class CSVLogger(Logger):
    """metrics.csv: one row per round. A metric that first appears in a later round (the
    evaluation's on the first evaluated round, an audit at the last evaluation) widens the
    table: the file is rewritten once with the new header, earlier rows left blank in the new
    columns."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / "metrics.csv"
        self.fields: list[str] | None = None
        if self.path.exists() and self.path.stat().st_size:  # a resumed run appends rows
            with self.path.open(newline="") as f:
                self.fields = next(csv.reader(f), None)

    def truncate(self, last_round: int) -> None:
        """Keep the header and the rows of rounds up to `last_round` (a half-written last row
        goes too)."""
        if not self.path.exists():
            return
        lines = self.path.read_text().splitlines()
        if lines:
            header = lines[0].split(",")
            col = header.index("round") if "round" in header else 0
            body = [line for line in lines[1:] if _csv_round(line, col) <= last_round]
            write_text_atomic(self.path, "".join(line + "\n" for line in [lines[0], *body]))

    def log_metrics(self, metrics: dict, step: int) -> None:
        if self.fields is None:
            self.fields = list(metrics)
            self._rewrite([])
        added = [k for k in metrics if k not in self.fields]
        if added:
            with self.path.open(newline="") as f:
                rows = list(csv.DictReader(f))
            self.fields += added
            self._rewrite(rows)
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.fields).writerow(metrics)

    def _rewrite(self, rows: list[dict]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.fields)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, self.path)
