"""The Triton task suite on CPU: every hand-written candidate and a few dozen mutations of each
task are correct under the interpreter and compile ahead of time for sm_90; inputs are
reproducible across processes; importing the registry imports neither torch nor triton.

Interpreter checks run in one subprocess (``python -m gfsim.live.tasks.selfcheck``) with
``TRITON_INTERPRET=1`` in its environment, rather than by setting the variable at the top of this
module: the variable must be set before triton is imported, and under pytest another test module
(the measurer's) may import triton first; it would also leak into every later test, and
ahead-of-time compilation needs it unset (an interpreted kernel cannot be compiled). The
subprocess starts when this module's first test runs and works on the second core while the AOT
tests compile in this process. Subprocesses run with cwd=tmp_path: ``python -c`` and ``-m`` put
the cwd first on sys.path, and the checkout's gfsim/ folder would shadow the installed package.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from gfsim.errors import GfsimError

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from gfsim.live.tasks import TASKS, Candidate, UnknownTaskError, get_task  # noqa: E402
from gfsim.live.tasks.aot import compile_for  # noqa: E402
from gfsim.live.tasks.base import load_code  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION is unset")

NAMES = sorted(TASKS)
# Kernels are dtype-generic: the registered task's candidates also run on the other dtype.
DTYPES = {"softmax": ("float32", "float16"), "layernorm": ("float16", "float32"),
          "matmul": ("float16",)}
MUTATION_SHAPE = {"softmax": {"M": 2, "N": 5000}, "layernorm": {"M": 2, "N": 5000},
                  "matmul": {"M": 33, "N": 47, "K": 65}}
MUTATIONS_PER_START = 4  # a walk of 4 children from each hand-written candidate


def _env(**extra):
    return {**os.environ, "TRITON_DEFAULT_FP_FUSION": "1", **extra}


def mutation_walk(task, seed: int = 0) -> list[tuple[Candidate, Candidate]]:
    rng = np.random.default_rng(seed)
    pairs = []
    for cur in task.candidates():
        for _ in range(MUTATIONS_PER_START):
            child = task.mutate(cur, rng)
            pairs.append((cur, child))
            cur = child
    return pairs


def _unique(cands):
    seen = {}
    for c in cands:
        seen.setdefault(c.candidate_id, c)
    return list(seen.values())


def _job(c: Candidate, dims: dict, dtype: str) -> dict:
    return {"task": c.task, "variant": c.variant, "params": c.params, "dims": dims, "seed": 7,
            "dtype": dtype, "device": "cpu"}


def _interpreter_jobs() -> list[dict]:
    jobs = []
    for name in NAMES:
        task = get_task(name)
        for c in task.candidates():
            for dtype in DTYPES[name]:
                jobs += [_job(c, dims, dtype) for dims in task.check_shapes]
        for c in _unique(child for _, child in mutation_walk(task)):
            jobs.append(_job(c, MUTATION_SHAPE[name], task.dtype))
    return jobs


class Interpreted:
    """The selfcheck subprocess: started once, its results looked up per candidate."""

    def __init__(self, workdir: Path):
        self.jobs = _interpreter_jobs()
        (workdir / "jobs.json").write_text(json.dumps(self.jobs))
        self.out = workdir / "results.json"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gfsim.live.tasks.selfcheck", "jobs.json", "results.json"],
            cwd=workdir, env=_env(TRITON_INTERPRET="1"), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        self._results = None

    def results(self) -> list[dict]:
        if self._results is None:
            output, _ = self.proc.communicate(timeout=600)
            assert self.proc.returncode == 0, output[-3000:]
            answer = json.loads(self.out.read_text())
            if answer["unsupported"]:  # a known interpreter bug of this triton/numpy pair
                pytest.skip(answer["unsupported"])
            self._results = answer["results"]
        return self._results

    def failures(self, candidate: Candidate, dtype: str) -> list[str]:
        """Failed jobs of this candidate and dtype; raises if it had no jobs."""
        found, bad = 0, []
        for job, res in zip(self.jobs, self.results()):
            if (job["task"], job["variant"], job["params"], job["dtype"]) == (
                    candidate.task, candidate.variant, candidate.params, dtype):
                found += 1
                if not res["ok"]:
                    bad.append(f"{job['dims']}: {res['error']}")
        assert found, "no interpreter job for this candidate"
        return bad

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module", autouse=True)
def interpreted(tmp_path_factory):
    runner = Interpreted(tmp_path_factory.mktemp("interpret"))
    yield runner
    runner.close()


def _params(name):
    return [pytest.param(name, i, id=f"{name}-{i}-{c.variant}")
            for i, c in enumerate(get_task(name).candidates())]


ALL_CANDIDATES = [p for name in NAMES for p in _params(name)]


# -- AOT first: it runs in this process while the interpreter subprocess uses the other core --

@pytest.mark.parametrize("name,i", ALL_CANDIDATES)
def test_candidate_compiles_for_sm90_on_every_bench_shape(name, i):
    c = get_task(name).candidates()[i]
    res = compile_for(c, arch=90)
    assert res["ok"], res["error"]
    assert res["kernels"] >= 1 and res["error"] is None


@pytest.mark.parametrize("name", NAMES)
def test_mutations_compile_for_sm90(name):
    task = get_task(name)
    children = _unique(child for _, child in mutation_walk(task))
    bad = {}
    for c in children:
        res = compile_for(c, arch=90, shapes=task.bench_shapes[:1])
        if not res["ok"]:
            bad[f"{c.variant} {c.params}"] = res["error"][:300]
    assert not bad, bad


def test_compile_for_reports_a_broken_kernel():
    task = get_task("softmax")
    c = task.candidates()[0]
    code = c.code.replace("x = x - tl.max(x, axis=0)", "x = x - tl.max(x, axis=3)")
    assert code != c.code
    broken = SimpleNamespace(task=c.task, code=code, candidate_id="softmax-broken")
    res = compile_for(broken, arch=90, shapes=task.bench_shapes[:1])
    assert not res["ok"] and res["kernels"] == 0 and res["error"]


# -- the interpreter ---------------------------------------------------------------------------

@pytest.mark.parametrize("name,i", ALL_CANDIDATES)
def test_candidate_matches_reference_under_interpreter(name, i, interpreted):
    c = get_task(name).candidates()[i]
    for dtype in DTYPES[name]:
        bad = interpreted.failures(c, dtype)
        assert not bad, f"{dtype}: {bad}"


@pytest.mark.parametrize("name", NAMES)
def test_mutations_match_reference_under_interpreter(name, interpreted):
    task = get_task(name)
    bad = {}
    for c in _unique(child for _, child in mutation_walk(task)):
        fails = interpreted.failures(c, task.dtype)
        if fails:
            bad[f"{c.variant} {c.params}"] = fails
    assert not bad, bad


def test_load_code_gives_jit_kernels_their_source():
    # A plain exec() fails: "@jit functions should be defined in a Python file".
    c = get_task("softmax").candidates()[0]
    ns = load_code(c.code, f"<candidate {c.candidate_id}>")
    assert callable(ns["run"]) and callable(ns["aot_specs"])
    with pytest.raises(ValueError, match="Python file"):
        exec(compile(c.code, "<string>", "exec"), {})


# -- the families and mutate() -----------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_family_spans_every_variant_with_valid_distinct_candidates(name):
    task = get_task(name)
    cands = task.candidates()
    assert len(cands) >= 5
    assert {c.variant for c in cands} == set(task.space)
    assert len({c.candidate_id for c in cands}) == len(cands)
    for c in cands:
        task.validate(c.variant, c.params)
        assert c.task == name and c.parent is None
        assert json.loads(json.dumps(c.params)) == c.params
        assert c.candidate_id == f"{name}-{hashlib.sha256(c.code.encode()).hexdigest()[:12]}"
        compile(c.code, c.candidate_id, "exec")  # valid standalone Python
        assert "gfsim" not in c.code.replace("# gfsim candidate", "")
        assert "def run(" in c.code and "def aot_specs(" in c.code


@pytest.mark.parametrize("name", NAMES)
def test_mutate_is_deterministic_and_always_changes_something(name):
    task = get_task(name)
    first = [(p.candidate_id, c.candidate_id) for p, c in mutation_walk(task, seed=3)]
    again = [(p.candidate_id, c.candidate_id) for p, c in mutation_walk(task, seed=3)]
    other = [(p.candidate_id, c.candidate_id) for p, c in mutation_walk(task, seed=4)]
    assert first == again
    assert first != other
    switched = 0
    for parent, child in mutation_walk(task, seed=3):
        task.validate(child.variant, child.params)
        assert child.parent == parent.candidate_id
        assert child.code != parent.code
        if child.variant == parent.variant:
            changed = [k for k in child.params if child.params[k] != parent.params[k]]
            assert len(changed) == 1
            values = task.space[child.variant][changed[0]]
            step = values.index(child.params[changed[0]]) - values.index(parent.params[changed[0]])
            assert abs(step) == 1  # a neighbouring value
        else:
            switched += 1
    assert switched > 0  # the walk also changes algorithm, not only parameters


def test_candidate_is_a_hashable_value():
    task = get_task("matmul")
    a, b = task.candidates()[0], task.candidates()[0]
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    with pytest.raises(AttributeError):
        a.variant = "naive_k_loop"


def test_invalid_parameters_and_unknown_names_are_errors():
    task = get_task("softmax")
    with pytest.raises(GfsimError, match="BLOCK=3"):
        task.candidate("online", BLOCK=3)
    with pytest.raises(GfsimError, match="one_pass, online, multi_row"):
        task.candidate("two_pass")
    with pytest.raises(UnknownTaskError, match="softmax") as err:
        get_task("conv")
    assert isinstance(err.value, GfsimError) and isinstance(err.value, KeyError)
    assert "conv" not in TASKS and len(TASKS) == 3


# -- inputs and references ---------------------------------------------------------------------

# Digests of make_inputs on a few shapes: run here and in a fresh process.
DIGESTS = """
import hashlib
import torch
from gfsim.live.tasks import TASKS, get_task

def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(str(t.dtype).encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()

def digests(seed):
    out = {}
    for name in sorted(TASKS):
        task = get_task(name)
        for k, dims in enumerate(task.check_shapes[:2] + [{"M": 64, "N": 4096, "K": 512}]):
            out[f"{name}/{k}"] = digest(task.make_inputs(dims, seed, "cpu"))
    return out
"""
_ns: dict = {}
exec(DIGESTS, _ns)
digest, digests = _ns["digest"], _ns["digests"]


@pytest.mark.parametrize("name", NAMES)
def test_make_inputs_is_reproducible_nonzero_and_seeded(name):
    task = get_task(name)
    for dims in task.check_shapes:
        a = task.make_inputs(dims, 5, "cpu")
        b = task.make_inputs(dims, 5, "cpu")
        c = task.make_inputs(dims, 6, "cpu")
        assert digest(a) == digest(b)
        assert digest(a) != digest(c)
        for t in a:
            assert str(t.dtype) == f"torch.{task.dtype}"
            assert t.device.type == "cpu"
            assert torch.count_nonzero(t) > 0 and bool(torch.isfinite(t).all())


def test_make_inputs_is_bitwise_identical_in_a_fresh_process(tmp_path):
    code = DIGESTS + "\nimport json\nprint(json.dumps(digests(11)))\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == digests(11)
    assert digests(11) != digests(12)


@pytest.mark.parametrize("name", NAMES)
def test_reference_entry_points_exist_and_are_blocked_names(name):
    from gfsim.live.worker import resolve  # what the worker's guard uses

    task = get_task(name)
    for dotted in task.blocked:
        owner, attr = resolve(dotted)
        assert hasattr(owner, attr), dotted
    dims = task.check_shapes[0]
    inputs = task.make_inputs(dims, 1, "cpu")
    ref = task.reference(*inputs)
    assert ref.dtype == inputs[0].dtype
    assert torch.allclose(task.baseline(*inputs).float(), ref.float(), atol=task.atol * 10,
                          rtol=task.rtol * 10)


def test_registry_import_is_light_and_lazy(tmp_path):
    code = """
import sys
class Guard:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'triton'):
            raise ImportError('imported ' + name)
sys.meta_path.insert(0, Guard())
import gfsim.live, gfsim.live.tasks
from gfsim.live.tasks import TASKS, get_task
assert sorted(TASKS) == ['layernorm', 'matmul', 'softmax']
task = get_task('matmul')
c = task.candidates()[0]
assert 'def run(' in c.code and task.mutate(c, __import__('numpy').random.default_rng(0))
assert not any(m.split('.')[0] in ('torch', 'triton') for m in sys.modules)
print('ok')
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"


# -- on a GPU ----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("name,i", ALL_CANDIDATES)
def test_candidate_matches_reference_on_gpu(name, i):
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("needs CUDA (and TRITON_INTERPRET unset)")
    from gfsim.live.tasks.selfcheck import check

    task = get_task(name)
    c = task.candidates()[i]
    run = load_code(c.code, f"<candidate {c.candidate_id}>")["run"]
    bad = {}
    for dtype in DTYPES[name]:
        t = task if dtype == task.dtype else type(task)(dtype=dtype)
        shapes = t.check_shapes + (t.bench_shapes if dtype == task.dtype else [])
        for dims in shapes:
            res = check(t, run, dims, 3, "cuda")
            if not res["ok"]:
                bad[f"{dtype} {dims}"] = res["error"]
    assert not bad, bad


GPU_MUTATION_SHAPE = {"softmax": {"M": 512, "N": 8192}, "layernorm": {"M": 512, "N": 12288},
                      "matmul": {"M": 1024, "N": 1024, "K": 1024}}


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_mutations_match_reference_on_gpu(name):
    # Also catches what AOT compilation cannot: launch-time limits such as shared memory.
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("needs CUDA (and TRITON_INTERPRET unset)")
    from gfsim.live.tasks.selfcheck import check

    task = get_task(name)
    bad = {}
    for c in _unique(child for _, child in mutation_walk(task)):
        run = load_code(c.code, f"<candidate {c.candidate_id}>")["run"]
        for dims in (MUTATION_SHAPE[name], GPU_MUTATION_SHAPE[name]):
            res = check(task, run, dims, 3, "cuda")
            if not res["ok"]:
                bad[f"{c.variant} {c.params} {dims}"] = res["error"]
    assert not bad, bad
