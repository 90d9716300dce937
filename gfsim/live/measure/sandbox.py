"""The sandbox candidate code runs in: one fresh, confined process per candidate.

A *zygote* (``python -m gfsim.live.measure.sandbox TASK FD``) imports torch, Triton and the
task once, never initialises CUDA and never runs candidate code. For every candidate it forks twice:

- the first child (outer) calls ``unshare`` for new user, PID, network, mount, IPC and UTS
  namespaces, maps its uid to root *inside* the user namespace, forks the inner process,
  reports the inner process's pid, waits for it and reports its exit status;
- the inner process is PID 1 of its own PID namespace. It mounts a private ``/proc`` (so no
  process outside is visible, the measurer and zygote included) and a private, size-limited
  tmpfs on ``/dev/shm``, restricts itself with Landlock (reads only of the software it runs
  and what the loader, Python and the GPU driver need: ``read_allowlist``; writes only beneath
  its own folder; the GPU's and a few other device nodes readable and writable but not
  creatable; no TCP, no signals or abstract Unix sockets beyond its own domain) and with a
  seccomp filter (no ``socket()`` at all, so no Unix socket by path
  either; no ``ptrace``, ``mount``, ``unshare``, ``setns``, ``bpf``, ``io_uring``...), and only
  then loads the candidate (``gfsim.live.measure.worker``). Its outer process joined the candidate's
  cgroup first (``gfsim.live.measure.cgroup``: the kernel caps its memory and tasks) where the
  measurer made one; where none, the inner applies the fallback's rlimits, and its seccomp
  filter refuses ``memfd_create`` and SysV shm too. When it exits or is killed the kernel kills
  every process left in its namespace, and the mount namespace (its ``/dev/shm`` with it) goes.

The environment is allow-listed (no secrets), and the zygote is non-dumpable, so where
namespaces are missing its ``/proc/<pid>/environ`` and memory cannot be read by a candidate.
``probe()`` runs the same confinement in a throw-away child and says what this kernel allows;
the measurer refuses untrusted code when something is missing unless the user passes
``--trust-candidates``. Linux's Landlock and seccomp have no wrapper in the standard library:
the few system calls are made through ctypes here (the PyPI ``landlock`` package covers only
the filesystem part of the ABI, not network rules or scoping).
"""

from __future__ import annotations

import ctypes
import errno as _errno
import json
import os
import platform
import signal
import socket
import stat
import sys
from dataclasses import asdict, dataclass, field

__all__ = ["Facilities", "probe", "probe_subprocess", "MISSING_HELP", "ENV_ALLOWLIST",
           "python_path", "plain_env", "read_allowlist", "device_nodes"]

# What a sandboxed process (and the zygote) inherits of the environment: nothing secret.
ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES",
                 "CUDA_HOME", "TRITON_INTERPRET", "NCCL_NVLS_ENABLE",
                 "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")

# -- Linux constants ---------------------------------------------------------------------------
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
CLONE_NEWCGROUP = 0x02000000
_NS_FLAGS = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | \
    CLONE_NEWNET | CLONE_NEWCGROUP
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 4, 22, 38
SECCOMP_MODE_FILTER = 2

MISSING_HELP = ("gfsim runs LLM-written kernels only inside a sandbox (see docs: threat model); "
                "pass `trust_candidates` to run them with what this machine allows")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> int:
    if ret == -1:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return ret


def prctl(option: int, arg: int = 0) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None):
    _check(_libc.mount(source.encode() if source else None, target.encode(),
                       fstype.encode() if fstype else None, ctypes.c_ulong(flags),
                       data.encode() if data else None), f"mount {target}")


# -- Landlock (Linux 5.13+; network rules ABI 4, scoping ABI 6) --------------------------------
_SYS = {"x86_64": {"socket": 41, "ptrace": 101, "mount": 165, "umount2": 166,
                   "pivot_root": 155, "unshare": 272, "setns": 308, "process_vm_readv": 310,
                   "process_vm_writev": 311, "kexec_load": 246, "bpf": 321,
                   "perf_event_open": 298, "open_by_handle_at": 304, "keyctl": 250,
                   "add_key": 248, "request_key": 249, "userfaultfd": 323, "clone": 56,
                   "chroot": 161, "connect": 42, "sendto": 44, "sendmsg": 46,
                   "sendmmsg": 307, "memfd_create": 319, "shmget": 29},
        "aarch64": {"socket": 198, "ptrace": 117, "mount": 40, "umount2": 39,
                    "pivot_root": 41, "unshare": 97, "setns": 268, "process_vm_readv": 270,
                    "process_vm_writev": 271, "kexec_load": 104, "bpf": 280,
                    "perf_event_open": 241, "open_by_handle_at": 265, "keyctl": 219,
                    "add_key": 217, "request_key": 218, "userfaultfd": 282, "clone": 220,
                    "chroot": 51, "connect": 203, "sendto": 206, "sendmsg": 211,
                    "sendmmsg": 269, "memfd_create": 279, "shmget": 194}}
# The same numbers on every architecture (the unified table of Linux 5.1+).
_COMMON = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
           "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
           "fsmount": 432, "fspick": 433, "clone3": 435, "mount_setattr": 442,
           "landlock_create_ruleset": 444, "landlock_add_rule": 445,
           "landlock_restrict_self": 446, "memfd_secret": 447}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 14, 1 << 15
# Every right that changes the filesystem, by the ABI that introduced it.
_FS_WRITES = {1: (1 << 1) | (1 << 4) | (1 << 5) | sum(1 << b for b in range(6, 13)),
              2: 1 << 13, 3: 1 << 14}
_FS_READS = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR  # all three in ABI 1
# The rights a rule on a file (not a folder) may carry; Landlock refuses any other there.
_FS_FILE_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
_NET_TCP = (1 << 0) | (1 << 1)  # bind, connect
_SCOPE_ALL = (1 << 0) | (1 << 1)  # abstract Unix sockets, signals


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _sys(name: str) -> int:
    return _COMMON.get(name) or _SYS[platform.machine()][name]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where Landlock is missing or disabled."""
    try:
        v = _libc.syscall(_sys("landlock_create_ruleset"), None, ctypes.c_size_t(0),
                          ctypes.c_uint32(1))
    except KeyError:
        return 0
    return max(int(v), 0)


def landlock_restrict(writable: list[str], existing: list[str], abi: int,
                      readable: dict | None = None) -> dict:
    """Allow writes only beneath ``writable`` (everything) and to existing files beneath
    ``existing`` (opened for writing: /dev/null, the GPU's nodes); deny TCP; scope signals and
    abstract Unix sockets to this domain.

    With ``readable`` (``{"execute": [...], "read": [...]}``: ``read_allowlist`` and
    ``proc_readable``), reading is confined too: a file or folder may be read only beneath
    ``writable``, ``existing`` and those paths, and a program run only beneath ``writable`` and
    ``readable["execute"]``. Without it, reading and executing stay allowed. Paths of
    ``existing`` and ``readable`` that no longer exist are left out."""
    writes = 0
    for level, bits in _FS_WRITES.items():
        if abi >= level:
            writes |= bits
    reads = _FS_READS if readable is not None else 0
    fs = writes | reads
    attr = _RulesetAttr(fs, _NET_TCP if abi >= 4 else 0, _SCOPE_ALL if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    rules = [(p, fs, True) for p in writable] + \
        [(p, (_FS_WRITE_FILE | _FS_TRUNCATE | _FS_READ_FILE | _FS_READ_DIR) & fs, False)
         for p in existing]
    if readable is not None:
        rules += [(p, _FS_READS, False) for p in readable.get("execute", ())]
        rules += [(p, _FS_READ_FILE | _FS_READ_DIR, False) for p in readable.get("read", ())]
    fd = _check(_libc.syscall(_sys("landlock_create_ruleset"), ctypes.byref(attr),
                              ctypes.c_size_t(size), ctypes.c_uint32(0)), "landlock ruleset")
    added = 0
    try:
        for path, rights, required in rules:
            added += _add_rule(fd, path, rights, required)
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        _check(_libc.syscall(_sys("landlock_restrict_self"), fd, ctypes.c_uint32(0)),
               "landlock restrict")
    finally:
        os.close(fd)
    out = {"landlock_abi": abi, "tcp": abi < 4, "scoped": abi >= 6,
           "reads_confined": readable is not None, "landlock_rules": added}
    if readable is not None:
        out["readable"] = readable
    return out


def _add_rule(ruleset: int, path: str, rights: int, required: bool) -> int:
    """Add one path-beneath rule (1), or leave out a path that is gone (0, unless
    ``required``). A rule on a file keeps only the rights a file can have."""
    try:
        pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        if required:
            raise
        return 0
    try:
        if not stat.S_ISDIR(os.fstat(pfd).st_mode):
            rights &= _FS_FILE_RIGHTS
        rule = _PathBeneath(rights, pfd)
        _check(_libc.syscall(_sys("landlock_add_rule"), ruleset, 1, ctypes.byref(rule),
                             ctypes.c_uint32(0)), f"landlock rule {path}")
    finally:
        os.close(pfd)
    return 1


# -- seccomp: a small BPF filter ----------------------------------------------------------------
_DENIED = ("ptrace", "mount", "umount2", "pivot_root", "chroot", "unshare", "setns",
           "process_vm_readv", "process_vm_writev", "kexec_load", "bpf", "perf_event_open",
           "open_by_handle_at", "keyctl", "add_key", "request_key", "userfaultfd",
           "io_uring_setup", "io_uring_enter", "io_uring_register", "open_tree", "move_mount",
           "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "sendmsg", "sendmmsg")
_AF_UNIX = 1
# Memory no process maps, which a watchdog summing resident memory cannot see: refused where no
# cgroup charges it (``seccomp_filter(unmapped_memory=False)``).
_UNMAPPED_MEMORY = ("memfd_create", "memfd_secret", "shmget")


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _arg(i: int, high: bool = False) -> int:
    """Offset of a system call argument's low (or high) 32 bits in ``seccomp_data``."""
    return 16 + 8 * i + (4 if high else 0)


def seccomp_filter(unmapped_memory: bool = True) -> dict:
    """Install the filter. The ``_DENIED`` calls fail with EPERM, and so do
    ``_UNMAPPED_MEMORY``'s unless ``unmapped_memory`` (a cgroup counts that memory).
    ``socket`` is allowed for AF_UNIX only (the CUDA driver opens one at initialisation), but
    ``connect`` always fails
    (ECONNREFUSED: CUDA then takes it that no MPS daemon runs), ``sendto`` with an address
    fails and ``sendmsg`` is refused, so no Unix socket outside can be reached by path.
    ``clone`` with a namespace flag fails; ``clone3`` (whose flags a filter cannot read) fails
    with ENOSYS, so the C library falls back to ``clone``; another architecture's calls kill
    the process."""
    arch = platform.machine()
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    allow, kill = 0x7FFF0000, 0x80000000

    def err(code: int) -> int:
        return 0x00050000 | code

    prog = [(ld, 0, 0, 4), (jeq, 1, 0, _AUDIT_ARCH[arch]), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if arch == "x86_64":  # the x32 ABI shares the architecture number: refuse it
        prog += [(0x35, 0, 1, 0x40000000), (ret, 0, 0, err(_errno.EPERM))]
    denied = _DENIED if unmapped_memory else _DENIED + _UNMAPPED_MEMORY
    for name in denied:
        prog += [(jeq, 0, 1, _sys(name)), (ret, 0, 0, err(_errno.EPERM))]
    prog += [(jeq, 0, 1, _sys("clone3")), (ret, 0, 0, err(_errno.ENOSYS)),
             (jeq, 0, 1, _sys("connect")), (ret, 0, 0, err(_errno.ECONNREFUSED)),
             # socket(domain, ...): AF_UNIX only
             (jeq, 0, 4, _sys("socket")), (ld, 0, 0, _arg(0)), (jeq, 0, 1, _AF_UNIX),
             (ret, 0, 0, allow), (ret, 0, 0, err(_errno.EAFNOSUPPORT)),
             # sendto(..., dest_addr, addrlen): only without an address
             (jeq, 0, 6, _sys("sendto")), (ld, 0, 0, _arg(4)), (jeq, 0, 3, 0),
             (ld, 0, 0, _arg(4, high=True)), (jeq, 0, 1, 0), (ret, 0, 0, allow),
             (ret, 0, 0, err(_errno.EPERM)),
             # clone(flags, ...): no namespace flags (last: the argument replaces the number)
             (jeq, 0, 3, _sys("clone")), (ld, 0, 0, _arg(0)),
             (jset, 0, 1, _NS_FLAGS), (ret, 0, 0, err(_errno.EPERM)), (ret, 0, 0, allow)]
    arr = (_SockFilter * len(prog))(*[_SockFilter(*p) for p in prog])
    fprog = _SockFprog(len(prog), arr)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0),
           "seccomp")
    return {"seccomp": len(denied) + 4}


# -- what a sandbox may read ---------------------------------------------------------------------
# System software, read and run: the loader and its libraries, the C compiler and headers
# Triton builds its launchers with (cc, as, ld, cc1 under /usr/libexec or /usr/lib/gcc),
# ldconfig (Triton asks it where libcuda is), zoneinfo and locales (/usr/share). Not /usr or
# /usr/local as a whole: their etc, src and the like are left out.
_SYSTEM_SOFTWARE = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr/bin",
                    "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32",
                    "/usr/libexec", "/usr/include", "/usr/share", "/usr/local/bin",
                    "/usr/local/lib", "/usr/local/lib64", "/usr/local/include",
                    "/usr/local/cuda*", "/usr/local/nvidia")
# Files of /etc the loader and the C library read (not /etc as a whole: /etc/shadow, keys and
# credentials live there). The user database answers getpass.getuser(), and holds no secret.
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.preload", "/etc/ld.so.conf",
                 "/etc/ld.so.conf.d", "/etc/localtime", "/etc/timezone", "/etc/nsswitch.conf",
                 "/etc/passwd", "/etc/group", "/etc/host.conf")
# The kernel's description of the machine (the CUDA driver and NVML read the GPU's PCI device,
# NUMA node and CPU lists; PyTorch the cgroup's CPU limit). Not /sys/kernel's debug, security
# and tracing file systems, nor /sys/firmware (EFI variables, ACPI tables).
_SYSTEM_DATA = ("/sys/devices", "/sys/bus", "/sys/class", "/sys/dev", "/sys/module",
                "/sys/kernel/mm", "/sys/fs/cgroup")
# Global files of /proc, where a sandbox has no private /proc (with one, all of /proc is
# readable: it shows only the sandbox's own processes).
_PROC_GLOBAL = ("/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/loadavg",
                "/proc/uptime", "/proc/version", "/proc/filesystems", "/proc/devices",
                "/proc/modules", "/proc/sys", "/proc/driver")
# Device nodes a sandbox may open (read and write; never create): the null, zero and random
# devices, and the GPU's (NVIDIA's, AMD's, WSL's). Not /dev as a whole: the block device of
# the root file system lies there, readable and writable by its owner, root, which a
# candidate mapped to root is.
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
            "/dev/nvidia*", "/dev/kfd", "/dev/dri", "/dev/dxg")
# Never allowed as a whole, whatever the interpreter's paths say: where users', the system's
# and the run's files live.
_NEVER_WHOLE = ("/", "/etc", "/home", "/root", "/tmp", "/var", "/var/tmp", "/run", "/mnt",
                "/media", "/srv", "/opt", "/boot", "/dev", "/dev/shm", "/proc", "/sys", "/usr",
                "/usr/local")
# The folder of the measurer's own folder (the zygote's working directory) that every sandbox
# may read: the GPU clock's allocator library (``gpushare.build_allocator``), which the
# candidate's process loads. Nothing else of the measurer's folder is readable.
SHARED_FOLDER = "gpushare"


def device_nodes() -> list[str]:
    """The device nodes of ``_DEVICES`` that exist here."""
    import glob

    return sorted({p for pattern in _DEVICES for p in glob.glob(pattern)})


def read_allowlist(measurer_root: str | None = None) -> dict:
    """What a sandbox may read, from the live interpreter: ``{"execute": [...], "read":
    [...]}``, real paths, none beneath another of its kind.

    ``execute`` (read and run): the system software (``_SYSTEM_SOFTWARE``); the interpreter's
    prefixes (``sys.prefix``, ``sys.base_prefix``, the exec prefixes), its folder and every
    ``sysconfig`` path; the site-packages and dist-packages on ``sys.path``; the folder of
    every package this process has imported from elsewhere (a source checkout on
    ``PYTHONPATH``, an editable install: the package's own folder, never the checkout's
    root); the folder of every file mapped into this process (its shared libraries); the
    NVIDIA driver's libraries where ``ldconfig -p`` finds them, ``LD_LIBRARY_PATH`` and
    ``CUDA_HOME``; the C compiler Triton builds each kernel's launcher with, and its prefix
    (``_compiler_folders``). ``read``: a few files of /etc (``_SYSTEM_FILES``), parts of /sys
    (``_SYSTEM_DATA``) and ``measurer_root``'s ``SHARED_FOLDER`` (made here if missing).

    Never allowed: a folder of ``_NEVER_WHOLE``, one that holds ``measurer_root`` (its working
    directory when not given) or the user's home, or one inside ``measurer_root``. Call it
    before any candidate runs: what it reads is then still the measurer's own."""
    import glob

    root = os.path.realpath(measurer_root or os.getcwd())
    keep_out = [root, _home()]
    allowed = _Allowed(root, keep_out)
    for pattern in _SYSTEM_SOFTWARE:
        for path in glob.glob(pattern):
            allowed.add(path, "execute")
    for path in _python_paths():
        allowed.add(path, "execute")
    for path in _imported_from(allowed):
        allowed.add(path, "execute")
    for path in _mapped_folders():
        allowed.add(path, "execute")
    for path in _driver_folders():
        allowed.add(path, "execute")
    for path in _compiler_folders():
        allowed.add(path, "execute")
    for path in (*_SYSTEM_FILES, *_SYSTEM_DATA):
        allowed.add(path, "read")
    if measurer_root is not None:
        shared = os.path.join(root, SHARED_FOLDER)
        os.makedirs(shared, exist_ok=True)
        allowed.add(shared, "read", inside_root=True)
    return allowed.lists()


def proc_readable(private_proc: bool) -> list[str]:
    """What a sandbox may read of /proc beyond its own ``/proc/self``: all of it where it has
    a private /proc (its own processes alone, its children's ``/proc/self`` included),
    ``_PROC_GLOBAL`` where not."""
    return ["/proc"] if private_proc else list(_PROC_GLOBAL)


class _Allowed:
    """The allow-list being built: real paths by kind, with ``read_allowlist``'s guards."""

    def __init__(self, root: str, keep_out: list[str]):
        self.root, self.keep_out = root, keep_out
        self.paths: dict[str, str] = {}

    def add(self, path: str, kind: str, inside_root: bool = False) -> None:
        if not path or not os.path.isabs(path):
            return
        real = os.path.realpath(path)
        if not os.path.exists(real) or real in _NEVER_WHOLE:
            return
        if any(k == real or k.startswith(real.rstrip("/") + "/") for k in self.keep_out):
            return  # it holds the measurer's folder or the user's home
        if not inside_root and (real == self.root or real.startswith(self.root + "/")):
            return
        if self.paths.get(real) != "execute":
            self.paths[real] = kind

    def covers(self, path: str) -> bool:
        real = os.path.realpath(path)
        return any(real == p or real.startswith(p.rstrip("/") + "/") for p in self.paths)

    def lists(self) -> dict:
        out: dict = {"execute": [], "read": []}
        for path in sorted(self.paths):
            kind = self.paths[path]
            wider = [p for p, k in self.paths.items() if p != path and
                     path.startswith(p.rstrip("/") + "/") and (k == "execute" or k == kind)]
            if not wider:
                out[kind].append(path)
        return out


def _home() -> str:
    try:
        import pwd

        return os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir)
    except (ImportError, KeyError):
        return os.path.realpath(os.path.expanduser("~"))


def _python_paths() -> list[str]:
    """The interpreter's prefixes, its folder, its ``sysconfig`` paths, and the site-packages
    and dist-packages on ``sys.path`` (other entries of ``sys.path``, the working directory
    and source checkouts, are left to ``_imported_from``)."""
    import site
    import sysconfig

    prefixes = [os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix,
                                              sys.base_exec_prefix}]
    out = [*prefixes, os.path.dirname(os.path.realpath(sys.executable)),
           *sysconfig.get_paths().values()]
    try:
        out += site.getsitepackages()
    except AttributeError:
        pass
    for entry in sys.path:
        real = os.path.realpath(entry) if entry else ""
        if os.path.basename(real) in ("site-packages", "dist-packages") or \
                any(real.startswith(p.rstrip("/") + "/") for p in prefixes):
            out.append(real)
    return out


def _imported_from(allowed: _Allowed) -> list[str]:
    """The folder of every top-level package imported here that ``allowed`` does not cover
    yet (the file, for a plain module): gfsim's own from a source checkout or an editable
    install, say, without the rest of the checkout (where a run's log may lie)."""
    out = []
    for name, module in list(sys.modules.items()):
        if "." in name or name.startswith("__"):  # __main__, __mp_main__: the script
            continue
        try:
            attrs = vars(module)
            paths = list(attrs.get("__path__") or []) or [attrs.get("__file__")]
        except Exception:  # noqa: BLE001 - an odd object in sys.modules
            continue
        for path in paths:
            if isinstance(path, str) and os.path.isabs(path) and not allowed.covers(path):
                out.append(path)
    return out


def _mapped_folders() -> list[str]:
    """The folders of the files mapped into this process (its shared libraries)."""
    out = set()
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/") and \
                        not parts[5].rstrip().endswith("(deleted)"):
                    path = parts[5].rstrip("\n")
                    if not path.startswith(("/dev/", "/proc/", "/sys/", "/memfd:")):
                        out.add(os.path.dirname(path))
    except OSError:
        pass
    return sorted(out)


def _driver_folders() -> list[str]:
    """Where the NVIDIA driver's libraries lie (the CUDA driver is loaded only in a sandbox,
    so they are not mapped here yet): ``ldconfig -p``'s libcuda and libnvidia-*, then
    ``LD_LIBRARY_PATH`` and ``CUDA_HOME``."""
    import shutil
    import subprocess

    out = []
    ldconfig = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists(
        "/sbin/ldconfig") else None)
    if ldconfig:
        try:
            text = subprocess.run([ldconfig, "-p"], capture_output=True, timeout=30,
                                  check=False).stdout.decode(errors="replace")
        except (OSError, subprocess.SubprocessError):
            text = ""
        for line in text.splitlines():
            name, _, path = line.strip().partition(" => ")
            if name.startswith(("libcuda.", "libcudadebugger.", "libnvidia-", "libnvcuvid.")):
                out += [os.path.dirname(path), os.path.dirname(os.path.realpath(path))]
    out += [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    if os.environ.get("CUDA_HOME"):
        out.append(os.environ["CUDA_HOME"])
    return out


def _compiler_folders() -> list[str]:
    """Where the C compiler that Triton builds each kernel's launcher with lies: ``CC``, else
    ``gcc``, ``clang`` and ``cc`` on ``PATH`` (Triton's own order is ``CC``, gcc, clang). A
    compiler installed in a prefix of its own (``/opt/gcc/bin/gcc``) needs that prefix (its
    ``libexec``, ``lib`` and ``include``): the prefix is given, or only the binary's folder
    where the prefix is a system folder read-listed as a whole never is (``/usr``, ``/opt``)."""
    import shutil

    out = []
    names = [os.environ["CC"]] if os.environ.get("CC") else []
    for name in (*names, "gcc", "clang", "cc"):
        found = shutil.which(name)
        if not found:
            continue
        for binary in {found, os.path.realpath(found)}:
            folder = os.path.dirname(binary)
            prefix = os.path.dirname(folder)
            out.append(folder)
            if os.path.basename(folder) == "bin" and prefix not in _NEVER_WHOLE:
                out.append(prefix)
    return out


# -- what this machine allows --------------------------------------------------------------------
@dataclass(frozen=True)
class Facilities:
    """What the kernel lets the sandbox do, as ``probe`` found it."""

    user_ns: bool = False
    pid_ns: bool = False
    net_ns: bool = False
    mount_ns: bool = False  # a private /proc and /dev/shm inside the PID namespace
    landlock_abi: int = 0
    seccomp: bool = False
    errors: tuple = ()
    # Landlock confines reading to ``readable`` (``read_allowlist``: the probe read a file
    # outside it and was refused, and read one inside it).
    reads_confined: bool = False
    readable: dict = field(default_factory=dict)
    # The cgroup version whose groups limit each sandbox's memory and tasks (0: none may be
    # made here, and ``limits_fallback`` holds instead), and what holds, in words.
    cgroup: int = 0
    memory_limit: str = ""
    task_limit: str = ""
    # The controllers a sandbox's group holds ("memory", "pids"; either may be missing where
    # the machine delegates only the other), and what holds the candidate's folder quota.
    cgroup_controllers: tuple = ()
    folder_quota: str = ""

    def missing(self) -> list[str]:
        """What full isolation needs and this machine lacks (empty: all of it is there)."""
        out = [name for name, ok in (
            ("user namespace", self.user_ns), ("PID namespace", self.pid_ns),
            ("network namespace", self.net_ns), ("private /proc and /dev/shm", self.mount_ns),
            ("seccomp", self.seccomp)) if not ok]
        if self.landlock_abi < 6:
            out.append(f"Landlock ABI >= 6 (have {self.landlock_abi or 'none'})")
        if not self.reads_confined:
            out.append("read confinement (a candidate could read any file its user can)")
        return out

    def as_dict(self) -> dict:
        d = asdict(self)
        d["errors"] = list(self.errors)
        d["cgroup_controllers"] = list(self.cgroup_controllers)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Facilities:
        return cls(**{**d, "errors": tuple(d.get("errors", ())),
                      "cgroup_controllers": tuple(d.get("cgroup_controllers", ()))})


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def unshare_mapped(flags: int) -> None:
    """``unshare(CLONE_NEWUSER | flags)`` and map this process's uid and gid to root inside.
    The maps are written by a helper forked beforehand, which stays in the parent namespace:
    since Linux 5.12 mapping an outer root needs CAP_SETFCAP there, which the process that
    entered the new namespace no longer has."""
    uid, gid = os.geteuid(), os.getegid()
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    helper = os.fork()
    if helper == 0:  # pragma: no cover - the helper
        code = 1
        try:
            os.close(go_w)
            os.close(done_r)
            if os.read(go_r, 1) == b"1":
                target = os.getppid()
                _write(f"/proc/{target}/setgroups", "deny")
                _write(f"/proc/{target}/uid_map", f"0 {uid} 1")
                _write(f"/proc/{target}/gid_map", f"0 {gid} 1")
                os.write(done_w, b"1")
                code = 0
        finally:
            os._exit(code)
    os.close(go_r)
    os.close(done_w)
    try:
        unshare(CLONE_NEWUSER | flags)
        os.write(go_w, b"1")
        ok = os.read(done_r, 1) == b"1"
    finally:
        os.close(go_w)
        os.close(done_r)
        os.waitpid(helper, 0)
    if not ok:
        raise OSError(_errno.EPERM, "could not map the uid into the user namespace")


def enter_outer(fac: Facilities) -> int:
    """In the outer child: new namespaces (what ``fac`` allows), uid mapped to root inside."""
    flags = 0
    if fac.user_ns:
        flags = CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWCGROUP | \
            (CLONE_NEWPID if fac.pid_ns else 0) | (CLONE_NEWNET if fac.net_ns else 0) | \
            (CLONE_NEWNS if fac.mount_ns else 0)
        unshare_mapped(flags)
    return flags


def existing_writable() -> list[str]:
    """Existing files a sandbox may open for writing (not create): the device nodes it needs
    (``device_nodes``), and its own /proc entries (the CUDA driver names its threads through
    /proc/self/task/*/comm)."""
    return [*device_nodes(), "/proc/self"]


def folder_tmpfs(folder: str, max_bytes: int, max_entries: int) -> None:
    """In a new mount namespace: a tmpfs of at most ``max_bytes`` and ``max_entries`` entries
    (files, folders, links; its root is one inode more) over ``folder``, so that the kernel
    refuses (ENOSPC) what passes the candidate's folder quota, and the folder goes with the
    namespace. What the measurer put in the folder before (the Triton cache's trusted modules;
    not ``stderr.log``, which the outer process holds open beneath) is copied in; the working
    directory moves onto the tmpfs. Its pages are charged to the memory cgroup of the process
    that writes them: the sandbox's."""
    import shutil

    below = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV,
              f"size={max(4096, int(max_bytes))},nr_inodes={max(1, int(max_entries)) + 1},"
              "mode=0700")
        for name in os.listdir(below):
            src = f"/proc/self/fd/{below}/{name}"
            if name == "stderr.log" or os.path.islink(src):
                continue
            if os.path.isdir(src):
                shutil.copytree(src, os.path.join(folder, name), symlinks=True)
            else:
                shutil.copy2(src, os.path.join(folder, name))
    finally:
        os.close(below)
    os.chdir(folder)


def private_proc_shm(shm_mb: int) -> None:
    """In a new mount and PID namespace: a private /proc and a size-capped /dev/shm."""
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={max(1, int(shm_mb))}m,mode=1777")


def _limits(spec: dict) -> dict:
    return {k: spec[k] for k in ("cgroup", "cgroup_controllers", "max_tasks",
                                 "rlimit_data_bytes", "tasks_by", "folder_bytes",
                                 "folder_entries") if k in spec}


def limits_word(limits: dict) -> str:
    """Which limits hold a sandbox's memory and tasks, for its word: ``cgroup2`` (a group with
    both controllers), ``rlimits`` (none: the fallback), or a group with one controller and
    what holds the other, e.g. ``cgroup2-memory+tasks-watchdog`` (``tasks_by``: ``nproc``
    where RLIMIT_NPROC binds, ``watchdog`` where only the measurer's count of threads does)."""
    version, held = int(limits.get("cgroup") or 0), _held_controllers(limits)
    if not held:
        return "rlimits"
    if len(held) == 2:
        return f"cgroup{version}"
    if held == ("memory",):
        return f"cgroup{version}-memory+tasks-{limits.get('tasks_by', 'nproc')}"
    return f"cgroup{version}-pids+memory-seccomp"


def _held_controllers(limits: dict) -> tuple:
    """The controllers of ("memory", "pids") the sandbox's group holds (both where an older
    measurer's ``limits`` do not say)."""
    if not limits.get("cgroup"):
        return ()
    return tuple(c for c in ("memory", "pids")
                 if c in limits.get("cgroup_controllers", ("memory", "pids")))


def enter_inner(fac: Facilities, folder: str, shm_mb: int, limits: dict | None = None) -> dict:
    """In the inner process (PID 1 of the new namespace): private /proc and /dev/shm, the
    fallback's resource limits where no cgroup holds (``limits``: ``cgroup``, the version its
    outer process joined, 0 for none; ``max_tasks``; ``rlimit_data_bytes``), then Landlock and
    seccomp. Returns what was applied."""
    applied: dict = {}
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    limits = limits or {}
    held = _held_controllers(limits)
    applied["limits"] = limits_word(limits)
    fallback = {**limits, "max_tasks": 0 if "pids" in held else limits.get("max_tasks")}
    if "memory" in held:
        fallback.pop("rlimit_data_bytes", None)
    if not fac.user_ns:  # RLIMIT_NPROC counts a uid's tasks: only the namespace's own
        fallback["max_tasks"] = 0
    _fallback_rlimits(fallback)
    if fac.mount_ns and fac.pid_ns:
        private_proc_shm(shm_mb)
        applied["private_proc_shm"] = True
        if limits.get("folder_bytes"):
            folder_tmpfs(folder, int(limits["folder_bytes"]), int(limits["folder_entries"]))
            applied["folder_quota"] = "tmpfs"
    if fac.landlock_abi:
        private = bool(applied.get("private_proc_shm"))
        writable = [folder] + (["/dev/shm"] if private else [])
        applied.update(landlock_restrict(writable, existing_writable(), fac.landlock_abi,
                                         _with_proc(fac.readable, private)
                                         if fac.reads_confined else None))
    if fac.seccomp:
        applied.update(seccomp_filter(unmapped_memory="memory" in held))
    return applied


def _fallback_rlimits(limits: dict) -> None:
    """Without a cgroup: at most ``max_tasks`` tasks of this uid in the user namespace
    (threads count; the kernel exempts a root measurer's uid), and private writable memory
    (``rlimit_data_bytes``, where given) per process."""
    import resource

    if limits.get("max_tasks"):
        n = int(limits["max_tasks"])
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
    if limits.get("rlimit_data_bytes"):
        n = int(limits["rlimit_data_bytes"])
        resource.setrlimit(resource.RLIMIT_DATA, (n, n))


def _with_proc(readable: dict, private_proc: bool) -> dict:
    """``readable`` with what a sandbox may read of /proc (``proc_readable``)."""
    return {"execute": list(readable.get("execute", ())),
            "read": [*readable.get("read", ()), *proc_readable(private_proc)]}


def probe(readable: dict | None = None) -> Facilities:
    """Try every step of the confinement in a throw-away child and report what held, reads
    confined to ``readable`` (``read_allowlist()`` when not given) included. Call it only from
    a single-threaded process (it forks)."""
    import tempfile

    from gfsim.core.folders import remove_tree

    if readable is None:
        readable = read_allowlist()
    r, w = os.pipe()
    folder = tempfile.mkdtemp(prefix="gfsim-probe-")
    outside = tempfile.mkdtemp(prefix="gfsim-probe-outside-")
    with open(os.path.join(outside, "secret"), "w") as fh:
        fh.write("not for the sandbox")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.close(r)
            found = _probe_child(folder, outside, readable)
            os.write(w, (json.dumps(found) + "\n").encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    remove_tree(folder)
    remove_tree(outside)
    try:
        found = json.loads(data)
    except ValueError:
        return Facilities(errors=("the probe died",))
    if found.get("reads_confined"):
        found["readable"] = readable
    found.update(kernel_limits())
    found["folder_quota"] = folder_quota_word(bool(found.get("mount_ns")))
    return Facilities.from_dict(found)


def kernel_limits() -> dict:
    """Which limits hold a sandbox's memory and tasks here, as ``Facilities`` fields: a cgroup
    where this process may make one (``gfsim.live.measure.cgroup``) for what it holds of memory and
    tasks, else the fallback's."""
    from gfsim.live.measure import cgroup

    version, held, why = cgroup.controllers()
    fallback_memory = ("watchdog over resident memory and /dev/shm, RLIMIT_DATA on the CPU; "
                       "memfd_create, memfd_secret and shmget refused")
    fallback_tasks = ("RLIMIT_NPROC in the user namespace (the kernel exempts a root "
                      "measurer's uid) and the watchdog's count of threads")
    out = {"cgroup": version, "cgroup_controllers": list(held)}
    if "memory" in held:
        out["memory_limit"] = (f"cgroup v{version}: the kernel caps all of the sandbox's "
                               "memory (memfd and SysV shm included; no swap)")
    else:
        out["memory_limit"] = f"{fallback_memory} (no memory cgroup: {why or 'not delegated'})"
    if "pids" in held:
        out["task_limit"] = f"cgroup v{version} pids.max: processes and threads"
    else:
        out["task_limit"] = f"{fallback_tasks} (no pids cgroup: {why or 'not delegated'})"
    return out


def folder_quota_word(mount_ns: bool) -> str:
    """What holds a candidate's folder quota (``MeasurerConfig.folder_max_*``) here."""
    check = "the measurer's check every 0.5 s"
    if mount_ns and os.geteuid() == 0:
        return (f"tmpfs in the sandbox's mount namespace: the kernel refuses bytes and entries "
                f"past the quota (ENOSPC), its pages charged to the sandbox's memory; depth by "
                f"{check}")
    why = "no mount namespace" if not mount_ns else \
        "the measurer is not root (it could not read the folder through /proc/<pid>/root)"
    return f"{check}: depth, entries and bytes; one file by RLIMIT_FSIZE ({why})"


def _reads_refused(outside: str) -> str | None:
    """None when a file and a folder ``outside`` the allow-list are refused and the
    interpreter's own files are still readable; else what went wrong."""
    for what, attempt in (("read", lambda: open(os.path.join(outside, "secret")).read()),
                          ("listed", lambda: os.listdir(outside))):
        try:
            attempt()
            return f"a folder outside the allow-list could be {what}"
        except PermissionError:
            pass
    try:
        with open(os.__file__, "rb") as fh:
            fh.read(1)
    except OSError as exc:
        return f"the interpreter's own files are not readable: {exc}"
    return None


def _probe_child(folder: str, outside: str,
                 readable: dict) -> dict:  # pragma: no cover - runs in a forked child
    errors = []
    abi = landlock_abi()
    found = {"landlock_abi": abi}
    try:
        unshare_mapped(0)
        uid_ok = True
    except OSError as exc:
        uid_ok = False
        errors.append(f"user namespace: {exc}")
    found["user_ns"] = uid_ok
    for name, flag in (("net_ns", CLONE_NEWNET), ("mount_ns", CLONE_NEWNS),
                       ("pid_ns", CLONE_NEWPID)):
        try:
            if not uid_ok:
                raise OSError(_errno.EPERM, "needs the user namespace")
            unshare(flag)
            found[name] = True
        except OSError as exc:
            found[name] = False
            errors.append(f"{name}: {exc}")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        inner = {}
        try:
            fac = Facilities(user_ns=found["user_ns"], pid_ns=found["pid_ns"],
                             net_ns=found["net_ns"], mount_ns=found["mount_ns"],
                             landlock_abi=abi, seccomp=True)
            inner["pid1"] = os.getpid() == 1
            try:
                if fac.mount_ns and fac.pid_ns:
                    private_proc_shm(1)
                inner["mount_ns"] = True
            except OSError as exc:
                inner["mount_ns"] = False
                inner["error"] = f"private /proc and /dev/shm: {exc}"
            try:
                if abi:
                    private = bool(fac.mount_ns and fac.pid_ns and inner["mount_ns"])
                    landlock_restrict([folder], existing_writable(), abi,
                                      _with_proc(readable, private))
                    why = _reads_refused(outside)
                    inner["reads_confined"] = why is None
                    if why:
                        inner["error_reads"] = f"read confinement: {why}"
            except OSError as exc:
                inner["landlock_abi"] = 0
                inner["error_ll"] = f"landlock: {exc}"
            try:
                seccomp_filter()
                try:
                    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()
                    inner["seccomp"] = False
                except OSError:
                    inner["seccomp"] = True
            except (OSError, KeyError) as exc:
                inner["seccomp"] = False
                inner["error_sc"] = f"seccomp: {exc}"
        finally:
            os.write(w, (json.dumps(inner) + "\n").encode())
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.waitpid(pid, 0)
    inner = json.loads(data or b"{}")
    found["pid_ns"] = found["pid_ns"] and bool(inner.get("pid1"))
    found["mount_ns"] = found["mount_ns"] and found["pid_ns"] and bool(inner.get("mount_ns"))
    found["seccomp"] = bool(inner.get("seccomp"))
    if "landlock_abi" in inner:
        found["landlock_abi"] = inner["landlock_abi"]
    found["reads_confined"] = bool(inner.get("reads_confined")) and found["landlock_abi"] > 0
    errors += [inner[k] for k in ("error", "error_ll", "error_reads", "error_sc")
               if k in inner]
    found["errors"] = errors
    return found


def probe_subprocess(timeout: float = 30.0) -> Facilities:
    """``probe`` in a fresh interpreter (safe to call from a process with threads)."""
    import subprocess

    out = subprocess.run([sys.executable, "-m", "gfsim.live.measure.sandbox", "--probe"],
                         capture_output=True, timeout=timeout, env=plain_env())
    try:
        return Facilities.from_dict(json.loads(out.stdout.decode().strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return Facilities(errors=(f"the probe failed: {out.stderr.decode()[-300:]}",))


def plain_env() -> dict:
    env = {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ}
    env["PYTHONPATH"] = python_path()
    return env


def python_path() -> str:
    """gfsim's own root first, then the PYTHONPATH this process was given."""
    from pathlib import Path

    import gfsim

    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([str(Path(gfsim.__file__).resolve().parent.parent), *rest])


# -- the zygote ----------------------------------------------------------------------------------
def _recv(sock: socket.socket):
    msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 8)
    return (json.loads(msg) if msg else None), fds


def zygote(task_name: str, sock_fd: int) -> None:  # pragma: no cover - its own process
    """Prepare (imports, no CUDA), then fork one confined process per spawn request."""
    prctl(PR_SET_DUMPABLE, 0)
    sock = socket.socket(fileno=sock_fd)
    import numpy  # noqa: F401 - imported once here, inherited by every candidate

    import torch  # noqa: F401

    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        pass
    from gfsim.live.measure import timing, worker  # noqa: F401
    from gfsim.live.tasks import get_task

    get_task(task_name)
    # What every candidate may read, computed once from this process (its cwd is the
    # measurer's folder), before any candidate code has run.
    fac = probe(read_allowlist(os.getcwd()))
    sock.send(json.dumps({"ready": True, "pid": os.getpid(), "facilities": fac.as_dict(),
                          "cuda_initialised": bool(torch.cuda.is_initialized())}).encode())
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the outer children reap themselves
    # What a candidate detaches (setsid) where no PID namespace holds it comes here, and is
    # killed: gfsim.live.measure.orphans
    from gfsim.live.measure import orphans

    prctl(orphans.PR_SET_CHILD_SUBREAPER, 1)
    outers: set[int] = set()
    while True:
        spec, fds = _recv(sock)
        if spec is None or spec.get("op") == "exit":
            orphans.kill_all(os.getpid())
            return
        if spec.get("op") == "sweep":
            swept = orphans.kill_adopted(os.getpid(), outers)
            sock.send(json.dumps({"swept": swept}).encode())
            continue
        pid = os.fork()
        if pid == 0:
            status = fds[2]
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _outer(spec, fds, sock_fd)
            except BaseException as exc:  # noqa: BLE001 - report, then die
                try:
                    os.write(status, (json.dumps({"error": f"{type(exc).__name__}: {exc}"})
                                      + "\n").encode())
                finally:
                    os._exit(70)
            os._exit(0)
        for fd in fds:
            os.close(fd)
        outers.add(pid)
        sock.send(json.dumps({"spawned": pid}).encode())


def _outer(spec: dict, fds: list[int], sock_fd: int) -> None:  # pragma: no cover - child
    req, ans, status = fds
    os.setsid()
    err = os.open(os.path.join(spec["dir"], "stderr.log"),
                  os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    os.dup2(err, 1)
    os.dup2(err, 2)
    os.close(err)
    os.close(sock_fd)
    low = 3
    for fd in sorted({req, ans, status}):  # nothing else of the zygote's stays open
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    fac = Facilities.from_dict(spec["facilities"])
    if spec.get("cgroup_procs"):  # before the namespaces: everything started later is inside
        from gfsim.live.measure import cgroup

        cgroup.join(spec["cgroup_procs"])
    enter_outer(fac)
    pid = os.fork()
    if pid == 0:
        os.close(status)
        code = 0
        try:
            _inner(spec, fac, req, ans)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            code = 71
        finally:
            os._exit(code)
    os.close(req)
    os.close(ans)
    os.write(status, (json.dumps({"pid": pid}) + "\n").encode())
    _, st = os.waitpid(pid, 0)
    os.write(status, (json.dumps({"exit": os.waitstatus_to_exitcode(st)}) + "\n").encode())


def _inner(spec: dict, fac: Facilities, req: int, ans: int) -> None:  # pragma: no cover
    folder = spec["dir"]
    os.chdir(folder)
    os.environ.clear()
    os.environ.update(spec["env"])
    import resource
    import tempfile

    tempfile.tempdir = folder  # the zygote's cached answer would be /tmp, not writable here

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if spec.get("file_max_bytes"):  # the kernel's cap on any one file it writes (its folder's
        n = int(spec["file_max_bytes"])  # quota in bytes; the measurer watches the sum)
        resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))
    applied = enter_inner(fac, folder, spec.get("shm_mb", 1024), _limits(spec))
    from gfsim.live.measure import worker

    answers = socket.socket(fileno=ans)
    worker.serve(spec["task"], os.fdopen(req, "r"), answers.send,
                 {"confined": applied, "namespace_pid": os.getpid()}, sock=answers)


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:] == ["--probe"]:
        print(json.dumps(probe().as_dict()))
    else:
        zygote(sys.argv[1], int(sys.argv[2]))
