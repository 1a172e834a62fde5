"""Every client's personal model on its local splits, in batched passes (`torch.func`).

A chunk of clients becomes a `PersonalBatch`: from the algorithm's `personal_models` hook where it
has one (FedRep: the body once, the heads stacked), else by reading each client's
`personal_model` once and snapshotting its parameters, buffers and per-client tensor attributes
of submodules (WAFFLe's factor masks); tensors equal for every client of the chunk are kept
once, the others stacked. The chunk's padded local data then runs through
`vmap(functional_call(model))`. Clients are ordered by their split sizes so that a chunk pads
little; a chunk holds at most `EVAL_BATCH` padded samples per pass and about `CHUNK_BYTES` of
stacked state. Per-client hit counts are exact, and the accuracy is the same float32 division
as `accuracy`'s mean, so the values equal those of a per-client loop wherever the batched
forward gives the same argmax (its logits agree to float tolerance). The same logits give each
client's mean cross-entropy (`personal_outcomes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap
from torch.utils._pytree import tree_flatten, tree_map

from fedexp.core.algorithm import PersonalBatch
from fedexp.core.client_store import tensor_attrs
from fedexp.engine.eval.hits import EVAL_BATCH
from fedexp.engine.stacking import architecture, split_attrs

CHUNK_BYTES = 256 * 1024**2  # stacked per-client parameters, buffers and attributes per chunk
FIRST_CHUNK = 64  # clients in the first chunk, before the bytes per client are known


@dataclass
class _Snapshot:
    tensors: dict[str, torch.Tensor]  # the first snapshot's own tensor where equal to it
    attrs: dict[str, dict]  # submodule name -> its per-client attributes
    key: tuple  # clients with equal keys are stacked together


class _Layout:
    """What is read off one resident personal model: its architecture key, its parameter and
    buffer tensors, and the public attributes of its submodules that hold tensors or None
    (per-client inputs such as factor masks). Read once per model object and evaluation (a
    personal model is loaded into in place)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.key = architecture(model)
        self.tensors = [*model.named_parameters(), *model.named_buffers()]
        self.attrs = {}
        self.modules = {}
        for name, (sub, found) in tensor_attrs(model).items():
            self.attrs[name], self.modules[name] = found, sub

    def snapshot(self, first: _Snapshot | None) -> _Snapshot:
        tensors = {}
        for name, t in self.tensors:
            t = t.detach()
            same = first is not None and torch.equal(t, first.tensors[name])
            tensors[name] = first.tensors[name] if same else t.clone()
        attrs, signature = {}, []
        for name, keys in self.attrs.items():
            values = vars(self.modules[name])
            found = {k: values.get(k) for k in keys}
            attrs[name] = tree_map(lambda v: v.clone() if torch.is_tensor(v) else v, found)
            leaves = tree_flatten(found)[0]
            signature.append(tuple(tuple(v.shape) if torch.is_tensor(v) else v for v in leaves))
        # clients whose attributes differ in kind (None for one, a tensor for another) or
        # shape cannot be stacked together: the signature separates them
        return _Snapshot(tensors, attrs, (self.key, tuple(signature)))


def _stack(layout: _Layout, group: list[_Snapshot], device) -> PersonalBatch:
    first = group[0]
    differs = [n for n, t in first.tensors.items() if any(g.tensors[n] is not t for g in group)]
    shared = {n: t for n, t in first.tensors.items() if n not in differs}
    stacked = {n: torch.stack([g.tensors[n] for g in group]) for n in differs}
    batch = PersonalBatch(layout.model, shared, stacked)
    for name in first.attrs:
        same, batched = split_attrs([g.attrs.get(name, {}) for g in group], device)
        batch.shared_attrs[name], batch.attrs[name] = same, batched
    return batch


def _batches(algorithm, state, ids: np.ndarray, layouts: dict, device):
    """[(PersonalBatch, rows of `ids` it holds)] for one chunk; None: no personal models."""
    batch = algorithm.personal_models(state, ids.tolist())
    if batch is not None:
        return [(batch, np.arange(len(ids)))]
    groups: dict[tuple, tuple[_Layout, list[_Snapshot], list[int]]] = {}
    for row, cid in enumerate(ids.tolist()):
        model = algorithm.personal_model(state, cid)
        if model is None:
            return None
        if id(model) not in layouts:
            layouts[id(model)] = _Layout(model)
        layout = layouts[id(model)]
        first = next((g[1][0] for g in groups.values() if g[0] is layout), None)
        snap = layout.snapshot(first)
        _, snaps, rows = groups.setdefault(snap.key, (layout, [], []))
        snaps.append(snap)
        rows.append(row)
    return [(_stack(lay, snaps, device), np.array(rows)) for lay, snaps, rows in groups.values()]


def _stacked_bytes(batch: PersonalBatch) -> int:
    leaves = [*batch.stacked.values(), *tree_flatten(batch.attrs)[0]]
    return sum(torch.as_tensor(v).nbytes for v in leaves)


def personal_accuracies(
    algorithm, state, data, clients: np.ndarray, splits: tuple[str, ...]
) -> dict[str, np.ndarray] | None:
    """Accuracy of each of `clients`' personal model on its local `splits` (NaN where a split is
    empty), in `clients` order; None where the algorithm has no personal models."""
    out = personal_outcomes(algorithm, state, data, clients, splits)
    return None if out is None else {s: accs for s, (accs, _) in out.items()}


def personal_outcomes(
    algorithm, state, data, clients: np.ndarray, splits: tuple[str, ...]
) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """(accuracy, mean cross-entropy) of each of `clients`' personal model on its local
    `splits` (NaN where a split is empty), in `clients` order, from one pass; None where the
    algorithm has no personal models."""
    clients = np.asarray(clients, dtype=np.int64)
    out = {s: (np.full(len(clients), np.nan), np.full(len(clients), np.nan)) for s in splits}
    if len(clients) == 0:
        return out
    sizes = np.max([data.split_sizes(s)[clients] for s in splits], axis=0)
    order = np.argsort(sizes, kind="stable")  # similar sizes share a chunk: little padding
    layouts: dict[int, _Layout] = {}  # id(model) -> its layout, for this evaluation
    cap, start = FIRST_CHUNK, 0
    while start < len(order):
        stop = start + 1
        while (
            stop < len(order)
            and stop - start < cap
            and (stop - start + 1) * max(int(sizes[order[stop]]), 1) <= EVAL_BATCH
        ):
            stop += 1
        pos = order[start:stop]
        batches = _batches(algorithm, state, clients[pos], layouts, data.x.device)
        if batches is None:
            return None
        held = 0
        for batch, rows in batches:
            found = _evaluate(batch, clients[pos[rows]], data, splits)
            for s in splits:
                for mine, theirs in zip(out[s], found[s]):
                    mine[pos[rows]] = theirs
            held += _stacked_bytes(batch)
        cap = max(1, CHUNK_BYTES * len(pos) // max(held, 1))
        start = stop
    return out


@torch.no_grad()
def _evaluate(
    batch: PersonalBatch, ids: np.ndarray, data, splits
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """One batch's clients: vmapped forward over their padded local data, exact hit counts and
    the summed cross-entropy of the real samples; per split (accuracies, mean losses)."""
    model = batch.model
    modules = dict(model.named_modules())
    touched = set(batch.attrs) | set(batch.shared_attrs)
    saved = {name: dict(vars(modules[name])) for name in touched}
    was_training = model.training
    model.eval()

    def forward(params, attrs, x):
        for name, values in attrs.items():
            vars(modules[name]).update(values)
        return functional_call(model, {**batch.shared, **params}, (x,))

    def looped_forward(stacked, attrs, x):  # the same calls one client at a time
        def row(i):
            return tree_map(lambda v: v[i] if torch.is_tensor(v) else v, (stacked, attrs))

        return torch.stack([forward(*row(i), x[i]) for i in range(len(x))])

    # torch.func has no batching rule for the recurrent kernels (aten::lstm): loop over clients
    recurrent = any(isinstance(m, nn.RNNBase) for m in model.modules())
    batched_forward = (
        looped_forward if recurrent else vmap(forward, in_dims=(0, 0, 0), randomness="different")
    )
    out = {}
    try:
        for name, values in batch.shared_attrs.items():
            vars(modules[name]).update(values)
        forward_batch = partial(batched_forward, batch.stacked, batch.attrs)  # inputs -> logits
        for split in splits:
            out[split] = _split_outcomes(forward_batch, ids, data, split)
    finally:
        for name, values in saved.items():
            vars(modules[name]).clear()
            vars(modules[name]).update(values)
        model.train(was_training)
    return out


def _split_outcomes(forward, ids: np.ndarray, data, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(accuracies, mean losses) of the clients `ids` on their local `split`: their padded
    samples through `forward` (each client's inputs, stacked -> its logits), a window of
    columns at a time; exact hit counts and the summed cross-entropy of the real samples. NaN
    for a client without samples in the split."""
    device = data.x.device
    flat, offsets = data.local_index(split)
    n = offsets[ids + 1] - offsets[ids]
    if n.max(initial=0) == 0:
        return np.full(len(ids), np.nan), np.full(len(ids), np.nan)
    width = int(n.max())
    window = max(1, EVAL_BATCH // len(ids))
    hits = torch.zeros(len(ids), dtype=torch.long, device=device)
    loss = torch.zeros(len(ids), dtype=torch.float64, device=device)
    for lo in range(0, width, window):
        cols = np.arange(lo, min(lo + window, width))
        valid = cols[None, :] < n[:, None]
        pos = np.where(valid, offsets[ids][:, None] + cols[None, :], 0)
        idx = flat[torch.as_tensor(pos, device=device)]
        logits = forward(data.x[idx])
        real = torch.as_tensor(valid, device=device)
        right = (logits.argmax(-1) == data.y[idx]) & real
        hits += right.sum(1)
        ce = F.cross_entropy(
            logits.flatten(0, 1).double(), data.y[idx].flatten().long(), reduction="none"
        )
        loss += torch.where(real, ce.view(real.shape), 0.0).sum(1)
    total = torch.as_tensor(n, device=device).float()
    acc = (hits.float() / total).double().cpu().numpy()  # float32, as accuracy's mean
    mean_loss = (loss / total.double()).cpu().numpy()
    return np.where(n > 0, acc, np.nan), np.where(n > 0, mean_loss, np.nan)
