"""Exact resume: the checkpointing callback, putting a checkpoint back, and whether a run dir can be
resumed (`python -m fedexp resume=<run dir>`). The file itself: `fedexp.runtime.checkpoint`; the
saved config: `fedexp.config.saved`."""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from fedexp.core.callbacks import Callback, RoundReport
from fedexp.core.summary import RunSummary
from fedexp.core.types import ConfigError, ServerState
from fedexp.runtime.checkpoint import (
    CHECKPOINT_FILE,
    FORMAT_VERSION,
    config_hash,
    data_digest,
    rng_state,
    save_checkpoint,
    saved_total,
    set_rng_state,
)
from fedexp.runtime.signals import Interrupted, StopSignals

log = logging.getLogger(__name__)


def component_states(components: Mapping[str, Any]) -> dict:
    """`state_dict()` of every component that has one (attack, executor, callbacks)."""
    out = {}
    for name, obj in components.items():
        fn = getattr(obj, "state_dict", None)
        if callable(fn):
            out[name] = fn()
    return out


def load_component_states(components: Mapping[str, Any], states: Mapping[str, Any]) -> None:
    for name, obj in components.items():
        fn = getattr(obj, "load_state_dict", None)
        if callable(fn) and name in states:
            fn(states[name])


def logger_names(loggers: Sequence) -> dict[str, Any]:
    """Loggers by type name: the key of their state in a checkpoint."""
    return {type(lg).__name__: lg for lg in loggers}


class Checkpointer(Callback):
    """Writes `run_dir/checkpoint.pt` every `every` rounds and when a stop signal arrives.

    Put it last in the callback list: it saves a round once every other callback has seen it,
    and after a stop signal it raises `Interrupted`, which ends the run.

    Args:
        run_dir: the run directory.
        every: rounds between checkpoints; 0 writes one only on SIGINT/SIGTERM.
        config: the run's config (its hash is checked on resume).
        store: the ClientStore.
        data: the FederatedData (its digest is checked on resume).
        components: name -> object with optional `state_dict`/`load_state_dict` (the attack,
            the executor, callbacks).
        loggers: loggers whose optional `state_dict()` (e.g. the W&B run id) is saved; they are
            restored before they start, by `restore_loggers`.
    """

    def __init__(
        self,
        run_dir: str | Path,
        every: int,
        config: DictConfig,
        store,
        data,
        components: Mapping[str, Any],
        loggers: Sequence = (),
    ):
        self.path = Path(run_dir) / CHECKPOINT_FILE
        self.every = every
        self.config = OmegaConf.to_container(config, resolve=False)
        self.hash = config_hash(config)
        self.data = data
        self.data_digest: str | None = None  # of the data, at the first save
        self.store = store
        self.components = dict(components)
        self.loggers = list(loggers)
        self.signals = StopSignals()
        self.saved_round: int | None = None  # the round the checkpoint on disk holds

    def snapshot(self, report: RoundReport) -> dict:
        state: ServerState = report.state
        if self.data_digest is None:
            self.data_digest = data_digest(self.data)
        return {
            "format": FORMAT_VERSION,
            "config_hash": str(self.hash),
            "resolved_config": self.hash.stable,
            "data_digest": self.data_digest,
            "config": self.config,
            "round": report.round,
            "server": {"params": state.params, "buffers": state.buffers},
            "client_store": self.store.state_dict(),
            "orchestrator": dict(report.loop_state),
            "components": component_states(self.components),
            "loggers": component_states(logger_names(self.loggers)),
            "rng": rng_state(),
            "threads": torch.get_num_threads(),  # a resumed run keeps its count (same sums)
        }

    def save(self, report: RoundReport) -> None:
        save_checkpoint(self.path, self.snapshot(report))
        self.saved_round = report.round
        log.info("checkpoint: round %d -> %s", report.round, self.path)

    def on_round_end(self, report: RoundReport) -> None:
        """Save after every `every`-th round and after a stop signal (then stop the run). A
        stop signal that came during the last round stops nothing: the run completes (its
        final model and summary are written with the signals still held)."""
        stop = self.signals.requested
        if report.round >= report.last_round:
            self.signals.finishing = True
            if stop is not None:
                log.warning(
                    "%s came in the last round: the run completes",
                    signal.Signals(stop).name,
                )
                stop = None
        if stop is not None or (self.every and report.round % self.every == 0):
            self.save(report)
        if stop is not None:
            raise Interrupted(report.round, stop)

    def restore_loggers(self, payload: dict | None) -> None:
        """Give the loggers their saved state (the W&B run id) before they start; no-op
        without a checkpoint."""
        if payload is not None:
            load_component_states(logger_names(self.loggers), payload.get("loggers", {}))

    def check_restorable(self, payload: dict, algorithm) -> None:
        """Everything `restore` will do, done once before any file of the run is touched: the
        algorithm's state from `init_state()` next to the saved one (the same tensors, shapes
        and dtypes), the client store, the components' states and the RNG streams loaded. A
        checkpoint that does not fit is a one-line ConfigError; a resume then changes nothing."""
        total, done = self.hash.stable.get("rounds"), int(payload["round"])
        if total != saved_total(payload) and isinstance(total, int) and total <= done:
            raise ConfigError(not_an_extension(done, total))  # a run killed after round `done`
        try:
            fresh = algorithm.init_state()
            server = payload["server"]
            check_like(fresh.params, server["params"], "server.params", self.path)
            for key in set(fresh.buffers) & set(server["buffers"]):
                check_like(fresh.buffers[key], server["buffers"][key], f"buffers.{key}", self.path)
            self.store.load_state_dict(payload["client_store"])
            load_component_states(self.components, payload["components"])
            state = ServerState(params=server["params"], buffers=dict(server["buffers"]))
            on_resume = getattr(algorithm, "on_resume", None)
            if callable(on_resume):
                on_resume(state)
            now = rng_state()
            set_rng_state(payload["rng"])
            set_rng_state(now)
        except ConfigError:
            raise
        except Exception as err:
            first = (str(err).strip().splitlines() or [""])[0][:160]
            raise ConfigError(
                f"resume: {self.path} does not fit this run ({type(err).__name__}: {first})"
            ) from None

    def restore(self, payload: dict, orch, algorithm) -> tuple[ServerState, int]:
        """Put a loaded checkpoint back; returns (server state, first round to run).

        `init_state()` runs first, exactly as in a fresh run, so any cache an algorithm builds
        there exists again; then its state is replaced by the saved one and the algorithm's
        `on_resume(state)` hook may rebuild caches that depend on it.
        """
        algorithm.init_state()
        server = payload["server"]
        state = ServerState(params=server["params"], buffers=dict(server["buffers"]))
        self.store.load_state_dict(payload["client_store"])
        load_component_states(self.components, payload["components"])
        orch.load_state_dict(payload["orchestrator"])
        orch.state = state
        on_resume = getattr(algorithm, "on_resume", None)
        if callable(on_resume):
            on_resume(state)
        set_rng_state(payload["rng"])  # last: nothing above may draw from it afterwards
        self.saved_round = int(payload["round"])
        return state, int(payload["round"]) + 1


def check_like(fresh: Any, saved: Any, where: str, path: Path) -> None:
    """The saved value has the fresh one's structure: tensors of the same shape and dtype, the
    same keys and lengths (other values are not compared)."""
    if isinstance(fresh, torch.Tensor) or isinstance(saved, torch.Tensor):
        ok = (
            isinstance(fresh, torch.Tensor)
            and isinstance(saved, torch.Tensor)
            and fresh.shape == saved.shape
            and fresh.dtype == saved.dtype
        )
        if not ok:
            shape = lambda t: (  # noqa: E731
                f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
            )
            raise ConfigError(
                f"resume: {path} does not fit this run: {where} is {shape(saved)}, the "
                f"model's is {shape(fresh)}"
            )
    elif isinstance(fresh, dict) and isinstance(saved, dict):
        for key in set(fresh) & set(saved):
            check_like(fresh[key], saved[key], f"{where}.{key}", path)
    elif (
        isinstance(fresh, list | tuple)
        and isinstance(saved, list | tuple)
        and len(fresh) == len(saved)
    ):
        for i, (a, b) in enumerate(zip(fresh, saved)):
            check_like(a, b, f"{where}[{i}]", path)


# the files of a run dir a resume reads, rewrites or appends to
RUN_FILES = (
    ".hydra/config.yaml",
    ".hydra/hydra.yaml",
    ".hydra/overrides.yaml",
    CHECKPOINT_FILE,
    "metrics.jsonl",
    "metrics.csv",
    "summary.json",
    "partition_stats.csv",
    "partition_labels.png",
    "__main__.log",
)


def check_resumable(run_dir: str | Path, rounds: int | None = None) -> None:
    """A run dir `python -m fedexp resume=<run dir>` can continue: its files are files, it has
    rounds left to run (a completed run only with `rounds`, the new total, above the rounds it
    ran: an extension), and it holds a checkpoint; anything else is a one-line ConfigError. Its
    saved config: `fedexp.config.saved.load_run_config`."""
    run_dir = Path(run_dir)
    if not (run_dir / ".hydra" / "config.yaml").exists():
        raise ConfigError(f"resume: {run_dir} is not a run dir (no .hydra/config.yaml)")
    for name in RUN_FILES:  # what a resume reads, rewrites or appends to
        if (run_dir / name).exists() and not (run_dir / name).is_file():
            raise ConfigError(f"resume: {run_dir / name} is not a file; the run dir is damaged")
    summary = _saved_summary(run_dir)
    done = summary.rounds_completed if summary is not None else None
    if rounds is not None and done is not None:
        if rounds <= done:
            raise ConfigError(not_an_extension(done, rounds))
    elif summary is not None and summary.status == "completed":
        # an extension stopped before its end: the saved config has more rounds than the
        # summary's (of the run it extends)
        total, ran = _saved_rounds(run_dir), (summary.config or {}).get("rounds")
        if not (isinstance(total, int) and isinstance(ran, int) and total > ran):
            raise ConfigError(
                f"resume: {run_dir} already completed all its rounds ({done}); extend it "
                f"with rounds=N, N > {done}"
            )
    if not (run_dir / CHECKPOINT_FILE).exists():
        raise ConfigError(
            f"resume: {run_dir} has no {CHECKPOINT_FILE} (no checkpoint was written in the "
            "rounds it ran; checkpoint_every sets how often they are written)"
        )


def not_an_extension(done: int, rounds: int) -> str:
    return (
        f"rounds: the run has done {done} rounds; rounds={rounds} does not extend it "
        f"(give more than {done})"
    )


def _saved_summary(run_dir: Path) -> RunSummary | None:
    """The run dir's summary.json (None: none, or unreadable)."""
    path = run_dir / "summary.json"
    if not path.exists():
        return None
    try:
        return RunSummary.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, ValueError, AttributeError, TypeError):
        return None


def _saved_rounds(run_dir: Path) -> int | None:
    """`rounds` in the run dir's .hydra/config.yaml (None: not a number there)."""
    try:
        rounds = OmegaConf.load(run_dir / ".hydra" / "config.yaml").get("rounds")
    except Exception:  # an unreadable config is refused, naming it, by `load_run_config`
        return None
    return rounds if isinstance(rounds, int) and not isinstance(rounds, bool) else None
