"""The rows of a foreign SQLite study, checked read-only before Optuna reads them.

Optuna trusts its own tables: a value it never writes ends ``gfsim tune`` in a traceback from
deep inside SQLAlchemy or Optuna (a trial state ``'BOGUS'``: LookupError; text that is not
UTF-8: StorageInternalError; a distribution nested 10,000 deep: RecursionError), after Optuna
may already have written. So a study file that is damaged (``PRAGMA quick_check``), lacks a
column of Optuna's schema, or holds a value of the wrong type, a state or direction Optuna does
not know, a date it cannot parse, text that is not UTF-8, JSON that does not parse or is
nested deeper than ``MAX_JSON_DEPTH``, or a parameter its distribution cannot hold, is named
by table, row and column. The pass reads each row once (0.6 s for 10,000 trials on a
2-core machine).
"""

from __future__ import annotations

import json
import re

__all__ = ["bad_row", "MAX_JSON_DEPTH"]

MAX_JSON_DEPTH = 64  # gfsim's own attributes nest four deep; Python's parser stops near 1,000
# The columns Optuna leaves NULL (a waiting trial's dates, an infinite value); it fills every
# other, though its schema allows NULL in more (a parameter without a name became a key None).
_NULLS = {("trials", "datetime_start"), ("trials", "datetime_complete"),
          ("trial_values", "value"), ("trial_intermediate_values", "intermediate_value"),
          ("version_info", "schema_version"), ("version_info", "library_version")}
_SQL_TYPES = {"Integer": ("integer",), "Float": ("real", "integer"), "String": ("text",),
              "Text": ("text",), "Enum": ("text",), "DateTime": ("text",)}


def bad_row(con) -> str | None:
    """What is wrong with the study open (read-only) on sqlite3 connection ``con``, in words
    naming table, row and column; None if nothing is."""
    damage = con.execute("PRAGMA quick_check(1)").fetchone()[0]
    if damage != "ok":
        return f"damaged pages ({_show(damage, 120)})"
    present = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    for table in _optuna_tables():
        if table.name not in present:
            continue  # Optuna makes a missing table
        have = {r[1] for r in con.execute(f'PRAGMA table_info("{table.name}")')}
        for column in table.columns:
            if column.name not in have:
                return f"table {table.name} without its column {column.name}"
            what = _bad_column(con, table.name, column)
            if what:
                return what
    if {"trials", "trial_values", "study_directions"} <= present:
        what = _bad_objective(con)
        if what:
            return what
    if "trial_params" in present:
        return _bad_param(con)
    return None


def _bad_objective(con) -> str | None:
    """A direction or a trial's value numbered past its study's directions (Optuna indexes
    a list by it: IndexError)."""
    row = con.execute(
        "SELECT d.rowid, d.objective FROM study_directions d WHERE d.objective < 0 OR "
        "d.objective >= (SELECT count(*) FROM study_directions e WHERE e.study_id = d.study_id)"
        " LIMIT 1").fetchone()
    if row:
        return f"table study_directions row {row[0]}: objective {row[1]} is past the study's"
    row = con.execute(
        "SELECT v.rowid, v.objective FROM trial_values v JOIN trials t USING (trial_id) "
        "WHERE v.objective < 0 OR v.objective >= (SELECT count(*) FROM study_directions d "
        "WHERE d.study_id = t.study_id) LIMIT 1").fetchone()
    if row:
        return (f"table trial_values row {row[0]}: objective {row[1]} is past its study's "
                "directions")
    return None


def _optuna_tables():
    from optuna.storages._rdb import models

    return models.BaseModel.metadata.sorted_tables


def _bad_column(con, table: str, column) -> str | None:
    kind = type(column.type).__name__
    types = _SQL_TYPES.get(kind)
    if types is None:
        return None
    nullable = column.nullable and (table, column.name) in _NULLS
    allowed = ", ".join(f"'{t}'" for t in types + (("null",) if nullable else ()))
    name = f'"{column.name}"'
    row = con.execute(f'SELECT rowid, typeof({name}), quote(substr({name}, 1, 40)) FROM '
                      f'"{table}" WHERE typeof({name}) NOT IN ({allowed}) LIMIT 1').fetchone()
    if row:
        held = "is NULL" if row[1] == "null" else f"holds {row[1]} {_plain(row[2])}"
        return f"table {table} row {row[0]}: {column.name} {held}, not {' or '.join(types)}"
    if kind == "Enum":
        known = ", ".join(f"'{e}'" for e in column.type.enums)
        row = con.execute(f'SELECT rowid, quote(substr({name}, 1, 40)) FROM "{table}" '
                          f"WHERE {name} NOT IN ({known}) LIMIT 1").fetchone()
        if row:
            return (f"table {table} row {row[0]}: {column.name} {_plain(row[1])} is none of "
                    f"{'/'.join(column.type.enums)}")
    if types == ("text",):
        return _bad_text(con, table, column.name, kind)
    return None


def _bad_text(con, table: str, column: str, kind: str) -> str | None:
    """Text that is not UTF-8, a date SQLAlchemy cannot parse, JSON that does not parse or
    nests too deep. (JSON SQLite finds valid is not parsed again: 10,000 trials take 0.6 s.)"""
    import sqlite3

    from sqlalchemy.dialects import sqlite

    as_date = sqlite.DATETIME().result_processor(sqlite.dialect(), None)
    is_json = column.endswith("_json")
    select = f'SELECT rowid, CAST("{column}" AS BLOB), %s FROM "{table}" ' \
             f'WHERE "{column}" IS NOT NULL'
    try:
        cursor = con.execute(select % (f'json_valid("{column}")' if is_json else "0"))
    except sqlite3.OperationalError:  # an SQLite without JSON functions
        cursor = con.execute(select % "0")
    for rowid, raw, valid in cursor:
        where = f"table {table} row {rowid}: {column}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"{where} is not UTF-8 (byte {exc.start})"
        try:
            if kind == "DateTime":
                as_date(text)
            elif is_json:
                depth = json_depth(text) if raw.count(b"[") + raw.count(b"{") > \
                    MAX_JSON_DEPTH else 0
                if depth > MAX_JSON_DEPTH:
                    return f"{where} nests {depth} deep (at most {MAX_JSON_DEPTH})"
                if not valid or _LONG_DIGITS.search(raw):  # NaN and Infinity, which
                    json.loads(text)  # Python writes and SQLite refuses; Python's own limit
        except (ValueError, TypeError) as exc:
            return f"{where} {_show(text)} does not parse ({_show(exc, 60)})"
    return None


def _bad_param(con) -> str | None:
    """A parameter whose distribution Optuna cannot read, or cannot hold its value."""
    from optuna.distributions import json_to_distribution

    for rowid, value, text in con.execute(
            "SELECT rowid, param_value, distribution_json FROM trial_params"):
        try:
            json_to_distribution(text).to_external_repr(value)
        except Exception as exc:  # noqa: BLE001 - anything Optuna raises on it, named
            return (f"table trial_params row {rowid}: distribution_json {_show(text)} does "
                    f"not hold the value {_show(value)} ({type(exc).__name__})")
    return None


def json_depth(text: str) -> int:
    """How deep the arrays and objects of JSON ``text`` nest (strings skipped), without
    parsing it: a parser recurses once a level."""
    depth = deepest = 0
    for c in _BRACKETS.findall(_STRINGS.sub("", text)):
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


_STRINGS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")
_LONG_DIGITS = re.compile(rb"[0-9]{4300}")  # an integer Python does not read (int_max_str_digits)


def _plain(sql_literal: str) -> str:
    """An SQL literal (``quote()``'s) as shown: printable, at most 40 characters."""
    text = "".join(c if c.isprintable() else "?" for c in str(sql_literal))
    return text[:40] + ("..." if len(text) > 40 else "")


def _show(value, limit: int = 40) -> str:
    text = "".join(c if c.isprintable() else "?" for c in str(value))
    return repr(text[:limit] + ("..." if len(text) > limit else ""))
