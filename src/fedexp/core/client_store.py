"""Per-client state that stays on a client across rounds (FedRep heads, personal models, ...)."""

from __future__ import annotations

from typing import Any


class ClientStore:
    """A mapping client id -> opaque state; the round loop never looks inside."""

    def __init__(self) -> None:
        self._state: dict[int, Any] = {}

    def get(self, client_id: int, default: Any = None) -> Any:
        return self._state.get(client_id, default)

    def put(self, client_id: int, state: Any) -> None:
        self._state[client_id] = state

    def __contains__(self, client_id: int) -> bool:
        return client_id in self._state

    def __len__(self) -> int:
        return len(self._state)

    def state_dict(self) -> dict[int, Any]:
        return dict(self._state)

    def load_state_dict(self, state: dict[int, Any]) -> None:
        self._state = dict(state)
