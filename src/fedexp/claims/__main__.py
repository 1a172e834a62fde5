"""`python -m fedexp.claims [--tier small|paper] [--seeds N] [--only IDS] [--out DIR] [--jobs J]
[--update-doc MD]`."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import datetime
from pathlib import Path

from fedexp.claims.claim import Claim, Setting, settings_of
from fedexp.claims.heading import header, timing_line, vary_markdown
from fedexp.claims.protocol_diff import differences_markdown
from fedexp.claims.runner import Runner, SettingResult
from fedexp.claims.settings_text import (
    attacked_settings,
    check_composes,
    claim_setting_text,
    common_text,
    common_values,
    setting_configs,
)
from fedexp.claims.table import claim_json, grid_tables, markdown, row, update_doc
from fedexp.claims.tiers import DEFAULT_SEEDS, TIERS, tier
from fedexp.claims.verdict import Tails, evaluate, tail_means
from fedexp.core.types import ConfigError

EXIT_CONFIG = 2


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m fedexp.claims",
        description="Check the direction of the papers' headline claims on small data.",
    )
    parser.add_argument(
        "--tier",
        default="small",
        choices=TIERS,
        help="small: the bundled digits, minutes (default); paper: the papers' protocols on "
        "MNIST-1D, about 110 minutes on 2 cores with --jobs 2",
    )
    parser.add_argument(
        "--seeds", type=int, default=None, help="seeds 0..N-1 per setting (small 5, paper 3)"
    )
    parser.add_argument("--only", default=None, help="claim ids or slugs, comma-separated")
    parser.add_argument("--out", default=None, help="output dir (outputs/claims/<timestamp>)")
    parser.add_argument("--jobs", type=int, default=1, help="settings run in parallel (1)")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a CLI override appended to every run (repeatable; e.g. rounds=2 for a dry run)",
    )
    parser.add_argument(
        "--vary",
        default=None,
        metavar="KEY=V1,V2,...",
        help="a controlled experiment: run the claims once per value of one override (every "
        "other setting as the tier has it) and tabulate each claim's measures and verdict per "
        "value in vary.md",
    )
    parser.add_argument(
        "--update-doc",
        default=None,
        metavar="MD",
        help="also write the table into this markdown file between its claims markers",
    )
    return parser.parse_args(argv)


def select(only: str | None, claims: list[Claim]) -> list[Claim]:
    """The claims named by `--only` (ids or slugs), in catalogue order; all when None."""
    if only is None:
        return list(claims)
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    known = {c.id: c for c in claims} | {c.slug: c for c in claims}
    unknown = [w for w in wanted if w not in known]
    if unknown or not wanted:
        names = ", ".join(f"{c.id} ({c.slug})" for c in claims)
        bad = ", ".join(unknown) or "(none)"
        raise ConfigError(f"--only: unknown claim {bad} in this tier; claims: {names}")
    chosen = {known[w].id for w in wanted}
    return [c for c in claims if c.id in chosen]


def check_args(args: argparse.Namespace) -> None:
    if args.seeds is None:
        args.seeds = DEFAULT_SEEDS[args.tier]
    if args.seeds < 1:
        raise ConfigError(f"--seeds: {args.seeds} is not a positive number of seeds")
    if args.jobs < 1:
        raise ConfigError(f"--jobs: {args.jobs} is not a positive number of jobs")
    for item in args.override:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"--override: {item!r} is not KEY=VALUE")
    if args.vary is not None:
        key, _, values = args.vary.partition("=")
        if not key or not [v for v in values.split(",") if v]:
            raise ConfigError(f"--vary: {args.vary!r} is not KEY=V1,V2,...")
        if args.update_doc is not None:
            raise ConfigError("--vary writes vary.md; --update-doc takes a tier's table only")
    if args.update_doc is not None and not Path(args.update_doc).is_file():
        raise ConfigError(f"--update-doc: {args.update_doc} is not a file")


def settings_json(
    results: dict[str, SettingResult], users: dict[str, list[str]], known: dict[str, Setting]
) -> dict:
    return {
        sid: {
            "overrides": list(known[sid].overrides),
            "claims": users[sid],
            "wall_s": res.wall_s,
            "error": res.error,
            "runs": [
                {
                    "seed": r.seed,
                    "run_dir": r.run_dir,
                    "status": r.status,
                    "run_s": r.run_s,
                    "reused": r.reused,
                }  # fmt: skip
                for r in res.runs.values()
            ],
        }
        for sid, res in results.items()
    }


def run_tails(results: dict[str, SettingResult], claims: list[Claim]) -> Tails:
    """For the settings of the claims' drop terms: each run's last-10-evaluations means of the
    terms' metrics, read from its metrics.jsonl."""
    wanted: dict[str, set[str]] = {}
    for claim in claims:
        for term in claim.terms:
            if term.clean:
                for sid in (term.setting, term.clean):
                    wanted.setdefault(sid, set()).update(term.keys)
    tails: Tails = {}
    for sid, keys in wanted.items():
        for seed, record in getattr(results.get(sid), "runs", {}).items():
            path = Path(record.run_dir) / "metrics.jsonl"
            try:
                lines = path.read_text().splitlines()
            except OSError:
                continue
            rows = []
            for line in lines:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
            tails.setdefault(sid, {})[seed] = tail_means(rows, tuple(sorted(keys)))
    return tails


def vary_values(vary: str | None) -> list[str | None]:
    """The override of each controlled run: [None] (the tier as it is) without --vary."""
    if vary is None:
        return [None]
    key, _, values = vary.partition("=")
    return [f"{key}={v}" for v in values.split(",") if v]


def main(argv: list[str] | None = None) -> int:
    """Run the selected claims' settings, write claims.md and claims.json (with --vary: once per
    value, and vary.md); 1 if a run failed or a claim has no verdict (n/a)."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    try:
        check_args(args)
        catalogue, known = tier(args.tier)
        claims = select(args.only, catalogue)
    except ConfigError as err:
        print(f"fedexp: error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    default_out = f"outputs/claims/{args.tier}-{datetime.now():%Y-%m-%d_%H-%M-%S}"
    users: dict[str, list[str]] = {}
    for claim in claims:
        for sid in settings_of(claim):
            users.setdefault(sid, []).append(claim.id)
    settings = [known[sid] for sid in users]
    variants = vary_values(args.vary)
    try:
        for extra in variants:
            check_composes(settings, [*args.override, *([extra] if extra else [])])
    except ConfigError as err:
        print(f"fedexp: error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    out = Path(args.out or default_out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.vary is None:
        return check(argv, args, claims, known, users, out)
    start, codes, tables = time.perf_counter(), [], []
    for extra in variants:
        args_v = argparse.Namespace(**{**vars(args), "override": [*args.override, extra]})
        sub = out / vary_dir(extra)
        codes.append(check(argv, args_v, claims, known, users, sub))
        tables.append((extra, json.loads((sub / "claims.json").read_text())))
    text = vary_markdown(argv, args, tables, time.perf_counter() - start)
    (out / "vary.md").write_text(text)
    print(text)
    print(f"fedexp.claims: wrote {out / 'vary.md'}", flush=True)
    return max(codes)


def vary_dir(extra: str) -> str:
    """The output sub-dir of one value: `KEY-VALUE` with every character Hydra's override
    grammar or a path would read (`=`, `/`, quotes, brackets, commas, spaces) as `-`."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "-", extra)


def check(argv, args, claims, known, users, out: Path) -> int:
    """Run the claims' settings into `out`, write claims.md and claims.json there; the exit
    code (0, 1 for a failed run or an n/a verdict, 130 when interrupted)."""
    out.mkdir(parents=True, exist_ok=True)
    settings = [known[sid] for sid in users]
    seeds = list(range(args.seeds))
    print(
        f"fedexp.claims ({args.tier} tier): {len(claims)} claims, {len(settings)} settings × "
        f"{len(seeds)} seeds = {len(settings) * len(seeds)} runs, {args.jobs} at a time; "
        f"out: {out}",
        flush=True,
    )
    labels = {sid: ",".join(ids) for sid, ids in users.items()}
    start = time.perf_counter()
    try:
        attacked = attacked_settings(settings, args.override)
        runner = Runner(out, seeds, labels, args.override, args.jobs, attacked=attacked)
        results = runner.run_all(settings)
    except KeyboardInterrupt:
        print(
            f"fedexp.claims: stopped; completed runs are reused with --out {out}", file=sys.stderr
        )
        return 130
    wall = time.perf_counter() - start
    text, entries, undecided = tabulate(argv, args, claims, known, users, results, wall)
    (out / "claims.md").write_text(text)
    record = {
        "command": ["python", "-m", "fedexp.claims", *argv],
        "tier": args.tier,
        "seeds": seeds,
        "jobs": args.jobs,
        "overrides": args.override,
        "wall_s": wall,
        "claims": entries,
        "settings": settings_json(results, users, known),
    }
    (out / "claims.json").write_text(json.dumps(record, indent=1, ensure_ascii=False))
    if args.update_doc:
        update_doc(Path(args.update_doc), text, args.tier)
    print(text)
    return report_failures(results, undecided, out)


def tabulate(argv, args, claims, known, users, results, wall: float):
    """claims.md's text, claims.json's claim entries and the ids of the claims without a
    verdict, from the runs' results."""
    seeds = list(range(args.seeds))
    summaries = {
        sid: {s: r.summary for s, r in res.runs.items() if r.summary is not None}
        for sid, res in results.items()
    }
    tails = run_tails(results, claims)
    common = common_values(setting_configs(list(users), known, summaries))
    rows, entries, undecided, measures = [], [], [], {}
    for claim in claims:
        measured, verdict = evaluate(claim, summaries, seeds, tails)
        measures[claim.id] = measured
        if verdict.text() == "n/a":
            undecided.append(claim.id)
        setting = claim_setting_text(claim, known, summaries, common)
        rows.append(row(claim, measured, verdict, setting))
        entries.append(claim_json(claim, measured, verdict, setting))
    head = header(argv, args, seeds, results, wall)
    head += f"\n\nEvery setting of this table has: {common_text(common)}."
    text = markdown(rows, head, timing_line(results))
    grids = grid_tables(claims, measures)
    if grids:
        text += "\nThe measurement rows, term by term:\n\n" + grids
    if args.tier == "paper":
        labels = {sid: ",".join(ids) for sid, ids in users.items()}
        text += (
            "\nWhat differs from the papers' protocols, every key whose composed value differs "
            "between a setting and its paper preset (generated from the configs):\n\n"
            + differences_markdown([known[sid] for sid in users], labels)
        )
    return text, entries, undecided


def report_failures(results: dict[str, SettingResult], undecided: list[str], out: Path) -> int:
    """Name the failed settings and the claims without a verdict; the exit code."""
    failures = {sid: res.error for sid, res in results.items() if res.error}
    for sid, error in failures.items():
        print(f"fedexp.claims: {sid} failed ({error}); see {out / 'runs' / sid}", file=sys.stderr)
    if undecided:
        print(
            f"fedexp.claims: no verdict for claim(s) {', '.join(undecided)}: a run failed, "
            "diverged or did not finish (the table names them)",
            file=sys.stderr,
        )
    print(f"fedexp.claims: wrote {out / 'claims.md'} and claims.json", flush=True)
    return 1 if failures or undecided else 0


if __name__ == "__main__":
    sys.exit(main())
