"""The contract between a Triton task, its candidates and the measurer.

A ``Task`` owns the benchmark: input generation, the trusted PyTorch reference, the shapes, the
tolerances and a hand-written family of ``Candidate`` kernels with a search space that
``mutate`` walks. A ``Candidate`` is a value (task, variant, params); its ``code`` is standalone
Python rendered from the task's templates: it imports torch/triton itself and defines

- ``run(*inputs)``: launches the Triton kernel(s) on ``make_inputs``' tensors and returns the
  output tensor, or a tuple of output tensors in the order ``Task.reference`` returns them (a
  quantiser's values and scales, say);
- ``aot_specs(dims)``: the kernels ``run`` would launch for a shape, as a list of
  ``(kernel_name, signature, constexprs, options)`` tuples, so that ``gfsim.live.tasks.aot`` can
  compile them ahead of time (for sm_90 without a GPU: Triton's JIT needs a driver to learn a
  kernel's signature, and a shape-dependent constexpr such as a one-pass softmax's BLOCK needs the
  shape, hence a function of ``dims`` rather than a constant list).

Nothing here imports torch or triton: task modules import them inside functions.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import linecache
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property

__all__ = ["Candidate", "Task", "load_code", "output_arrays", "render_header", "staged",
           "worst_excess"]


@dataclass(frozen=True)
class Candidate:
    """One kernel: an algorithmic ``variant`` of ``task`` with tunable ``params``.

    ``params`` holds ints and strings only (JSON-serialisable); ``parent`` is the parent's
    ``candidate_id`` when ``Task.mutate`` made it. Two candidates with the same code have the
    same ``candidate_id`` whatever their parents.
    """

    task: str
    variant: str
    params: dict
    parent: str | None = None

    @cached_property
    def code(self) -> str:
        """The full standalone source (see the module docstring)."""
        from gfsim.live.tasks import get_task

        return get_task(self.task).render(self.variant, self.params)

    def __hash__(self) -> int:  # params is a dict: hash its canonical JSON
        return hash((self.task, self.variant, json.dumps(self.params, sort_keys=True),
                     self.parent))

    @property
    def candidate_id(self) -> str:
        return f"{self.task}-{hashlib.sha256(self.code.encode()).hexdigest()[:12]}"


def seeded(seed: int, device: str):
    """A torch generator on ``device`` seeded with ``seed``: inputs are drawn where they are
    used (drawing 64M numbers on the CPU and copying them costs about a second a request), and
    the same (seed, device) gives bitwise the same tensors in any process."""
    import torch

    return torch.Generator(device=device).manual_seed(int(seed))


class Task(ABC):
    """A benchmark and its kernel family.

    Contract:
    - ``make_inputs(dims, seed, device)`` is a pure function of its arguments: the same call in
      any process gives bitwise identical tensors (drawn on that device with a seeded
      ``torch.Generator``); never all zeros.
    - ``reference(*inputs)`` is the trusted result: one tensor, or a tuple of tensors for a task
      with several outputs; it calls only the entry points in ``blocked`` plus elementwise ops
      and casts. The parent compares a candidate's outputs with it as float32 NumPy arrays
      through ``compare`` (by default ``numpy.allclose(got, ref, atol, rtol)`` per output).
    - ``baseline(*inputs)`` is what a speedup is measured against: the native-dtype PyTorch op
      (for fp16 tasks the float32 reference would be an unfairly slow baseline).
    - ``space[variant][param]`` lists the valid values of each tunable parameter in order (so
      that a "neighbouring value" means something); ``defaults[variant]`` is a valid point.
    - ``mutate(parent, rng)`` is deterministic given the numpy ``rng`` and always changes the
      code; ``neighbourhood(parent)`` lists the wider operator's children (what the measured
      worlds search), ``points()`` the whole space.
    """

    name: str
    dtype: str  # "float16" or "float32"
    atol: float
    rtol: float
    bench_shapes: list[dict]
    check_shapes: list[dict]
    blocked: tuple[str, ...]
    space: dict[str, dict[str, tuple]]
    defaults: dict[str, dict]
    switch_probability = 0.25  # mutate(): chance of changing the variant instead of a parameter
    # Per variant, parameters added after candidates of it were measured and logged, with the
    # value the code had before (Triton's default): at that value the parameter is not written
    # into the code (``written``), so an old candidate's code, and its id, are unchanged; an old
    # log's parameters lack it (``complete`` fills it in).
    implicit: dict[str, dict] = {}
    shape_steps: dict[str, int] = {}  # hidden_shape(): a dim that must be a multiple of this

    @abstractmethod
    def make_inputs(self, dims: dict, seed: int, device: str) -> tuple: ...

    @abstractmethod
    def reference(self, *inputs): ...

    def baseline(self, *inputs):
        return self.reference(*inputs)

    def compare(self, got: list, ref: list) -> str | None:
        """None if a candidate's outputs match the reference's, else why not.

        ``got`` and ``ref`` are lists of float32 NumPy arrays (``output_arrays`` of what ``run``
        and ``reference`` returned), in order. The default wants as many outputs, each of the
        reference's shape, finite, and ``numpy.allclose(got, ref, atol, rtol)``; a task whose
        outputs need another notion of "equal" (quantised values, say) overrides it.
        """
        import numpy as np

        if len(got) != len(ref):
            return f"{len(got)} outputs where the reference has {len(ref)}"
        for k, (g, r) in enumerate(zip(got, ref, strict=True)):
            what = "output" if len(ref) == 1 else f"output {k}"
            if g.shape != r.shape:
                return f"{what} shape {tuple(g.shape)} != reference {tuple(r.shape)}"
            if not np.all(np.isfinite(g)):
                return f"{what} has NaN or inf"
            if not np.allclose(g, r, atol=self.atol, rtol=self.rtol):
                worst = worst_excess([g], [r], self.atol, self.rtol)
                return f"{what} differs from the reference (worst excess {worst:.3g})"
        return None

    def hidden_shape(self, rng) -> dict:
        """A check shape the candidate is not told about, drawn with the numpy ``rng``: each dim
        uniform between the smallest and twice the largest value the check shapes give it
        (rounded up to ``shape_steps``), so a kernel correct only on the listed shapes fails."""
        out = {}
        for key in self.check_shapes[0]:
            values = [int(s[key]) for s in self.check_shapes]
            step = int(self.shape_steps.get(key, 1))
            v = int(rng.integers(min(values), 2 * max(values) + 1))
            out[key] = max(step, -(-v // step) * step)
        return out

    @abstractmethod
    def candidates(self) -> list[Candidate]: ...

    @abstractmethod
    def render(self, variant: str, params: dict) -> str:
        """The candidate source for a valid (variant, params)."""

    def describe(self) -> str:
        """One line for prompts and log headers: the module's first docstring line."""
        import sys

        doc = (sys.modules[type(self).__module__].__doc__ or self.name).strip()
        return doc.splitlines()[0].strip()

    def reference_code(self) -> str:
        """The kernel a speedup is measured against, as standalone source for a forecaster's
        prompt: the ``baseline`` method rewritten as a function ``run``, with the dtype and the
        timed shapes."""
        import inspect
        import re
        import textwrap

        src = textwrap.dedent(inspect.getsource(type(self).baseline))
        head, _, body = src.partition("\n")
        args = head[head.index("(") + 1: head.rindex(")")].split(",")
        args = ", ".join(a.strip() for a in args if a.strip() != "self")
        body = re.sub(r"\bself\.(\w+)", lambda m: repr(getattr(self, m.group(1))), body)
        return (f"# reference for task {self.name}: {self.describe()}\n"
                f"# dtype {self.dtype}; timed shapes {self.bench_shapes}\n"
                f"def run({args}):\n{body}")

    # -- the search space ---------------------------------------------------------------------
    def candidate(self, variant: str, **params) -> Candidate:
        """A candidate of ``variant``; parameters not given take the variant's defaults."""
        full = {**self.defaults.get(variant, {}), **params}
        self.validate(variant, full)
        return Candidate(self.name, variant, full)

    def written(self, variant: str, params: dict) -> dict:
        """The parameters written into the code: all but those at their implicit value."""
        gone = self.implicit.get(variant, {})
        return {k: v for k, v in params.items() if not (k in gone and gone[k] == v)}

    def complete(self, variant: str, params: dict) -> dict:
        """``params`` of an older log with the parameters added since at their implicit
        value (``implicit``)."""
        return {**self.implicit.get(variant, {}), **params} if variant in self.space else \
            dict(params)

    def validate(self, variant: str, params: dict) -> None:
        from gfsim.core.errors import GfsimError

        if variant not in self.space:
            raise GfsimError(f"task {self.name}: unknown variant {variant!r}; valid: "
                             f"{', '.join(self.space)}")
        allowed = self.space[variant]
        if set(params) != set(allowed):
            raise GfsimError(f"task {self.name}, variant {variant}: parameters "
                             f"{sorted(params)} != {sorted(allowed)}")
        for key, value in params.items():
            if value not in allowed[key]:
                raise GfsimError(f"task {self.name}, variant {variant}: {key}={value!r} not in "
                                 f"{list(allowed[key])}")

    def all_candidates(self, variant: str):
        """Every point of a variant's grid (for exhaustive tests; can be large)."""
        keys = list(self.space[variant])
        for values in itertools.product(*(self.space[variant][k] for k in keys)):
            yield Candidate(self.name, variant, dict(zip(keys, values)))

    def points(self):
        """Every candidate of the task's space (``gfsim.core.spaces.points``), variant by
        variant, in a fixed order."""
        from gfsim.core.spaces import points

        for variant, params in points(self.space):
            yield Candidate(self.name, variant, params)

    def neighbourhood(self, parent: Candidate) -> list[Candidate]:
        """The wide mutation operator's children of ``parent``, distinct and in a fixed order:
        one or two of its parameters changed to any other value, or another variant with its
        parameters carried over and up to two of that variant's changed
        (``gfsim.core.spaces.neighbours``). Where ``mutate`` moves one parameter one step, this
        is the wider neighbourhood an LLM's rewrite reaches: every point of every task has at
        least 64 neighbours (``tests/test_neighbourhood.py``), and the measured worlds count
        them by compiled binary too."""
        from gfsim.core.spaces import neighbours

        self.validate(parent.variant, parent.params)
        return [Candidate(self.name, v, p, parent=parent.candidate_id)
                for v, p in neighbours(self.space, self.defaults, parent.variant, parent.params)]

    def mutate_wide(self, parent: Candidate, rng) -> Candidate:
        """A child drawn uniformly from ``neighbourhood(parent)`` with the numpy ``rng``."""
        options = self.neighbourhood(parent)
        return options[int(rng.integers(len(options)))]

    def mutate(self, parent: Candidate, rng) -> Candidate:
        """A child: one parameter moved to a neighbouring value, or another variant.

        Switching variant keeps the parameters the new variant shares with the old one and takes
        the new variant's defaults for the rest. Deterministic given ``rng``
        (``numpy.random.Generator``); the child's code always differs from the parent's.
        """
        self.validate(parent.variant, parent.params)
        tunable = [k for k, vals in self.space[parent.variant].items() if len(vals) > 1]
        others = [v for v in self.space if v != parent.variant]
        if others and (not tunable or rng.random() < self.switch_probability):
            variant = others[int(rng.integers(len(others)))]
            params = {k: (parent.params[k] if parent.params.get(k) in vals else
                          self.defaults[variant][k])
                      for k, vals in self.space[variant].items()}
        else:
            variant = parent.variant
            key = tunable[int(rng.integers(len(tunable)))]
            values = self.space[variant][key]
            i = values.index(parent.params[key])
            step = int(rng.choice((-1, 1)))
            if not 0 <= i + step < len(values):
                step = -step
            params = {**parent.params, key: values[i + step]}
        self.validate(variant, params)
        return Candidate(self.name, variant, params, parent=parent.candidate_id)


def output_arrays(out, what: str = "run()") -> list:
    """The outputs of ``run`` or ``reference`` as float32 NumPy arrays on the host, in order:
    ``out`` is one tensor or a tuple (or list) of tensors. ``.float()`` widens every dtype used
    here exactly, float8 included (NumPy has no float8)."""
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    if not outs or not all(hasattr(o, "detach") for o in outs):
        raise TypeError(f"{what} returned {type(out).__name__}, not a tensor or a tuple of "
                        "tensors")
    return [o.detach().float().cpu().numpy() for o in outs]


def worst_excess(got: list, ref: list, atol: float, rtol: float) -> float | None:
    """max(|got - ref| - atol - rtol * |ref|) over the pairs of outputs of equal, non-empty
    shape (positive: outside ``numpy.allclose``); None where no pair compares. Diagnostic only:
    ``Task.compare`` gives the verdict."""
    import numpy as np

    worst = None
    for g, r in zip(got, ref):
        if g.shape == r.shape and g.size:
            e = float(np.max(np.abs(g.astype(np.float64) - r) - atol - rtol * np.abs(r)))
            worst = e if worst is None else max(worst, e)
    return worst


def staged(template: str, written: dict) -> str:
    """A template's ``[[stages:TEXT]]`` fragments: TEXT where the candidate's code holds
    NUM_STAGES, nothing where it does not (``Task.implicit``)."""
    import re

    keep = "NUM_STAGES" in written
    return re.sub(r"\[\[stages:(.*?)\]\]", (lambda m: m.group(1)) if keep else "", template,
                  flags=re.S)


def render_header(task: Task, variant: str, params: dict, constants: dict) -> str:
    """The common top of a candidate's source: imports and its constants, one per line, the
    parameters in the variant's own order (``space``), so that a point has one source however
    its parameters were gathered (a dict's order is its insertion order)."""
    lines = [f"# gfsim candidate: task={task.name} variant={variant}",
             "import torch", "import triton", "import triton.language as tl", "",
             f"DTYPE = {task.dtype!r}  # element type that aot_specs() describes"]
    order = list(task.space.get(variant, {}))
    ordered = {k: params[k] for k in order if k in params}
    ordered.update((k, v) for k, v in params.items() if k not in ordered)
    for key, value in {**constants, **ordered}.items():
        lines.append(f"{key} = {value!r}")
    return "\n".join(lines) + "\n"


def load_code(code: str, filename: str) -> dict:
    """Execute candidate source and return its namespace.

    ``@triton.jit`` reads its function's source back with ``inspect.getsourcelines``, which fails
    ("@jit functions should be defined in a Python file") for a plain ``exec`` of a string. The
    source is therefore registered in ``linecache`` under ``filename`` (entries without an mtime
    are never evicted), which satisfies ``inspect`` without writing a file. Use a distinct
    ``filename`` per candidate (e.g. ``f"<candidate {candidate_id}>"``).
    """
    linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
    namespace: dict = {"__name__": "candidate", "__file__": filename}
    exec(compile(code, filename, "exec"), namespace)  # noqa: S102 - the point of this function
    return namespace
