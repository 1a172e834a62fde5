"""Per-client index sets held as one flat array and an offsets array (no per-client objects)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class Split(Sequence):
    """Every client's indices in one flat array: client c holds `flat[offsets[c]:offsets[c+1]]`.

    Behaves as a read-only list of per-client index arrays (`split[c]` is a view), but holds two
    arrays whatever the number of clients.
    """

    def __init__(self, flat: np.ndarray, offsets: np.ndarray):
        self.flat = np.asarray(flat, dtype=np.int64)
        self.offsets = np.asarray(offsets, dtype=np.int64)

    @classmethod
    def of(cls, parts: Split | Sequence[np.ndarray]) -> Split:
        """`parts` as a Split (one per-client array each, or already a Split)."""
        if isinstance(parts, Split):
            return parts
        sizes = [len(p) for p in parts]
        flat = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        return cls(flat, np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]))

    @property
    def sizes(self) -> np.ndarray:
        """Each client's number of indices."""
        return np.diff(self.offsets)

    def owners(self) -> np.ndarray:
        """The client of each entry of `flat`."""
        return np.repeat(np.arange(len(self)), self.sizes)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, c):
        if isinstance(c, slice):
            return [self[i] for i in range(*c.indices(len(self)))]
        c = range(len(self))[c]  # negative indices; IndexError past the end
        return self.flat[self.offsets[c] : self.offsets[c + 1]]

    def __add__(self, other) -> list[np.ndarray]:  # as lists concatenate
        return [*self, *other]

    def __radd__(self, other) -> list[np.ndarray]:
        return [*other, *self]

    def __repr__(self) -> str:
        return f"Split({len(self)} clients, {len(self.flat)} indices)"
