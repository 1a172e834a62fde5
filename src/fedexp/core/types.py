"""Typed messages that cross the client/server boundary, and the round context.

Each message says its exact size on the wire (see `fedexp.metrics.comm` for the formats): dense
`Weights`, and those of the compressed and robust algorithms (`Signs`, `SparseDelta`, `Ranking`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

# re-exported: the error and the float width live in the layers below core
from fedexp.errors import ConfigError  # noqa: F401
from fedexp.metrics.comm import FLOAT_BITS, index_bits, permutation_bits


class Diverged(RuntimeError):
    """A non-finite loss or model; the run stops cleanly."""

    def __init__(self, round_idx: int, what: str):
        super().__init__(f"diverged at round {round_idx}: {what}")
        self.round_idx = round_idx


@dataclass(frozen=True)
class RoundContext:
    """What every component knows about the current round."""

    round: int
    client_ids: tuple[int, ...]
    seed: int
    # uploads of this round an attack corrupted (flagged `ClientResult.malicious`); the round
    # loop fills it after the attack, before `aggregate`, where aggregators may be granted it
    num_malicious: int = 0


# what a message carries, as attacks and aggregators see it (`Message.capabilities`)
VECTOR = "vector"  # one dense flat float vector: `vector`, `with_vector` (`VectorMessage`)
SIGNS = "signs"  # one +1/-1 per coordinate (int8): `map_values`
SPARSE = "sparse"  # some coordinates of a float vector (values and indices): `map_values`
RANKING = "ranking"  # permutations of edge ids (FRL)


class Message:
    """A payload or an upload. Subclasses say how many bits they cost on the wire, and what they
    carry in `capabilities` (`VECTOR`, `SIGNS`, `SPARSE`, `RANKING`): an attack corrupts the
    messages whose capabilities it knows, whatever their class."""

    capabilities: ClassVar[frozenset[str]] = frozenset()

    def num_bits(self) -> int:
        raise NotImplementedError

    def cohort_bits(self, size: int) -> int | None:
        """Bits of the `size` clients' messages stacked in this one (`fedexp.core.cohort`), or
        None (the default): `size` times one client's, as for every message whose size does not
        depend on what it carries. A message whose size does (FedProto's prototypes of the
        classes a client holds) counts all of its rows."""
        return None

    def map_values(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Message:
        """The same message with `fn` applied elementwise to the numbers it carries (`fn(0)`
        must be 0 for sparse messages: the coordinates not sent stay zero)."""
        raise TypeError(f"{type(self).__name__} carries no values to transform")


class VectorMessage(Message):
    """A message carrying one flat float vector (the `VECTOR` capability): `vector` reads it and
    `with_vector` returns the same message carrying another, whatever the field is called.
    FedAvg's hooks read payloads and uploads through it, so a payload with more in it (FedHeNN's
    RAD, WAFFLe's temperature) needs no hooks of its own for the weights."""

    capabilities: ClassVar[frozenset[str]] = frozenset({VECTOR})
    vector_field: ClassVar[str] = "values"  # the dataclass field holding the vector

    @property
    def vector(self) -> torch.Tensor:
        return getattr(self, self.vector_field)

    def with_vector(self, vector: torch.Tensor) -> VectorMessage:
        return dataclasses.replace(self, **{self.vector_field: vector})

    def map_values(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Message:
        return self.with_vector(fn(self.vector))


def capabilities(message_type: type | None) -> frozenset[str]:
    """What a Message class carries (nothing for None: an undeclared upload type)."""
    return getattr(message_type, "capabilities", frozenset())


@dataclass(frozen=True)
class Weights(VectorMessage):
    """Dense float tensor (a flat parameter vector or a delta)."""

    values: torch.Tensor

    def num_bits(self) -> int:
        return self.values.numel() * FLOAT_BITS


@dataclass(frozen=True)
class Nothing(Message):
    """An empty message (e.g. nothing sent down to a client that keeps its own model)."""

    def num_bits(self) -> int:
        return 0


@dataclass(frozen=True)
class Signs(Message):
    """One sign per coordinate (+1 / -1 as int8), packed on the wire as 1 bit each (SignSGD)."""

    values: torch.Tensor
    capabilities = frozenset({SIGNS})

    def num_bits(self) -> int:
        return self.values.numel()

    def map_values(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Message:
        return Signs(fn(self.values))


@dataclass(frozen=True)
class SparseDelta(Message):
    """The kept coordinates of a `dim`-long vector: float values and their indices (TopK)."""

    values: torch.Tensor
    indices: torch.Tensor
    dim: int
    capabilities = frozenset({SPARSE})

    def num_bits(self) -> int:
        return self.values.numel() * (FLOAT_BITS + index_bits(self.dim))

    def dense(self) -> torch.Tensor:
        out = torch.zeros(self.dim, dtype=self.values.dtype, device=self.values.device)
        return out.index_put((self.indices,), self.values)

    def map_values(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Message:
        return dataclasses.replace(self, values=fn(self.values))


@dataclass(frozen=True)
class Ranking(Message):
    """One permutation per supermask layer: edge ids from the lowest to the highest rank (FRL)."""

    layers: tuple[torch.Tensor, ...]
    capabilities = frozenset({RANKING})

    def num_bits(self) -> int:
        return sum(permutation_bits(layer.numel()) for layer in self.layers)


@dataclass(frozen=True)
class ClientResult:
    """What one client returns at the end of its local training."""

    client_id: int
    num_samples: int
    upload: Message
    train_loss: float
    num_steps: int
    malicious: bool = False  # set by an attack that corrupted this upload
    # what `self.log` recorded in the client's steps: name -> its mean over those steps
    logged: dict[str, torch.Tensor] = field(default_factory=dict)
    # the running statistics (BatchNorm's) uploaded beside `upload`, as one float vector, where
    # the algorithm shares them (`Algorithm.client_stats`); counted in comm/up_bits
    stats: torch.Tensor | None = None


@dataclass
class ServerState:
    """Server-side state; `params` is the global flat vector where the algorithm has one."""

    params: torch.Tensor | None = None
    buffers: dict[str, Any] = field(default_factory=dict)


def malicious_count(results: Sequence[ClientResult]) -> int:
    """How many of the round's uploads an attack corrupted (it flags them `malicious`)."""
    flagged = getattr(results, "malicious_total", None)  # `RoundResults` counts its flags
    if flagged is not None:
        return flagged
    return sum(r.malicious for r in results)
