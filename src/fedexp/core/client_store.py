"""Per-client state that stays on a client across rounds (FedRep heads, personal models, ...).

The store keeps at most `max_bytes` of client state in memory (tensor bytes, wherever the tensors
live) and spills the least recently used clients to disk with `torch.save`, loading them back on
the next `get`: 10 000 clients with personal models fit a small budget. Without a budget
everything stays in memory.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from fedexp.core.types import ConfigError

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_bytes(value: int | str | None) -> int | None:
    """`1048576`, `"512MB"`, `"1.5G"` -> bytes (binary units); None stays None."""
    if value is None or isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)i?B?\s*", str(value).upper())
    if not match:
        raise ConfigError(f"client_store.max_bytes: cannot read {value!r} (e.g. 2GB, 512MB)")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def state_bytes(state: Any) -> int:
    """Bytes held by the tensors inside `state` (dicts, lists, tuples of tensors)."""
    leaves, _ = tree_flatten(state)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


class ClientStore:
    """A mapping client id -> opaque state; the round loop never looks inside.

    Args:
        max_bytes: budget for states held in memory (int or "512MB"); None: no limit.
        spill_dir: where spilled states go; None: a temporary dir removed with the store.
    """

    def __init__(self, max_bytes: int | str | None = None, spill_dir: str | Path | None = None):
        self.max_bytes = parse_bytes(max_bytes)
        if self.max_bytes is not None and self.max_bytes <= 0:
            raise ConfigError(f"client_store.max_bytes: must be > 0 or null, got {max_bytes}")
        self._state: OrderedDict[int, Any] = OrderedDict()  # least recently used first
        self._bytes: dict[int, int] = {}
        self._spilled: set[int] = set()
        self._spill_root = Path(spill_dir) if spill_dir is not None else None
        self._spill_path: Path | None = None
        self.resident_bytes = 0
        self.spills = 0  # how many times a state was written out (for reports and tests)

    # ---- mapping -------------------------------------------------------------------------------
    def get(self, client_id: int, default: Any = None) -> Any:
        if client_id in self._state:
            self._state.move_to_end(client_id)
            return self._state[client_id]
        if client_id in self._spilled:
            state = torch.load(self._file(client_id), weights_only=True)
            self._spilled.discard(client_id)
            self._file(client_id).unlink()
            self._keep(client_id, state)
            return state
        return default

    def put(self, client_id: int, state: Any) -> None:
        self.delete(client_id)
        self._keep(client_id, state)

    def gather(self, client_ids, default: Any) -> Any:
        """The states of `client_ids` stacked along a new leading dimension (one stack per
        tensor of the state, a dict or list of tensors too); `default` for a client without one
        (the same object for all: no copy is made)."""
        states = [self.get(c, default) for c in client_ids]
        return tree_map(lambda *rows: torch.stack(rows), *states)

    def scatter(self, client_ids, stacked: Any) -> None:
        """`put` each client its row of `stacked` (as `gather` returns them). Each row is a copy
        of its own: a view would keep the whole cohort's tensor alive while any row is kept."""
        leaves, spec = tree_flatten(stacked)
        rows = [t.unbind(0) for t in leaves]
        for i, cid in enumerate(client_ids):
            self.put(cid, tree_unflatten([r[i].clone() for r in rows], spec))

    def delete(self, client_id: int) -> None:
        """Forget the client's state (resident or spilled); a client without one is left alone."""
        if client_id in self._spilled:
            self._spilled.discard(client_id)
            self._file(client_id).unlink()
        elif client_id in self._state:
            self.resident_bytes -= self._bytes.pop(client_id)
            del self._state[client_id]

    def __contains__(self, client_id: int) -> bool:
        return client_id in self._state or client_id in self._spilled

    def __len__(self) -> int:
        return len(self._state) + len(self._spilled)

    def state_dict(self) -> dict[int, Any]:
        """Every client's state (spilled ones read back from disk, not re-admitted)."""
        out = dict(self._state)
        for cid in self._spilled:
            out[cid] = torch.load(self._file(cid), weights_only=True)
        return dict(sorted(out.items()))

    def load_state_dict(self, state: dict[int, Any]) -> None:
        for cid in list(self._spilled):
            self._file(cid).unlink()
        self._state.clear()
        self._bytes.clear()
        self._spilled.clear()
        self.resident_bytes = 0
        for cid, value in state.items():
            self._keep(int(cid), value)

    @property
    def num_spilled(self) -> int:
        return len(self._spilled)

    # ---- budget --------------------------------------------------------------------------------
    def _keep(self, client_id: int, state: Any) -> None:
        size = state_bytes(state)
        self._state[client_id] = state
        self._bytes[client_id] = size
        self.resident_bytes += size
        if self.max_bytes is None:
            return
        # the newest entry always stays, even alone over budget: it is about to be used
        while self.resident_bytes > self.max_bytes and len(self._state) > 1:
            oldest, value = self._state.popitem(last=False)
            torch.save(value, self._file(oldest))
            self.resident_bytes -= self._bytes.pop(oldest)
            self._spilled.add(oldest)
            self.spills += 1

    def _file(self, client_id: int) -> Path:
        if self._spill_path is None:
            if self._spill_root is None:
                self._spill_path = Path(tempfile.mkdtemp(prefix="fedexp-store-"))
                weakref.finalize(self, shutil.rmtree, self._spill_path, ignore_errors=True)
            else:
                self._spill_path = self._spill_root
                self._spill_path.mkdir(parents=True, exist_ok=True)
        return self._spill_path / f"client_{client_id}.pt"


def holds_tensor(value) -> bool:
    return any(torch.is_tensor(v) for v in tree_flatten(value)[0])


def tensor_attrs(model: nn.Module) -> dict[str, tuple[nn.Module, list[str]]]:
    """The public attributes of `model`'s submodules that hold tensors or None (per-model inputs
    such as factor masks): submodule name -> (the submodule, those attribute names)."""
    out = {}
    for name, sub in model.named_modules():
        found = [
            k
            for k, v in vars(sub).items()
            if not k.startswith("_") and k not in ("training", "generator")
            and (v is None or holds_tensor(v))
        ]  # fmt: skip
        if found:
            out[name] = (sub, found)
    return out
