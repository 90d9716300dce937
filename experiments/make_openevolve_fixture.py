"""Record a real, small OpenEvolve run for tests/data/openevolve/ (the importer's fixture).

    python experiments/make_openevolve_fixture.py [--out tests/data/openevolve] \
        [--vllm-url http://127.0.0.1:8012/v1] [--iterations 16] [--seed 0]

What runs: OpenEvolve (from PyPI, the version installed; the fixture records which) evolves the
task suite's softmax kernel for ``--iterations`` iterations on CPU. Its LLM ensemble is two
OpenAI-compatible servers on loopback:

- the repository's vLLM CPU server (``scripts/start_vllm_cpu.sh`` serving the tiny, randomly
  initialised model; start it with ``GFSIM_VLLM_MAX_MODEL_LEN=8192``, so that a long prompt is
  answered, emptily, rather than refused), weight 0.4, greedy: a real server whose answers are
  noise, so its programs fail to compile (or, past its 2,048 positions, are empty and rejected
  by OpenEvolve); the prompt is a short template (``inputs/full_rewrite_user.txt``);
- ``gfsim.integrations.mutation_server``, weight 0.7: it answers with the task suite's
  mutation operator's variant of the program it is shown (``Task.mutate``), NOT a language
  model, so that the run has successful programs. Programs keep the model that wrote them
  (``metadata.llm_model``), so each one is labelled.

The evaluator is ``gfsim.integrations.kernel_evaluator.evaluate_kernel``: gfsim's sandboxed
measurer under the Triton interpreter with CPU timing, so runtimes are the interpreter's on
this machine's CPU, not a GPU's. Small database settings (population 6, two islands, migration
every 3 generations, a checkpoint every 3 iterations) make the run exercise what the importer
must handle: programs dropped between checkpoints (named only by the log), migrant copies,
failures with error text.

Output (``--out``): ``run/`` (OpenEvolve's output folder: ``checkpoints/``, ``logs/``,
``best/``), ``inputs/`` (the initial program, the evaluator file and the config used) and
``PROVENANCE.json``. About a minute here. With ``--trace`` the run also writes OpenEvolve's
evolution trace (``run/evolution_trace.jsonl`` and its failures file; the fixture of
``tests/data/openevolve-trace``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EVALUATOR = '''"""The fixture's evaluator: a task-suite softmax kernel, measured by gfsim (interpreter)."""
from gfsim.integrations.kernel_evaluator import evaluate_kernel


def evaluate(program_path):
    return evaluate_kernel(program_path, "softmax")
'''


# A short prompt, so that it fits the tiny model's 2048 positions for the smaller kernels (the
# mutation server reads only the current program): OpenEvolve's own templates are ~4,800 of its
# tokens, past which its answers are empty.
USER_TEMPLATE = """# Current Program
```{language}
{current_program}
```
Rewrite the program to make it faster. Answer with the whole program in one ```{language} block.
"""


def config(vllm_url: str, mutation_url: str, iterations: int, seed: int) -> dict:
    return {
        "max_iterations": iterations, "checkpoint_interval": 3, "random_seed": seed,
        "language": "python", "diff_based_evolution": False, "log_level": "INFO",
        "llm": {"api_key": "none", "retries": 0, "timeout": 120, "temperature": 0.7,
                "models": [
                    {"name": "tiny", "api_base": vllm_url, "weight": 0.4, "max_tokens": 96,
                     "temperature": 0.0},  # greedy: vLLM CPU 0.32 fails seeded sampling
                    {"name": "gfsim-mutation-operator", "api_base": mutation_url,
                     "weight": 0.7, "max_tokens": 4096}]},
        "prompt": {"num_top_programs": 0, "num_diverse_programs": 0,
                   "system_message": "You make Triton kernels faster.",
                   "template_dir": "templates", "use_template_stochasticity": False},
        "database": {"num_islands": 2, "population_size": 6, "archive_size": 4,
                     "migration_interval": 3, "migration_rate": 0.5},
        "evaluator": {"timeout": 300, "max_retries": 0, "cascade_evaluation": False,
                      "parallel_evaluations": 1},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "openevolve"))
    ap.add_argument("--vllm-url", default=os.environ.get("GFSIM_VLLM_URL",
                                                         "http://127.0.0.1:8012/v1"))
    ap.add_argument("--vllm-model", default="tiny")
    ap.add_argument("--iterations", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace", action="store_true",
                    help="also write OpenEvolve's evolution trace (evolution_trace.jsonl, with "
                         "its failures file): the fixture of tests/data/openevolve-trace")
    args = ap.parse_args()

    import openevolve
    from openevolve import OpenEvolve
    from openevolve.config import Config

    from gfsim.integrations.mutation_server import MODEL, MutationServer
    from gfsim.live.tasks import get_task

    out = Path(args.out)
    work = Path(tempfile.mkdtemp(prefix="gfsim-oe-fixture-"))
    initial = get_task("softmax").candidates()[0]  # one_pass: short enough for the tiny model
    (work / "initial.py").write_text(initial.code)
    (work / "evaluator.py").write_text(EVALUATOR)
    (work / "templates").mkdir()
    (work / "templates" / "full_rewrite_user.txt").write_text(USER_TEMPLATE)
    t0 = time.time()
    with MutationServer(seed=args.seed) as mutation:
        cfg_dict = config(args.vllm_url, mutation.url, args.iterations, args.seed)
        cfg_dict["llm"]["models"][0]["name"] = args.vllm_model
        if args.trace:
            cfg_dict["evolution_trace"] = {"enabled": True, "format": "jsonl",
                                           "include_code": False, "include_prompts": False,
                                           "include_failures": True, "buffer_size": 1}
        cfg = Config.from_dict(json.loads(json.dumps(cfg_dict)))
        cfg.prompt.template_dir = str(work / "templates")
        oe = OpenEvolve(str(work / "initial.py"), str(work / "evaluator.py"), cfg,
                        output_dir=str(work / "run"))
        best = asyncio.run(oe.run(iterations=args.iterations))
    seconds = time.time() - t0
    if out.exists():
        shutil.rmtree(out)
    (out / "inputs").mkdir(parents=True)
    shutil.copytree(work / "run", out / "run")
    for name in ("initial.py", "evaluator.py", "templates/full_rewrite_user.txt"):
        shutil.copy(work / name, out / "inputs" / Path(name).name)
    import yaml

    cfg_dict["llm"]["models"][1]["api_base"] = "http://127.0.0.1:PORT/v1 (the mutation server)"
    (out / "inputs" / "config.yaml").write_text(yaml.safe_dump(cfg_dict, sort_keys=False))
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "gfsim",
                            "experiments"], capture_output=True, text=True).stdout.strip()
    (out / "PROVENANCE.json").write_text(json.dumps({
        "what": "a real OpenEvolve run, recorded by experiments/make_openevolve_fixture.py",
        "openevolve_version": openevolve.__version__,
        "command": "python experiments/make_openevolve_fixture.py " + " ".join(sys.argv[1:]),
        "gfsim_commit": commit, "gfsim_uncommitted_changes": bool(dirty), "python": platform.python_version(),
        "iterations": args.iterations, "seed": args.seed, "seconds": round(seconds, 1),
        "llms": {
            args.vllm_model: "the repository's vLLM CPU server (scripts/start_vllm_cpu.sh): a "
                             "real vLLM serving a tiny RANDOMLY INITIALISED model; its answers "
                             "are noise",
            MODEL: "NOT an LLM: gfsim.integrations.mutation_server answers with the task "
                   "suite's mutation operator's variant (Task.mutate) of the program shown"},
        "evaluator": "gfsim.integrations.kernel_evaluator.evaluate_kernel: gfsim's sandboxed "
                     "measurer under the Triton INTERPRETER on CPU; runtimes are the "
                     "interpreter's on this CPU, not a GPU's",
        "best_program": {"id": best.id, "metrics": best.metrics} if best else None,
    }, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {out} ({seconds:.0f} s)")


if __name__ == "__main__":
    main()
