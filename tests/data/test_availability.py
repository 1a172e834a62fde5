"""Availability traces (`availability: <csv>`): the two forms, what they mean for sampling, and
one-line refusals naming the file and the line."""

from __future__ import annotations

import pytest

from fedexp.data.availability import read_availability
from fedexp.engine.participation import Participation
from fedexp.errors import ConfigError

LONG = """client_id,round,available
0,1,1
1,1,1
2,1,0
3,1,1
1,2,1
3,3,1
"""
MATRIX = """client_id,1,2,3
0,1,0,0
1,1,1,0
2,0,0,0
3,1,0,1
"""


def write(tmp_path, text: str, name: str = "trace.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_long_and_the_matrix_forms_say_the_same(tmp_path):
    long = read_availability(write(tmp_path, LONG, "long.csv"), 6)
    matrix = read_availability(write(tmp_path, MATRIX, "matrix.csv"), 6)
    assert long.rounds == matrix.rounds == ((0, 1, 3), (1,), (3,))
    # the trace repeats: round 4 reads round 1, round 6 round 3
    assert long.available(4) == (0, 1, 3) and long.available(6) == (3,)


def test_only_available_clients_are_sampled(tmp_path):
    trace = read_availability(write(tmp_path, LONG), 6)
    run = Participation(0, 6, 2, trace=trace)
    for t in range(1, 31):
        cohort = run.cohort(t)
        assert set(cohort.sampled) <= set(trace.available(t))
        # fewer available than clients_per_round: all of them
        assert len(cohort.sampled) == min(2, len(trace.available(t)))
        assert cohort.metrics()["clients/available"] == len(trace.available(t))
    # clients 2, 4 and 5 are never available
    assert not {c for t in range(1, 31) for c in run.cohort(t).sampled} & {2, 4, 5}


def test_a_trace_with_every_client_available_draws_what_a_run_without_one_draws(tmp_path):
    rows = "".join(f"{c},1,1\n" for c in range(20))
    trace = read_availability(write(tmp_path, "client_id,round,available\n" + rows), 20)
    with_trace, without = Participation(3, 20, 10, trace=trace), Participation(3, 20, 10)
    assert all(with_trace.cohort(t).sampled == without.cohort(t).sampled for t in range(1, 11))


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        ("client_id,round,available\n0,1,1\n1,x,1\n", "line 3", "round must be an integer"),
        ("client_id,round,available\n0,1,2\n", "line 2", "available must be 0 or 1"),
        ("client_id,round,available\n0,1,1\n9,1,1\n", "line 3", "client_id 9 is outside [0, 6)"),
        ("client_id,round,available\n0,0,1\n", "line 2", "round must be >= 1"),
        ("client_id,round,available\n0,1,1\n\n0,1,0\n", "line 4", "given twice"),
        ("client_id,round,available\n0,1\n", "line 2", "expected 3 fields"),
        ("client,round,up\n0,1,1\n", "line 1", "header must be"),
        ("client_id,1,3\n0,1,1\n", "line 1", "column 3 must be round 2"),
        ("client_id,1,2\n0,1,1\n0,0,1\n", "line 3", "client 0 is given twice"),
        ("client_id,1,2\n0,1\n", "line 2", "expected 3 fields"),
    ],
)
def test_a_malformed_trace_is_one_line_naming_the_file_and_line(tmp_path, text, where, says):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        read_availability(path, 6)
    message = str(err.value)
    assert message.startswith(f"availability: {path} {where}: ") and says in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "says"),
    [("", "the file is empty"), ("client_id,1,2\n0,0,0\n", "no client is ever available")],
)
def test_an_empty_trace_is_refused(tmp_path, text, says):
    with pytest.raises(ConfigError, match=says):
        read_availability(write(tmp_path, text), 6)


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^availability: .*nope.csv: no such file$"):
        read_availability(tmp_path / "nope.csv", 6)
