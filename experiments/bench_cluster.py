"""The counterfactual benchmark on a Ray cluster against local processes (issue 56's target; a
benchmark, not a test).

    python experiments/bench_cluster.py [--seeds 12] [--world family] [--cpus N]
                                        [--address HOST:PORT] [--out bench_cluster.json]

Runs ``gfsim counterfactual --world family --seeds N --json`` twice on this machine, each in a
fresh process: with ``--jobs 2``, and with ``--cluster ray`` on a Ray cluster (``--address``:
a running one; else a one-host cluster of ``--cpus`` CPUs, all of this machine's by default,
started here as ``ray start --head --block`` and stopped by its process id). It prints both
wall-clock times, their ratio (target: at least 6x on a 16-core machine) and whether the two
outputs are identical but for where they ran (``ran_on``, and the options that say how).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 6.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(cpus: int) -> tuple[subprocess.Popen, str, str]:
    """A one-host Ray cluster of ``cpus`` CPUs: (its ``ray start --block`` process, address,
    temp folder)."""
    port = _free_port()
    tmp = tempfile.mkdtemp(prefix="gfsim-ray.", dir="/tmp")
    ray = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    head = subprocess.Popen([ray, "start", "--head", "--block", "--port", str(port),
                             "--node-ip-address", "127.0.0.1", "--num-cpus", str(cpus),
                             "--include-dashboard", "false", "--disable-usage-stats",
                             "--temp-dir", tmp], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=tmp)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            break
        except OSError:
            time.sleep(0.5)
    else:
        head.kill()
        raise SystemExit("the Ray head did not start in 2 minutes")
    return head, f"127.0.0.1:{port}", tmp


def run(args: list[str], env: dict) -> tuple[float, dict]:
    t0 = time.perf_counter()  # (outside the checkout: its gfsim/ would shadow the install)
    res = subprocess.run([sys.executable, "-m", "gfsim", *args], capture_output=True, text=True,
                         env=env, timeout=3600, cwd=tempfile.gettempdir())
    seconds = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"gfsim {' '.join(args)} failed:\n{res.stderr[-2000:]}")
    return seconds, json.loads(res.stdout)


def comparable(out: dict) -> dict:
    """The output without where it ran and how that was asked."""
    out = dict(out)
    out.pop("ran_on", None)
    settings = dict(out.pop("settings", {}))
    for key in ("options", "from"):
        settings[key] = {k: v for k, v in settings.get(key, {}).items()
                         if k not in ("jobs", "cluster")}
    out["settings"] = settings
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--world", default="family")
    ap.add_argument("--cpus", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--address", default=None, help="a running cluster (default: start one)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    common = ["counterfactual", "--world", a.world, "--seeds", str(a.seeds), "--json"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    load0 = os.getloadavg()
    local_s, local = run([*common, "--jobs", "2"], env)
    print(f"--jobs 2: {local_s:.1f} s", flush=True)
    head = tmp = None
    address = a.address
    if address is None:
        head, address, tmp = start_cluster(a.cpus)
    try:
        cluster_s, remote = run([*common, "--cluster", "ray"], {**env, "RAY_ADDRESS": address})
    finally:
        if head is not None:
            head.send_signal(signal.SIGTERM)
            head.wait(60)
            shutil.rmtree(tmp, ignore_errors=True)
    same = comparable(local) == comparable(remote)
    ratio = local_s / cluster_s
    result = {"machine": {"cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(),
                          "host": platform.node(), "load_before": load0,
                          "load_after": os.getloadavg()},
              "world": a.world, "seeds": a.seeds, "local_jobs2_s": round(local_s, 1),
              "cluster_s": round(cluster_s, 1), "ratio": round(ratio, 2),
              "target": TARGET, "met": ratio >= TARGET and same, "identical": same,
              "ran_on": remote["ran_on"], "local_ran_on": local["ran_on"]}
    print(json.dumps(result, indent=1))
    print(f"--jobs 2: {local_s:.1f} s; Ray cluster ({remote['ran_on']['workers']} CPUs): "
          f"{cluster_s:.1f} s; {ratio:.2f}x (target {TARGET:.0f}x: "
          f"{'met' if ratio >= TARGET else 'missed'}); results identical: {same}")
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
