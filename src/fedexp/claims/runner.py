"""Run settings through the real CLI: one Hydra multirun over the seeds per setting.

Each setting runs as `python -m fedexp -m <overrides> seed=0,1,.. logger=csv` (one interpreter
for all its seeds, so imports are paid once) with its sweep dir `<out>/runs/<setting id>` and one
sub-dir per seed. A setting whose sweep dir already holds a completed run of the same overrides
and seed is not run again (`--out` of an earlier check resumes it). Settings run `jobs` at a
time; a progress line is printed as each run's `summary.json` appears.

The CLI processes run in their own session: a Ctrl-C reaches only this process, which kills them
(a multirun whose job is interrupted would otherwise go on with its next seed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fedexp.claims.claim import Setting
from fedexp.core.summary import RunSummary

FIXED = ("logger=csv", "progress=false", "checkpoint_every=0")
POLL_S = 0.5


@dataclass
class RunRecord:
    """One (setting, seed) run: its summary (None if it did not complete) and its timing."""

    setting: str
    seed: int
    run_dir: str
    status: str
    run_s: float  # wall time from the previous run of the setting (or the process start)
    reused: bool = False
    summary: RunSummary | None = field(default=None, repr=False)


@dataclass
class SettingResult:
    setting: str
    runs: dict[int, RunRecord]
    wall_s: float
    error: str | None = None  # the last lines of stderr when the process failed


def command(setting: Setting, seeds: list[int], sweep_dir: Path, extra: tuple[str, ...]) -> list:
    """The CLI command line of one setting's multirun over `seeds`."""
    return [
        sys.executable,
        "-m",
        "fedexp",
        "-m",
        *setting.overrides,
        *extra,
        *FIXED,
        "seed=" + ",".join(str(s) for s in seeds),
        f"hydra.sweep.dir={sweep_dir}",
        "hydra.sweep.subdir=seed${seed}",
    ]


def attack_option(override: str) -> bool:
    """Whether an override sets an attack's option (`attack.fraction=0.1`, `+attack.x=1`)."""
    return override.lstrip("+~").startswith("attack.")


def overrides_for(extra: Sequence[str], attacked: bool) -> tuple[str, ...]:
    """The overrides of `extra` that apply to a setting: an attack's option applies to an
    attacked setting alone; a clean run has no attack to set (the CLI refuses `attack.fraction`
    without one), so it runs as its tier has it."""
    return tuple(o for o in extra if attacked or not attack_option(o))


def seed_dirs(sweep: Path, seed: int) -> list[Path]:
    """A seed's run dirs in a setting's sweep dir, oldest first: `seed<k>`, then those of each
    later batch (`batch-<n>/seed<k>`, the runs of a resumed check)."""
    batches = sorted(sweep.glob("batch-*"), key=lambda p: int(p.name.split("-")[1]))
    return [d for d in (sweep / f"seed{seed}", *(b / f"seed{seed}" for b in batches)) if d.exists()]


def _completed(run_dir: Path) -> RunSummary | None:
    """The run's summary.json (None while there is none, or it is still being written)."""
    path = run_dir / "summary.json"
    if not path.exists():
        return None
    try:
        return RunSummary.from_dict(json.loads(path.read_text()))
    except (ValueError, OSError):  # JSONDecodeError is a ValueError
        return None  # still being written


class Runner:
    """Runs settings for the given seeds, printing one progress line per finished run.

    Args:
        out: the claims output dir; runs go under `out/runs/<setting id>/seed<k>`.
        seeds: the seeds every setting runs with.
        labels: for each setting id, the claims that use it (for the progress line).
        extra: overrides appended to every run (after the setting's own).
        jobs: settings run at the same time (one subprocess each).
    """

    def __init__(
        self, out: Path, seeds, labels, extra=(), jobs: int = 1, stream=None, attacked=None
    ):
        self.out, self.seeds, self.labels = out, list(seeds), labels
        self.extra, self.jobs = tuple(extra), jobs
        self.attacked = attacked  # ids of the settings that run an attack (None: not asked)
        self.stream = stream or sys.stdout
        self.total, self.done, self.start = 0, 0, time.perf_counter()
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def run_all(self, settings: list[Setting]) -> dict[str, SettingResult]:
        self.total, self.done = len(settings) * len(self.seeds), 0
        self.start = time.perf_counter()
        longest_first = sorted(settings, key=lambda s: -s.cost)
        pool = ThreadPoolExecutor(max_workers=self.jobs)
        try:
            results = {r.setting: r for r in pool.map(self.run_setting, longest_first)}
        except BaseException:  # Ctrl-C: the running settings kill their processes
            self.stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown()
        return {s.id: results[s.id] for s in settings}

    def _report(self, record: RunRecord) -> None:
        with self.lock:
            self.done += 1
            minutes, seconds = divmod(int(time.perf_counter() - self.start), 60)
            note = "reused" if record.reused else f"{record.run_s:.1f} s"
            if record.status == "failed":
                note = "failed"
            elif record.status != "completed":
                note += f", {record.status}"
            print(
                f"[claims {self.done}/{self.total}] claim {self.labels.get(record.setting, '?')}"
                f" | {record.setting} | seed {record.seed} | {note}"
                f" | elapsed {minutes}m{seconds:02d}s",
                file=self.stream,
                flush=True,
            )

    def run_setting(self, setting: Setting) -> SettingResult:
        sweep = self.out / "runs" / setting.id
        extra = overrides_for(self.extra, self.attacked is None or setting.id in self.attacked)
        spec = {"overrides": [*setting.overrides, *extra, *FIXED]}
        spec_path = sweep / "setting.json"
        same = spec_path.exists() and json.loads(spec_path.read_text()) == spec
        if sweep.exists() and not same:  # runs of other overrides: kept aside, never reused
            sweep.rename(sweep.with_name(f"{setting.id}.stale-{time.strftime('%Y%m%d-%H%M%S')}"))
        runs: dict[int, RunRecord] = {}
        todo = []
        for seed in self.seeds:
            done = [d for d in seed_dirs(sweep, seed) if (s := _completed(d)) and s.completed]
            if done:
                summary = _completed(done[-1])
                runs[seed] = RunRecord(
                    setting.id, seed, str(done[-1]), "completed", 0.0, True, summary
                )
                self._report(runs[seed])
            else:
                todo.append(seed)
        if not todo:
            return SettingResult(setting.id, runs, 0.0)
        sweep.mkdir(parents=True, exist_ok=True)
        spec_path.write_text(json.dumps(spec, indent=1))
        # the CLI refuses a sweep dir that holds an earlier sweep: the runs still to do go into
        # a batch dir of their own (an interrupted check resumed)
        batches = sorted(sweep.glob("batch-*"))
        if (sweep / "multirun.yaml").exists() or list(sweep.glob("*/.hydra")):
            sweep = sweep / f"batch-{len(batches) + 1}"
            sweep.mkdir()
        start = time.perf_counter()
        pending, code = self._run_process(setting, todo, sweep, runs, extra)
        error = None
        for seed in pending:  # the process ended without these runs' summaries
            runs[seed] = RunRecord(setting.id, seed, str(sweep / f"seed{seed}"), "failed", 0.0)
            self._report(runs[seed])
        if code != 0 or pending:
            lines = (sweep / "claims_stderr.log").read_text(errors="replace").strip().splitlines()
            error = f"exit {code}: " + (lines[-1] if lines else "no output")
        return SettingResult(setting.id, runs, time.perf_counter() - start, error)

    def _run_process(
        self, setting: Setting, todo: list[int], sweep: Path, runs: dict, extra: tuple
    ) -> tuple[list[int], int | None]:
        """Run the setting's multirun over `todo` in `sweep`, recording each run in `runs` as
        its summary appears; the seeds the process ended without, and its exit code."""
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", WANDB_MODE="disabled")
        last = time.perf_counter()
        with open(sweep / "claims_stderr.log", "w") as err:
            proc = subprocess.Popen(
                command(setting, todo, sweep, extra),
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
            pending = list(todo)
            while pending:
                finished = proc.poll() is not None
                for seed in list(pending):
                    summary = _completed(sweep / f"seed{seed}")
                    if summary is None:
                        continue
                    now = time.perf_counter()
                    record = RunRecord(
                        setting.id, seed, str(sweep / f"seed{seed}"), summary.status,
                        now - last, summary=summary,
                    )  # fmt: skip
                    last = now
                    runs[seed] = record
                    pending.remove(seed)
                    self._report(record)
                if finished:
                    break
                if self.stop.wait(POLL_S):
                    proc.kill()
                    break
            proc.wait()  # a run's summary is written before its process ends
        return pending, proc.returncode
