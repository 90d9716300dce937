"""A live search (``gfsim live``): real candidates, real forecasts and real measurements, written
to a replay log as it goes, and then replayed to check the simulator against the run."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

__all__ = ["live", "fidelity", "merge"]


def fidelity(log) -> dict:
    """A live log (a path, a shipped name or a ``ReplayLog``) replayed with the run's own
    capacities, beside what the run recorded, search by search (``gfsim fidelity``)."""
    from gfsim.api.options import open_log_arg
    from gfsim.live.fidelity import fidelity as compare

    return compare(open_log_arg(log))


def merge(logs, out: str | Path) -> dict:
    """Several logs of the same hardware and timing protocol as one, every input validated
    first and ``out`` written atomically (``gfsim merge``)."""
    from gfsim.replay_logs.merge import merge_logs

    return merge_logs(logs, out)


def live(out: str | Path, *, tasks: str = "softmax,layernorm,matmul", resume: bool = False,
         driver: str = "puct", policy="all", forecaster=None, source: str = "mutate",
         measurer: str = "triton", preset: str | None = None, steps: int | None = None,
         parents_per_step: int | None = None, samples_per_parent: int | None = None,
         overgen: int | None = None, k_per_parent: int | None = None, budget: str | None = None,
         seed: int = 0, capacity: str = "gen=4,forecast=4", protocol: str = "gfsim",
         rse: float = 0.001, max_reps: int = 100, energy_window: float = 1.0,
         max_minutes: float | None = None, trust_candidates: bool = False, clock: str = "auto",
         trust_cpu_clock: bool = False, cluster: str | None = None, gpus: int | None = None,
         config: str | Path | None = None,
         progress: Callable[[int, int, str], None] | None = None) -> dict:
    """Run a live search and write its log to ``out``; returns what ``gfsim live --json`` prints
    (the run's summary and its fidelity: the log replayed with the run's capacities).

    The options are ``gfsim live``'s (``gfsim live --help`` says what each does); ``forecaster``
    is a spec or a ``Forecaster`` (the learned one runs in its live form, learning as the run
    measures), ``policy`` a spec or a ``Policy``. ``config``: the settings file the options came
    from, which ``out`` must not overwrite. ``progress(advance, total, text)`` is called once
    before the first step (advance 0) and after each step. Needs the ``live`` extra (torch and
    Triton), a CUDA GPU unless ``measurer="interpret"``, and a machine that can confine
    candidate code unless ``trust_candidates``.
    """
    import datetime
    import math
    import sys

    from gfsim.core.errors import GfsimError
    from gfsim.live.driver import LiveOptions, LiveRun
    from gfsim.live.sources import parse_source
    from gfsim.live.tasks import get_task
    from gfsim.api.options import parse_capacities, search_config
    from gfsim.simulator.budget import parse_budget

    if driver != "puct":
        raise GfsimError(f"`driver` {driver}: a live run re-runs the closed-loop search; only "
                         "puct is live (replay a log with `driver` trace)")
    if measurer not in ("triton", "interpret"):
        raise GfsimError(f"`measurer` {measurer!r}: valid: triton, interpret")
    from gfsim.core.inputs import check_output

    check_output(out, [config] if config is not None else [])  # (its settings file)
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    for name in names:
        get_task(name)  # unknown names: an error listing the valid ones
    if len(set(names)) != len(names):
        raise GfsimError(f"`tasks` {tasks}: a task is named twice")
    given = parse_capacities(capacity, "`capacity`", keys=("gen", "forecast"))
    caps = {"generator": given.get("gen", 4), "forecaster": given.get("forecast", 4)}
    search = search_config("puct", preset, steps=steps, parents_per_step=parents_per_step,
                           samples_per_parent=samples_per_parent, overgen=overgen,
                           k_per_parent=k_per_parent)
    options = LiveOptions(tasks=names, search=search, policy=policy, seed=seed,
                          budget=parse_budget(budget), generator_slots=caps["generator"],
                          forecaster_slots=caps["forecaster"],
                          max_session_s=max_minutes * 60 if max_minutes else math.inf,
                          trust_cpu_clock=trust_cpu_clock)
    the_forecaster = None
    if forecaster and forecaster != "none":
        from gfsim.api.forecast import make_forecaster

        the_forecaster = make_forecaster(forecaster)
        if the_forecaster.kind == "learned":  # its live form learns as the run measures
            from gfsim.live.llm.learned import LiveLearnedForecaster

            the_forecaster = LiveLearnedForecaster(the_forecaster)
    the_source = parse_source(source)

    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError as exc:
        raise GfsimError(f"gfsim live needs the live extra (pip install 'gfsim[live]'): "
                         f"{exc}") from None
    from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer

    interpret = measurer == "interpret"
    if clock not in ("auto", "gpu", "wall"):
        raise GfsimError(f"`clock` {clock!r}: expected auto, gpu or wall")
    if gpus is not None and gpus > 1 and not cluster:
        raise GfsimError(f"`gpus` {gpus}: more than one GPU needs `cluster` (one Ray actor per "
                         "GPU; on one machine: ray start --head, then `cluster` ray)")
    if not interpret and not cluster and not torch.cuda.is_available():
        raise GfsimError("`measurer` triton needs a CUDA GPU, and torch sees none; use "
                         "`measurer` interpret to run the kernels under the Triton "
                         "interpreter on the CPU (interpreter times, not GPU times, which a "
                         "candidate can forge: with `trust_cpu_clock`)")
    _refuse_cpu_clock(interpret, clock, protocol, trust_cpu_clock)
    # Under the interpreter a call takes milliseconds to seconds: time it less tightly.
    mconfig = MeasurerConfig(protocol=protocol, rse_target=0.05 if interpret else rse,
                             max_reps=min(max_reps, 10) if interpret else max_reps,
                             energy_window_s=0.0 if interpret else energy_window,
                             interpret=interpret, cpu_timing=interpret,
                             trust_candidates=trust_candidates, clock=clock)
    from gfsim.live.measure.gpus import local_pool, on_cluster, ray_pool
    from gfsim.live.measure.sandbox import MISSING_HELP, probe_subprocess

    hardware = _environment(interpret)
    if cluster:  # the candidates run on the cluster's hosts, each probed by its measurer
        pool = ray_pool(cluster, mconfig, gpus, trust_candidates=trust_candidates)
        on_cluster(pool, hardware)
    else:
        facilities = probe_subprocess()
        missing = facilities.missing()
        if missing and not trust_candidates:
            why = "; ".join(facilities.errors) or "see gfsim.live.measure.sandbox"
            raise GfsimError(f"this machine cannot confine candidate code: no "
                             f"{', '.join(missing)} ({why}); {MISSING_HELP}")
        if missing:
            print(f"sandbox incomplete, running anyway (--trust-candidates): no "
                  f"{', '.join(missing)}", file=sys.stderr)
        hardware["sandbox"] = facilities.as_dict()
        pool = local_pool(lambda task_name: TritonMeasurer(task_name, mconfig), interpret)
    timing = {"protocol": "cpu-wallclock" if interpret else protocol,
              "l2_flush": protocol == "gfsim" and not interpret,
              "input_clone_timed": protocol == "reference" and not interpret,
              "statistic": "median" if protocol == "gfsim" or interpret else "mean",
              "rse_target": mconfig.rse_target, "max_reps": mconfig.max_reps,
              "ref_retime_every": mconfig.ref_retime_every}
    note = ("a live gfsim search: every evaluation was measured by gfsim's TritonMeasurer" +
            (" under the Triton interpreter on a CPU, timed by wall clock: the speedups are "
             "interpreter speedups and say nothing about a GPU" if interpret else
             f" on a {hardware['device_name']}") +
            (f", {pool.size} measurers of a Ray cluster at once (hosts "
             f"{', '.join(pool.placement['hosts'])})" if cluster else ""))
    provenance = {"kind": "measured", "source": "gfsim live", "note": note,
                  "command": " ".join(["gfsim", *sys.argv[1:]]),
                  "date": datetime.date.today().isoformat(),
                  "candidates_from": the_source.describe()}
    if the_forecaster is not None and the_forecaster.kind == "whatif":
        provenance["forecasts"] = (
            f"what-if forecasts ({the_forecaster.name}): synthetic, drawn after each "
            "measurement from the measured speedup (gfsim.forecasts.whatif; every parameter an "
            "assumption); no LLM forecaster ran")
    elif the_forecaster is not None:
        provenance["forecasts"] = f"live forecaster {the_forecaster.describe()}"
    try:
        run = LiveRun(out, options, the_source, None, the_forecaster, resume=resume,
                      hardware=hardware, provenance=provenance, timing_protocol=timing,
                      pool=pool)
    except BaseException:
        pool.close()
        raise
    if progress is not None:
        total = search.steps * len(names)
        progress(0, total, "steps")

        def on_step(s, step):
            progress(1, total, f"{s.task.name} step {step}: best {s.best:.3f}x, "
                     f"{s.evals} measured")

        run.on_step = on_step
    summary = run.run()
    from gfsim.live.fidelity import fidelity

    try:
        summary["fidelity"] = fidelity(out)
    except GfsimError as exc:
        summary["fidelity"] = {"error": str(exc)}
    return summary


def _environment(interpret: bool) -> dict:
    """The header's hardware block: the GPU, its driver, and the software versions."""
    import platform

    import torch

    import gfsim

    hw: dict = {"python": platform.python_version(), "torch": torch.__version__,
                "gfsim": gfsim.__version__}
    try:
        import triton

        hw["triton"] = triton.__version__
    except ImportError:
        pass
    if interpret or not torch.cuda.is_available():
        hw["device_name"] = "cpu (Triton interpreter)"
        hw["cpu"] = platform.processor() or platform.machine()
        return hw
    hw["device_name"] = torch.cuda.get_device_name(0)
    hw["cuda"] = torch.version.cuda
    try:
        import pynvml

        pynvml.nvmlInit()
        hw["driver"] = pynvml.nvmlSystemGetDriverVersion()
        if isinstance(hw["driver"], bytes):
            hw["driver"] = hw["driver"].decode()
    except Exception:  # noqa: BLE001 - no NVML: the driver version stays unknown
        pass
    return hw


def _refuse_cpu_clock(interpret: bool, clock: str, protocol: str, trusted: bool) -> None:
    """Refuse, before anything starts, a run whose options put its timing on the CPU clock
    (whose times a candidate can forge) without --trust-cpu-clock. Where the GPU clock merely
    fails to start, the run refuses after timing its seed kernel (``LiveRun``)."""
    from gfsim.core.errors import GfsimError

    if trusted:
        return
    why = ("`measurer` interpret" if interpret else "`clock` wall" if clock == "wall" else
           "`protocol` reference" if protocol == "reference" and clock != "gpu" else None)
    if why:
        raise GfsimError(f"{why} times candidates on the CPU clock, whose times a candidate's "
                         "own process reports and can forge; pass `trust_cpu_clock` to record "
                         "such times as successes, marked untrusted")
