"""An RDB storage URL checked before Optuna opens it, so that whatever is wrong is one line.

- An in-memory SQLite database (``sqlite://``, ``sqlite:///:memory:``, ``mode=memory``) lives
  as long as one connection: Optuna's heartbeat thread and every worker open their own, see no
  tables, and the study is lost when the command ends. It is refused.
- An SQLite file is a program as well as data: a trigger runs its SQL on every write Optuna
  makes (one that loops hangs ``gfsim tune`` for ever; one that inserts a billion rows fills
  the disk), and so do a stored generated column or an index on an expression. Python 3.11's
  sqlite3 cannot switch triggers off (``setconfig`` came in 3.12), so an existing file is read
  first, read-only, and one that holds a trigger, a view, a virtual table, an index on an
  expression or a generated column (none of them in Optuna's schema) is refused by name. A
  path that is not a regular file (a named pipe would block the read), or that leads into
  ``/proc``, ``/sys`` or ``/dev`` (``/proc/self/mem`` is a "regular file": SQLite would write
  this process's memory), is refused too, as is a URL that turns SQLite's locking off
  (``vfs=``, ``nolock``, ``immutable``: a commit then failed, a StorageInternalError).
- The same read-only pass checks the rows (``rdb_rows.bad_row``): a damaged file, or a value
  Optuna never writes, is refused by table, row and column before Optuna reads it (it ended
  in tracebacks from deep inside SQLAlchemy). The pass leaves no file behind: the ``-shm``
  file SQLite makes to read a WAL-mode study is removed again when the pass made it.
"""

from __future__ import annotations

import os
import re
import stat

from gfsim.core.errors import GfsimError

__all__ = ["check_rdb_url", "OPTUNA_TABLES"]

# The tables of Optuna's RDB schema (optuna/storages/_rdb/models.py) and alembic's own.
OPTUNA_TABLES = frozenset({
    "studies", "version_info", "study_directions", "study_user_attributes",
    "study_system_attributes", "trials", "trial_user_attributes", "trial_system_attributes",
    "trial_params", "trial_values", "trial_intermediate_values", "trial_heartbeats",
    "alembic_version"})
_NAME = r'(?:"[^"]+"|`[^`]+`|\[[^\]]+\]|\w+)'
# An index on plain columns, as SQLAlchemy writes Optuna's: nothing evaluated per row.
_PLAIN_INDEX = re.compile(rf"\s*CREATE\s+(?:UNIQUE\s+)?INDEX\s+{_NAME}\s+ON\s+{_NAME}\s*"
                          rf"\(\s*{_NAME}(?:\s+(?:ASC|DESC))?(?:\s*,\s*{_NAME}"
                          rf"(?:\s+(?:ASC|DESC))?)*\s*\)\s*", re.IGNORECASE)


def check_rdb_url(url: str, rows: bool = True) -> None:
    """Refuse, in one line (``GfsimError``), an in-memory SQLite URL, and an SQLite file that
    is not a regular file, holds SQL of its own that Optuna's writes would run, or (``rows``)
    rows Optuna never writes (see the module). Other databases pass: their servers keep
    their own schema."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception as exc:  # ArgumentError and kin: Optuna would fail on it the same way
        raise GfsimError(f"`storage` {url}: not a database URL ({exc})") from None
    if parsed.get_backend_name() != "sqlite":
        return
    database = parsed.database or ""
    query = {k: str(v) for k, v in parsed.query.items()}
    if (database in ("", ":memory:") or database.startswith("file::memory:")
            or query.get("mode") == "memory" or "mode=memory" in database):
        raise GfsimError(f"`storage` {url}: an in-memory SQLite database lasts one connection, "
                         "so the study would be lost and workers could not share it; give a "
                         "file (sqlite:///NAME.db), or leave `storage` out for a journal file")
    unlocked = [k for k in _UNLOCKED if k in query or re.search(rf"[?&]{k}=", database)]
    if unlocked:
        raise GfsimError(f"`storage` {url}: sets {unlocked[0]}, which turns SQLite's locking "
                         "off or has it trust that nothing writes; Optuna's heartbeat and "
                         "workers write at once and would break the study: leave it out")
    path = database[5:].split("?", 1)[0] if database.startswith("file:") else database
    _check_file(url, path, rows)


# URI parameters under which concurrent writers are unsafe (vfs=unix-none has no locks)
_UNLOCKED = ("vfs", "nolock", "immutable")


_SYSTEM = ("/proc/", "/sys/", "/dev/")


def _check_file(url: str, path: str, rows: bool = True) -> None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:  # Optuna makes it
        return
    except OSError as exc:
        raise GfsimError(f"`storage` {url}: cannot be opened ({exc.strerror})") from None
    real = os.path.realpath(path)
    if not stat.S_ISREG(mode) or (real + "/").startswith(_SYSTEM):
        raise GfsimError(f"`storage` {url}: {path} is not a regular file"
                         f"{' (it leads to ' + _show(real) + ')' if real != path else ''}; "
                         "an SQLite study must be a file")
    if os.stat(path).st_size == 0:
        return
    what, bad = _inspect(url, path, rows)
    if bad is not None:
        raise GfsimError(f"`storage` {url}: {bad}, which Optuna never writes; a foreign or "
                         "damaged study is not opened (the file is left as it is)")
    if what is not None:
        raise GfsimError(f"`storage` {url}: holds {what}, SQL that Optuna's schema does not "
                         "have and that reading or writing the study could run; a foreign "
                         "study is not opened: drop it if you trust the file, or tune in a "
                         "fresh one")


def _inspect(url: str, path: str, rows: bool) -> tuple[str | None, str | None]:
    """The file's own SQL (``_foreign_sql``) and, when it has none and ``rows``, what is wrong
    with its rows (``rdb_rows.bad_row``), read without a trace: a ``-shm`` file the read made
    is removed."""
    import sqlite3
    from urllib.parse import quote

    from gfsim.tuning.rdb_rows import bad_row

    shm = path + "-shm"
    had_shm = os.path.lexists(shm)
    try:
        con = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=ro", uri=True,
                              timeout=10)
    except sqlite3.Error as exc:
        raise GfsimError(f"`storage` {url}: cannot be opened ({exc})") from None
    try:
        what = _foreign_sql(con)
        return what, (bad_row(con) if rows and what is None else None)
    except (sqlite3.Error, UnicodeDecodeError) as exc:  # not a database, a corrupt one
        what = "its schema is not UTF-8" if isinstance(exc, UnicodeDecodeError) else exc
        raise GfsimError(f"`storage` {url}: is not an SQLite database Optuna can read "
                         f"({what}); the file is left as it is") from None
    except RecursionError:
        raise GfsimError(f"`storage` {url}: holds values nested too deep to read; the "
                         "file is left as it is") from None
    finally:
        con.close()
        if not had_shm and os.path.lexists(shm):
            os.unlink(shm)


def _foreign_sql(con) -> str | None:
    """The first piece of SQL in the file open on ``con`` that writes would run: a trigger,
    a view, a virtual table, an index on an expression, a generated column; None if none."""
    rows = con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    for kind, name, table, sql in rows:
        shown = _show(name)
        if kind == "trigger":
            return f"a trigger {shown} on table {_show(table)}"
        if kind == "view":
            return f"a view {shown}"
        if kind == "table" and re.match(r"\s*CREATE\s+VIRTUAL\b", sql or "", re.I):
            return f"a virtual table {shown}"
        if kind == "index" and sql and not _PLAIN_INDEX.fullmatch(sql):
            return f"an index {shown} on an expression or with a condition"
    for kind, name, _, _ in rows:
        if kind == "table" and name in OPTUNA_TABLES:
            hidden = [c[1] for c in con.execute(f'PRAGMA table_xinfo("{name}")')
                      if c[6] in (2, 3)]
            if hidden:
                return f"a generated column {_show(hidden[0])} in table {name}"
    return None


def _show(name) -> str:
    """A name from the file, quoted, without control characters, at most 80 characters."""
    text = "".join(c if c.isprintable() else "?" for c in str(name))
    return repr(text[:80])
