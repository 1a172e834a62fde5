"""Flower's Bulyan on fixed inputs: the reference numbers of tests/aggregators/test_bulyan.py.

    PYTHONPATH=<dir with flwr> python scripts/reference_bulyan.py

Runs `flwr.server.strategy.aggregate.aggregate_bulyan` over `aggregate_krum` (to_keep=0: Krum,
the paper's first phase) on the inputs of `case_inputs` for each (n, f) of CASES, then fedexp's
`bulyan` on the same inputs, and prints Flower's aggregates (float64) with the largest absolute
difference. The test file holds the printed numbers as constants (flwr 1.42.0) and runs this
comparison itself where flwr is importable.

The inputs are a closed formula, not a random generator's draw, so that they stay the same
across numpy and torch versions: x[i, j] = 10 sin(1 + 7 i + 3 j + 31 case), the first f rows
moved by the case's shift in every coordinate (the Byzantine ones), all values distinct (no ties
in Krum's scores or in the distances to the median).
"""

from __future__ import annotations

import math

import numpy as np

# (n, f, shift of the first f rows): n >= 4f + 3; theta = n - 2f odd and even; Byzantine rows far
# off (50) and among the others (3, 0)
CASES = ((7, 1, 50.0), (8, 1, 50.0), (11, 2, 50.0), (12, 2, 3.0), (15, 3, 3.0), (9, 1, 0.0))
DIM = 5


def case_inputs(case: int, n: int, f: int, shift: float, dim: int = DIM) -> np.ndarray:
    """[n, dim] float64 inputs of a case (the formula of the module docstring)."""
    rows = [
        [10.0 * math.sin(1 + 7 * i + 3 * j + 31 * case) + (shift if i < f else 0.0)
         for j in range(dim)]
        for i in range(n)
    ]  # fmt: skip
    return np.array(rows, dtype=np.float64)


def flower_bulyan(x: np.ndarray, f: int) -> np.ndarray:
    """Flower's Bulyan over Krum of the rows of `x` (one layer each, unit sample counts)."""
    from flwr.server.strategy.aggregate import aggregate_bulyan, aggregate_krum

    results = [([row.copy()], 1) for row in x]
    (out,) = aggregate_bulyan(results, f, aggregate_krum, to_keep=0)
    return np.asarray(out, dtype=np.float64)


def main() -> None:
    import flwr
    import torch

    from fedexp.aggregators.bulyan import bulyan

    print(f"flwr {flwr.__version__}")
    for case, (n, f, shift) in enumerate(CASES):
        x = case_inputs(case, n, f, shift)
        theirs = flower_bulyan(x, f)
        ours = bulyan(torch.from_numpy(x), torch.ones(n, dtype=torch.float64), f=f).numpy()
        values = ", ".join(repr(float(v)) for v in theirs)
        print(f"    ({case}, {n}, {f}, {shift}): ({values}),  # max |fedexp - flwr| = "
              f"{float(np.abs(ours - theirs).max()):.3g}")  # fmt: skip


if __name__ == "__main__":
    main()
