"""The LLM mutator (``llm:`` source): the prompt and the answer parser offline; generation against
the real tiny vLLM server (random weights: it answers garbage, deterministically for a seed);
faults injected with the loopback proxy between client and server; spec parsing."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from gfsim.core.errors import SpecError
from gfsim.live.llm.forecaster import fit_prompt
from gfsim.live.llm.mutator import (
    NO_BLOCK,
    NO_RUN,
    SYSTEM,
    LlmMutator,
    MutatorError,
    mutation_messages,
    parse_mutator,
    read_answer,
    request_seed,
)
from gfsim.live.sources import ParentInfo, parse_source
from gfsim.live.tasks import get_task

TINY_CONTEXT = 512  # the test model's --max-model-len
PROMPT_LIMIT = 300
KEY = (7, "softmax", "n0", 0)
GOOD = "import torch\nimport triton\n\n\ndef run(x):\n    return x * 2\n"


def softmax():
    return get_task("softmax")


def parent(outcome=None, speedup=None, reason=None) -> ParentInfo:
    return ParentInfo("n0", softmax().candidates()[0].code, outcome=outcome, speedup=speedup,
                      reason=reason)


# -- offline: reading answers ---------------------------------------------------------------------
def test_one_python_block_is_the_code():
    for fence in ("```python", "```", "```py", "  ```Python3"):
        code, why, meta = read_answer(f"Here it is:\n{fence}\n{GOOD}```\nEnjoy.", "stop")
        assert (code, why) == (GOOD, None) and "python_blocks" not in meta, fence
    # Indented as a whole (inside a list item): dedented; an assignment or import counts as run.
    code, why, _ = read_answer("1. code:\n   ```python\n   import torch\n   run = torch.neg\n"
                               "   ```")
    assert code == "import torch\nrun = torch.neg\n" and why is None
    assert read_answer("```\nfrom m import k as run\n```")[0] == "from m import k as run\n"
    # Reasoning between think tags is not the answer.
    code, _, _ = read_answer("<think>```python\ndef run(): pass\n```</think>\n```python\n"
                             f"{GOOD}```")
    assert code == GOOD


def test_two_blocks_take_the_first_and_say_so():
    other = GOOD.replace("* 2", "* 3")
    code, why, meta = read_answer(f"```python\n{GOOD}```\nor\n```python\n{other}```\n")
    assert code == GOOD and why is None
    assert meta["python_blocks"] == 2 and "first" in meta["note"]
    # A block in another language is not a python block, and its fences do not confuse.
    code, _, meta = read_answer(f"```bash\npip install triton\n```\n```python\n{GOOD}```")
    assert code == GOOD and "python_blocks" not in meta


@pytest.mark.parametrize("answer, reason", [
    ("I would use shared memory and a two-pass reduction.", NO_BLOCK),
    ("", NO_BLOCK + " (the answer is empty)"),
    ("```bash\nnvidia-smi\n```", NO_BLOCK),
    ("```python\nimport torch\ndef run(x", NO_BLOCK + " (a block was opened but not closed"),
    ("```python\nimport torch\n\ndef launch(x):\n    return x\n```", NO_RUN),
    ("```python\nclass K:\n    def run(self, x):\n        return x\n```", NO_RUN),
])
def test_an_answer_without_usable_code_is_a_generation_failure(answer, reason):
    code, why, meta = read_answer(answer, "length")
    assert code is None and why.startswith(reason)
    assert "answer_excerpt" in meta


def test_code_that_does_not_parse_is_kept_for_the_measurer():
    broken = "import torch\ndef run(x)\n    return x\n"
    code, why, meta = read_answer(f"```python\n{broken}```")
    assert code == broken and why is None and "SyntaxError" in meta["syntax_error"]


# -- offline: the prompt, the seed, the spec ------------------------------------------------------
def test_the_prompt_shows_the_task_the_parent_and_its_feedback():
    task = softmax()
    system, user = (m["content"] for m in mutation_messages(task, parent()))
    assert system == SYSTEM and "`run(*inputs)`" in system and "exactly ONE ```python" in system
    assert task.describe() in user and "dtype float32" in user and "M=4096, N=32000" in user
    assert f"```python\n{task.reference_code().rstrip()}\n```" in user
    assert f"```python\n{parent().code.rstrip()}\n```" in user
    assert "Not measured yet." in user and "torch.softmax" in user
    ok = mutation_messages(task, parent("success", 1.234))[1]["content"]
    assert "Outcome: success." in ok and "1.23x" in ok and "Failure reason" not in ok
    tb = "Traceback (most recent call last):\n" + "  frame\n" * 500 + "CompilationError: bad"
    failed = mutation_messages(task, parent("compile_failed", None, tb))[1]["content"]
    assert "Outcome: compile_failed." in failed and failed.count("frame") < 200
    assert "CompilationError: bad" in failed  # a long reason keeps its end


def test_the_parent_code_is_cut_first():
    task, p = softmax(), parent()
    full = mutation_messages(task, p)
    size = sum(len(m["content"]) for m in full)
    fitted, cut = fit_prompt(lambda *s: mutation_messages(task, p, *s),
                             lambda ms: sum(len(m["content"]) for m in ms), size - 500)
    assert cut and fitted[0] == full[0]  # the system message is whole
    assert "characters cut to fit the context" in fitted[1]["content"]
    assert fitted[1]["content"].endswith("as exactly one ```python block.")  # the rest is whole


def test_request_seeds_are_keyed():
    assert request_seed(KEY, 0) == request_seed(KEY, 0)
    seeds = {request_seed(KEY, s) for s in range(50)} | {request_seed((8, *KEY[1:]), 0)}
    assert len(seeds) == 51 and all(0 <= s < 2**31 for s in seeds)


def test_mutator_specs(monkeypatch):
    m = parse_mutator("llm:http://127.0.0.1:9/v1,model=m,temperature=0.2,top_p=0.9,"
                      "max_tokens=200,max_prompt_tokens=300,concurrency=2,timeout=3,retries=1,"
                      "backoff=0.1")
    assert (m.model, m.temperature, m.top_p, m.max_tokens, m.max_prompt_tokens, m.concurrency,
            m.timeout_s, m.retries, m.backoff_s) == ("m", 0.2, 0.9, 200, 300, 2, 3.0, 1, 0.1)
    assert m.root_url == "http://127.0.0.1:9"
    d = parse_mutator("llm:https://x/v1,model=m")
    assert (d.temperature, d.top_p, d.max_tokens, d.max_prompt_tokens, d.concurrency,
            d.retries) == (0.8, None, 1024, None, 4, 3)
    assert isinstance(parse_source("llm:http://x/v1,model=m"), LlmMutator)
    monkeypatch.setenv("GFSIM_TEST_LLM_KEY", "sk-secret")
    k = parse_mutator("llm:http://x/v1,model=m,api_key_env=GFSIM_TEST_LLM_KEY")
    assert k.api_key == "sk-secret"
    assert k.describe()["name"] == "llm" and "sk-secret" not in repr(k.describe())
    assert {"base_url", "model", "temperature", "max_tokens"} <= set(k.describe())
    for spec, msg in (("mutate:http://x", "expected llm:URL"),
                      ("llm:model=m", "first item after llm: is the server URL"),
                      ("llm:ftp://x,model=m", "not an http"), ("llm:http://x", "model=NAME"),
                      ("llm:http://x,model=m,color=red", "unknown key 'color'; valid: model"),
                      ("llm:http://x,model=m,retries=two", "not a int"),
                      ("llm:http://x,model=m,concurrency=0", "concurrency must be >= 1"),
                      ("llm:http://x,model=m,top_p=1.5", "top_p must be in"),
                      ("llm:http://x,model=m,api_key_env=GFSIM_SURELY_UNSET", "is not set")):
        with pytest.raises(SpecError, match=re.escape(msg)):
            parse_mutator(spec)


def test_the_root_is_the_tasks_first_kernel():
    task = softmax()
    root = LlmMutator("http://x/v1", "m").seed(task)
    assert root.code == task.candidates()[0].code and root.outcome is None


def test_a_server_that_is_down_gives_a_failed_child():
    m = LlmMutator("http://127.0.0.1:9/v1", "m", retries=1, backoff_s=0.01)
    g = m.generate(softmax(), parent(), KEY, 0)
    assert g.code is None and g.failed_reason.startswith("no answer after 2 attempts")
    assert "ConnectError" in g.failed_reason and g.meta["attempts"] == 2


# -- a real vLLM server ---------------------------------------------------------------------------
def make(vllm, **kw) -> LlmMutator:
    kw.setdefault("max_prompt_tokens", PROMPT_LIMIT)
    kw.setdefault("max_tokens", 48)
    return LlmMutator(kw.pop("url", vllm.url), kw.pop("model", vllm.model), **kw)


def test_a_real_request_is_sent_and_its_answer_read(vllm_server):
    m = make(vllm_server)
    a = m.generate(softmax(), parent(), KEY, 0)
    assert 0 < a.input_tokens <= PROMPT_LIMIT and 0 < a.output_tokens <= 48
    assert a.service_s > 0 and a.meta["attempts"] == 1 and a.meta["model"] == vllm_server.model
    assert a.meta["seed"] == request_seed(KEY, 0) and a.meta["finish_reason"] in ("stop",
                                                                                  "length")
    assert a.meta["prompt_truncated"] is True  # the tiny context holds far less than the prompt
    if a.code is None:  # what the random-weights model says: garbage without a python block
        assert a.failed_reason.startswith(NO_BLOCK) and a.meta["answer_excerpt"]
    else:  # (a seed that happened to produce a block: its code is returned)
        assert a.failed_reason is None
    # The same key and slot: the same seed, the same answer; another slot, another one.
    b = m.generate(softmax(), parent(), KEY, 0)
    assert (b.code, b.failed_reason, b.output_tokens, b.meta.get("answer_excerpt")) == (
        a.code, a.failed_reason, a.output_tokens, a.meta.get("answer_excerpt"))
    c = m.generate(softmax(), parent(), KEY, 1)
    assert c.meta["seed"] != a.meta["seed"]
    assert (c.meta.get("answer_excerpt"), c.code) != (a.meta.get("answer_excerpt"), a.code)


def watching_tokenize(proxy, default="pass"):
    """A proxy whose faults (and ``seen`` list) hit the token-count requests instead."""
    p = proxy(default=default)
    p.only = "/tokenize"
    return p


def test_children_run_concurrently_and_share_one_fitted_prompt(vllm_server, proxy):
    p = watching_tokenize(proxy)
    m = make(vllm_server, url=p.url(), concurrency=4, keepalive=False)
    with ThreadPoolExecutor(m.concurrency) as pool:
        kids = list(pool.map(lambda s: m.generate(softmax(), parent(), KEY, s), range(4)))
    assert all(k.output_tokens > 0 and k.meta["attempts"] == 1 for k in kids)
    assert len({k.meta["seed"] for k in kids}) == 4
    assert len({k.input_tokens for k in kids}) == 1
    fits = len(p.seen)  # the prompt was fitted before, by threads that raced for it
    assert fits > 0
    m.generate(softmax(), parent(), KEY, 9)  # the same parent: no counting again
    assert len(p.seen) == fits
    m.generate(softmax(), parent("success", 1.5), KEY, 0)  # new feedback: a new prompt
    assert len(p.seen) > fits
    m.close()


def test_a_prompt_too_long_for_the_context_is_a_failed_child(vllm_server):
    g = make(vllm_server, max_prompt_tokens=None).generate(softmax(), parent(), KEY, 0)
    assert g.code is None and g.failed_reason.startswith("prompt too long for the model's")
    assert g.input_tokens is None


def test_misconfiguration_raises(vllm_server):
    task, p = softmax(), parent()
    with pytest.raises(MutatorError, match="HTTP 404"):  # chat completions
        make(vllm_server, model="no-such-model", max_prompt_tokens=None).generate(task, p, KEY, 0)
    with pytest.raises(MutatorError, match="HTTP 404"):  # /tokenize, to fit the prompt
        make(vllm_server, model="no-such-model").generate(task, p, KEY, 0)
    with pytest.raises(MutatorError, match="HTTP 400"):  # more answer tokens than the context
        make(vllm_server, max_tokens=TINY_CONTEXT + 1).generate(task, p, KEY, 0)
    with pytest.raises(MutatorError, match="does not fit in 5 tokens"):
        make(vllm_server, max_prompt_tokens=5).generate(task, p, KEY, 0)


# -- faults between client and server -------------------------------------------------------------
def through(vllm_server, proxy_, **kw) -> LlmMutator:
    """A mutator that talks through the proxy, one connection per request, so that each chat
    completion meets the proxy's next fault (token-count requests pass)."""
    return make(vllm_server, url=proxy_.url(), backoff_s=0.01, keepalive=False, **kw)


@pytest.mark.parametrize("fault", ["drop", "http500", "notjson", "garbage"])
def test_a_server_that_never_answers_gives_a_failed_child(vllm_server, proxy, fault):
    p = proxy(default=fault)
    g = through(vllm_server, p, retries=2).generate(softmax(), parent(), KEY, 0)
    assert g.code is None and g.failed_reason.startswith("no answer after 3 attempts")
    assert g.meta["attempts"] == 3 and p.seen == [fault] * 3
    assert g.input_tokens is None and g.service_s == 0.0
    expect = {"drop": "Error", "garbage": "Error", "http500": "HTTP 500",
              "notjson": "not JSON"}[fault]
    assert expect in g.failed_reason


def test_a_later_attempt_that_passes_recovers(vllm_server, proxy):
    p = proxy(["drop", "http500"])
    g = through(vllm_server, p, retries=3).generate(softmax(), parent(), KEY, 0)
    assert g.failed_reason is None or g.failed_reason.startswith(NO_BLOCK)
    assert g.meta["attempts"] == 3 and p.seen == ["drop", "http500", "pass"]
    assert g.output_tokens > 0 and g.service_s > 0


@pytest.mark.slow
def test_a_slow_server_times_out_then_answers(vllm_server, proxy):
    # timeout_s is ten times a 48-token answer or more (a 1.5 s limit fails under load); the
    # delay, three times timeout_s, always outlasts it
    p = proxy(["delay:15"])
    g = through(vllm_server, p, retries=1, timeout_s=5.0).generate(softmax(), parent(), KEY, 0)
    assert g.meta["attempts"] == 2 and g.output_tokens > 0 and p.seen == ["delay:15", "pass"]
    slow = proxy(default="delay:15")
    g = through(vllm_server, slow, retries=1, timeout_s=5.0).generate(softmax(), parent(), KEY,
                                                                      0)
    assert g.code is None and g.failed_reason.startswith("no answer after 2 attempts")
    assert "Timeout" in g.failed_reason


def test_token_counting_that_gets_no_answer_gives_a_failed_child(vllm_server, proxy):
    p = watching_tokenize(proxy, default="drop")
    g = through(vllm_server, p, retries=1).generate(softmax(), parent(), KEY, 0)
    assert g.code is None and g.failed_reason.startswith("no answer from /tokenize")
    assert p.seen == ["drop", "drop"]
