"""Checkpoints for exact resume: everything that determines the future of a run, in one file.

What is saved (and why it is enough): the server state (params + buffers), the client store, the
round number, the orchestrator's running totals and last evaluation, the state of the attack,
executor and callbacks (their optional `state_dict`), the loggers' run ids, and the global RNG
streams. Client sampling and every client's randomness are derived from (seed, round, client) in
`fedexp.core.seeding`, so there is no sampler position to save; the global torch/numpy/python RNG
streams are saved anyway because nothing stops a component (a server-side noise draw, a library
call) from using them between the executor's per-client reseeds. Client optimizers are built
afresh for every phase of every client, so they hold no state across rounds; a client whose
optimizer state persists keeps it in the client store, which is saved.

Files hold only tensors, numbers, strings, None, lists and dicts, so they load with
`torch.load(weights_only=True)`; they are written to a temp file and renamed into place, so a kill
at any moment leaves either the previous checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from fedexp.core.fingerprint import (  # noqa: F401 - config_hash is part of this API
    VOLATILE_KEYS,
    ConfigDigest,
    config_hash,
    data_digest,
    first_difference,
)
from fedexp.core.types import ConfigError, ServerState

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT_VERSION = 2  # 2: the config hash is of the resolved config, and the data digest is saved
SAVEABLE_SCALARS = (bool, int, float, str, type(None))


class Interrupted(RuntimeError):
    """SIGINT/SIGTERM arrived; the run stopped after a round and wrote a checkpoint."""

    def __init__(self, round_idx: int, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name} after round {round_idx}")
        self.round_idx = round_idx
        self.signum = signum


def check_saveable(obj: Any, where: str = "checkpoint") -> None:
    """Raise TypeError naming the first value that `torch.load(weights_only=True)` would refuse.

    Components keep their state as tensors, numbers, strings, lists/tuples and dicts of those
    (the convention of ServerState.buffers and the ClientStore); anything else is a bug there.
    """
    if isinstance(obj, (torch.Tensor, *SAVEABLE_SCALARS)):
        return
    if isinstance(obj, list | tuple):
        for i, item in enumerate(obj):
            check_saveable(item, f"{where}[{i}]")
    elif isinstance(obj, dict):
        for key, item in obj.items():
            if not isinstance(key, int | str):
                raise TypeError(f"{where}: dict key {key!r} is not an int or str")
            check_saveable(item, f"{where}[{key!r}]")
    else:
        raise TypeError(
            f"{where}: {type(obj).__name__} cannot go into a checkpoint; keep state as "
            "tensors, numbers, strings, lists and dicts"
        )


def save_checkpoint(path: str | Path, payload: dict) -> None:
    """Write `payload` atomically: temp file in the same directory, fsync, rename."""
    path = Path(path)
    check_saveable(payload)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(
    path: str | Path, expected_hash: str | None = None, map_location: Any = "cpu"
) -> dict:
    """Load and check a checkpoint; any problem is a one-line ConfigError."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"resume: no checkpoint at {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ConfigError(
            f"resume: {path} is not a readable checkpoint ({type(err).__name__}: {first[:120]})"
        ) from None
    version = payload.get("format") if isinstance(payload, dict) else None
    if version == 1:
        raise ConfigError(
            f"resume: {path} was written by an older fedexp (checkpoint format 1), which did not "
            "record the data it trained on; start the run again"
        )
    if version != FORMAT_VERSION:
        raise ConfigError(f"resume: {path} is not a fedexp checkpoint of format {FORMAT_VERSION}")
    if expected_hash is not None and payload.get("config_hash") != expected_hash:
        diff = None
        if isinstance(expected_hash, ConfigDigest):
            diff = first_difference(expected_hash.stable, payload.get("resolved_config"))
        detail = f": {diff}" if diff else ""
        raise ConfigError(
            f"resume: {path} was written for a different config than the run dir's "
            f".hydra/config.yaml resolves to now (config hash mismatch{detail})"
        )
    return payload


def check_resumed_data(payload: dict | None, data: Any) -> None:
    """Refuse (one line) to resume a checkpoint on data other than the data it was trained on;
    no-op without a checkpoint. `data` is the built FederatedData."""
    if payload is not None and payload.get("data_digest") != data_digest(data):
        raise ConfigError(
            "resume: the data differs from the data the checkpoint was trained on (training "
            "labels, inputs or client partition); resume with the same data"
        )


# ---- RNG streams ------------------------------------------------------------------------------
def rng_state() -> dict:
    """The global RNG streams (torch CPU and CUDA, numpy's legacy global, python's random)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "python": [version, list(internal), gauss_next],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"].cpu())
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])


# ---- metric logs ------------------------------------------------------------------------------
def truncate_metric_logs(run_dir: str | Path, last_round: int) -> None:
    """Drop metrics.jsonl/metrics.csv rows past `last_round` (logged after the checkpoint).

    The resumed run logs those rounds again, so every round appears exactly once. A half-written
    last line (the process was killed while writing it) is dropped too.
    """
    run_dir = Path(run_dir)
    jsonl = run_dir / "metrics.jsonl"
    if jsonl.exists():
        keep = []
        for line in jsonl.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if int(row.get("round", 0)) <= last_round:
                keep.append(line)
        _write_atomic(jsonl, "".join(line + "\n" for line in keep))
    csv_path = run_dir / "metrics.csv"
    if csv_path.exists():
        lines = csv_path.read_text().splitlines()
        if lines:
            header = lines[0].split(",")
            col = header.index("round") if "round" in header else 0
            body = [line for line in lines[1:] if _csv_round(line, col) <= last_round]
            _write_atomic(csv_path, "".join(line + "\n" for line in [lines[0], *body]))


def _csv_round(line: str, col: int) -> float:
    """The row's round; a malformed (half-written) row sorts after every round."""
    try:
        return int(line.split(",")[col])
    except (IndexError, ValueError):
        return float("inf")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ---- stop on SIGINT / SIGTERM -------------------------------------------------------------------
class StopSignals:
    """First SIGINT/SIGTERM: finish the round, checkpoint, stop. Second: stop at once."""

    def __init__(self) -> None:
        self.requested: int | None = None

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt
        self.requested = signum
        log.warning(
            "%s: stopping after this round with a checkpoint (again to stop at once)",
            signal.Signals(signum).name,
        )

    @contextmanager
    def installed(self) -> Iterator[StopSignals]:
        if threading.current_thread() is not threading.main_thread():
            yield self  # signal handlers can only be set from the main thread
            return
        previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


# ---- the checkpointer -------------------------------------------------------------------------
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


def restore_logger(logger, payload: dict | None) -> None:
    """Give a logger its saved state (the W&B run id) before it starts; no-op without one."""
    if payload is not None:
        load_component_states({type(logger).__name__: logger}, payload.get("loggers", {}))


class Checkpointer:
    """Writes `run_dir/checkpoint.pt` every `every` rounds and when a stop signal arrives.

    Args:
        run_dir: the run directory.
        every: rounds between checkpoints; 0 writes one only on SIGINT/SIGTERM.
        config: the run's config (its hash is checked on resume).
        store: the ClientStore.
        components: name -> object with optional `state_dict`/`load_state_dict` (the attack,
            the executor, callbacks).
        loggers: loggers whose optional `state_dict()` (e.g. the W&B run id) is saved; they are
            restored before they start, by `restore_logger`.
    """

    def __init__(
        self,
        run_dir: str | Path,
        every: int,
        config: DictConfig,
        store,
        components: Mapping[str, Any],
        loggers: Sequence = (),
    ):
        self.path = Path(run_dir) / CHECKPOINT_FILE
        self.every = every
        self.config = OmegaConf.to_container(config, resolve=False)
        self.hash = config_hash(config)
        self.data_digest: str | None = None  # of the orchestrator's data, at the first save
        self.store = store
        self.components = dict(components)
        self.loggers = list(loggers)
        self.signals = StopSignals()
        self.saved_round: int | None = None  # the round the checkpoint on disk holds

    def snapshot(self, orch) -> dict:
        state: ServerState = orch.state
        if self.data_digest is None:
            self.data_digest = data_digest(orch.data)
        return {
            "format": FORMAT_VERSION,
            "config_hash": str(self.hash),
            "resolved_config": self.hash.stable,
            "data_digest": self.data_digest,
            "config": self.config,
            "round": orch.round,
            "server": {"params": state.params, "buffers": state.buffers},
            "client_store": self.store.state_dict(),
            "orchestrator": orch.state_dict(),
            "components": component_states(self.components),
            "loggers": component_states({type(lg).__name__: lg for lg in self.loggers}),
            "rng": rng_state(),
        }

    def save(self, orch) -> None:
        save_checkpoint(self.path, self.snapshot(orch))
        self.saved_round = orch.round
        log.info("checkpoint: round %d -> %s", orch.round, self.path)

    def after_round(self, orch, round_idx: int) -> None:
        """Called by the orchestrator once round `round_idx` is complete and logged."""
        stop = self.signals.requested
        if stop is not None or (self.every and round_idx % self.every == 0):
            self.save(orch)
        if stop is not None:
            raise Interrupted(round_idx, stop)

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


# ---- resume from the command line -------------------------------------------------------------
RESUME_OVERRIDABLE = ("device", "threads", "progress", "checkpoint_every")


def load_run_config(
    run_dir: str | Path, overrides: Sequence[str] = ()
) -> tuple[DictConfig, dict, str | None]:
    """The saved config of a run dir, for `python -m fedexp resume=<run dir>`.

    Returns (config, Hydra group choices, W&B group). Only keys that do not change results
    (`RESUME_OVERRIDABLE`) may be overridden; anything wrong is a one-line ConfigError.
    """
    run_dir = Path(run_dir)
    cfg_path = run_dir / ".hydra" / "config.yaml"
    if not cfg_path.exists():
        raise ConfigError(f"resume: {run_dir} is not a run dir (no .hydra/config.yaml)")
    summary_path = run_dir / "summary.json"
    if summary_path.exists():
        try:
            status = json.loads(summary_path.read_text()).get("status")
        except (json.JSONDecodeError, AttributeError):
            status = None
        if status == "completed":
            raise ConfigError(f"resume: {run_dir} already completed all its rounds")
    if not (run_dir / CHECKPOINT_FILE).exists():
        raise ConfigError(
            f"resume: {run_dir} has no {CHECKPOINT_FILE} (stopped before its first checkpoint; "
            "checkpoint_every sets how often they are written)"
        )
    cfg = OmegaConf.load(cfg_path)
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key not in RESUME_OVERRIDABLE:
            raise ConfigError(
                f"{key}: a resumed run keeps its config; only {', '.join(RESUME_OVERRIDABLE)} "
                "may be given with resume="
            )
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([f"{key}={value}"]))
    OmegaConf.set_struct(cfg, True)
    choices, group = {}, None
    hydra_path = run_dir / ".hydra" / "hydra.yaml"
    if hydra_path.exists():
        hydra = OmegaConf.to_container(OmegaConf.load(hydra_path), resolve=False).get("hydra", {})
        runtime_choices = hydra.get("runtime", {}).get("choices", {})
        choices = {k: v for k, v in runtime_choices.items() if not k.startswith("hydra")}
        group = run_dir.parent.name if str(hydra.get("mode")) == "MULTIRUN" else None
    return cfg, choices, group
