"""The Ansible playbook's Slurm templates (``ansible/roles/slurm/templates``) rendered without
Ansible: the tests' Slurm is configured from them, so what the tests run is what the playbook
installs, and the book can show what a cluster's files would read.

The templates use core Jinja2 only (no Ansible filters, lookups or facts) and are rendered here
as Ansible's template module renders them: trim_blocks on, lstrip_blocks off, the last newline
kept. StrictUndefined: a variable the role adds and a caller does not give fails at once
instead of rendering as an empty string.
"""

from __future__ import annotations

from pathlib import Path

import jinja2
import jinja2.meta

from ..core.paths import repo_path

SLURM_FILES = ("slurm.conf", "gres.conf", "cgroup.conf")


def templates() -> Path:
    """The slurm role's templates folder in the guide's repository."""
    return repo_path("ansible", "roles", "slurm", "templates")


def environment() -> jinja2.Environment:
    """Jinja2 set up as Ansible's template module sets it up."""
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates())), trim_blocks=True,
                              lstrip_blocks=False, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)


def render(name: str, values: dict) -> str:
    """``name`` (one of SLURM_FILES) rendered with the role's variables ``values``."""
    return environment().get_template(f"{name}.j2").render(**values)


def template_variables() -> set[str]:
    """Every variable the Slurm templates read (the role's defaults must define each one)."""
    env = environment()
    names: set[str] = set()
    for name in SLURM_FILES:
        source = (templates() / f"{name}.j2").read_text()
        names |= jinja2.meta.find_undeclared_variables(env.parse(source))
    return names
