"""Every README command, and bad input: exit 2 with one line, never a traceback."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.replay_logs import DEFAULT_LOG, load_log, resolve_log

runner = CliRunner()
TINY = Path(__file__).parent / "data" / "tiny.jsonl"
JSON_KEYS = {"policy", "log", "best_speedup", "gpu_evals", "candidates", "forecasts", "wall_s",
             "usd", "joules", "usd_imputed_share", "orphan_share", "stages", "baseline",
             "usd_delta", "wall_s_delta", "joules_delta", "speedup_delta"}
STAGES = {"generation", "forecasting", "cold_start", "compilation", "check", "timing", "idle"}


def invoke(*args):
    return runner.invoke(app, list(args))


def test_readme_main_command_prints_a_threshold_result():
    res = invoke("replay", "--policy", "threshold:0.7")
    assert res.exit_code == 0, res.output
    assert "threshold:tau=0.7" in res.output and "baseline (all)" in res.output
    assert "synthetic" in res.output


def test_replay_json_has_the_promised_keys_and_consistent_deltas():
    res = invoke("replay", "--policy", "threshold:0.7", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert JSON_KEYS <= set(out)
    assert set(out["stages"]) == STAGES and set(out["baseline"]["stages"]) == STAGES
    for stage in out["stages"].values():
        assert set(stage) == {"s", "usd", "joules"}
    base = out["baseline"]
    assert out["usd_delta"] == pytest.approx(out["usd"] - base["usd"])
    assert out["speedup_delta"] == pytest.approx(out["best_speedup"] - base["best_speedup"])
    assert out["wall_s_delta"] == pytest.approx(out["wall_s"] - base["wall_s"])
    assert out["joules_delta"] == pytest.approx(out["joules"] - base["joules"])
    assert base["forecasts"] == 0 < out["forecasts"]
    default = load_log(resolve_log(None))
    assert out["log"] == DEFAULT_LOG == "synthetic-puct-v1"
    # The baseline measures every candidate of the default log that has an evaluation.
    assert base["gpu_evals"] == default.status_counts()["evaluated"] > 0


def test_replay_json_keeps_anytime_curves_short_unless_asked_for_detail():
    args = ("replay", "--log", "synthetic-v1", "--policy", "all", "--json")
    lean = json.loads(invoke(*args).output)
    full = json.loads(invoke(*args, "--detail").output)
    assert lean["anytime_points"] == 100 and full["anytime_points"] is None
    for sid, rows in full["anytime"].items():
        search = next(s for s in full["searches"] if s["search_id"] == sid)
        assert len(rows) == search["gpu_evals"] + 1 > 100  # one per measurement, and the start
        short = lean["anytime"][sid]
        assert len(short) <= 100 and short[0] == rows[0] and short[-1] == rows[-1]
        assert all(r in rows for r in short)
        # Every improvement of the best is kept (the same step function) while they fit.
        best = [r[4] for r in rows]
        rises = [r for i, r in enumerate(rows) if i == 0 or best[i] > best[i - 1]]
        if len(rises) < 99:
            assert all(r in short for r in rises)
        else:
            assert len(short) == 100
    drop = {"anytime", "anytime_points", "simulation_s", "settings"}  # settings: --detail
    assert {k: v for k, v in lean.items() if k not in drop} == {
        k: v for k, v in full.items() if k not in drop}


def test_replay_options_reach_the_simulation(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('base = "reserved-h100"\n[capacities]\ngpus = 2\n')
    out_csv = tmp_path / "cands.csv"
    res = invoke("replay", "-p", "topk:2", "--log", str(TINY), "--cost", str(toml),
                 "--budget", "gpu_evals=2", "--seed", "3", "--capacity", "gen=1",
                 "--candidates-out", str(out_csv), "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["cost_model"].startswith("reserved-h100+") and out["seed"] == 3
    assert out["budget"]["gpu_evals"] == 2 and all(s["gpu_evals"] <= 2 for s in out["searches"])
    assert out["stages"]["idle"]["usd"] > 0
    assert out_csv.read_text().startswith("candidate_id,")


def test_validate_and_listing_commands():
    res = invoke("validate", str(TINY))
    assert res.exit_code == 0 and "valid" in res.output
    res = invoke("validate", "synthetic-mini", "--json")
    assert json.loads(res.output)["candidates"] == 368
    res = invoke("logs")
    assert res.exit_code == 0 and "synthetic-mini" in res.output
    res = invoke("policies", "--json")
    rows = json.loads(res.output)
    names = [p["name"] for p in rows if not p["plugin"]]  # (an installed plug-in's come after)
    assert names == ["all", "random", "oracle", "topk", "threshold", "ev"]
    assert [p["plugin"] for p in rows] == sorted(p["plugin"] for p in rows)


def corrupt_copy(tmp_path):
    lines = TINY.read_text().splitlines()
    lines[4] = lines[4][:20]
    path = tmp_path / "corrupt.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("args, fragment", [
    (["replay", "--log", "no/such/file.jsonl"], "no/such/file.jsonl: no such file"),
    (["replay", "--policy", "nosuch"], "unknown policy 'nosuch'; valid: all, random"),
    (["replay", "--policy", "threshold:tau=0.7,x=1"], "unknown parameter 'x'"),
    (["replay", "--baseline", "nosuch"], "unknown policy 'nosuch'"),
    (["replay", "--policy", "threshold:1.5"],
     "threshold: tau=1.5 is above its maximum 1.0 (range 0 to 1)"),
    (["replay", "--budget", "usd=-3"], "budget: usd must be > 0"),
    (["replay", "--budget", "dollars=3"], "budget: unknown key 'dollars'"),
    (["replay", "--cost", "gpu-for-free"], "unknown cost preset"),
    (["replay", "--capacity", "gpus=x"], "capacity: gpus='x' is not a whole number"),
    (["replay", "--forecaster", "nobody"], "no forecasts by 'nobody'"),
    (["replay", "--forecaster", "whatif:paper"], "(or draw them: paper:PRESET"),
    (["validate", "missing.jsonl"], "missing.jsonl: no such file"),
])
def test_bad_input_exits_2_with_one_line(args, fragment):
    res = invoke(*args)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gfsim: error:"), res.output
    assert fragment in lines[0]


def test_candidates_out_into_a_missing_folder_is_refused_before_any_replay(tmp_path,
                                                                          monkeypatch):
    """It ended in a traceback, after the whole replay had run."""
    import gfsim.replay_logs
    import gfsim.simulator

    def no_work(*a, **k):
        raise AssertionError("replay work began before the output path was checked")

    monkeypatch.setattr(gfsim.replay_logs, "open_log", no_work)
    monkeypatch.setattr(gfsim.simulator, "replay_with_baseline", no_work)
    target = tmp_path / "absent" / "x.csv"
    png = tmp_path / "absent" / "x.png"
    for flag, path, fragment in (
            ("--candidates-out", target,
             f"{target}: --candidates-out: folder {target.parent} does not exist"),
            ("--candidates-out", tmp_path / "x.txt", "--candidates-out takes a .csv or .parquet"),
            ("--plot", png, f"{png}: folder {png.parent} does not exist"),
            ("--plot", tmp_path / "x.jpg", "--plot writes a .png")):
        res = invoke("replay", "--log", str(TINY), flag, str(path))
        assert res.exit_code == 2, res.output
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("gfsim: error:"), res.output
        assert fragment in lines[0]
    assert not target.parent.exists()


def test_errors_name_a_shipped_log_by_its_name_not_its_installed_path():
    """They printed /.../site-packages/gfsim/replay_logs/data/h200-suite-v0.jsonl.gz."""
    shipped = str(resolve_log("h200-suite-v0"))
    for args, fragment in (
            (["replay", "--log", "h200-suite-v0", "--driver", "puct"],
             "h200-suite-v0 (shipped log): a 'pairs' log has no search order"),
            (["score", "--log", "synthetic-mini", "--task", "nope"],
             "synthetic-mini (shipped log): no task 'nope'")):
        res = invoke(*args)
        assert res.exit_code == 2, res.output
        line = res.output.strip()
        assert "\n" not in line and line.startswith(f"gfsim: error: {fragment}"), line
        assert shipped not in line and "replay_logs" not in line
    res = invoke("replay", "--log", str(TINY), "--forecaster", "nobody")
    assert f"gfsim: error: {TINY}: no forecasts by 'nobody'" in res.output  # a path stays one
    assert load_log(TINY).display_name == str(TINY)


def test_corrupt_log_exits_2_naming_its_line(tmp_path):
    path = corrupt_copy(tmp_path)
    for args in (["validate", str(path)], ["replay", "--log", str(path)]):
        res = invoke(*args)
        assert res.exit_code == 2
        assert f"{path}:5: not valid JSON" in res.output
        assert "Traceback" not in res.output


def test_installed_console_script_reports_errors_without_traceback(tmp_path):
    exe = Path(sys.executable).parent / "gfsim"
    if not exe.exists():
        pytest.skip("console script not on this interpreter's bin")
    path = corrupt_copy(tmp_path)
    proc = subprocess.run([str(exe), "replay", "--log", str(path)], capture_output=True,
                          text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"gfsim: error: {path}:5: not valid JSON")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


FORBIDDEN = ("torch", "triton", "vllm", "psycopg", "pandas", "simpy", "optuna", "scipy",
             "openevolve")


def test_help_imports_no_heavy_or_live_dependency(tmp_path):
    # cwd away from the checkout: `python -c` puts cwd first on sys.path, and the source
    # tree's gfsim/ folder would shadow the installed package.
    # A finder that fails any import of a forbidden module: the test fails if --help tries one,
    # whether or not that module is installed here.
    code = f"""
import sys
FORBIDDEN = {FORBIDDEN!r}
class Guard:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in FORBIDDEN:
            raise ImportError('gfsim --help imported ' + name)
sys.meta_path.insert(0, Guard())
sys.argv = ['gfsim', '--help']
from gfsim.cli.main import main
try:
    main()
except SystemExit as e:
    assert e.code in (0, None), e.code
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "replay" in proc.stdout


# -- small defects (issue 24) ----------------------------------------------------------------------
def test_seeds_below_one_are_refused():
    for cmd in (["replay", "--seeds", "0"], ["savings", "--seeds", "0"]):
        res = runner.invoke(app, cmd)
        assert res.exit_code == 2 and "--seeds" in res.output, (cmd, res.output)


def test_synth_refuses_a_missing_folder_as_plot_does(tmp_path):
    res = runner.invoke(app, ["synth", "--out", str(tmp_path / "no" / "such" / "x.jsonl")])
    assert res.exit_code == 2 and "does not exist" in res.output
    assert not (tmp_path / "no").exists()


def test_validate_refuses_a_truncated_log_unless_allowed_every_time(tmp_path):
    import gzip

    data = gzip.open(resolve_log("synthetic-mini"), "rb").read()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(data)[:-2000])
    for _ in range(2):  # the second load must not come from a cache that forgot the cut
        res = runner.invoke(app, ["validate", str(cut)])
        assert res.exit_code == 2 and "gzip stream ends early" in res.output
        assert "--allow-truncated" in res.output and "complete lines" in res.output
    res = runner.invoke(app, ["validate", str(cut), "--allow-truncated", "--json"])
    assert res.exit_code == 0
    assert "ends early" in json.loads(res.stdout[res.stdout.index("{"):])["truncated"]


def test_interval_tables_are_in_the_reports_units():
    res = runner.invoke(app, ["replay", "--seeds", "2", "--policy", "random:0.5"])
    assert res.exit_code == 0, res.output
    table = res.output[res.output.index("2 seeds: mean"):]
    assert "wall-clock" in table and "$" in table and "e+0" not in table
    wall = next(ln for ln in table.splitlines() if "wall-clock" in ln)
    units = set(re.findall(r"\d (d|h|min|s)\b", wall))
    assert len(units) == 1, wall  # one unit a row: policy, baseline and delta read together


def test_no_flag_is_shown_as_taking_a_value_and_every_option_says_what_it_does():
    import click
    import typer

    cmd = typer.main.get_command(app)
    undocumented, commands = [], []

    def walk(c, name):
        if isinstance(c, click.Group):
            for n, sub in c.commands.items():
                walk(sub, f"{name} {n}")
            return
        commands.append(name.split()[1:])
        undocumented.extend(f"{name} {p.opts[0]}" for p in c.params
                            if isinstance(p, click.Option) and not (p.help or "").strip())

    walk(cmd, "gfsim")
    assert undocumented == []
    for args in commands:
        res = runner.invoke(app, [*args, "--help"], terminal_width=200)
        shown = [ln for ln in res.output.splitlines() if "<bool>" in ln
                 and "Show this message" not in ln]  # (typer's own --help says <bool>)
        assert res.exit_code == 0 and shown == [], (args, shown)


def test_plots_of_a_synthetic_log_say_so_in_their_title(tmp_path, monkeypatch):
    from gfsim.analysis import plots

    titles = []
    for name in ("plot_anytime", "plot_scores"):
        real = getattr(plots, name)
        monkeypatch.setattr(plots, name, lambda *a, real=real, **k: titles.append(
            k.get("title", "")) or real(*a, **k))
    assert runner.invoke(app, ["replay", "--plot", str(tmp_path / "a.png")]).exit_code == 0
    assert runner.invoke(app, ["score", "--plot", str(tmp_path / "s.png")]).exit_code == 0
    assert len(titles) == 2 and all("SYNTHETIC" in t for t in titles), titles


def test_a_live_forecaster_without_the_live_extra_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "httpx", None)  # as if the extra were not installed
    res = runner.invoke(app, ["forecast", "--log", "h200-live-v1", "--forecaster",
                              "vllm:http://127.0.0.1:9/v1,model=m", "--out",
                              str(tmp_path / "f.jsonl")])
    assert res.exit_code == 2 and "needs the live extra" in res.output
    assert res.output.count("\n") == 1
