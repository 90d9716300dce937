"""Where a live run measures: this machine's GPU, or every GPU of a Ray cluster.

A ``MeasurerPool`` holds one slot per GPU; a slot measures one candidate at a time, and the
live driver sends each candidate to whichever slot is free (``MeasurerPool.measure`` waits for
one). Two kinds of slot:

- ``LocalSlot``: the measurers of this process (one ``TritonMeasurer`` per task, on the GPU
  torch sees), as a live run has always measured;
- ``RaySlot``: a ``MeasurerActor`` on a Ray cluster, placed by Ray on any host with a free GPU
  (``num_gpus=1``: Ray sets the actor's ``CUDA_VISIBLE_DEVICES``, which the sandbox passes on
  to the candidate's process). The actor keeps its measurers, and so their warm Triton cache,
  for the whole run.

Every slot says where it is (``where``: its number in the pool, ``measurer``; host, GPU index
and name, NVML UUID), and the driver
records that with each evaluation (``measured_on``). A slot that disappears mid-measurement
(its actor died: a host lost, a GPU fallen off the bus, a worker killed) raises ``SlotLost``;
the pool drops it and measures the candidate again on another slot, and the evaluation lists
the lost slots (``lost``). A candidate whose measurement lost ``LOSSES_PER_CANDIDATE`` slots
is not measured again (it may be what kills them): it is recorded as an infrastructure failure.
When no slot is left the run stops with an error, and ``--resume`` continues it.

Under the Triton interpreter (``MeasurerConfig.interpret``) a slot is one CPU measurer of the
cluster (``num_gpus=0``): the same placement and faults, testable without a GPU.
"""

from __future__ import annotations

import socket
import threading
from typing import Callable

from gfsim.core.errors import GfsimError

__all__ = ["MeasurerPool", "LocalSlot", "RaySlot", "SlotLost", "MeasurerActor", "local_pool",
           "ray_pool", "LOSSES_PER_CANDIDATE", "device_where"]

# A candidate is measured on at most this many slots that disappear under it; then it is
# recorded as an infrastructure failure (it may be what brings its slots down).
LOSSES_PER_CANDIDATE = 2
# Seconds a new actor has to say where it is (start a worker, import torch, probe the sandbox).
START_TIMEOUT_S = 300.0


class SlotLost(Exception):
    """The slot (its actor, its host or its GPU) disappeared during a call."""


def device_where(interpret: bool) -> dict:
    """This process's host and the GPU it measures on: ``host``, ``gpu`` (the index on its
    host, None on the CPU), ``device`` (the name) and, where NVML answers, ``uuid``."""
    import os

    where: dict = {"host": socket.gethostname(), "gpu": None}
    import torch

    if interpret or not torch.cuda.is_available():
        where["device"] = "cpu (Triton interpreter)"
        return where
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if v.strip()]
    index = torch.cuda.current_device()
    # The index on the host: CUDA_VISIBLE_DEVICES maps this process's device 0 to it.
    where["gpu"] = int(visible[index]) if visible and visible[index].isdigit() else index
    where["device"] = torch.cuda.get_device_name(index)
    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(where["gpu"]))
        where["uuid"] = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    except Exception:  # noqa: BLE001 - no NVML: the UUID stays unknown
        pass
    return where


def _label(where: dict) -> str:
    gpu = f"cpu{where.get('measurer', '')}" if where.get("gpu") is None else f"gpu{where['gpu']}"
    return f"{where.get('host')}:{gpu}"


class Slot:
    """One measuring place: ``measure(task, code)`` gives the measurer's answer (an
    ``evaluation``'s fields) or raises ``SlotLost``; ``where`` says where it is."""

    where: dict

    def measure(self, task: str, code: str) -> dict:
        raise NotImplementedError

    def close(self) -> None:
        pass


class LocalSlot(Slot):
    """The measurers of this process, one per task (``measurer_for(task)``), made as needed."""

    def __init__(self, measurer_for: Callable, where: dict):
        self.measurer_for = measurer_for
        self.where = where
        self._measurers: dict = {}

    def measure(self, task: str, code: str) -> dict:
        from gfsim.live.candidates import CodeCandidate

        if task not in self._measurers:
            self._measurers[task] = self.measurer_for(task)
        return self._measurers[task].measure(CodeCandidate(task, code))

    def close(self) -> None:
        for m in self._measurers.values():
            m.close()
        self._measurers.clear()


class MeasurerActor:
    """A Ray actor that measures for a live run on one GPU of its host (or, under the
    interpreter, one CPU): ``TritonMeasurer``s made as tasks come, kept warm for the run."""

    def __init__(self, config):
        from gfsim.live.measure.measurer import TritonMeasurer

        self.config = config
        self._slot = LocalSlot(lambda task: TritonMeasurer(task, config), {})

    def where(self) -> dict:
        """Where this actor measures, and what its host's kernel lets the sandbox do."""
        from gfsim.live.measure.sandbox import probe_subprocess

        out = device_where(self.config.interpret)
        fac = probe_subprocess()
        out["sandbox_missing"] = list(fac.missing())
        return out

    def measure(self, task: str, code: str) -> dict:
        return self._slot.measure(task, code)

    def close(self) -> None:
        self._slot.close()


class RaySlot(Slot):
    """A ``MeasurerActor`` of a Ray cluster."""

    def __init__(self, ray, actor, where: dict):
        self._ray = ray
        self.actor = actor
        self.where = where

    def measure(self, task: str, code: str) -> dict:
        ray = self._ray
        try:
            return ray.get(self.actor.measure.remote(task, code))
        except ray.exceptions.RayTaskError as exc:  # the measurer raised: its error, here
            from gfsim.core.executor import task_error

            raise task_error(exc) from None
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError,
                ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as exc:
            raise SlotLost(_first_line(exc)) from None

    def close(self) -> None:
        ray = self._ray
        try:
            ray.get(self.actor.close.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - a dead or stuck actor: killed below anyway
            pass
        try:
            ray.kill(self.actor)
        except Exception:  # noqa: BLE001 - already gone
            pass


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


class MeasurerPool:
    """Slots that measure candidates, each one at a time; ``measure`` sends a candidate to a
    free slot (waiting for one), and to another where its slot is lost (module doc).
    ``placement`` says how the slots were placed (for the log and the summary)."""

    def __init__(self, slots: list[Slot], placement: dict, owner=None):
        if not slots:
            raise GfsimError("a live run needs at least one measurer")
        self.slots = list(slots)
        self.placement = placement
        self.lost: list[dict] = []  # every slot lost, in order
        self._free = list(self.slots)
        self._alive = len(self.slots)
        self._cond = threading.Condition()
        self._owner = owner  # what to close after the slots (a Ray connection)

    @property
    def size(self) -> int:
        """The slots the run began with (its GPU capacity)."""
        return len(self.slots)

    def _take(self) -> Slot:
        with self._cond:
            while not self._free:
                if self._alive == 0:
                    raise GfsimError(
                        f"every measurer of this run was lost ({len(self.lost)}: "
                        f"{', '.join(_label(w) for w in self.lost[:8])}); the log keeps what "
                        "was measured: rerun the command with `resume` once GPUs are back")
                self._cond.wait()
            return self._free.pop(0)

    def _give(self, slot: Slot) -> None:
        with self._cond:
            self._free.append(slot)
            self._cond.notify()

    def _drop(self, slot: Slot, why: str) -> dict:
        lost = {**slot.where, "error": why}
        with self._cond:
            self._alive -= 1
            self.lost.append(lost)
            self._cond.notify_all()
        slot.close()
        return lost

    def measure(self, task: str, code: str, on_try: Callable[[dict], None] | None = None,
                on_lost: Callable[[dict], None] | None = None
                ) -> tuple[dict, dict | None, list[dict]]:
        """Measure ``code`` of ``task`` on a free slot: (the measurer's answer, where it was
        measured, the slots lost under it). ``on_try(where)`` is called just before each try
        and ``on_lost(where and error)`` after each slot lost (the driver records both)."""
        lost: list[dict] = []
        while True:
            slot = self._take()
            where = slot.where
            try:
                if on_try is not None:
                    on_try(where)
                ev = slot.measure(task, code)
            except SlotLost as exc:
                lost.append(self._drop(slot, str(exc)))
                if on_lost is not None:
                    on_lost(lost[-1])
                if len(lost) >= LOSSES_PER_CANDIDATE:
                    return _lost_too_often(lost), None, lost
                continue
            except BaseException:
                self._give(slot)
                raise
            self._give(slot)
            return ev, where, lost

    def measure_each(self, task: str, code: str) -> list[tuple[dict, dict]]:
        """Measure ``code`` of ``task`` on every measurer at once (a run's seed kernel, before
        anything else is measured: each measurer warms up on it, its compile cache and its
        baseline's timing, and the answers say how far its timings agree): (answer, where)
        per measurer not lost, in the pool's order."""
        with self._cond:
            slots, self._free = list(self._free), []
        answers: list = [None] * len(slots)

        def one(k: int) -> None:
            try:
                answers[k] = slots[k].measure(task, code)
            except BaseException as exc:  # noqa: BLE001 - sorted out below
                answers[k] = exc

        threads = [threading.Thread(target=one, args=(k,), name=f"gfsim-measure-each-{k}")
                   for k in range(len(slots))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out, error = [], None
        for slot, answer in zip(slots, answers):
            if isinstance(answer, SlotLost):
                self._drop(slot, str(answer))
                continue
            self._give(slot)
            if isinstance(answer, BaseException):
                error = error or answer
            else:
                out.append((answer, slot.where))
        if error is not None:
            raise error
        if not out:
            self._take()  # (raises: every measurer lost)
        return out

    def describe(self) -> dict:
        return {**self.placement, "measurers": len(self.slots),
                "where": [s.where for s in self.slots],
                **({"lost": self.lost} if self.lost else {})}

    def close(self) -> None:
        for slot in self.slots:
            slot.close()
        if self._owner is not None:
            self._owner.close()
            self._owner = None


def _lost_too_often(lost: list[dict]) -> dict:
    return {"outcome": "infrastructure_failure", "failed_stage": "placement",
            "compile_s": 0.0, "check_s": 0.0, "timing_s": 0.0, "wall_s": 0.0,
            "reason": f"the measurer disappeared under this candidate {len(lost)} times "
                      f"({'; '.join(_label(w) + ': ' + w['error'] for w in lost)[:400]}); "
                      "not measured again"}


def local_pool(measurer_for: Callable, interpret: bool) -> MeasurerPool:
    """This process's measurers, on the GPU torch sees (one slot)."""
    return MeasurerPool([LocalSlot(measurer_for, {"measurer": 0, **device_where(interpret)})],
                        {"placement": "local"})


def ray_pool(cluster: str, config, gpus: int | None = None, *,
             trust_candidates: bool = False) -> MeasurerPool:
    """One ``MeasurerActor`` per GPU of the Ray cluster ``cluster`` (``--cluster``'s value),
    or ``gpus`` of them; under the interpreter (``config.interpret``) ``gpus`` CPU actors
    (default 2). Refuses, before any candidate, a cluster without that many GPUs and a host
    whose kernel cannot confine candidates (unless ``trust_candidates``)."""
    from gfsim.core.executor import RayCluster, parse_cluster

    address = parse_cluster(cluster)
    if address is None:
        raise GfsimError("a measurer pool on a cluster needs `cluster`")
    conn = RayCluster(address)
    ray = conn.join()
    try:
        have = float(ray.cluster_resources().get("GPU", 0))
        if config.interpret:
            n, per = (gpus or 2), {"num_gpus": 0, "num_cpus": 1}
            cpus = float(ray.cluster_resources().get("CPU", 0))
            if n > cpus:
                raise GfsimError(f"`gpus` {n}: the Ray cluster {address} has {cpus:g} CPUs "
                                 "for measurers under the interpreter")
        else:
            if have < 1:
                raise GfsimError(f"`cluster`: the Ray cluster {address} has no GPU (its nodes "
                                 "were started without one: ray start --num-gpus N); use "
                                 "`measurer` interpret to measure on CPUs")
            n, per = (gpus or int(have)), {"num_gpus": 1, "num_cpus": 1}
            if n > have:
                raise GfsimError(f"`gpus` {n}: the Ray cluster {address} has {have:g} GPUs")
        actor_class = ray.remote(max_restarts=0, max_task_retries=0, **per)(MeasurerActor)
        actors = [actor_class.remote(config) for _ in range(n)]
        try:
            wheres = ray.get([a.where.remote() for a in actors], timeout=START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise GfsimError(f"`cluster`: {n} measurers did not start on {address} in "
                             f"{START_TIMEOUT_S:.0f} s (are {n} "
                             f"{'CPUs' if config.interpret else 'GPUs'} free?)") from None
        unsafe = [w for w in wheres if w.get("sandbox_missing")]
        if unsafe and not trust_candidates:
            raise GfsimError(f"`cluster`: host {unsafe[0]['host']} cannot confine candidate "
                             f"code (no {', '.join(unsafe[0]['sandbox_missing'])}); pass "
                             "`trust_candidates` to run there anyway")
        wrong = [w for w in wheres if not config.interpret and w.get("gpu") is None]
        if wrong:
            raise GfsimError(f"`cluster`: the measurer placed on {wrong[0]['host']} sees no "
                             "CUDA GPU, though Ray gave it one")
        slots = [RaySlot(ray, a, {"measurer": k, **{f: v for f, v in w.items()
                                                    if f != "sandbox_missing"}})
                 for k, (a, w) in enumerate(zip(actors, wheres))]
    except BaseException:
        conn.close()
        raise
    return MeasurerPool(slots, {"placement": "ray", "address": address,
                                "hosts": sorted({w["host"] for w in wheres})}, owner=conn)


def on_cluster(pool: MeasurerPool, hardware: dict) -> dict:
    """A live log header's ``hardware`` block for a run measured by ``pool`` on a cluster: the
    measurers' device name (``mixed: ...`` where they differ) and where each one is, in place
    of this machine's device; returns ``hardware``."""
    placed = pool.describe()
    names = sorted({w.get("device") or "?" for w in placed["where"]})
    for key in ("device_name", "cpu", "cuda", "driver"):
        hardware.pop(key, None)  # this machine's: it measures nothing
    hardware["device_name"] = names[0] if len(names) == 1 else "mixed: " + ", ".join(names)
    hardware["measurers"] = placed["where"]
    return hardware
