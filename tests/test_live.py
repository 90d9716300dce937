"""``gfsim live`` on the CPU: the real search loop with real parts where they can run here (the
vLLM server, the Triton interpreter in the isolated measurement worker), killed and resumed;
merging runs; what a live run refuses. The GPU run itself is on the H200 (see the shipped
``h200-live-v1`` log and its fidelity test in test_fidelity.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from typer.testing import CliRunner  # noqa: E402

from gfsim.cli.main import app  # noqa: E402
from gfsim.replay_logs import load_log  # noqa: E402
from gfsim.replay_logs.io import iter_records  # noqa: E402

runner = CliRunner()
TINY_CONTEXT = 512
# Interpreter timings are on the CPU clock, whose times a candidate can forge: a run records
# them as successes only when told to (tests/test_cpu_clock.py).
SMALL = ["--measurer", "interpret", "--trust-cpu-clock", "--steps", "3", "--parents-per-step",
         "2", "--samples-per-parent", "2", "--k-per-parent", "2"]


def _records(path) -> list[dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return [rec for _, rec in iter_records(path)]
        except Exception:  # noqa: BLE001 - a file being written: try again later
            return []


def _key(rec: dict):
    return (rec["kind"], rec.get("candidate_id") or rec.get("search_id"), rec.get("step"))


def _live(tmp_path, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gfsim.cli.main", "live", *args],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def test_a_live_run_against_vllm_killed_and_resumed_loses_nothing(vllm_server, tmp_path):
    """Real forecasts from the vLLM server decide (topk:1: the best forecast of each batch), real
    Triton kernels run under the interpreter in the measurement worker; the run is killed with
    SIGKILL mid-search, then resumed: every record written before the kill is still there, nothing
    is asked, decided or measured twice, and the replay of the final log follows the logged
    search."""
    out = tmp_path / "run.jsonl.gz"
    spec = (f"vllm:{vllm_server.url},model={vllm_server.model},mode=logprobs,labels=words,"
            f"max_prompt_tokens={TINY_CONTEXT - 16}")
    args = ["--tasks", "softmax,layernorm", *SMALL, "--steps", "4", "--policy",
            "topk:1", "--forecaster", spec, "--out", str(out), "--seed", "3"]
    proc = _live(tmp_path, *args)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        recs = _records(out)
        if sum(r["kind"] == "evaluation" for r in recs) >= 4:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended before it could be killed:\n{proc.stdout.read()}"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _records(out)
    assert sum(r["kind"] == "evaluation" for r in before) >= 4
    assert sum(r["kind"] == "step" for r in before) < 8, "killed too late to test a resume"

    res = subprocess.run([sys.executable, "-m", "gfsim.cli.main", "live", *args, "--resume",
                          "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads(res.stdout)
    after = [rec for _, rec in iter_records(out)]
    # Nothing lost: every record from before the kill is in the final log, unchanged.
    final = {(_key(r), json.dumps(r, sort_keys=True)) for r in after}
    for rec in before:
        assert (_key(rec), json.dumps(rec, sort_keys=True)) in final, rec
    # Nothing twice: one candidate, decision and evaluation record per candidate, one answered
    # forecast each (the resumed session asked only the candidates that had none).
    counts = Counter(_key(r) for r in after if r["kind"] != "header")
    assert max(counts.values()) == 1, [k for k, n in counts.items() if n > 1]
    log = load_log(out)  # a valid log (a second evaluation would be an error)
    with_code = log.candidates["has_code"].sum() + \
        log.candidates["code_sha256"].notna().sum() - log.candidates["has_code"].sum()
    assert len(log.forecasts) == with_code
    assert {s["steps"] for s in summary["searches"]} == {4}
    sessions = {r["live"]["session"] for r in after if r["kind"] == "step"}
    assert sessions == {1, 2} or sessions == {2}
    # The policy read the forecasts: some candidates skipped, some measured.
    assert set(log.decisions["action"]) == {"measure", "skip"}
    # The replay re-runs exactly the logged search: no child from outside the log, the same
    # evaluations, and the GPU held for exactly the logged service seconds.
    fid = summary["fidelity"]
    assert all(r["fallback_draws"] == 0 for r in fid["searches"]), fid
    assert fid["total"]["gpu_evals"] == len(log.evaluations)
    logged_busy = float(log.evaluations["wall_s"].sum())
    assert fid["total"]["replay_gpu_busy_s"] == pytest.approx(logged_busy, rel=1e-9)
    # Interpreter speedups are labelled as such in the header, and as untrusted.
    assert log.header["timing_protocol"]["protocol"] == "cpu-wallclock"
    assert "interpreter" in log.header["provenance"]["note"]
    assert log.header["timing_protocol"]["trusted"] is False
    assert "forge" in log.header["provenance"]["timing_trust"]


def _run(tmp_path, out, *extra):
    res = runner.invoke(app, ["live", "--tasks", "softmax", *SMALL, "--out", str(out),
                              "--json", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_runs_merge_and_the_merged_log_replays_both(tmp_path):
    a, b, merged = tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz", tmp_path / "ab.jsonl.gz"
    summary = _run(tmp_path, a, "--seed", "1")
    _run(tmp_path, b, "--seed", "2")
    # CPU-clock (interpreter) successes, recorded with --trust-cpu-clock: marked untrusted in
    # every evaluation, the header and the summary.
    assert "forge" in summary["timing_trust"]
    recs = [r for _, r in iter_records(a)]
    assert recs[0]["timing_protocol"]["trusted"] is False
    assert "--trust-cpu-clock" in recs[0]["provenance"]["timing_trust"]
    wins = [r for r in recs if r["kind"] == "evaluation" and r["outcome"] == "success"]
    assert wins and all(r["timing_trusted"] is False and r["timing_clock"] == "wall"
                        for r in wins)
    res = runner.invoke(app, ["merge", str(a), str(b), "--out", str(merged), "--json"])
    assert res.exit_code == 0, res.output
    assert merged.read_bytes()[:2] == b"\x1f\x8b"  # a .gz output is gzipped
    log = load_log(merged)
    assert set(log.candidates["search_id"]) == {"live-softmax-seed1", "live-softmax-seed2"}
    assert [m["path"] for m in log.header["merged_from"]] == [str(a), str(b)]
    assert log.header["timing_protocol"]["trusted"] is False  # the mark survives a merge
    # Each search keeps the seed speedup its own run measured.
    runs = {r["search_id"]: r["seed_speedup"] for r in log.runs}
    from gfsim.live.fidelity import fidelity

    fid = fidelity(log)
    assert len(fid["searches"]) == 2 and all(r["fallback_draws"] == 0 for r in fid["searches"])
    assert runs["live-softmax-seed1"] > 0 and runs["live-softmax-seed2"] > 0
    # The same run twice does not merge: its searches would appear twice.
    res = runner.invoke(app, ["merge", str(a), str(a), "--out", str(tmp_path / "aa.jsonl")])
    assert res.exit_code == 2 and "is also in" in res.output
    res = runner.invoke(app, ["merge", str(a), "synthetic-mini", "--out",
                              str(tmp_path / "x.jsonl")])
    assert res.exit_code == 2 and "do not merge" in res.output


def test_a_duplicate_kernel_is_measured_once_and_its_code_stored_once(tmp_path):
    """With no retries the mutation operator repeats kernels; a repeat reuses the first
    measurement (zero seconds, reused_from) and the log stores each code once."""
    from gfsim.live.driver import LiveOptions, LiveRun
    from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer
    from gfsim.live.sources import MutationSource
    from gfsim.simulator.closed.engine import SearchConfig

    out = tmp_path / "dup.jsonl"
    opts = LiveOptions(tasks=["softmax"], search=SearchConfig(steps=4, parents_per_step=1,
                                                              samples_per_parent=4),
                       seed=5, trust_cpu_clock=True)
    cfg = MeasurerConfig(interpret=True, cpu_timing=True, rse_target=0.2, max_reps=3)
    run = LiveRun(out, opts, MutationSource(retries=0),
                  lambda t: TritonMeasurer(t, cfg, workdir=tmp_path), None,
                  hardware={"device_name": "cpu (Triton interpreter)"},
                  provenance={"kind": "measured", "note": "test"})
    run.run()
    recs = [r for _, r in iter_records(out)]
    evals = {r["candidate_id"]: r for r in recs if r["kind"] == "evaluation"}
    reused = [r for r in evals.values() if r.get("reused_from")]
    assert reused, "no duplicate in 16 mutations of one parent line: pick another seed"
    for r in reused:
        first = evals[r["reused_from"]]
        assert r["wall_s"] == r["compile_s"] == r["timing_s"] == 0.0
        assert r["outcome"] == first["outcome"] and r.get("speedup") == first.get("speedup")
    cands = [r for r in recs if r["kind"] == "candidate"]
    stored = [r for r in cands if "code" in r]
    assert len(stored) == len({r["code_sha256"] for r in cands}) < len(cands)
    load_log(out)


def test_the_reference_is_retimed_every_n_candidates(tmp_path):
    from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer
    from gfsim.live.tasks import get_task

    task = get_task("softmax")
    cands = task.candidates()[:5]
    cfg = MeasurerConfig(interpret=True, cpu_timing=True, rse_target=0.5, max_reps=3,
                         ref_retime_every=2)
    with TritonMeasurer("softmax", cfg, workdir=tmp_path) as m:
        marks = [bool(m.measure(c).get("ref_retimed")) for c in cands]
        assert marks == [True, False, True, False, True]
        assert len(m.reference_log) == 3 * len(m.timing_shapes("cpu"))
        # Every candidate had a fresh process; the baseline is timed in a process of its own,
        # which no candidate's (it could patch the baseline) is allowed to do.
        assert m.sandboxes == len(cands)
        box = m._spawn()
        try:
            assert box.pid != m._ref_worker.pid
            assert box.call({"op": "load", "code": cands[0].code}, 60)["ok"]
            ans = box.call({"op": "time_baseline", "dims": task.check_shapes[0], "seed": 0,
                            "reps": 3}, 60)
            assert not ans["ok"] and "has run candidate code" in ans["error"]
        finally:
            box.close()


def test_what_a_live_run_refuses(tmp_path):
    out = tmp_path / "r.jsonl"
    cases = [
        (["--driver", "trace"], "only puct is live"),
        (["--policy", "threshold:0.7", "--forecaster", "paper:gemini3-flash"],
         "what-if forecaster"),
        (["--policy", "threshold:0.7"], "give --forecaster"),
        (["--policy", "oracle:0.5"], "oracle"),
        (["--tasks", "softmax,nope"], "unknown task"),
        (["--source", "log:synthetic-mini"], "stores its code"),
        (["--capacity", "gpus=2"], "unknown key"),
    ]
    for extra, needle in cases:
        res = runner.invoke(app, ["live", "--measurer", "interpret", "--trust-cpu-clock",
                                  "--out", str(out), *extra])
        assert res.exit_code == 2 and needle in res.output, (extra, res.output)
    # Timings a candidate can forge: refused at once without --trust-cpu-clock, in one line.
    for extra in (["--measurer", "interpret"], ["--clock", "wall"], ["--protocol", "reference"]):
        res = runner.invoke(app, ["live", "--out", str(out), *extra])
        if extra[0] != "--measurer" and not torch.cuda.is_available():
            continue  # refused first for wanting a GPU
        assert res.exit_code == 2 and "--trust-cpu-clock" in res.output, (extra, res.output)
        assert "CPU clock" in res.output and not out.exists()
    if not torch.cuda.is_available():
        res = runner.invoke(app, ["live", "--out", str(out)])
        assert res.exit_code == 2 and "--measurer interpret" in res.output
    # An existing log is continued only when asked, and only with its own configuration.
    _run(tmp_path, out, "--steps", "1")
    res = runner.invoke(app, ["live", "--tasks", "softmax", *SMALL, "--out", str(out)])
    assert res.exit_code == 2 and "--resume" in res.output
    res = runner.invoke(app, ["live", "--tasks", "softmax", *SMALL, "--steps", "1", "--out",
                              str(out), "--resume", "--policy", "random:0.5"])
    assert res.exit_code == 2 and "keeps its configuration" in res.output


def test_code_from_a_log_is_a_candidate_source(tmp_path):
    """``--source log:h200-suite-v0``: the shipped kernels, re-measured here (interpreter)."""
    out = tmp_path / "fromlog.jsonl"
    summary = _run(tmp_path, out, "--source", "log:h200-suite-v0", "--steps", "2")
    log = load_log(out)
    from gfsim.replay_logs.shipped import resolve_log

    codes = {r["code"] for _, r in iter_records(resolve_log("h200-suite-v0"))
             if r["kind"] == "candidate" and r.get("code")}
    mine = [r for _, r in iter_records(out) if r["kind"] == "candidate"]
    assert mine and all(r["code"] in codes for r in mine if "code" in r)
    assert summary["searches"][0]["candidates"] == len(log.candidates)


def test_a_write_cut_by_a_crash_is_dropped_before_resuming(tmp_path):
    """The last gzip member cut short (a crash mid-write): resuming rewrites the log without
    it (still gzipped), redoes only what it held, and measures nothing again."""
    from gfsim.live.driver import LiveOptions, LiveRun
    from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer
    from gfsim.live.sources import MutationSource
    from gfsim.simulator.closed.engine import SearchConfig

    out = tmp_path / "cut.jsonl.gz"
    opts = LiveOptions(tasks=["softmax"], search=SearchConfig(steps=3, samples_per_parent=2),
                       seed=2, trust_cpu_clock=True)
    cfg = MeasurerConfig(interpret=True, cpu_timing=True, rse_target=0.2, max_reps=3)

    def make():
        return LiveRun(out, opts, MutationSource(), lambda t: TritonMeasurer(t, cfg,
                                                                             workdir=tmp_path),
                       None, resume=out.exists(),
                       hardware={"device_name": "cpu (Triton interpreter)"},
                       provenance={"kind": "measured", "note": "test"})

    make().run()
    full = [r for _, r in iter_records(out)]
    assert full[-1]["kind"] == "step" and full[-1]["step"] == 2
    out.write_bytes(out.read_bytes()[:-12])  # the step record's member, cut
    summary = make().run()
    assert summary["dropped_tail"]
    assert out.read_bytes()[:2] == b"\x1f\x8b"  # rewritten as gzip, not as plain text
    after = [r for _, r in iter_records(out)]
    assert [r for r in after if r["kind"] == "evaluation"] == \
        [r for r in full if r["kind"] == "evaluation"]
    redone = [r for r in after if r["kind"] == "step" and r["step"] == 2]
    assert len(redone) == 1 and redone[0]["live"]["resumed"] and redone[0]["live"]["session"] == 2
    load_log(out)


def test_an_llm_mutator_drives_a_live_run(vllm_server, tmp_path):
    """``--source llm:...`` through the live loop against the real server: the tiny model's
    answers hold no python block, so every child is a recorded generation failure (with its
    tokens and time), nothing is measured, and the log is valid."""
    out = tmp_path / "llm.jsonl"
    summary = _run(tmp_path, out, "--steps", "2", "--source",
                   f"llm:{vllm_server.url},model={vllm_server.model},max_tokens=64,"
                   f"max_prompt_tokens=300,temperature=0.8")
    log = load_log(out)
    assert len(log.candidates) == summary["searches"][0]["candidates"] == 4
    assert log.candidates["gen_failed_reason"].notna().all()
    assert (log.candidates["gen_input_tokens"] > 0).all()
    assert (log.candidates["gen_service_s"] > 0).all()
    assert len(log.evaluations) == 0 and summary["searches"][0]["gpu_evals"] == 0
    assert log.header["generator"]["name"] == "llm"


_DYING = '''
import os, signal, sys
from gfsim.live.driver import LiveOptions, LiveRun
from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer
from gfsim.live.sources import MutationSource
from gfsim.simulator.closed.engine import SearchConfig

out, work, die_at = sys.argv[1], sys.argv[2], int(sys.argv[3])


class Dying(TritonMeasurer):
    """Kills this whole process on its die_at-th measurement: what a candidate that hangs the
    GPU until the user kills the run (or one that escaped and killed it) leaves behind."""

    calls = 0

    def measure(self, candidate):
        Dying.calls += 1
        if Dying.calls == die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().measure(candidate)


cfg = MeasurerConfig(interpret=True, cpu_timing=True, rse_target=0.2, max_reps=3)
opts = LiveOptions(tasks=["softmax"], search=SearchConfig(steps=2, samples_per_parent=2),
                   seed=3, trust_cpu_clock=True)
LiveRun(out, opts, MutationSource(), lambda t: Dying(t, cfg, workdir=work), None,
        resume=os.path.exists(out), hardware={"device_name": "cpu (Triton interpreter)"},
        provenance={"kind": "measured", "note": "test"}).run()
'''


@pytest.mark.slow
def test_a_candidate_that_kills_the_run_is_a_failure_on_resume_not_redone_forever(tmp_path):
    """Each measurement begins with an ``attempt`` record (fsynced). The run is killed while
    measuring the first child; the resumed session records it as a failure from that one
    attempt (one dead session, not two) and finishes the search."""
    import subprocess
    import sys

    out = tmp_path / "dying.jsonl"
    script = tmp_path / "dying.py"
    script.write_text(_DYING)

    def session(die_at):
        return subprocess.run([sys.executable, str(script), str(out), str(tmp_path), str(die_at)],
                              capture_output=True, timeout=600)

    assert session(2).returncode == -9  # measure 1: the seed; 2: the first child
    recs = [r for _, r in iter_records(out)]
    victim = [r for r in recs if r["kind"] == "attempt"][-1]["candidate_id"]
    assert not any(r["kind"] == "evaluation" and r["candidate_id"] == victim for r in recs)
    done = session(0)  # the first resume: the victim is not measured again
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    recs = [r for _, r in iter_records(out)]
    attempts = [r for r in recs if r["kind"] == "attempt" and r["candidate_id"] == victim]
    assert [r["attempt"] for r in attempts] == [1]
    ev = [r for r in recs if r["kind"] == "evaluation" and r["candidate_id"] == victim]
    assert len(ev) == 1 and ev[0]["outcome"] == "runtime_error"
    assert ev[0]["failed_stage"] == "attempt" and "begun once" in ev[0]["reason"]
    log = load_log(out)  # the log is valid, and the search went on past the victim
    assert len(log.steps) == 2 and (log.evaluations["outcome"] == "success").any()


def _cpu_run(out, tmp_path, forecaster=None, steps=3):
    from gfsim.live.driver import LiveOptions, LiveRun
    from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer
    from gfsim.live.sources import MutationSource
    from gfsim.simulator.closed.engine import SearchConfig

    opts = LiveOptions(tasks=["softmax"], search=SearchConfig(steps=steps, samples_per_parent=2),
                       seed=2, trust_cpu_clock=True)
    cfg = MeasurerConfig(interpret=True, cpu_timing=True, rse_target=0.2, max_reps=3)
    return LiveRun(out, opts, MutationSource(),
                   lambda t: TritonMeasurer(t, cfg, workdir=tmp_path), forecaster,
                   resume=out.exists(), hardware={"device_name": "cpu (Triton interpreter)"},
                   provenance={"kind": "measured", "note": "test"})


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_a_header_cut_by_a_crash_starts_the_run_afresh_on_resume(tmp_path, suffix):
    import gzip

    out = tmp_path / f"torn{suffix}"
    line = json.dumps({"kind": "header", "schema_version": 1, "log_id": "torn"}).encode()
    out.write_bytes(gzip.compress(line + b"\n")[:-9] if suffix.endswith(".gz") else line[:25])
    summary = _cpu_run(out, tmp_path, steps=1).run()
    assert summary["dropped_tail"]
    recs = [r for _, r in iter_records(out)]
    assert recs[0]["kind"] == "header" and [r["kind"] for r in recs].count("header") == 1
    load_log(out)


@pytest.mark.slow
def test_a_decision_batch_cut_by_a_crash_is_completed_not_decided_again(tmp_path):
    out = tmp_path / "decisions.jsonl"  # plain text: the lines before a cut survive
    _cpu_run(out, tmp_path).run()
    lines = out.read_bytes().splitlines(keepends=True)
    kinds = [json.loads(x)["kind"] for x in lines]
    # the last batch of two or more decisions: cut inside its second line
    starts = [i for i in range(1, len(kinds) - 1) if kinds[i] == "decision"
              and kinds[i + 1] == "decision" and kinds[i - 1] != "decision"]
    i = starts[-1]
    kept = json.loads(lines[i])
    out.write_bytes(b"".join(lines[:i + 1]) + lines[i + 1][:10])
    summary = _cpu_run(out, tmp_path).run()
    assert summary["dropped_tail"]
    decisions = Counter(r["candidate_id"] for _, r in iter_records(out) if r["kind"] ==
                        "decision")
    assert decisions and set(decisions.values()) == {1}  # no candidate decided twice
    assert [r for _, r in iter_records(out) if r["kind"] == "decision"
            and r["candidate_id"] == kept["candidate_id"]] == [kept]
    load_log(out)


def test_an_evaluation_whose_what_if_forecast_a_crash_cut_gets_it_on_resume(tmp_path):
    from gfsim.forecasts.whatif import parse_whatif

    out = tmp_path / "whatif.jsonl"
    _cpu_run(out, tmp_path, parse_whatif("paper:gemini3-flash"), steps=2).run()
    recs = [r for _, r in iter_records(out)]
    # the last successful evaluation: its forecast (written just after it) removed
    last = max(k for k, r in enumerate(recs) if r["kind"] == "evaluation"
               and r["outcome"] == "success" and k + 1 < len(recs)
               and recs[k + 1]["kind"] == "forecast")
    cid = recs[last]["candidate_id"]
    with open(out, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in recs[:last + 1])
    _cpu_run(out, tmp_path, parse_whatif("paper:gemini3-flash"), steps=2).run()
    after = [r for _, r in iter_records(out)]
    assert [r["kind"] for r in after if r.get("candidate_id") == cid].count("forecast") == 1
    assert [r["kind"] for r in after if r.get("candidate_id") == cid].count("evaluation") == 1
    load_log(out)


@pytest.mark.slow
def test_a_live_threshold_run_reads_the_cost_models_forecasts(tmp_path):
    """gfsim live with the learned cost model and a forecast-reading policy: the first batch is
    forecast from the prior, later ones by trees trained on the run's own measurements (and
    its compile features: the wide mutator's code is the suite's own, so it is compiled for
    sm_90 here); every decision reads a forecast and the log replays."""
    out = tmp_path / "cm.jsonl"
    res = runner.invoke(app, ["live", "--tasks", "softmax", *SMALL, "--source", "mutate-wide",
                              "--forecaster", "costmodel:min_train=2,min_errors=2",
                              "--policy", "threshold:0.7", "--out", str(out), "--seed", "5",
                              "--json"])
    assert res.exit_code == 0, res.output
    log = load_log(out, cache=False)
    fc = log.forecasts
    assert len(fc) and set(fc["mode"]) == {"costmodel"}
    recs = [r for r in _records(out) if r["kind"] == "forecast"]
    assert "prior" in recs[0]["reasoning"] and any("trees" in r["reasoning"] for r in recs)
    assert len(log.decisions) == len(recs)
    meta = [e.get("source_meta") for e in log.candidates["extra"] if e]
    assert meta and all(m.get("variant") for m in meta)
    rep = runner.invoke(app, ["replay", "--log", str(out), "--policy", "threshold:0.7",
                              "--forecaster", "costmodel:min_train=2,min_errors=2", "--json"])
    assert rep.exit_code == 0, rep.output
