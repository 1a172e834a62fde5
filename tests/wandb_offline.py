"""Read back a W&B offline run (run-*.wandb): a LevelDB-style log of protobuf Records."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK, HEADER = 32768, 7


def records(path: Path):
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", "not a W&B run file"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 0:  # zero padding up to the end of the block
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(pending)
            yield rec


def history(path: Path) -> list[dict]:
    """Every logged history row as {key: value}."""
    rows = []
    for rec in records(path):
        if rec.WhichOneof("record_type") == "history":
            rows.append(
                {
                    (i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                    for i in rec.history.item
                }
            )
    return rows


def run_info(path: Path) -> dict:
    """The run record: id, name, group, job_type, tags and config ({key: value})."""
    for rec in records(path):
        if rec.WhichOneof("record_type") == "run":
            return {
                "id": rec.run.run_id,
                "name": rec.run.display_name,
                "group": rec.run.run_group,
                "job_type": rec.run.job_type,
                "tags": list(rec.run.tags),
                "config": {i.key: json.loads(i.value_json) for i in rec.run.config.update},
            }
    return {}


def metric_definitions(path: Path) -> dict:
    """`define_metric` records: {name or glob: (step metric, sorted summary kinds)}."""
    found = {}
    for rec in records(path):
        if rec.WhichOneof("record_type") == "metric":
            m = rec.metric
            kinds = sorted(f.name for f, on in m.summary.ListFields() if on)
            found[m.name or m.glob_name] = (m.step_metric, kinds)
    return found


def history_item(row_path: Path, key: str) -> list[dict]:
    """The value of nested item `key` (a histogram, a table) in every history row holding it."""
    out = []
    for rec in records(row_path):
        if rec.WhichOneof("record_type") != "history":
            continue
        item = {}
        for i in rec.history.item:
            parts = [i.key] if i.key else list(i.nested_key)
            if parts[0] == key:
                item["/".join(parts[1:])] = json.loads(i.value_json)
        if item:
            out.append(item)
    return out


def summary(path: Path) -> dict:
    """The run summary as the last update of each key left it ({key: value})."""
    out: dict = {}
    for rec in records(path):
        if rec.WhichOneof("record_type") == "summary":
            for i in rec.summary.update:
                out[i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
    return out


def artifacts(path: Path) -> list[dict]:
    """Logged artifacts: name, type and metadata."""
    found = []
    for rec in records(path):
        if rec.WhichOneof("record_type") == "artifact":
            a = rec.artifact
            found.append(
                {"name": a.name, "type": a.type, "metadata": json.loads(a.metadata or "{}")}
            )
    return found
