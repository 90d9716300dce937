"""``ArchiveBank`` (many archives as arrays) keeps ``PuctArchive``'s rules to the bit.

A bank of searches and one ``PuctArchive`` per search take the same random steps: parents
chosen by each (they must agree), children with random rewards (ties and failures included),
duplicate codes, small capacities that force truncation, several parents per step and
different shapes per search. Every selection and every column is compared.
"""

import math

import numpy as np
import pytest

from gfsim.simulator.closed.puct import ArchiveNode, ChildResult, PuctArchive
from gfsim.simulator.closed.bank import ArchiveBank
from gfsim.simulator.closed.engine import SearchConfig


def random_config(rng) -> SearchConfig:
    return SearchConfig(steps=int(rng.integers(1, 14)),
                        parents_per_step=int(rng.integers(1, 4)),
                        samples_per_parent=int(rng.integers(1, 5)),
                        k_per_parent=int(rng.integers(1, 5)),
                        capacity=int(rng.choice([3, 5, 8, 1000])),
                        c_puct=float(rng.choice([0.0, 0.5, 1.0, 2.0])))


def random_children(rng, parent: ArchiveNode, k: int, n: int, tied: bool) -> list:
    out = []
    for j in range(n):
        u = rng.random()
        reward = None if u < 0.2 else (float(rng.choice([0.5, 1.0, 2.0])) if tied
                                       else float(rng.lognormal(0, 0.5)))
        code = None if rng.random() < 0.5 else f"code{int(rng.integers(6))}"
        out.append(ChildResult(parent.node_id, f"{parent.node_id}/{k}.{j}", reward, code))
    return out


@pytest.mark.parametrize("case", range(40))
def test_a_bank_chooses_and_updates_as_one_archive_per_search(case):
    rng = np.random.default_rng(case)
    searches = int(rng.integers(1, 7))
    configs = [random_config(rng) for _ in range(searches)]
    tied = bool(case % 2)
    roots = [ArchiveNode("seed", float(rng.choice([1.0, rng.uniform(0.5, 2)])), (),
                         is_seed=True) for _ in configs]
    singles = [PuctArchive(ArchiveNode(r.node_id, r.reward, (), is_seed=True),
                           k_per_parent=c.k_per_parent, capacity=c.capacity, c_puct=c.c_puct)
               for r, c in zip(roots, configs)]
    bank = ArchiveBank(roots, configs)
    for step in range(max(c.steps for c in configs)):
        rows = [k for k, c in enumerate(configs) if step < c.steps]
        chosen = bank.select(rows, [configs[k].parents_per_step for k in rows])
        updates = []
        for k, parents in zip(rows, chosen):
            expected = singles[k].select_parents(configs[k].parents_per_step)
            assert [p.node_id for p in parents] == [p.node_id for p in expected]
            children = [c for p in expected for c in random_children(
                rng, p, step, int(rng.integers(0, 6)), tied)]
            singles[k].complete_step(expected, children)
            updates.append((k, parents, children))
        bank.complete(updates)
        for k, single in enumerate(singles):
            n = single._n
            assert bank.size(k) == len(single.nodes) == n
            assert [m.node_id for m in bank.nodes[k]] == [m.node_id for m in single.nodes]
            assert bank.expansions[k] == single.expansions
            assert bank._scale(k) == single._scale()
            np.testing.assert_array_equal(bank._r[k, :n], single._r[:n])
            np.testing.assert_array_equal(bank._v[k, :n], single._v[:n])
            np.testing.assert_array_equal(bank._b[k, :n], single._b[:n])
            np.testing.assert_array_equal(bank._ser[k, :n], single._ser[:n])
            np.testing.assert_array_equal(bank._dep[k, :n], single._dep[:n])
            depth = single._anc.shape[1]
            width = min(depth, bank._anc.shape[2])
            np.testing.assert_array_equal(bank._anc[k, :n, :width], single._anc[:n, :width])
            assert bank._codes[k] == single._codes


def test_the_root_alone_is_chosen_once_and_a_wider_step_finds_no_more():
    bank = ArchiveBank([ArchiveNode("seed", 1.0, (), is_seed=True)], [SearchConfig()])
    assert [[p.node_id for p in ps] for ps in bank.select([0], [3])] == [["seed"]]
    assert math.isnan(bank._b[0, 0])
