"""Client availability traces (`availability: <path>`): which clients can be sampled in which
round, read from a CSV file. The file is only parsed, never executed.

Two forms are accepted, told apart by their header line:

- long: `client_id,round,available` (those three names, in that order), one line per (client,
  round) with `available` 0 or 1; a (client, round) not listed is unavailable, so a file may
  list only the available pairs;
- matrix: `client_id,1,2,...,R` (the rounds 1..R in order), one line per client with a 0 or 1
  per round.

Client ids are 0-based (the run's client ids), rounds 1-based. The trace lasts R rounds (the
largest round of a long file, the columns of a matrix); round t of a longer run reads the
trace's round ((t - 1) mod R) + 1, as FedScale replays its traces. A client the file does not
name is never available. Blank lines are skipped. Anything else is a `ConfigError` naming the
file and the line: a field that is not an integer, an `available` other than 0/1, a client id
outside [0, num_clients), a round below 1, a (client, round) or a client given twice, a line
with the wrong number of fields, a file where no client is ever available.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from fedexp.errors import ConfigError

KEY = "availability"
LONG_HEADER = ("client_id", "round", "available")


@dataclass(frozen=True)
class Availability:
    """A parsed trace: `rounds[r]` is the sorted ids available in the trace's round r + 1."""

    path: str
    rounds: tuple[tuple[int, ...], ...]

    def available(self, round_idx: int) -> tuple[int, ...]:
        """The clients that may be sampled in round `round_idx` (1-based; the trace repeats)."""
        return self.rounds[(round_idx - 1) % len(self.rounds)]


def _fail(path, line: int, problem: str) -> ConfigError:
    return ConfigError(f"{KEY}: {path} line {line}: {problem}")


def _int(path, line: int, text: str, what: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise _fail(path, line, f"{what} must be an integer, got {text.strip()!r}") from None


def _flag(path, line: int, text: str) -> bool:
    value = text.strip()
    if value not in ("0", "1"):
        raise _fail(path, line, f"available must be 0 or 1, got {value!r}")
    return value == "1"


def _client(path, line: int, text: str, num_clients: int) -> int:
    cid = _int(path, line, text, "client_id")
    if not 0 <= cid < num_clients:
        raise _fail(path, line, f"client_id {cid} is outside [0, {num_clients}) (num_clients)")
    return cid


def _long(path, rows, num_clients: int) -> dict[int, set[int]]:
    seen: set[tuple[int, int]] = set()
    out: dict[int, set[int]] = {}
    for line, fields in rows:
        if len(fields) != 3:
            raise _fail(
                path, line, f"expected 3 fields (client_id,round,available), got {len(fields)}"
            )
        cid = _client(path, line, fields[0], num_clients)
        rnd = _int(path, line, fields[1], "round")
        if rnd < 1:
            raise _fail(path, line, f"round must be >= 1, got {rnd}")
        if (cid, rnd) in seen:
            raise _fail(path, line, f"client {cid} in round {rnd} is given twice")
        seen.add((cid, rnd))
        out.setdefault(rnd, set())
        if _flag(path, line, fields[2]):
            out[rnd].add(cid)
    return out


def _matrix(path, header: list[str], rows, num_clients: int) -> dict[int, set[int]]:
    for i, name in enumerate(header[1:], start=1):
        if name.strip() != str(i):
            raise _fail(path, 1, f"matrix header: column {i + 1} must be round {i}, got {name!r}")
    out: dict[int, set[int]] = {r: set() for r in range(1, len(header))}
    clients: set[int] = set()
    for line, fields in rows:
        if len(fields) != len(header):
            raise _fail(path, line, f"expected {len(header)} fields, got {len(fields)}")
        cid = _client(path, line, fields[0], num_clients)
        if cid in clients:
            raise _fail(path, line, f"client {cid} is given twice")
        clients.add(cid)
        for r, text in enumerate(fields[1:], start=1):
            if _flag(path, line, text):
                out[r].add(cid)
    return out


def read_availability(path: str | Path, num_clients: int) -> Availability:
    """The trace at `path` for a run of `num_clients` clients (module docstring)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"{KEY}: {path}: no such file")
    try:
        with file.open(newline="", encoding="utf-8") as f:
            lines = [(n, row) for n, row in enumerate(csv.reader(f), start=1) if row]
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise ConfigError(f"{KEY}: {path}: cannot read it as CSV ({err})") from None
    if not lines:
        raise ConfigError(f"{KEY}: {path}: the file is empty")
    header = [h.strip() for h in lines[0][1]]
    if tuple(header) == LONG_HEADER:
        by_round = _long(path, lines[1:], num_clients)
    elif header[0] == "client_id" and len(header) > 1:
        by_round = _matrix(path, header, lines[1:], num_clients)
    else:
        raise _fail(path, 1, "header must be client_id,round,available or client_id,1,2,...,R")
    if not any(by_round.values()):
        raise ConfigError(f"{KEY}: {path}: no client is ever available")
    last = max(by_round)
    rounds = tuple(tuple(sorted(by_round.get(r, ()))) for r in range(1, last + 1))
    return Availability(str(path), rounds)
