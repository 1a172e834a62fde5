"""Checkpoint files: safe to load, atomic, checked; metric logs truncated; RNG streams restored."""

from __future__ import annotations

import json
import random
from fractions import Fraction

import numpy as np
import pytest
import torch

from fedexp.core.types import ConfigError
from fedexp.loggers.files import CSVLogger, RunRecorder
from fedexp.runtime.checkpoint import (
    FORMAT_VERSION,
    check_saveable,
    config_hash,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def payload(**extra):
    return {
        "format": FORMAT_VERSION,
        "config_hash": "abc",
        "round": 7,
        "server": {"params": torch.arange(3.0), "buffers": {"momentum": torch.ones(3), "n": 2}},
        "client_store": {0: torch.zeros(2), 5: {"head": torch.ones(1), "steps": [1, 2]}},
        **extra,
    }


def test_a_checkpoint_round_trips_through_a_weights_only_load(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, payload())
    loaded = load_checkpoint(path, expected_hash="abc")
    assert loaded["round"] == 7 and loaded["server"]["buffers"]["n"] == 2
    assert torch.equal(loaded["server"]["params"], torch.arange(3.0))
    assert torch.equal(loaded["client_store"][5]["head"], torch.ones(1))  # int keys survive
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temp file left


def test_a_failed_write_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, payload())
    with pytest.raises(TypeError, match=r"checkpoint\['client_store'\]\[1\]: ndarray"):
        save_checkpoint(path, payload(round=8, client_store={1: np.zeros(2)}))
    assert load_checkpoint(path)["round"] == 7


def test_unsaveable_state_is_named_by_its_path():
    with pytest.raises(TypeError, match=r"state\['buffers'\]\['rng'\]: Generator"):
        check_saveable({"buffers": {"rng": torch.Generator()}}, "state")
    check_saveable({"a": [1, 2.0, "x", None, (torch.ones(1),)]})


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"not a zip file at all", "is not a readable checkpoint"),
        (None, "is not a fedexp checkpoint"),
    ],
)
def test_an_unreadable_or_foreign_file_is_one_config_error(tmp_path, content, expected):
    path = tmp_path / "checkpoint.pt"
    if content is None:
        torch.save({"weights": torch.ones(2)}, path)
    else:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=expected) as err:
        load_checkpoint(path)
    assert "\n" not in str(err.value)


def test_a_truncated_checkpoint_is_one_config_error(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, payload())
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ConfigError, match="is not a readable checkpoint"):
        load_checkpoint(path)


def test_a_pickled_object_is_refused(tmp_path):
    # weights_only loading refuses arbitrary globals: a checkpoint cannot run code on load
    path = tmp_path / "checkpoint.pt"
    torch.save({"format": FORMAT_VERSION, "x": Fraction(1, 3)}, path)
    with pytest.raises(ConfigError, match="is not a readable checkpoint"):
        load_checkpoint(path)


def test_the_config_hash_ignores_keys_that_do_not_change_results(tmp_path):
    cfg = {"seed": 0, "rounds": 5, "device": "cpu", "progress": True, "checkpoint_every": 2}
    same = dict(cfg, device="cuda", progress=False, checkpoint_every=0, resume="x")
    assert config_hash(cfg) == config_hash(same)
    assert config_hash(cfg) != config_hash(dict(cfg, seed=1))
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, payload(config_hash=str(config_hash(dict(cfg, seed=9)))))
    with pytest.raises(ConfigError, match="config hash mismatch"):
        load_checkpoint(path, expected_hash=config_hash(cfg))


def test_metric_logs_keep_only_rounds_up_to_the_checkpoint(tmp_path):
    rows = [{"round": t, "eval/global/acc": t / 10} for t in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"round": 6, "ev'
    )
    csv = ["round,eval/global/acc"] + [f"{t},{t / 10}" for t in range(1, 6)] + ["6,0."]
    (tmp_path / "metrics.csv").write_text("\n".join(csv) + "\n")
    RunRecorder(tmp_path).truncate(3)
    CSVLogger(tmp_path).truncate(3)
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept == rows[:3]
    assert (tmp_path / "metrics.csv").read_text().splitlines() == csv[:4]


def test_rng_streams_continue_exactly_after_a_restore():
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    saved = rng_state()
    first = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    set_rng_state(saved)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(first[0], again[0])
    assert np.array_equal(first[1], again[1]) and first[2] == again[2]
    check_saveable(saved)  # and the RNG state itself fits in a weights-only checkpoint


# ---- what a resume must agree with: the resolved config and the data -----------------------------
def test_the_config_hash_is_taken_on_the_resolved_config(monkeypatch):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(
        {
            "seed": 0,
            "paths": {"data_root": "${oc.env:FX_DATA,/a}", "cache_dir": "${oc.env:FX_CACHE,/c}"},
            "dataset": {"data_dir": "${paths.data_root}/digits"},
        }
    )
    monkeypatch.setenv("FX_DATA", "/a")
    saved = config_hash(cfg)
    monkeypatch.setenv("FX_CACHE", "/elsewhere")  # a cache holds nothing a result depends on
    assert config_hash(cfg) == saved
    monkeypatch.setenv("FX_DATA", "/b")
    now = config_hash(cfg)
    assert now != saved
    assert now.stable["dataset"]["data_dir"] == "/b/digits"


def test_a_mismatch_names_the_first_key_that_differs(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"seed": 0, "paths": {"data_root": "${oc.env:FX_DATA,/a}"}})
    monkeypatch.setenv("FX_DATA", "/a")
    saved = config_hash(cfg)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, payload(config_hash=str(saved), resolved_config=saved.stable))
    assert load_checkpoint(path, expected_hash=config_hash(cfg))["round"] == 7
    monkeypatch.setenv("FX_DATA", "/b")
    with pytest.raises(ConfigError, match="config hash mismatch") as err:
        load_checkpoint(path, expected_hash=config_hash(cfg))
    assert "paths.data_root is '/b' now, '/a' in the checkpoint" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_checkpoint_of_the_previous_format_is_refused_in_one_line(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, payload(format=1))
    with pytest.raises(ConfigError, match="older fedexp \\(checkpoint format 1\\)"):
        load_checkpoint(path)


def tiny_data(labels=(0, 1, 0, 1, 2, 2), train=((0, 1), (2, 3)), test=((4,), (5,)), x=None):
    """The parts of a FederatedData that its digest reads."""
    from types import SimpleNamespace

    n = len(labels)
    dataset = SimpleNamespace(
        train_y=torch.tensor(labels),
        train_x=torch.arange(n * 2.0).reshape(n, 2) if x is None else x,
        test_y=None,
    )
    partition = SimpleNamespace(
        train=[np.array(t) for t in train], test=[np.array(t) for t in test]
    )
    return SimpleNamespace(dataset=dataset, partition=partition)


def test_the_data_digest_changes_with_labels_inputs_and_partition_only():
    from fedexp.runtime.checkpoint import check_resumed_data, data_digest

    base = data_digest(tiny_data())
    assert data_digest(tiny_data()) == base  # the same data, built again
    assert data_digest(tiny_data(labels=(0, 1, 0, 1, 2, 0))) != base
    assert data_digest(tiny_data(train=((0, 2), (1, 3)))) != base
    assert data_digest(tiny_data(test=((5,), (4,)))) != base
    assert data_digest(tiny_data(x=torch.arange(12.0).reshape(6, 2) + 1)) != base
    check_resumed_data(None, tiny_data())  # a fresh run: nothing to compare
    check_resumed_data({"data_digest": base}, tiny_data())
    with pytest.raises(ConfigError, match="resume: the data differs from the data the checkpoint"):
        check_resumed_data({"data_digest": base}, tiny_data(train=((0, 1, 2), (3,))))
