"""Library errors speak in parameters, the CLI in flags (gfsim.core.errors): a message names a
parameter in backticks, as gfsim.api's keyword, and each command renders it as its flag."""

from __future__ import annotations

import io
import re
import sys
import tokenize
from pathlib import Path

import pytest

from gfsim.core.errors import GfsimError, as_flags

ROOT = Path(__file__).resolve().parents[1]
LINKED = ("simulator", "policies", "cost_models", "replay_logs")  # gfsim/ shows them
LIBRARY = [p for p in ROOT.glob("gfsim/**/*.py")
           if p.relative_to(ROOT).parts[1] not in ("cli", *LINKED)]
LIBRARY += [p for folder in LINKED for p in ROOT.glob(f"{folder}/**/*.py")]


def _flags() -> set[str]:
    """Every long flag of every gfsim command, without its dashes."""
    from typer.main import get_command

    from gfsim.cli.common import command_flags
    from gfsim.cli.import_cmd import app as import_app
    from gfsim.cli.main import COMMANDS

    fns = [fn for _, fn, _ in COMMANDS] + [c.callback for c in import_app.registered_commands]
    get_command(import_app)  # (the sub-app builds)
    return {flag[2:] for fn in fns for flag in command_flags(fn).values()}


def _messages(path: Path):
    """(line, text) of the string literals inside raise statements and error constructors."""
    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    in_raise, depth = False, []
    for k, t in enumerate(tokens):
        if t.type == tokenize.NAME and t.string == "raise":
            in_raise = True
        elif t.type == tokenize.NEWLINE:
            in_raise = False
        if t.type == tokenize.NAME and t.string.endswith("Error") and k + 1 < len(tokens) \
                and tokens[k + 1].string == "(":
            depth.append(0)
        elif t.type == tokenize.OP and t.string == "(" and depth:
            depth[-1] += 1
        elif t.type == tokenize.OP and t.string == ")" and depth:
            depth[-1] -= 1
            if depth[-1] == 0:
                depth.pop()
        if t.type == tokenize.STRING and (in_raise or depth):
            yield t.start[0], t.string


def test_no_library_error_names_a_command_line_flag():
    flags = _flags()
    assert {"forecaster", "parents-per-step", "search", "json"} <= flags
    found = []
    assert len(LIBRARY) > 150
    for path in LIBRARY:
        for line, text in _messages(path):
            for name in re.findall(r"(?<![\w-])--([a-z][a-z0-9-]*)", text):
                if name in flags:
                    found.append(f"{path.relative_to(ROOT)}:{line}: --{name}")
    assert not found, "name the parameter in backticks instead:\n" + "\n".join(found)


def test_the_library_says_the_parameter_and_the_command_the_flag(capsys):
    import gfsim
    from gfsim.cli.main import app
    from typer.testing import CliRunner

    with pytest.raises(GfsimError) as err:
        gfsim.compare(None, "all", steps=3, parents_per_step=2)
    assert str(err.value).startswith("`steps`, `parents_per_step`: only with `driver` puct")
    res = CliRunner().invoke(app, ["replay", "--steps", "3", "--parents-per-step", "2"])
    assert res.exit_code == 2
    assert "--steps, --parents-per-step: only with --driver puct" in res.output
    assert "`" not in res.output
    # A parameter whose flag is named otherwise (gfsim live's preset is --search).
    from gfsim.cli.common import command_flags
    from gfsim.cli.live_cmd import live

    flags = command_flags(live)
    assert flags["preset"] == "--search" and flags["search"] == "--search"
    assert as_flags("`preset` and `search`: `x_y`", flags) == "--search and --search: --x-y"


def test_the_library_message_is_unchanged_where_nothing_is_backticked():
    assert as_flags("ray start --head, then `cluster` ray") == \
        "ray start --head, then --cluster ray"
    assert as_flags("see `gfsim logs` and ``code``") == "see `gfsim logs` and ``code``"
    assert sys.modules["gfsim.core.errors"].as_flags is as_flags
