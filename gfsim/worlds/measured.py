"""A measured world: a Triton task's variant space, every kernel in it timed once on a real GPU.

The tables ship in ``gfsim/worlds/data/h200`` (built by ``experiments/build_h200_world.py`` on
an H200 through the hardened measurer; ``--world h200:TASK``). Per task, three gzipped JSON
Lines files:

- ``TASK.binaries.jsonl.gz``: every point of the space (variant, params), compiled ahead of
  time for the GPU: its binary's SHA-256 and the compile's register, shared-memory, spill and
  SASS instruction counts (``gfsim.live.tasks.aot.binary_features``);
- ``TASK.jsonl.gz``: a header (device, software versions, measurer configuration, the space and
  its neighbourhood, the order seed), then one ``measurement`` per distinct binary, in the
  seeded random order they were measured in (so the measured ones are a uniform sample of the
  space until all are), and ``repeat`` > 0 rows re-measuring some of them (the noise);
- ``TASK.reference.jsonl.gz``: every timing of the PyTorch baseline during the runs.

As a world (one task per table):

- a node is a point whose binary was measured; its measurement is the table's first one
  (outcome, speedup against the baseline timed beside it, compile, check and timing seconds):
  MEASURED. Points with the same binary are one kernel (``code_id`` is the binary's hash);
- a child of a point is drawn, keyed by (world seed, parent, index), uniformly among the
  measured points of its neighbourhood (``gfsim.core.spaces.neighbours``: one or two
  parameters changed, or another variant carried over with up to two changed); a point with
  no measured neighbour gives itself back;
- the seed kernel is a measured success drawn (keyed by the world seed) among those whose
  speedup lies between the 30th and 70th percentile; the reference runtime is the median of
  the baseline's timings;
- forecasts come from a what-if forecaster of stated quality centred on the true log2 speedup;
  generation seconds are ASSUMPTIONS (``gfsim.worlds.kit.Priors``), since no LLM generated the
  kernels, and the cold start is 0: the measured compile seconds include the sandboxed
  process's start.

Where the table covers only part of the space, the world is the measured part: its
neighbourhoods are the measured parts of the space's (``coverage`` in the provenance), a fair
sample because the measuring order is uniform.
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import statistics
from importlib import resources
from pathlib import Path

from gfsim.core.errors import GfsimError
from gfsim.core.rng import stream
from gfsim.core.spaces import neighbours, point_key
from gfsim.forecasts.learned import BINARY_FEATURES
from gfsim.worlds.kit import KitNode, KitTask, KitWorld, Priors, node_id_of, whatif_of

__all__ = ["MeasuredWorld", "MeasuredTable", "load_table", "shipped_tables", "find_table",
           "DEFAULT_FORECASTER", "SPEC_PREFIX"]

SPEC_PREFIX = "h200:"
DEFAULT_FORECASTER = {"sigma": 0.7, "beta": 0.7, "temp": 1.0, "parse_fail": 0.01}
FORMAT = 1


def _shipped_dir() -> Path:
    return Path(str(resources.files("gfsim.worlds").joinpath("data/h200")))


def shipped_tables() -> list[str]:
    """The task names of the tables gfsim ships."""
    d = _shipped_dir()
    return sorted(p.name[:-len(".jsonl.gz")] for p in d.glob("*.jsonl.gz")
                  if p.name.count(".") == 2)


def find_table(name: str) -> Path:
    """A table by task name (a shipped one) or by path to its ``TASK.jsonl[.gz]``."""
    p = Path(name).expanduser()
    if p.is_file():
        return p
    if "/" not in name and (_shipped_dir() / f"{name}.jsonl.gz").is_file():
        return _shipped_dir() / f"{name}.jsonl.gz"
    raise GfsimError(f"`world` {SPEC_PREFIX}{name}: no such measured table (shipped: "
                     f"{', '.join(shipped_tables()) or 'none'}; or give a path to TASK.jsonl.gz)")


def _lines(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    rows = []
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise GfsimError(f"{path}:{n}: not JSON ({exc})") from None
                if not isinstance(row, dict):
                    raise GfsimError(f"{path}:{n}: expected a JSON object")
                rows.append(row)
    except (OSError, EOFError) as exc:
        raise GfsimError(f"{path}: cannot read: {exc}") from None
    return rows


def _sibling(path: Path, suffix: str) -> Path:
    stem = path.name.split(".")[0]
    for name in (f"{stem}.{suffix}.jsonl.gz", f"{stem}.{suffix}.jsonl"):
        if (path.parent / name).is_file():
            return path.parent / name
    raise GfsimError(f"{path}: its {suffix} table ({stem}.{suffix}.jsonl.gz) is missing")


class MeasuredTable:
    """One task's table, parsed: points, measurements, the measured neighbourhoods."""

    def __init__(self, path: Path):
        self.path = path
        rows = _lines(path)
        if not rows or rows[0].get("kind") != "header":
            raise GfsimError(f"{path}:1: expected a header record (kind: header)")
        head = self.header = rows[0]
        if head.get("format") != FORMAT:
            raise GfsimError(f"{path}:1: field format: {head.get('format')!r} is not {FORMAT}")
        for field in ("task", "space", "defaults", "neighbourhood", "hardware"):
            if field not in head:
                raise GfsimError(f"{path}:1: field {field}: missing")
        self.task = str(head["task"])
        self.space = {v: {k: tuple(vals) for k, vals in grid.items()}
                      for v, grid in head["space"].items()}
        self.defaults = head["defaults"]
        self.radii = (int(head["neighbourhood"]["same"]), int(head["neighbourhood"]["switch"]))
        self.device = str(head["hardware"].get("device_name", "unknown GPU"))
        bin_path = _sibling(path, "binaries")
        self.points: dict[str, dict] = {}
        for n, row in enumerate(_lines(bin_path), 1):
            for field in ("variant", "params", "ok"):
                if field not in row:
                    raise GfsimError(f"{bin_path}:{n}: field {field}: missing")
            key = point_key(row["variant"], row["params"])
            self.points[key] = {**row, "binary": row.get("binary_sha256")
                                or f"failed:{row.get('candidate_id', key)}"}
        self.first: dict[str, dict] = {}
        self.repeats: dict[str, list[dict]] = {}
        for n, row in enumerate(rows[1:], 2):
            if row.get("kind") != "measurement":
                raise GfsimError(f"{path}:{n}: field kind: {row.get('kind')!r} is not "
                                 "measurement")
            for field in ("binary_sha256", "outcome", "repeat", "wall_s"):
                if field not in row:
                    raise GfsimError(f"{path}:{n}: field {field}: missing")
            if row["outcome"] == "success" and not (
                    isinstance(row.get("speedup"), (int, float)) and row["speedup"] > 0):
                raise GfsimError(f"{path}:{n}: field speedup: a success needs a speedup > 0")
            key = row["binary_sha256"]
            if row["repeat"] == 0:
                if key in self.first:
                    raise GfsimError(f"{path}:{n}: binary {key[:12]} measured twice as "
                                     "repeat 0")
                self.first[key] = row
            else:
                self.repeats.setdefault(key, []).append(row)
        # The world's nodes: points whose binary was measured, in the space's order.
        self.measured = [k for k, p in self.points.items() if p["binary"] in self.first]
        self._measured_set = set(self.measured)
        if len(self.measured) < 2:
            raise GfsimError(f"{path}: fewer than two measured points: not a world")
        refs = [r["ref_runtime_ns"] for r in self.first.values() if r.get("ref_runtime_ns")]
        if not refs:
            raise GfsimError(f"{path}: no measurement has ref_runtime_ns")
        self.reference_ns = float(statistics.median(refs))
        self.distinct = len({p["binary"] for p in self.points.values()})

    def measurement(self, key: str) -> dict:
        return self.first[self.points[key]["binary"]]

    @functools.lru_cache(maxsize=None)  # noqa: B019 - one table per process, kept for its life
    def neighbours(self, key: str) -> tuple[str, ...]:
        """The measured points of ``key``'s neighbourhood, in the neighbourhood's order."""
        p = self.points[key]
        out = []
        for v, params in neighbours(self.space, self.defaults, p["variant"], p["params"],
                                    *self.radii):
            k = point_key(v, params)
            if k in self._measured_set:
                out.append(k)
        return tuple(out)

    def successes(self) -> list[str]:
        return [k for k in self.measured if self.measurement(k)["outcome"] == "success"]

    def noise(self) -> dict:
        """The re-measured kernels' spread: the median and largest |log2(repeat / first)|."""
        d = [abs(math.log2(r["speedup"] / self.first[k]["speedup"]))
             for k, reps in self.repeats.items() for r in reps
             if r.get("outcome") == "success" and self.first[k].get("outcome") == "success"]
        return {"remeasured": len(d), "median_abs_log2": statistics.median(d) if d else None,
                "max_abs_log2": max(d) if d else None}


@functools.lru_cache(maxsize=16)
def _table(path: str, mtime_ns: int, size: int) -> MeasuredTable:
    return MeasuredTable(Path(path))


def load_table(name: str) -> MeasuredTable:
    path = find_table(name)
    st = path.stat()
    return _table(str(path.resolve()), st.st_mtime_ns, st.st_size)


class MeasuredWorld(KitWorld):
    """One task per measured table (module docstring). ``tables``: task names or paths;
    ``forecaster``: the what-if forecaster's sigma, beta, temp and parse_fail."""

    # Logs of this world score forecasts against labels in the paper's bins, the bins its
    # forecasts (what-if, cost model) are given in.
    label_bin_convention = "paper"

    def __init__(self, tables, seed: int = 0, forecaster: dict | None = None):
        self.seed = self._check_seed(seed)
        if isinstance(tables, (str, Path)):
            tables = [tables]
        self.priors = Priors()
        self.forecaster_spec = dict(forecaster or DEFAULT_FORECASTER)
        self.whatif = whatif_of(self.forecaster_spec, self.seed)
        self.tables: dict[str, MeasuredTable] = {}
        self.tasks: list[KitTask] = []
        self._roots: dict[str, KitNode] = {}
        for name in tables:
            table = load_table(str(name))
            tid = f"h200-{table.task}"
            if tid in self.tables:
                raise GfsimError(f"`world` {SPEC_PREFIX}: {name} is given twice")
            self.tables[tid] = table
            ok = table.successes()
            speeds = sorted(table.measurement(k)["speedup"] for k in ok)
            lo = speeds[int(0.3 * (len(speeds) - 1))]
            hi = speeds[int(math.ceil(0.7 * (len(speeds) - 1)))]
            seeds = [k for k in ok if lo <= table.measurement(k)["speedup"] <= hi
                     and table.neighbours(k)]
            if not seeds:
                raise GfsimError(f"{table.path}: no mid-range success has a measured "
                                 "neighbour: not a world")
            key = seeds[int(stream(self.seed, "measured-seed", tid).integers(len(seeds)))]
            m = table.measurement(key)
            seed_speedup = float(f"{m['speedup']:.6g}")
            best = max(speeds)
            self.tasks.append(KitTask(
                tid, f"{table.task} on {table.device}: {len(table.measured)} of "
                     f"{len(table.points)} points measured ({table.distinct} distinct "
                     f"binaries in the space); reference = the PyTorch baseline, median "
                     f"{table.reference_ns / 1e3:.4g} us over the timed shapes",
                round(table.reference_ns, 3), seed_speedup,
                {"headroom_speedup": round(best, 6)}))
            self._roots[tid] = self._node(tid, key, f"{tid}-root", None, 0, None)
        if not self.tasks:
            raise GfsimError(f"`world` {SPEC_PREFIX}: no table given")
        self._index_tasks()

    def _node(self, tid: str, key: str, nid: str, parent: KitNode | None, depth: int,
              gen_s: float | None) -> KitNode:
        table = self.tables[tid]
        m = table.measurement(key)
        ok = m["outcome"] == "success"
        speedup = float(f"{m['speedup']:.6g}") if ok else None
        log2_s = math.log2(m["speedup"]) if ok else (parent.log2_speedup if parent else 0.0)
        stage = (0.0, float(m.get("compile_s", 0.0)), float(m.get("check_s", 0.0)),
                 float(m.get("timing_s", 0.0)))
        if gen_s is None:
            gen_s = self.priors.draw_times(self.seed, nid)[0]
        return KitNode(nid, tid, parent.node_id if parent else None, depth,
                       table.points[key]["binary"], (key,), log2_s,
                       parent.log2_speedup if parent else None, m["outcome"], speedup, stage,
                       gen_s)

    def child(self, parent: KitNode, index: int) -> KitNode:
        index = self._check_child(parent, index)
        tid = parent.task_id
        table = self.tables[tid]
        options = table.neighbours(parent.state[0])
        nid = node_id_of(tid, parent.node_id, index)
        if options:
            u = stream(self.seed, tid, parent.node_id, index).random()
            key = options[int(u * len(options))]
        else:
            key = parent.state[0]
        return self._node(tid, key, nid, parent, parent.depth + 1, None)

    def describe(self, node: KitNode) -> dict:
        """The candidate's ``source_meta``: its variant, parameters and what its ahead-of-time
        compile reported (``gfsim.live.tasks.aot.FEATURES``, compile seconds included)."""
        p = self.tables[node.task_id].points[node.state[0]]
        feats = {k: p[k] for k in (*BINARY_FEATURES, "seconds") if k in p}
        return {"variant": p["variant"], "params": dict(p["params"]), "features": feats}

    def provenance(self) -> dict:
        tables = []
        for t in self.tables.values():
            h = t.header
            tables.append({
                "task": t.task, "file": t.path.name, "device": t.device,
                "hardware": h["hardware"], "created_at": h.get("created_at"),
                "points": len(t.points), "distinct_binaries": t.distinct,
                "measured_points": len(t.measured), "measured_binaries": len(t.first),
                "coverage": round(len(t.measured) / len(t.points), 4),
                "order_seed": h.get("order_seed"), "measurer": h.get("measurer"),
                "reference_ns": t.reference_ns, "noise": t.noise()})
        return {"kind": "measured", "world": "h200",
                "note": ("outcomes, speedups and compile, check and timing seconds are "
                         "measurements of every kernel in the table on the GPU named, through "
                         "gfsim's sandboxed measurer; the search over them (the wide "
                         "mutation operator), the forecasts (a what-if forecaster) and the "
                         "generation seconds are SYNTHETIC assumptions"),
                "device_name": ", ".join(dict.fromkeys(t.device for t in self.tables.values())),
                "seed": self.seed, "tables": tables, "forecaster": self.whatif.name,
                "priors": self.priors.as_dict()}
