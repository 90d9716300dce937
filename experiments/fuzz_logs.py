"""A standing fuzz benchmark of the log reader, ``gfsim validate`` and ``gfsim replay``.

Each case mutates one valid base log, writes it to a file, and runs ``gfsim validate`` on it,
then ``gfsim replay`` (the trace driver under ``all`` and ``threshold:0.7``, and on every fourth
case the puct driver for three steps). Each command runs in a worker process, in-process
through the Typer app, with a hang limit per case (10 s). A case fails as

- **crashed**: a command ended in an exception other than gfsim's one-line input error (a
  traceback for the user), or its error message spans lines;
- **hung**: the case ran past the hang limit (the worker is killed and replaced);
- **misreported**: ``validate`` accepted a log that ``replay`` then refused.

The mutation mix, one class per case, drawn uniformly:

- ``byte_flip``: one to four bytes of the text set to random values (mostly invalid JSON or
  UTF-8);
- ``gzip``: the log gzipped (one member per line group, as a live run writes it), then bytes
  flipped or the file cut short;
- ``line_edit``: a line deleted, duplicated, moved, cut short, or a blank or garbage line
  inserted;
- ``type_change``: one value anywhere in one record replaced by a value of another JSON type;
- ``extreme_value``: one value replaced by an extreme (integers beyond 64 bits or with
  thousands of digits, 1e308, subnormals, -0.0, NaN and Infinity literals, lone surrogate
  escapes, rich markup, control characters, 100,000-character strings, deep nesting);
- ``link_corruption``: an id made to point elsewhere (an unknown or another record's
  candidate, parent or search, a self-parent, a cycle), a duplicated record, a step or seq
  changed;
- ``many_extremes``: every number of one list or record set to one extreme (``[1e308] * 8``
  probabilities: one at a time never overflows their sum);
- ``size_bomb``: a gzip stream that inflates to hundreds of MiB (newlines, one long line, or
  whitespace), a run of a hundred thousand blank lines, or a line of millions of characters;
- ``lying_shape``: the run records' shape (``configuration.search``) made to claim up to 10^6
  samples per parent, F up to 10^4, or 10^6 steps, replayed under the puct driver;
- ``side_file``: the log (or an OpenEvolve run's ``logs/fuzz.log``, imported) a link to
  ``/proc`` or ``/dev`` files, a FIFO, or a file with a sparse tail of 64 or 256 MiB;
- ``settings_file``: a ``--config`` file of dotted keys, deep nesting, escapes in keys, a
  FIFO, a device, or more than a settings file may hold (``replay --config``);
- ``foreign_study``: an Optuna storage given to ``gfsim tune --storage`` (``fuzz_studies.py``):
  a study gfsim made, then given triggers, views, virtual tables, expression indexes,
  generated columns, another schema version, wrong column types, 10 MB or 10,000-deep values,
  escapes, trials RUNNING for dead processes; or a file cut short, not SQLite, a folder, FIFO,
  link to ``/dev`` or ``/proc``, read-only, with a WAL beside it; or a journal file. Each runs
  ``gfsim tune`` in a process of its own (``fuzz_studies.HANG_S`` guard, caps on memory and
  file size); it also fails as **heavy** (a peak above 2 GB) or **altered** (refused, yet a
  file of the study changed). Its ``peak MB`` is each case's own process's; other classes'
  is their worker's peak so far (an upper bound).

Every worker runs under an address-space cap (``MEMORY_CAP``, 4 GiB): a case that would take
more ends in a MemoryError, which counts as crashed, not as a wait.

All but ``byte_flip`` and ``gzip`` leave every line valid JSON, so most mutants reach
``replay``; the summary says how many did.

    python experiments/fuzz_logs.py --cases 10000            # a fresh seed, printed
    python experiments/fuzz_logs.py --cases 2000 --seed 7 --save-failures /tmp/fails
    python experiments/fuzz_logs.py --corpus tests/data/fuzz  # the regression corpus only

Exit status 1 if any case failed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gzip
import io
import json
import multiprocessing as mp
import os
import random
import secrets
import shutil
import sys
import tempfile
import time
import traceback
import zlib
from collections import Counter, defaultdict
from multiprocessing.connection import wait
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLASSES = ("byte_flip", "gzip", "line_edit", "type_change", "extreme_value", "link_corruption",
           "many_extremes", "size_bomb", "lying_shape", "side_file", "settings_file",
           "foreign_study")
HANG_S = 10.0
MEMORY_CAP = 4 << 30  # address space per worker (the replays of an honest case take < 1.5 GiB)


# -- base logs ---------------------------------------------------------------------------------
def _records(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _first_search(records: list[dict], max_step: int) -> list[dict]:
    """The header, the first search's run record, and that search's records up to ``max_step``
    (a small, still valid slice of a large log)."""
    runs = [r for r in records if r["kind"] == "run"]
    if not runs:
        return records
    sid = runs[0]["search_id"]
    keep_ids = {r["candidate_id"] for r in records if r["kind"] == "candidate"
                and r["search_id"] == sid and r["step"] <= max_step}
    out = []
    for r in records:
        k = r["kind"]
        if k == "header" or (k == "run" and r["search_id"] == sid) or (
                k == "step" and r["search_id"] == sid and r["step"] <= max_step) or (
                k not in ("header", "run", "step") and r.get("candidate_id") in keep_ids):
            out.append(r)
    return out


def base_logs() -> dict[str, list[str]]:
    """Name -> lines (JSON text) of each valid base log."""
    shipped = ROOT / "replay_logs" / "data"
    bases = {
        "tiny": _records(ROOT / "tests" / "data" / "tiny.jsonl"),
        "tiny-no-forecasts": _records(ROOT / "tests" / "data" / "tiny-no-forecasts.jsonl"),
        "h200-suite-v0": _records(shipped / "h200-suite-v0.jsonl.gz"),
        "synthetic-mini[0]": _first_search(_records(shipped / "synthetic-mini.jsonl.gz"), 3),
        "h200-live-v1[0]": _first_search(_records(shipped / "h200-live-v1.jsonl.gz"), 2),
    }
    return {name: [json.dumps(r, ensure_ascii=False) for r in recs]
            for name, recs in bases.items()}


# -- mutations ---------------------------------------------------------------------------------
EXTREMES_TEXT = [  # JSON texts spliced in as values
    "18446744073709551616", "-9223372036854775809", "9" * 4400, "1" + "0" * 400, "1e308",
    "-1e308", "1e999", "-1e999", "5e-324", "-0.0", "0", "-1", "NaN", "Infinity", "-Infinity",
    '"\\ud800"', '"x\\udfffy"', '"[/b]"', '"[bold red]x[/]"', '"\\u0000"', '"\\u202e"',
    '"' + "n" * 100_000 + '"', '""', '" "', "[" * 5000 + "]" * 5000, '{"a":' * 3000 + "1" +
    "}" * 3000, "[]", "{}", "true", "null", '"\\n"', "1.7976931348623157e308", "4294967296",
]
TYPE_VALUES = [0, 1, -1, 2.5, "", "x", True, False, None, [], {}, [1, 2], {"k": "v"}, "1.0"]


def _paths(doc, prefix=()):
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:12]):
            out += _paths(v, prefix + (i,))
    return out


def _set(doc, path, value):
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1]] = value


SENTINEL = "\u0001GFSIM-FUZZ\u0001"


def _splice(rec: dict, path, text: str) -> str:
    """The record's JSON with the value at ``path`` replaced by the raw JSON ``text``."""
    _set(rec, path, SENTINEL)
    return json.dumps(rec, ensure_ascii=False).replace(json.dumps(SENTINEL), text, 1)


def mutate(lines: list[str], cls: str, rng: random.Random) -> tuple[bytes, str, str]:
    """(file bytes, suffix, what was done) of one mutant of ``lines``."""
    lines = list(lines)
    i = rng.randrange(len(lines))
    if cls == "byte_flip" or cls == "gzip":
        data = bytearray(("\n".join(lines) + "\n").encode("utf-8"))
        if cls == "gzip":
            groups, k = [], 0
            while k < len(lines):  # one gzip member per batch of lines, as LogWriter writes
                n = rng.randint(1, 6)
                groups.append(gzip.compress(("\n".join(lines[k:k + n]) + "\n").encode(),
                                            mtime=0))
                k += n
            data = bytearray(b"".join(groups))
            if rng.random() < 0.5:
                cut = rng.randrange(1, len(data))
                return bytes(data[:cut]), ".jsonl.gz", f"gzip cut at byte {cut} of {len(data)}"
        flips = []
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(data))
            data[pos] = rng.randrange(256)
            flips.append(pos)
        return bytes(data), ".jsonl.gz" if cls == "gzip" else ".jsonl", f"bytes at {flips}"
    if cls == "line_edit":
        op = rng.choice(["delete", "duplicate", "move", "cut", "blank", "garbage", "header"])
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(rng.randrange(len(lines) + 1), lines[i])
        elif op == "move":
            lines.insert(rng.randrange(len(lines)), lines.pop(i))
        elif op == "cut":
            lines[i] = lines[i][:rng.randrange(max(len(lines[i]), 1))]
        elif op == "blank":
            lines.insert(i, " \t")
        elif op == "garbage":
            lines.insert(i, rng.choice(["{}", "[]", "1", '"x"', "null", '{"kind":null}',
                                        '{"kind":"header"}', '{"kind":"bogus"}', "{" * 200]))
        else:
            lines.append(lines.pop(0))
        end = "" if op == "cut" and i == len(lines) - 1 else "\n"
        return ("\n".join(lines) + end).encode("utf-8"), ".jsonl", f"line {i + 1}: {op}"
    if cls == "many_extremes":
        return _many_extremes(lines, i, rng)
    if cls == "size_bomb":
        return _size_bomb(lines, i, rng)
    if cls in _FILE_CLASSES:
        return _FILE_CLASSES[cls](lines, i, rng)
    rec = json.loads(lines[i])
    if cls == "type_change":
        paths = _paths(rec)
        path = rng.choice(paths)
        _set(rec, path, rng.choice(TYPE_VALUES))
        lines[i] = json.dumps(rec, ensure_ascii=False)
        return _join(lines), ".jsonl", f"line {i + 1}: {'.'.join(map(str, path))} retyped"
    if cls == "extreme_value":
        paths = _paths(rec)
        path = rng.choice(paths)
        text = rng.choice(EXTREMES_TEXT)
        lines[i] = _splice(rec, path, text)
        return _join(lines), ".jsonl", f"line {i + 1}: {'.'.join(map(str, path))} = {text[:30]}"
    # link_corruption
    records = [json.loads(x) for x in lines]
    ids = [r["candidate_id"] for r in records if r.get("kind") == "candidate"]
    searches = sorted({r["search_id"] for r in records if "search_id" in r})
    op = rng.choice(["candidate_id", "parent_id", "self_parent", "cycle", "search_id",
                     "task_id", "parent_ids", "step", "seq", "duplicate_record"])
    linked = [k for k, r in enumerate(records) if "candidate_id" in r]
    cands = [k for k, r in enumerate(records) if r.get("kind") == "candidate"]
    if op == "candidate_id" and linked:
        k = rng.choice(linked)
        records[k]["candidate_id"] = rng.choice(ids + ["no-such-candidate"])
    elif op in ("parent_id", "self_parent", "cycle") and cands:
        k = rng.choice(cands)
        me = records[k]["candidate_id"]
        if op == "parent_id":
            records[k]["parent_id"] = rng.choice(ids + ["no-such-parent"])
        elif op == "self_parent":
            records[k]["parent_id"] = me
        else:  # me -> other -> me
            j = rng.choice(cands)
            records[k]["parent_id"] = records[j]["candidate_id"]
            records[j]["parent_id"] = me
    elif op == "search_id" and searches:
        k = rng.choice([k for k, r in enumerate(records) if "search_id" in r])
        records[k]["search_id"] = rng.choice(searches + ["no-such-search"])
    elif op == "task_id" and cands:
        records[rng.choice(cands)]["task_id"] = rng.choice(["no-such-task", "alpha", "softmax"])
    elif op == "parent_ids":
        steps = [k for k, r in enumerate(records) if r.get("kind") == "step"]
        if steps:
            k = rng.choice(steps)
            records[k]["parent_ids"] = rng.sample(ids + ["no-such-parent"],
                                                  min(len(ids) + 1, rng.randint(0, 3)))
    elif op in ("step", "seq"):
        withstep = [k for k, r in enumerate(records) if op in r]
        if withstep:
            records[rng.choice(withstep)][op] = rng.choice([0, 1, 2, 3, 7, 10_000, 2**62])
    else:
        k = rng.randrange(len(records))
        records.insert(rng.randrange(len(records) + 1), dict(records[k]))
    return _join([json.dumps(r, ensure_ascii=False) for r in records]), ".jsonl", \
        f"link: {op}"


BIG_NUMBERS = ["1e308", "1.7976931348623157e308", "-1e308", "1e307", "4e307"]


def _many_extremes(lines: list[str], i: int, rng: random.Random) -> tuple[bytes, str, str]:
    rec = json.loads(lines[i])
    lists = [p for p in _paths(rec) if isinstance(_get(rec, p), list)]
    text = rng.choice(BIG_NUMBERS)
    if lists and rng.random() < 0.7:
        path = rng.choice(lists)
        n = len(_get(rec, path)) or 8
        _set(rec, path, SENTINEL)
        lines[i] = json.dumps(rec, ensure_ascii=False).replace(
            json.dumps(SENTINEL), "[" + ",".join([text] * n) + "]", 1)
        return _join(lines), ".jsonl", f"line {i + 1}: {'.'.join(map(str, path))} = [{text}]*{n}"
    numbers = [p for p in _paths(rec) if isinstance(_get(rec, p), (int, float))
               and not isinstance(_get(rec, p), bool)]
    for path in numbers:  # every number of the record: sums of two of them overflow too
        _set(rec, path, 1e308)
    lines[i] = json.dumps(rec, ensure_ascii=False).replace("1e+308", text)
    return _join(lines), ".jsonl", f"line {i + 1}: all {len(numbers)} numbers = {text}"


def _get(doc, path):
    for k in path:
        doc = doc[k]
    return doc


@functools.lru_cache(maxsize=None)
def _bomb(kind: str) -> bytes:
    """A gzip stream of a few hundred KB that inflates to 200 MiB (made once per process)."""
    unit = {"newlines": b"\n", "line": b"a", "spaces": b" \t"}[kind]
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = unit * ((1 << 20) // len(unit))
    return b"".join([z.compress(block) for _ in range(200)] + [z.flush()])


def _size_bomb(lines: list[str], i: int, rng: random.Random) -> tuple[bytes, str, str]:
    op = rng.choice(["gzip-newlines", "gzip-line", "gzip-spaces", "blank-lines", "long-line"])
    if op.startswith("gzip-"):
        head = gzip.compress(_join(lines[:i]), mtime=0) if rng.random() < 0.5 else b""
        return head + _bomb(op[5:]), ".jsonl.gz", f"line {i + 1}: {op} bomb (200 MiB)"
    if op == "blank-lines":
        lines.insert(i, "\n" * rng.choice([1000, 100_000]))
        return _join(lines), ".jsonl", f"line {i + 1}: a run of blank lines"
    rec = json.loads(lines[i])
    rec["padding"] = "x" * rng.choice([1 << 20, 8 << 20])
    lines[i] = json.dumps(rec)
    return _join(lines), ".jsonl", f"line {i + 1}: a line of {len(lines[i]):,} characters"


def _join(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")


# -- lying shapes, side files and settings files (issue 52) -----------------------------------
# A case's suffix says how its file is made when it is not its bytes: ``@link`` (the bytes are
# a link's target), ``@fifo``, ``@sparse-N`` (the bytes, then N MiB of a hole), and the
# command it is read by: ``.toml@settings...`` (replay --config) or ``.log@openevolve...``
# (the file is an OpenEvolve run's logs/fuzz.log, imported).
LINK_TARGETS = ["/proc/self/pagemap", "/proc/self/mem", "/proc/self/environ", "/proc/kcore",
                "/sys/kernel/mm/transparent_hugepage/enabled", "/dev/zero", "/dev/urandom",
                "/dev/null", "/dev/stdin"]
OPENEVOLVE_RUN = ROOT / "tests" / "data" / "openevolve" / "run"


def _lying_shape(lines: list[str], i: int, rng: random.Random) -> tuple[bytes, str, str]:
    claim = rng.choice([{"samples_per_parent": 10**rng.randint(2, 6)},
                        {"overgen": 10**rng.randint(2, 4)},
                        {"samples_per_parent": 10**4, "overgen": 10**3},
                        {"steps": 10**6, "parents_per_step": 10**3}])
    out, lied = [], 0
    for line in lines:
        rec = json.loads(line)
        if rec.get("kind") == "run" and isinstance(rec.get("configuration"), dict):
            search = rec["configuration"].get("search")
            search = dict(search) if isinstance(search, dict) else {
                "steps": 3, "parents_per_step": 2, "samples_per_parent": 4, "overgen": 1,
                "k_per_parent": 4, "capacity": 1000, "c_puct": 1.0}
            rec["configuration"]["search"] = {**search, **claim}
            lied += 1
        out.append(json.dumps(rec, ensure_ascii=False))
    return _join(out), ".jsonl", f"{lied} run records claim {claim}"


def _side_file(lines: list[str], i: int, rng: random.Random) -> tuple[bytes, str, str]:
    host = rng.choice([".jsonl", ".log@openevolve"])
    op = rng.choice(["link", "link", "fifo", "sparse"])
    if op == "link":
        target = rng.choice(LINK_TARGETS)
        return target.encode(), f"{host}@link", f"{host}: a link to {target}"
    if op == "fifo":
        return b"", f"{host}@fifo", f"{host}: a FIFO"
    # (within the hang limit on a loaded machine: a log is read whole, once; a side file is
    # streamed, and was held five times over)
    mib = rng.choice([64, 256])
    return _join(lines), f"{host}@sparse-{mib}", f"{host}: a sparse tail of {mib} MiB"


def _settings_file(lines: list[str], i: int, rng: random.Random) -> tuple[bytes, str, str]:
    op = rng.choice(["dotted", "deep-arrays", "deep-tables", "escape-key", "many-keys",
                     "long-key", "fifo", "link", "large", "binary"])
    n = rng.choice([40, 1000, 100_000])
    text = {"dotted": "a" + ".a" * n + " = 1\n",
            "deep-arrays": "x = " + "[" * n + "]" * n + "\n",
            "deep-tables": "x = " + "{a = " * min(n, 5000) + "1" + "}" * min(n, 5000) + "\n",
            "escape-key": '"\\u001b]0;FUZZ\\u0007\\u009b\\u202e" = 1\n',
            "many-keys": "".join(f"k{j} = {j}\n" for j in range(min(n, 20_000))),
            "long-key": '"' + "k" * n + '" = 1\n',
            "large": "# " + "x" * (2 << 20) + "\n",
            "binary": "\x00\xff\x1b",
            }.get(op, "")
    if op == "link":
        return rng.choice(LINK_TARGETS).encode(), ".toml@settings@link", "settings: a link"
    if op == "fifo":
        return b"", ".toml@settings@fifo", "settings: a FIFO"
    return text.encode("utf-8", "surrogateescape"), ".toml@settings", f"settings: {op} ({n})"


if str(ROOT / "experiments") not in sys.path:  # fuzz_studies, beside this file
    sys.path.append(str(ROOT / "experiments"))
import fuzz_studies  # noqa: E402

_FILE_CLASSES = {"lying_shape": _lying_shape, "side_file": _side_file,
                 "settings_file": _settings_file, "foreign_study": fuzz_studies.foreign_study}


def materialise(tmp: str, data: bytes, suffix: str) -> tuple[str, list[list[str]] | None]:
    """Make a case's file under ``tmp`` as its suffix says; the path the commands read, and
    the commands themselves where they are not a log's (None: ``commands``)."""
    kinds = suffix.split("@")
    ext, how = kinds[0], (kinds[-1] if len(kinds) > 1 else "bytes")
    folder = os.path.join(tmp, f"case-{os.getpid()}")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    path = os.path.join(folder, "case" + ext)
    cmds = None
    if "openevolve" in kinds:
        run = os.path.join(folder, "run")
        shutil.copytree(OPENEVOLVE_RUN, run)
        path = os.path.join(run, "logs", "fuzz.log")
        cmds = [["import", "openevolve", run, "-o", os.path.join(folder, "out.jsonl"),
                 "--runtime-metric", "runtime_ns", "--openevolve-version", "0.4.1"]]
    elif "settings" in kinds:
        cmds = [["replay", "--log", "synthetic-mini", "--config", path]]
    if how == "link":
        os.symlink(data.decode(), path)
    elif how == "fifo":
        os.mkfifo(path)
    else:
        with open(path, "wb") as fh:
            fh.write(data)
            if how.startswith("sparse-"):
                fh.truncate(len(data) + (int(how[len("sparse-"):]) << 20))
    return path, cmds


# -- running a case ----------------------------------------------------------------------------
def commands(path: str, puct: bool) -> list[list[str]]:
    """validate, then replay: the human tables (where user strings are printed) and JSON."""
    cmds = [["validate", path],
            ["replay", "--log", path, "--policy", "all"],
            ["replay", "--log", path, "--policy", "threshold:0.7", "--json"]]
    if puct:
        cmds.append(["replay", "--log", path, "--policy", "threshold:0.7", "--driver", "puct",
                     "--steps", "3"])
    return cmds


def run_command(app, args: list[str]) -> tuple[str, str]:
    """("ok" | "error" | "crash", detail) of one command, run in this process."""
    import click

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            # Without standalone mode click returns an Exit's code instead of raising it
            # (and a command's own return value, None, otherwise).
            ret = app(args, standalone_mode=False)
            code = ret if isinstance(ret, int) else 0
        except click.exceptions.Exit as exc:
            code = exc.exit_code
        except click.ClickException as exc:  # a usage error: fine, but not expected here
            return "crash", f"click {type(exc).__name__}: {exc.format_message()[:200]}"
        except BaseException as exc:  # noqa: BLE001 - the point: anything else is a crash
            if getattr(getattr(exc, "param", None), "name", None) == "config" and hasattr(
                    exc, "format_message"):  # a refused settings file (typer's own click)
                return _settings_error(exc.format_message())
            tb = traceback.extract_tb(exc.__traceback__)
            where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb)
                          if "gfsim" in f.filename or "/replay_logs/" in f.filename
                          or "/simulator/" in f.filename or "/policies/" in f.filename),
                         "?")
            return "crash", f"{type(exc).__name__} at {where}: {str(exc)[:160]}"
    text = err.getvalue()
    errors = [ln for ln in text.splitlines() if ln.startswith("gfsim: error:")]
    if code == 0:
        return "ok", ""
    if code != 2 or len(errors) != 1 or len(text.strip().splitlines()) > len(errors) + \
            text.count("gfsim: warning:"):
        return "crash", f"exit {code} with output {text[:200]!r}"
    return "error", errors[0][len("gfsim: error: "):][:200]


def _settings_error(message: str) -> tuple[str, str]:
    """A refused settings file: an error if it is one line with no raw control character (a
    key echoed raw could set the terminal's title)."""
    raw = [c for c in message if c not in "\n" and (ord(c) < 32 or 0x7f <= ord(c) <= 0x9f
                                                     or c in "\u202a\u202b\u202c\u202d\u202e")]
    if raw or "\n" in message.strip():
        return "crash", f"settings error not one printable line: {message[:200]!r}"
    return "error", message[:200]


# Refusals that say the log does not suit the command (a 'pairs' log has no search to replay; a
# policy that reads forecasts needs a log with some; the puct driver needs parents and
# children, and a search PUCT does not reproduce needs enough evidence to invent children
# from), not that the log is invalid: a valid log may draw them, so they are not misreports.
USAGE = ("has no search order or parents", "reads forecasts and the log has none",
         "holds no candidates: nothing to replay", "the puct driver needs a trajectory log",
         "a config_space log allows only policies that need no forecast",
         "cannot be replayed closed loop: PUCT does not reproduce it",
         "a shape the log does not support", "memory budget")


def judge(results: list[tuple[str, str]]) -> tuple[str, str, bool]:
    """The case's verdict and detail from its commands' results (validate first), and whether
    a replay ran to its end."""
    replayed = any(status == "ok" for status, _ in results[1:])
    for status, detail in results:
        if status == "crash":
            return "crashed", detail, replayed
        if status in ("hung", "heavy", "altered"):  # a foreign study's own verdicts
            return status, detail, replayed
    if results[0][0] == "ok":
        for status, detail in results[1:]:
            if status == "error" and not any(u in detail for u in USAGE):
                return "misreported", detail, replayed
    return "ok", "", replayed


def _worker(conn, tmp: str) -> None:
    import shutil
    import warnings

    warnings.simplefilter("ignore")
    os.environ["GFSIM_CACHE_DIR"] = os.path.join(tmp, "cache")
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    from gfsim.cli.main import app

    while True:
        msg = conn.recv()
        if msg is None:
            return
        case_id, data, suffix, puct = msg
        if "@study" in suffix:  # gfsim tune in a process of its own: its own peak
            conn.send((case_id, *fuzz_studies.run_study_case(tmp, data, suffix)))
            continue
        path, own = materialise(tmp, data, suffix)
        results = []
        for args in own or commands(path, puct):
            results.append(run_command(app, args))
            if results[0][0] != "ok" and args[0] == "validate":
                # replay of a refused log must still not crash: run one policy only
                results.append(run_command(app, commands(path, False)[2]))
                break
        shutil.rmtree(os.path.join(tmp, ".gfsim-cache"), ignore_errors=True)
        shutil.rmtree(os.path.join(tmp, "cache"), ignore_errors=True)
        conn.send((case_id, results, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))


class Pool:
    """Worker processes, each answering one case at a time; a case past ``HANG_S`` kills its
    worker (a fresh one takes its place)."""

    def __init__(self, jobs: int, tmp: str):
        self.ctx = mp.get_context("spawn")
        here = str(Path(__file__).resolve().parent)
        if __name__ != "__main__" and here not in sys.path:
            # imported by name (the tests): a spawned worker imports it by that name, with
            # this process's sys.path
            sys.path.append(here)
        self.tmp, self.workers = tmp, []
        for _ in range(jobs):
            self.workers.append(self._start())

    def _start(self):
        parent, child = self.ctx.Pipe()
        wdir = tempfile.mkdtemp(dir=self.tmp)
        proc = self.ctx.Process(target=_worker, args=(child, wdir), daemon=True)
        proc.start()
        return {"proc": proc, "conn": parent, "case": None, "since": 0.0}

    def run(self, cases, on_result) -> None:
        pending = iter(cases)
        exhausted = False
        while True:
            for w in self.workers:
                if w["case"] is None and not exhausted:
                    case = next(pending, None)
                    if case is None:
                        exhausted = True
                        break
                    w["case"], w["since"] = case, time.monotonic()
                    w["limit"] = _hang_limit(case["suffix"])
                    w["conn"].send((case["id"], case["data"], case["suffix"], case["puct"]))
            busy = [w for w in self.workers if w["case"] is not None]
            if not busy:
                return
            now = time.monotonic()
            timeout = max(0.0, min(w["since"] + w["limit"] - now for w in busy))
            ready = wait([w["conn"] for w in busy], timeout=timeout)
            for w in busy:
                if w["conn"] in ready:
                    try:
                        _case_id, results, w["case"]["peak_kb"] = w["conn"].recv()
                    except EOFError:  # the worker died (a crash of the interpreter itself)
                        on_result(w["case"], "crashed", "the worker process died", False)
                        self._replace(w)
                        continue
                    on_result(w["case"], *judge(results))
                    w["case"] = None
                elif time.monotonic() - w["since"] > w["limit"]:
                    on_result(w["case"], "hung", f"no answer within {w['limit']:.0f} s",
                              False)
                    self._replace(w)

    def _replace(self, w) -> None:
        w["proc"].kill()
        w["proc"].join()
        w.update(self._start(), case=None)

    def close(self) -> None:
        for w in self.workers:
            with contextlib.suppress(Exception):
                w["conn"].send(None)
            w["proc"].join(timeout=5)
            if w["proc"].is_alive():
                w["proc"].kill()


def _hang_limit(suffix: str) -> float:
    """A case's hang limit: a foreign study's process has its own guard, and a worker waits
    a little longer for its answer."""
    return fuzz_studies.HANG_S + 15 if "@study" in suffix else HANG_S


def make_cases(n: int, seed: int, bases: dict[str, list[str]], classes=CLASSES):
    names = sorted(bases)
    for k in range(n):
        rng = random.Random(f"{seed}:{k}")
        cls = classes[k % len(classes)] if n >= len(classes) else rng.choice(classes)
        base = rng.choice(names)
        data, suffix, what = mutate(bases[base], cls, rng)
        yield {"id": k, "class": cls, "base": base, "data": data, "suffix": suffix,
               "what": what, "puct": k % 4 == 0 or cls == "lying_shape"}


def corpus_cases(folder: Path):
    for k, path in enumerate(sorted(p for p in folder.iterdir() if ".jsonl" in p.name
                                    or "@" in p.name)):
        yield {"id": k, "class": path.name.split("--")[0], "base": path.name,
               "data": path.read_bytes(), "suffix": _corpus_suffix(path.name),
               "what": path.name, "puct": True}


def _corpus_suffix(name: str) -> str:
    """A corpus file's case suffix: what follows its id (``.jsonl.gz``, ``.toml@settings``)."""
    if "@" in name:
        tail = name[name.rindex("--") + 2:]
        return tail[tail.index("."):]
    return ".jsonl.gz" if name.endswith(".gz") else ".jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=None, help="default: a fresh one, printed")
    ap.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--corpus", type=Path, help="run this folder's mutants instead")
    ap.add_argument("--classes", default=",".join(CLASSES),
                    help="the mutation classes drawn, comma-separated (default: all)")
    ap.add_argument("--save-failures", type=Path, help="write each failing mutant here")
    ap.add_argument("--json", type=Path, help="write the summary and failures here")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    if args.corpus:
        cases = list(corpus_cases(args.corpus))
        print(f"regression corpus {args.corpus}: {len(cases)} cases", file=sys.stderr)
    else:
        classes = tuple(c for c in args.classes.split(",") if c)
        unknown = sorted(set(classes) - set(CLASSES))
        if unknown or not classes:
            ap.error(f"--classes: unknown {unknown}; valid: {', '.join(CLASSES)}")
        cases = make_cases(args.cases, seed, base_logs(), classes)
        print(f"seed {seed}: {args.cases} cases, {args.jobs} workers", file=sys.stderr)
    counts: dict[str, Counter] = defaultdict(Counter)
    failures = []
    started = time.monotonic()
    done = [0]

    def on_result(case, verdict, detail, replayed):
        c = counts[case["class"]]
        c["cases"] += 1
        c[verdict] += 1
        c["replayed"] += replayed
        c["peak_kb"] = max(c["peak_kb"], case.get("peak_kb", 0))
        try:
            text = case["data"].decode("utf-8")
            c["valid_json"] += all(_is_json(x) for x in text.splitlines() if x.strip())
        except UnicodeDecodeError:
            pass
        if verdict != "ok":
            failures.append({"id": case["id"], "class": case["class"], "base": case["base"],
                             "what": case["what"], "verdict": verdict, "detail": detail})
            if args.save_failures:
                args.save_failures.mkdir(parents=True, exist_ok=True)
                name = f"{case['class']}--{verdict}--{seed}-{case['id']}{case['suffix']}"
                (args.save_failures / name).write_bytes(case["data"])
        done[0] += 1
        if done[0] % 500 == 0:
            print(f"  {done[0]} cases, {len(failures)} failures, "
                  f"{time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="gfsim-fuzz-") as tmp:
        pool = Pool(args.jobs, tmp)
        try:
            pool.run(cases, on_result)
        finally:
            pool.close()
    total = Counter()
    head = ("class", "cases", "valid JSON", "replayed", "crashed", "hung", "misreported",
            "heavy", "altered", "peak MB")
    print("\n{:16s} {:>6s} {:>10s} {:>8s} {:>8s} {:>5s} {:>11s} {:>5s} {:>7s} {:>7s}".format(
        *head))
    row = "{:16s} {:6d} {:10d} {:8d} {:8d} {:5d} {:11d} {:5d} {:7d} {:7.0f}"
    keys = ("cases", "valid_json", "replayed", "crashed", "hung", "misreported", "heavy",
            "altered")
    for cls in sorted(counts):
        c = counts[cls]
        total.update({k: c[k] for k in keys})
        print(row.format(cls, *(c[k] for k in keys), c["peak_kb"] / 1024))
    peak_kb = max((c["peak_kb"] for c in counts.values()), default=0)
    print(row.format("all", *(total[k] for k in keys), peak_kb / 1024))
    failed = sum(total[k] for k in ("crashed", "hung", "misreported", "heavy", "altered"))
    print(f"\n{failed} of {total['cases']} cases failed (seed {seed}; "
          f"{time.monotonic() - started:.0f} s)")
    by_detail = Counter((f["verdict"], f["detail"][:120]) for f in failures)
    for (verdict, detail), n in by_detail.most_common(25):
        print(f"  {n:5d} {verdict}: {detail}")
    if args.json:
        args.json.write_text(json.dumps({"seed": seed, "counts": counts, "failures": failures},
                                        indent=1))
    return 1 if failed else 0


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
