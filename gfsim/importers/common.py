"""What the importers share: reading another tool's JSON safely, writing an imported log all or
nothing."""

from __future__ import annotations

from pathlib import Path

from gfsim.core.durable import replace
from gfsim.core.errors import GfsimError

__all__ = ["BadField", "KEY_DIGITS_MAX", "check_version", "is_number", "json_loads",
           "load_json", "parse_key", "read_surrogate_log", "source_name", "write_validated"]

KEY_DIGITS_MAX = 18  # an id of more digits names nothing a run made (and 5,000 fail int())


class BadField(GfsimError):
    """Bad input, in one line: where (a file, with its table, row or line), the field, what
    is wrong."""

    def __init__(self, where, field: str | None, message: str):
        super().__init__(f"{where}" + (f": field '{field}'" if field else "") + f": {message}")


def source_name(path, parts: int = 1) -> str:
    """What a log's header keeps of a user's file or folder: its last ``parts`` names (a run
    folder's name; ``runs/list/eval_results.json`` with ``parts=2`` gives
    ``list/eval_results.json``), never the absolute path of the user's disk."""
    import os

    names = Path(os.path.abspath(path)).parts[1:]  # (``.`` becomes the folder's own name)
    return "/".join(names[-parts:]) if names else str(path)


def is_number(v) -> bool:
    """A finite JSON number (not a bool)."""
    import math

    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_key(value, where, what: str) -> int:
    """A non-negative id or key of another tool's file (a level, a problem or sample number, an
    iteration) as an int: a JSON integer, or text that is a plain ASCII decimal of 1 to
    ``KEY_DIGITS_MAX`` digits. Anything else (``'²'`` and ``'١'``, whose ``isdigit()`` is true,
    a sign, a float, 5,000 digits) is one line naming ``where`` and ``what`` (the field)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value < 10 ** KEY_DIGITS_MAX:
            return value
        shown = "a negative number" if value < 0 else f"a number of over {KEY_DIGITS_MAX} digits"
    elif isinstance(value, str) and 0 < len(value) <= KEY_DIGITS_MAX and value.isascii() \
            and value.isdigit():
        return int(value)
    elif isinstance(value, str) and len(value) > 24:
        shown = f"{value[:16]!r}... ({len(value)} characters)"
    elif isinstance(value, (str, float)):
        shown = repr(value)
    else:  # (a list or an object: never its repr, which may be huge)
        shown = f"a JSON {type(value).__name__}"
    raise BadField(where, None, f"{what} {shown} is not a plain decimal number (ASCII digits, "
                                f"at most {KEY_DIGITS_MAX})")


def check_version(text: str | None, option: str, tool: str, supported: tuple, tested: str):
    """The version a user says a run was made with (``--openevolve-version``), stripped, or
    one line refusing it outside ``supported`` ((major, minor) from, (major, minor) before);
    None when not said."""
    import re

    if text is None:
        return None
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)?(?:[.+-]?\w+)*", text.strip())
    if m is None or not (supported[0] <= (int(m.group(1)), int(m.group(2))) < supported[1]):
        lo, hi = (".".join(map(str, v)) for v in supported)
        raise GfsimError(f"{option}: {text!r} is not supported; this importer reads runs of "
                         f"{tool} >={lo},<{hi} (tested with {tested})")
    return text.strip()


def load_json(path: Path, root: Path | None = None):
    """A JSON file of another tool's, read within the input limits (``read_input``: a regular
    file, inside ``root`` when given, bounded), or one line naming the file."""
    import json

    from gfsim.replay_logs.io import read_input

    try:
        return json_loads(read_input(path, root=root).decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise BadField(path, None, f"not valid JSON ({exc.msg} at line {exc.lineno} column "
                                   f"{exc.colno}; a cut file?)") from None
    except RecursionError:
        raise BadField(path, None, "JSON nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise BadField(path, None, f"not valid UTF-8 (at byte {exc.start})") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise BadField(path, None, f"not valid JSON ({str(exc)[:120]})") from None


def _int(text: str):
    """A JSON integer as Python's int up to 18 digits, else as a float (``inf`` beyond a
    double): an integer of 400 digits cannot be compared with ``math.isfinite`` or turned into
    a float later (OverflowError), one of 5,000 not even parsed (ValueError)."""
    return int(text) if len(text.lstrip("-")) <= 18 else float(text)


def json_loads(text: str | bytes):
    """``json.loads`` of another tool's output, whose integers a check can always handle (see
    ``_int``); NaN and Infinity are kept as that tool wrote them. Raises ``json.JSONDecodeError``
    and ``RecursionError`` as ``json.loads`` does."""
    import json

    return json.loads(text, parse_int=_int)


def write_validated(records: list[dict], out: Path, source: Path) -> None:
    """Write ``records`` to a temporary file beside ``out``, check it as a log, then rename it
    to ``out``: an import leaves a complete, valid log or nothing. A problem is reported
    against ``source``, the file that was imported. ``None`` fields are left out."""
    from gfsim.replay_logs import LogWriter, load_log

    tmp = out.with_name(out.stem + ".partial" + out.suffix)  # keeps .gz: compressed by suffix
    tmp.unlink(missing_ok=True)  # (what an import killed earlier left)
    try:
        with LogWriter(tmp) as w:
            w.append_many([{k: v for k, v in r.items() if v is not None} for r in records])
        load_log(tmp)
    except BaseException as exc:  # nothing of a failed import is left behind
        tmp.unlink(missing_ok=True)
        if isinstance(exc, GfsimError):
            raise GfsimError(f"{source}: the imported records do not validate ({exc})") \
                from None
        if isinstance(exc, (ValueError, TypeError, OverflowError)):  # NaN, or not JSON
            raise GfsimError(f"{source}: the imported records cannot be written as a log "
                             f"({type(exc).__name__}: {str(exc)[:200]})") from None
        raise
    replace(tmp, out)  # and the directory fsynced


def read_surrogate_log(path: Path) -> dict:
    """The log gfsim's surrogate wrote during an OpenEvolve or ShinkaEvolve run
    (``--surrogate-log``): its candidates' codes in order (``by_code``: code sha256 -> candidate
    ids), their usable forecasts (as the bring-your-own-search format's ``forecast`` field),
    the ``selection`` its policy made, and how many candidates it holds."""
    from gfsim.replay_logs.io import iter_records

    if not path.is_file():
        raise GfsimError(f"{path}: `surrogate_log`: no such file")
    by_code: dict[str, list[str]] = {}
    forecasts: dict[str, dict] = {}
    policy, n = None, 0
    for _, rec in iter_records(path):
        kind = rec.get("kind")
        if kind == "run":
            policy = (rec.get("configuration") or {}).get("policy")
        elif kind == "candidate" and rec.get("code_sha256"):
            by_code.setdefault(rec["code_sha256"], []).append(rec["candidate_id"])
            n += 1
        elif kind == "forecast" and not rec.get("error") and not rec.get("parse_failed"):
            probs = rec.get("probs")
            if isinstance(probs, list) and len(probs) == 8 and sum(probs) > 0:
                forecasts[rec["candidate_id"]] = {
                    "probs": probs, "forecaster": rec.get("forecaster"),
                    **{k: rec[k] for k in ("latency_s", "input_tokens", "output_tokens")
                       if rec.get(k) is not None}}
    if not n:
        raise GfsimError(f"{path}: `surrogate_log`: no candidate records (not a log the "
                         "surrogate wrote?)")
    selection = None
    if policy and policy != "all":
        selection = {"rule": f"gfsim's surrogate in front of the evaluator chose with "
                             f"{policy} (--surrogate-log {path.name})"}
    return {"by_code": by_code, "forecasts": forecasts, "selection": selection,
            "candidates": n}
