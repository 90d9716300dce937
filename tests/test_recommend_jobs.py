"""``gfsim recommend --jobs`` (issue 53): the configurations replayed in several processes give
the answer one process gives, seed for seed."""

import json

from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.cost_models import load_cost_model
from gfsim.replay_logs import open_log
from gfsim.simulator import parse_budget
from gfsim.simulator.shape import OwnShape
from gfsim.tuning.recommend import parse_config, recommendation
from gfsim.tuning.trials import TrialSetup

MODEL = load_cost_model("serverless-a100")


def _setup():
    return TrialSetup(open_log("synthetic-puct-v1"), MODEL, "all", "puct",
                      parse_budget("usd=20,steps=10"), [0], OwnShape(), children="model")


def _text(rec: dict) -> str:
    return json.dumps(rec, sort_keys=True)  # (NaN == NaN here, unlike in a dict compare)


def test_a_recommendation_in_processes_is_the_one_of_one_process():
    # A pick (all beats measuring a random fifth), so the break-even prices' replays run in
    # the processes too; three configurations on two processes.
    own = OwnShape()
    base = parse_config("random:0.2@1", "puct", own)
    cands = [parse_config(c, "puct", own) for c in ("all@1", "topk:2@2")]
    kw = dict(fresh_seeds=range(10, 13))
    one = recommendation(_setup(), cands, base, range(3), jobs=1, **kw)
    two = recommendation(_setup(), cands, base, range(3), jobs=2, **kw)
    assert not one["keeps_incumbent"] and "gpu" in one["prices"]
    assert len(one["configs"]) == 3 and one["log_surprise"] is not None
    assert _text(two) == _text(one)


def test_recommend_command_jobs_change_nothing_but_the_recorded_setting():
    args = ["recommend", "--candidate", "all@1", "--candidate", "ev:10@2", "--incumbent",
            "random:0.2@1", "--budget", "usd=20,steps=5", "--seeds", "2", "--fresh-seeds",
            "2", "--no-prices", "--json"]
    got = {}
    for jobs in ("1", "3"):
        res = CliRunner().invoke(app, [*args, "--jobs", jobs])
        assert res.exit_code == 0, res.output
        got[jobs] = json.loads(res.stdout)
    assert got["3"]["settings"]["options"]["jobs"] == 3
    assert _text(got["1"]["recommendation"]) == _text(got["3"]["recommendation"])
    bad = CliRunner().invoke(app, ["recommend", "--jobs", "-1"])
    assert bad.exit_code == 2 and "--jobs" in bad.output


def test_tune_replays_its_top_trials_in_the_trials_processes_with_one_process_answers(
        tmp_path, monkeypatch):
    # gfsim tune --jobs 2 re-scores the top trials on fresh seeds and recommends in the
    # processes its trials ran in (kept warm, then closed): the figures one process gives.
    # (The recommendation's candidates are feasible trials, all of them here: no constraint.)
    import multiprocessing

    import gfsim

    got = {}
    for jobs, recommend in ((1, True), (2, True), (1, False)):
        folder = tmp_path / f"{jobs}-{recommend}"  # a study of its own (settings name it)
        folder.mkdir()
        monkeypatch.chdir(folder)
        t = gfsim.tune("synthetic-puct-v1", "threshold", ["tau=0.3:0.95", "overgen=1:2:int"],
                       driver="puct", budget="usd=10,steps=4", seeds=3, trials=3, top=2,
                       jobs=jobs, recommend=recommend)
        got[jobs, recommend] = t.to_dict()
        assert not multiprocessing.active_children()  # the pool ended with the command
    one, two, alone = got[1, True], got[2, True], got[1, False]
    assert one["recommendation"] is not None and len(one["out_of_sample"]) == 2
    for key in ("top", "out_of_sample", "leave_one_task_out", "recommendation"):
        assert _text(two[key]) == _text(one[key]), key
    # The out-of-sample scores read the recommendation's replays on the fresh seeds: the
    # scores that replays of their own give (a tune without a recommendation).
    assert alone["recommendation"] is None
    assert _text(alone["out_of_sample"]) == _text(one["out_of_sample"])
