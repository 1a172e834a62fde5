"""The final models of a run, written at its end: `<run dir>/model.pt` and, where the clients
have models of their own, `<run dir>/personal_models/`.

`model.pt` holds the global model as the algorithm evaluates it (`Algorithm.global_model` of
the last round's state): its `state_dict`, the per-model tensor attributes of its submodules
that a `state_dict` leaves out (`attrs`: WAFFLe's factor selections; empty for ordinary
models) and `meta` (the round, the algorithm, the model factory and its arguments, the config
hash, where the personal models are). An algorithm without a global model (FedRep, local
training, FedProto, FedBN on a model with BatchNorm, ...) writes `state_dict: None` and says so
in `meta["note"]`.

`personal_models/clients-<first>-<last>.pt` map client id -> {"state_dict", "attrs"} of
`Algorithm.personal_model` for every client; a tensor equal to the previous client's in the
same file (FedRep's body) is stored once. Without a `client_store.max_bytes` budget the clients
share one file; with one, a file holds at most that many bytes of distinct tensors (a model
larger than that alone): the models being written take at most the store's budget in memory,
besides the store's own. Everything is tensors, numbers, strings,
lists and dicts (`torch.load(weights_only=True)`), written atomically; `model.pt` is written
last, so a run dir with `model.pt` has its personal models complete.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from fedexp.core.client_store import holds_tensor, state_bytes, tensor_attrs
from fedexp.runtime.checkpoint import check_saveable, config_hash, save_atomic

MODEL_FILE = "model.pt"
PERSONAL_DIR = "personal_models"
FORMAT = 1


def module_attrs(model: nn.Module) -> dict[str, dict[str, Any]]:
    """The tensor attributes of `model`'s submodules (`client_store.tensor_attrs`: per-model inputs
    such as factor masks), copied: submodule name -> {attribute: value}."""
    return {
        name: {k: tree_map(_clone, vars(sub)[k]) for k in keys}
        for name, (sub, keys) in tensor_attrs(model).items()
    }


def _clone(value: Any) -> Any:
    return value.detach().clone() if torch.is_tensor(value) else value


def load_attrs(model: nn.Module, attrs: dict[str, dict[str, Any]]) -> None:
    """Set the saved submodule attributes (`module_attrs`) on `model`."""
    for name, values in attrs.items():
        vars(model.get_submodule(name)).update(values)


def model_record(model: nn.Module, previous: dict | None = None) -> dict:
    """{"state_dict", "attrs"} of `model`, copied; a tensor equal to the one of the same name
    in `previous` (a record) is that very tensor, so `torch.save` writes it once."""
    before = previous["state_dict"] if previous is not None else {}
    state = {}
    for name, t in model.state_dict().items():
        old = before.get(name)
        same = (
            old is not None
            and old.shape == t.shape
            and old.dtype == t.dtype
            and torch.equal(old, t)
        )
        state[name] = old if same else t.detach().clone()
    return {"state_dict": state, "attrs": module_attrs(model)}


def _new_bytes(record: dict, previous: dict | None) -> int:
    before = {id(t) for t in (previous or {"state_dict": {}})["state_dict"].values()}
    fresh = [t for t in record["state_dict"].values() if id(t) not in before]
    return state_bytes(fresh) + state_bytes(record["attrs"])


def model_spec(factory: Any) -> dict:
    """The model factory as a target and its keyword arguments (the config's options and the
    data's: input_shape, num_classes, ...), where they can be saved; else {}."""
    if not isinstance(factory, functools.partial):
        return {}
    func = factory.func
    spec = {"_target_": f"{func.__module__}.{func.__qualname__}", "kwargs": dict(factory.keywords)}
    try:
        check_saveable(spec)
    except TypeError:
        return {}
    return spec


def loads_into_factory_model(factory: Any, record: dict) -> bool:
    """Whether the record loads into a fresh model of the factory as it is: the same
    `state_dict` keys and shapes, no tensor attributes (not so for FRL's supermask twin or
    WAFFLe's factorised layers, which the algorithm builds from it)."""
    if any(holds_tensor(v) for v in record["attrs"].values()):
        return False
    try:
        with torch.random.fork_rng(devices=[]):
            fresh = factory().state_dict()
    except Exception:  # a model family wants an architecture
        return False
    saved = record["state_dict"]
    return fresh.keys() == saved.keys() and all(fresh[k].shape == saved[k].shape for k in fresh)


def _write_personal(run_dir: Path, algorithm, state, num_clients: int, budget: int | None):
    """Every client's personal model under `run_dir/personal_models/` (replacing an older
    one); returns the files' names, or None where the algorithm has no personal models."""
    if not algorithm.has_personal_models:
        return None
    final, tmp = run_dir / PERSONAL_DIR, run_dir / f"{PERSONAL_DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    files, part, held, previous, first = [], {}, 0, None, 0

    def flush(last: int) -> None:
        name = f"clients-{first:05d}-{last:05d}.pt"
        save_atomic(tmp / name, part)
        files.append(name)

    for cid in range(num_clients):
        model = algorithm.personal_model(state, cid)
        if model is None:
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        record = model_record(model, previous)
        size = _new_bytes(record, previous)
        if part and budget is not None and held + size > budget:
            flush(cid - 1)
            part, held, first = {}, 0, cid
            record = model_record(model)  # nothing shared across files
            size = _new_bytes(record, None)
        part[cid], held, previous = record, held + size, record
    flush(num_clients - 1)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return files


def save_final_models(
    run_dir: str | Path, algorithm, state, round_idx: int, cfg, store, num_clients: int
) -> None:
    """Write `model.pt` (and `personal_models/`) for the run's state after round `round_idx`."""
    run_dir = Path(run_dir)
    factory = algorithm.ctx.model_factory
    model = algorithm.global_model(state)
    record = model_record(model) if model is not None else {"state_dict": None, "attrs": {}}
    (run_dir / MODEL_FILE).unlink(missing_ok=True)  # an older one never names newer files
    personal = _write_personal(run_dir, algorithm, state, num_clients, store.max_bytes)
    if personal is None:
        shutil.rmtree(run_dir / PERSONAL_DIR, ignore_errors=True)  # an older run's
    name = type(algorithm).__name__
    if model is None:
        note = f"{name} has no global model: personal models only ({PERSONAL_DIR}/)"
    else:
        note = f"the global model of {name} after round {round_idx}"
    meta = {
        "round": round_idx,
        "algorithm": cfg.algorithm._target_,
        "model": model_spec(factory),
        "config_hash": str(config_hash(cfg)),
        "global_model": model is not None,
        "loads_into_model": model is not None and loads_into_factory_model(factory, record),
        "personal": None if personal is None else {"dir": PERSONAL_DIR, "files": personal},
        "note": note,
    }
    payload = {"format": FORMAT, **record, "meta": meta}
    check_saveable(payload, MODEL_FILE)
    save_atomic(run_dir / MODEL_FILE, payload)
