"""Issue 52, deliver 5 (the importers' half) and 6: no key of another tool's file gives a
traceback (one helper, ``parse_key``, parses them all), a run folder's reads stay inside it,
every table and JSON output escapes C0, C1 and bidi characters, and a CPU-clock figure carries
its UNTRUSTED caveat once."""

import io
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.core.errors import GfsimError
from gfsim.importers.common import parse_key

DATA = Path(__file__).parent / "data"
KB = DATA / "kernelbench"
KB_BASE = KB / "baseline_time_torch.json"
OE_RUN = DATA / "openevolve" / "run"
runner = CliRunner()
HUGE = "9" * 5000  # int() refuses more than 4,300 digits (ValueError)


# -- one helper for every importer's ids and keys ---------------------------------------------

@pytest.mark.parametrize("value", ["²", "١", "-1", "+1", " 1", "1.0", "", HUGE, "1" * 19, 1.5,
                                   float("inf"), True, None, [1], -3, 10 ** 18])
def test_parse_key_refuses_what_is_not_a_plain_ascii_decimal_in_one_line(value):
    with pytest.raises(GfsimError) as got:
        parse_key(value, "f.json", "problem key")
    text = str(got.value)
    assert text.startswith("f.json: problem key ") and "\n" not in text and len(text) < 200


@pytest.mark.parametrize("value, number", [("0", 0), ("0042", 42), (7, 7),
                                           ("9" * 18, 10 ** 18 - 1)])
def test_parse_key_takes_plain_decimals(value, number):
    assert parse_key(value, "f.json", "problem key") == number


def _kernelbench(tmp_path, shape, data=None, raw=None) -> Path:
    run = tmp_path / "run"
    shutil.copytree(KB / "runs" / shape, run)
    if data is not None:
        (run / "eval_results.json").write_text(json.dumps(data(json.loads(
            (run / "eval_results.json").read_text()))))
    if raw is not None:
        (run / "eval_results.json").write_text(raw)
    return run


def _import_kb(run: Path, tmp_path: Path):
    return runner.invoke(app, ["import", "kernelbench", str(run), "--baseline", str(KB_BASE),
                               "-o", str(tmp_path / "log.jsonl")])


@pytest.mark.parametrize("shape, data, raw, words", [
    ("by_level", lambda d: {HUGE: d["1"]}, None, "level key"),
    ("by_level", lambda d: {"1": {HUGE: d["1"]["1"]}}, None, "problem key"),
    ("by_level", lambda d: {"1": {"1": {HUGE: d["1"]["1"]["0"]}}}, None, "sample id"),
    ("by_level", lambda d: {"1": {"1": {"²": d["1"]["1"]["0"]}}}, None, "sample id '²'"),
    ("by_level", lambda d: {"1": {"١": d["1"]["1"]}}, None, "problem key '١'"),
    ("list", lambda d: {"1": [dict(d["1"][0], sample_id="²")]}, None, "sample id '²'"),
    ("list", None, '{"1": [{"sample_id": ' + HUGE + ', "compiled": true, "correctness": false}]}',
     "sample id"),
])
def test_kernelbench_keys_are_one_line_naming_file_and_field(tmp_path, shape, data, raw, words):
    res = _import_kb(_kernelbench(tmp_path, shape, data, raw), tmp_path)
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    line = res.output.strip()
    assert "\n" not in line and "eval_results.json" in line and words in line, line
    assert not (tmp_path / "log.jsonl").exists()


def test_kernelbench_does_not_follow_eval_results_out_of_the_run_folder(tmp_path):
    run = _kernelbench(tmp_path, "list")
    outside = tmp_path / "elsewhere.json"
    (run / "eval_results.json").rename(outside)
    (run / "eval_results.json").symlink_to(outside)
    res = _import_kb(run, tmp_path)
    assert res.exit_code == 2 and "leads outside" in res.output, res.output
    assert not (tmp_path / "log.jsonl").exists()


def _openevolve(tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(OE_RUN, run)
    return run


def _import_oe(run: Path, tmp_path: Path):
    return runner.invoke(app, ["import", "openevolve", str(run), "-o", str(tmp_path / "l.jsonl"),
                               "--runtime-metric", "runtime_ns", "--json"])


def test_openevolve_iteration_of_5000_digits_is_one_line(tmp_path):
    run = _openevolve(tmp_path)
    log = next((run / "logs").glob("*.log"))
    log.write_text(log.read_text().replace("Iteration 2:", f"Iteration {HUGE}:", 1))
    res = _import_oe(run, tmp_path)
    assert res.exit_code == 2 and "iteration" in res.output and log.name in res.output, \
        res.output


def test_openevolve_logs_link_out_of_the_run_folder_is_refused(tmp_path):
    run = _openevolve(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()  # no .log files: the programs only the logs held would vanish silently
    shutil.rmtree(run / "logs")
    (run / "logs").symlink_to(elsewhere)
    res = _import_oe(run, tmp_path)
    assert res.exit_code == 2 and "logs: leads outside" in res.output, res.output


def test_openevolve_logs_without_log_files_say_what_is_lost(tmp_path):
    whole = _import_oe(OE_RUN, tmp_path)
    assert whole.exit_code == 0, whole.output
    assert "logs_note" not in json.loads(whole.output)
    run = _openevolve(tmp_path)
    for f in (run / "logs").glob("*.log"):
        f.unlink()
    res = _import_oe(run, tmp_path)
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["candidates"] < json.loads(whole.output)["candidates"]
    assert "only the logs name" in got["logs_note"]


def test_gpu_forecasters_bin_of_infinity_is_one_line():
    from gfsim.importers.gpu_forecasters import _probs

    with pytest.raises(GfsimError, match="bin inf"):
        _probs([{"bin": float("inf"), "p": 1.0}], "f.jsonl:1")
    with pytest.raises(GfsimError, match="bin 1.5"):  # was read as bin 1
        _probs([{"bin": 1.5, "p": 1.0}], "f.jsonl:1")
    assert _probs([{"bin": 2.0, "p": 1.0}], "f.jsonl:1")[1] == 1.0


# -- every table and every JSON output escapes C0, C1 and bidi characters ---------------------

EVIL = "\x1b[31mRED\x1b]0;pwned\x07\x85\u202eevil\u2066\x00\u200f\u061c"
ACTS = "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"


def _evil_log(tmp_path) -> Path:
    """The tiny fixture with a task, a search and a forecaster named with terminal escapes,
    C1 and bidi characters and a NUL."""
    text = (DATA / "tiny.jsonl").read_text()
    for name in ("alpha-s0", "alpha", "fixture-fc"):
        text = text.replace(f'"{name}"', json.dumps(name + EVIL))
    path = tmp_path / "evil.jsonl"
    path.write_text(text)
    return path


def test_tune_tables_show_a_logs_controls_escaped(tmp_path, monkeypatch):
    import re

    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["tune", "-l", str(_evil_log(tmp_path)), "--param",
                              "tau=0.1:0.9", "--trials", "2"])
    assert res.exit_code == 0, res.output
    assert "leave one task out" in res.output and "alpha\\x1b[31m" in res.output
    assert re.findall(ACTS, res.output) == []


def test_replay_json_escapes_c1_and_bidi_and_reads_back_the_same(tmp_path):
    import re

    res = runner.invoke(app, ["replay", "-l", str(_evil_log(tmp_path)), "--json"])
    assert res.exit_code == 0, res.output
    assert re.findall(ACTS, res.output) == []
    assert "\\u0085\\u202eevil\\u2066" in res.output
    assert any(t.get("task_id") == "alpha" + EVIL
               for t in json.loads(res.output)["searches"])


def test_every_table_cell_title_and_printed_text_is_escaped():
    import re

    from gfsim.cli.common import Table, console, json_bytes

    out = io.StringIO()
    con = console(width=200, file=out)
    table = Table("task" + EVIL, title="t" + EVIL)
    table.add_row("a" + EVIL)
    con.print(table)
    con.print("plain " + EVIL, markup=False)
    shown = out.getvalue()
    assert re.findall(ACTS, shown) == [] and shown.count("\\x1b[31m") == 4
    assert re.findall(ACTS, json_bytes({"k" + EVIL: EVIL}).decode()) == []
    assert json.loads(json_bytes({"k" + EVIL: EVIL})) == {"k" + EVIL: EVIL}


# -- a CPU-clock figure carries its UNTRUSTED caveat, once -------------------------------------

def _forged(tmp_path, header: bool) -> Path:
    """The tiny fixture whose successes say they were timed on the CPU clock, one of them a
    forged 133,253x; ``header``: with the header's ``timing_trust`` that ``gfsim live
    --trust-cpu-clock`` writes (else a log edited to drop it)."""
    from gfsim.live.driver import CPU_CLOCK_NOTE

    recs = [json.loads(line) for line in (DATA / "tiny.jsonl").read_text().splitlines()]
    for r in recs:
        if r["kind"] == "evaluation" and r["outcome"] == "success":
            r.update(timing_clock="wall", timing_trusted=False)
            if r["candidate_id"] == "a0":
                r.update(speedup=133253.0, runtime_ns=r["ref_runtime_ns"] / 133253.0)
    if header:
        recs[0]["provenance"]["timing_trust"] = CPU_CLOCK_NOTE
    path = tmp_path / f"forged-{header}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


@pytest.mark.parametrize("header", [True, False])
@pytest.mark.parametrize("command", [["recommend", "--candidate", "topk:2", "--seeds", "1",
                                      "--fresh-seeds", "0", "--driver", "trace"],
                                     ["replay"], ["savings", "--seeds", "1"]])
def test_every_command_shows_the_untrusted_caveat_once(tmp_path, command, header):
    res = runner.invoke(app, [*command, "-l", str(_forged(tmp_path, header))])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())  # (rich folds long lines)
    assert text.count("UNTRUSTED") == 1, text
    assert "can forge" in text


def test_a_log_without_cpu_clock_marks_has_no_untrusted_caveat():
    from gfsim.replay_logs import load_log
    from gfsim.replay_logs.shipped import untrusted_timings

    assert untrusted_timings(load_log(DATA / "tiny.jsonl")) is None


# -- a seal.key that is a folder ----------------------------------------------------------------

def test_a_seal_key_that_is_a_folder_is_one_line_and_replay_runs(tmp_path, monkeypatch):
    from gfsim.replay_logs import seal

    monkeypatch.setenv("GFSIM_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache" / "seal.key").mkdir(parents=True)  # IsADirectoryError on every replay
    seal._key_at.cache_clear()
    try:
        for _ in range(2):
            res = runner.invoke(app, ["replay", "-l", str(DATA / "tiny.jsonl")])
            assert res.exit_code == 0, res.output
            assert res.exception is None
        assert not seal.available()
    finally:
        seal._key_at.cache_clear()
    with pytest.warns(UserWarning, match=r"seal.key: the cache's key is not a regular file"):
        assert seal.seal(b"tables") is None
    seal._key_at.cache_clear()


# -- --trust-candidates without a PID namespace: a setsid grandchild dies with close() ----------

def _processes_named(name: str) -> list[int]:
    import os

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as fh:
                comm = fh.read().strip()
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if comm == name and state != "Z":
            found.append(int(pid))
    return found


def test_a_detached_grandchild_does_not_outlive_a_degraded_sandbox(tmp_path):
    """On a machine without namespaces (the measurer run with --trust-candidates), killing a
    sandbox's process group missed a grandchild that called setsid(): it held its memory
    (2.2 GB in the issue) after close(). The zygote adopts it as subreaper and kills it."""
    import os
    import signal
    import time

    pytest.importorskip("torch")
    pytest.importorskip("triton")
    import gfsim.live.measure.measurer as mod
    from gfsim.live.candidates import CodeCandidate
    from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer
    from gfsim.live.measure.sandbox import Facilities

    class NoNamespaces(TritonMeasurer):
        def _start_zygote(self):
            real = mod.Zygote

            class Degraded(real):
                def __init__(self, *a, **k):
                    super().__init__(*a, **k)
                    self.facilities = Facilities(landlock_abi=self.facilities.landlock_abi,
                                                 seccomp=self.facilities.seccomp)

            mod.Zygote = Degraded
            try:
                return super()._start_zygote()
            finally:
                mod.Zygote = real

    name = f"gfleak{os.getpid() % 10 ** 6}"
    code = f"""
import os, time, ctypes
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        ctypes.CDLL(None).prctl(15, b"{name}", 0, 0, 0)
        hold = bytearray(50 * 2**20)
        time.sleep(120)
    os._exit(0)
os.wait()
import torch
def run(x):
    e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)
"""
    m = NoNamespaces("softmax", MeasurerConfig(compile_timeout_s=60, check_timeout_s=20,
                                               trust_candidates=True), workdir=tmp_path)
    try:
        r = m.measure(CodeCandidate("softmax", code))
        assert r["outcome"] != "compile_failed", r
        assert not m.facilities.pid_ns
    finally:
        m.close()
    for _ in range(100):  # (SIGKILL is delivered, not instant: a hang guard)
        left = _processes_named(name)
        if not left:
            break
        time.sleep(0.05)
    for pid in left:  # what the old code left behind, not left to the machine
        os.kill(pid, signal.SIGKILL)
    assert left == []


def test_a_warning_naming_a_logs_path_is_escaped(tmp_path):
    import re

    log = tmp_path / f"cut{EVIL.replace(chr(0), '')}.jsonl"
    log.write_text((DATA / "tiny.jsonl").read_text() + '{"kind": "candidate", "cand')
    res = runner.invoke(app, ["validate", str(log), "--allow-truncated"])
    assert "gfsim: warning:" in res.output and "cut\\x1b[31m" in res.output, res.output
    assert re.findall(ACTS, res.output) == []
