"""Record a real, small ShinkaEvolve run for tests/data/shinka/ (the importer's fixture).

    python experiments/make_shinka_fixture.py --shinka-python /path/to/venv/bin/python \
        [--out tests/data/shinka] [--vllm-url http://127.0.0.1:8019/v1] [--generations 12]

What runs: ShinkaEvolve (``shinka-evolve`` from PyPI, in its own environment: ``--shinka-python``
is a Python that imports it; its pins, httpx 0.27 and an older openai among them, are not
gfsim's) evolves the task suite's softmax kernel for ``--generations`` generations on CPU, two
islands, one evaluation at a time. Its LLM ensemble is two OpenAI-compatible servers on
loopback, named as ShinkaEvolve names a local server (``local/MODEL@URL``):

- the repository's vLLM CPU server (``scripts/start_vllm_cpu.sh`` serving the tiny, randomly
  initialised model; start it with ``GFSIM_VLLM_MAX_MODEL_LEN=32768``: ShinkaEvolve's prompts
  pass 8,192 tokens after about ten generations): a real server whose
  answers are noise, so its proposals hold no program and fail before evaluation (ShinkaEvolve's
  ``attempt_log``);
- ``gfsim.integrations.mutation_server``: it answers with the task suite's mutation operator's
  variant of the program it is shown (``Task.mutate``), NOT a language model, so that the run
  has programs that compile, run and differ in speed. Each program keeps the model that wrote it
  (``metadata.model_name``), so each one is labelled.

The evaluator (``inputs/evaluate.py``, run by ShinkaEvolve with gfsim's own Python) is
``gfsim.integrations.kernel_evaluator.evaluate_kernel``: gfsim's sandboxed measurer under the
Triton interpreter with CPU timing, so runtimes are the interpreter's on this machine's CPU, not
a GPU's. ``combined_score`` is the speedup over the task's PyTorch baseline (0 for a failure).

Output (``--out``): ``run/`` (ShinkaEvolve's results folder: ``programs.sqlite``, ``gen_N/``,
``evolution_run.log``; the LLM answers under ``gen_N/attempts`` are left out), ``inputs/``
(the initial program, the evaluator and the runner), ``loader_view.json`` (what ShinkaEvolve's
own loader, ``shinka.utils.load_programs_to_df``, reads from the database: the test compares
the importer with it), ``shinka-stderr-N.txt`` (what ShinkaEvolve wrote to stderr, its warnings,
per invocation) and ``PROVENANCE.json``. A few minutes here.

``--surrogate POLICY`` puts gfsim's gate (``gfsim.integrations.shinka.ShinkaGate``) in front of
the evaluator, with that policy and the vLLM server's tiny model as its forecaster, and keeps
the gate's own log (``gfsim-surrogate.jsonl``): the fixture of tests/data/shinka-surrogate,
recorded with ``--surrogate random:0.5 --generations 12 --out tests/data/shinka-surrogate``.

``--cap USD`` holds the whole run to a dollar cap (``gfsim.integrations.cap.DollarCap``, one
ledger, ``cap-ledger.jsonl``): each LLM server goes behind a ``gfsim.integrations.cap_proxy``
(``refusal="reply"``, ShinkaEvolve's answer; its log of what it forwarded and refused,
``cap-proxy.jsonl``), and the gate (policy ``all`` unless ``--surrogate``) holds the evaluations
to the same ledger. The prices are made up and large (``CAP_PRICES``) so that a short run
reaches the cap. ``--resume-cap USD2 --resume-generations N`` then runs ShinkaEvolve again on
the same results folder and ledger with the larger cap and N generations in all (resuming, as
ShinkaEvolve does when its folder has a database). Under a cap a failed proposal's
``gen_N/attempts`` is kept: ShinkaEvolve records its LLM answers there, the proxy's refusals.
``--no-vllm``: the mutation server is the only LLM (the vLLM server is not needed). The fixture
of tests/data/shinka-cap: ``--vllm-url URL --cap 4.0 --resume-cap 8.0 --resume-generations 16
--out tests/data/shinka-cap``, the vLLM server started with ``GFSIM_VLLM_MAX_MODEL_LEN=32768``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EVALUATE = '''"""The fixture's evaluator: a task-suite softmax kernel, measured by gfsim (interpreter).
ShinkaEvolve runs it as ``python evaluate.py --program_path P --results_dir R``."""
import argparse
import json
import os

from gfsim.integrations.kernel_evaluator import evaluate_kernel

ap = argparse.ArgumentParser()
ap.add_argument("--program_path", required=True)
ap.add_argument("--results_dir", required=True)
args = ap.parse_args()
m = evaluate_kernel(args.program_path, "softmax")
ok = "error" not in m
os.makedirs(args.results_dir, exist_ok=True)
with open(os.path.join(args.results_dir, "metrics.json"), "w") as f:
    json.dump({"combined_score": m["combined_score"],
               "public": {k: m[k] for k in ("speedup", "runtime_ns", "device") if k in m},
               "private": {"outcome": m.get("outcome", "success")},
               "text_feedback": m.get("error", "")}, f)
with open(os.path.join(args.results_dir, "correct.json"), "w") as f:
    json.dump({"correct": ok, "error": m.get("error")}, f)
'''

GATE = '''"""The fixture's evaluation script with gfsim's gate in front (--surrogate, --cap)."""
import json
from pathlib import Path

from gfsim.integrations.cap import DollarCap
from gfsim.integrations.kernel_evaluator import evaluate_kernel
from gfsim.integrations.shinka import ShinkaGate

# --cap: the run's dollar cap as the fixture's proxies hold it (cap.json, beside this file)
CAP_FILE = Path(__file__).with_name("cap.json")
CAP = None
if CAP_FILE.exists():
    CAP = DollarCap(**{k: tuple(v) if isinstance(v, list) else v
                       for k, v in json.loads(CAP_FILE.read_text()).items()})


def evaluate(program_path):
    return evaluate_kernel(program_path, "softmax")


ShinkaGate(evaluate, runtime_metric="runtime_ns", policy=POLICY, forecaster=FORECASTER,
           log=LOG, task="softmax", cap=CAP).main()
'''

# --cap: made-up, large prices (USD per million tokens in and out, per GPU-hour) so that a short
# run reaches the cap; the mutation server reports words as tokens
CAP_PRICES = {"generator_usd_per_m": (100.0, 400.0), "gpu_usd_per_hour": 36.0,
              "eval_reserve_s": 20.0, "max_output_tokens": 512}

RUNNER = '''"""Runs ShinkaEvolve for the fixture (executed by --shinka-python)."""
import json
import sys

from shinka.core import EvolutionConfig, ShinkaEvolveRunner
from shinka.database import DatabaseConfig
from shinka.launch import LocalJobConfig

cfg = json.loads(sys.argv[1])
evo = EvolutionConfig(
    llm_models=cfg["llm_models"], llm_dynamic_selection=None,
    llm_kwargs={"temperatures": [0.0], "max_tokens": 512},
    patch_types=["full"], patch_type_probs=[1.0], num_generations=cfg["generations"],
    max_patch_resamples=1,  # a proposal the noise model spoils fails: attempt_log has rows
    job_type="local", language="python", embedding_model=None, meta_rec_interval=None,
    meta_llm_models=None, novelty_llm_models=None, init_program_path=cfg["initial"],
    results_dir=cfg["results"])
job = LocalJobConfig(eval_program_path=cfg["evaluate"], python_executable=cfg["python"],
                     time="00:05:00")
db = DatabaseConfig(num_islands=2, archive_size=8, migration_interval=4)
ShinkaEvolveRunner(evo_config=evo, job_config=job, db_config=db, max_evaluation_jobs=1,
                   max_proposal_jobs=1, max_db_workers=1, verbose=False).run()
'''

LOADER = '''"""What ShinkaEvolve's own loader reads from the run (executed by --shinka-python)."""
import json
import math
import sqlite3
import sys

from shinka.utils import load_programs_to_df


def text(v):
    return v if isinstance(v, str) and v else None


def number(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


df = load_programs_to_df(sys.argv[1], verbose=False)
con = sqlite3.connect(sys.argv[1] + "/programs.sqlite")
island = dict(con.execute("SELECT id, island_idx FROM programs"))  # not among the loader's
rows = []
for _, r in df.iterrows():
    copy = r.get("_is_island_copy") is True or r.get("_is_island_copy") == 1
    rows.append({"id": r["id"], "parent_id": text(r["parent_id"]),
                 "generation": int(r["generation"]), "correct": bool(r["correct"]),
                 "combined_score": number(r["combined_score"]),
                 "island_idx": island.get(r["id"]),
                 "copy_of": text(r.get("_original_program_id")) if copy else None})
failed = con.execute("SELECT count(*) FROM attempt_log").fetchone()[0]
print(json.dumps({"loader": "shinka.utils.load_programs_to_df", "programs": rows,
                  "attempt_log_rows": failed}, indent=1))
'''

def _run(args, work: Path, llms: list, generations: int, cap_usd: float | None) -> dict:
    """One ShinkaEvolve invocation on ``work/run`` (a second one resumes it), its LLM servers
    behind cap proxies where ``cap_usd`` is given; returns what it ran and when."""
    from gfsim.integrations.cap import DollarCap
    from gfsim.integrations.cap_proxy import CapProxy

    with contextlib.ExitStack() as stack:
        urls = [url for _, url in llms]
        if cap_usd is not None:
            settings = {"usd": cap_usd, "ledger": str(work / "cap-ledger.jsonl"), **CAP_PRICES}
            (work / "cap.json").write_text(json.dumps(settings))  # the gate's (evaluate.py)
            cap = DollarCap(**settings)
            urls = [stack.enter_context(CapProxy(cap, url, refusal="reply",
                                                 log=work / "cap-proxy.jsonl")).url
                    for url in urls]
        cfg = {"llm_models": [f"local/{name}@{url}" for (name, _), url in zip(llms, urls)],
               "generations": generations, "initial": str(work / "initial.py"),
               "evaluate": str(work / "evaluate.py"), "results": str(work / "run"),
               "python": sys.executable}
        t0 = time.time()
        # ShinkaEvolve's warnings (its log file has none with verbose off) are kept, per run
        done = subprocess.run([args.shinka_python, str(work / "run_shinka.py"),
                               json.dumps(cfg)], cwd=work, stderr=subprocess.PIPE, text=True)
        sys.stderr.write(done.stderr)
        stderr = f"shinka-stderr-{len(list(work.glob('shinka-stderr-*'))) + 1}.txt"
        (work / stderr).write_text(done.stderr)
        done.check_returncode()
        return {"cap_usd": cap_usd, "generations": generations, "started_t": t0,
                "ended_t": time.time(), "returncode": done.returncode, "stderr": stderr,
                "configuration": cfg}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shinka-python", required=True,
                    help="a Python with shinka-evolve installed")
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "shinka"))
    ap.add_argument("--vllm-url", default="http://127.0.0.1:8019/v1")
    ap.add_argument("--vllm-model", default="tiny")
    ap.add_argument("--no-vllm", action="store_true",
                    help="the mutation server is the only LLM (no vLLM server needed)")
    ap.add_argument("--generations", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--surrogate", metavar="POLICY",
                    help="put gfsim's surrogate (gfsim.integrations.shinka) in front of the "
                         "evaluator with this policy, forecasting with the vLLM server's tiny "
                         "model: the fixture of tests/data/shinka-surrogate")
    ap.add_argument("--cap", type=float, metavar="USD",
                    help="hold the run to a dollar cap: LLM servers behind cap proxies, the "
                         "gate (policy all unless --surrogate) on the same ledger")
    ap.add_argument("--resume-cap", type=float, metavar="USD",
                    help="then resume the run with this larger cap on the same ledger")
    ap.add_argument("--resume-generations", type=int, metavar="N",
                    help="the resumed run's generations in all")
    args = ap.parse_args()
    if args.surrogate and args.no_vllm:
        ap.error("--surrogate forecasts with the vLLM server: leave out --no-vllm")
    if (args.resume_cap is None) != (args.resume_generations is None) or \
            (args.resume_cap is not None and args.cap is None):
        ap.error("--resume-cap and --resume-generations go together, with --cap")

    from gfsim.integrations.mutation_server import MODEL, MutationServer
    from gfsim.live.tasks import get_task

    version = subprocess.run([args.shinka_python, "-c", "import importlib.metadata as m; "
                              "print(m.version('shinka-evolve'))"], capture_output=True,
                             text=True, check=True).stdout.strip()
    out = Path(args.out)
    work = Path(tempfile.mkdtemp(prefix="gfsim-shinka-fixture-"))
    seed = get_task("softmax").candidates()[0]  # one_pass: short enough for the tiny model
    (work / "initial.py").write_text("# EVOLVE-BLOCK-START\n" + seed.code.rstrip("\n")
                                     + "\n# EVOLVE-BLOCK-END\n")
    forecaster = None
    if args.surrogate:
        # The tiny random model's logits overflow on ShinkaEvolve-length prompts (vLLM then
        # answers HTTP 400 "Out of range float values"): the forecaster's prompt is cut to
        # 400 tokens, which it answers (at 2,000, 6 of 9 prompts still overflowed).
        forecaster = (f"vllm:{args.vllm_url},model={args.vllm_model},mode=logprobs,"
                      "max_prompt_tokens=400")
    gated = bool(args.surrogate or args.cap is not None)
    policy = args.surrogate or "all"
    if gated:
        (work / "evaluate.py").write_text(
            GATE.replace("POLICY", repr(policy)).replace("FORECASTER", repr(forecaster))
            .replace("LOG", repr(str(work / "gfsim-surrogate.jsonl"))))
    else:
        (work / "evaluate.py").write_text(EVALUATE)
    (work / "run_shinka.py").write_text(RUNNER)
    (work / "loader_view.py").write_text(LOADER)
    t0 = time.time()
    with MutationServer(seed=args.seed) as mutation:
        llms = ([] if args.no_vllm else [(args.vllm_model, args.vllm_url)]) + \
            [(MODEL, mutation.url)]
        phases = [_run(args, work, llms, args.generations, args.cap)]
        if args.resume_cap is not None:
            phases.append(_run(args, work, llms, args.resume_generations, args.resume_cap))
    seconds = time.time() - t0
    view = subprocess.run([args.shinka_python, str(work / "loader_view.py"), str(work / "run")],
                          cwd=work, capture_output=True, text=True, check=True).stdout
    if out.exists():
        shutil.rmtree(out)
    (out / "inputs").mkdir(parents=True)
    # The LLM answers and prompts under gen_N/attempts are the bulk of a run folder and are
    # not what the importer reads; under a cap a failed proposal's are kept: its answers (the
    # proxy's refusals) are recorded there alone.
    def attempts(folder, names):
        failed = args.cap is not None and "failure.json" in names
        return [] if failed else [n for n in names if n == "attempts"]

    shutil.copytree(work / "run", out / "run", ignore=attempts)
    for name in ("initial.py", "evaluate.py", "run_shinka.py") + \
            (("cap.json",) if args.cap is not None else ()):
        shutil.copy(work / name, out / "inputs" / name)
    (out / "loader_view.json").write_text(view)
    if gated:
        shutil.copy(work / "gfsim-surrogate.jsonl", out / "gfsim-surrogate.jsonl")
    if args.cap is not None:
        for name in ("cap-ledger.jsonl", "cap-proxy.jsonl"):
            shutil.copy(work / name, out / name)
    for phase in phases:
        shutil.copy(work / phase["stderr"], out / phase["stderr"])
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    for phase in phases:  # (the loopback ports of a past run mean nothing)
        cfg = phase["configuration"]
        cfg["llm_models"] = [m.split("@")[0] + "@http://127.0.0.1:PORT/v1" + (
            " (a cap proxy in front of " if args.cap is not None else " (") +
            ("the mutation server)" if MODEL in m else "the vLLM server)")
            for m in cfg["llm_models"]]
        cfg.update(initial="inputs/initial.py", evaluate="inputs/evaluate.py", results="run",
                   python="gfsim's Python")
    llm_notes = {MODEL: "NOT an LLM: gfsim.integrations.mutation_server answers with the task "
                        "suite's mutation operator's variant (Task.mutate) of the program "
                        "shown"}
    if not args.no_vllm:
        llm_notes[args.vllm_model] = ("the repository's vLLM CPU server "
                                      "(scripts/start_vllm_cpu.sh): a real vLLM serving a tiny "
                                      "RANDOMLY INITIALISED model; its answers are noise")
    (out / "PROVENANCE.json").write_text(json.dumps({
        "what": "a real ShinkaEvolve run, recorded by experiments/make_shinka_fixture.py",
        "shinka_evolve_version": version,
        "command": "python experiments/make_shinka_fixture.py " + " ".join(sys.argv[1:]),
        "gfsim_commit": commit, "python": platform.python_version(),
        "generations": args.generations, "seed": args.seed, "seconds": round(seconds, 1),
        "configuration": phases[0]["configuration"],
        "llms": llm_notes,
        "evaluator": "gfsim.integrations.kernel_evaluator.evaluate_kernel: gfsim's sandboxed "
                     "measurer under the Triton INTERPRETER on CPU; runtimes are the "
                     "interpreter's on this CPU, not a GPU's",
        "left_out": "run/gen_N/attempts (the LLM answers and prompts)" + (
            ", but for failed proposals" if args.cap is not None else ""),
        "surrogate": ({"policy": policy, "forecaster": f"{forecaster} (the tiny RANDOM model: "
                       "its forecasts are noise)" if forecaster else None,
                       "log": "gfsim-surrogate.jsonl"} if gated else None),
        "cap": _cap_provenance(work, phases) if args.cap is not None else None,
    }, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {out} ({seconds:.0f} s)")


def _cap_provenance(work: Path, phases: list) -> dict:
    """The cap's settings and figures per ShinkaEvolve invocation (from the ledger)."""
    from gfsim.integrations.cap import DollarCap

    rows = []
    lines = (work / "cap-ledger.jsonl").read_text().splitlines()
    for phase in phases:  # the ledger as it stood when this invocation ended
        upto = work / "ledger-upto.jsonl"
        upto.write_text("".join(line + "\n" for line in lines
                                if json.loads(line)["t"] <= phase["ended_t"]))
        st = DollarCap(phase["cap_usd"], upto, **CAP_PRICES).status()
        rows.append({"cap_usd": phase["cap_usd"], "generations": phase["generations"],
                     "started_t": phase["started_t"], "ended_t": phase["ended_t"],
                     "seconds": round(phase["ended_t"] - phase["started_t"], 1),
                     "spent_usd_by_its_end": st["spent_usd"],
                     "reached": st["reached"] is not None, "stderr": phase["stderr"],
                     "shinka_returncode": phase["returncode"],
                     "configuration": phase["configuration"]})
    return {"prices": {**CAP_PRICES, "note": "made up and large, so that a short run reaches "
                       "the cap; the mutation server reports words as tokens"},
            "ledger": "cap-ledger.jsonl", "proxy_log": "cap-proxy.jsonl",
            "refusal": "reply (gfsim.integrations.cap_proxy: ShinkaEvolve retries HTTP "
                       "errors)", "phases": rows}


if __name__ == "__main__":
    main()
