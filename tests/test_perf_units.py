"""Sizes, bandwidths and message-size sweeps: what the perf commands read and print."""

from __future__ import annotations

import pytest

from guide_utils.core.errors import GuideError
from guide_utils.perf import comms
from guide_utils.perf.units import parse_bandwidth, parse_bytes


@pytest.mark.parametrize("text, expected", [("100Gbit/s", 12.5e9), ("25GbE", 3.125e9), ("25 Gbps", 3.125e9),
                                            ("56 Gb/s", 7e9), ("12.5GB/s", 12.5e9), ("900 MB/s", 9e8),
                                            ("10 Mbit/s", 1.25e6)])
def test_bandwidth_units(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["10", "10G", "10 Gbit", "fast", "-1Gbit/s", "0 GB/s"])
def test_bandwidth_without_bits_or_bytes_per_second_is_refused(text):
    with pytest.raises(GuideError) as err:
        parse_bandwidth(text)
    assert "\n" not in str(err.value)


def test_byte_sizes():
    assert [parse_bytes(t) for t in ("4", "64K", "256M", "1GiB", "1.5GB")] == [4, 65536, 2**28, 2**30, 1_500_000_000]
    for bad in ("0", "-4", "lots", "4 parsecs"):
        with pytest.raises(GuideError):
            parse_bytes(bad)


def test_the_default_sweep_reaches_256_mib_from_4_bytes():
    s = comms.sizes()
    assert s[0] == 4 and s[-1] == 256 * 2**20 >= 256e6 and all(b == 4 * a for a, b in zip(s, s[1:]))


def test_bus_bandwidth_is_the_nccl_tests_correction():
    # 1 GB in 0.25 s is 4 GB/s of algorithm bandwidth; 2(n-1)/n is 1 for 2 ranks, 1.75 for 8
    assert comms.algbw(1e9, 0.25) == 4.0
    assert comms.busbw(4.0, 2) == 4.0 and comms.busbw(4.0, 8) == 7.0 and comms.busbw(4.0, 1) == 0.0
