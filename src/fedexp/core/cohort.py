"""A round's cohort handled at once: the batched forms of `client_begin` / `client_end` and the
results they give.

The vectorized executor trains a cohort's clients together; without these forms it still calls
`client_begin` and `client_end` once per client, and the host work of a round grows with the
cohort (each call copies parameters, reads and writes client state, builds an upload). An
algorithm that implements `Algorithm.cohort_begin` / `cohort_end` gives the executor the whole
cohort's starting point and takes the whole cohort's trained parameters back as stacked tensors
(leading dimension: the cohort, in `client_ids` order), so a round issues the same torch
operations whatever its size, plus a few per client (the client's own shuffle).

`CohortResults` is what such a round returns: a sequence of `ClientResult` (indexing builds one,
so attacks, audits and any code written for per-client results keep working) that also holds the
stacked uploads, losses and logged values, which `Algorithm.aggregate` and the orchestrator read
without building per-client results.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedexp.core.types import ClientResult, Message


@dataclass
class CohortStart:
    """What a batched `client_begin` gives the executor for a cohort of C clients.

    params: every parameter and buffer of the client module by name, stacked [C, *shape] (an
        `expand` of one tensor where every client starts from the same).
    attrs: the per-client inputs to `training_step` the module declares in `per_client_state`,
        stacked [C, ...] (lists and dicts of such tensors too).
    shared: module attributes set once for the whole cohort (the same for every client).
    """

    params: dict[str, torch.Tensor]
    attrs: dict[str, Any] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)


@dataclass
class CohortTraining:
    """What local training did for a cohort: `LocalTraining`'s facts, one entry per client."""

    client_ids: list[int]
    samples: list[int]
    steps: list[int]
    mean_loss: torch.Tensor  # [C]
    lrs: tuple[float, ...] = ()  # every phase's optimizer's learning rates (as `PhaseTraining`)

    @property
    def lr(self) -> float | None:
        """The learning rate every step used, or None where param groups differ
        (`LocalTraining.lr`)."""
        lrs = set(self.lrs)
        return lrs.pop() if len(lrs) == 1 else None


def unstack(message: Message, i: int) -> Message:
    """Row `i` of a message whose tensor fields are stacked along a leading cohort dimension."""

    def row(value):
        if isinstance(value, torch.Tensor):
            return value[i]
        if isinstance(value, tuple) and value and isinstance(value[0], torch.Tensor):
            return tuple(v[i] for v in value)
        return value

    fields = {f.name: row(getattr(message, f.name)) for f in dataclasses.fields(message)}
    return type(message)(**fields)


class CohortResults(Sequence):
    """The round's results for a cohort trained at once.

    upload: the uploads of every client as one message whose tensor fields are stacked [C, ...]
        (`unstack` gives one client's); logged: name -> [C] means (NaN where a client logged
        nothing under that name).
    """

    def __init__(
        self,
        training: CohortTraining,
        upload: Message,
        logged: dict[str, torch.Tensor] | None = None,
        logged_counts: dict[str, torch.Tensor] | None = None,
    ):
        self.client_ids = list(training.client_ids)
        self.num_samples = list(training.samples)
        self.num_steps = list(training.steps)
        self.train_loss = training.mean_loss
        self.upload = upload
        self.logged = dict(logged or {})
        self.logged_counts = dict(logged_counts or {})
        self._rows: dict[int, ClientResult] = {}
        self.malicious_total = 0  # an attack that corrupts uploads returns per-client results

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
                unstack(self.upload, i),
                self.train_loss[i],
                self.num_steps[i],
                logged=logged,
            )
        return self._rows[i]

    def upload_bits(self) -> int:
        """Bits of every client's upload: stacked rows share their shapes, so C times one's."""
        return len(self) * unstack(self.upload, 0).num_bits() if len(self) else 0

    def logged_means(self) -> dict[str, torch.Tensor]:
        """name -> the mean over the clients that logged it of each one's mean (a tensor)."""
        out = {}
        for name, values in self.logged.items():
            has = self.logged_counts[name] > 0
            out[name] = torch.where(has, values, 0.0).sum() / has.sum()
        return out


def is_cohort(results: Sequence) -> bool:
    return isinstance(results, CohortResults)


def result_samples(results: Sequence[ClientResult]) -> list[int]:
    """Each client's number of training samples, without building per-client results."""
    if isinstance(results, CohortResults):
        return results.num_samples
    return [r.num_samples for r in results]


def result_losses(results: Sequence[ClientResult]) -> torch.Tensor:
    """The clients' mean training losses [n] as one tensor."""
    if isinstance(results, CohortResults):
        return results.train_loss
    return torch.stack([torch.as_tensor(r.train_loss) for r in results])


def stacked_field(results: Sequence[ClientResult], name: str, index: int | None = None):
    """The uploads' field `name` stacked [n, ...] (its `index`-th entry for a tuple field)."""
    if isinstance(results, CohortResults):
        value = getattr(results.upload, name)
        return value if index is None else value[index]
    rows = [getattr(r.upload, name) for r in results]
    return torch.stack(rows if index is None else [row[index] for row in rows])


def flat_rows(module, params, tensors) -> torch.Tensor:
    """`tensors` (parameters of `module`) read from the stacked `params` (name -> [C, ...]),
    flat per client: [C, d] (`flat_params` of each client's)."""
    names = {id(p): n for n, p in module.named_parameters()}
    return torch.cat([params[names[id(p)]].flatten(1) for p in tensors], 1)
