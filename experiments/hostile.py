"""The hostile-candidate suite: kernels that try to fool or escape the measurer, and what each
one must not achieve. ``experiments/hostile_suite.py`` prints the table; ``tests/test_hostile.py``
runs the CPU rows; on a GPU every row runs.

Each row is a candidate built around an honest kernel (so that, fooling aside, it would pass),
plus a verdict that inspects the evaluation and the machine afterwards: a row is *contained*
when the attack changed nothing the measurer reports or the host keeps. The forging rows are
judged against the same honest kernel measured in the same run (``honest_ns``).
"""

from __future__ import annotations

import os
import socket
import tempfile
import textwrap
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

__all__ = ["Context", "Row", "ROWS", "honest_code", "run_row", "run_suite", "format_table"]

# A plain-PyTorch softmax, row by row: the honest kernel of the CPU rows. (The interpreter would
# make a Triton one slow; row by row, a call costs several times what the timing loop around it
# does, so the measurer's clock resolves a forged claim on two busy CPU cores.)
_TORCH_SOFTMAX = '''
import torch
def _honest(x):
    y = torch.empty_like(x)
    for i in range(x.shape[0]):
        row = x[i].double()
        e = torch.exp(row - row.max())
        y[i] = (e / e.sum()).to(x.dtype)
    return y
'''


def honest_code(task, device: str) -> str:
    """The honest kernel the rows wrap, defining ``_honest(*inputs)``: the task's first
    hand-written Triton candidate on a GPU; on the CPU a PyTorch softmax (task softmax)."""
    if device == "cuda":
        return task.candidates()[0].code.replace("\ndef run(", "\ndef _honest(")
    if task.name != "softmax":
        raise ValueError("the CPU rows wrap a softmax: run them with task softmax")
    return _TORCH_SOFTMAX


@dataclass
class Context:
    """What the rows share: the honest code, markers the host is searched for afterwards, the
    paths and the socket an escape would reach."""

    honest: str
    device: str = "cpu"
    marker: str = field(default_factory=lambda: "gfsimhostile" + uuid.uuid4().hex[:8])
    outside: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gfsim-host-")))
    log_path: Path | None = None
    parent_pid: int = field(default_factory=os.getpid)
    package_dirs: list = field(default_factory=list)
    honest_ns: float | None = None
    secret: str = "GFSIM_HOSTILE_SECRET_VALUE"
    # What the files the reading rows try lie hold: it must never reach a record.
    read_secret: str = field(default_factory=lambda: "GFSIMREAD" + uuid.uuid4().hex[:12])
    measurer_root: Path | None = None  # set by run_row: the measurer's own folder
    # Set by run_row from the measurer's settings: what the hoarding rows must not pass.
    memory_limit_mb: float = 16_000.0
    max_tasks: int = 512
    root_device: str | None = None  # the block device of "/", where there is one
    unix_path: str | None = None
    connections: list = field(default_factory=list)
    _server: socket.socket | None = None

    def __post_init__(self):
        import gfsim

        self.package_dirs = [str(Path(gfsim.__file__).resolve().parent.parent)]
        os.environ["GFSIM_HOSTILE_SECRET"] = self.secret  # what read-environ looks for
        self.log_path = self.outside / "live.jsonl"
        self.log_path.write_text('{"kind": "header", "note": "%s log"}\n' % self.read_secret)
        self._secret_files()
        self.root_device = _root_device()
        self.unix_path = str(self.outside / "host.sock")
        self.dgram_path = str(self.outside / "host.dgram")
        self._dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._dgram.bind(self.dgram_path)
        self._dgram.setblocking(False)
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.unix_path)
        self._server.listen(4)
        self._server.settimeout(0.2)
        threading.Thread(target=self._accept, daemon=True).start()

    def _secret_files(self):
        """Two 0600 files outside every sandbox's folder: one of this process's user, and
        (where this process may give it away, as root) one of another user (nobody)."""
        for name, owner in (("own-secret.txt", None), ("other-secret.txt", 65534)):
            path = self.outside / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(f"{self.read_secret} {name}\n")
            if owner is not None:
                try:
                    os.chown(path, owner, owner)
                except OSError:
                    path.unlink()

    def _accept(self):
        while self._server is not None:
            try:
                conn, _ = self._server.accept()
                self.connections.append(True)
                conn.close()
            except OSError:
                continue

    def datagrams(self) -> int:
        n = 0
        while True:
            try:
                self._dgram.recv(4096)
                n += 1
            except OSError:
                return n

    def close(self):
        self._dgram.close()
        server, self._server = self._server, None
        if server is not None:
            server.close()
        from gfsim.core.folders import remove_tree

        remove_tree(self.outside)


def _root_device() -> str | None:
    """The block device the root file system lies on (``/dev/vda``, say), or None (an overlay
    or another file system with no device of its own)."""
    st = os.stat("/")
    try:
        uevent = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/uevent")
        name = dict(line.split("=", 1) for line in uevent.read_text().split()
                    if "=" in line).get("DEVNAME")
    except OSError:
        return None
    return f"/dev/{name}" if name and Path(f"/dev/{name}").exists() else None


@dataclass(frozen=True)
class Row:
    name: str
    attempt: str  # what the candidate tries
    today: str  # what it achieved before the sandbox (issue 22's table)
    body: Callable  # (Context) -> code after the honest part, defining run(*inputs)
    verdict: Callable  # (evaluation, Context, host) -> (contained: bool, detail: str)
    gpu_only: bool = False


def _run(expr: str = "_honest(*inputs)") -> str:
    return f"def run(*inputs):\n    return {expr}\n"


def _forge(factor: float, skip_flush: bool = False):
    """Divide the reported times by ``factor``; with ``skip_flush``, also skip the loop's own
    work (the L2 flush) in its process, so that the batches really are shorter."""
    flush = ('_t._flush_buffer = lambda: _t._cuda()["empty"](1, dtype=_t._uint8(), '
             'device="cuda")') if skip_flush else ""

    def body(ctx):
        return textwrap.dedent(f'''
            import sys
            _t = sys.modules["gfsim.live.measure.timing"]
            _real = _t.time_reps
            {flush}
            def _fake(*a, **k):
                r = _real(*a, **k)
                r["times_ms"] = [x / {factor!r} for x in r["times_ms"]]
                for key in ("mean_ms", "median_ms", "value_ms"):
                    r[key] /= {factor!r}
                r["kernel_s"] /= {factor!r}
                return r
            _t.time_reps = _fake
        ''') + _run()
    return body


def _timing_held(rec, ctx, host):
    """A forgery is contained when it is refused or fails, or when every shape is recorded at
    no less than 0.7x the floor the measurer's own clock vouches for (the loosest tolerance)
    and, on a GPU, the whole within 10% of the honest kernel's time. (On two busy CPU cores the
    interpreter's times vary by 2x from run to run, so there the record's own floor is the
    yardstick.)"""
    if rec["outcome"] != "success":
        return True, f"refused ({rec['outcome']}): {rec.get('reason', '')[:80]}"
    return _held(rec, ctx)


def _held(rec, ctx):
    ratio = rec["runtime_ns"] / ctx.honest_ns
    floors = [(v, f) for v, f in zip(rec["timing_value_ms"], rec["timing_floor_ms"])
              if f is not None and f > 0]  # no floors on the GPU clock: it claims nothing
    own = min((v / f for v, f in floors), default=None)
    ok = (own is None or own >= 0.7) and (ratio >= 0.9 or ctx.device != "cuda")
    where = " (on the measurer's GPU clock)" if rec.get("timing_clock") == "gpu" else \
        f", at least {own:.2f}x the measurer's floor" if own is not None else ""
    return ok, (f"recorded at {ratio:.2f}x the honest kernel's time{where}"
                + (" (capped)" if rec.get("timing_capped") else ""))


def _perf_counter(ctx):
    return textwrap.dedent('''
        import time
        _real = time.perf_counter
        _start = _real()
        time.perf_counter = lambda: _start + (_real() - _start) / 1e6
    ''') + _run()


def _cache_by_pointer(ctx):
    return textwrap.dedent('''
        _cache = {}
        def run(*inputs):
            key = tuple((x.data_ptr(), tuple(x.shape)) for x in inputs)
            if key not in _cache:
                _cache[key] = _honest(*inputs)
            return _cache[key]
    ''')


def _failed_or_honest(rec, ctx, host):
    if rec["outcome"] != "success":
        return rec["outcome"] in ("incorrect", "runtime_error"), \
            f"{rec['outcome']}: {rec.get('reason', '')[:90]}"
    return _held(rec, ctx)


def _sitecustomize(ctx):
    dirs = [*ctx.package_dirs]
    return textwrap.dedent(f'''
        import os, sys
        _wrote = []
        for d in ({dirs!r} + [p for p in sys.path if p]
                  + os.environ.get("PYTHONPATH", "").split(":")):
            try:
                with open(os.path.join(d, "sitecustomize.py"), "w") as f:
                    f.write("import time\\ntime.sleep(2)  # {ctx.marker}\\n")
                _wrote.append(d)
            except OSError:
                pass
    ''') + _run()


def _no_sitecustomize(rec, ctx, host):
    import sys

    found = [d for d in {*ctx.package_dirs, *sys.path} if d and
             Path(d, "sitecustomize.py").is_file() and
             ctx.marker in Path(d, "sitecustomize.py").read_text(errors="replace")]
    for d in found:  # never leave it behind, even when the row fails
        Path(d, "sitecustomize.py").unlink()
    return not found, "no sitecustomize.py written" if not found else f"written into {found}"


def _threads(ctx):
    return textwrap.dedent(f'''
        import ctypes, hashlib, threading
        _block = b"x" * (64 * 1024 * 1024)
        def _burn():  # hashing a large buffer releases the GIL: the cores burn, not the GIL
            ctypes.CDLL(None).prctl(15, b"{ctx.marker[:15]}", 0, 0, 0)
            while True:
                hashlib.sha256(_block).digest()
        for _ in range(4):
            threading.Thread(target=_burn, daemon=True).start()
    ''') + _run()


def _fork_hog(ctx):
    return textwrap.dedent(f'''
        import ctypes, os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                ctypes.CDLL(None).prctl(15, b"{ctx.marker[:15]}", 0, 0, 0)
                hog = bytearray(2 * 1024 ** 3)
                for i in range(0, len(hog), 4096):
                    hog[i] = 1
                time.sleep(3600)
            os._exit(0)
    ''') + _run()


def _shm(ctx):
    return textwrap.dedent(f'''
        _f = open("/dev/shm/{ctx.marker}", "wb")
        _chunk = b"x" * (64 * 1024 * 1024)
        try:
            for _ in range(19):  # about 1.2 GB
                _f.write(_chunk)
            _f.flush()
        except OSError:
            pass
    ''') + _run()


def _leftovers(rec, ctx, host):
    """No process or thread named after the marker, no /dev/shm file of it on the host."""
    import time

    time.sleep(0.3)
    left = []
    tag = ctx.marker[:15]
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                if Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip() == tag:
                    left.append(int(tid))
        except OSError:
            continue
    shm = Path("/dev/shm", ctx.marker)
    if shm.exists():
        left.append("/dev/shm file")
        shm.unlink()
    for tid in left:
        if isinstance(tid, int):
            try:
                os.kill(tid, 9)
            except OSError:
                pass
    return not left, "nothing left behind" if not left else f"left behind: {left[:4]}"


def _forge_log(ctx):
    return textwrap.dedent(f'''
        import json
        try:
            with open({str(ctx.log_path)!r}, "a") as f:
                f.write(json.dumps({{"kind": "evaluation", "candidate_id": "forged",
                                     "outcome": "success", "speedup": 1000.0}}) + "\\n")
        except OSError:
            pass
    ''') + _run()


def _log_intact(rec, ctx, host):
    text = ctx.log_path.read_text()
    ok = "forged" not in text
    return ok, "the log is untouched" if ok else "a forged record was appended"


def _kill_parent(ctx):
    return textwrap.dedent(f'''
        import os, signal
        for pid in (os.getppid(), {ctx.parent_pid}, -1):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    ''') + _run()


def _parent_alive(rec, ctx, host):
    ok = host.get("zygote_alive", True)
    return ok, "the measurer and its zygote survived" if ok else "the zygote died"


def _environ(ctx):
    return textwrap.dedent('''
        import os
        _found = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    raw = open(f"/proc/{pid}/environ", "rb").read()
                    _found.append(raw.decode(errors="replace"))
                except OSError:
                    pass
        _found.append(repr(dict(os.environ)))
        raise RuntimeError("seen: " + " | ".join(_found))
    ''') + _run()


def _no_secret(rec, ctx, host):
    text = repr(rec)
    ok = ctx.secret not in text
    return ok, "the secret stayed in the parent" if ok else "the secret leaked into the record"


def _unix_socket(ctx):
    return textwrap.dedent(f'''
        import socket
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect({ctx.unix_path!r})
            s.close()
        except OSError:
            pass
        for _send in ("sendto", "sendmsg"):
            try:
                d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                if _send == "sendto":
                    d.sendto(b"escaped", {ctx.dgram_path!r})
                else:
                    d.sendmsg([b"escaped"], [], 0, {ctx.dgram_path!r})
            except OSError:
                pass
    ''') + _run()


def _no_connection(rec, ctx, host):
    import time

    time.sleep(0.3)
    got = ctx.datagrams()
    ok = not ctx.connections and not got
    return ok, "nothing reached the host's sockets" if ok else \
        f"{len(ctx.connections)} connections, {got} datagrams reached the host"


def _write_outside(ctx):
    return textwrap.dedent(f'''
        for _p in ({str(ctx.outside / ctx.marker)!r}, "/tmp/{ctx.marker}"):
            try:
                open(_p, "w").write("escaped")
            except OSError:
                pass
    ''') + _run()


def _nothing_outside(rec, ctx, host):
    found = [p for p in (ctx.outside / ctx.marker, Path("/tmp", ctx.marker)) if p.exists()]
    for p in found:
        p.unlink()
    return not found, "no file written outside its folder" if not found else f"wrote {found}"


# The folder rows: each fills its own folder (the one place it may write) with what a cleanup
# of it must survive, under a folder named after the marker. Contained: the candidate's folder
# is gone once it is measured, nothing a link points to is touched, and the measurer goes on.
def _folder_attack(body: str):
    """The candidate's code: ``body`` run in a folder named after the marker. An attack the
    sandbox refuses fails the candidate's load, so the record says so (a row never passes
    for an attack that did not happen unseen)."""
    def code(ctx):
        return textwrap.dedent(f'''
            import os
            _home = os.getcwd()
            os.mkdir("{ctx.marker}")
            os.chdir("{ctx.marker}")
        ''') + textwrap.dedent(body.format(ctx=ctx)) + "os.chdir(_home)\n" + _run()
    return code


_DEEP = '''
for _ in range(3000):  # deeper than rmtree's recursion, longer than PATH_MAX
    os.mkdir("d" * 200)
    os.chdir("d" * 200)
'''
_MANY = '''
for _i in range(200_000):
    os.close(os.open(str(_i), os.O_WRONLY | os.O_CREAT, 0o600))
'''
_LINKS = '''
for _name, _to in (("self", "."), ("up", ".."), ("a", "b"), ("b", "a"), ("root", "/"),
                   ("outside", "{ctx.outside}"), ("measurer", "{ctx.measurer_root}")):
    os.symlink(_to, _name)
os.mkdir("x")
os.symlink("../x", "x/loop")
'''
_LOCKED = '''
os.makedirs("locked/inner")
os.makedirs("readonly")
for _d in ("locked/inner", "readonly"):
    for _i in range(10):
        open(f"{{_d}}/{{_i}}", "w").close()
    os.mkfifo(f"{{_d}}/fifo")
os.chmod("locked/inner", 0)
os.chmod("locked", 0)
os.chmod("readonly", 0o500)
'''


def _folder_removed(rec, ctx, host):
    """Nothing of the candidate's folder is left in the measurer's, the files a link pointed
    to are intact, and the measurer's zygote lives."""
    root = ctx.measurer_root
    left = [p.name for p in root.glob("gfsim-worker-*") if os.path.lexists(p / ctx.marker)] \
        if root is not None else ["(no measurer folder)"]
    intact = (ctx.outside / "own-secret.txt").exists() and root is not None and \
        (root / "zygote.log").exists()
    ok = not left and intact and host["zygote_alive"]
    how = f"{str(rec.get('reason'))[:90]}; " if rec.get("reason") else ""
    return ok, how + ("its folder removed, nothing a link points to touched" if ok else
                      f"left {left[:2]}" if left else "a linked file or the measurer is gone")


# The reading rows: each tries to read or list paths outside its folder, then raises with
# what it got, so that whatever it read would reach the record's reason (a file made by the
# suite: its text; a file or folder of the host: only how much, never its content).
_READ_HELPERS = '''
import os
def _try(label, fn, *args):
    try:
        return f"{label}=GOT:{fn(*args)}"
    except PermissionError:
        return f"{label}=denied"
    except FileNotFoundError:
        return f"{label}=absent"
    except OSError as exc:
        return f"{label}=refused({exc.errno})"
def _text(path):
    with open(path, errors="replace") as fh:
        return fh.read(200)
def _size(path):
    with open(path, "rb") as fh:
        return f"{len(fh.read(4096))} bytes"
def _listed(path):
    return f"{len(os.listdir(path))} entries"
def _opened_for_writing(path):
    os.close(os.open(path, os.O_WRONLY | os.O_CLOEXEC))
    return "opened for writing, nothing written"
'''


def _reads(targets) -> str:
    """The candidate's code: ``targets`` are ``(label, helper, path expression)``."""
    tries = ",\n    ".join(f"_try({label!r}, {helper}, {expr})" for label, helper, expr in targets)
    return _READ_HELPERS + f"_seen = [\n    {tries},\n]\n" + \
        'raise RuntimeError("reads: " + "; ".join(_seen))\n' + _run()


def _read_outside(ctx):
    return _reads([("own", "_text", repr(str(ctx.outside / "own-secret.txt"))),
                   ("other-user", "_text", repr(str(ctx.outside / "other-secret.txt"))),
                   ("folder", "_listed", repr(str(ctx.outside)))])


def _read_host(ctx):
    home = Path.home()
    targets = [("/root", "_listed", "'/root'"), ("home", "_listed", repr(str(home))),
               ("ssh", "_listed", repr(str(home / ".ssh"))), ("/tmp", "_listed", "'/tmp'"),
               ("shadow", "_size", "'/etc/shadow'")]
    if ctx.root_device:
        targets += [("disk", "_size", repr(ctx.root_device)),
                    ("disk-w", "_opened_for_writing", repr(ctx.root_device))]
    return _reads(targets)


def _read_log(ctx):
    return _reads([("log", "_text", repr(str(ctx.log_path))),
                   ("log-folder", "_listed", repr(str(ctx.log_path.parent))),
                   ("above-measurer", "_listed",
                    "os.path.dirname(os.path.dirname(os.getcwd()))")])


def _read_measurer(ctx):
    if ctx.measurer_root is not None:  # a file only the measurer's folder holds
        (ctx.measurer_root / "planted-secret.txt").write_text(f"{ctx.read_secret} planted\n")
    return _reads([("measurer", "_listed", "os.path.dirname(os.getcwd())"),
                   ("zygote-log", "_size",
                    "os.path.join(os.path.dirname(os.getcwd()), 'zygote.log')"),
                   ("planted", "_text",
                    "os.path.join(os.path.dirname(os.getcwd()), 'planted-secret.txt')")])


def _nothing_read(rec, ctx, host):
    """Contained when the candidate reported every attempt refused (or its path absent), and
    nothing of the suite's secret files reached the record."""
    if ctx.measurer_root is not None:
        Path(ctx.measurer_root, "planted-secret.txt").unlink(missing_ok=True)
    reason = str(rec.get("reason", ""))
    if ctx.read_secret in repr(rec):
        return False, "a secret file's text reached the record"
    if "reads: " not in reason:
        return False, f"no report of its attempts ({rec['outcome']}: {reason[:60]})"
    parts = reason.split("reads: ", 1)[1].split("; ")
    got = [p.split("=", 1)[0] for p in parts if "=GOT" in p]
    if got:
        return False, f"got {', '.join(got)}"
    return True, "refused: " + ", ".join(p.strip() for p in parts)[:100]


def _side_stream(ctx):
    return textwrap.dedent('''
        import torch
        _side = torch.cuda.Stream()
        def run(*inputs):
            _side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(_side):
                out = _honest(*inputs)
            return out
    ''')


def _shape_special(ctx):
    return textwrap.dedent('''
        import torch
        from gfsim.live.tasks import get_task
        _told = set()
        for _t in ("softmax", "layernorm", "matmul", "cross_entropy", "fp8_quant"):
            for _s in get_task(_t).check_shapes:
                _told.add(tuple(_s.values()))
        def run(*inputs):
            out = _honest(*inputs)
            if tuple(inputs[0].shape) not in _told:
                out = torch.zeros_like(out) if not isinstance(out, tuple) else out
            return out
    ''')


def _alias(ctx):
    return textwrap.dedent('''
        def run(*inputs):
            out = _honest(*inputs)
            inputs[0].copy_(out)
            return inputs[0]
    ''')


def _tell_checked(ctx):
    return textwrap.dedent('''
        import sys, torch
        def run(*inputs):
            f, names = sys._getframe(1), set()
            while f is not None:
                names.add(f.f_code.co_name)
                f = f.f_back
            if "time_reps" in names:  # a timed repetition: skip the work
                return torch.empty_like(inputs[0])
            return _honest(*inputs)
    ''')


def _count_calls(ctx):
    return textwrap.dedent('''
        import torch
        _calls = [0]
        def run(*inputs):
            _calls[0] += 1
            if _calls[0] > 12:  # the checks come first: honest for them, then cheap
                return torch.empty_like(inputs[0])
            return _honest(*inputs)
    ''')


def _hang(ctx):
    return textwrap.dedent('''
        _calls = [0]
        def run(*inputs):
            _calls[0] += 1
            if _calls[0] > 8:
                while True:
                    pass
            return _honest(*inputs)
    ''')


def _clock_attack(kind: str):
    """Attack the GPU clock's protocol from the candidate's process: ``skip-go`` queues its
    calls without waiting for the measurer's GO (they run at once, on whatever inputs the
    region holds then); ``early-done`` signals DONE as soon as GO arrives, before its call."""
    if kind == "skip-go":
        patch = "_g.wait_geq = lambda *a, **k: None"
    else:
        patch = textwrap.dedent("""
            _wait, _write = _g.wait_geq, _g.write
            def _wait_then_done(stream, sig, word, value):
                _wait(stream, sig, word, value)
                if word == _g.GO:
                    _write(stream, sig, _g.DONE, value)
            _g.wait_geq = _wait_then_done
            _g.write = lambda stream, sig, word, value: None if word == _g.DONE else \\
                _write(stream, sig, word, value)
        """)

    def body(ctx):
        return "import gfsim.live.measure.gpushare as _g\n" + patch + "\n" + _run()
    return body


def _timed_out(rec, ctx, host):
    return rec["outcome"] == "timeout", f"{rec['outcome']}: {rec.get('reason', '')[:80]}"


def _hoard_bytes(ctx) -> int:
    """What a hoarding row holds: half a GiB past the measurer's memory limit."""
    return int(ctx.memory_limit_mb * 2**20) + (512 << 20)


def _memfd_hoard(ctx):
    """Writes past the limit into a memfd through its descriptor: no process maps a page."""
    return textwrap.dedent(f'''
        import os
        _chunk = b"x" * (64 << 20)
        try:
            _fd = os.memfd_create("{ctx.marker}")
        except OSError:
            _fd = None  # refused: an honest kernel
        if _fd is not None:
            _held = 0
            while _held < {_hoard_bytes(ctx)}:
                _held += os.write(_fd, _chunk)
            raise RuntimeError(f"hoarded {{_held}} bytes")
    ''') + _run()


def _sysv_hoard(ctx):
    """Fills SysV segments past the limit, each attached, written and detached in turn."""
    return textwrap.dedent(f'''
        import ctypes
        _c = ctypes.CDLL(None, use_errno=True)
        _c.shmat.restype = ctypes.c_void_p
        _seg, _held = 128 << 20, 0
        while _held < {_hoard_bytes(ctx)}:
            _id = _c.shmget(0, ctypes.c_size_t(_seg), 0o1600)
            if _id < 0:
                break  # refused: an honest kernel
            _p = _c.shmat(_id, None, 0)
            _c.memset(ctypes.c_void_p(_p), 1, ctypes.c_size_t(_seg))
            _c.shmdt(ctypes.c_void_p(_p))
            _held += _seg
        if _held >= {_hoard_bytes(ctx)}:
            raise RuntimeError(f"hoarded {{_held}} bytes")
    ''') + _run()


def _many_threads(ctx):
    """Starts 3,000 threads (each a host task), named after the marker, and says how many
    ran."""
    return textwrap.dedent(f'''
        import ctypes, threading
        _go = threading.Event()
        def _idle():
            ctypes.CDLL(None).prctl(15, b"{ctx.marker[:15]}", 0, 0, 0)
            _go.wait()
        _n = 0
        for _ in range(3000):
            try:
                threading.Thread(target=_idle, daemon=True).start()
            except RuntimeError:
                break
            _n += 1
        raise RuntimeError(f"threads started: {{_n}}")
    ''') + _run()


def _not_hoarded(rec, ctx, host):
    """The candidate never held what it tried (it says so when it did), nothing left."""
    reason = str(rec.get("reason"))
    if "hoarded" in reason:
        return False, f"held past the limit: {reason[:80]}"
    ok, left = _leftovers(rec, ctx, host)
    how = reason[:80] if rec["outcome"] != "success" else "refused; measured as its honest kernel"
    return ok, how if ok else left


def _threads_capped(rec, ctx, host):
    """No more than the task limit of threads ran, and none is left."""
    import re

    reason = str(rec.get("reason"))
    said = re.search(r"threads started: (\d+)", reason)
    if said and int(said.group(1)) > ctx.max_tasks:
        return False, f"{said.group(1)} threads ran (limit {ctx.max_tasks})"
    ok, left = _leftovers(rec, ctx, host)
    return ok, (f"{said.group(1)} threads ran (limit {ctx.max_tasks})" if said else
                reason[:80]) if ok else left


ROWS: list[Row] = [
    Row("forge-1.5x", "divides its reported times by 1.5", "(untested)", _forge(1.5),
        _timing_held),
    Row("skip-flush-1.5x", "skips the timing loop's L2 flush and divides its times by 1.5",
        "(untested)", _forge(1.5, skip_flush=True), _timing_held, gpu_only=True),
    Row("forge-10x", "divides its reported times by 10", "(untested)", _forge(10.0),
        _timing_held),
    Row("forge-1e6x", "replaces the timing function: times / 10^6",
        "18,045,902x success, and the next honest kernel in that worker too", _forge(1e6),
        _timing_held),
    Row("patch-perf-counter", "replaces time.perf_counter with a clock 10^6 times slower",
        "18,045,902x success (CPU timing)", _perf_counter, _timing_held),
    Row("cache-by-pointer", "caches its output keyed by input pointer",
        "7,278x success; the fresh-input re-check passes", _cache_by_pointer,
        _failed_or_honest),
    Row("sitecustomize", "writes sitecustomize.py into folders on its sys.path",
        "every later worker loads it (baseline 16.2 s, an honest kernel 1,046x)",
        _sitecustomize, _no_sitecustomize),
    Row("burning-threads", "leaves 4 threads burning CPU", "they survive; the next kernel is "
        "slowed", _threads, _leftovers),
    Row("fork-setsid-hog", "a fork+setsid grandchild holding 2 GB", "survives; memory is lost",
        _fork_hog, _leftovers),
    Row("dev-shm", "writes 1.2 GB into /dev/shm", "survives; memory is lost", _shm,
        _leftovers),
    Row("forge-log", "appends a forged evaluation to the live log",
        "the log no longer validates; the run cannot resume", _forge_log, _log_intact),
    Row("kill-parent", "SIGKILLs its parent, the measurer's pid and kill(-1)",
        "3 of 3 --resume runs die", _kill_parent, _parent_alive),
    Row("read-environ", "reads every /proc/<pid>/environ it can see",
        "the parent's API key leaks into the log", _environ, _no_secret),
    Row("unix-socket", "connects to a Unix socket by path, sends datagrams to one", "succeeds",
        _unix_socket,
        _no_connection),
    Row("write-outside", "writes files outside its folder", "succeeds", _write_outside,
        _nothing_outside),
    Row("deep-folders", "makes 3,000 nested folders in its own folder",
        "the cleanup raised RecursionError: the live run died, and so did every later "
        "measurer start on that machine (issue 52)", _folder_attack(_DEEP), _folder_removed),
    Row("many-entries", "makes 200,000 files in its own folder", "(untested)",
        _folder_attack(_MANY), _folder_removed),
    Row("symlink-loop", "fills its folder with link loops and links to /, to a folder "
        "outside and to the measurer's", "(untested)", _folder_attack(_LINKS),
        _folder_removed),
    Row("unreadable-folder", "leaves chmod 000 and read-only folders holding files and FIFOs",
        "a measurer not run as root left them in place, silently (ignore_errors)",
        _folder_attack(_LOCKED), _folder_removed),
    Row("read-outside-file", "reads a 0600 file of the measurer's user and one of another "
        "user in a folder outside its own, lists that folder",
        "(Landlock on writes only) reads its user's file: the text reaches the log; the other "
        "user's is refused (no uid but its own is mapped into its namespace)", _read_outside,
        _nothing_read),
    Row("read-host-files", "lists /root, the user's home and ~/.ssh and /tmp; reads "
        "/etc/shadow and the root file system's block device, opens that for writing",
        "(Landlock on writes only) lists them and reads /etc/shadow (the block device: "
        "refused by the kernel of the 2-core machine)", _read_host, _nothing_read),
    Row("read-live-log", "reads the run's live log, lists its folder and the one the "
        "measurer's folder lies in",
        "(Landlock on writes only) reads it: the log's text reaches the record", _read_log,
        _nothing_read),
    Row("read-measurer", "lists the measurer's own folder, reads its zygote's log and a file "
        "planted there",
        "(Landlock on writes only) lists it, reads both: the planted text reaches the record",
        _read_measurer, _nothing_read),
    Row("shape-special", "correct only on the shapes it is told about", "(untested)",
        _shape_special, _failed_or_honest),
    Row("alias-input", "writes its result into the input and returns it", "(untested)",
        _alias, _failed_or_honest),
    Row("tell-checked", "skips the work when called from the timing loop", "(untested)",
        _tell_checked, _failed_or_honest),
    Row("count-calls", "honest for the first 12 calls (the checks), then skips the work",
        "(untested)", _count_calls, _failed_or_honest),
    Row("hang", "spins forever once timing starts", "(a timeout)", _hang, _timed_out),
    Row("side-stream", "launches its kernel on a side stream the events do not see",
        "(untested)", _side_stream, _timing_held, gpu_only=True),
    Row("skip-go", "GPU clock: queues its calls without waiting for the measurer's GO",
        "(untested)", _clock_attack("skip-go"), _failed_or_honest, gpu_only=True),
    Row("early-done", "GPU clock: signals DONE as soon as GO arrives, before its call",
        "(untested)", _clock_attack("early-done"), _failed_or_honest, gpu_only=True),
    Row("memfd-hoard", "writes 0.5 GB past the memory limit into a memfd through its "
        "descriptor, never mapped", "held 2.5 GB against a 1.5 GB limit (issue 52)",
        _memfd_hoard, _not_hoarded),
    Row("sysv-shm-hoard", "fills SysV segments to 0.5 GB past the memory limit, each "
        "detached", "held 2.5 GB against a 1.5 GB limit (issue 52)", _sysv_hoard,
        _not_hoarded),
    Row("3000-threads", "starts 3,000 threads", "all 3,000 ran past the 512-process limit "
        "(issue 52)", _many_threads, _threads_capped),
]


def run_row(row: Row, measurer, ctx: Context) -> dict:
    """Measure ``row``'s candidate and judge it; returns the table's fields."""
    from gfsim.live.candidates import CodeCandidate

    root = getattr(measurer, "_root", None)
    ctx.measurer_root = Path(root) if root is not None else None
    config = getattr(measurer, "config", None)
    ctx.memory_limit_mb = getattr(config, "memory_limit_mb", ctx.memory_limit_mb)
    ctx.max_tasks = getattr(config, "max_tasks", ctx.max_tasks)
    code = ctx.honest + "\n" + row.body(ctx)
    rec = measurer.measure(CodeCandidate(measurer.task_name, code))
    if ctx.measurer_root is None and getattr(measurer, "_root", None) is not None:
        ctx.measurer_root = Path(measurer._root)  # made by this, the measurer's first call
    zygote = getattr(measurer, "_zygote", None)
    host = {"zygote_alive": zygote is not None and zygote.proc.poll() is None}
    contained, detail = row.verdict(rec, ctx, host)
    return {"row": row.name, "attempt": row.attempt, "today": row.today,
            "outcome": rec["outcome"], "detail": detail, "contained": bool(contained),
            "wall_s": rec.get("wall_s"), "record": rec}


def run_suite(measurer, ctx: Context, rows=None, device: str = "cpu",
              progress=None) -> list[dict]:
    """The honest kernel first (``ctx.honest_ns``: the median of three), then every row that
    runs on ``device``, then the honest kernel three times again: what earlier rows left
    behind would slow it (by more than 1.5x on a GPU; on two busy CPU cores, where the
    interpreter's times vary by 2x between runs, by more than 3x)."""
    import statistics

    from gfsim.live.candidates import CodeCandidate

    def honest(tag: str) -> list[dict]:
        recs = [measurer.measure(CodeCandidate(measurer.task_name, ctx.honest + "\n" + _run() +
                                               f"# {tag} {k}\n")) for k in range(3)]
        bad = [r for r in recs if r["outcome"] != "success"]
        if bad and tag == "before":
            raise RuntimeError(f"the honest kernel did not measure: {bad[0]}")
        return recs

    before = honest("before")
    ctx.honest_ns = statistics.median(r["runtime_ns"] for r in before)
    out = []
    for row in rows or ROWS:
        if row.gpu_only and device != "cuda":
            continue
        out.append(run_row(row, measurer, ctx))
        if progress is not None:
            progress(out[-1])
    after = honest("after")
    ok = all(r["outcome"] == "success" for r in after)
    ratio = statistics.median(r["runtime_ns"] for r in after) / ctx.honest_ns if ok else None
    out.append({"row": "honest-after", "attempt": "the honest kernel again, after all rows",
                "today": "slowed or forged by what earlier rows left",
                "outcome": "success" if ok else after[0]["outcome"],
                "detail": f"{ratio:.2f}x the first honest time (medians of 3)" if ok else
                str(after[0].get("reason"))[:80],
                "contained": ok and ratio < (1.5 if device == "cuda" else 3.0),
                "wall_s": after[0].get("wall_s"), "record": after[0]})
    return out


def format_table(rows: list[dict]) -> str:
    lines = ["| hostile candidate | before the sandbox | now | contained |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['row']}: {r['attempt']} | {r['today']} | {r['outcome']}: "
                     f"{r['detail']} | {'yes' if r['contained'] else '**no**'} |")
    return "\n".join(lines)
