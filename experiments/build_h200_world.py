"""Measure a Triton task's variant space on a GPU, as a world table (``gfsim.worlds.measured``).

Run on the GPU machine, from the repository root (``PYTHONPATH=.``), one task per call:

    python experiments/build_h200_world.py --task softmax --prior DIR --out OUT --seconds 540

Three phases, all resumable (what ``--prior`` already holds is kept and not done again):

1. *binaries*: every point of the task's space (``Task.points()``) compiled ahead of time for
   the GPU's architecture in a process pool (``gfsim.live.tasks.aot.binary_features``): its
   cubin hash and the compile's register, shared-memory, spill and instruction counts. Points
   that compile to the same binaries are one kernel.
2. *measure*: the distinct binaries in an order drawn once from ``--order-seed`` (a uniform
   random permutation, so that any prefix of it is a uniform sample of the space), each
   measured through the hardened measurer (``TritonMeasurer``: sandboxed, checked, GPU clock),
   one representative point per binary, until the time is spent.
3. *confirm*: the best ``--confirm-best`` successes and ``--confirm-random`` others measured
   again, in fresh processes, so that the noise of a measurement is known.

Rows are appended and fsynced as they come, so a call cut short keeps what it measured. The
table ``OUT/TASK.jsonl`` starts with a header (device, software versions, the measurer's
configuration, the order seed); ``gfsim.worlds.measured`` reads it.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import gzip
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np

FORMAT = 1


def _features(args):
    task_name, variant, params, arch = args
    from gfsim.live.tasks import get_task
    from gfsim.live.tasks.aot import binary_features

    task = get_task(task_name)
    cand = task.candidate(variant, **params)
    return {"variant": variant, "params": params, "candidate_id": cand.candidate_id,
            **binary_features(cand, arch=arch)}


def _append(path: Path, rows: list[dict]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _read(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:  # a torn last line from a killed call: dropped, re-done
            break
    return rows


def _versions() -> dict:
    import torch
    import triton

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "triton": triton.__version__}
    if torch.cuda.is_available():
        out["device_name"] = torch.cuda.get_device_name(0)
        out["capability"] = "%d.%d" % torch.cuda.get_device_capability(0)
        out["cuda"] = torch.version.cuda
    try:
        import subprocess

        out["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError:
        pass
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--prior", type=Path, help="folder holding an earlier call's TASK.jsonl "
                    "and TASK.binaries.jsonl")
    ap.add_argument("--seconds", type=float, default=540.0, help="stop starting measurements "
                    "after this many seconds (the whole call)")
    ap.add_argument("--order-seed", type=int, default=20261202)
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--confirm-best", type=int, default=5)
    ap.add_argument("--confirm-random", type=int, default=5)
    ap.add_argument("--confirm-seconds", type=float, default=45.0,
                    help="time kept for the confirm phase at the end")
    ap.add_argument("--measure-seed", type=int, default=0)
    ap.add_argument("--pack", type=Path, metavar="DEST", help="measure nothing: write --out's "
                    "tables (after --prior's) to DEST gzipped, as gfsim ships them")
    a = ap.parse_args()
    t_start = time.monotonic()
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer
    from gfsim.live.tasks import get_task

    task = get_task(a.task)
    a.out.mkdir(parents=True, exist_ok=True)
    bin_path, table_path = a.out / f"{a.task}.binaries.jsonl", a.out / f"{a.task}.jsonl"
    if a.prior:  # plain or packed (.gz) tables of an earlier call
        for name in (bin_path.name, table_path.name, f"{a.task}.reference.jsonl"):
            if (a.out / name).exists():
                continue
            if (a.prior / name).is_file():
                shutil.copyfile(a.prior / name, a.out / name)
            elif (a.prior / f"{name}.gz").is_file():
                with gzip.open(a.prior / f"{name}.gz", "rb") as src, \
                        open(a.out / name, "wb") as dst:
                    shutil.copyfileobj(src, dst)
    if a.pack:
        return pack(task, a.out, a.pack)

    # 1. binaries
    from gfsim.core.spaces import point_key

    have = {point_key(r["variant"], r["params"]): r for r in _read(bin_path)}
    todo = [(a.task, c.variant, c.params, a.arch) for c in task.points()
            if point_key(c.variant, c.params) not in have]
    if todo:
        t0 = time.monotonic()
        with cf.ProcessPoolExecutor(a.jobs) as pool:
            batch = []
            for row in pool.map(_features, todo, chunksize=4):
                batch.append(row)
                have[point_key(row["variant"], row["params"])] = row
                if len(batch) >= 32:
                    _append(bin_path, batch)
                    batch = []
            _append(bin_path, batch)
        print(f"binaries: {len(todo)} points compiled in {time.monotonic() - t0:.0f} s "
              f"({a.jobs} processes)", flush=True)
    points = [have[point_key(c.variant, c.params)] for c in task.points()]
    by_binary: dict[str, dict] = {}
    for p in points:
        key = p.get("binary_sha256") or f"failed:{p['candidate_id']}"
        by_binary.setdefault(key, p)
    keys = sorted(by_binary)
    order = [keys[i] for i in np.random.default_rng(a.order_seed).permutation(len(keys))]
    print(f"binaries: {len(points)} points, {len(keys)} distinct kernels "
          f"({sum(1 for p in points if not p['ok'])} failed to compile ahead of time)", flush=True)

    # 2. measure
    config = MeasurerConfig(energy_window_s=0.0, seed=a.measure_seed)
    rows = _read(table_path)
    if not rows:
        header = {"kind": "header", "format": FORMAT, "task": a.task,
                  "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  "order_seed": a.order_seed, "arch": a.arch, "points": len(points),
                  "distinct_binaries": len(keys), "hardware": _versions(),
                  "measurer": {k: getattr(config, k) for k in
                               ("protocol", "rse_target", "max_reps", "energy_window_s",
                                "clock", "seed", "hidden_shapes", "ref_retime_every")},
                  "bench_shapes": task.bench_shapes, **_space_of(task)}
        _append(table_path, [header])
        rows = [header]
    done = {r["binary_sha256"] for r in rows if r.get("kind") == "measurement"}
    deadline = t_start + a.seconds
    measured = 0
    with TritonMeasurer(a.task, config) as meas:
        per = []
        for key in order:
            if key in done:
                continue
            guess = float(np.median(per)) if per else 5.0
            if time.monotonic() + guess > deadline - a.confirm_seconds:
                break
            p = by_binary[key]
            t0 = time.monotonic()
            ev = meas.measure(task.candidate(p["variant"], **p["params"]))
            per.append(time.monotonic() - t0)
            row = {"kind": "measurement", "binary_sha256": key, "candidate_id": p["candidate_id"],
                   "variant": p["variant"], "params": p["params"], "repeat": 0,
                   "measured_at": round(time.time(), 3), **_keep(ev)}
            _append(table_path, [row])
            rows.append(row)
            measured += 1
            if measured % 20 == 0:
                print(f"measure: {measured} this call, {len(done) + measured} of {len(keys)}; "
                      f"median {np.median(per):.2f} s each", flush=True)
        print(f"measure: {measured} this call; {len(done) + measured} of {len(keys)} distinct "
              f"kernels measured", flush=True)

        # 3. confirm
        first = [r for r in rows if r.get("kind") == "measurement" and r["repeat"] == 0]
        repeats = {}
        for r in rows:
            if r.get("kind") == "measurement" and r["repeat"] > 0:
                repeats[r["binary_sha256"]] = max(repeats.get(r["binary_sha256"], 0), r["repeat"])
        ok = sorted((r for r in first if r["outcome"] == "success"),
                    key=lambda r: -r["speedup"])
        pick = ok[:a.confirm_best]
        rng = np.random.default_rng([a.order_seed, len(first)])
        rest = ok[a.confirm_best:]
        if rest:
            for i in rng.choice(len(rest), size=min(a.confirm_random, len(rest)), replace=False):
                pick.append(rest[int(i)])
        confirmed = 0
        for r in pick:
            guess = float(np.median(per)) if per else 5.0
            if time.monotonic() + guess > deadline:
                break
            ev = meas.measure(task.candidate(r["variant"], **r["params"]))
            rep = repeats.get(r["binary_sha256"], 0) + 1
            repeats[r["binary_sha256"]] = rep
            _append(table_path, [{**{k: r[k] for k in ("kind", "binary_sha256", "candidate_id",
                                                       "variant", "params")},
                                  "repeat": rep, "measured_at": round(time.time(), 3),
                                  **_keep(ev)}])
            confirmed += 1
        print(f"confirm: {confirmed} re-measured", flush=True)
        refs = meas.reference_log
    _append(a.out / f"{a.task}.reference.jsonl", [{"t": time.time(), **r} for r in refs])
    print(f"done in {time.monotonic() - t_start:.0f} s", flush=True)
    return 0


def _space_of(task) -> dict:
    """The space and neighbourhood a world on this table walks (``gfsim.core.spaces``)."""
    from gfsim.core.spaces import SAME_VARIANT_CHANGES, SWITCH_CHANGES

    return {"space": {v: {k: list(vals) for k, vals in grid.items()}
                      for v, grid in task.space.items()},
            "defaults": task.defaults,
            "neighbourhood": {"same": SAME_VARIANT_CHANGES, "switch": SWITCH_CHANGES}}


def pack(task, src: Path, dest: Path) -> int:
    """``src``'s tables gzipped into ``dest``; the header gains the task's space where an
    earlier version of this script left it out (checked against the points compiled)."""
    dest.mkdir(parents=True, exist_ok=True)
    from gfsim.core.spaces import point_key

    ids = {point_key(c.variant, c.params): c.candidate_id for c in task.points()}
    binaries = _read(src / f"{task.name}.binaries.jsonl")
    rows = _read(src / f"{task.name}.jsonl")
    if {point_key(r["variant"], r["params"]) for r in binaries} != set(ids):
        raise SystemExit(f"{src}: the binaries table is not the task's space (run the "
                         "binaries phase again)")
    if not rows or rows[0].get("kind") != "header":
        raise SystemExit(f"{src}/{task.name}.jsonl: no header")
    # A point's id is its code's hash under today's templates (they may leave a parameter at
    # its implicit value out of the code: Task.implicit); the binaries are what was compiled.
    for r in binaries + rows[1:]:
        r["candidate_id"] = ids[point_key(r["variant"], r["params"])]
    rows[0] = {**_space_of(task), **rows[0]}
    for name, data in ((f"{task.name}.jsonl", rows), (f"{task.name}.binaries.jsonl", binaries),
                       (f"{task.name}.reference.jsonl",
                        _read(src / f"{task.name}.reference.jsonl"))):
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in data)
        tmp = dest / f".{name}.gz.tmp"
        with gzip.GzipFile(tmp, "wb", mtime=0) as fh:
            fh.write(text.encode())
        os.replace(tmp, dest / f"{name}.gz")
        print(f"packed {dest / (name + '.gz')}: {len(data)} rows")
    return 0


_KEEP = ("outcome", "speedup", "runtime_ns", "ref_runtime_ns", "compile_s", "check_s",
         "timing_s", "wall_s", "reason", "failed_stage", "timing_reps", "timing_rse",
         "timing_statistic", "timing_clock", "timing_capped", "timing_forged", "ref_retimed",
         "trusted_runtime_ns", "sandbox")


def _keep(ev: dict) -> dict:
    out = {}
    for k in _KEEP:
        if k in ev and ev[k] is not None:
            v = ev[k]
            out[k] = v[:500] if isinstance(v, str) else v
    return out


if __name__ == "__main__":
    sys.exit(main())
