"""Parameters laid out in one flat buffer: a model's parameters as one vector and back.

`share_storage` lays parameters out as views of one contiguous buffer; `flat_params`, `flat_delta`
and `load_flat` are then one copy each instead of one per tensor (and fall back to one copy per
tensor where the layout is gone). `named_views` reads a flat vector back as named tensors.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from torch import nn
from torch.autograd.graph import increment_version

# id of the first parameter -> (a weak reference to it, the buffer, the ids of the parameters
# laid out in it, in order); an entry goes when its first parameter does (tensors compare
# elementwise, so they cannot key a WeakKeyDictionary)
_SHARED_STORAGE: dict[int, tuple[weakref.ref, torch.Tensor, tuple[int, ...]]] = {}


@torch.no_grad()
def share_storage(params: Sequence[nn.Parameter]) -> None:
    """Lay `params` out, in this order, as views of one contiguous buffer, so that `flat_params`
    and `load_flat` over exactly these parameters are one copy each instead of one per tensor.

    Values, shapes, dtypes, devices and the parameter objects (which optimizers hold) stay
    as they were. Nothing is done where the parameters differ in dtype or device, where one is
    not contiguous (a channels-last weight keeps its strides) or empty, where two share
    storage already, or where they are already laid out. A parameter whose storage is later
    replaced (`module.to`, a deep copy's fresh tensors) only loses the fast path: `flat_params`
    and `load_flat` check the layout on every call. A parameter pickled or saved on its own
    carries the whole buffer; the run's saved models and messages are copies.
    """
    params = list(params)
    if len(params) < 2 or shared_buffer(params) is not None:
        return
    first = params[0]
    if any(
        p.dtype != first.dtype or p.device != first.device or not p.is_contiguous() or not p.numel()
        for p in params
    ):
        return
    if len({p.untyped_storage().data_ptr() for p in params}) < len(params):
        return
    buffer = torch.cat([p.detach().reshape(-1) for p in params])
    offset = 0
    for p in params:
        n = p.numel()
        p.data = buffer[offset : offset + n].view(p.shape)
        offset += n
    key = id(first)
    gone = weakref.ref(first, lambda _ref: _SHARED_STORAGE.pop(key, None))
    _SHARED_STORAGE[key] = (gone, buffer, tuple(id(p) for p in params))


def share_model_storage(model: nn.Module, params: Sequence[nn.Parameter]) -> None:
    """`share_storage(params)` for parameters of `model`, except where it has a recurrent layer:
    on CUDA, cuDNN packs an RNN's weights into a buffer of its own and would copy them on every
    forward pass once they were moved out of it."""
    if not any(isinstance(m, nn.RNNBase) for m in model.modules()):
        share_storage(params)


def shared_buffer(params: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The buffer `share_storage` laid `params` out in, if they are still exactly its views."""
    entry = _SHARED_STORAGE.get(id(params[0])) if params else None
    if entry is None:
        return None
    first, buffer, ids = entry
    if first() is not params[0] or len(ids) != len(params):
        return None
    address, itemsize = buffer.data_ptr(), buffer.element_size()
    for p, pid in zip(params, ids):
        if id(p) != pid or p.data_ptr() != address or not p.is_contiguous():
            return None
        address += p.numel() * itemsize
    return buffer


def flat_params(params: Sequence[nn.Parameter]) -> torch.Tensor:
    """Concatenate parameters into one detached flat vector (a copy)."""
    buffer = shared_buffer(params)
    if buffer is not None:
        return buffer.clone()
    return torch.cat([p.detach().reshape(-1) for p in params])


def flat_delta(params: Sequence[nn.Parameter], reference: torch.Tensor) -> torch.Tensor:
    """`flat_params(params) - reference`, read straight off the parameters' buffer where they
    share one (`share_storage`): a client's upload without the intermediate copy."""
    buffer = shared_buffer(params)
    if buffer is not None and reference.shape == buffer.shape:
        return buffer - reference  # made from detached tensors: no autograd history
    return flat_params(params) - reference


@torch.no_grad()
def load_flat(params: Sequence[nn.Parameter], flat: torch.Tensor) -> None:
    """Copy a flat vector into parameters in place (no aliasing)."""
    buffer = shared_buffer(params)
    if buffer is not None and flat.shape == buffer.shape:
        buffer.copy_(flat)
        # each parameter has its own version counter: mark them written, so that autograd
        # still refuses a backward through weights loaded since the forward pass
        increment_version(params)
        return
    offset = 0
    for p in params:
        n = p.numel()
        p.copy_(flat[offset : offset + n].view_as(p))
        offset += n


def named_views(
    flat: torch.Tensor, model: nn.Module, params: Sequence[nn.Parameter]
) -> dict[str, torch.Tensor]:
    """`flat` (the concatenation of `params`, optionally with a leading batch dimension) as
    views shaped like `params`, keyed by their names in `model`."""
    names = {id(p): n for n, p in model.named_parameters()}
    lead = flat.shape[:-1]
    chunks = flat.split([p.numel() for p in params], dim=-1)
    return {names[id(p)]: c.reshape(*lead, *p.shape) for p, c in zip(params, chunks)}
