"""Readable units: no file under src/ or scripts/ over 400 lines, no function over 60 lines, and
no import circle among the scripts.

A function's length is `end_lineno - lineno + 1` of its `def` (decorators left out; methods and
nested functions count alone). fedexp's own modules are checked for import circles by
tests/test_layers.py and `make lint`; the scripts are not a package, so their circles are found
here from their `import` / `from` statements of each other (inside functions too).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("src", "scripts")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60

# Offenders that are being split now, as `offenders` names them (none at present). The set only
# shrinks: a test fails for an entry that is no longer an offender, so remove it here once its
# split lands.
BEING_SPLIT: set[str] = set()


def python_files(repo: Path) -> Iterator[Path]:
    for root in ROOTS:
        yield from sorted(p for p in (repo / root).rglob("*.py") if "__pycache__" not in p.parts)


def functions(node: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, node) of every function under `node`: `Class.method`, `outer.inner`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + child.name, child
            yield from functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from functions(child, f"{prefix}{child.name}.")
        else:
            yield from functions(child, prefix)


def offenders(repo: Path) -> dict[str, str]:
    """key (as `BEING_SPLIT` names it) -> what is too long, for every file over
    `MAX_FILE_LINES` and every function over `MAX_FUNCTION_LINES` under `ROOTS`."""
    found = {}
    for path in python_files(repo):
        rel = path.relative_to(repo).as_posix()
        source = path.read_text()
        lines = len(source.splitlines())
        if lines > MAX_FILE_LINES:
            found[f"file {rel}"] = f"{rel}: {lines} lines (at most {MAX_FILE_LINES})"
        for name, node in functions(ast.parse(source, filename=rel)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found[f"function {rel}:{name}"] = (
                    f"{rel}:{node.lineno} {name}: {length} lines (at most {MAX_FUNCTION_LINES})"
                )
    return found


def script_imports(scripts: Path) -> dict[str, set[str]]:
    """Each script (by module name) -> the other scripts it imports, anywhere in the file."""
    paths = {p.stem: p for p in sorted(scripts.glob("*.py"))}
    graph = {}
    for name, path in paths.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
        graph[name] = {m for m in imported if m in paths and m != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph`, each as the path that closes it (a -> b -> a)."""
    found, state = [], dict.fromkeys(graph, 0)  # 0 new, 1 on the stack, 2 done

    def visit(module: str, stack: list[str]) -> None:
        state[module] = 1
        stack.append(module)
        for dep in sorted(graph[module]):
            if state[dep] == 1:
                found.append(stack[stack.index(dep) :] + [dep])
            elif state[dep] == 0:
                visit(dep, stack)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if state[module] == 0:
            visit(module, [])
    return found


def test_no_file_or_function_too_long():
    new = [text for key, text in offenders(REPO).items() if key not in BEING_SPLIT]
    assert new == [], "split these:\n" + "\n".join(new)


def test_the_list_being_split_names_only_offenders():
    done = sorted(BEING_SPLIT - set(offenders(REPO)))
    assert done == [], f"no longer over the limit: remove from BEING_SPLIT: {done}"


def test_no_import_circle_among_the_scripts():
    found = circles(script_imports(REPO / "scripts"))
    assert found == [], "\n".join(" -> ".join(f"scripts/{m}.py" for m in c) for c in found)


def test_a_long_file_a_long_function_and_a_circle_are_caught(tmp_path):
    # the checks are not vacuous: planted in a tree of their own
    package = tmp_path / "src" / "pkg"
    package.mkdir(parents=True)
    fits = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    (package / "fits.py").write_text(f"@decorated\ndef f():\n{fits}")  # the limit, exactly
    long = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (package / "long.py").write_text(f"class C:\n    def g(self):\n{long}")  # one line over
    (package / "big.py").write_text("x = 1\n" * (MAX_FILE_LINES + 1))
    assert sorted(offenders(tmp_path)) == [
        "file src/pkg/big.py",
        "function src/pkg/long.py:C.g",
    ]
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "a.py").write_text("def main():\n    from b import run\n")
    (scripts / "b.py").write_text("import c\n")
    (scripts / "c.py").write_text("import a as first, json\n")
    (scripts / "d.py").write_text("from c import x\n")
    assert circles(script_imports(scripts)) == [["a", "b", "c", "a"]]


# the re-exports of old module paths, removed in 0.2.0 (docs/lifecycle.md, "Old module paths")
CORE_SHIMS = {"distributed.py", "executors.py", "run_dir.py", "vectorized.py"}


def test_core_holds_at_most_twelve_api_modules():
    core = Path(__file__).resolve().parents[1] / "src" / "fedexp" / "core"
    real = sorted(p.name for p in core.glob("*.py") if p.name not in {"__init__.py", *CORE_SHIMS})
    assert len(real) <= 12, real
    for shim in CORE_SHIMS:  # a shim re-exports and holds no code of its own
        text = (core / shim).read_text()
        assert "def " not in text and "class " not in text, shim
