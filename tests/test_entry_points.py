"""Every door a reader types: each console script of pyproject.toml and each
``python -m guide_utils`` subcommand loads and answers ``--help``."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import pytest

from guide_utils.__main__ import commands, main

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_console_script_loads_and_helps(name, capsys):
    module, func = SCRIPTS[name].split(":")
    entry = getattr(importlib.import_module(module), func)
    with pytest.raises(SystemExit) as stop:
        entry(["--help"])
    assert stop.value.code == 0 and "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(commands()))  # the studies' among them (studies.registry)
def test_subcommand_helps(name, capsys):
    with pytest.raises(SystemExit) as stop:
        main([name, "--help"])
    assert stop.value.code == 0 and "usage:" in capsys.readouterr().out


def test_an_unknown_subcommand_is_one_line(capsys):
    assert main(["no-such-command"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'no-such-command'" in err and len(err.strip().splitlines()) == 1
