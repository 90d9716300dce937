"""Memory bounded by what the input justifies (issue 52): each command runs in a fresh process
under an address-space cap (``RLIMIT_AS``) and a hang guard, and must end in its result or in
one line naming the file, never in a MemoryError, a traceback or a wait. Each case failed on
main f85b4f7: a sparse OpenEvolve log cost five times its size, a /proc link was read to the
limit and joined (2.1x the limit), a gzip's text was held twice, a run record's lying shape
ran into a MemoryError, and settings files skipped every input limit."""

from __future__ import annotations

import gzip
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
OPENEVOLVE_RUN = DATA / "openevolve" / "run"
CAP = 1 << 30  # address space of each command: gfsim's own needs stay under 0.5 GiB
HANG_S = 60  # a guard against a hang, not a timing: each command takes a few seconds
# Commands run from here, not the checkout's root: there `python -c` would import the checkout's
# gfsim/ instead of the install under test.
HERE = Path(__file__).parent


def gfsim(*args, cap: int = CAP, env: dict | None = None, stdin=subprocess.DEVNULL):
    """(exit status, stdout, stderr) of ``gfsim ARGS`` in a fresh process under ``cap``."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    full_env = {**os.environ, "GFSIM_CACHE_DIR": os.environ.get("GFSIM_CACHE_DIR", ""),
                **(env or {})}
    full_env = {k: v for k, v in full_env.items() if v != ""}
    res = subprocess.run([sys.executable, "-c", "from gfsim.cli.main import main; main()",
                          *map(str, args)], capture_output=True, text=True, timeout=HANG_S,
                         preexec_fn=limit, env=full_env, stdin=stdin, cwd=HERE)
    return res.returncode, res.stdout, res.stderr


def one_line_error(rc: int, err: str) -> str:
    """The error line of a command that must have refused its input cleanly."""
    assert "Traceback" not in err and "MemoryError" not in err, err[-2000:]
    lines = [ln for ln in err.splitlines() if ln.strip() and "warning" not in ln
             and not ln.startswith(("Usage: ", "Try '"))]  # (click's frame of a bad option)
    assert rc == 2 and len(lines) == 1, (rc, err[-2000:])
    return lines[0]


# -- side files: an OpenEvolve run's logs/*.log --------------------------------------------------

def test_a_sparse_openevolve_log_is_streamed_not_held(tmp_path):
    """512 MiB of a sparse log (no disk used) under a 1 GiB cap: read whole, decoded and copied
    into a StringIO it needed five times its size; streamed, it needs a line."""
    run = tmp_path / "run"
    shutil.copytree(OPENEVOLVE_RUN, run)
    with open(run / "logs" / "sparse.log", "wb") as fh:
        fh.truncate(512 << 20)
    out = tmp_path / "out.jsonl"
    rc, stdout, err = gfsim("import", "openevolve", run, "-o", out, "--runtime-metric",
                            "runtime_ns", "--openevolve-version", "0.4.1")
    assert rc == 0, err[-2000:]
    assert out.stat().st_size > 0


# -- a file's true size is what was read ----------------------------------------------------------

def test_a_log_that_links_to_proc_is_refused_in_one_line(tmp_path):
    log = tmp_path / "log.jsonl"
    log.symlink_to("/proc/self/pagemap")  # says 0 bytes, holds gigabytes
    rc, _, err = gfsim("validate", log, env={"GFSIM_MAX_INPUT_BYTES": str(256 << 20)})
    line = one_line_error(rc, err)
    assert "log.jsonl: is a kernel pseudo-file" in line


def test_a_file_that_reads_past_its_stated_size_is_read_once_within_the_limit(tmp_path):
    """The bounded reader itself, on a file it is not told to refuse: /proc/self/pagemap read
    to a 512 MiB limit under a 1 GiB cap. Gathered as pieces and joined, it needed 2.1x the
    limit and ended in 'not enough memory'; read into one buffer, it is refused by its size."""
    code = ("import gfsim.core.inputs as i\n"
            "i._pseudo_devices = set\n"
            "try:\n    i.read_file('/proc/self/pagemap', 'log file')\n"
            "except i.InputError as e:\n    print(e)\n")

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=HANG_S, preexec_fn=limit, cwd=HERE,
                         env={**os.environ, "GFSIM_MAX_INPUT_BYTES": str(512 << 20)})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "is above the 512.0 MiB gfsim reads" in res.stdout, res.stdout


def _near_bomb(size_mib: int) -> bytes:
    """A gzip stream that inflates about 90x (just under the 100x a bomb is): spaces with a
    random capital every 230 bytes, after a valid header line."""
    rnd = random.Random(1)
    block = bytearray(b" " * (1 << 16))
    for k in range(0, len(block), 230):
        block[k] = rnd.randrange(65, 91)
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    parts = [z.compress(b'{"kind":"header"}\n')]
    parts += [z.compress(bytes(block)) for _ in range(size_mib * 16)]
    return b"".join(parts + [z.compress(b"\n"), z.flush()])


def test_a_gzip_just_under_the_bomb_ratio_is_inflated_once(tmp_path):
    """384 MiB of text from 4 MB of gzip under a 1 GiB cap: joined from its pieces, the text
    was held twice and ended in 'not enough memory'; inflated into one buffer, it is held
    once and its text is what it is."""
    gz = tmp_path / "near.jsonl.gz"
    gz.write_bytes(_near_bomb(384))
    stored = gz.stat().st_size
    assert 50 < (384 << 20) / stored < 100  # just under the ratio, not refused as a bomb
    code = ("import sys\nfrom pathlib import Path\n"
            "from gfsim.replay_logs.io import decompress, read_raw\n"
            "p = Path(sys.argv[1])\n"
            "data, cut = decompress(p, read_raw(p))\n"
            "print(len(data), cut)\n")

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

    res = subprocess.run([sys.executable, "-c", code, str(gz)], capture_output=True,
                         text=True, timeout=HANG_S, preexec_fn=limit, cwd=HERE)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == [str(18 + (384 << 20) + 1), "False"]


# -- shapes the log does not support -------------------------------------------------------------

def _lying_log(tmp_path: Path) -> Path:
    from gfsim.replay_logs.shipped import shipped_path

    lines = gzip.decompress(shipped_path("h200-costmodel-all").read_bytes()).splitlines()
    out = []
    for line in lines:
        rec = json.loads(line)
        if rec["kind"] == "run":  # 10^4 samples x F 10^3: 10^7 children per parent
            rec["configuration"]["search"].update(samples_per_parent=10**4, overgen=10**3)
        out.append(json.dumps(rec))
    log = tmp_path / "lying.jsonl"
    log.write_text("\n".join(out) + "\n")
    return log


def test_a_run_record_that_lies_about_its_shape_is_refused_before_any_work(tmp_path):
    """It ran a minute into a MemoryError traceback under a 4 GB cap (past the hang guard
    under this test's cap); now one line naming the search and the field."""
    rc, _, err = gfsim("replay", "--log", _lying_log(tmp_path), "--driver", "puct")
    line = one_line_error(rc, err)
    assert "lying.jsonl: search 'live-" in line
    assert "10,000,000 children per parent" in line and "does not support" in line


def test_a_shape_above_the_memory_budget_is_refused_in_one_line():
    """--samples-per-parent 100 --overgen 10 draws 72,000 candidates (140 MiB by the
    estimate): it ran on main; under a 100 MB budget it is refused before any work."""
    rc, _, err = gfsim("replay", "--log", "h200-costmodel-all", "--driver", "puct",
                       "--samples-per-parent", "100", "--overgen", "10",
                       env={"GFSIM_MEMORY_BUDGET": "100MB"})
    line = one_line_error(rc, err)
    assert "would draw 72,000 candidates" in line and "memory budget (GFSIM_MEMORY_BUDGET)" \
        in line
    rc, _, err = gfsim("replay", "--log", "h200-costmodel-all", "--driver", "puct",
                       env={"GFSIM_MEMORY_BUDGET": "a lot"})
    assert "GFSIM_MEMORY_BUDGET: expected an amount of memory" in one_line_error(rc, err)


# -- settings files ------------------------------------------------------------------------------

def _config(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / "settings.toml"
    if kind == "fifo":
        os.mkfifo(path)  # blocked for ever
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")  # passed 3 GB in 5 s
    elif kind == "dotted-keys":
        path.write_text("a" + ".a" * 100_000 + " = 1\n")  # passed 4 GB
    elif kind == "deep-arrays":
        path.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")  # RecursionError
    elif kind == "deep-tables":
        path.write_text("x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n")  # RecursionError
    elif kind == "too-large":
        path.write_text("# " + "x" * (2 << 20) + "\n")
    return path


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "dotted-keys", "deep-arrays",
                                  "deep-tables", "too-large"])
def test_a_settings_file_is_read_within_a_logs_limits(tmp_path, kind):
    rc, _, err = gfsim("replay", "--log", "synthetic-mini", "--config", _config(tmp_path, kind))
    line = one_line_error(rc, err)
    assert "settings.toml: " in line
    expect = {"fifo": "is not a regular file", "dev-zero": "is not a regular file",
              "dotted-keys": "a dotted key of more than 32 parts",
              "deep-arrays": "nested more than 32 deep", "deep-tables": "nested more than 32 deep",
              "too-large": "above the 1.0 MiB such a file may hold"}[kind]
    assert expect in line


def test_an_unknown_settings_key_is_echoed_escaped(tmp_path):
    cfg = tmp_path / "settings.toml"
    cfg.write_text('"\\u001b]0;PWNED\\u0007\\u001b[2Jevil\\u202e" = 1\n')
    rc, _, err = gfsim("replay", "--log", "synthetic-mini", "--config", cfg)
    line = one_line_error(rc, err)
    assert "not an option of gfsim replay" in line
    assert "\x1b" not in err and "\x07" not in err and "\u202e" not in err
    assert "\\x1b]0;PWNED\\x07" in line


def test_a_settings_file_with_many_keys_still_reads(tmp_path):
    """The limits are far above what a person writes: the documented example file reads."""
    from gfsim.core.settings_file import read_settings

    text = "\n".join(f'k{i}.a.b = {{x = [1.5, 2.5, "a.b.c"], y = "[{{"}}' for i in range(2000))
    path = tmp_path / "settings.toml"
    path.write_text(text + "\n[replay]\npolicy = 'all'\n")
    data = read_settings(path)
    assert len(data) == 2001 and data["k7"]["a"]["b"]["x"] == [1.5, 2.5, "a.b.c"]


def test_a_cost_model_file_is_read_as_a_settings_file(tmp_path):
    """``--cost FILE.toml`` took any size and nesting: 3,000 nested arrays gave a
    RecursionError traceback."""
    cost = tmp_path / "cost.toml"
    cost.write_text('base = "serverless-a100"\nx = ' + "[" * 3000 + "]" * 3000 + "\n")
    rc, _, err = gfsim("replay", "--log", "synthetic-mini", "--cost", cost)
    assert "cost.toml: nested more than 32 deep" in one_line_error(rc, err)


@pytest.mark.parametrize("gz", [False, True])
def test_a_streamed_side_file_keeps_every_line_and_its_number(tmp_path, monkeypatch, gz):
    """Lines cut across the reader's chunks, runs of blank lines and a last line without its
    newline come out as a whole read splits them, numbered alike; a long line is cut at the
    cap, or refused by its number."""
    from gfsim.core.errors import LogError
    from gfsim.replay_logs import io as log_io

    monkeypatch.setattr(log_io, "_CHUNK_BYTES", 7)
    rnd = random.Random(3)
    lines = ["x" * rnd.randrange(0, 30) for _ in range(200)] + ["tail"]
    text = "\n".join(lines).encode()
    path = tmp_path / ("side.log.gz" if gz else "side.log")
    path.write_bytes(gzip.compress(text) if gz else text)
    expect = [(n, line.encode()) for n, line in enumerate(lines, 1) if line]
    assert list(log_io.iter_input_lines(path)) == expect
    cut = list(log_io.iter_input_lines(path, max_line_bytes=10, cut_long=True))
    assert cut == [(n, line[:10]) for n, line in expect]
    longest = max(expect, key=lambda e: len(e[1]))
    with pytest.raises(LogError, match=rf"side.log(.gz)?:{longest[0]}: line is longer than"):
        list(log_io.iter_input_lines(path, max_line_bytes=len(longest[1]) - 1))
