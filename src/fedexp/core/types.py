"""Typed messages that cross the client/server boundary, and the round context."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

# re-exported: the error and the float width live in the layers below core
from fedexp.errors import ConfigError  # noqa: F401
from fedexp.metrics.comm import FLOAT_BITS


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
    # benign local training of other clients on this round's payloads that leaves no trace
    # (`fedexp.core.executors.train_aside`); set by the round loop for the attack only
    train_aside: Callable[[Sequence[int]], list[ClientResult]] | None = field(
        default=None, compare=False, repr=False
    )


class Message:
    """A payload or an upload. Subclasses say how many bits they cost on the wire."""

    def num_bits(self) -> int:
        raise NotImplementedError


@dataclass(frozen=True)
class Weights(Message):
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
class ClientResult:
    """What one client returns at the end of its local training."""

    client_id: int
    num_samples: int
    upload: Message
    train_loss: float
    num_steps: int
    malicious: bool = False  # set by an attack that corrupted this upload


@dataclass
class ServerState:
    """Server-side state; `params` is the global flat vector where the algorithm has one."""

    params: torch.Tensor | None = None
    buffers: dict[str, Any] = field(default_factory=dict)
