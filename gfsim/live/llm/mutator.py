"""``LlmMutator``: child kernels written by an LLM behind an OpenAI-compatible chat-completions
server (vLLM, or any server that speaks the same API).

One request per child. The model is shown the task (its description, dtype, timed shapes and
the PyTorch baseline a speedup is measured against), the parent's code and what measuring the
parent showed (outcome, speedup, failure reason), and is asked for one standalone Triton module
that defines ``run(*inputs)``, in exactly one ```python block.

Reading the answer (``read_answer``): the first python block is taken (a count of the blocks goes
into the meta when there are several); an answer with no block, or whose block parses but
defines no ``run``, is a generation failure (``Generated.code`` None, ``failed_reason`` says
why). A block that does not parse is *not* a generation failure: its code is returned and the
measurer records a compile failure, as it would for any kernel that does not compile.

Failures are kept apart as in the forecaster (and through the same HTTP code,
``gfsim.live.llm.client.HttpTransport``): no answer at all (server down, timeouts, HTTP 5xx or
429, a body that is not JSON), after ``retries`` retries with exponential backoff, is a failed
child whose reason starts with "no answer"; a prompt longer than the model's context is a failed
child too. What makes every request fail (an unknown model, a refused API key, an option the
server rejects) raises ``MutatorError``.

Reproducibility: each request carries a ``seed`` derived from the expansion key and the slot, so
a server that honours it (vLLM does) answers the same request the same way.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import textwrap
import threading
import time

from gfsim.core.errors import GfsimError, SpecError
from gfsim.live.candidates import CandidateSource, Generated, ParentInfo, task_seed
from gfsim.live.llm.client import HttpTransport, NoAnswer, new_tally, server_spec
from gfsim.live.llm.prompt import PromptTooLong, cut_text, fit_prompt

__all__ = ["LlmMutator", "MutatorError", "parse_mutator", "read_answer", "mutation_messages",
           "request_seed"]

NO_BLOCK = "no python block in the answer"
NO_RUN = "the python block defines no run()"
_PYTHON_TAGS = ("", "python", "py", "python3")
_REASON_CHARS = 1200  # of a parent's failure reason (the end of a traceback says most)
_EXCERPT_CHARS = 200  # of a failed answer, kept in the meta


class MutatorError(GfsimError):
    """An LLM mutator that cannot work at all (unknown model, refused key, a request format the
    server rejects, a prompt limit too small for any prompt): raised, unlike per-child
    failures, which are returned as failed ``Generated`` children."""


class _Refused(Exception):
    """The server refused this one request (its prompt is longer than the model's context)."""


# -- the prompt -----------------------------------------------------------------------------------
SYSTEM = """You are an expert in GPU kernels written in Triton. You are given a task, the \
PyTorch baseline that speedups are measured against, a parent kernel for the task and what \
measuring the parent showed. Write an optimised Triton kernel for the task: repair the parent \
if it failed, otherwise make it faster.

Rules for the code:
1. It is one standalone Python module: it imports torch, triton and triton.language itself and \
uses nothing else from outside.
2. It defines `run(*inputs)` with the same inputs and output as the parent's `run`: the \
inputs are CUDA tensors, and `run` returns the output tensor (same shape and dtype as the \
baseline's, the same values within the tolerances). An `aot_specs` function is optional.
3. The work is done by `@triton.jit` kernels that `run` launches; PyTorch's own implementation \
of the operation is blocked while the kernel is measured (calling it raises).

Answer with exactly ONE ```python code block holding the whole module."""


def _feedback(parent: ParentInfo) -> str:
    if parent.outcome is None:
        return "Not measured yet."
    lines = [f"Outcome: {parent.outcome}."]
    if parent.speedup is not None:
        lines.append(f"Speedup over the PyTorch baseline: {parent.speedup:.3g}x "
                     "(above 1 is faster than the baseline).")
    if parent.reason:
        reason = parent.reason.strip()
        if len(reason) > _REASON_CHARS:
            reason = "[...] " + reason[-_REASON_CHARS:]
        lines.append(f"Failure reason:\n{reason}")
    return "\n".join(lines)


def mutation_messages(task, parent: ParentInfo, code_share: float = 1.0,
                      system_share: float = 1.0, user_share: float = 1.0) -> list[dict]:
    """The conversation for one child of ``parent``. To fit a small context, ``code_share`` < 1
    keeps that share of the parent's code, ``system_share`` and ``user_share`` that share of each
    message (``gfsim.live.llm.prompt.fit_prompt`` lowers them in that order)."""
    shapes = "; ".join(", ".join(f"{k}={v}" for k, v in dims.items())
                       for dims in task.bench_shapes)
    blocked = ", ".join(task.blocked[:3]) + (" and more" if len(task.blocked) > 3 else "")
    user = "\n\n".join([
        f"# Task: {task.name}\n{task.describe()}",
        f"## Inputs\ndtype {task.dtype}; timed shapes: {shapes}. The output is checked against "
        f"a float32 reference with atol={task.atol:g}, rtol={task.rtol:g}. Blocked (calling "
        f"them raises): {blocked}.",
        f"## PyTorch baseline\n```python\n{task.reference_code().rstrip()}\n```",
        f"## Parent kernel\n```python\n{cut_text(parent.code.rstrip(), code_share)}\n```",
        f"## Measured feedback on the parent\n{_feedback(parent)}",
        "Write the improved kernel now, as exactly one ```python block.",
    ])
    return [{"role": "system", "content": cut_text(SYSTEM, system_share)},
            {"role": "user", "content": cut_text(user, user_share)}]


# -- the answer -----------------------------------------------------------------------------------
def _blocks(text: str) -> tuple[list[str], bool]:
    """The python (or untagged) fenced blocks of ``text``, in order, and whether a python block
    was opened but never closed (an answer cut at ``max_tokens``)."""
    found: list[str] = []
    body: list[str] | None = None
    tag = ""
    for line in text.splitlines():
        s = line.strip()
        if body is None:
            if s.startswith("```"):
                words = s.strip("`").split()
                tag, body = (words[0].lower() if words else ""), []
        elif s.startswith("```") and not s.strip("`").strip():
            if tag in _PYTHON_TAGS:
                found.append("\n".join(body))
            body = None
        else:
            body.append(line)
    return found, body is not None and tag in _PYTHON_TAGS


def _defines_run(tree: ast.Module) -> bool:
    """A top-level ``run`` (def, assignment or import; also under a top-level if/try/with)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "run":
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "run" for t in targets):
                return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name) == "run" for a in node.names):
                return True
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for part in ("body", "orelse", "finalbody", "handlers"):
                stack.extend(getattr(node, part, None) or ())
        if isinstance(node, ast.ExceptHandler):
            stack.extend(node.body)
    return False


def read_answer(content: str | None, finish_reason: str | None = None):
    """An answer's text -> (code or None, failed reason or None, meta). See the module doc."""
    text = (content or "").encode("utf-8", "replace").decode("utf-8")
    text = re.sub(r"<think>.*?</think>", "", text, flags=re.DOTALL)
    blocks, unclosed = _blocks(text)
    meta: dict = {}
    if not blocks:
        why = NO_BLOCK
        if unclosed:
            why += f" (a block was opened but not closed; finish_reason {finish_reason!r})"
        elif not text.strip():
            why += " (the answer is empty)"
        meta["answer_excerpt"] = text[:_EXCERPT_CHARS]
        return None, why, meta
    if len(blocks) > 1:
        meta["python_blocks"] = len(blocks)
        meta["note"] = f"{len(blocks)} python blocks in the answer; the first was used"
    code = textwrap.dedent(blocks[0]).strip("\n") + "\n"
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError) as exc:  # the measurer's compile failure, not ours
        meta["syntax_error"] = f"{type(exc).__name__}: {exc}"[:200]
        return code, None, meta
    if not _defines_run(tree):
        meta["answer_excerpt"] = code[:_EXCERPT_CHARS]
        return None, NO_RUN, meta
    return code, None, meta


def request_seed(key: tuple, slot: int) -> int:
    """The sampling seed of child ``slot`` of expansion ``key`` (fits a signed 32-bit int)."""
    from gfsim.core.rng import stream

    return int(stream(*key, "llm", slot).integers(2**31 - 1))


# -- the source -----------------------------------------------------------------------------------
class LlmMutator(CandidateSource, HttpTransport):
    """Children from an LLM behind an OpenAI-compatible chat-completions server; see the module
    doc. Thread-safe: ``generate`` may run ``concurrency`` at a time."""

    name = "llm"

    def __init__(self, base_url: str, model: str, *, temperature: float = 0.8,
                 top_p: float | None = None, max_tokens: int = 1024,
                 max_prompt_tokens: int | None = None, concurrency: int = 4,
                 timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 0.5,
                 api_key: str | None = None, keepalive: bool = True):
        for key, value, low in (("concurrency", concurrency, 1), ("retries", retries, 0),
                                ("max_tokens", max_tokens, 1)):
            if value < low:
                raise SpecError(f"llm source: {key} must be >= {low}, got {value}")
        if max_prompt_tokens is not None and max_prompt_tokens < 1:
            raise SpecError(f"llm source: max_prompt_tokens must be >= 1, got "
                            f"{max_prompt_tokens}")
        if not (timeout_s > 0 and backoff_s >= 0):
            raise SpecError("llm source: timeout must be > 0 and backoff >= 0")
        if not temperature >= 0:
            raise SpecError(f"llm source: temperature must be >= 0, got {temperature}")
        if top_p is not None and not 0 < top_p <= 1:
            raise SpecError(f"llm source: top_p must be in (0, 1], got {top_p}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.api_key = api_key
        self.keepalive = keepalive  # False: a new connection per request (fault-injection tests)
        self._client = None
        self._fitted: dict[str, tuple[list[dict], bool]] = {}  # the same parent, the same prompt
        self._fitted_lock = threading.Lock()

    # -- CandidateSource -------------------------------------------------------------------------
    def seed(self, task) -> ParentInfo:
        return task_seed(task)

    def generate(self, task, parent, key, slot) -> Generated:
        started = time.perf_counter()
        seed = request_seed(key, slot)
        meta: dict = {"model": self.model, "seed": seed}
        try:
            messages, truncated = self._prompt(task, parent)
        except NoAnswer as exc:
            meta["wall_s"] = time.perf_counter() - started
            return Generated(None, meta, failed_reason=f"no answer from /tokenize: {exc}")
        except _Refused as exc:
            meta["wall_s"] = time.perf_counter() - started
            return Generated(None, meta, failed_reason=str(exc))
        if truncated:
            meta["prompt_truncated"] = True
        tally = new_tally()
        try:
            body = self._post(f"{self.base_url}/chat/completions",
                              self._payload(messages, seed), tally)
        except (NoAnswer, _Refused) as exc:
            meta["attempts"] = tally["attempts"]
            meta["wall_s"] = time.perf_counter() - started
            return Generated(None, meta, failed_reason=str(exc))
        meta["attempts"] = tally["attempts"]
        out = Generated(None, meta, service_s=tally["latency_s"],
                        input_tokens=tally["input_tokens"],
                        output_tokens=tally["output_tokens"])
        try:
            choice = body["choices"][0]
            message = choice.get("message") or {}
            content = message.get("content")
        except (KeyError, IndexError, TypeError, AttributeError):
            out.failed_reason = "no answer: a JSON answer without choices"
            meta["wall_s"] = time.perf_counter() - started
            return out
        meta["model"] = body.get("model") or self.model
        meta["finish_reason"] = choice.get("finish_reason")
        code, why, extra = read_answer(content if isinstance(content, str) else None,
                                       choice.get("finish_reason"))
        meta.update(extra)
        out.code, out.failed_reason = code, why
        meta["wall_s"] = time.perf_counter() - started
        return out

    def describe(self) -> dict:
        return {"name": self.name, "base_url": self.base_url, "model": self.model,
                "temperature": self.temperature, "top_p": self.top_p,
                "max_tokens": self.max_tokens, "max_prompt_tokens": self.max_prompt_tokens,
                "concurrency": self.concurrency, "timeout_s": self.timeout_s,
                "retries": self.retries}

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- requests --------------------------------------------------------------------------------
    def _payload(self, messages: list[dict], seed: int) -> dict:
        payload = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                   "temperature": self.temperature, "seed": seed, "n": 1}
        if self.top_p is not None:
            payload["top_p"] = self.top_p
        return payload

    def _prompt(self, task, parent: ParentInfo) -> tuple[list[dict], bool]:
        """The fitted conversation, once per distinct prompt (every child of one expansion has
        the same one)."""
        full = mutation_messages(task, parent)
        if self.max_prompt_tokens is None:
            return full, False
        digest = hashlib.sha256(json.dumps(full, sort_keys=True).encode()).hexdigest()
        with self._fitted_lock:
            hit = self._fitted.get(digest)
        if hit is not None:
            return hit
        try:
            fitted = fit_prompt(lambda *shares: mutation_messages(task, parent, *shares),
                                self._count_tokens, self.max_prompt_tokens)
        except PromptTooLong as exc:  # fit_prompt's "does not fit": every prompt is too big
            raise MutatorError(f"llm source: {exc} (max_prompt_tokens="
                               f"{self.max_prompt_tokens})") from None
        with self._fitted_lock:
            if len(self._fitted) >= 256:
                self._fitted.clear()
            self._fitted[digest] = fitted
        return fitted

    def _count_tokens(self, messages: list[dict]) -> int:
        body = self._post(f"{self.root_url}/tokenize",
                          {"model": self.model, "messages": messages,
                           "add_generation_prompt": True}, new_tally())
        count = body.get("count")
        if not isinstance(count, int):
            raise MutatorError(f"{self.root_url}/tokenize gave no token count (max_prompt_tokens "
                               "needs vLLM's /tokenize)")
        return count

    def _rejected(self, url: str, resp) -> Exception:
        text = resp.text[:300]
        if resp.status_code == 400 and "context length" in text:
            return _Refused(f"prompt too long for the model's context: HTTP 400: {text}")
        hint = ""
        if url.endswith("/tokenize") and resp.status_code == 404 and "does not exist" not in text:
            hint = " (max_prompt_tokens needs vLLM's /tokenize; leave it unset for other servers)"
        return MutatorError(f"llm source: {url}: HTTP {resp.status_code}: {text}{hint}")


_LLM_KEYS = {"model": str, "temperature": float, "top_p": float, "max_tokens": int,
             "max_prompt_tokens": int, "concurrency": int, "timeout": float, "retries": int,
             "backoff": float, "api_key_env": str}


def parse_mutator(spec: str) -> LlmMutator:
    """``llm:URL,model=NAME[,temperature=0.8,top_p=P,max_tokens=1024,max_prompt_tokens=N,
    concurrency=4,timeout=60,retries=3,backoff=0.5,api_key_env=VAR]``. The API key is read from
    the environment variable ``api_key_env`` names, never from the command line."""
    kind, sep, rest = (spec or "").partition(":")
    if kind != "llm" or not sep:
        raise SpecError(f"`source`: expected llm:URL,model=NAME,...; got {spec!r}")
    url, kw = server_spec(rest, "`source`", "llm", _LLM_KEYS)
    return LlmMutator(url, kw.pop("model"), **kw)
