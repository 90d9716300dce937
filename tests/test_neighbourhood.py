"""The wide mutation operator (``gfsim.core.spaces``, ``Task.neighbourhood``) and the compiled
binaries it is counted by: every point of every task has at least 64 neighbours, distinct by
parameters, and on the shipped H200 tables distinct by compiled binary too."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gfsim.core.spaces import neighbours, point_key, points, project
from gfsim.live.tasks import TASKS, get_task

SPACE = {"a": {"X": (1, 2, 3), "Y": ("p", "q")}, "b": {"X": (2, 4), "Z": (0, 1, 2)}}
DEFAULTS = {"a": {"X": 1, "Y": "p"}, "b": {"X": 4, "Z": 0}}


def test_a_small_space_by_hand():
    assert list(points(SPACE))[:2] == [("a", {"X": 1, "Y": "p"}), ("a", {"X": 1, "Y": "q"})]
    assert len(list(points(SPACE))) == 6 + 6
    assert project(SPACE, DEFAULTS, {"X": 2, "Y": "q"}, "b") == {"X": 2, "Z": 0}
    assert project(SPACE, DEFAULTS, {"X": 3, "Y": "q"}, "b") == {"X": 4, "Z": 0}  # 3 not in b
    got = neighbours(SPACE, DEFAULTS, "a", {"X": 1, "Y": "p"}, same=1, switch=1)
    keys = [point_key(v, p) for v, p in got]
    # one change in a: X to 2 or 3, Y to q; then b carried over (X=4, Z=0) and one change of it
    assert keys == [point_key("a", {"X": 2, "Y": "p"}), point_key("a", {"X": 3, "Y": "p"}),
                    point_key("a", {"X": 1, "Y": "q"}), point_key("b", {"X": 4, "Z": 0}),
                    point_key("b", {"X": 2, "Z": 0}), point_key("b", {"X": 4, "Z": 1}),
                    point_key("b", {"X": 4, "Z": 2})]
    both = neighbours(SPACE, DEFAULTS, "a", {"X": 1, "Y": "p"}, same=2, switch=2)
    # a: 3 single changes + 2 pairs; b: its projection, 3 single changes, 2 pairs
    assert len(both) == len({point_key(v, p) for v, p in both}) == 5 + 6
    assert ("a", {"X": 1, "Y": "p"}) not in both


@pytest.mark.parametrize("name", list(TASKS))
def test_every_point_has_at_least_64_distinct_valid_neighbours(name):
    task = get_task(name)
    sizes = []
    for parent in task.points():
        kids = task.neighbourhood(parent)
        sizes.append(len(kids))
        assert len({c.candidate_id for c in kids}) == len(kids)  # distinct code
        assert parent.candidate_id not in {c.candidate_id for c in kids}
        for c in kids[:: max(1, len(kids) // 7)]:
            task.validate(c.variant, c.params)
            assert c.parent == parent.candidate_id
    assert min(sizes) >= 64, (name, min(sizes))


def test_mutate_wide_is_keyed_and_draws_from_the_neighbourhood():
    task = get_task("softmax")
    parent = task.candidates()[0]
    hood = {c.candidate_id for c in task.neighbourhood(parent)}
    a = [task.mutate_wide(parent, np.random.default_rng(5)).candidate_id for _ in range(3)]
    assert len(set(a)) == 1 and a[0] in hood
    many = {task.mutate_wide(parent, np.random.default_rng(s)).candidate_id for s in range(60)}
    assert len(many) > 30 and many <= hood


def test_the_shipped_tables_count_64_distinct_binaries_around_every_point():
    """The whole space of each shipped table was compiled on the H200's own Triton: a point's
    neighbourhood holds at least 64 binaries other than its own."""
    from gfsim.worlds.measured import load_table, shipped_tables

    assert len(shipped_tables()) >= 3
    for name in shipped_tables():
        table = load_table(name)
        task = get_task(table.task)
        # the table's space is the task's space today
        assert table.space == {v: {p: tuple(x) for p, x in g.items()}
                               for v, g in task.space.items()}
        assert len(table.points) == len(list(task.points()))
        for p in list(table.points.values())[::7]:  # ids are today's render of the point
            assert p["candidate_id"] == task.candidate(p["variant"], **p["params"]).candidate_id
        worst = min(
            len({table.points[point_key(v, q)]["binary"] for v, q in
                 neighbours(table.space, table.defaults, p["variant"], p["params"],
                            *table.radii)} - {p["binary"]})
            for p in table.points.values())
        assert worst >= 64, (name, worst)


def test_binary_features_tell_kernels_apart_without_a_gpu():
    pytest.importorskip("triton")
    from gfsim.live.tasks.aot import FEATURES, binary_features

    task = get_task("fp8_quant")
    a = task.candidate("one_group", NUM_WARPS=1, SCALE="div")
    b = task.candidate("one_group", NUM_WARPS=2, SCALE="div")
    fa, fa2, fb = binary_features(a), binary_features(a), binary_features(b)
    assert fa["ok"] and fb["ok"], (fa, fb)
    assert fa["binary_sha256"] == fa2["binary_sha256"] != fb["binary_sha256"]
    for k in FEATURES:
        assert isinstance(fa[k], int) and fa[k] >= 0
    assert fa["regs_max"] > 0 and fa["sass_instructions"] > 10 and fa["kernels"] == 1
    json.dumps(fa)
    broken = task.candidate("one_group", NUM_WARPS=1, SCALE="div")
    object.__setattr__(broken, "code", broken.code.replace("tl.max(", "tl.no_such_op("))
    bad = binary_features(broken)
    assert not bad["ok"] and "no_such_op" in bad["error"]


def test_a_parameter_added_later_leaves_old_candidates_code_unchanged():
    """NUM_STAGES joined softmax's and layernorm's looped variants after logs of them were
    written: at Triton's default (3) it is not written into the code, so an old log's
    parameters, completed, render the code that was measured."""
    for name, variant, old in (("softmax", "online", {"NUM_WARPS": 4, "BLOCK": 1024,
                                                      "LANES": 0, "EVICT": "none"}),
                               ("layernorm", "two_loop", {"NUM_WARPS": 4, "BLOCK": 1024,
                                                          "AFFINE": "fused"})):
        task = get_task(name)
        params = task.complete(variant, old)
        assert params["NUM_STAGES"] == 3
        code = task.render(variant, params)
        assert "NUM_STAGES" not in code and "num_stages" not in code
        other = task.render(variant, {**params, "NUM_STAGES": 2})
        assert "NUM_STAGES = 2" in other and "num_stages=NUM_STAGES" in other
        assert '"num_stages": NUM_STAGES' in other and "[[" not in other and "[[" not in code


@pytest.mark.parametrize("name", sorted(TASKS))
def test_a_point_has_one_source_whatever_the_order_of_its_parameters(name):
    """A mutation that switches variant gathers the parameters in the variant's order, one
    that moves a parameter keeps its parent's order: both must give the same source, or the
    live driver measures one kernel twice and the cost model distrusts the code (it ran on the
    H200 before this held: 5 points measured under two sources in 520 candidates)."""
    task = get_task(name)
    for variant, params in list(points(task.space))[::7]:
        shuffled = dict(reversed(list(params.items())))
        assert task.render(variant, shuffled) == task.render(variant, params)
        completed = task.complete(variant, shuffled)
        assert task.render(variant, completed) == task.render(variant, params)
