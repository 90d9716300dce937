"""Key digits against every importer that reads numbers from keys or ids (issue 52).

``experiments/fuzz_logs.py`` fuzzes gfsim's own logs; this fuzzes what the importers read as
numbers from other tools' files: KernelBench's level, problem and sample keys (each shape), its
baseline's ``levelN`` keys and ``N_name.py`` file names, ``generation_config.yaml``'s level,
OpenEvolve's ``Iteration N:`` log lines and ``checkpoint_N`` folders, and the GPU-forecasters
eval set's bin keys. Each case puts one digit-like value (a Unicode digit such as ``²`` or
``١``, a full-width digit, 19 or 5,000 digits, a sign, a space, an underscore, an exponent,
an empty string) in one place and runs the ``gfsim import`` command in this process. A case
fails as **crashed** where the command ends in anything but exit 0 or gfsim's one-line input
error (exit 2 with one line), and as **misread** where a value that is not a plain ASCII
decimal of at most 18 digits is imported (exit 0).

    python experiments/fuzz_importer_keys.py --cases 500 --seed 1

Exit status 1 if any case failed. Peak memory is printed (``ru_maxrss``).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
VALUES = ["²", "١", "٣", "１", "𝟙", "Ⅻ", "9" * 5000, "9" * 19, "1" * 18, "-1", "+1", " 1",
          "1_000", "1e3", "0x1", "", "0" * 30, "1\x00", "12", "007"]
PLACES = ("kb_level_key", "kb_problem_key", "kb_sample_key", "kb_list_sample_id",
          "kb_baseline_level", "kb_baseline_file", "kb_config_level", "oe_iteration",
          "oe_checkpoint", "gf_bin_key")


def _kernelbench(tmp: Path, place: str, value: str) -> list[str]:
    run = tmp / "run"
    shape = "list" if place in ("kb_list_sample_id", "kb_config_level") else "by_level"
    shutil.copytree(DATA / "kernelbench" / "runs" / shape, run)
    base = tmp / "baseline.json"
    shutil.copy(DATA / "kernelbench" / "baseline_time_torch.json", base)
    res = run / "eval_results.json"
    data = json.loads(res.read_text())
    if place == "kb_level_key":
        data = {value: data["1"]}
    elif place == "kb_problem_key":
        data = {"1": {value: data["1"]["1"]}}
    elif place == "kb_sample_key":
        data = {"1": {"1": {value: data["1"]["1"]["0"]}}}
    elif place == "kb_list_sample_id":
        data["1"][0]["sample_id"] = "@@"
    elif place == "kb_config_level":
        (run / "generation_config.yaml").write_text(f"level: {value}\n")
    else:
        b = json.loads(base.read_text())
        if place == "kb_baseline_level":
            b = {f"level{value}": b["level1"]}
        else:
            name = next(iter(b["level1"]))
            b["level1"][f"{value}_{name.partition('_')[2]}"] = b["level1"].pop(name)
        base.write_text(json.dumps(b, ensure_ascii=False))
    text = json.dumps(data, ensure_ascii=False)
    if place == "kb_list_sample_id":  # a bare JSON number where the value is digits
        text = text.replace('"@@"', value if value.isascii() and value.isdigit()
                            else json.dumps(value))
    res.write_text(text)
    return ["import", "kernelbench", str(run), "--baseline", str(base), "-o",
            str(tmp / "out.jsonl")] + (["--level", "1"] if place == "kb_baseline_level" else [])


def _openevolve(tmp: Path, place: str, value: str) -> list[str]:
    run = tmp / "run"
    shutil.copytree(DATA / "openevolve" / "run", run)
    if place == "oe_iteration":
        log = next((run / "logs").glob("*.log"))
        log.write_text(log.read_text().replace("Iteration 2:", f"Iteration {value}:", 1))
    else:
        first = sorted((run / "checkpoints").iterdir())[0]
        try:
            first.rename(first.with_name(f"checkpoint_{value}"))
        except (OSError, ValueError):  # a name the file system refuses (too long, a NUL)
            return []
    return ["import", "openevolve", str(run), "-o", str(tmp / "out.jsonl"),
            "--runtime-metric", "runtime_ns"]


def _gpu_forecasters(tmp: Path, value: str) -> list[str]:
    pred = tmp / "pred.jsonl"
    lines = (DATA / "gpu_forecasters" / "eval_predictions.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    rec["bin_probabilities"] = {value if i == 0 else str(d["bin"]): d["p"]
                                for i, d in enumerate(rec["bin_probabilities"])}
    lines[0] = json.dumps(rec, ensure_ascii=False)
    pred.write_text("\n".join(lines) + "\n")
    return ["import", "gpu-forecasters-eval-set", "--rows",
            str(DATA / "gpu_forecasters" / "eval_rows.jsonl"), "--predictions", str(pred),
            "-o", str(tmp / "out.jsonl")]


def case_args(tmp: Path, place: str, value: str) -> list[str]:
    if place.startswith("kb_"):
        return _kernelbench(tmp, place, value)
    if place.startswith("oe_"):
        return _openevolve(tmp, place, value)
    return _gpu_forecasters(tmp, value)


def _read_as_plain(place: str, value: str) -> bool:
    """Whether the file, so edited, still holds a plain number there: YAML strips the spaces
    around ``level:``, and ``1_000_Name.py`` is problem 1's file (``N_`` starts the name)."""
    def plain(v: str) -> bool:
        return v.isascii() and v.isdigit() and 0 < len(v) <= 18

    return (plain(value) or (place == "kb_config_level" and plain(value.strip()))
            or (place == "kb_baseline_file" and plain(value.partition("_")[0])))


def judge(result, place: str, value: str) -> str:
    """ok, crashed or misread (see the module doc). Where OpenEvolve's own pattern does not
    match (``Iteration ²:``, ``checkpoint_²``), the line or folder is not one of the run's and
    is passed over: an import that succeeds then is ok."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return "crashed"
    if result.exit_code == 2:
        line = result.output.strip()
        return "ok" if line.startswith("gfsim: error:") and "\n" not in line else "crashed"
    if result.exit_code == 0:
        passed_over = place.startswith("oe_")
        return "ok" if passed_over or _read_as_plain(place, value) else "misread"
    return "crashed"


def main() -> int:
    from typer.testing import CliRunner

    from gfsim.cli.main import app

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    runner = CliRunner()
    counts: dict[str, Counter] = {p: Counter() for p in PLACES}
    failures = []
    for k in range(args.cases):
        place = PLACES[k % len(PLACES)]
        value = rng.choice(VALUES)
        with tempfile.TemporaryDirectory(prefix="gfsim-keys-") as tmp:
            cmd = case_args(Path(tmp), place, value)
            if not cmd:
                counts[place]["skipped"] += 1
                continue
            verdict = judge(runner.invoke(app, cmd), place, value)
        counts[place]["cases"] += 1
        counts[place][verdict] += 1
        if verdict != "ok":
            failures.append((place, value[:20], verdict))
    print(f"{'place':20s} {'cases':>6s} {'ok':>5s} {'crashed':>8s} {'misread':>8s}")
    for place, c in counts.items():
        print(f"{place:20s} {c['cases']:6d} {c['ok']:5d} {c['crashed']:8d} {c['misread']:8d}")
    for place, value, verdict in sorted(set(failures)):
        print(f"  {verdict}: {place} {value!r}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(f"{len(failures)} of {sum(c['cases'] for c in counts.values())} cases failed "
          f"(seed {args.seed}); peak {peak} MB")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
