"""A round's batches for stacked clients, laid out on the host (numpy arrays: no device sync
per step) and moved to the device once (`fedexp.engine.executors.stacked` trains on them)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Schedule:
    """One phase's batches for stacked clients, on the host: sample indices [C, T, B] into the
    clients' data laid end to end, their validity [C, T, B] and the active steps [C, T]."""

    idx: np.ndarray
    valid: np.ndarray
    active: np.ndarray

    def rows(self, a: int, b: int, pad_to: int | None = None) -> Schedule:
        """Clients a..b, padded with inactive rows (no valid sample, no step) to `pad_to`."""
        idx, valid, active = self.idx[a:b], self.valid[a:b], self.active[a:b]
        pad = (pad_to or 0) - (b - a)
        if pad > 0:
            idx = np.concatenate([idx, np.zeros((pad, *idx.shape[1:]), idx.dtype)])
            valid = np.concatenate([valid, np.zeros((pad, *valid.shape[1:]), bool)])
            active = np.concatenate([active, np.zeros((pad, *active.shape[1:]), bool)])
        return Schedule(idx, valid, active)

    def to(self, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[bool]]:
        """(idx, valid, active) on the device, and which steps every client takes (a list on
        the host: no device sync per step)."""
        everyone = self.active.all(0).tolist()
        put = [torch.as_tensor(a, device=device) for a in (self.idx, self.valid, self.active)]
        return put[0], put[1], put[2], everyone


def schedule(
    orders: list[list[np.ndarray]], sizes: list[int], batch_size: int, caps=None
) -> Schedule:
    """One phase's `Schedule`. `orders[i]`: client i's permutation of each epoch of the phase;
    `caps[i]`: the steps client i takes (its first, of its epochs' batches in order; a drawn
    local work cuts its last epoch short), None: all of them.

    Each epoch's last, short batch is padded (invalid samples, label ignored); a client with
    fewer steps than the longest repeats its first batch on the padded steps and is masked out
    of the update.
    """
    per_epoch = [-(-n // batch_size) for n in sizes]
    own = [len(o) * k for o, k in zip(orders, per_epoch)]
    if caps is not None:
        own = [k if cap is None else min(k, cap) for k, cap in zip(own, caps)]
    steps = max(own, default=0)
    num = len(sizes)
    idx = np.zeros((num, steps, batch_size), dtype=np.int64)
    valid = np.zeros((num, steps, batch_size), dtype=bool)
    active = np.zeros((num, steps), dtype=bool)
    offset = 0
    for i, (client_orders, n) in enumerate(zip(orders, sizes)):
        if client_orders:
            k = per_epoch[i]
            pos = np.full((len(client_orders), k * batch_size), -1, dtype=np.int64)
            for e, order in enumerate(client_orders):
                pos[e, :n] = order
            pos = pos.reshape(-1, batch_size)[: own[i]]
            pos = np.concatenate([pos, np.repeat(pos[:1], steps - len(pos), axis=0)])
            idx[i] = np.maximum(pos, 0) + offset
            valid[i] = pos >= 0
            active[i, : own[i]] = True
        offset += n
    return Schedule(idx, valid, active)


def pad_rows(t, rows: int):
    """A stacked [C, ...] tensor padded to `rows` by repeating its first row (any other value)."""
    if not isinstance(t, torch.Tensor) or t.shape[0] >= rows:
        return t
    return torch.cat([t, t[:1].expand(rows - t.shape[0], *t.shape[1:])])
