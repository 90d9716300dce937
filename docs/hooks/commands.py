"""MkDocs hook: a page's ``<!-- gfsim-command: NAME -->`` becomes that command's reference (usage,
arguments and options with their types, defaults and help), read from the Typer app itself, so
that the command pages never drift from the commands. (Typer keeps its own copy of Click, which
mkdocs-click does not read; this is the few lines it would take.)"""

from __future__ import annotations

import re

MARKER = re.compile(r"<!-- gfsim-command: ([\w-]+(?: [\w-]+)?) -->")


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|").replace("[", "\\[")


def _command(path: str):
    import typer

    from gfsim.cli.main import app

    cmd = typer.main.get_command(app)
    for part in path.split():
        cmd = cmd.commands[part]
    return cmd


def _type(param, ctx) -> str:
    if getattr(param, "is_flag", False):
        return "flag"
    return _cell(param.display_type(ctx)).strip("<>")


def _default(param) -> str:
    if getattr(param, "is_flag", False) or param.required:
        return "required" if param.required else ""
    d = param.default
    if d is None or d == () or callable(d):
        return ""
    return f"`{_cell(d)}`"


def render(path: str) -> str:
    cmd = _command(path)
    ctx = cmd.make_context(f"gfsim {path}", [], resilient_parsing=True)
    # ("\b" is click's mark for a paragraph it must not rewrap: a help's URL line)
    lines = [" ".join((cmd.help or "").replace("\b", "").split()), "", "```text",
             " ".join(["gfsim", path, *(p.name.upper() for p in cmd.params
                                         if p.param_type_name == "argument"), "[OPTIONS]"]),
             "```", ""]
    if hasattr(cmd, "commands"):  # a group: its commands
        lines += ["| command | what it does |", "|---|---|"]
        lines += [f"| `gfsim {path} {n}` | {_cell(c.help or '').split('. ')[0]} |"
                  for n, c in sorted(cmd.commands.items())]
        for n in sorted(cmd.commands):
            lines += ["", f"## gfsim {path} {n}", "", render(f"{path} {n}")]
        return "\n".join(lines)
    args = [p for p in cmd.params if p.param_type_name == "argument"]
    opts = [p for p in cmd.params if p.param_type_name == "option" and not p.hidden]
    if args:
        lines += ["| argument | type | what it is |", "|---|---|---|"]
        lines += [f"| `{p.name.upper()}` | {_type(p, ctx)} | "
                  f"{_cell(getattr(p, 'help', '') or '')} |" for p in args]
        lines.append("")
    lines += ["| option | type | default | what it does |", "|---|---|---|---|"]
    lines += [f"| `{', '.join(p.opts)}` | {_type(p, ctx)} | {_default(p)} | {_cell(p.help or '')} |"
              for p in opts]
    return "\n".join(lines)


def on_page_markdown(markdown, page, config, files):
    return MARKER.sub(lambda m: render(m.group(1)), markdown)
