"""Timings on the CPU clock (issue 41, item 3): the candidate's own process reports them, so a
candidate can forge them. The measurer marks every timing with its clock and whether it is
trusted (only the GPU clock is); ``gfsim live`` records CPU-clock successes only with
``--trust-cpu-clock`` (``LiveOptions.trust_cpu_clock``), and says so in the log and the summary.
Also here: a candidate whose measurement kills the run costs one dead session, not two.

The driver's tests use a stand-in measurer (no sandbox, milliseconds); the measurer's own marks
are tested with real candidates on the CPU, a forger among them."""

from __future__ import annotations

import hashlib

import pytest

from gfsim.core.errors import GfsimError
from gfsim.live.driver import CPU_CLOCK_NOTE, LiveOptions, LiveRun
from gfsim.live.measure.measurer import Measurer
from gfsim.live.sources import MutationSource
from gfsim.replay_logs import load_log
from gfsim.replay_logs.io import iter_records
from gfsim.simulator.closed.engine import SearchConfig


class Died(Exception):
    """What a measurement that kills the run leaves behind, in this process: an attempt record
    and no evaluation."""


class Stub(Measurer):
    """Answers as a TritonMeasurer would, without running anything: a success whose speedup
    follows from the code, on the CPU clock (``timing_trusted`` false) unless ``trusted``; the
    seed (the first call) on the GPU clock where ``trusted_seed``. ``die_at``: the call that
    raises ``Died`` (1: the seed)."""

    def __init__(self, trusted: bool = False, trusted_seed: bool | None = None,
                 die_at: int = 0):
        self.trusted = trusted
        self.trusted_seed = trusted if trusted_seed is None else trusted_seed
        self.die_at = die_at
        self.codes: list[str] = []

    def measure(self, candidate) -> dict:
        self.codes.append(candidate.code)
        if len(self.codes) == self.die_at:
            raise Died(candidate.code)
        trusted = self.trusted_seed if len(self.codes) == 1 else self.trusted
        h = int(hashlib.sha256(candidate.code.encode()).hexdigest()[:6], 16)
        speedup = 0.5 + (h % 1000) / 500
        return {"outcome": "success", "speedup": speedup, "runtime_ns": 1e6 / speedup,
                "ref_runtime_ns": 1e6, "compile_s": 0.01, "check_s": 0.01, "timing_s": 0.01,
                "wall_s": 0.03, "service_s": 0.03, "timing_protocol": "cpu-wallclock",
                "timing_clock": "gpu" if trusted else "wall", "timing_trusted": trusted}


def _run(out, stub: Stub, trust: bool = False, steps: int = 2, resume: bool = False):
    opts = LiveOptions(tasks=["softmax"], search=SearchConfig(steps=steps, parents_per_step=1,
                                                              samples_per_parent=2),
                       seed=4, trust_cpu_clock=trust)
    return LiveRun(out, opts, MutationSource(), lambda task: stub, None, resume=resume,
                   hardware={"device_name": "cpu"},
                   provenance={"kind": "measured", "note": "test"},
                   timing_protocol={"protocol": "cpu-wallclock"}).run()


def _records(out) -> list[dict]:
    return [rec for _, rec in iter_records(out)]


# -- the driver: no CPU-clock success without the flag ---------------------------------------
def test_a_cpu_clock_run_without_the_flag_refuses_to_start_and_writes_nothing(tmp_path):
    out = tmp_path / "cpu.jsonl"
    with pytest.raises(GfsimError, match="`trust_cpu_clock`") as err:
        _run(out, Stub())
    assert "seed kernel was timed on the CPU clock" in str(err.value)
    assert "\n" not in str(err.value)
    assert not out.exists()


def test_with_the_flag_every_success_and_the_header_say_the_timings_are_untrusted(tmp_path):
    out = tmp_path / "trusted.jsonl"
    summary = _run(out, Stub(), trust=True)
    assert summary["timing_trust"] == CPU_CLOCK_NOTE and "forge" in CPU_CLOCK_NOTE
    recs = _records(out)
    header = recs[0]
    assert header["provenance"]["timing_trust"] == CPU_CLOCK_NOTE
    assert header["timing_protocol"] == {"protocol": "cpu-wallclock", "clock": "wall",
                                         "trusted": False}
    run = next(r for r in recs if r["kind"] == "run")
    assert run["configuration"]["trust_cpu_clock"] is True
    assert run["seed_evaluation"]["timing_trusted"] is False
    evals = [r for r in recs if r["kind"] == "evaluation"]
    assert evals and all(r["outcome"] == "success" and r["timing_trusted"] is False
                         and r["timing_clock"] == "wall" for r in evals)
    load_log(out)  # a valid log: the marks are fields the schema keeps


def test_the_printed_summary_says_the_timings_are_untrusted(tmp_path, capsys):
    from gfsim.cli.live_cmd import _print

    summary = _run(tmp_path / "printed.jsonl", Stub(), trust=True)
    summary["fidelity"] = {"error": "not compared here"}
    _print(summary)
    text = " ".join(capsys.readouterr().out.split())
    assert "UNTRUSTED timings" in text and "can forge" in text


def test_a_gpu_clock_run_needs_no_flag_and_carries_no_untrusted_mark(tmp_path):
    """Control: trusted timings are recorded as before."""
    out = tmp_path / "gpu.jsonl"
    summary = _run(out, Stub(trusted=True))
    assert summary.get("timing_trust") is None
    recs = _records(out)
    assert "timing_trust" not in recs[0]["provenance"]
    assert recs[0]["timing_protocol"] == {"protocol": "cpu-wallclock"}
    evals = [r for r in recs if r["kind"] == "evaluation"]
    assert evals and all(r["outcome"] == "success" and r.get("timing_trusted") is not False
                         for r in evals)


def test_an_untrusted_success_after_a_trusted_seed_is_not_recorded_as_a_success(tmp_path):
    """A clock that changes under the run (or a measurer of one's own): each CPU-clock success
    is recorded as a failure of the measurement saying why, its timings kept, no speedup."""
    out = tmp_path / "mixed.jsonl"
    summary = _run(out, Stub(trusted=False, trusted_seed=True))
    assert summary["timing_trust"] is None
    evals = [r for r in _records(out) if r["kind"] == "evaluation"]
    assert evals and not any(r["outcome"] == "success" for r in evals)
    for r in evals:
        assert r["outcome"] == "infrastructure_failure" and "speedup" not in r
        assert r["timing_trusted"] is False and "--trust-cpu-clock" in r["reason"]
    assert all(s["best_speedup"] == s["seed_speedup"] for s in summary["searches"])
    load_log(out)


def test_resuming_an_untrusted_run_without_the_flag_is_refused(tmp_path):
    """The seed's recorded evaluation says its clock: a resume without the flag is refused
    before it adds anything; with it, the summary says the timings are untrusted."""
    out = tmp_path / "resume.jsonl"
    with pytest.raises(Died):
        _run(out, Stub(die_at=3), trust=True)
    n = len(_records(out))
    with pytest.raises(GfsimError, match="`trust_cpu_clock`"):
        _run(out, Stub(), resume=True)
    assert len(_records(out)) == n
    summary = _run(out, Stub(), trust=True, resume=True)
    assert summary["timing_trust"] == CPU_CLOCK_NOTE
    assert {s["steps"] for s in summary["searches"]} == {2}


# -- the driver: one dead session per crash ------------------------------------------------
def test_a_candidate_whose_measurement_kills_the_run_is_a_failure_on_the_first_resume(
        tmp_path):
    """The first child's measurement dies (call 2; call 1 is the seed): the resumed run records
    it as a failure from its one attempt without measuring it again, and goes on."""
    out = tmp_path / "dies.jsonl"
    with pytest.raises(Died) as died:
        _run(out, Stub(trusted=True, die_at=2))
    victim_code = died.value.args[0]
    recs = _records(out)
    attempts = [r for r in recs if r["kind"] == "attempt"]
    victim = attempts[-1]["candidate_id"]
    assert not any(r["kind"] == "evaluation" and r["candidate_id"] == victim for r in recs)

    again = Stub(trusted=True)
    summary = _run(out, again, resume=True)
    assert victim_code not in again.codes  # not measured again
    recs = _records(out)
    assert [r["attempt"] for r in recs if r["kind"] == "attempt"
            and r["candidate_id"] == victim] == [1]
    ev = [r for r in recs if r["kind"] == "evaluation" and r["candidate_id"] == victim]
    assert len(ev) == 1 and ev[0]["outcome"] == "runtime_error"
    assert ev[0]["failed_stage"] == "attempt" and "begun once" in ev[0]["reason"]
    assert {s["steps"] for s in summary["searches"]} == {2}
    load_log(out)


# -- the measurer's marks, with real candidates on the CPU ----------------------------------
torch = pytest.importorskip("torch")
pytest.importorskip("triton")

# A candidate that replaces the timing loop in its own process (as the hostile suite's forgers
# do): every reported time divided by a million.
FORGER = '''
import sys, torch
_t = sys.modules["gfsim.live.measure.timing"]
_real = _t.time_reps
def _fake(*a, **k):
    r = _real(*a, **k)
    r["times_ms"] = [x / 1e6 for x in r["times_ms"]]
    for key in ("mean_ms", "median_ms", "value_ms"):
        r[key] /= 1e6
    r["kernel_s"] /= 1e6
    return r
_t.time_reps = _fake
def run(x):
    return torch.ops.aten._softmax(x, -1, False)
'''
# The fastest honest call there is: aten's own softmax (the guard refuses torch.softmax).
ATEN = "import torch\ndef run(x):\n    return torch.ops.aten._softmax(x, -1, False)\n"


@pytest.fixture(scope="module")
def cpu_measurer(tmp_path_factory):
    from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer

    cfg = MeasurerConfig(cpu_timing=True, rse_target=0.2, max_reps=10,
                         cpu_shapes=({"M": 64, "N": 4096},), timing_timeout_s=20,
                         check_timeout_s=30, compile_timeout_s=60, memory_limit_mb=3000,
                         energy_window_s=0)
    m = TritonMeasurer("softmax", cfg, workdir=tmp_path_factory.mktemp("cpuclock"))
    yield m
    m.close()


def _measure(m, code):
    from gfsim.live.candidates import CodeCandidate

    return m.measure(CodeCandidate("softmax", code))


def test_a_forger_on_the_cpu_clock_is_never_a_trusted_success(cpu_measurer):
    r = _measure(cpu_measurer, FORGER)
    assert r["timing_clock"] == "wall" and r["timing_trusted"] is False, r
    assert r.get("timing_clock_note") == "no GPU"


def test_an_honest_aten_softmax_is_not_refused_on_the_cpu_clock(cpu_measurer):
    for k in range(3):
        r = _measure(cpu_measurer, ATEN + f"# {k}\n")
        assert r["outcome"] == "success" and not r.get("timing_forged"), r
        assert r["timing_trusted"] is False


def test_a_forger_in_a_live_run_on_the_cpu_clock(cpu_measurer, tmp_path):
    """The forger as a live run's seed (the seed is measured like any candidate): without the
    flag the run refuses to start; with it, its success carries the untrusted marks."""
    from gfsim.live.candidates import ParentInfo

    class Forgers(MutationSource):
        def seed(self, task):
            return ParentInfo("seed", FORGER, {})

        def generate(self, task, parent, key, slot):
            from gfsim.live.candidates import Generated

            return Generated(code=FORGER + f"# {key[2]} {key[3]} {slot}\n")

    def run(out, trust):
        opts = LiveOptions(tasks=["softmax"], search=SearchConfig(
            steps=1, parents_per_step=1, samples_per_parent=1), seed=1, trust_cpu_clock=trust)
        return LiveRun(out, opts, Forgers(), lambda task: _Shared(cpu_measurer), None,
                       hardware={"device_name": "cpu"},
                       provenance={"kind": "measured", "note": "test"}).run()

    with pytest.raises(GfsimError, match="`trust_cpu_clock`"):
        run(tmp_path / "no.jsonl", False)
    assert not (tmp_path / "no.jsonl").exists()
    out = tmp_path / "yes.jsonl"
    run(out, True)
    evals = [r for r in _records(out) if r["kind"] == "evaluation"]
    assert evals and all(r["timing_trusted"] is False for r in evals)
    assert _records(out)[0]["provenance"]["timing_trust"] == CPU_CLOCK_NOTE


class _Shared(Measurer):
    """The module's measurer, lent to a run that would close it."""

    def __init__(self, inner):
        self.inner = inner

    def measure(self, candidate) -> dict:
        return self.inner.measure(candidate)
