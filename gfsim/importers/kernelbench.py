"""KernelBench results as a gfsim trajectory log (``gfsim import kernelbench RUN_DIR --baseline
FILE -o LOG``): a thin adapter over the bring-your-own-search format
(``gfsim.importers.search``).

What is read:

- ``RUN_DIR/eval_results.json`` (or the file itself), in every shape KernelBench's
  ``scripts/eval_from_generations.py`` has written: per problem id one sample object (releases
  up to v0.1), per problem id a list of samples (since the pass@k change of October 2025), or,
  in forks, per problem id an object of samples by sample id, or that nested under the level.
  A sample has ``compiled``, ``correctness``, ``runtime`` (ms, the mean of ``runtime_stats``;
  -1 when not timed), ``runtime_stats`` and ``metadata`` (the error keys).
- the baseline (``--baseline``): ``results/timing/GPU/baseline_time_torch.json`` (or a
  ``torch.compile`` variant): per level (``level1``, ...) per problem file
  (``42_Conv_...py``) the reference's timing stats in ms. Problems are matched by the number
  that starts the file name (file names changed between KernelBench versions; numbers did not).
- the level: ``level`` (``--level``), the nesting of a level-keyed file, or
  ``RUN_DIR/generation_config.yaml``'s ``level``. A ``--level`` that contradicts the run's
  ``generation_config.yaml`` is refused in one line naming both, unless ``force``
  (``--force``); one that contradicts a level-keyed file's nesting always is.
- the GPU: each sample's ``metadata.hardware`` (``torch.cuda.get_device_name``) and each
  baseline entry's ``hardware``. A baseline timed on another GPU than the results is refused
  in one line naming both (its speedups would compare two GPUs), unless ``force``. The
  results' GPU is the header's ``hardware.device_name`` unless ``device`` (``--device``) names
  one.

Mapping: each problem is a task (``level{L}/{file name}``, or ``level{L}/problem_{P}`` where
the baseline does not name it) and a search of its own; each sample a candidate, a child of
the reference (KernelBench keeps no lineage), in sample order. Outcomes:

- ``correctness`` true and ``runtime`` > 0: ``success``, speedup = the baseline's mean /
  ``runtime`` (KernelBench's own speedup); ``metadata.excessive_speedup`` (KernelBench's flag
  for a kernel more than 10x faster than the reference timed beside it) is kept;
- ``correctness`` true, not timed (``runtime`` -1): ``not_measured`` (checked, never timed);
- ``compiled`` true, not correct: ``runtime_error`` where ``metadata.runtime_error`` says so,
  else ``incorrect`` (its ``correctness_issue``);
- ``compiled`` false: ``timeout`` for ``"Evaluation timed out"``, ``runtime_error`` for a CUDA
  or other error caught in the worker, else ``compile_failed`` (its ``compilation_error``).

KernelBench logs no times, tokens or costs of generation, and ``eval_results.json`` no
per-sample elapsed seconds (its evaluator prints only a batch's), so replays impute them (and
say so). What it does record is kept on each candidate under ``kernelbench``: the kernel's timed
runs (``timed_runs_s`` = ``num_trials`` x the mean, measured: a lower bound of the timing stage,
without warm-up, compilation or checks).
A problem (a sample that lacks a field, a problem the baseline lacks, a file of another shape) is
one line naming the file, problem, sample and field; nothing is written unless the whole import
validates.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from gfsim.core.errors import GfsimError
from gfsim.importers.common import BadField, is_number, load_json, parse_key, source_name
from gfsim.replay_logs.io import read_input

__all__ = ["import_kernelbench", "read_results", "SHAPES"]

SHAPES = {"sample": "problem -> one sample (KernelBench up to v0.1)",
          "list": "problem -> list of samples (KernelBench since October 2025)",
          "by_sample": "problem -> sample id -> sample (forks)",
          "by_level": "level -> problem -> sample id -> sample (forks)"}
_SAMPLE_KEYS = ("compiled", "correctness")


def _is_sample(v) -> bool:
    return isinstance(v, dict) and any(k in v for k in _SAMPLE_KEYS)


def read_results(path: Path, level: int | None, root: Path | None = None) -> dict:
    """``{"shape": ..., "samples": [(level, problem, sample_id, sample, where)]}`` from an
    ``eval_results.json`` of any of ``SHAPES``."""
    data = load_json(path, root)
    if not isinstance(data, dict) or not data:
        raise BadField(path, None, "expected a non-empty JSON object of problems (KernelBench's "
                               "eval_results.json)")
    first = next(iter(data.values()))
    if _is_sample(first):
        shape = "sample"
    elif isinstance(first, list):
        shape = "list"
    elif isinstance(first, dict) and first and _is_sample(next(iter(first.values()))):
        shape = "by_sample"
    elif isinstance(first, dict) and first and all(isinstance(v, dict)
                                                   for v in first.values()):
        shape = "by_level"
    else:
        raise BadField(path, None, "not a shape of KernelBench's eval_results.json (known: "
                               + "; ".join(SHAPES.values()) + ")")
    samples = []

    def add(lvl, pid, sid, sample, where):
        sid = parse_key(sid, where, "sample id")
        where = f"{where}, sample {sid}"
        if not _is_sample(sample):
            raise BadField(where, None, "expected a sample object with compiled and correctness "
                                    f"(the file's shape: {SHAPES[shape]})")
        samples.append((lvl, pid, sid, sample, where))

    if shape == "by_level":
        for lkey, problems in data.items():
            lvl = parse_key(lkey, path, "level key")
            if not isinstance(problems, dict):
                raise BadField(path, None, f"level key {lvl}: expected an object of problems")
            for pkey, by_sid in problems.items():
                pid = parse_key(pkey, f"{path}: level {lvl}", "problem key")
                where = f"{path}: level {lvl}, problem {pid}"
                if not isinstance(by_sid, dict):
                    raise BadField(where, None, "expected an object of samples by sample id")
                for sid, sample in by_sid.items():
                    add(lvl, pid, sid, sample, where)
        return {"shape": shape, "samples": samples}
    for pkey, value in data.items():
        pid = parse_key(pkey, path, "problem key")
        where = f"{path}: problem {pid}"
        if shape == "sample":
            add(level, pid, (value or {}).get("sample_id", 0) if isinstance(value, dict)
                else 0, value, where)
        elif shape == "list":
            if not isinstance(value, list):
                raise BadField(where, None, "expected a list of samples")
            for k, sample in enumerate(value):
                sid = sample.get("sample_id", k) if isinstance(sample, dict) else k
                add(level, pid, sid, sample, where)
        else:
            if not isinstance(value, dict):
                raise BadField(where, None, "expected an object of samples by sample id")
            for sid, sample in value.items():
                add(level, pid, sid, sample, where)
    return {"shape": shape, "samples": samples}


def read_baseline(path: Path) -> dict:
    """``{(level, problem number): (file name, mean ms, hardware or None)}`` of a KernelBench
    baseline timing file."""
    data = load_json(path)
    if not isinstance(data, dict):
        raise BadField(path, None, "expected an object of levels (level1, level2, ...)")
    out = {}
    for lkey, problems in data.items():
        m = re.fullmatch(r"level(\w+)", str(lkey))
        if m is None or not isinstance(problems, dict):
            raise BadField(path, None, f"key {str(lkey)[:40]!r}: expected levelN holding problems")
        lvl = parse_key(m.group(1), path, f"level of key {str(lkey)[:30]!r}")
        for name, stats in problems.items():
            n = re.match(r"(\w+?)_", str(name))
            if n is None:
                raise BadField(f"{path}: level{lvl}, {str(name)[:60]!r}", None,
                               "a problem file name starts with its number")
            pid = parse_key(n.group(1), f"{path}: level{lvl}", "number of the problem file "
                            f"{str(name)[:30]!r}")
            where = f"{path}: level{lvl}, {name}"
            mean = stats.get("mean") if isinstance(stats, dict) else None
            if not (is_number(mean) and mean > 0):
                raise BadField(where, "mean", "expected the reference's mean runtime in ms (> 0)")
            hw = stats.get("hardware")
            out[(lvl, pid)] = (
                str(name), float(mean), hw if isinstance(hw, str) and hw.strip() else None)
    return out


def _config_level(run: Path) -> int | None:
    cfg = run / "generation_config.yaml"
    if not cfg.is_file():
        return None
    m = re.search(r"^level:[ \t]*(\S+)[ \t]*$",
                  read_input(cfg, root=run).decode("utf-8", "replace"), re.M)
    return parse_key(m.group(1), cfg, "level") if m else None


def _hardware(sample: dict) -> str | None:
    """The GPU a sample was evaluated on, as KernelBench records it (``metadata.hardware``,
    else ``runtime_stats.hardware``: ``torch.cuda.get_device_name``)."""
    for part in ("metadata", "runtime_stats"):
        got = sample.get(part) if isinstance(sample.get(part), dict) else {}
        if isinstance(got.get("hardware"), str) and got["hardware"].strip():
            return got["hardware"]
    return None


def check_level(level: int | None, run: Path, got: dict, force: bool) -> int | None:
    """The level to import at: ``level`` (``--level``), else the run's own. A ``level`` that
    contradicts the run's ``generation_config.yaml`` is refused in one line naming both,
    unless ``force``; one that contradicts a level-keyed file's nesting is always refused (that
    file's levels are its own)."""
    recorded = _config_level(run)
    if got["shape"] == "by_level":
        nested = sorted({s[0] for s in got["samples"]})
        if level is not None and nested != [level]:
            raise GfsimError(f"`level` {level} contradicts the levels the results are keyed by "
                             f"({', '.join(map(str, nested))}); leave `level` out")
        return level
    if level is None:
        return recorded
    if recorded is not None and recorded != level and not force:
        raise GfsimError(f"`level` {level} contradicts the run's level {recorded} "
                         f"({run / 'generation_config.yaml'}); give `level` {recorded}, or "
                         "`force` to import it as level " + str(level))
    return level


def check_hardware(samples: list, base: dict, results: Path, base_path: Path,
                   force: bool) -> dict:
    """The GPUs the results and the baseline were timed on (``{"results": [...],
    "baseline": [...]}``, as each records them); a baseline timed on another GPU than the
    results is refused in one line naming both (its speedups would compare two GPUs), unless
    ``force``."""
    ran = sorted({hw for s in samples if (hw := _hardware(s[3]))})
    timed = sorted({base[(s[0], s[1])][2] for s in samples
                    if (s[0], s[1]) in base and base[(s[0], s[1])][2]})
    if ran and timed and ran != timed and not force:
        raise GfsimError(f"{base_path}: `baseline` was timed on {', '.join(timed)}, the "
                         f"results ({results}) on {', '.join(ran)}; give the baseline of the "
                         "results' GPU (KernelBench's results/timing/GPU/), or `force`")
    return {"results": ran, "baseline": timed}


def _outcome(sample: dict, where: str) -> tuple[str, str | None]:
    meta = sample.get("metadata") if isinstance(sample.get("metadata"), dict) else {}
    for field in _SAMPLE_KEYS:
        if not isinstance(sample.get(field), bool):
            raise BadField(where, field, "expected true or false")

    def text(*keys):
        for k in keys:
            v = meta.get(k)
            if v not in (None, "", []):
                return str(v)[-4000:]
        return None

    if sample["correctness"]:
        return "success", None
    if sample["compiled"]:
        err = text("runtime_error", "runtime_error_traceback")
        if err:
            return "runtime_error", err
        return "incorrect", text("correctness_issue") or "incorrect output"
    err = text("error", "other_error", "cuda_error", "gpu_error", "compilation_error")
    if meta.get("error") == "Evaluation timed out":
        return "timeout", err
    if text("cuda_error", "other_error", "gpu_error", "error") and not text(
            "compilation_error"):
        return "runtime_error", err
    return "compile_failed", err or "did not compile"


def import_kernelbench(run_dir, out, *, baseline, level: int | None = None,
                       device: str = "unknown", provenance: str = "measured",
                       log_id: str | None = None, force: bool = False) -> dict:
    """Write a trajectory log for KernelBench results; returns a summary (see the module doc
    for the mapping). ``baseline`` is KernelBench's baseline timing file for the GPU the
    results were measured on: one timed on another GPU, or a ``level`` that contradicts the
    run's ``generation_config.yaml``, is refused unless ``force``."""
    from gfsim.core.inputs import check_output
    from gfsim.importers.search import import_records

    src = Path(run_dir)
    path, run = (src / "eval_results.json", src) if src.is_dir() else (src, src.parent)
    root = run if src.is_dir() else None  # a run folder's files are read inside it
    base_path = Path(baseline)
    # the run folder is read where it is given, or holds the generation_config.yaml read
    check_output(out, [src, base_path, run if (run / "generation_config.yaml").is_file()
                       else None])
    if not path.is_file():
        raise GfsimError(f"{path}: no such file (give a KernelBench run folder or its "
                         "eval_results.json)")
    got = read_results(path, level if level is not None else _config_level(run), root)
    check_level(level, run, got, force)
    if not base_path.is_file():
        raise GfsimError(f"{base_path}: `baseline`: no such file")
    base = read_baseline(base_path)
    hardware = check_hardware(got["samples"], base, path, base_path, force)
    if device == "unknown" and len(hardware["results"]) == 1:
        device = hardware["results"][0]  # what the results record, where --device is not given
    records = []
    counts: dict[str, int] = {}
    flagged = 0
    rows = sorted(got["samples"], key=lambda s: (s[0] or 0, s[1], s[2]))
    for order, (lvl, pid, sid, sample, where) in enumerate(rows):
        if lvl is None:
            raise GfsimError(f"{path}: the level is not known: give `level` (or a "
                             "generation_config.yaml with level beside the results)")
        name, ref, _ = base.get((lvl, pid), (None, None, None))
        task = f"level{lvl}/{name[:-3] if name and name.endswith('.py') else name}" if name \
            else f"level{lvl}/problem_{pid}"
        outcome, error = _outcome(sample, where)
        runtime = sample.get("runtime")
        meta = sample.get("metadata") if isinstance(sample.get("metadata"), dict) else {}
        rec = {"id": f"L{lvl}-P{pid}-S{sid}", "parent": None, "order": order, "task": task,
               "search": task, "error": error}
        if outcome == "success":
            if not (is_number(runtime) and runtime > 0):
                outcome, rec["error"] = "not_measured", None  # correct, never timed
            elif ref is None:
                raise BadField(where, None, f"level {lvl} problem {pid} is not in the baseline "
                                        f"{base_path} (a baseline of another level set?)")
            else:
                rec["speedup"] = ref / float(runtime)
                flagged += meta.get("excessive_speedup") is True
        rec["outcome"] = outcome
        stats = sample.get("runtime_stats") if isinstance(sample.get("runtime_stats"),
                                                          dict) else {}
        rec["kernelbench"] = {
            "level": lvl, "problem": pid, "sample": sid, "problem_file": name,
            "runtime_ms": runtime if is_number(runtime) else None,
            "reference_ms": ref, "runtime_stats": stats or None,
            "hardware": _hardware(sample),
            "correctness_trials": meta.get("correctness_trials"),
            "timed_runs_s": _timed_runs_s(stats),
            "excessive_speedup": meta.get("excessive_speedup") is True or None}
        counts[outcome] = counts.get(outcome, 0) + 1
        records.append((where, rec))
    if not records:
        raise BadField(path, None, "no samples")
    digest = hashlib.sha256(read_input(path, root=root)).hexdigest()
    prov = {"kind": provenance,
            "note": f"imported by gfsim import kernelbench from {source_name(path, 2)}",
            "source": source_name(path, 2), "sha256": digest,
            "kernelbench": {"shape": got["shape"], "format": SHAPES[got["shape"]],
                            "hardware": hardware,
                            **({"forced": "--force: a contradicting level or baseline GPU "
                                          "was let through"} if force else {}),
                            "baseline": source_name(base_path, 2),
                            "baseline_sha256": hashlib.sha256(read_input(base_path))
                            .hexdigest()},
            "speedup": "the baseline's mean runtime / the sample's runtime (ms), as "
                       "KernelBench computes it"}
    summary = import_records(
        records, out, source=path, provenance=prov, device=device,
        log_id=log_id or source_name(run),
        header_fields={"generator": {"model": "unknown (KernelBench records no generation)"}},
        run_configuration={"kernelbench": {
            "evaluation": "independent samples per problem, each a child of the reference"}},
        driver="kernelbench")
    summary.update(source=str(path), shape=got["shape"], problems=len({(r["kernelbench"][
        "level"], r["kernelbench"]["problem"]) for _, r in records}), outcomes=counts,
        excessive_speedup_flags=flagged)
    return summary


def _timed_runs_s(stats: dict) -> float | None:
    """Seconds of a sample's timed kernel runs (``num_trials`` x the mean ms), where recorded."""
    n, mean = stats.get("num_trials"), stats.get("mean")
    if is_number(n) and n > 0 and is_number(mean) and mean > 0:
        return round(n * mean / 1000.0, 9)
    return None
