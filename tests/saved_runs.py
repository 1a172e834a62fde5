"""What a run dir holds, read back for comparing two runs exactly."""

from __future__ import annotations

from pathlib import Path

import torch


def saved_models(run_dir: Path) -> list:
    """What the run saved as its final models (model.pt, then personal_models/*.pt), loaded."""
    files = [run_dir / "model.pt", *sorted((run_dir / "personal_models").glob("*.pt"))]
    return [torch.load(f, weights_only=True) for f in files]


def same(a, b) -> bool:
    """Equal, tensors bit for bit and of one dtype, through dicts, lists and tuples."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b
