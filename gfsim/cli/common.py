"""What every command shares: turning input errors into one line and exit code 2."""

from __future__ import annotations

import functools
import re
import sys
import warnings
from typing import Any, Callable

import typer
import typer.core

from gfsim.core.errors import GfsimError

__all__ = ["handles_errors", "print_json", "console", "esc", "one_line", "search_config",
           "puct_children", "resolve_children", "SIMULATE_HELP", "CONTEXT", "GfsimCommand",
           "Table"]

# Every command: -h as well as --help.
CONTEXT = {"help_option_names": ["-h", "--help"]}


class GfsimCommand(typer.core.TyperCommand):
    """A command whose options show a metavar a user can read (``--seed N``, ``--log LOG``,
    ``--plot PATH``) where none is given, instead of a Python type (``<str>``,
    ``<list[str]>``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for p in self.params:  # click's classes, or the copy of click newer typers carry
            if getattr(p, "param_type_name", None) == "argument":
                # RUN_DIR in the usage line (REQUIRED as click writes it, not {run_dir})
                p.metavar = p.metavar or p.name.upper()
                shown = p.metavar + ("..." if p.nargs != 1 else "")
                p.display_type_rich = lambda ctx: ""
                p._usage_display_name = (lambda _s=shown: _s) if p.required else \
                    (lambda _s=shown: f"[{_s}]")
                continue
            if getattr(p, "param_type_name", None) != "option" or p.is_flag or p.count:
                continue
            if not p.metavar:
                p.metavar = _metavar(p)
            # typer >= 0.25 shows the type, never the metavar: show the metavar
            p.display_type_rich = lambda ctx, _m=p.metavar: _m


def _metavar(p) -> str:
    """NAME for text (the option's long name), N, NUMBER, PATH, or [A|B] for choices."""
    desc = getattr(p, "type_descriptor", None)  # typer >= 0.25: no click type
    if desc is not None:
        if desc.is_choice and desc.choices is not None:
            return "[" + "|".join(str(getattr(c, "value", c)) for c in desc.choices) + "]"
        kind = "Path" if desc.is_path else getattr(desc.annotation, "__name__", "")
        kind = {"int": "IntParamType", "float": "FloatParamType"}.get(kind, kind)
    else:
        kind = type(p.type).__name__
        if kind == "Choice":
            return "[" + "|".join(str(c) for c in p.type.choices) + "]"
    if kind in ("IntParamType", "IntRange"):
        return "N"
    if kind in ("FloatParamType", "FloatRange"):
        return "NUMBER"
    if kind in ("Path", "File"):
        return "PATH"
    return max(p.opts, key=len).lstrip("-").upper().replace("-", "_")


def Table(*headers, **kwargs):  # noqa: N802 - stands in for rich's class
    """A rich table whose columns fold what does not fit (a log's name, a path) onto the next
    line instead of cutting it with an ellipsis."""
    from rich.table import Table as RichTable

    class _Folding(RichTable):
        def add_column(self, *args, overflow="fold", **kw):
            super().add_column(*args, overflow=overflow, **kw)

    return _Folding(*headers, **kwargs)

EXIT_INPUT_ERROR = 2


def console():
    from rich.console import Console

    return Console()


# Characters a terminal acts on rather than shows: C0 and C1 controls and DEL (an escape
# sequence can set the window title, clear the screen or rewrite what was printed) and the
# bidirectional overrides and isolates (which reorder what is shown).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape_control(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _printable(text: str) -> str:
    """``text`` as it may reach a terminal: what UTF-8 cannot carry (a lone surrogate, as from
    an undecodable byte of a path) and every control character written as an escape (a log
    or a user's file decides these strings, not gfsim)."""
    return _CONTROLS.sub(_escape_control, text.encode("utf-8", "backslashreplace")
                         .decode("utf-8"))


def one_line(message: str, limit: int = 2000) -> str:
    """An error message as one printable line of at most about ``limit`` characters: line
    breaks written as ``\\n``, characters UTF-8 cannot carry escaped, and the middle of a long
    message (a 100,000-character name quoted in it, say) cut."""
    text = _printable(message.replace("\r", "\\r").replace("\n", "\\n"))
    if len(text) > limit:
        cut = len(text) - limit
        text = f"{text[:limit * 3 // 4]} ... ({cut:,} characters cut) ... {text[-limit // 4:]}"
    return text


def esc(value: Any, limit: int = 200) -> str:
    """A user's or a log's string, ready for rich output: cut to ``limit`` characters, rich
    markup escaped (a name such as ``[/b]`` is printed, not parsed) and any character that
    UTF-8 cannot carry (an undecodable byte of a path) written as an escape."""
    from rich.markup import escape

    text = str(value)
    if len(text) > limit:
        text = text[: limit - 1] + "\u2026"
    return escape(_printable(text))


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"gfsim: warning: {message}", file=sys.stderr)


def handles_errors(fn: Callable) -> Callable:
    """Run a command; a ``GfsimError`` (bad file, spec, option) exits 2 with one line."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        warnings.showwarning = _show_warning
        try:
            return fn(*args, **kwargs)
        except GfsimError as exc:
            print(f"gfsim: error: {one_line(str(exc))}", file=sys.stderr)
            raise typer.Exit(EXIT_INPUT_ERROR) from None

    return wrapper


def _default(o: Any):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def json_bytes(obj: Any) -> bytes:
    """Indented JSON by msgspec's encoder (a 10 MB document in tens of milliseconds; the
    standard library takes seconds). NaN and infinities, which JSON has not, come out null."""
    import msgspec

    return msgspec.json.format(msgspec.json.encode(obj, enc_hook=_default), indent=2)


def print_json(obj: Any) -> None:
    data = json_bytes(obj) + b"\n"
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # a text-only stream
        sys.stdout.write(data.decode())
        return
    sys.stdout.flush()
    buffer.write(data)
    buffer.flush()


CHILDREN_HELP = ("puct: where children the log never held come from: auto (the default: model "
                 "under the puct driver, where the counterfactual benchmark finds the world "
                 "model's replays better calibrated than the fallback's in every world), "
                 "fallback (logged children "
                 "of other parents in the node's speedup bin, rescaled), model (a world model "
                 "fitted to the log: model:crb, a conditional residual bootstrap, the default; "
                 "model:gbm, gradient-boosted quantile trees), fresh (the world model "
                 "invents every child, the logged ones too: each seed a new search like the "
                 "logged one; fresh:crb, fresh:gbm) or own (none: only the logged children).")


SIMULATE_HELP = ("puct: simulate PUCT even on a log whose search it does not reproduce and "
                 "whose evidence is too thin to invent children from (refused otherwise; the "
                 "result is labelled simulated either way).")


def resolve_children(driver: str, children: str) -> str:
    """--children's value with ``auto`` resolved: the world model under the puct driver,
    else ``fallback`` (the trace driver draws no children)."""
    if children == "auto":
        return "model" if driver == "puct" else "fallback"
    return children


def puct_children(driver: str, children: str, simulate: bool = False) -> dict:
    """The replay keywords for --children and --simulate: checked, and only for the puct
    driver."""
    from gfsim.core.errors import GfsimError
    from gfsim.simulator.world_model import check_children

    children = resolve_children(driver, children)
    check_children(children)
    if driver != "puct":
        if children != "fallback" or simulate:
            flag = "--children" if children != "fallback" else "--simulate"
            raise GfsimError(f"{flag}: only the puct driver draws children; the trace "
                             "driver replays the logged order")
        return {}
    return {"children": children, "simulate": simulate}


def learning_spec(forecaster: str | None):
    """The cost model's spec where --forecaster names one: the replay lets it learn only from
    what the replayed search measured (``replay_many``'s ``learning``); else None."""
    from gfsim.forecasts.costmodel import is_costmodel, parse_costmodel

    return parse_costmodel(forecaster) if is_costmodel(forecaster) else None


def search_config(driver: str, preset: str | None, log=None, **knobs):
    """The puct search shape from --search and the knobs; an error if given to the trace
    driver, where they mean nothing. Without --search, each search of the log in its own shape
    (recorded by its run, else inferred from its candidates: ``simulator.shape``) with the
    knobs given in place of its own; with no ``log`` (a new, live search), paper-standard."""
    from gfsim.core.errors import GfsimError
    from gfsim.simulator.puct_engine import SEARCH_PRESETS, replace_config
    from gfsim.simulator.shape import OwnShape

    given = {k: v for k, v in knobs.items() if v is not None}
    if driver != "puct":
        if preset is not None or given:
            flags = ", ".join(["--search"] * (preset is not None)
                              + [f"--{k.replace('_', '-')}" for k in given])
            raise GfsimError(f"{flags}: only with --driver puct")
        return None
    if preset is None and log is not None:
        return OwnShape(**given)
    preset = preset or "paper-standard"
    if preset not in SEARCH_PRESETS:
        raise GfsimError(f"--search: unknown preset {preset!r}; valid: "
                         f"{', '.join(SEARCH_PRESETS)}")
    return replace_config(SEARCH_PRESETS[preset], **given)
