"""`malloc_keep`: large freed blocks reused instead of mapped and faulted in anew (glibc)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest
from tests.conftest import REPO

from fedexp.runtime import allocator

# a 64 MB block (16 384 pages of 4 KiB) allocated, written page by page and freed, 4 times;
# the page faults of the last 3 are counted (a process of its own: the setting is process-wide)
PROBE = """
import importlib.util, resource, sys
spec = importlib.util.spec_from_file_location("allocator", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
print(mod.keep_freed_blocks(sys.argv[2] == "1"))
size = 64 << 20
faults = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = bytearray(size)
    block[::4096] = bytes(size // 4096)
    del block
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sum(faults[1:]))
"""


def probe(keep: bool) -> tuple[str, int]:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBE,
            str(REPO / "src/fedexp/runtime/allocator.py"),
            str(int(keep)),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return out[0], int(out[1])


@pytest.mark.cli
@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="glibc's mallopt",
)
def test_kept_blocks_are_reused_where_the_default_maps_them_anew():
    said, faults = probe(keep=False)
    assert said == "the C library's defaults (malloc_keep: false)"
    assert faults >= 3 * 16384 * 0.9  # every 64 MB block mapped and faulted in again
    said, faults = probe(keep=True)
    assert said == "freed blocks up to 1 GiB kept for reuse (glibc mallopt)"
    assert faults < 1000  # the first block's pages, reused


def test_nothing_is_changed_when_off_or_not_glibc(monkeypatch):
    monkeypatch.setattr(allocator, "_kept", False)  # as in a fresh process
    assert allocator.keep_freed_blocks(False) == "the C library's defaults (malloc_keep: false)"
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("", ""))
    assert allocator.keep_freed_blocks(True) == "the C library's defaults (not glibc)"


def test_a_later_run_that_turns_it_off_is_told_it_stays_on(monkeypatch):
    monkeypatch.setattr(allocator, "_kept", True)
    said = allocator.keep_freed_blocks(False)
    assert said == "freed blocks kept for reuse, as an earlier run in this process set it"
