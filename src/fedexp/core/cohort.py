"""One client protocol, shaped for a batch: what a cohort starts from, what its training did, and
the round's results.

An algorithm writes its client half once, for a cohort of C clients that train one module
(`Algorithm.begin` / `Algorithm.end`): `begin` returns every client's starting parameters and
per-client inputs stacked along a leading client axis (`CohortStart`), `end` receives the trained
parameters the same way with what the training did (`CohortTraining`) and returns the uploads as
one message whose tensor fields are stacked [C, ...]. The sequential executor runs each client as
a cohort of one; the vectorized executor runs a whole architecture group at once, so a round
issues the same torch operations whatever its size, plus a few per client (its own shuffle).

`RoundResults` is the one type a round's results have, whatever the executor: a sequence of
`ClientResult` (indexing builds one, so attacks and audits read clients one by one) that also
holds the uploads stacked, the losses, and what the steps logged, which `Algorithm.aggregate`
and the round loop read without building per-client results.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedexp.core.local import PhaseTraining
from fedexp.core.types import ClientResult, Message


@dataclass
class CohortStart:
    """What `Algorithm.begin` gives the executor for a cohort of C clients.

    params: every parameter and buffer of the client module by name, stacked [C, *shape] (an
        `expand` of one tensor where every client starts from the same).
    attrs: the per-client inputs to `training_step` the module declares in `per_client_state`,
        stacked [C, ...] (lists and dicts of such tensors too).
    shared: module attributes set once for the whole cohort (the same for every client).
    flat: optionally, groups of the module's tensors that take one flat vector ([d] for every
        client, or [C, d]): a client loaded into the module takes it with one copy where they
        share a buffer (`fedexp.core.flat.load_flat`); `params` still holds them by name.
    """

    params: dict[str, torch.Tensor]
    attrs: dict[str, Any] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)
    flat: list[tuple[list[torch.Tensor], torch.Tensor]] = field(default_factory=list)


@dataclass
class CohortTraining:
    """What local training did for a cohort, one entry per client (in `client_ids` order).

    `data`: each client's training samples (x, y) as it trained on them (an attack's poisoned
    view where there is one), for an `end` that evaluates the trained model on them; `phases`:
    each client's phases (`PhaseTraining`: name, epochs, steps, learning rates)."""

    client_ids: list[int]
    samples: list[int]
    steps: list[int]
    mean_loss: torch.Tensor  # [C]
    lrs: tuple[float, ...] = ()  # every phase's optimizer's learning rates, per param group
    data: Sequence[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    phases: list[tuple[PhaseTraining, ...]] = field(default_factory=list)  # each client's

    @property
    def lr(self) -> float | None:
        """The learning rate every step used, or None where param groups or phases differ."""
        lrs = set(self.lrs)
        return lrs.pop() if len(lrs) == 1 else None


# ---- messages stacked along the client axis ----------------------------------------------------
def _row(value, i: int):
    if isinstance(value, torch.Tensor):
        return value[i]
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return type(value)(v[i] for v in value)
    if isinstance(value, dict):
        return {k: _row(v, i) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return unstack(value, i)
    return value


def unstack(message, i: int):
    """Row `i` of a message (or a dataclass inside one) whose tensor fields are stacked along a
    leading client dimension; fields that are not tensors are every client's."""
    fields = {f.name: _row(getattr(message, f.name), i) for f in dataclasses.fields(message)}
    return type(message)(**fields)


def _join(values: list, how):
    first = values[0]
    if isinstance(first, torch.Tensor):
        return how(values)
    if isinstance(first, (tuple, list)) and first and isinstance(first[0], torch.Tensor):
        return type(first)(how(list(vs)) for vs in zip(*values))
    if isinstance(first, dict):
        return {k: _join([v[k] for v in values], how) for k in first}
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        return _join_messages(values, how)
    if any(v != first for v in values[1:]):
        raise ValueError(f"uploads differ in a field that is not stacked: {values!r}")
    return first


def _join_messages(messages: list, how):
    kind = type(messages[0])
    if any(type(m) is not kind for m in messages):
        raise ValueError("uploads of different types cannot be stacked")
    names = [f.name for f in dataclasses.fields(kind)]
    return kind(**{n: _join([getattr(m, n) for m in messages], how) for n in names})


def stack_messages(rows: Sequence[Message]) -> Message:
    """Messages of single clients as one message stacked [C, ...]."""
    return _join_messages(list(rows), torch.stack)


def cat_messages(parts: Sequence[Message]) -> Message:
    """Stacked messages [C_k, ...] joined along the client axis."""
    return parts[0] if len(parts) == 1 else _join_messages(list(parts), torch.cat)


# ---- the round's results -----------------------------------------------------------------------
@dataclass
class _Part:
    """Consecutive clients of a round whose uploads are one stacked message."""

    upload: Message
    size: int
    stats: torch.Tensor | None = None  # [size, s] running statistics uploaded beside it


class RoundResults(Sequence):
    """The round's results, in the order of the round's clients.

    The uploads are held as stacked messages (one per cohort the executor trained at once);
    `uploads()` joins them into one [C, ...], `upload_rows(name)` gives one field so. Losses are
    one tensor [C]; logged: name -> [C] means with the count of steps that logged each.
    """

    def __init__(
        self,
        training: CohortTraining,
        upload: Message,
        logged: dict[str, torch.Tensor] | None = None,
        logged_counts: dict[str, torch.Tensor] | None = None,
        stats: torch.Tensor | None = None,
    ):
        self.client_ids = list(training.client_ids)
        self.num_samples = list(training.samples)
        self.num_steps = list(training.steps)
        self.train_loss = training.mean_loss.reshape(len(self.client_ids))
        self.logged = dict(logged or {})
        self.logged_counts = dict(logged_counts or {})
        self.malicious = [False] * len(self.client_ids)
        self._parts = [_Part(upload, len(self.client_ids), stats)]
        self._rows: dict[int, ClientResult] = {}

    # ---- building ----------------------------------------------------------------------------
    @classmethod
    def empty(cls) -> RoundResults:
        """No client's results."""
        return cls.concat([])

    @classmethod
    def concat(cls, results: Sequence[RoundResults]) -> RoundResults:
        """Results of consecutive cohorts as one (logged names a cohort lacks count 0 there)."""
        if len(results) == 1:
            return results[0]
        out = cls.__new__(cls)
        out.client_ids = [c for r in results for c in r.client_ids]
        out.num_samples = [n for r in results for n in r.num_samples]
        out.num_steps = [k for r in results for k in r.num_steps]
        out.train_loss = torch.cat([r.train_loss for r in results]) if results else torch.zeros(0)
        out.malicious = [m for r in results for m in r.malicious]
        out._parts = [p for r in results for p in r._parts]
        out._rows = {}
        names = dict.fromkeys(k for r in results for k in r.logged)
        out.logged, out.logged_counts = {}, {}
        for name in names:
            values, counts = [], []
            for r in results:
                if name in r.logged:
                    values.append(r.logged[name])
                    counts.append(r.logged_counts[name])
                else:
                    values.append(torch.full((len(r),), float("nan"), device=r.train_loss.device))
                    counts.append(torch.zeros(len(r), device=r.train_loss.device))
            out.logged[name] = torch.cat(values)
            out.logged_counts[name] = torch.cat(counts)
        return out

    @classmethod
    def of(cls, results: Sequence[ClientResult]) -> RoundResults:
        """Results written client by client (a test's, a hand-made round) as one."""
        parts = []
        for r in results:
            loss = torch.as_tensor(r.train_loss, dtype=torch.float32).reshape(1)
            facts = CohortTraining([r.client_id], [r.num_samples], [r.num_steps], loss)
            logged = {k: torch.as_tensor(v).reshape(1) for k, v in r.logged.items()}
            counts = {k: torch.ones(1) for k in r.logged}
            stats = None if r.stats is None else r.stats.unsqueeze(0)
            part = cls(facts, stack_messages([r.upload]), logged, counts, stats)
            part.malicious = [r.malicious]
            parts.append(part)
        return cls.concat(parts)

    def take(self, client_ids: Sequence[int]) -> RoundResults:
        """These results in the order of `client_ids` (each one of them)."""
        ids = [int(c) for c in client_ids]
        if ids == self.client_ids:
            return self
        at = {c: i for i, c in enumerate(self.client_ids)}
        return RoundResults.concat([self._slice(at[c]) for c in ids])

    def _slice(self, i: int) -> RoundResults:
        part, row = self._locate(i)
        one = [self.client_ids[i]]
        loss = self.train_loss[i : i + 1]
        training = CohortTraining(one, [self.num_samples[i]], [self.num_steps[i]], loss)
        upload = cat_messages([_narrow(part.upload, row)])
        stats = None if part.stats is None else part.stats[row : row + 1]
        logged = {k: v[i : i + 1] for k, v in self.logged.items()}
        counts = {k: v[i : i + 1] for k, v in self.logged_counts.items()}
        out = RoundResults(training, upload, logged, counts, stats)
        out.malicious = [self.malicious[i]]
        return out

    def with_uploads(self, positions: Sequence[int], uploads: Sequence[Message]) -> RoundResults:
        """These results with the uploads at `positions` replaced and flagged malicious (an
        attack's corruption); the running statistics stay as the clients computed them. The
        results given stay as they were."""
        if not positions:
            return self
        rows = [self.upload(i) for i in range(len(self))]
        for i, upload in zip(positions, uploads):
            rows[i] = upload
        stats = [self.stats(i) for i in range(len(self))]
        out = RoundResults.__new__(RoundResults)
        out.__dict__.update(self.__dict__)
        out._rows = {}
        try:
            out._parts = [_Part(stack_messages(rows), len(rows), _stack_or_none(stats))]
        except (ValueError, RuntimeError):  # rows of different shapes: one part each
            out._parts = [
                _Part(stack_messages([r]), 1, None if s is None else s.unsqueeze(0))
                for r, s in zip(rows, stats)
            ]
        out.malicious = list(self.malicious)
        for i in positions:
            out.malicious[i] = True
        return out

    def to(self, device) -> RoundResults:
        """These results with every tensor on `device`."""
        out = RoundResults.__new__(RoundResults)
        out.__dict__.update(self.__dict__)
        out.train_loss = self.train_loss.to(device)
        out.logged = {k: v.to(device) for k, v in self.logged.items()}
        out.logged_counts = {k: v.to(device) for k, v in self.logged_counts.items()}
        move = lambda t: t.to(device)  # noqa: E731
        out._parts = [_Part(_map(p.upload, move), p.size, _map(p.stats, move)) for p in self._parts]
        out._rows = {}
        return out

    # ---- reading -----------------------------------------------------------------------------
    def _locate(self, i: int) -> tuple[_Part, int]:
        for part in self._parts:
            if i < part.size:
                return part, i
            i -= part.size
        raise IndexError(i)

    def upload(self, i: int) -> Message:
        part, row = self._locate(i)
        return unstack(part.upload, row)

    def stats(self, i: int) -> torch.Tensor | None:
        part, row = self._locate(i)
        return None if part.stats is None else part.stats[row]

    def uploads(self) -> Message:
        """Every client's upload as one message stacked [C, ...] (`unstack` gives one's)."""
        return cat_messages([p.upload for p in self._parts])

    def upload_rows(self, name: str, index: int | None = None) -> torch.Tensor:
        """The uploads' field `name` stacked [C, ...] (its `index`-th entry for a tuple)."""
        rows = [getattr(p.upload, name) for p in self._parts]
        rows = rows if index is None else [r[index] for r in rows]
        return rows[0] if len(rows) == 1 else torch.cat(rows)

    def stats_rows(self) -> torch.Tensor | None:
        """The running statistics every client uploaded [C, s], or None where any sent none."""
        parts = [p.stats for p in self._parts]
        if not parts or any(s is None for s in parts):
            return None
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    @property
    def malicious_total(self) -> int:
        return sum(self.malicious)

    def __len__(self) -> int:
        return len(self.client_ids)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        if i not in self._rows:
            logged = {k: v[i] for k, v in self.logged.items() if bool(self.logged_counts[k][i] > 0)}
            self._rows[i] = ClientResult(
                self.client_ids[i],
                self.num_samples[i],
                self.upload(i),
                self.train_loss[i],
                self.num_steps[i],
                malicious=self.malicious[i],
                logged=logged,
                stats=self.stats(i),
            )
        return self._rows[i]

    def upload_bits(self, stats_bits) -> int:
        """Bits of every client's upload and running statistics (`Message.cohort_bits`: a part's
        size times one row's unless the message counts its rows; `stats_bits(vector)` counts a
        statistics row)."""
        total = 0
        for part in self._parts:
            bits = part.upload.cohort_bits(part.size)
            if bits is None:
                bits = part.size * unstack(part.upload, 0).num_bits()
            stats = 0 if part.stats is None else part.size * stats_bits(part.stats[0])
            total += bits + stats
        return total

    def logged_means(self) -> dict[str, torch.Tensor]:
        """name -> the mean over the clients that logged it of each one's mean (a tensor)."""
        out = {}
        for name, values in self.logged.items():
            has = self.logged_counts[name] > 0
            out[name] = torch.where(has, values, 0.0).sum() / has.sum()
        return out


def _map(value, fn):
    """`value` (a message, a dataclass, tuples, lists and dicts of them) with `fn` applied to
    every tensor in it."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _map(getattr(value, f.name), fn) for f in dataclasses.fields(value)}
        return type(value)(**fields)
    return value


def _narrow(message, row: int):
    """Row `row` of a stacked message, kept stacked [1, ...]."""
    return _map(message, lambda t: t[row : row + 1])


def _stack_or_none(rows: list) -> torch.Tensor | None:
    return None if not rows or any(r is None for r in rows) else torch.stack(rows)


def resident(module, count: int, given: dict | None = None) -> dict[str, torch.Tensor]:
    """`given` (name -> [C, ...]) completed with the module's own parameters and buffers for
    every name it lacks, expanded to `count` clients (as the resident module holds them)."""
    out = dict(given or {})
    for name, t in module.named_tensors():
        if name not in out:
            out[name] = t.detach().expand(count, *t.shape)
    return out


def flat_rows(module, params, tensors) -> torch.Tensor:
    """`tensors` (parameters or buffers of `module`) read from the stacked `params`
    (name -> [C, ...]), flat per client: [C, d] (`flat_params` of each client's)."""
    names = module.tensor_names()
    rows = [params[names[id(t)]] for t in tensors]
    return torch.cat([r.reshape(r.shape[0], -1) for r in rows], 1)
