"""The sandbox confines reading (gfsim.live.measure.sandbox.read_allowlist): a candidate reads the
software it runs and what the loader, Python and the GPU driver need, nothing of the users' or
the run's files. The hostile rows that try (read-outside-file, read-host-files, read-live-log,
read-measurer) run in tests/test_hostile.py; the GPU run (an H100) is in
docs/data/hostile-h100-reads.json."""

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gfsim.live.measure import sandbox
from gfsim.live.measure.sandbox import Facilities, landlock_abi, read_allowlist

needs_landlock = pytest.mark.skipif(landlock_abi() == 0, reason="no Landlock on this kernel")


def _covered(path, allowed: dict) -> bool:
    real = os.path.realpath(path)
    return any(real == p or real.startswith(p.rstrip("/") + "/")
               for p in allowed["execute"] + allowed["read"])


def test_the_allowlist_holds_the_interpreter_and_the_system_not_the_users_files(tmp_path):
    root = tmp_path / "measure"
    root.mkdir()
    allowed = read_allowlist(str(root))
    every = allowed["execute"] + allowed["read"]
    home = os.path.realpath(Path.home())
    for path in every:
        assert path == os.path.realpath(path) and path != "/"
        assert not (home + "/").startswith(path.rstrip("/") + "/"), f"{path} holds the home"
        assert not (str(root) + "/").startswith(path.rstrip("/") + "/"), path
    # The interpreter, its standard library and gfsim itself...
    for path in (sys.executable, os.__file__, json.__file__, sandbox.__file__):
        assert _covered(path, allowed), path
    # ...but not the rest of gfsim's checkout (a run's log may lie there), unless gfsim is
    # installed into a site-packages folder.
    checkout = Path(sandbox.__file__).resolve().parents[3]
    if checkout.name not in ("site-packages", "dist-packages"):
        assert not _covered(checkout / "pyproject.toml", allowed)
    # Of the measurer's folder, only the GPU clock's shared folder.
    assert allowed["read"].count(str(root / sandbox.SHARED_FOLDER)) == 1
    assert (root / sandbox.SHARED_FOLDER).is_dir()
    assert not _covered(root / "zygote.log", allowed)
    for path in ("/etc/shadow", "/etc/ssh", "/root", home, "/tmp", "/home", "/var/log",
                 "/dev/vda", "/sys/firmware"):
        assert not _covered(path, allowed), path
    for path in ("/etc/ld.so.cache", "/etc/passwd", "/usr/lib", "/sys/devices"):
        if os.path.exists(path):
            assert _covered(path, allowed), path


def test_facilities_without_read_confinement_say_so():
    fac = Facilities(user_ns=True, pid_ns=True, net_ns=True, mount_ns=True, landlock_abi=7,
                     seccomp=True)
    assert fac.missing() == ["read confinement (a candidate could read any file its user can)"]
    full = replace(fac, reads_confined=True, readable={"execute": ["/usr"], "read": []})
    assert full.missing() == []
    assert Facilities.from_dict(full.as_dict()) == full
    # A report written before reads were confined reads as not confining them.
    old = {k: v for k, v in full.as_dict().items() if k not in ("reads_confined", "readable")}
    assert not Facilities.from_dict(old).reads_confined


@needs_landlock
def test_the_probe_confines_reads_where_landlock_is_there():
    fac = sandbox.probe()
    assert fac.reads_confined, fac.errors
    assert fac.readable["execute"] and fac.readable["read"]


def _in_a_confined_child(folder: Path, outside: Path) -> dict:
    """Fork a child, confine it as a sandbox is (no private /proc), try reads, report."""
    allowed = read_allowlist(str(folder.parent))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        seen = {}
        try:
            sandbox.landlock_restrict([str(folder)], sandbox.existing_writable(),
                                      landlock_abi(), sandbox._with_proc(allowed, False))
            for name, attempt in (
                    ("outside file", lambda: (outside / "secret").read_text()),
                    ("outside folder", lambda: os.listdir(outside)),
                    ("home", lambda: os.listdir(Path.home())),
                    ("measurer's folder", lambda: os.listdir(folder.parent)),
                    ("stdlib", lambda: Path(os.__file__).read_bytes()[:1]),
                    ("new stdlib import", lambda: __import__("tabnanny")),
                    ("passwd", lambda: Path("/etc/passwd").read_bytes()[:1]),
                    ("own /proc", lambda: Path("/proc/self/status").read_text()[:1]),
                    ("own folder", lambda: (folder / "x").write_text("x") and
                     (folder / "x").read_text()),
                    ("/dev/null", lambda: open("/dev/null", "r+b").close())):
                try:
                    attempt()
                    seen[name] = "ok"
                except OSError as exc:
                    seen[name] = type(exc).__name__
        except BaseException as exc:  # noqa: BLE001
            seen["error"] = repr(exc)
        finally:
            os.write(w, json.dumps(seen).encode())
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


@needs_landlock
def test_a_confined_process_reads_its_software_and_folder_and_nothing_else(tmp_path):
    folder = tmp_path / "measure" / "gfsim-worker-x"
    folder.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("hunter2")
    seen = _in_a_confined_child(folder, outside)
    assert "error" not in seen, seen
    for name in ("outside file", "outside folder", "home", "measurer's folder"):
        assert seen[name] == "PermissionError", (name, seen)
    for name in ("stdlib", "new stdlib import", "passwd", "own /proc", "own folder",
                 "/dev/null"):
        assert seen[name] == "ok", (name, seen)


def _needs_torch_and_triton():
    pytest.importorskip("torch")
    pytest.importorskip("triton")


@needs_landlock
def test_an_honest_triton_kernel_passes_with_reads_confined(tmp_path):
    """The task's hand-written Triton softmax, under the interpreter in the sandbox."""
    _needs_torch_and_triton()
    from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer
    from gfsim.live.tasks import get_task

    cfg = MeasurerConfig(interpret=True, cpu_timing=True, rse_target=0.2, max_reps=3,
                         energy_window_s=0)
    with TritonMeasurer("softmax", cfg, workdir=tmp_path) as m:
        assert m.facilities.reads_confined and not m.facilities.missing()
        rec = m.measure(get_task("softmax").candidates()[0])
        box = m._spawn()
        try:
            confined = box.confined
        finally:
            box.close()
    assert rec["outcome"] == "success", rec
    assert confined["reads_confined"] and confined["readable"]["execute"]


@needs_landlock
def test_a_machine_that_cannot_confine_reads_refuses_untrusted_code(tmp_path, monkeypatch):
    """Where the probe found reads not confined, the measurer refuses candidate code unless
    --trust-candidates (trust_candidates) is given."""
    _needs_torch_and_triton()
    import gfsim.live.measure.measurer as mod
    from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer, UntrustedRefused

    class ReadsOpen(mod.Zygote):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.facilities = replace(self.facilities, reads_confined=False)

    monkeypatch.setattr(mod, "Zygote", ReadsOpen)
    m = TritonMeasurer("softmax", MeasurerConfig(compile_timeout_s=60), workdir=tmp_path)
    with pytest.raises(UntrustedRefused, match="read confinement.*`trust_candidates`"):
        m.facilities  # noqa: B018 - starts the zygote, which refuses
    m.close()


def test_the_compiler_triton_builds_launchers_with_is_readable_with_its_prefix(tmp_path,
                                                                              monkeypatch):
    # A compiler in a prefix of its own (as /opt/gcc/bin/gcc on the H200 machine): without its
    # prefix, Triton's launcher build fails inside the sandbox with EACCES.
    prefix = tmp_path / "toolchain"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "libexec").mkdir()
    cc = prefix / "bin" / "mycc"
    cc.write_text("#!/bin/sh\n")
    cc.chmod(0o755)
    root = tmp_path / "measure"
    root.mkdir()
    monkeypatch.setenv("CC", str(cc))
    allowed = read_allowlist(str(root))
    assert _covered(cc, allowed) and _covered(prefix / "libexec", allowed)
    assert not _covered(tmp_path / "elsewhere", allowed)
    # A compiler in a system folder adds that folder alone, never /usr or /opt whole.
    monkeypatch.setenv("CC", "/usr/bin/true")
    every = read_allowlist(str(root))
    assert not {"/usr", "/opt", "/"} & set(every["execute"] + every["read"])
