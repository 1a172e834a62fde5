"""privacy=mia runs to the end with every algorithm: a metric where an eavesdropper can rebuild a
model from one upload, no metric where it cannot (FedHeNN heterogeneous with
upload=representations: only representations travel; FedProto: only class prototypes; FedMD:
only class scores; local, centralised: nothing travels)."""

from __future__ import annotations

from pathlib import Path

import pytest

CONF = Path(__file__).resolve().parents[2] / "conf"
ALGORITHMS = sorted(p.stem for p in (CONF / "algorithm").glob("[!_]*.yaml"))
HETERO = ("algorithm.variant=heterogeneous",)
REPRESENTATIONS = (*HETERO, "algorithm.upload=representations")
NO_EAVESDROPPED_MODEL = {
    ("fedhenn", REPRESENTATIONS),
    ("fedproto", ()),
    ("fedmd", ()),
    ("local", ()),
    ("centralised", ()),
}
CASES = [(a, ()) for a in ALGORITHMS] + [("fedhenn", HETERO), ("fedhenn", REPRESENTATIONS)]


@pytest.mark.parametrize(("algorithm", "options"), CASES, ids=[" ".join((a, *o)) for a, o in CASES])
def test_mia_audit_completes_for_every_algorithm(
    algorithm, options, compose_cfg, lifecycle, tmp_path
):
    overrides = [f"algorithm={algorithm}", "privacy=mia", "privacy.num_targets=1"]
    overrides += ["privacy.num_shadows=2", "privacy.attack_model=logistic", "rounds=1", *options]
    summary = lifecycle.run(compose_cfg(*overrides), tmp_path / "run")
    assert summary["status"] == "completed"
    metrics = summary["metrics"]
    if (algorithm, options) in NO_EAVESDROPPED_MODEL:
        assert "privacy/mia_acc" not in metrics
    else:
        assert 0.0 <= metrics["privacy/mia_acc"] <= 1.0
