"""The package's layers (pyproject.toml, `[tool.importlinter]`) hold: checked by import-linter.

A failure prints import-linter's report: the broken contract and the import chain that breaks it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONTRACTS = ("layers", "leaves", "wiring")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the package in `root/src` with the contracts in `root/pyproject.toml`."""
    env = dict(os.environ, PYTHONPATH=str(root / "src"))
    code = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache", "--no-logo"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_every_import_contract_is_kept():
    proc = lint_imports(REPO)
    assert proc.returncode == 0, f"import contracts broken:\n{proc.stdout}\n{proc.stderr}"
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in proc.stdout, proc.stdout


def test_a_leaf_importing_core_breaks_the_layers(tmp_path):
    # the contracts are not vacuous: one upward import in a copy of the package is caught
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    shutil.copytree(REPO / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    leaf = tmp_path / "src/fedexp/metrics/comm.py"
    leaf.write_text(leaf.read_text() + "\nfrom fedexp.core import types  # noqa: E402\n")
    proc = lint_imports(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "fedexp.metrics is not allowed to import fedexp.core" in proc.stdout
    assert "fedexp.metrics.comm -> fedexp.core.types" in proc.stdout
    assert "leaves > errors BROKEN" in proc.stdout  # the layers contract, the others kept
    assert f"Contracts: {len(CONTRACTS) - 1} kept, 1 broken." in proc.stdout, proc.stdout
