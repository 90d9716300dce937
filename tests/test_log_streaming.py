"""The log reader streams (issue 52, item 3): a log's text is read, or inflated, a chunk of
whole lines at a time and decoded into the columns, so what a load holds is its columns and
one chunk, never the text. A gzip of blank lines just under the bomb ratio was inflated whole
before this (and refused for memory under a cap far above what streaming needs); line numbers
and messages must come out the same whatever the chunk size."""

from __future__ import annotations

import gzip
import json
import os
import random
import resource
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest

import gfsim.replay_logs.io as log_io
from gfsim.core.errors import LogError
from gfsim.core.inputs import size_text
from gfsim.replay_logs import load_log
from gfsim.replay_logs.io import TruncatedTailWarning
from gfsim.replay_logs.shipped import shipped_path

DATA = Path(__file__).parent / "data"
TINY = DATA / "tiny.jsonl"
HANG_S = 120  # a guard against a hang, not a timing: the load takes a few seconds
# Run from here, not the checkout's root (there ``python -c`` imports the checkout's gfsim/).
HERE = Path(__file__).parent


def _blank_gzip(path: Path, text_mib: int) -> int:
    """A log of a valid header then ``text_mib`` MiB of whitespace-only lines (8 KiB each,
    a tab at a random place in every 250 bytes), about 80x compressed: just under the 100x a
    bomb is. One 64 KiB gzip member repeated: written in milliseconds. Returns its text size."""
    rnd = random.Random(1)
    block = bytearray(b" " * (1 << 16))
    for k in range(0, len(block) - 250, 250):
        block[k + rnd.randrange(250)] = 9
    for k in range(8191, len(block), 8192):
        block[k] = 10
    head = TINY.read_bytes().split(b"\n", 1)[0] + b"\n"
    path.write_bytes(gzip.compress(head, mtime=0)
                     + gzip.compress(bytes(block), 6, mtime=0) * (text_mib * 16))
    return len(head) + (text_mib << 20)


def test_a_gzip_of_blank_lines_is_streamed_not_held(tmp_path):
    """640 MiB of text from 8 MB of gzip, loaded in a fresh process whose address space is
    capped at 768 MiB (about 550 MiB of it is the interpreter and its libraries): held whole,
    the text does not fit ('not enough memory to decompress it'); streamed, it loads, and
    what it kept resident is far below the text."""
    gz = tmp_path / "blank.jsonl.gz"
    text = _blank_gzip(gz, 640)
    assert 50 < text / gz.stat().st_size < 100  # just under the ratio, not refused as a bomb
    cap = 768 << 20
    code = ("import sys\nfrom gfsim.replay_logs import load_log\n"
            "log = load_log(sys.argv[1])\n"
            "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')]\n"
            "print(dict(log.counts), hwm[0].split()[1])\n")

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    res = subprocess.run([sys.executable, "-c", code, str(gz)], capture_output=True,
                         text=True, timeout=HANG_S, preexec_fn=limit, cwd=HERE,
                         env={**os.environ, "GFSIM_LOG_CACHE": "off"})
    assert res.returncode == 0, res.stderr[-2000:]
    counts, peak_kib = res.stdout.rsplit(" ", 1)
    assert counts == "{'header': 1}"
    # the process's own peak (VmHWM: ru_maxrss would carry over the parent's, a pytest worker's)
    assert int(peak_kib) << 10 < text // 2  # (about 160 MB resident for 671 MB of text)


def test_a_plain_file_is_read_a_piece_at_a_time(tmp_path):
    """A header then a 640 MiB hole (a sparse file: NUL bytes, no newline), under the same
    cap: read whole, the file did not fit ('not enough memory to read its 640.0 MiB');
    read a piece at a time, its second line is counted, not held, and refused by number and
    size."""
    path = tmp_path / "sparse.jsonl"
    head = TINY.read_bytes().split(b"\n", 1)[0] + b"\n"
    path.write_bytes(head)
    os.truncate(path, 640 << 20)
    cap = 768 << 20
    code = "import sys\nfrom gfsim.replay_logs import load_log\nload_log(sys.argv[1])\n"

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    res = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, timeout=HANG_S, preexec_fn=limit, cwd=HERE,
                         env={**os.environ, "GFSIM_LOG_CACHE": "off"})
    assert res.returncode != 0
    said = res.stderr.strip().splitlines()[-1]
    line = size_text((640 << 20) - len(head))
    assert said.endswith(f"{path}:2: line is {line}, above the 64.0 MiB a log's line may "
                         "hold"), said


# -- chunk boundaries ----------------------------------------------------------------------------

def _lines() -> list[str]:
    """The tiny log followed by 120 more (valid) decisions: long enough to cross dozens of
    chunk boundaries at the small chunk size below."""
    lines = [ln for ln in TINY.read_text().splitlines() if ln.strip()]
    lines += [json.dumps({"kind": "decision", "candidate_id": "a0", "policy": "threshold",
                          "action": "measure", "score": round(0.01 * k, 2)})
              for k in range(120)]
    return lines


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of about 256 bytes (plain: pieces of 100 bytes) or 1000 (inflated a kilobyte at a
    time: smaller draws would copy zlib's unconsumed input for each)."""
    def use():
        monkeypatch.setattr(log_io, "LINE_CHUNK_BYTES", 256)
        monkeypatch.setattr(log_io, "_PIECE_BYTES", 100)
        monkeypatch.setattr(log_io, "_DRAW_BYTES", 1000)
    return use


def _write(path: Path, text: str) -> Path:
    data = text.encode("utf-8", "surrogateescape")
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    return path


def _error(path: Path) -> str:
    with pytest.raises(LogError) as info:
        load_log(path)
    return str(info.value)


DEFECTS = {  # what is put at a line: the message's tail, as the reader says it
    "bad JSON": ('{"kind": "decision", "candidate_id": "a0",', "not valid JSON"),
    "bad UTF-8": ('{"kind": "decision", "candidate_id": "a\udcff0"}', "not valid UTF-8"),
    "unknown candidate": ('{"kind": "decision", "candidate_id": "zz", "policy": "p", '
                          '"action": "measure"}', "unknown candidate 'zz'"),
    "bad field": ('{"kind": "decision", "candidate_id": "a0", "policy": "p", '
                  '"action": "jump"}', "field 'action'"),
}


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
@pytest.mark.parametrize("defect", list(DEFECTS))
@pytest.mark.parametrize("blanks", [0, 3])
@pytest.mark.parametrize("at", [20, 57, 101])
def test_an_error_after_a_chunk_boundary_names_its_line(tmp_path, small_chunks, suffix,
                                                        defect, blanks, at):
    """A defect on a line far past the first chunk is named at that line, with blank lines
    before it counted (they send the log to the validating reader) or not (the fast reader
    gives up and the validating reader names it), and the message is the one a single
    chunk gives."""
    bad, said = DEFECTS[defect]
    lines = _lines()
    lines[at:at] = [""] * blanks + [bad]
    path = _write(tmp_path / f"log{suffix}", "\n".join(lines) + "\n")
    whole = _error(path)
    small_chunks()
    chunked = _error(path)
    assert chunked == whole
    assert chunked.startswith(f"{path}:{at + blanks + 1}: ") and said in chunked


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_a_line_too_long_is_named_by_line_and_size_however_it_is_chunked(
        tmp_path, monkeypatch, small_chunks, suffix):
    """A line past the limit is counted, not held, across many chunks and pieces, and is
    refused by number and whole size; the lines before it are read first."""
    monkeypatch.setattr(log_io, "MAX_LINE_BYTES", 2000)
    lines = _lines()
    long_line = json.dumps({"kind": "decision", "candidate_id": "a0", "policy": "p",
                            "action": "measure", "reason": "x" * 5000})
    lines[40:40] = [long_line]
    path = _write(tmp_path / f"long{suffix}", "\n".join(lines) + "\n")
    whole = _error(path)
    small_chunks()
    chunked = _error(path)
    assert chunked == whole == (f"{path}:41: line is {len(long_line):,} bytes, above the "
                                "2,000 bytes a log's line may hold")
    lines[10] = lines[10][:-1]  # an earlier defect is said first, in a chunk or in one
    path = _write(tmp_path / f"long-and-bad{suffix}", "\n".join(lines) + "\n")
    assert _error(path).startswith(f"{path}:11: not valid JSON")
    monkeypatch.setattr(log_io, "LINE_CHUNK_BYTES", 16 << 20)
    assert _error(path).startswith(f"{path}:11: not valid JSON")


def _tables(log) -> list:
    return [log.header, log.runs, log.steps, log.counts, log.candidates, log.forecasts,
            log.decisions, log.evaluations, log.forecast_errors]


def _same_tables(a, b) -> None:
    for x, y in zip(_tables(a), _tables(b)):
        if isinstance(x, pd.DataFrame):
            pd.testing.assert_frame_equal(x, y, check_dtype=True, check_exact=True)
        else:
            assert x == y


@pytest.mark.parametrize("source", ["tiny.jsonl", "tiny-no-forecasts.jsonl", "decisions.jsonl",
                                    "decisions.jsonl.gz", "synthetic-mini"])
def test_the_tables_do_not_depend_on_the_chunk_size(tmp_path, monkeypatch, small_chunks,
                                                    source):
    monkeypatch.setenv("GFSIM_LOG_CACHE", "off")
    if source.startswith("tiny"):
        path = DATA / source
    elif source.startswith("decisions"):
        path = _write(tmp_path / source, "\n".join(_lines()) + "\n")
    else:
        path = shipped_path(source)
    whole = load_log(path)
    small_chunks()
    _same_tables(load_log(path), whole)


def test_a_gzip_cut_by_a_crash_keeps_its_complete_lines_whatever_the_chunk_size(
        tmp_path, small_chunks):
    """A gzip stream that ends early keeps the complete lines before the cut, counted across
    chunks as in one (the warning's count), and drops the unfinished one."""
    text = "\n".join(_lines()) + "\n"
    whole_gz = gzip.compress(text.encode(), mtime=0)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole_gz[:int(len(whole_gz) * 0.8)])
    d = __import__("zlib").decompressobj(wbits=31)
    kept = d.decompress(path.read_bytes()).count(b"\n")

    def load():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            log = load_log(path)
        return log, [str(w.message) for w in caught if w.category is TruncatedTailWarning]

    whole, said = load()
    small_chunks()
    chunked, said_chunked = load()
    assert said == said_chunked == [f"{path}: gzip stream ends early (crash during a write?); "
                                    f"kept the {kept} complete lines before the cut"]
    assert sum(chunked.counts.values()) == kept  # (no blank line in it)
    _same_tables(chunked, whole)


def _many_records(path: Path, candidates: int) -> None:
    """tiny.jsonl's header, run and first step, then ``candidates`` copies of its first
    candidate record under new ids (a valid log)."""
    records = [json.loads(x) for x in TINY.read_text().splitlines()]
    head = [r for r in records if r["kind"] in ("header", "run")][:2]
    first_step = next(r for r in records if r["kind"] == "step")
    cand = next(r for r in records if r["kind"] == "candidate"
                and r["search_id"] == first_step["search_id"] and r["step"] == first_step["step"])
    out = [json.dumps(r) for r in (*head, first_step)]
    for k in range(candidates):
        out.append(json.dumps({**cand, "candidate_id": f"many-{k}", "seq": k}))
    path.write_text("\n".join(out) + "\n")


@pytest.mark.parametrize("reader", ["fast", "validating"])
def test_a_log_whose_records_pass_the_memory_budget_is_refused_by_line(tmp_path, monkeypatch,
                                                                      reader):
    """A log's columns are bounded by the memory budget (GFSIM_MEMORY_BUDGET), checked as it
    is read: past it, one line naming the file, the line reached and the budget, before the
    rest is read; under it the same log loads."""
    import gfsim.replay_logs.log as log_mod

    log = tmp_path / "many.jsonl"
    _many_records(log, 70_000)
    if reader == "validating":
        monkeypatch.setattr(log_mod, "_fast_columns", lambda path, text: None)
    monkeypatch.setenv("GFSIM_MEMORY_BUDGET", "20MB")
    with pytest.raises(log_mod.LogTooLargeError) as info:
        load_log(log)
    msg = str(info.value)
    assert msg.startswith(f"{log}:") and "records by this line" in msg
    assert "GFSIM_MEMORY_BUDGET" in msg and "\n" not in msg
    line = int(msg.split(":")[1])
    assert 2 <= line <= 70_002
    monkeypatch.setenv("GFSIM_MEMORY_BUDGET", "2GB")
    assert len(load_log(log).candidates) == 70_000
