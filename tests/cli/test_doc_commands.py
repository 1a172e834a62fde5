"""Every command of README.md and docs/*.md's code blocks runs, at smoke size (`make test-full`).

The commands are read from the pages themselves (tests/doc_commands.py), so a page that shows a
command the code refuses fails here. Image datasets are tiny files in the real on-disk formats
(tests/datafiles.py); `<run dir>` and `<date>/<time>` are a run and a sweep made once; a
`resume=` gets a copy of that run without its summary (killed after its last checkpoint). The ones
that need a GPU, a download, a W&B account or the user's own files are in `SKIPPED`, with why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from datafiles import write_cifar10, write_mnist
from doc_commands import REPO, commands, skip_reason, smoke_command

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
COMMANDS = commands()


def _env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    path = os.pathsep.join([str(REPO / "src"), str(TESTS), str(root / "pkgs")])
    env.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        FEDEXP_DATA_DIR=str(root / "data"),
        FEDEXP_CACHE_DIR=str(root / "cache"),
        PYTHONPATH=path + os.pathsep + env.get("PYTHONPATH", ""),
    )
    return env


def _python(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """Data in the real formats, the docs' example package, one finished run and one sweep."""
    root = tmp_path_factory.mktemp("docs")
    write_cifar10(root / "data" / "cifar10", n_per_batch=60)
    write_mnist(root / "data" / "mnist", "MNIST", n_train=120, n_test=40)
    pkg = root / "pkgs" / "my_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    # docs/lightning.md's module: Lightning's documented LitModel, and one with __init__ args
    (pkg / "models.py").write_text(
        "from lightning_docs_model import LitBodyHead as Lit, LitModel  # noqa: F401\n"
    )
    env = _env(root)
    run_dir, sweep_dir = root / "made" / "run", root / "made" / "sweep"
    made = [
        # three rounds, a checkpoint at round 2: with its summary removed, a run killed in round 3
        ["-m", "fedexp", "debug=smoke", "rounds=3", "checkpoint_every=2"]
        + [f"hydra.run.dir={run_dir}"],
        ["-m", "fedexp", "-m", "debug=smoke", "seed=0,1", f"hydra.sweep.dir={sweep_dir}"],
    ]
    for args in made:
        proc = _python(args, root, env)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return {"root": root, "env": env, "run_dir": run_dir, "sweep_dir": sweep_dir}


@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_documented_command_runs(command, world, tmp_path):
    reason = skip_reason(command)
    if reason:
        pytest.skip(reason)
    run_dir = world["run_dir"]
    if "resume=" in command.text:  # a run killed after its checkpoint, as the docs mean
        run_dir = tmp_path / "killed"
        shutil.copytree(world["run_dir"], run_dir)
        (run_dir / "summary.json").unlink()
    args = smoke_command(command, run_dir, world["sweep_dir"], tmp_path)
    proc = _python(args, tmp_path, world["env"])
    assert proc.returncode == 0, (
        f"{command.id}: {command.text}\nran: python {' '.join(args)}\n"
        f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
