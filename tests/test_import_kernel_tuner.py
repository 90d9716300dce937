"""gfsim import kernel-tuner: caches and T4 files as config_space logs, checked side by side
with Kernel Tuner's own simulation mode on the real caches gfsim ships
(gfsim/worlds/data/kernel_tuner)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.core.errors import GfsimError
from gfsim.cost_models import Capacities, load_cost_model
from gfsim.importers.kernel_tuner import import_kernel_tuner
from gfsim.policies import make_policy
from gfsim.replay_logs import load_log
from gfsim.simulator import replay

runner = CliRunner()
DATA = Path(__file__).parent / "data" / "kernel_tuner"
ONE_GPU = Capacities(generator=1, forecaster=1, compile_workers=1, gpus=1)


def hub() -> Path:
    """The real Kernel Tuner caches gfsim ships, in the installed package (their README says
    where from)."""
    from gfsim.worlds.kernel_tuner import shipped_cache_dir

    return shipped_cache_dir()


def test_a_small_cache_becomes_one_candidate_per_configuration(tmp_path):
    s = import_kernel_tuner(DATA / "tiny_cache.json", tmp_path / "log.jsonl")
    log = load_log(tmp_path / "log.jsonl")
    assert log.shape == "config_space" and log.header["provenance"]["kind"] == "measured"
    assert s["outcomes"] == {"success": 3, "compile_failed": 1, "runtime_error": 1}
    # The reference is the first configuration that ran (32,1: 2 ms), stated in the header.
    assert log.header["reference_configuration"] == {"block_size_x": 32, "unroll": 1}
    ev = log.evaluations.set_index("candidate_id")
    assert ev.loc["vector_add:64,1", "speedup"] == pytest.approx(2.0)
    assert ev.loc["vector_add:128,2", "speedup"] == pytest.approx(0.5)
    assert ev.loc["vector_add:32,2", "outcome"] == "compile_failed"
    assert ev.loc["vector_add:32,2", "compile_s"] == pytest.approx(0.8)
    assert ev.loc["vector_add:64,1", "check_s"] == pytest.approx(0.02)
    assert list(log.candidates["step"]) == [0, 1, 2, 3, 4]  # the file's order
    # An explicit reference configuration.
    import_kernel_tuner(DATA / "tiny_cache.json", tmp_path / "r.jsonl",
                        reference="block_size_x=64,unroll=1")
    ev = load_log(tmp_path / "r.jsonl").evaluations.set_index("candidate_id")
    assert ev.loc["vector_add:32,1", "speedup"] == pytest.approx(0.5)
    with pytest.raises(GfsimError, match="no successful configuration matches"):
        import_kernel_tuner(DATA / "tiny_cache.json", tmp_path / "x.jsonl",
                            reference="block_size_x=32,unroll=2")


def test_the_t4_format_gives_the_same_configurations(tmp_path):
    s = import_kernel_tuner(DATA / "tiny_t4.json", tmp_path / "t4.jsonl")
    assert s["format"] == "T4 results" and s["configurations"] == 3
    ev = load_log(tmp_path / "t4.jsonl").evaluations.set_index("candidate_id")
    ids = list(ev.index)
    assert ids[0].endswith(":32,1") and ev.iloc[2]["speedup"] == pytest.approx(2.0)
    assert list(ev["outcome"]) == ["success", "compile_failed", "success"]
    assert ev.iloc[0]["timing_s"] == pytest.approx(0.004)  # the runs, summed


def test_a_measure_all_replay_books_what_the_cache_says(tmp_path):
    import_kernel_tuner(DATA / "tiny_cache.json", tmp_path / "log.jsonl")
    log = load_log(tmp_path / "log.jsonl")
    r = replay(log, make_policy("all"), load_cost_model("reserved-a100"), capacities=ONE_GPU)
    st = r.stages
    # compile + verification + benchmark, the 2 ms benchmark of the runtime failure included
    # (it failed while timing: the logged timing ran).
    want = (1000 + 10 + 50 + 800 + 1200 + 20 + 40 + 900 + 0 + 1100 + 30 + 60 + 2) / 1e3
    assert st["compilation"].seconds + st["check"].seconds + st["timing"].seconds == \
        pytest.approx(want, rel=1e-12)
    assert r.searches[0].wall_s == pytest.approx(want, rel=1e-12)  # one at a time
    assert st["generation"].usd == 0 and st["cold_start"].seconds == 0
    assert r.best_speedup == pytest.approx(2.0)
    with pytest.raises(GfsimError, match="allows only policies that need no forecast"):
        replay(log, make_policy("threshold:0.7"), load_cost_model("reserved-a100"))


@pytest.mark.parametrize("name", ["convolution_milo_A100", "dedispersion_milo_A100"])
def test_totals_match_kernel_tuners_simulation_mode(tmp_path, name):
    """The side-by-side check: Kernel Tuner replays the cache in simulation mode (brute force
    over exactly the cached configurations); a measure-everything gfsim replay of the imported
    log, zero overhead and one GPU, books the same compile + verification + benchmark time."""
    kernel_tuner = pytest.importorskip("kernel_tuner")
    src = hub() / f"{name}.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    plain = tmp_path / f"{name}.json"
    plain.write_text(json.dumps(doc))
    keys = set(doc["cache"])
    tp = doc["tune_params"]

    def cached(p):  # a named function: Kernel Tuner parses inline lambdas from source
        return ",".join(str(p[k]) for k in tp) in keys

    _, env = kernel_tuner.tune_kernel(
        doc["kernel_name"], "__global__ void k() {}", doc["problem_size"], [], tp,
        cache=str(plain), simulation_mode=True, strategy="brute_force", quiet=True,
        restrictions=cached)
    kt_s = env["simulated_time"] / 1e3
    out = tmp_path / f"{name}.jsonl.gz"
    import_kernel_tuner(src, out)
    r = replay(load_log(out), make_policy("all"), load_cost_model("reserved-a100"),
               capacities=ONE_GPU, orphans_dropped=False)
    st = r.stages
    booked = st["compilation"].seconds + st["check"].seconds + st["timing"].seconds
    # The same seconds: a runtime failure's benchmark milliseconds are booked too (it
    # failed while timing), as Kernel Tuner books them.
    assert booked == pytest.approx(kt_s, rel=1e-9)
    assert r.searches[0].gpu_evals == len(keys)


@pytest.mark.parametrize("name", ["convolution_milo_A100_T4", "convolution_milo_MI250X"])
def test_the_other_shared_files_import_and_validate(tmp_path, name):
    out = tmp_path / "x.jsonl.gz"
    s = import_kernel_tuner(hub() / f"{name}.json.gz", out)
    assert s["configurations"] == 4362
    assert runner.invoke(app, ["validate", str(out)]).exit_code == 0


def test_a_shipped_cache_imports_by_name_from_any_folder(tmp_path, monkeypatch):
    """The README's tour imports a cache gfsim ships by its file name: it must work from any
    folder of any install, not only in the checkout."""
    monkeypatch.delenv("GFSIM_KERNEL_TUNER_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["import", "kernel-tuner", "convolution_milo_MI250X.json.gz", "-o",
                              "x.jsonl.gz", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["configurations"] == 4362
    res = runner.invoke(app, ["import", "kernel-tuner", "nope.json.gz", "-o", "y.jsonl.gz"])
    assert res.exit_code == 2 and "nope.json.gz: not found" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_bad_files_get_one_line_naming_file_and_place(tmp_path):
    bad = {
        "nothing.json": ('{"x": 1}', "neither a Kernel Tuner cache"),
        "trunc.json": ('{"cache": {"1": {"time": 1.0,\n', "trunc.json:2: not valid JSON"),
        "fail.json": (json.dumps({"tune_params": {"a": [1]}, "cache": {"1": {
            "a": 1, "time": "WeirdFailure", "compile_time": 1, "verification_time": 0,
            "benchmark_time": 0}}}), "unknown failure 'WeirdFailure'"),
        "neg.json": (json.dumps({"tune_params": {"a": [1]}, "cache": {"1": {
            "a": 1, "time": 1.0, "compile_time": -5, "verification_time": 0,
            "benchmark_time": 0}}}), "field 'cache['1'].compile_time'"),
        "notime.json": (json.dumps({"tune_params": {"a": [1]}, "cache": {"1": {"a": 1}}}),
                        "field 'cache['1'].time': missing"),
    }
    for fname, (text, msg) in bad.items():
        p = tmp_path / fname
        p.write_text(text)
        res = runner.invoke(app, ["import", "kernel-tuner", str(p), "-o",
                                  str(tmp_path / "o.jsonl")])
        assert res.exit_code == 2 and msg in res.output, (fname, res.output)
        assert len(res.output.strip().splitlines()) == 1
    raw = tmp_path / "latin.json"
    raw.write_bytes(b'{"cache": {"\xe9": 1}}')
    res = runner.invoke(app, ["import", "kernel-tuner", str(raw), "-o", str(tmp_path / "o")])
    assert res.exit_code == 2 and "latin.json:1: not valid UTF-8" in res.output
    assert not (tmp_path / "o.jsonl").exists()  # nothing half-written
