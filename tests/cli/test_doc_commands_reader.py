"""The reader of the docs' commands (tests/doc_commands.py) finds them all, and its skip list
names only commands that exist (so a rewritten command cannot stay skipped unseen)."""

from __future__ import annotations

from pathlib import Path

from doc_commands import (
    SKIPPED,
    DocCommand,
    _code_lines,
    commands,
    commands_in,
    skip_reason,
    smoke_command,
)


def test_reads_fenced_and_indented_blocks_joins_lines_and_expands_variables():
    text = (
        "Prose with `python -m fedexp inline` is not a block.\n\n"
        "    python -m fedexp a=1   # a comment\n\n"
        "```bash\n"
        'S="seed=0,1"; P="x=1 $S"\n'
        "python -m fedexp -m b=2 \\\n"
        "    c=3 $P\n"
        "```\n"
    )
    lines = dict(_code_lines(text))
    assert 1 not in lines and 3 in lines and 6 in lines
    assert [(c.line, c.text) for c in commands_in(text, "x.md")] == [
        (3, "python -m fedexp a=1"),
        (7, "python -m fedexp -m b=2 c=3 x=1 seed=0,1"),
    ]


def test_every_page_command_is_found_and_every_skip_entry_is_used():
    found = commands()
    files = {c.file for c in found}
    assert {"README.md", "docs/lifecycle.md", "docs/robustness.md", "docs/waffle.md"} <= files
    assert len(found) >= 60
    assert all("$" not in c.text for c in found), [c.text for c in found if "$" in c.text]
    for needle in SKIPPED:
        assert any(needle in c.text for c in found), f"SKIPPED entry {needle!r} matches nothing"
    skipped = [c for c in found if skip_reason(c)]
    assert len(skipped) <= len(found) // 5


def test_smoke_command_cuts_sizes_and_fills_placeholders():
    run, sweep, out = Path("/r"), Path("/s"), Path("/o")
    big = DocCommand("x.md", 1, "python -m fedexp -m rounds=1500 num_clients=1000 seed=0,1")
    assert smoke_command(big, run, sweep, out) == [
        "-m", "fedexp", "-m", "rounds=2", "num_clients=6", "seed=0,1", "debug=smoke",
        "hydra.sweep.dir=/o/sweep",
    ]  # fmt: skip
    report = DocCommand("x.md", 1, "python -m fedexp.report outputs/multirun/<date>/<time> "
                        "[more dirs] --out DIR")  # fmt: skip
    assert smoke_command(report, run, sweep, out) == [
        "-m", "fedexp.report", "/s", "--out", "/o/report"
    ]  # fmt: skip
    resume = DocCommand("x.md", 1, "python -m fedexp resume=outputs/runs/2025-01-01/12-00")
    assert smoke_command(resume, run, sweep, out) == ["-m", "fedexp", "resume=/r"]
    extend = DocCommand("x.md", 1, "python -m fedexp resume=outputs/runs/2025-01-01/12 rounds=100")
    assert smoke_command(extend, run, sweep, out) == ["-m", "fedexp", "resume=/r", "rounds=4"]
    claims = DocCommand("x.md", 1, "python -m fedexp.claims --seeds 3 --jobs 2")
    argv = smoke_command(claims, run, sweep, out)
    assert argv[:4] == ["-m", "fedexp.claims", "--jobs", "2"] and "3" not in argv
