"""The package's layers (pyproject.toml, `[tool.importlinter]`) hold: checked by import-linter.

A failure prints import-linter's report: the broken contract and the import chain that breaks it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONTRACTS = ("layers", "core-below-engine", "leaves", "wiring")

# import-linter in processes of its own, and the import graph of the whole package
pytestmark = pytest.mark.cli


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


def test_upward_imports_into_engine_runtime_and_config_break_the_layers(tmp_path):
    # a component using the round engine, core using the run's lifecycle, and the run's
    # lifecycle using the config rules (runtime and config are independent siblings)
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    shutil.copytree(REPO / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    planted = {
        "algorithms/fedprox.py": "from fedexp.engine import orchestrator",
        "core/seeding.py": "from fedexp.runtime import signals",
        "runtime/threads.py": "from fedexp.config import values",
    }
    for path, line in planted.items():
        module = tmp_path / "src/fedexp" / path
        module.write_text(module.read_text() + f"\n{line}  # noqa: E402\n")
    proc = lint_imports(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())  # import-linter wraps long lines
    assert "fedexp.algorithms is not allowed to import fedexp.engine" in out
    assert "fedexp.algorithms.fedprox -> fedexp.engine.orchestrator" in out
    assert "fedexp.core is not allowed to import fedexp.runtime" in out
    assert "fedexp.runtime is not allowed to import fedexp.config" in out
    # core -> runtime breaks the core-below-engine contract too
    assert "fedexp.core.seeding -> fedexp.runtime.signals" in out
    assert "until 0.2.0) BROKEN" in out
    assert f"Contracts: {len(CONTRACTS) - 2} kept, 2 broken." in proc.stdout, proc.stdout


def test_core_importing_the_engine_breaks_its_contract_but_the_old_paths_do_not(tmp_path):
    # the old paths' re-exports are the only imports of engine/ and runtime/ core may hold
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    shutil.copytree(REPO / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    module = tmp_path / "src/fedexp/core/flat.py"
    module.write_text(module.read_text() + "\nfrom fedexp.engine import stacking  # noqa: E402\n")
    proc = lint_imports(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert "fedexp.core.flat -> fedexp.engine.stacking" in out
    assert "until 0.2.0) BROKEN" in out  # and the layers, as any upward import
    assert f"Contracts: {len(CONTRACTS) - 2} kept, 2 broken." in proc.stdout, proc.stdout
    shims = ("executors", "vectorized", "distributed", "run_dir")
    assert not any(f"fedexp.core.{shim} ->" in out for shim in shims)  # ignored, both times


def _module_cycles() -> list[list[str]]:
    """Cycles of module-level imports among fedexp's modules (grimp's graph, the one
    import-linter checks), found by a depth-first search."""
    import grimp

    graph = grimp.build_graph("fedexp", exclude_type_checking_imports=True)
    modules = sorted(graph.modules)
    cycles, state = [], dict.fromkeys(modules, 0)  # 0 new, 1 on the stack, 2 done

    def visit(module: str, stack: list[str]) -> None:
        state[module] = 1
        stack.append(module)
        for dep in sorted(graph.find_modules_directly_imported_by(module)):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif state.get(dep) == 0:
                visit(dep, stack)
        stack.pop()
        state[module] = 2

    for module in modules:
        if state[module] == 0:
            visit(module, [])
    return cycles


def test_no_module_imports_itself_back():
    # packages re-exporting their modules are left aside: a package imports its children
    cycles = [
        c for c in _module_cycles() if not any(a.startswith(b + ".") for a, b in zip(c, c[1:]))
    ]
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


def _function_level_imports() -> list[tuple[str, int, str]]:
    """(file, line, source) of every `from fedexp...`/`import fedexp...` inside a function."""
    import ast

    found = []
    for path in sorted((REPO / "src").rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for inner in ast.walk(node):
                names = (
                    [inner.module or ""]
                    if isinstance(inner, ast.ImportFrom)
                    else [a.name for a in inner.names]
                    if isinstance(inner, ast.Import)
                    else []
                )
                if any(n == "fedexp" or n.startswith("fedexp.") for n in names):
                    rel = str(path.relative_to(REPO))
                    window = " ".join(lines[max(0, inner.lineno - 5) : inner.end_lineno])
                    found.append((rel, inner.lineno, window))
    return found


def test_an_import_inside_a_function_says_it_is_there_for_start_up():
    # such an import can hide a circle; the only other reason for one is start-up time
    # (torch, Lightning, W&B imported only by the runs that use them), and it says so: beside
    # it, or in the module docstring for all of a module's (`__main__`)
    def says_so(path: str, text: str) -> bool:
        head = (REPO / path).read_text().split('"""')[1]
        return "start-up" in text or "inside this module's functions are there for start-up" in (
            " ".join(head.split())
        )

    unexplained = [
        f"{path}:{line}"
        for path, line, text in _function_level_imports()
        if not says_so(path, text)
    ]
    assert unexplained == [], unexplained
