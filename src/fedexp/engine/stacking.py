"""Per-client values stacked along a leading client axis, for the vectorized executor and the
batched evaluation of personal models: which modules stack together, and which of their
attributes are stacked."""

from __future__ import annotations

from numbers import Number
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from fedexp.core.types import ConfigError


def architecture(module: nn.Module) -> tuple:
    """Modules with equal keys train in one vmapped group."""
    return (
        type(module),
        tuple((n, p.shape, p.dtype) for n, p in module.named_parameters()),
        tuple((n, b.shape, b.dtype) for n, b in module.named_buffers()),
    )


def split_attrs(attrs: list[dict[str, Any]], device) -> tuple[dict, dict]:
    """Attributes every client shares stay as they are; the others are stacked per client."""
    shared, batched = {}, {}
    for key in attrs[0]:
        values = [a.get(key) for a in attrs]
        first = values[0]
        if all(v is first for v in values) or (
            isinstance(first, Number) and all(v == first for v in values)
        ):
            shared[key] = first
            continue
        try:
            batched[key] = tree_map(
                lambda *leaves: torch.stack([torch.as_tensor(v, device=device) for v in leaves]),
                *values,
            )
        except (ValueError, TypeError, RuntimeError) as err:
            raise ConfigError(
                f"executor: module attribute {key!r} differs across clients and cannot be "
                f"stacked ({err})"
            ) from None
    return shared, batched
