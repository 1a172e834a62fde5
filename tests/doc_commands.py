"""The commands the README and docs/*.md show in their code blocks, made runnable at smoke size.

`commands()` reads every `python -m fedexp...` line of a fenced (```) or indented code block of
README.md and docs/*.md (continuation lines joined, comments dropped). `smoke_command()` turns one
into the command a test runs: placeholders (`<run dir>`, `<date>/<time>`) filled with real run
dirs, run sizes (rounds, clients, trials) cut to smoke size, `debug=smoke` added. `SKIPPED` is the
marked list of commands that cannot run here (a GPU, a download, a W&B account, the user's own
files), each with its reason; tests/cli/test_doc_commands_reader.py checks every entry still
matches a command, so the list cannot hide one that was rewritten.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# substring of a command -> why it does not run in the test suite
SKIPPED = {
    "dataset.download=true": "downloads a dataset",
    "hydra/launcher=slurm": "needs a SLURM cluster",
    "device=cuda": "needs a GPU",
    "dataset.path=~/data": "the user's own files",
    "dataset.path=org/name": "a Hub dataset (download)",
}

# run sizes a smoke test cuts (a command's own value would beat debug=smoke's)
SMOKE_SIZES = {
    "rounds": "2",
    "num_clients": "6",
    "clients_per_round": "3",
    "hydra.sweeper.n_trials": "2",
    "client.local_epochs": "1",
    "eval_every": "1",
    "checkpoint_every": "1",
}

# with `resume=`: a run that extends goes past the made run's 3 rounds
RESUME_SIZES = {"rounds": "4"}


@dataclass(frozen=True)
class DocCommand:
    file: str
    line: int
    text: str

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


def _code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line inside a fenced or indented code block."""
    out, fence, previous_blank = [], None, True
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            else:
                out.append((number, line))
        elif stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
        elif line.startswith("    ") and stripped and (previous_blank or _follows(out, number)):
            out.append((number, line))
        previous_blank = not stripped
    return out


def _follows(lines: list[tuple[int, str]], number: int) -> bool:
    return bool(lines) and lines[-1][0] == number - 1


def _uncomment(line: str) -> str:
    """The line without a trailing `# comment` (a `#` inside quotes stays)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


ASSIGNMENT = re.compile(r"^([A-Z_][A-Z0-9_]*)=(\"[^\"]*\"|'[^']*'|\S*)$")


def _expand(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{?([A-Z_][A-Z0-9_]*)\}?", lambda m: env.get(m.group(1), m.group(0)), text)


def commands() -> list[DocCommand]:
    """Every `python -m fedexp...` command of the README and docs/*.md code blocks."""
    return [c for path in DOCS for c in commands_in(path.read_text(), str(path.relative_to(REPO)))]


def commands_in(page: str, name: str) -> list[DocCommand]:
    """The `python -m fedexp...` commands of one page's code blocks: continuation lines joined,
    comments dropped, shell variables set in a block (`S="seed=0,1,2"; P="..."`) expanded."""
    found = []
    lines = _code_lines(page)
    env: dict[str, str] = {}
    i = 0
    while i < len(lines):
        number, line = lines[i]
        text = _uncomment(line).strip().lstrip("$ ").strip()
        while text.endswith("\\") and i + 1 < len(lines) and lines[i + 1][0] == lines[i][0] + 1:
            i += 1
            text = text[:-1].rstrip() + " " + _uncomment(lines[i][1]).strip()
        for part in text.split(";"):
            match = ASSIGNMENT.match(part.strip())
            if match:
                env[match.group(1)] = _expand(match.group(2).strip("\"'"), env)
        if text.startswith("python -m fedexp"):
            found.append(DocCommand(name, number, _expand(text, env)))
        i += 1
    return found


def skip_reason(command: DocCommand) -> str | None:
    if " ..." in command.text or command.text.endswith("..."):
        return "elided options (`...`)"
    for needle, why in SKIPPED.items():
        if needle in command.text:
            return why
    return None


CLAIMS_SMOKE = ["--seeds", "1", "--override", "debug=smoke", "--override", "rounds=2"]


def smoke_command(command: DocCommand, run_dir: Path, sweep_dir: Path, out: Path) -> list[str]:
    """The argv (after `python`) a test runs for a documented command: smoke size, placeholders
    filled (`<run dir>` and `outputs/runs/...` by a finished run, `<date>/<time>` and
    `outputs/multirun/...` by a finished sweep, `DIR` by a fresh folder)."""
    text = re.sub(r"\[--out DIR\]", "--out DIR", command.text)
    text = re.sub(r"\s\[[^\]]*\]", "", text)  # optional parts: `[more dirs]`, `[split=test|val]`
    # a command that runs a sweep into a dir gets a fresh one; one that reads a sweep, the made one
    fresh = f"hydra.sweep.dir={out / 'sweep'}"
    text = re.sub(r"hydra\.sweep\.dir=outputs/multirun/\S+", fresh, text)
    text = re.sub(r"outputs/multirun/\S+", str(sweep_dir), text)
    text = re.sub(r"outputs/runs/\S+", str(run_dir), text)
    for placeholder in ("<sweep dir>", "<that dir>"):
        text = text.replace(placeholder, str(sweep_dir))
    text = text.replace("<run dir>", str(run_dir)).replace("DIR", str(out / "report"))
    text = re.sub(r"(?<==)docs/examples/", f"{REPO / 'docs' / 'examples'}/", text)  # shipped files
    argv = shlex.split(text)
    module, args = argv[2], argv[3:]
    if module == "fedexp.claims":
        return ["-m", module, *_claims_smoke(args, out)]
    if module != "fedexp":
        return ["-m", module, *args]
    sizes = {**SMOKE_SIZES, **(RESUME_SIZES if any(a.startswith("resume=") for a in args) else {})}
    sized = []
    for arg in args:
        key = arg.split("=", 1)[0].lstrip("+")
        if "=" in arg and key in sizes:
            arg = f"{key}={sizes[key]}"
        sized.append(arg)
    if any(a in ("--cfg", "--help", "--info") for a in sized):
        return ["-m", "fedexp", *sized]
    if not any(a.startswith(("resume=", "debug=")) for a in sized):
        sized.append("debug=smoke")
    multirun = any(a in ("-m", "--multirun") or a.startswith("hparams_search=") for a in sized)
    where = f"hydra.sweep.dir={out / 'sweep'}" if multirun else f"hydra.run.dir={out / 'run'}"
    if not any(a.startswith(("resume=", "hydra.run.dir=", "hydra.sweep.dir=")) for a in sized):
        sized.append(where)
    return ["-m", "fedexp", *sized]


# `--vary` values of a size key that fit a smoke population (6 clients)
SMOKE_VARY = {"clients_per_round": "2,3", "num_clients": "6,8", "rounds": "1,2"}


def _claims_smoke(args: list[str], out: Path) -> list[str]:
    """A claims command at smoke size: one seed, two rounds, claim 1 unless it names some;
    a `--vary` of a population or round count takes values that fit the smoke population."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in ("--seeds", "--out"):
            skip = True
            continue
        if kept and kept[-1] == "--vary" and arg.split("=")[0] in SMOKE_VARY:
            arg = f"{arg.split('=')[0]}={SMOKE_VARY[arg.split('=')[0]]}"
        kept.append(arg)
    if "--only" not in kept:
        kept += ["--only", "1"]
    if "paper" in kept:  # the protocol tier's FedHeNN draws its RAD from a pool smoke would cap
        kept += ["--override", "partition.max_server_pool=null"]
    return [*kept, *CLAIMS_SMOKE, "--out", str(out / "claims")]
