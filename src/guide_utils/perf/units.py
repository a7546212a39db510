"""Sizes and bandwidths as people write them, read strictly.

Networks are sold in bits per second (a "100 Gbit/s" InfiniBand EDR port, "25 GbE"),
benchmarks such as nccl-tests report bytes per second (GB/s): a factor of 8 that is easy to
lose. Everything here is stored in bytes and bytes per second; a unit that could mean
either is refused with one line instead of guessed.

>>> parse_bytes("256M"), parse_bytes("4KiB"), parse_bytes("1.5 GB")
(268435456, 4096, 1500000000)
>>> parse_bandwidth("100Gbit/s"), parse_bandwidth("12.5 GB/s"), parse_bandwidth("25 Gbps")
(12500000000.0, 12500000000.0, 3125000000.0)
"""

from __future__ import annotations

import re

from ..core.errors import GuideError

# Binary prefixes for K/M/G alone (what `--max-bytes 256M` means to most people on a cluster:
# nccl-tests' -e 256M is 256 MiB); "kB/MB/GB" are decimal, "KiB/MiB/GiB" binary.
_BYTES = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_bytes(text: str | int | float, what: str = "size") -> int:
    """``"256M"`` (MiB), ``"64KiB"``, ``"1.5GB"`` (decimal) or a plain number of bytes."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
        if not m or m.group(2).lower() not in _BYTES:
            raise GuideError(f"{what} {text!r} is not a size; write bytes as e.g. 4, 64K, 256M (MiB), 1GiB or 1.5GB")
        value = float(m.group(1)) * _BYTES[m.group(2).lower()]
    if value <= 0:
        raise GuideError(f"{what} must be positive, got {text!r}")
    return int(round(value))


def parse_bandwidth(text: str | float, what: str = "bandwidth") -> float:
    """Bytes per second from ``"100Gbit/s"``, ``"25Gbps"``, ``"25GbE"`` (bits) or ``"12.5GB/s"``
    (bytes). A bare number or ``"10G"`` is refused: bits or bytes must be said."""
    m = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+)\s*([kKmMgGtT]?)\s*([a-zA-Z/]+)\s*", str(text))
    unit = m.group(3) if m else ""
    if unit.lower() in ("bit/s", "bits/s") or unit in ("bps", "b/s", "bE", "be"):  # "be": 25GbE
        divisor = 8
    elif unit in ("B/s", "Bps") or unit.lower() in ("byte/s", "bytes/s"):
        divisor = 1
    else:
        raise GuideError(f"{what} {text!r} has no unit of bits or bytes per second; write bits as e.g. 100Gbit/s "
                         "or 25Gbps (how networks are sold), or bytes as 12.5GB/s (how nccl-tests reports)")
    number = float(m.group(1))
    if number <= 0:
        raise GuideError(f"{what} must be positive, got {text!r}")
    return number * _PREFIX[m.group(2).lower()] / divisor


def human_bytes(n: float) -> str:
    """``268435456`` -> ``'256 MiB'`` (binary units, as the sizes of the sweep are powers of two)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{int(n)} B"
