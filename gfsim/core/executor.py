"""Where gfsim's fanned-out work runs: in this process, in local processes, or on a Ray cluster.

Everything gfsim fans out is a map of a module-level function over items, with one input every
task reads (``shared``: a log, a trial setup) installed once per worker: ``fn(shared, item)``.
``Executor`` is that map's one interface, with three implementations chosen at construction:

- ``InProcess``: here, one item after another;
- ``LocalProcesses``: ``jobs`` processes of this machine (``--jobs N``; no dependency);
- ``RayCluster``: the tasks of a running Ray cluster (``--cluster ray`` joins the one at
  ``RAY_ADDRESS``, ``--cluster ray://HOST:PORT`` a named one through Ray Client; the
  ``gfsim[cluster]`` extra, imported only here and only then).

Every task is a pure function of its item and ``shared`` (seeds travel in the items), so the
results are the same wherever they ran, and ``map`` returns them in the items' order. A worker
killed mid-task costs a retry of that task only (``RETRIES`` times at most per map): a result
is taken once, by its item's index, so nothing is lost or counted twice. ``shared`` travels
once: to each local process when it starts, and to a cluster through Ray's object store (one
``ray.put``; each worker reads it once and keeps it). Before any work, a cluster that cannot
be reached, or whose workers lack gfsim or run another version or source of it, is refused in
one line. ``describe()`` says where the work ran, for the JSON outputs.
"""

from __future__ import annotations

import hashlib
import os
import socket
from typing import Any, Callable, Iterable, Iterator

from gfsim.core.errors import GfsimError

__all__ = ["Executor", "InProcess", "LocalProcesses", "RayCluster", "make_executor", "task_error",
           "parse_cluster", "source_fingerprint", "cores", "RETRIES", "CLUSTER_HELP"]

RETRIES = 3  # a map's re-runs after killed workers, before it gives up
POLL_S = 0.5  # how often a map's ``poll`` is called while tasks run elsewhere
CLUSTER_HELP = ("Run the work on a Ray cluster instead of local processes: 'ray' joins the "
                "cluster at $RAY_ADDRESS (or the one started on this machine), "
                "'ray://HOST:PORT' a named one through Ray Client (pip install "
                "'gfsim[cluster]'; the cluster's workers need the same gfsim).")

Progress = Callable[[int, int], None]

_INSTALLED: dict = {}  # in a worker process: the shared input of the map it serves


def _nothing() -> None:
    pass


class Executor:
    """Runs ``fn(shared, item)`` for every item of a map. ``fn`` is a module-level function (it
    travels by name); ``shared`` is fixed at construction, installed once per worker.

    Subclasses implement ``_start_tasks``."""

    kind = "in-process"

    def __init__(self, shared: Any = None):
        self.shared = shared

    @property
    def workers(self) -> int:
        return 1

    def map(self, fn: Callable, items: Iterable, *, progress: Progress | None = None,
            poll: Callable[[], None] | None = None) -> Iterator:
        """``fn(shared, item)`` of every item, yielded in the items' order as soon as each one
        and those before it are done; ``progress(done, total)`` after each task, ``poll()``
        about every ``POLL_S`` while tasks run elsewhere. The tasks are handed out at the
        call (where they run elsewhere), not at the first ``next``."""
        items = list(items)
        return self._in_order(self._start_tasks(fn, items, poll or _nothing), len(items),
                              progress)

    @staticmethod
    def _in_order(completed: Iterator, total: int, progress: Progress | None) -> Iterator:
        waiting: dict[int, Any] = {}
        turn = 0
        for done, (index, result) in enumerate(completed, 1):
            waiting[index] = result
            if progress is not None:
                progress(done, total)
            while turn in waiting:
                yield waiting.pop(turn)
                turn += 1

    def run(self, fn: Callable, items: Iterable, *, progress: Progress | None = None,
            poll: Callable[[], None] | None = None) -> list:
        """``map``'s results as a list."""
        return list(self.map(fn, items, progress=progress, poll=poll))

    def _start_tasks(self, fn: Callable, items: list, poll: Callable[[], None]
                     ) -> Iterator[tuple[int, Any]]:
        """Hand out the tasks; (index, result) pairs as they finish, in any order, each index
        once; ``poll()`` about every ``POLL_S`` while waiting."""
        return ((index, fn(self.shared, item)) for index, item in enumerate(items))  # (no poll)

    def describe(self) -> dict:
        """Where the work ran (the JSON outputs' ``ran_on``)."""
        return {"executor": self.kind, "workers": self.workers}

    def close(self, cancel: bool = False) -> None:
        """Let the workers go (``cancel``: the tasks not yet begun are dropped)."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, kind, *exc) -> None:
        self.close(cancel=kind is not None)


class InProcess(Executor):
    """Here, one item after another."""


def _install(shared, initializer, initargs) -> None:
    from gfsim.core.lifeline import die_with_parent

    die_with_parent()  # a worker ends with the command that started it
    _INSTALLED["shared"] = shared
    if initializer is not None:
        initializer(*initargs)


def _local_call(fn: Callable, item):
    return fn(_INSTALLED.get("shared"), item)


class LocalProcesses(Executor):
    """``jobs`` processes of this machine, started at the first map and kept for the next
    (warm: a worker keeps what it cached); ``initializer(*initargs)`` runs in each as it
    starts, after ``shared`` is installed."""

    kind = "local-processes"

    def __init__(self, jobs: int, shared: Any = None, initializer: Callable | None = None,
                 initargs: tuple = ()):
        super().__init__(shared)
        self.jobs = int(jobs)
        self.initializer = initializer
        self.initargs = initargs
        self._pool = None

    @property
    def workers(self) -> int:
        return self.jobs

    def _start(self):
        if self._pool is None:
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(self.jobs, initializer=_install,
                                             initargs=(self.shared, self.initializer,
                                                       self.initargs))
        return self._pool

    def _submit(self, fn: Callable, pending: dict) -> dict:
        pool = self._start()
        return {pool.submit(_local_call, fn, item): index for index, item in pending.items()}

    def _start_tasks(self, fn: Callable, items: list, poll: Callable[[], None]
                     ) -> Iterator[tuple[int, Any]]:
        pending = dict(enumerate(items))
        return self._collect(fn, pending, self._submit(fn, pending), poll)

    def _collect(self, fn: Callable, pending: dict, futures: dict, poll) -> Iterator:
        from concurrent.futures import FIRST_COMPLETED, wait
        from concurrent.futures.process import BrokenProcessPool

        broken, total = 0, len(pending)
        while pending:
            try:
                waiting = set(futures)
                while waiting:
                    done, waiting = wait(waiting, timeout=POLL_S, return_when=FIRST_COMPLETED)
                    poll()
                    for future in done:
                        result = future.result()
                        index = futures[future]
                        del pending[index]
                        yield index, result
            except BrokenProcessPool:
                # A worker died (killed, or out of memory): the pool is unusable, and the
                # tasks not yet taken run again in a fresh one.
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
                broken += 1
                if broken > RETRIES:
                    raise GfsimError(
                        f"a worker process died {broken} times in one run of {total} tasks "
                        f"({len(pending)} not done); was one killed, or out of memory? Try "
                        "fewer `jobs`") from None
                futures = self._submit(fn, pending)

    def close(self, cancel: bool = False) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=cancel)
            self._pool = None


# -- Ray ------------------------------------------------------------------------------------------

def source_fingerprint() -> str:
    """A hash of this gfsim's Python sources (every module of the package, by dotted name,
    whether the install is regular or editable): two processes with the same fingerprint
    compute the same results."""
    import importlib.util

    found: dict[str, bytes] = {}
    for package in ("gfsim", "gfsim.simulator", "gfsim.policies", "gfsim.cost_models",
                    "gfsim.replay_logs"):
        spec = importlib.util.find_spec(package)
        for root in (spec.submodule_search_locations or []) if spec else []:
            for folder, dirs, files in os.walk(root):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                rel = os.path.relpath(folder, root)
                prefix = package if rel == "." else package + "." + rel.replace(os.sep, ".")
                for name in files:
                    if name.endswith(".py"):
                        with open(os.path.join(folder, name), "rb") as f:
                            found[f"{prefix}.{name[:-3]}"] = hashlib.sha256(f.read()).digest()
    digest = hashlib.sha256()
    for name in sorted(found):
        digest.update(name.encode() + b"\0" + found[name])
    return digest.hexdigest()[:16]


def whereabouts() -> dict:
    """What a worker runs: gfsim's version and source fingerprint, Python's, its host."""
    import platform

    import gfsim

    return {"gfsim": gfsim.__version__, "source": source_fingerprint(),
            "python": platform.python_version(), "host": socket.gethostname()}


def parse_cluster(value: str | None) -> str | None:
    """``--cluster``'s value as the address ``ray.init`` takes: ``ray`` is ``$RAY_ADDRESS``
    (else ``auto``: the cluster started on this machine), ``ray://HOST:PORT`` itself; None
    for none."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if value == "ray":
        return os.environ.get("RAY_ADDRESS", "").strip() or "auto"
    if value.startswith("ray://") and value.count(":") == 2 and value.rsplit(":", 1)[1].isdigit():
        return value
    raise GfsimError(f"`cluster`: expected 'ray' (the cluster at $RAY_ADDRESS) or "
                     f"'ray://HOST:PORT', got {value!r:.80}")


def _reachable(address: str, timeout_s: float = 3.0) -> str | None:
    """Why ``address`` (``HOST:PORT`` or ``ray://HOST:PORT``) answers no connection, or None
    (``auto`` and other forms are left to Ray)."""
    host_port = address[len("ray://"):] if address.startswith("ray://") else address
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        return f"nothing answers at {host}:{port} ({exc.strerror or exc})"
    return None


def _ray_call(box: list, fn: Callable, item):
    """In a Ray worker: ``fn(shared, item)``, ``shared`` fetched from the object store once
    per worker process (``box`` holds its reference, or nothing) and kept."""
    shared = None
    if box:
        key = box[0].hex()
        if _INSTALLED.get("key") != key:
            import ray

            _INSTALLED["shared"], _INSTALLED["key"] = ray.get(box[0]), key
        shared = _INSTALLED["shared"]
    return fn(shared, item)


class RayCluster(Executor):
    """The tasks of a running Ray cluster at ``address`` (what ``parse_cluster`` gives).
    Joining checks the cluster (``_check``); each task may be retried ``retries`` times when
    its worker dies, never when ``fn`` raised."""

    kind = "ray"

    def __init__(self, address: str, shared: Any = None, retries: int = RETRIES):
        super().__init__(shared)
        self.address = address
        self.retries = int(retries)
        self._ray = None
        self._box: list = []
        self._task = None
        self._seen: dict = {}
        self._owns = False

    @property
    def workers(self) -> int:
        self.join()
        return int(self._ray.cluster_resources().get("CPU", 0))

    def join(self):
        """Join the cluster (once; ``_check`` refuses a cluster unfit for this gfsim) and
        return the ``ray`` module, connected."""
        if self._ray is not None:
            return self._ray
        try:
            import ray
        except ImportError:
            raise GfsimError("`cluster` ray needs Ray: pip install 'gfsim[cluster]'") from None
        why = _reachable(self.address)
        if why:
            raise GfsimError(f"`cluster`: the Ray cluster {self.address} cannot be reached: "
                             f"{why}")
        self._owns = not ray.is_initialized()  # (one connection a process: Ray's own)
        if self._owns:
            try:
                ray.init(address=self.address, logging_level="ERROR", log_to_driver=False,
                         configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise GfsimError(f"`cluster`: the Ray cluster {self.address} cannot be "
                                 f"joined: {first}") from None
        self._ray = ray
        try:
            self._seen = self._check(ray)
        except BaseException:
            self.close()
            raise
        if self.shared is not None:
            self._box = [ray.put(self.shared)]
        self._task = ray.remote(max_retries=self.retries)(_ray_call)
        return ray

    @staticmethod
    def _check(ray) -> dict:
        """Refuse a cluster whose workers lack gfsim, or run another version or source of it
        than this process (one line); else what they run. The probe is a nested function,
        which Ray sends by value: it runs where gfsim cannot be imported too."""

        def probe():
            try:
                from gfsim.core.executor import whereabouts
            except ImportError as exc:
                return {"error": f"{type(exc).__name__}: {exc}"}
            return whereabouts()

        mine = whereabouts()
        try:
            theirs = ray.get(ray.remote(max_retries=0)(probe).remote(), timeout=120)
        except Exception as exc:  # noqa: BLE001 - any failure of the probe is the refusal
            raise GfsimError(f"`cluster`: the cluster's workers could not run gfsim's probe: "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                             ) from None
        why = _mismatch(mine, theirs)
        if why:
            raise GfsimError(f"`cluster`: refused: {why}")
        return theirs

    def _start_tasks(self, fn: Callable, items: list, poll: Callable[[], None]
                     ) -> Iterator[tuple[int, Any]]:
        ray = self.join()
        refs = {self._task.remote(self._box, fn, item): index for index, item in enumerate(items)}
        return self._collect(ray, refs, poll)

    def _collect(self, ray, refs: dict, poll) -> Iterator:
        pending = list(refs)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
                poll()
                for ref in ready:
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:  # fn raised: not retried
                        raise task_error(exc) from None
                    except ray.exceptions.WorkerCrashedError:
                        raise GfsimError(f"a task's Ray worker died {self.retries + 1} times; "
                                         "was it killed, or out of memory?") from None
                    yield refs[ref], result
        finally:
            for ref in pending:  # an error or a stop: the rest is not wanted
                ray.cancel(ref, force=True)

    def describe(self) -> dict:
        ray = self.join()
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        return {"executor": self.kind, "address": self.address, "nodes": len(nodes),
                "workers": self.workers, "hosts": sorted({n["NodeManagerHostname"]
                                                           for n in nodes}),
                "gfsim": self._seen.get("gfsim"), "source": self._seen.get("source")}

    def close(self, cancel: bool = False) -> None:
        if self._ray is not None:
            if self._owns:
                self._ray.shutdown()
            self._ray = None


def task_error(exc) -> BaseException:
    """What a Ray task or actor method raised (a ``RayTaskError``'s cause), to raise here as
    it was raised there."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc.as_instanceof_cause()


def _mismatch(mine: dict, theirs: dict) -> str | None:
    """Why a cluster whose probe answered ``theirs`` may not run this process's work."""
    if "error" in theirs:
        return f"its workers cannot import gfsim ({theirs['error']}); install the same gfsim there"
    if theirs.get("gfsim") != mine["gfsim"]:
        return (f"its workers run gfsim {theirs.get('gfsim')}, this is {mine['gfsim']}; "
                "install the same version there")
    if theirs.get("source") != mine["source"]:
        return (f"its workers run other gfsim sources (fingerprint {theirs.get('source')}, "
                f"this {mine['source']}): the results would not be this gfsim's")
    return None


def cores() -> int:
    """The cores this process may run on (``--jobs 0``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # (not on every platform)
        return max(1, os.cpu_count() or 1)


def make_executor(jobs: int = 1, cluster: str | None = None, shared: Any = None, *,
                  initializer: Callable | None = None, initargs: tuple = ()) -> Executor:
    """The executor a command's ``--jobs`` and ``--cluster`` ask for: a Ray cluster where
    ``cluster`` names one, else ``jobs`` local processes (1: this process; ``initializer``
    runs only in processes started for the work)."""
    address = parse_cluster(cluster)
    if address is not None:
        return RayCluster(address, shared)
    if jobs <= 1:
        return InProcess(shared)
    return LocalProcesses(jobs, shared, initializer, initargs)
