"""Help, the composed config, tab completion and a config error need no torch (start-up in about
a second); the default experiment starts its first round with torch and Hydra imported but none
of the packages that cost seconds and that it does not use (the times themselves are measured by
`scripts/bench.py --workload startup`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import hydra
import pytest

from fedexp.config.build import add_target_keys, find_conf

REPO = Path(__file__).resolve().parents[2]
# runs `python -m fedexp ARGS` in this interpreter, then reports whether torch (and optuna,
# which only a search needs) was imported, and which of the packages that a run of the default
# experiment does not need were
PROBE = """
import runpy, sys
sys.argv = ["fedexp", *sys.argv[1:]]
code = 0
try:
    runpy.run_module("fedexp", run_name="__main__")
except SystemExit as exit_:
    code = exit_.code
print(f"torch imported: {'torch' in sys.modules}; exit {code}", file=sys.stderr)
print(f"optuna imported: {'optuna' in sys.modules}", file=sys.stderr)
"""
# runs `python -m fedexp ARGS` up to the start of round 1, then reports which of the packages
# that cost seconds to import and that the default experiment does not use were imported
FIRST_ROUND = """
import os, runpy, sys
from fedexp.engine.orchestrator import Orchestrator

def first_round(*args, **kwargs):
    unused = ("lightning", "pytorch_lightning", "torchmetrics", "torchvision", "sklearn", "wandb")
    print(f"imported: {[name for name in unused if name in sys.modules]}", file=sys.stderr)
    import torch  # the round's first optimizer: what it would import lands in round 1's time
    before = set(sys.modules)
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    print(f"the optimizer imported: {sorted(set(sys.modules) - before)[:3]}", file=sys.stderr)
    sys.stderr.flush()
    os._exit(0)

Orchestrator.run_round = first_round
sys.argv = ["fedexp", *sys.argv[1:]]
runpy.run_module("fedexp", run_name="__main__")
"""


def probe(tmp_path, *args: str, env=None, script=PROBE) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=str(REPO / "src"), **(env or {}))
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "code", "shown"),
    [
        (("--help",), 0, "== Examples =="),
        (("--cfg", "job", "algorithm=fedprox"), 0, "mu:"),
        (("rounds=0",), 2, "fedexp: error: rounds: must be >= 1, got 0"),
        (("client.optimizer=lbfgs",), 2, "fedexp: error: client.optimizer: must be one of"),
        (("seed=abc",), 2, "fedexp: error: seed: must be"),
        (("nosuchkey=1",), 2, "fedexp: error: nosuchkey: no such key in the config"),
    ],
)
def test_no_torch_before_a_run(tmp_path, args, code, shown):
    proc = probe(tmp_path, *args)
    assert f"torch imported: False; exit {code}" in proc.stderr, proc.stderr
    assert "optuna imported: False" in proc.stderr  # Hydra imports every sweeper plugin
    assert shown in proc.stdout + proc.stderr
    assert list(tmp_path.glob("outputs/runs/*/*")) == []  # no run dir left


def test_tab_completion_needs_no_torch(tmp_path):
    env = {"COMP_LINE": "fedexp algorithm=fed", "COMP_POINT": "20"}
    proc = probe(tmp_path, "-sc", "query=bash", env=env)
    assert "torch imported: False; exit 0" in proc.stderr, proc.stderr
    assert {"algorithm=fedavg", "algorithm=fedprox"} <= set(proc.stdout.split())


def test_the_help_page_lists_the_groups_examples_and_outputs(tmp_path):
    out = probe(tmp_path, "--help").stdout
    assert out.startswith("fedexp: a federated-learning experiment runner")
    for group in ("algorithm: ", "dataset: ", "partition: ", "logger: "):
        assert group in out
    examples = out.split("== Examples ==")[1].split("==")[0]
    assert [line.split()[:3] for line in examples.strip().splitlines()] == [
        ["python", "-m", "fedexp"]
    ] * 5
    assert "outputs/runs/<date>/<time>/" in out


def test_the_help_page_lists_every_option_a_user_picks_and_no_internal_table(tmp_path):
    out = probe(tmp_path, "--help").stdout
    listed = {
        line.split(": ")[0]: set(line.split(": ")[1].split(", "))
        for line in out.split("== Config groups (group=option) ==")[1].split("==")[0].splitlines()
        if ": " in line
    }
    conf = REPO / "conf"
    picked = {"algorithm", "dataset", "model", "partition", "attack", "aggregator", "experiment"}
    for group in picked:  # every option on disk, shared partials (_*.yaml) left out
        on_disk = {p.stem for p in (conf / group).glob("*.yaml") if not p.stem.startswith("_")}
        assert listed[group] == on_disk, group
    assert {"scaffold", "dp_fedavg", "centralised"} <= listed["algorithm"]
    assert not {"paper_algorithm", "experiment_algorithm", "attack_paper"} & set(listed)
    assert listed["hydra/launcher"] == {"parallel", "slurm_gpu"}


def test_the_default_experiment_starts_without_lightning_sklearn_or_wandb(tmp_path):
    # Lightning (with torchmetrics and torchvision), sklearn.datasets and wandb cost seconds
    # each; the default experiment, up to its first round, uses none of them
    env = {"FEDEXP_CACHE_DIR": str(tmp_path / "cache")}
    proc = probe(tmp_path, f"hydra.run.dir={tmp_path}/run", env=env, script=FIRST_ROUND)
    assert "imported: []" in proc.stderr, proc.stderr
    assert (tmp_path / "run" / "partition_stats.csv").exists()  # it reached the first round
    # torch's compiler stack (1.5-2 s), imported by an optimizer's first construction, is
    # imported in start-up: round 1's time is training (OMP_NUM_THREADS=1 here: one process)
    assert "the optimizer imported: []" in proc.stderr, proc.stderr


def test_hydras_own_overrides_cost_no_extra_composition(monkeypatch):
    # `hydra.run.dir=...` and `hydra/launcher=...` never name a component's key: nothing to add
    def composed(*args, **kwargs):
        raise AssertionError("composed the config")

    monkeypatch.setattr(hydra, "initialize_config_dir", composed)
    args = ["hydra.run.dir=/tmp/x", "hydra/launcher=parallel", "rounds=3", "algorithm=fedprox"]
    assert add_target_keys(args, find_conf()) == args
    with pytest.raises(AssertionError, match="composed the config"):
        add_target_keys([*args, "client.lr=0.1"], find_conf())  # a dotted key: composed
