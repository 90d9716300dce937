"""What every command shares: input errors as one line and exit code 2, help that reads at 80
columns (``GfsimCommand``), the settings file (``--config``, ``load_config``), the record of how
a ``--json`` result was made (``effective_settings``), and printing."""

from __future__ import annotations

import contextvars
import functools
import re
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
import typer.core

from gfsim.api.options import parse_capacities, search_config
from gfsim.core.errors import GfsimError
from gfsim.core.executor import CLUSTER_HELP

__all__ = ["handles_errors", "print_json", "json_parts", "console", "esc", "one_line",
           "search_config",
           "SIMULATE_HELP", "CONTEXT", "GfsimCommand",
           "Table", "parse_capacities", "CONFIG_HELP", "load_config", "effective_settings",
           "current_settings", "command_flags", "LogOption", "ForecasterOption", "CostOption",
           "BudgetOption", "SeedOption", "ChildrenOption", "SimulateFlag", "ConfigOption",
           "JsonFlag", "ClusterOption"]

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

    def invoke(self, ctx):
        # print_json adds how the result was made (effective_settings) to what it prints
        token = _RUNNING.set(ctx)
        try:
            return super().invoke(ctx)
        finally:
            _RUNNING.reset(token)


_RUNNING: "contextvars.ContextVar" = contextvars.ContextVar("gfsim_command", default=None)


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
    return _folding_table()(*headers, **kwargs)


@functools.cache
def _folding_table():
    """The folding table class, made once (rich is imported only when a table is printed)."""
    from rich.table import Table as RichTable

    class FoldingTable(RichTable):
        """Every cell, header and title is shown with control characters escaped (a task id
        of a log is the log's, not gfsim's: ESC, OSC, C1, NUL or a bidi override in it would
        act on the terminal); markup in a log's strings is escaped where they are put in
        (``esc``)."""

        def __init__(self, *headers, **kw):
            for key in ("title", "caption"):
                if isinstance(kw.get(key), str):
                    kw[key] = _printable(kw[key])
            super().__init__(*(_printable(h) if isinstance(h, str) else h for h in headers),
                             **kw)

        def add_column(self, header="", *args, overflow="fold", **kw):
            super().add_column(_printable(header) if isinstance(header, str) else header,
                               *args, overflow=overflow, **kw)

        def add_row(self, *cells, **kw):
            super().add_row(*(_printable(c) if isinstance(c, str) else c for c in cells), **kw)

    return FoldingTable

EXIT_INPUT_ERROR = 2


def console(**kwargs):
    """The console commands print to (rich's, ``kwargs`` its settings): every character a
    terminal acts on that reaches it in text, not in rich's own styling, is shown escaped,
    whichever string of a log's it came in (see ``_CONTROLS``)."""
    return _safe_console()(**kwargs)


@functools.cache
def _safe_console():
    from rich.console import Console

    class SafeConsole(Console):
        def _render_buffer(self, buffer):
            # the text of each segment (line breaks are rich's own), never its styles or
            # cursor controls
            return super()._render_buffer(
                seg if seg.control or not _CONTROLS.search(seg.text)
                else seg._replace(text="\n".join(_printable(part)
                                                  for part in seg.text.split("\n")))
                for seg in buffer)

    return SafeConsole


# Characters a terminal acts on rather than shows: C0 and C1 controls and DEL (an escape
# sequence can set the window title, clear the screen or rewrite what was printed) and the
# bidirectional overrides and isolates (which reorder what is shown).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                       "\u2066-\u2069]")
# Those that JSON text may carry raw (msgspec escapes C0, not DEL, C1, the bidi marks or the
# line separators): only ever inside a string, where ``\\uXXXX`` reads back the same
_JSON_CONTROLS = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                            "\u2066-\u2069]")


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
    from gfsim.core.errors import as_flags

    # (a log's words; parameters named as flags, as errors are)
    print(f"gfsim: warning: {one_line(as_flags(str(message)))}", file=sys.stderr)


def command_flags(fn: Callable) -> dict[str, str]:
    """A command's parameters -> the long flag that sets each (``preset`` -> ``--search``),
    and each flag's own name -> it (``search`` -> ``--search``), read off its signature."""
    import inspect
    from typing import get_args, get_origin

    out: dict[str, str] = {}
    for name, param in inspect.signature(fn).parameters.items():
        infos = [param.default]
        if get_origin(param.annotation) is Annotated:
            infos += list(get_args(param.annotation)[1:])
        for info in infos:
            decls = [d for d in (getattr(info, "param_decls", None) or ())
                     if isinstance(d, str) and d.startswith("--")]
            if decls:
                out[name] = decls[0]
                for d in decls:
                    out.setdefault(d[2:].replace("-", "_"), d)
                break
    return out


def handles_errors(fn: Callable) -> Callable:
    """Run a command; a ``GfsimError`` (bad file, spec, option) exits 2 with one line, its
    parameters named as this command's flags (``gfsim.core.errors.as_flags``)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        warnings.showwarning = _show_warning
        try:
            return fn(*args, **kwargs)
        except GfsimError as exc:
            from gfsim.core.errors import as_flags

            message = as_flags(str(exc), command_flags(fn))
            print(f"gfsim: error: {one_line(message)}", file=sys.stderr)
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
    from collections.abc import Mapping, Sequence

    if isinstance(o, Mapping):  # a replay's lazy per-search parts (simulator.search_columns)
        return dict(o)
    if isinstance(o, Sequence):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def json_bytes(obj: Any) -> bytes:
    """Indented JSON by msgspec's encoder (a 10 MB document in tens of milliseconds; the
    standard library takes seconds). NaN and infinities, which JSON has not, come out null;
    control and bidi characters come out as ``\\uXXXX`` escapes (a log's strings reach a
    terminal through ``--json`` too)."""
    import msgspec

    data = msgspec.json.format(msgspec.json.encode(obj, enc_hook=_default), indent=2)
    if data.isascii():
        return data
    text = _JSON_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", data.decode("utf-8"))
    return text.encode("utf-8")


def print_json(obj: Any) -> None:
    """``obj`` as JSON on stdout; an object printed by a command gets ``settings``, how it was
    made (``effective_settings``), unless it has its own."""
    ctx = _RUNNING.get()
    if ctx is not None and isinstance(obj, dict) and "settings" not in obj:
        obj = {**obj, "settings": effective_settings(ctx)}
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # a text-only stream
        sys.stdout.write(b"".join(json_parts(obj)).decode() + "\n")
        return
    from gfsim.core.memory import no_cyclic_gc

    sys.stdout.flush()
    with no_cyclic_gc():  # the parts made are acyclic: no collection walks the heap meanwhile
        for part in json_parts(obj):  # (no copy of the whole document, nor for its newline)
            buffer.write(part)
    buffer.write(b"\n")
    buffer.flush()


_STREAM_TOKEN = "gfsim-json-part-7f3c9a"  # stands in for a streamed value while the rest is made


def json_parts(obj: Any):
    """``json_bytes(obj)``, to the byte, in pieces: a value of one of ``obj``'s dicts (at any
    depth through dicts) that offers ``json_chunks()`` (a list or dict of many searches,
    ``simulator.search_columns``) is encoded a chunk at a time as it is written, so the
    document is never whole in memory."""
    streamed: list = []

    def swap(o):
        if isinstance(o, dict):
            return {k: swap(v) for k, v in o.items()}
        if hasattr(o, "json_chunks"):
            streamed.append(o)
            return f"{_STREAM_TOKEN}-{len(streamed) - 1}"
        return o

    data = json_bytes(swap(obj))
    at = 0
    for k, value in enumerate(streamed):
        token = f'"{_STREAM_TOKEN}-{k}"'.encode()
        where = data.index(token, at)
        line = data[data.rfind(b"\n", 0, where) + 1:where]  # '  "key": ' before the value
        indent = len(line) - len(line.lstrip(b" "))
        yield data[at:where]
        yield from _streamed_value(value, indent)
        at = where + len(token)
    yield data[at:]


def _streamed_value(value, indent: int):
    """A list or dict, chunk by chunk, as ``json_bytes`` formats it ``indent`` spaces in."""
    from collections.abc import Mapping

    pad = b" " * indent
    opening, closing = (b"{", b"}") if isinstance(value, Mapping) else (b"[", b"]")
    first = True
    for chunk in value.json_chunks():
        if not chunk:
            continue
        body = json_bytes(chunk)[2:-2]  # its items, two spaces in: "[\n" ... "\n]" off
        yield opening + b"\n" if first else b",\n"
        yield pad + body.replace(b"\n", b"\n" + pad) if indent else body
        first = False
    yield opening + closing if first else b"\n" + pad + closing


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


# -- one settings file ------------------------------------------------------------------------
# --cluster, declared once for every command that fans its work out (gfsim.core.executor).
ClusterOption = Annotated[Optional[str], typer.Option("--cluster", help=CLUSTER_HELP,
                                                      metavar="ray|ray://HOST:PORT")]


# --json, declared once for the commands whose JSON is their whole output as one object.
JsonFlag = Annotated[bool, typer.Option("--json", help="Print the output as one JSON object.",
                                        metavar="")]


def print_ran_on(con, out: dict) -> None:
    """Where a command's work ran (its JSON's ``ran_on``), where that was a Ray cluster:
    local processes are the default and go unsaid."""
    where = out.get("ran_on") or {}
    if where.get("executor") == "ray":
        con.print(f"ran on the Ray cluster at {where['address']}: {where['nodes']} nodes, "
                  f"{where['workers']} CPUs", markup=False, highlight=False)

CONFIG_HELP = ("A TOML file of this command's options (names as on the command line, without "
               "the dashes: policy = \"threshold:0.7\", seeds = 4, budget = {usd = 2}); a "
               "[COMMAND] table applies to that command only. Options given on the command "
               "line win.")


def load_config(ctx, param, value):
    """``--config``'s callback: the file's options become the command's defaults
    (``ctx.default_map``), so the command line wins; an unknown name, or a value of the wrong
    kind, is one line naming the file and the key."""
    if value is None:
        return None
    from pathlib import Path

    from gfsim.core.inputs import InputError
    from gfsim.core.settings_file import read_settings

    path = Path(value)
    try:  # within a log's limits: a regular file, bounded size, nesting and keys
        data = read_settings(path)
    except InputError as exc:
        raise typer.BadParameter(one_line(str(exc)), ctx=ctx, param=param) from None
    name = ctx.info_name
    options = {}  # the file's names: the command line's long names without the dashes
    for p in ctx.command.params:
        if getattr(p, "param_type_name", None) == "option" and p.name != "config" \
                and p.expose_value:
            for opt in p.opts:
                if opt.startswith("--"):
                    options[opt[2:].replace("-", "_")] = p
    commands = set(getattr(ctx.find_root().command, "commands", {})) | {"import"}
    settings = {k: v for k, v in data.items() if not (isinstance(v, dict) and k in commands)}
    section = data.get(name) if isinstance(data.get(name), dict) else {}
    defaults = {}
    for where, table in ((None, settings), (name, section)):
        for key, v in table.items():
            field = key.replace("-", "_")
            at = f"{path}: " + (f"[{where}] " if where else "") + f"key '{_printable(key)}'"
            if field not in options:
                if where is None and field in _shared_names(ctx):
                    continue  # another command's option, in a file several commands read
                valid = ", ".join(sorted({o.replace("_", "-") for o in options}))
                raise typer.BadParameter(f"{at}: not an option of gfsim {name}; valid: {valid}",
                                         ctx=ctx, param=param)
            defaults[options[field].name] = _config_value(v, options[field], at, ctx, param)
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return str(path)


def _shared_names(ctx) -> set[str]:
    """The long option names (dashes as underscores) of every command that reads --config."""
    names: set[str] = set()
    for cmd in getattr(ctx.find_root().command, "commands", {}).values():
        params = getattr(cmd, "params", [])
        if any(p.name == "config" for p in params):
            names |= {o[2:].replace("-", "_") for p in params for o in getattr(p, "opts", [])
                      if o.startswith("--")}
    return names


def _config_value(v, option, at: str, ctx, param):
    """A TOML value as the option takes it: a table of keys (budget = {usd = 2}) as the
    KEY=VALUE list the command line writes, a list for a repeatable option, else the value."""
    def scalar(x):
        if isinstance(x, bool):
            return str(x).lower()
        if isinstance(x, (int, float, str)):
            return str(x)
        raise typer.BadParameter(f"{at}: expected text, a number or a table of them, got "
                                 f"{type(x).__name__}", ctx=ctx, param=param)

    if option.is_flag:
        if not isinstance(v, bool):
            raise typer.BadParameter(f"{at}: expected true or false", ctx=ctx, param=param)
        return v
    if isinstance(v, dict):
        return ",".join(f"{k}={scalar(x)}" for k, x in v.items())
    if option.multiple:
        return [scalar(x) for x in (v if isinstance(v, list) else [v])]
    if isinstance(v, list):
        return ",".join(scalar(x) for x in v)
    return v if isinstance(v, str) else scalar(v) if isinstance(v, bool) else v


def current_settings() -> dict | None:
    """``effective_settings`` of the command running now (None outside one)."""
    ctx = _RUNNING.get()
    return effective_settings(ctx) if ctx is not None else None


def effective_settings(ctx) -> dict:
    """How a result was made: the command, every option's effective value and where it came
    from (the command line, the --config file, or the default), gfsim's version and, where
    the command reads a log, the SHA-256 of its bytes."""
    import os

    from gfsim import __version__

    options, given = {}, {}
    for key, value in ctx.params.items():
        if key == "config":
            continue
        if isinstance(value, os.PathLike):
            value = str(value)
        elif isinstance(value, tuple):
            value = list(value)
        options[key] = value
        source = ctx.get_parameter_source(key)
        given[key] = {"COMMANDLINE": "command line", "DEFAULT_MAP": "config file",
                      "ENVIRONMENT": "environment"}.get(getattr(source, "name", ""), "default")
    out = {"command": ctx.command_path.removeprefix("gfsim ").strip() or ctx.info_name,
           "gfsim_version": __version__, "options": options,
           "from": {k: v for k, v in given.items() if v != "default"},
           "config": ctx.params.get("config")}
    log = ctx.params.get("log", "__none__")
    if log != "__none__":
        digests = [_log_sha256(one) for one in (log if isinstance(log, (list, tuple)) and log
                                                 else [log])]
        out["log_sha256"] = digests if isinstance(log, (list, tuple)) and log else digests[0]
    return out


def _log_sha256(log: str | None) -> str | None:
    """The SHA-256 of a log's bytes (None: the shipped default's); None where it is not
    there (a run that writes its log, live, before it exists)."""
    from gfsim.api.describe import log_sha256

    return log_sha256(log)


# -- options that mean the same in every command that takes them, declared once --------------
LOG_HELP = "The log: a path or a shipped log's name (`gfsim logs` lists them; default: " \
           "the shipped default)."
FORECASTER_HELP = ("The forecasts the policies read: a forecaster the log holds, by name "
                   "(default: its first); a what-if one drawn from its measured speedups, "
                   "paper:gemini3-flash or synthetic: with keys sigma, beta, temp, and "
                   "failed=parent|low for how it sees a failed kernel (an assumption); the "
                   "learned forecaster, learned (alias costmodel); or a plug-in's "
                   "(gfsim.forecasters).")
COST_HELP = ("Cost preset, e.g. serverless-a100, reserved-h100:gpus=2, "
             "serverless-h200:provider=runpod (overrides are KEY=VALUE pairs joined by commas), "
             "a TOML file, or a plug-in's name (`gfsim costs` lists them).")
BUDGET_HELP = ("Per-search limits, KEY=VALUE pairs joined by commas (usd=2,steps=10); keys: "
               "usd, seconds, joules, gpu_evals, gpu_hours, steps.")
LogOption = Annotated[Optional[str], typer.Option("--log", "-l", help=LOG_HELP)]
ForecasterOption = Annotated[Optional[str], typer.Option("--forecaster", "-f",
                                                         help=FORECASTER_HELP)]
CostOption = Annotated[str, typer.Option("--cost", "-c", help=COST_HELP)]
BudgetOption = Annotated[Optional[str], typer.Option("--budget", "-b", help=BUDGET_HELP)]
SeedOption = Annotated[int, typer.Option("--seed", "-s",
                                         help="The first seed of every keyed random stream.")]
ChildrenOption = Annotated[str, typer.Option("--children", help=CHILDREN_HELP)]
SimulateFlag = Annotated[bool, typer.Option("--simulate", help=SIMULATE_HELP, metavar="")]
ConfigOption = Annotated[Optional[Path], typer.Option("--config", help=CONFIG_HELP,
                                                      is_eager=True, callback=load_config)]
