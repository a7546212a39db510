"""The one reader of the numbers launchers and schedulers export.

Ranks, counts and ports are plain integers (``SLURM_PROCID=3``); job ids are not always:
PBS writes ``PBS_JOBID=1234.server`` (and ``1234[5].server`` for a subjob of an array), LSF
and Slurm show array jobs as ``1234[5]`` and ``1234_5``, a heterogeneous Slurm job as
``1234+0``. :func:`read_int` reads all of them, the job ids as the job's number; the array
index comes from the scheduler's own variable (``runtime.schedulers``). Anything else is one
:class:`~guide_utils.core.errors.GuideError` that names the variable and its value: a
launcher module never calls ``int()`` on the environment itself (a test checks).
"""

from __future__ import annotations

import re
from typing import Mapping

from ..core.errors import GuideError

# A job id: its number, then an array index (Slurm's _5, PBS's and LSF's [5] or PBS's array
# itself, []), a heterogeneous job's component (+0), a server or domain (.pbs01.example.org).
PLAIN = re.compile(r"[+-]?\d+")  # not int()'s own syntax: it reads Slurm's array id 1234_5 as 12345
JOB_ID = re.compile(r"(\d+)(?:_\d+|\[\d*\]|\+\d+)?(?:\.[A-Za-z][\w.-]*)?")


def parse_int(name: str, value: str) -> int:
    """``value`` of the variable ``name`` as an integer: a plain one, or a job id's number.

    >>> [parse_int("X", v) for v in ("3", "-1", "1234.pbs01", "1234[5].pbs01", "1234_5", "1234[5]", "77+1")]
    [3, -1, 1234, 1234, 1234, 1234, 77]
    >>> parse_int("SLURM_NTASKS", "many")
    Traceback (most recent call last):
    ...
    guide_utils.core.errors.GuideError: SLURM_NTASKS='many' is not an integer; is the job environment intact?
    """
    value = value.strip()
    if PLAIN.fullmatch(value):
        return int(value)
    match = JOB_ID.fullmatch(value)
    if match is None:
        raise GuideError(f"{name}={value!r} is not an integer; is the job environment intact?")
    return int(match.group(1))


def read_int(env: Mapping[str, str], *names: str) -> int | None:
    """The value of the first of ``names`` that is set (and not empty) in ``env``, as an
    integer (:func:`parse_int`); None when none is. The one parser of the ranks, counts and
    job ids launchers and schedulers export.

    >>> read_int({"RANK": "", "SLURM_PROCID": " 3"}, "RANK", "SLURM_PROCID")
    3
    >>> read_int({"PBS_JOBID": "4242.pbs01"}, "PBS_JOBID"), read_int({}, "LSB_JOBID")
    (4242, None)
    """
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return parse_int(name, value)
    return None
