"""The session's machine report (tests/host_speed.py): what it reads from /proc/stat, and a
reference step that fails is reported, not raised (the report must never fail a session)."""

from __future__ import annotations

import os

import pytest

import host_speed


def test_busy_time_counts_user_nice_system_and_interrupts_not_idle_or_steal():
    hz = os.sysconf("SC_CLK_TCK")
    seconds = (100, 2, 30, 999, 7, 1, 1, 5, 0, 0)  # user nice system idle iowait irq softirq steal guest*
    busy, steal = host_speed.busy_seconds("cpu  " + " ".join(str(s * hz) for s in seconds))
    assert (busy, steal) == (134, 5)
    now, _ = host_speed.busy_seconds()  # this machine's own line parses
    assert now > 0
    with pytest.raises(ValueError, match="not /proc/stat's first line"):
        host_speed.busy_seconds("cpu0 1 2 3 4 5 6 7 8")


def test_a_reference_step_that_fails_is_reported_not_raised(monkeypatch):
    monkeypatch.setattr(host_speed, "_STEP", "import sys; sys.exit('no torch here')")
    assert host_speed.step_ms() == "not measured (exit 1: no torch here)"
    monkeypatch.setattr(host_speed, "_STEP", "import time; time.sleep(5)")
    assert host_speed.step_ms(timeout=0.5) == "not measured (TimeoutExpired)"


def test_memory_in_use_is_total_less_available_and_oom_kills_are_read():
    meminfo = "MemTotal:       4194304 kB\nMemFree:   100 kB\nMemAvailable:   1048576 kB\nHugePages_Total:       0\n"
    assert host_speed.memory_in_use(meminfo) == (3.0, 4.0)
    used, total = host_speed.memory_in_use()  # this machine's own file parses
    assert 0 < used < total
    with pytest.raises(ValueError, match="MemAvailable"):
        host_speed.memory_in_use("MemTotal: 10 kB\n")
    assert host_speed.oom_kills("pgfault 12\noom_kill 3\nnr_dirty 0\n") == 3
    assert host_speed.oom_kills() >= 0
    with pytest.raises(ValueError, match="no oom_kill line"):
        host_speed.oom_kills("pgfault 12\n")


def test_the_kernels_oom_lines_are_a_list_even_where_the_log_cannot_be_read(monkeypatch):
    lines = host_speed.oom_lines()
    assert isinstance(lines, list) and all("Killed process" in line for line in lines)
    monkeypatch.setenv("PATH", "/nonexistent")  # no dmesg at all
    assert host_speed.oom_lines() == []
