"""Run the hostile-candidate suite (experiments/hostile.py) against the sandboxed measurer and print
its table: every row must be contained. On a machine without CUDA the rows run under the Triton
interpreter's CPU mode, timed by wall clock; with a GPU every row runs, side streams included.

    python experiments/hostile_suite.py [--task softmax] [--json OUT]
    python experiments/hostile_suite.py --honest 3 --json OUT   # false flags, GPU-s a kernel

``--honest N`` instead measures every hand-written candidate of every task N times and counts
how often an honest kernel's timing was capped or refused (false flags), with the seconds a
fresh sandboxed process took and the GPU-seconds per candidate. ``--no-cgroups`` runs either
with the fallback's memory and task limits (seccomp refuses memfd and SysV shm, rlimits apply),
as on a machine where no cgroup may be made, so that both kinds of limits are tried.

    python experiments/hostile_suite.py --reads-check --json OUT

``--reads-check`` runs the task's first hand-written kernel in a process confined as a
candidate's is (namespaces, Landlock with reads confined to ``sandbox.read_allowlist``,
seccomp), on the GPU where there is one: CUDA's start and Triton's compiler included. Where it
fails, it runs again with each of a few wider folders readable, to name what the allow-list
lacks on this machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from hostile import ROWS, Context, format_table, honest_code, run_suite  # (beside this script)
from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer
from gfsim.live.tasks import get_task


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="softmax")
    ap.add_argument("--json", help="write the rows (records included) here")
    ap.add_argument("--rows", help="comma-separated row names (default: all)")
    ap.add_argument("--honest", type=int, default=0, help="measure the task suite's honest "
                    "kernels this many times each instead")
    ap.add_argument("--tasks", default=None, help="with --honest: comma-separated tasks")
    ap.add_argument("--pad-cycles", type=int, default=0, help="a GPU spin before each timed "
                    "repetition (MeasurerConfig.pad_cycles; a diagnostic)")
    ap.add_argument("--seed", type=int, default=0, help="the measurer's seed (inputs, hidden "
                    "shapes, checked repetitions)")
    ap.add_argument("--no-cgroups", action="store_true", help="the fallback's memory and task "
                    "limits (seccomp refuses memfd and SysV shm; rlimits), as on a machine "
                    "without cgroups (MeasurerConfig.cgroups)")
    ap.add_argument("--cgroup-controllers", default="memory,pids", help="the controllers "
                    "each sandbox's group may use: 'memory' behaves as a machine that "
                    "delegates the memory controller alone (MeasurerConfig.cgroup_controllers)")
    ap.add_argument("--reads-check", action="store_true", help="run one kernel with reads "
                    "confined, and say what else it needed where it failed")
    args = ap.parse_args()
    if args.honest:
        return honest(args)
    if args.reads_check:
        return reads_check(args)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    task = get_task(args.task)
    controllers = tuple(c for c in args.cgroup_controllers.split(",") if c)
    if device == "cuda":
        cfg = MeasurerConfig(timing_timeout_s=20, check_timeout_s=30, compile_timeout_s=120,
                             memory_limit_mb=8000, pad_cycles=args.pad_cycles, seed=args.seed,
                             cgroups=not args.no_cgroups, cgroup_controllers=controllers)
    else:
        cfg = MeasurerConfig(cpu_timing=True, rse_target=0.05, max_reps=40,
                             cpu_shapes=({"M": 64, "N": 4096},), timing_timeout_s=20,
                             check_timeout_s=30, memory_limit_mb=3000, energy_window_s=0,
                             timing_tolerance=0.1, cgroups=not args.no_cgroups,
                             cgroup_controllers=controllers)
    rows = [r for r in ROWS if not args.rows or r.name in args.rows.split(",")]
    ctx = Context(honest_code(task, device), device)
    t0 = time.perf_counter()
    with TritonMeasurer(task.name, cfg) as m:
        fac = m.facilities
        print(f"sandbox on this machine: {fac.as_dict()}", file=sys.stderr)
        print(held_line(fac, cfg), file=sys.stderr, flush=True)
        def progress(row):
            print(f"{row['row']}: {row['outcome']}, contained {row['contained']} "
                  f"({row['wall_s'] or 0:.1f} s)", file=sys.stderr, flush=True)

        out = run_suite(m, ctx, rows, device, progress)
        spawn = sorted(m.spawn_s)
    ctx.close()
    print(format_table(out))
    print(held_line(fac, cfg))
    print("sandbox words: " + ", ".join(sorted({str(r["record"].get("sandbox"))
                                                 for r in out})))
    median_spawn = spawn[len(spawn) // 2]
    print(f"\n{sum(r['contained'] for r in out)} of {len(out)} rows contained on {device}; "
          f"a fresh sandboxed process took {median_spawn:.3f} s (median of {len(spawn)}, "
          f"max {spawn[-1]:.3f} s); the suite ran {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "facilities": fac.as_dict(), "spawn_s": spawn,
                       "versions": _versions(), "rows": out}, f, indent=1, default=str)
    return 0 if all(r["contained"] for r in out) else 1


def held_line(fac, cfg=None) -> str:
    """Which facilities held here, in one line: the kernel's memory and task limits (cgroup
    version and controllers, else the fallback; those ``cfg`` lets this run's groups use),
    the folder quota, and the confinement."""
    used = [c for c in fac.cgroup_controllers
            if cfg is None or (cfg.cgroups and c in cfg.cgroup_controllers)]
    held = ",".join(used) or "none"
    offered = "" if list(used) == list(fac.cgroup_controllers) else \
        f" (the machine offers {','.join(fac.cgroup_controllers) or 'none'})"
    return (f"held: cgroup v{fac.cgroup or '-'} controllers {held}{offered}; memory: "
            f"{fac.memory_limit}; "
            f"tasks: {fac.task_limit}; folder quota: {fac.folder_quota}; namespaces "
            f"user/pid/net/mount {int(fac.user_ns)}{int(fac.pid_ns)}{int(fac.net_ns)}"
            f"{int(fac.mount_ns)}, landlock ABI {fac.landlock_abi}, reads confined "
            f"{fac.reads_confined}, seccomp {fac.seccomp}")


def honest(args) -> int:
    import statistics

    import torch

    from gfsim.live.tasks import TASKS

    names = args.tasks.split(",") if args.tasks else list(TASKS)
    cfg = MeasurerConfig(energy_window_s=0, pad_cycles=args.pad_cycles, seed=args.seed,
                         cgroups=not args.no_cgroups) \
        if torch.cuda.is_available() else MeasurerConfig(
            cpu_timing=True, rse_target=0.05, max_reps=20, energy_window_s=0, interpret=True,
            seed=args.seed, cgroups=not args.no_cgroups)
    rows, spawn, primes = [], [], {}
    for name in names:
        task = get_task(name)
        with TritonMeasurer(name, cfg) as m:
            for rep in range(args.honest):
                for cand in task.candidates():
                    r = m.measure(cand)
                    flagged = bool(r.get("timing_capped") and any(r["timing_capped"])) or \
                        bool(r.get("timing_forged"))
                    rows.append({"task": name, "variant": cand.variant, "params": cand.params,
                                 "repeat": rep, "flagged": flagged, **r})
                    ratio = r["runtime_ns"] / r["trusted_runtime_ns"] \
                        if r.get("trusted_runtime_ns") else float("nan")
                    print(f"{name:13s} {cand.variant:18s} {r['outcome']:13s} "
                          f"speedup {r.get('speedup', float('nan')):6.3f} claimed/trusted "
                          f"{ratio:5.2f} wall {r['wall_s']:5.2f}s flagged {flagged}",
                          flush=True)
            spawn += m.spawn_s
            primes[name] = m.prime_log
    ok = [r for r in rows if r["outcome"] == "success" or r.get("timing_forged")]
    flags = sum(r["flagged"] for r in ok)
    # The GPU clock's per-candidate null and (when due) baseline timing run before the
    # candidate's process starts (clock_prep_s): the measurer's GPU time, counted here.
    walls = [r["wall_s"] + r.get("clock_prep_s", 0.0) for r in rows]
    summary = {"kernels": len(rows), "timed": len(ok), "false_flags": flags,
               "false_flag_rate": flags / max(len(ok), 1),
               "spawn_s_median": statistics.median(spawn), "spawn_s_max": max(spawn),
               "gpu_s_per_candidate_median": statistics.median(walls),
               "gpu_s_per_candidate_mean": statistics.fmean(walls),
               "compile_s_median": statistics.median(r["compile_s"] for r in rows),
               "not_success": sum(r["outcome"] != "success" for r in rows),
               "clock": sorted({str(r.get("timing_clock", "wall")) for r in rows}),
               "seed": args.seed, "pad_cycles": args.pad_cycles,
               "thresholds": {k: getattr(cfg, k) for k in (
                   "timing_tolerance", "timing_slack_ms", "forged_below")},
               "primed": primes}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=1, default=str)
    return 0


def _versions() -> dict:
    import platform

    import torch

    out = {"python": platform.python_version(), "kernel": platform.release(),
           "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        pass
    return out


# Folders tried, each alone, where the kernel fails with reads confined to the allow-list.
_WIDER = ("/proc", "/sys", "/etc", "/dev", "/run", "/var", "/opt", "/usr", "/tmp", "/root",
          "/home")


def reads_check(args) -> int:
    """Run the task's first kernel confined as a candidate is; on failure, with all of
    ``_WIDER`` readable, then with each alone. Prints one line per try; ``--json`` writes the
    tries, the allow-list and the paths the CUDA driver's library names."""
    import tempfile
    from dataclasses import replace

    import os

    # CUDA must not start in this process: a child forked after it cannot start it again
    # (``CUDA error: initialization error``), which is why the measurer forks from a zygote
    # that never touches CUDA. A throwaway interpreter says whether there is a GPU.
    import subprocess

    probe = subprocess.run([sys.executable, "-c", "import torch; "
                            "print(int(torch.cuda.is_available()))"],
                           capture_output=True, text=True, timeout=300)
    if probe.stdout.strip() != "1":  # Triton reads it when it is imported
        os.environ["TRITON_INTERPRET"] = "1"
    from gfsim.live.measure import sandbox

    task = get_task(args.task)
    root = tempfile.mkdtemp(prefix="gfsim-readcheck-")
    allowed = sandbox.read_allowlist(root)
    fac = sandbox.probe(allowed)
    print(f"sandbox: {json.dumps({k: v for k, v in fac.as_dict().items() if k != 'readable'})}")
    print(f"allow-list: {json.dumps(allowed)}")
    def wider(extra):
        return replace(fac, readable={"execute": [*allowed["execute"], *extra],
                                      "read": allowed["read"]})

    tries = [{"extra": [], **_confined_run(task, fac, root)}]
    if not tries[0]["ok"]:
        tries.append({"extra": list(_WIDER), **_confined_run(task, wider(_WIDER), root)})
        if tries[-1]["ok"]:
            for extra in _WIDER:
                tries.append({"extra": [extra], **_confined_run(task, wider([extra]), root)})
        else:  # a device node the list lacks, opened for writing?
            tries.append({"extra": [*_WIDER, "/dev (write)"],
                          **_confined_run(task, wider(_WIDER), root, dev_writes=True)})
    for t in tries:
        print(f"extra {t['extra'] or 'none'}: {'ok' if t['ok'] else 'FAILED'} "
              f"{t.get('device', '')} {t.get('seconds', 0):.1f} s {t.get('error', '')[-600:]}",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"facilities": fac.as_dict(), "tries": tries, "versions": _versions(),
                       "driver_paths": _driver_paths()}, f, indent=1)
    from gfsim.core.folders import remove_tree

    remove_tree(root)  # where the confined kernels wrote
    return 0 if tries[0]["ok"] else 1


def _confined_run(task, fac, root: str, dev_writes: bool = False) -> dict:
    """Fork as the zygote does (outer: namespaces; inner: ``enter_inner``), run the task's
    first kernel on its first benchmark shape, and report. ``dev_writes``: every existing
    file of /dev may be opened for writing (as before the device list)."""
    import os
    import tempfile

    from gfsim.live.measure import sandbox

    if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized():
        raise RuntimeError("CUDA started in the parent: its forked children cannot use it")
    folder = tempfile.mkdtemp(prefix="gfsim-worker-", dir=root)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the outer child
        try:
            os.close(r)
            sandbox.enter_outer(fac)
            inner = os.fork()
            if inner == 0:
                if dev_writes:
                    sandbox.existing_writable = lambda: ["/dev", "/proc/self"]
                _confined_kernel(task, fac, folder, w)
            os.waitpid(inner, 0)
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 20):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    try:
        return json.loads(data)
    except ValueError:
        return {"ok": False, "error": f"the confined process died: {data[-300:]!r}"}


def _confined_kernel(task, fac, folder: str, w: int) -> None:  # the inner child
    import os
    import tempfile
    import traceback

    out: dict = {"ok": False}
    try:
        os.chdir(folder)
        os.environ.update(HOME=folder, TMPDIR=folder,
                          TRITON_CACHE_DIR=os.path.join(folder, "triton-cache"))
        tempfile.tempdir = folder
        from gfsim.live.measure import sandbox

        out["confined"] = {k: v for k, v in sandbox.enter_inner(fac, folder, 1024).items()
                           if k != "readable"}
        t0 = time.perf_counter()
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        out["device"] = device
        path = os.path.join(folder, "candidate_check.py")
        with open(path, "w") as fh:
            fh.write(task.candidates()[0].code)
        import importlib.util

        spec = importlib.util.spec_from_file_location("candidate_check", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        inputs = task.make_inputs(task.check_shapes[0] if device == "cpu" else
                                  task.bench_shapes[0], 0, device)
        got = module.run(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        ref = task.reference(*inputs)
        got, ref = (got if isinstance(got, tuple) else (got,)), \
            (ref if isinstance(ref, tuple) else (ref,))
        out["max_abs_err"] = max(float((g.float() - r.float()).abs().max())
                                 for g, r in zip(got, ref))
        out["seconds"] = time.perf_counter() - t0
        out["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - reported
        out["error"] = f"{type(exc).__name__}: {exc} | {traceback.format_exc()[-1500:]}"
    finally:
        os.write(w, json.dumps(out).encode())
        os._exit(0)


def _driver_paths() -> list[str]:
    """Paths of /proc, /sys, /dev, /etc, /run, /var, /usr and /opt that the CUDA driver's
    library names (a lead to what it opens; there is no strace on the H200)."""
    import re
    import subprocess

    try:
        text = subprocess.run(["ldconfig", "-p"], capture_output=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    libs = [line.split(b" => ")[-1].strip() for line in text.splitlines()
            if line.strip().startswith(b"libcuda.so.1 ")]
    found = set()
    for lib in libs[:1]:
        with open(lib, "rb") as fh:
            data = fh.read()
        found |= {m.decode() for m in re.findall(
            rb"/(?:proc|sys|dev|etc|run|var|usr|opt)/[\x21-\x7e]{2,100}", data)}
    return sorted(found)


if __name__ == "__main__":
    sys.exit(main())
