"""A refused resume changes nothing: a damaged checkpoint (a missing section, a tensor of the
wrong shape, a round that is not a number, flipped bits in a weight), an unreadable saved config
or a metrics file replaced by a directory is refused in one line, and the run dir hashes the same
before and after (its lock file aside, which holds the pid of its last holder)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import main_in_process
from fedexp.runtime.checkpoint import CHECKPOINT_FILE, save_checkpoint
from fedexp.runtime.run_dir import LOCK_FILE


def digest(run_dir: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(run_dir.rglob("*")):
        if path.name != LOCK_FILE:
            h.update(str(path.relative_to(run_dir)).encode())
            h.update(path.read_bytes() if path.is_file() else b"<dir>")
    return h.hexdigest()


def resealed(change):
    """A damage written with a valid checksum: only the sections' own checks can find it."""

    def damage(run: Path) -> None:
        payload = torch.load(run / CHECKPOINT_FILE, weights_only=True)
        change(payload)
        payload.pop("checksum")
        save_checkpoint(run / CHECKPOINT_FILE, payload)

    return damage


def flip_bits(run: Path) -> None:
    """A few flipped bits in a weight, the file otherwise as written (its checksum kept)."""
    payload = torch.load(run / CHECKPOINT_FILE, weights_only=True)
    bits = payload["server"]["params"].view(torch.int32)
    bits[:3] ^= 1 << 4
    torch.save(payload, run / CHECKPOINT_FILE)


def unreadable_config(run: Path) -> None:
    (run / ".hydra" / "config.yaml").write_text("seed: [1, 2\nrounds: 3\n")


def metrics_as_a_dir(run: Path) -> None:
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").mkdir()


DAMAGES = {
    "missing section": (
        resealed(lambda p: p.pop("orchestrator")),
        "is damaged: it has no 'orchestrator' section",
    ),
    "wrong shape": (
        resealed(lambda p: p["server"].update(params=torch.zeros(7))),
        "does not fit this run: server.params is (7,) torch.float32, the model's is (",
    ),
    "round not a number": (
        resealed(lambda p: p.update(round="ten")),
        "is damaged: round is str 'ten'",
    ),
    "flipped bits": (flip_bits, "does not match the checksum saved with it"),
    "unreadable config": (unreadable_config, "config.yaml is not a readable config (ParserError"),
    "metrics a dir": (metrics_as_a_dir, "metrics.jsonl is not a file; the run dir is damaged"),
}


def test_a_refused_resume_leaves_the_run_dir_byte_for_byte(
    compose_cfg, lifecycle, tmp_path, monkeypatch, capsys
):
    # what a kill after round 3 leaves: a checkpoint of round 2, rows 1..3, no summary
    cfg = compose_cfg("rounds=3", "eval_every=1", "checkpoint_every=2")
    pristine = tmp_path / "pristine"
    (pristine / ".hydra").mkdir(parents=True)
    (pristine / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    lifecycle.run(cfg, pristine)
    (pristine / "summary.json").unlink()
    assert len(lifecycle.rows(pristine)) == 3
    for name, (damage, expected) in DAMAGES.items():
        run = tmp_path / name.replace(" ", "-")
        shutil.copytree(pristine, run)
        damage(run)
        before = digest(run)
        code, err = main_in_process(monkeypatch, capsys, f"resume={run}")
        assert code == 2, (name, err)
        assert err.startswith("fedexp: error: resume: ") and err.count("\n") == 1, (name, err)
        assert expected in err, (name, err)
        assert digest(run) == before, name  # nothing truncated, rewritten or appended


@pytest.mark.parametrize("bits", [1, 1 << 20])
def test_any_changed_bit_of_a_weight_fails_the_checksum(tmp_path, bits):
    from fedexp.runtime.checkpoint import content_checksum

    payload = {"server": {"params": torch.linspace(-1, 1, 64)}, "round": 3}
    changed = {"server": {"params": payload["server"]["params"].clone()}, "round": 3}
    changed["server"]["params"].view(torch.int32)[17] ^= bits
    assert content_checksum(payload) != content_checksum(changed)
    assert content_checksum(payload) == content_checksum(
        {"round": 3, "server": {"params": torch.linspace(-1, 1, 64)}}  # the same content
    )
