"""The command line's basics, as in the tools users like: ``--version``, ``-h``, ``python -m
gfsim``, shell completion, and help that reads at 80 columns with nothing cut (no ellipsis, no
Python type where a value goes, no line wider than the terminal)."""

import re
import subprocess
import sys

import pytest
import typer.main
from typer.testing import CliRunner

from gfsim import __version__
from gfsim.cli.main import app

runner = CliRunner()


def _commands():
    """Every command's words, groups included (``[]`` is gfsim itself)."""
    out = []

    def walk(cmd, words):
        out.append(words)
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*words, name])

    walk(typer.main.get_command(app), [])
    return out


COMMANDS = _commands()


def test_every_command_is_listed():
    names = {" ".join(c) for c in COMMANDS}
    assert {"replay", "tune", "savings", "counterfactual", "live", "import shinka",
            "import openevolve", "logs"} <= names


@pytest.mark.parametrize("words", COMMANDS, ids=lambda w: " ".join(w) or "gfsim")
def test_help_reads_at_80_columns_with_nothing_cut(words):
    res = runner.invoke(app, [*words, "-h"], terminal_width=80, env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    text = res.output
    assert text == runner.invoke(app, [*words, "--help"], terminal_width=80,
                                 env={"COLUMNS": "80"}).output
    assert "…" not in text
    wide = [ln for ln in text.splitlines() if len(ln) > 80]
    assert wide == [], wide
    # a value's metavar, never a Python type (`<str>`, `<list[str]>`, `<int range>`)
    assert not re.search(r"<(str|int|float|bool|path|list\[\w+\]|\w+ range)>", text), text
    # a command's one-line summary in a group's list is whole (click cuts it with "...")
    if getattr(typer.main.get_command(app), "commands", None) is not None:
        listed = text.partition("Commands:")[2]
        assert not re.search(r"\.\.\.\s*$", listed, re.M), listed


def test_no_help_text_holds_a_token_too_long_to_wrap():
    # textwrap splits a word wider than the help column (a key list such as
    # usd=..,seconds=..,joules=.. or a path) in the middle; help texts list keys in prose
    long = []

    def walk(cmd, words):
        for p in cmd.params:
            for tok in (getattr(p, "help", None) or "").split():
                if len(tok) > 40:
                    long.append((" ".join(words), p.name, tok))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*words, name])

    walk(typer.main.get_command(app), [])
    assert long == []


def test_version_from_the_flag_and_from_python_m(tmp_path):
    for flag in ("--version", "-V"):
        res = runner.invoke(app, [flag])
        assert res.exit_code == 0 and res.output.strip() == f"gfsim {__version__}"
    proc = subprocess.run([sys.executable, "-m", "gfsim", "--version"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"gfsim {__version__}"
    proc = subprocess.run([sys.executable, "-m", "gfsim", "replay", "-h"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and "--policy POLICY" in proc.stdout


def test_shell_completion_is_offered():
    res = runner.invoke(app, ["--help"], terminal_width=80)
    assert "--install-completion" in res.output and "--show-completion" in res.output


def test_logs_shows_every_shipped_name_whole_at_80_columns():
    from gfsim.replay_logs import DEFAULT_LOG, SHIPPED_LOGS

    res = runner.invoke(app, ["logs"], terminal_width=80, env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    for name in SHIPPED_LOGS:  # the name one types, alone at the start of its line
        assert any(ln.split("  ")[0] == name for ln in lines), name
    assert f"{DEFAULT_LOG}  (the default)" in lines
    assert "…" not in res.output and max(len(ln) for ln in lines) <= 80
