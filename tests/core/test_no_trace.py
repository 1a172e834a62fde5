"""`no_trace`: training inside leaves the given clients' store entries and torch's RNG as they
were (the attackers' pool and the membership-inference audit train through it)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fedexp.core.client_loop import no_trace
from fedexp.core.client_store import ClientStore


def algorithm_with(store: ClientStore) -> SimpleNamespace:
    return SimpleNamespace(store=store, device=torch.device("cpu"))


def train_inside(store: ClientStore) -> None:
    store.get(1).add_(torch.randn(3))  # written in place
    store.put(2, {"head": torch.randn(2)})  # replaced
    store.put(7, torch.randn(3))  # a client that had no entry


@pytest.mark.parametrize("max_bytes", [None, 1])  # 1: every entry but the newest spills
def test_the_entries_and_the_rng_are_as_before(max_bytes):
    store = ClientStore(max_bytes=max_bytes)
    store.put(1, torch.ones(3))
    store.put(2, {"head": torch.zeros(2)})
    store.put(3, torch.full((3,), 3.0))
    rng = torch.get_rng_state()
    with no_trace(algorithm_with(store), [1, 2, 7, 2]):
        train_inside(store)
    assert torch.equal(torch.get_rng_state(), rng)
    assert sorted(store.state_dict()) == [1, 2, 3]  # 7 is gone again
    assert torch.equal(store.get(1), torch.ones(3))
    assert torch.equal(store.get(2)["head"], torch.zeros(2))
    assert torch.equal(store.get(3), torch.full((3,), 3.0))


def test_an_error_inside_still_restores():
    store = ClientStore()
    store.put(1, torch.ones(3))
    rng = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="stopped"), no_trace(algorithm_with(store), [1, 2, 7]):
        train_inside(store)
        raise RuntimeError("stopped")
    assert torch.equal(torch.get_rng_state(), rng)
    assert sorted(store.state_dict()) == [1] and torch.equal(store.get(1), torch.ones(3))
