"""The bounded client store: LRU spill to disk under a byte budget, transparent reads."""

from __future__ import annotations

import pytest
import torch

from fedexp.core.client_store import ClientStore, parse_bytes
from fedexp.core.types import ConfigError


def state(cid: int) -> dict[str, torch.Tensor]:
    """A tiny personal model: 25 floats = 100 bytes."""
    return {"head": torch.full((5, 5), float(cid))}


def test_ten_thousand_clients_under_a_small_budget(tmp_path):
    # Prepare: 10 000 clients x 100 bytes = 1 MB of state, 20 kB budget
    store = ClientStore(max_bytes="20KB", spill_dir=tmp_path)
    # Execute
    for cid in range(10_000):
        store.put(cid, state(cid))
    # Assert: at most the budget in memory, every client readable and intact
    assert store.resident_bytes <= 20 * 1024
    assert len(store) == 10_000 and store.num_spilled == 10_000 - 204
    for cid in (0, 1234, 9999, 5000):
        assert torch.equal(store.get(cid)["head"], state(cid)["head"])
    assert store.resident_bytes <= 20 * 1024
    assert len(list(tmp_path.glob("client_*.pt"))) == store.num_spilled


def test_least_recently_used_spills_first(tmp_path):
    store = ClientStore(max_bytes=250, spill_dir=tmp_path)  # room for two 100-byte states
    store.put(1, state(1))
    store.put(2, state(2))
    store.get(1)  # 2 is now the least recently used
    store.put(3, state(3))
    assert store.num_spilled == 1 and (tmp_path / "client_2.pt").exists()
    store.put(2, state(20))  # overwriting a spilled client drops its file
    assert not (tmp_path / "client_2.pt").exists()
    assert store.get(2)["head"][0, 0] == 20 and 5 not in store and store.get(5, "x") == "x"


def test_state_dict_round_trip_includes_spilled_clients(tmp_path):
    store = ClientStore(max_bytes=150, spill_dir=tmp_path / "a")
    for cid in range(5):
        store.put(cid, state(cid))
    saved = store.state_dict()
    assert sorted(saved) == [0, 1, 2, 3, 4]
    other = ClientStore(max_bytes=150, spill_dir=tmp_path / "b")
    other.load_state_dict(saved)
    assert [float(other.get(c)["head"][0, 0]) for c in range(5)] == [0, 1, 2, 3, 4]


def test_unbounded_store_never_touches_disk():
    store = ClientStore()
    for cid in range(100):
        store.put(cid, state(cid))
    assert store.num_spilled == 0 and store.resident_bytes == 100 * 100


def test_budget_parsing():
    assert parse_bytes("512MB") == 512 * 2**20 and parse_bytes("1.5G") == 3 * 2**29
    assert parse_bytes(1000) == 1000 and parse_bytes(None) is None
    with pytest.raises(ConfigError, match="client_store.max_bytes"):
        parse_bytes("lots")
    with pytest.raises(ConfigError, match="client_store.max_bytes"):
        ClientStore(max_bytes=0)


def test_delete_forgets_resident_and_spilled_states_and_ignores_absent_ones(tmp_path):
    store = ClientStore(max_bytes=150, spill_dir=tmp_path)  # room for one 100-byte state
    store.put(1, state(1))
    store.put(2, state(2))  # 1 spills
    store.delete(1)
    assert 1 not in store and not (tmp_path / "client_1.pt").exists()
    store.delete(2)
    assert 2 not in store and store.resident_bytes == 0 and len(store) == 0
    store.delete(3)  # never stored: nothing to do
    assert len(store) == 0
