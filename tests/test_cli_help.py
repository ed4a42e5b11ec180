"""`fp8bench --help`, each command's `--help` at 80 columns, and `fp8bench --version`."""

from __future__ import annotations

from importlib.metadata import version

import pytest
import typer
from typer.testing import CliRunner

from fp8bench.cli import app

GROUP = typer.main.get_command(app)


def _command_paths(group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command's path under `group`: a group is whatever has subcommands (click's Group, or the copy of
    click that newer typer releases carry inside them)."""
    paths = [prefix]
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            paths += _command_paths(command, (*prefix, name))
        else:
            paths.append((*prefix, name))
    return paths


@pytest.mark.parametrize("path", _command_paths(GROUP), ids=lambda path: " ".join(path) or "fp8bench")
def test_help_reads_whole_at_80_columns(path):
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, prog_name="fp8bench")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"Usage: fp8bench {' '.join(path)}".rstrip())
    too_wide = [line for line in lines if len(line) > 80]
    assert not too_wide, too_wide
    assert "…" not in result.output
    # a command list gives each command's first sentence whole, not cut with "..."
    assert not [line for line in lines if line.endswith("...") and not line.startswith("Usage:")]


def test_the_command_list_shows_each_commands_summary():
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"})
    text = " ".join(result.output.split())
    assert "--version print the version and exit" in text
    assert "roofline LayerNorm -> Linear -> sigmoid, fwd + bwd: predicted FP8 speedup per recipe and implementation" in text


def test_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"fp8bench {version('fp8bench')}\n"
