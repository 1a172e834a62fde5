"""Comparing two runs, or two passes, whose float kernels differ.

Two code paths that compute the same thing with other kernels (a vmapped step against a plain
one, a batch of every client's samples against one per client, a padded batch against a short
one) agree only to float tolerance: the kernels sum in other orders, and which orders they take
differs from CPU to CPU. Wherever a discrete choice is made from such floats (an argmax, a top-k,
a sign, a sort), two inputs closer than that tolerance (a near-tie) may be ordered either way,
and an exact comparison of the two paths then passes on one CPU and fails on another. What the
two paths promise is agreement wherever the choice is clear, and this module checks that:

- accuracies: `near_ties` counts a model's samples whose two largest logits are within `TIE`;
  `assert_same_accuracies` asks for equal accuracies where a client holds none, and otherwise
  a difference of at most that many samples;
- uploads chosen from trained floats (TopK's coordinates, SignSGD's signs, FRL's rankings):
  `watch_choices` records them in a reference run; in the other run it checks each choice and,
  where the two differ on a near-tie, goes on with the reference's (`check_choices` checks that
  the run's floats admit it), so that the runs stay comparable round after round;
- the edges a supermask keeps, chosen inside a vmapped step where no choice can be replaced:
  `watch_mask_margins` gives the reference run's gap at every choice, for a case built to keep
  them clear of ties (`MASK_MARGIN`).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import torch

from fedexp.algorithms import frl, signsgd, topk
from fedexp.core.types import SparseDelta
from fedexp.models import supermask

# ---- accuracies ---------------------------------------------------------------------------------
TIE = 1e-4  # logits closer than this (relative to the largest, plus 1) may swap their order


@torch.no_grad()
def near_ties(logits: torch.Tensor) -> int:
    """How many samples (rows of `logits`) have two largest logits within `TIE`."""
    if logits.shape[0] == 0 or logits.shape[1] < 2:
        return 0
    top = logits.topk(2, dim=1).values
    return int((top[:, 0] - top[:, 1] <= TIE * (1 + top[:, 0].abs())).sum())


def assert_same_accuracies(got, expected, sizes, ties) -> None:
    """Per client, accuracies `got` and `expected` (NaN where a split is empty) of `sizes`
    samples are equal where the client holds no near-tie (`ties`), else within that many."""
    got, expected = np.asarray(got, dtype=float), np.asarray(expected, dtype=float)
    sizes, ties = np.asarray(sizes), np.asarray(ties)
    assert np.array_equal(np.isnan(got), np.isnan(expected)) and np.array_equal(
        np.isnan(got), sizes == 0
    )
    clear = (ties == 0) & (sizes > 0)
    assert np.array_equal(got[clear], expected[clear])  # exactly: the same hits, the same float
    held = sizes > 0
    hits = np.rint(got[held] * sizes[held]) - np.rint(expected[held] * sizes[held])
    assert (np.abs(hits) <= ties[held]).all()


# ---- uploads chosen from trained floats -------------------------------------------------------
@dataclass(frozen=True)
class Tolerance:
    """How far two paths' floats may part: |a - b| <= atol + rtol |b|, as `assert_close`."""

    rtol: float
    atol: float

    def bound(self, magnitude: torch.Tensor | float):
        """The most two floats near `magnitude` that each path may have moved may differ."""
        return 2 * (self.atol + self.rtol * magnitude)


@dataclass(frozen=True)
class Rule:
    """A function by which an algorithm's client hooks turn trained floats into an upload."""

    module: ModuleType  # where the hooks look it up
    name: str
    key: Callable  # the call's arguments -> the floats chosen from ([C, n] where batched)
    pin: Callable  # (this run's floats, the reference's choice) -> the reference's choice
    admits: Callable  # (this run's floats, the reference's choice, Tolerance) -> bool
    batched: bool = False  # one call for the cohort: key, result and upload have [C, ...] rows


def _top_fraction_admits(key: torch.Tensor, ref: SparseDelta, tol: Tolerance) -> bool:
    """The reference's coordinates are a top-k of |key| up to the tolerance."""
    chosen = torch.zeros(key.numel(), dtype=torch.bool)
    chosen[ref.indices] = True
    threshold = key.abs()[chosen].min()
    return bool(key.abs()[~chosen].max() - threshold <= tol.bound(threshold))


def _signs_admit(key: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> bool:
    """Where the signs differ, the value is within the tolerance of 0."""
    return bool(key[signsgd.to_signs(key) != ref].abs().le(tol.bound(0.0)).all())


def _sorted_admits(key: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> bool:
    """The reference's order sorts the key up to the tolerance."""
    ordered = key[ref]
    return bool((ordered[:-1] - ordered[1:] <= tol.bound(ordered[:-1].abs())).all())


TOP_FRACTION = Rule(
    topk,
    "top_fraction",
    key=lambda vector, fraction: vector,
    pin=lambda key, ref: SparseDelta(key[ref.indices].clone(), ref.indices.clone(), key.numel()),
    admits=_top_fraction_admits,
)
SIGNS = Rule(
    signsgd,
    "to_signs",
    key=lambda delta: delta,
    pin=lambda key, ref: ref.clone(),
    admits=_signs_admit,
    batched=True,  # `end` takes the signs of the cohort's deltas [C, d] at once
)
RANKING = Rule(
    frl,
    "ranking",
    key=lambda scores, kind: supermask.rank_key(scores, kind),
    pin=lambda key, ref: ref.clone(),
    admits=_sorted_admits,
)
RANKINGS = Rule(
    frl,
    "rankings",
    key=lambda stacked, kind: torch.stack([supermask.rank_key(s, kind) for s in stacked]),
    pin=lambda key, ref: ref.clone(),
    admits=_sorted_admits,
    batched=True,
)
# algorithm -> (its class, its rules)
RULES = {
    "topk": (topk.TopK, [TOP_FRACTION]),
    "signsgd": (signsgd.SignSGD, [SIGNS]),
    "frl": (frl.FRL, [RANKING, RANKINGS]),
}


@dataclass
class Choice:
    rule: Rule
    key: torch.Tensor  # the client's floats
    own: Any  # what the rule's function chose from them
    sent: Any  # what the client went on with: `own`, or on a near-tie the reference's


def watch_clients(monkeypatch, owner: type) -> list:
    """[(client, its number of earlier `end` calls)] of the running `end`'s rows; the list is
    empty outside it. An unbatched rule's calls inside it go to its rows in order."""
    running, visits = [], collections.Counter()
    end = owner.end

    def call(self, module, payloads, params, training):
        clients = list(training.client_ids)
        running[:] = [(c, visits[c]) for c in clients]
        visits.update(clients)
        try:
            return end(self, module, payloads, params, training)
        finally:
            running.clear()

    monkeypatch.setattr(owner, "end", call)
    return running


def watch_choices(monkeypatch, name: str, reference: dict | None = None) -> dict:
    """Records the choices of algorithm `name`'s rules inside its client hooks under (client, its
    number of earlier hooks, the call's number within the hook); nothing for an algorithm
    without rules. With the reference run's record as `reference`, a choice that differs from
    the reference's is replaced by it."""
    owner, rules = RULES.get(name, (None, []))
    records: dict[tuple[int, int, int], Choice] = {}
    if owner is None:
        return records
    running = watch_clients(monkeypatch, owner)
    calls = collections.Counter()
    rows = collections.Counter()  # unbatched calls so far in an `end`, by its first row

    def watched(rule: Rule, function):
        def call(*args):
            out = function(*args)
            if not running:  # the server's own use (e.g. its first ranking)
                return out
            keys, owns = rule.key(*args), out
            clients = running
            if not rule.batched:  # the k-th call of an `end` is its k-th row's
                keys, owns = [keys], [out]
                clients = [running[rows[running[0]] % len(running)]]
                rows[running[0]] += 1
            sent = []
            for client, key, own in zip(clients, keys, owns):
                at = (*client, calls[client])
                calls[client] += 1
                ref = None if reference is None else reference[at].sent
                same = ref is None or _same(own, ref)
                sent.append(own if same else rule.pin(key, ref))
                records[at] = Choice(rule, key.detach().clone(), own, sent[-1])
            return torch.stack(sent) if rule.batched else sent[0]

        return call

    for rule in rules:
        monkeypatch.setattr(rule.module, rule.name, watched(rule, getattr(rule.module, rule.name)))
    return records


def _same(a, b) -> bool:
    if isinstance(a, SparseDelta):
        return torch.equal(a.indices, b.indices)
    return torch.equal(a, b)


def check_choices(records: dict, reference: dict, tol: Tolerance) -> int:
    """Each choice of a run was made from the reference's floats to the tolerance, and where it
    differs from the reference's, the run's floats admit the reference's choice within that
    tolerance (a near-tie). Returns how many choices were replaced."""
    assert records.keys() == reference.keys()
    replaced = 0
    for at, choice in records.items():
        ref = reference[at]
        torch.testing.assert_close(choice.key, ref.key, rtol=tol.rtol, atol=tol.atol)
        if not _same(choice.own, ref.sent):
            replaced += 1
            assert choice.rule.admits(choice.key, ref.sent, tol), at
    return replaced


# ---- the edges a supermask keeps ----------------------------------------------------------------
MASKED = {"frl", "supermask_fedavg"}  # algorithms that train supermasks
# the least relative gap between the kept edge of least |score| and the next that a case built
# clear of ties must show: eight float32 ulps (two paths' trained scores agree to one or two)
MASK_MARGIN = 8 * torch.finfo(torch.float32).eps
# such a case at `debug=smoke` size: a supermask small enough, trained in few enough steps, that
# its kept edges stay clear of ties; random weights, since signed constant ones sum to exact
# zeros, which two paths round to either side of the ReLU's kink
CLEAR_SUPERMASK = [
    "model.hidden=[4]",
    "algorithm.weight_init=kaiming_normal",
    "client.batch_size=64",
]


def watch_mask_margins(monkeypatch) -> list[float]:
    """The relative gap between the k-th and (k+1)-th largest |score| at every mask."""
    margins: list[float] = []
    edge_mask = supermask.edge_mask

    def watched(scores, k):
        key = scores.detach().abs().reshape(-1)
        kept = supermask.num_kept(key.numel(), k)
        if kept < key.numel():
            top = key.topk(kept + 1).values
            margins.append(float((top[-2] - top[-1]) / top[-2]))
        return edge_mask(scores, k)

    monkeypatch.setattr(supermask, "edge_mask", watched)
    return margins
