"""A loopback OpenAI-compatible chat-completions server whose "LLM" is the task suite's
mutation operator: it answers every request with a variant of the program it was shown.

It stands in for an LLM where a search needs programs that compile and run (a test, a
fixture), and its answers are labelled as such: the ``model`` it reports is
``gfsim-mutation-operator`` unless told otherwise, and nothing about it is a language model.

How it reads a request: the program to mutate is the fenced block right under a
``# Current Program`` heading in the last user message (OpenEvolve's prompt), or else the first
block anywhere that starts with the task suite's ``# gfsim candidate: task=T variant=V`` header.
The header names the task and variant; the parameters are the module's top-level constants of
that variant's space (``Task.space``). The answer is one fenced python block holding
``Task.mutate`` (or, with ``wide=True``, ``Task.mutate_wide``) of that candidate, drawn with a
``numpy`` generator seeded from ``seed`` and the request's count, so a server run answers the
same sequence of requests the same way. A request with no such program is answered with a
short text that holds no code (an LLM answer a search cannot use).

Endpoints: ``POST /v1/chat/completions`` (and ``/chat/completions``), ``GET /v1/models``,
``GET /health``. Bound to 127.0.0.1 only. Usage::

    with MutationServer(seed=0) as server:
        base_url = server.url  # http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

import ast
import json
import re
import threading
import time
from http.server import ThreadingHTTPServer

from gfsim.integrations.jsonhttp import JsonHandler

__all__ = ["MutationServer", "MODEL", "parent_candidate", "answer"]

MODEL = "gfsim-mutation-operator"
_HEADER = re.compile(r"^# gfsim candidate: task=(\S+) variant=(\S+)", re.M)
_CURRENT = re.compile(r"^#\s*Current Program[ \t]*\n```[^\n]*\n(.*?)```", re.S | re.M)
_BLOCK = re.compile(r"```[^\n]*\n(.*?)```", re.S)


def parent_candidate(text: str):
    """The task-suite ``Candidate`` a prompt shows as the program to change, or None."""
    from gfsim.live.tasks import TASKS, Candidate

    blocks = [m.group(1) for m in _CURRENT.finditer(text)] or \
        [m.group(1) for m in _BLOCK.finditer(text)]
    for code in blocks:
        head = _HEADER.search(code)
        if head is None or head.group(1) not in TASKS:
            continue
        task = TASKS[head.group(1)]
        variant = head.group(2)
        if variant not in task.space:
            continue
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        params = {}
        for node in tree.body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id in task.space[variant]):
                try:
                    params[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
        params = task.complete(variant, params)
        try:
            task.validate(variant, params)
        except Exception:  # noqa: BLE001 - edited constants: not one of the suite's points
            continue
        return Candidate(task.name, variant, params)
    return None


def answer(text: str, rng, wide: bool = False) -> str:
    """The answer to a prompt: a mutated program in one python block, or a text with none."""
    from gfsim.live.tasks import TASKS

    parent = parent_candidate(text)
    if parent is None:
        return "I found no task-suite program in the prompt to change."
    task = TASKS[parent.task]
    child = task.mutate_wide(parent, rng) if wide else task.mutate(parent, rng)
    return (f"Changed {parent.variant} {parent.params} to {child.variant} {child.params}.\n\n"
            f"```python\n{child.code}```\n")


class MutationServer:
    """The server, on 127.0.0.1 and a free port (or ``port``), in a daemon thread.
    ``requests`` counts the chat completions answered; each waits ``delay_s`` seconds first (a
    slow server, so that a test's calls are in flight together)."""

    def __init__(self, *, seed: int = 0, wide: bool = False, model: str = MODEL,
                 port: int = 0, delay_s: float = 0.0):
        import numpy as np

        self.seed, self.wide, self.model, self.delay_s = seed, wide, model, delay_s
        self.requests = 0
        self._lock = threading.Lock()
        self._np = np
        server = self

        class Handler(JsonHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                if self.path.rstrip("/") in ("/health", ""):
                    self.send_json(200, {"status": "ok"})
                elif self.path.rstrip("/").endswith("/models"):
                    self.send_json(200, {"object": "list", "data": [
                        {"id": server.model, "object": "model", "owned_by": "gfsim"}]})
                else:
                    self.send_json(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self):  # noqa: N802
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self.send_json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length",
                                                                           0))))
                    messages = body["messages"]
                except (ValueError, KeyError, TypeError):
                    self.send_json(400, {"error": {"message": "expected a chat-completions body"}})
                    return
                if server.delay_s > 0:
                    time.sleep(server.delay_s)
                self.send_json(200, server._complete(messages))

        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def _complete(self, messages) -> dict:
        users = [m.get("content") for m in messages if isinstance(m, dict)
                 and m.get("role") == "user" and isinstance(m.get("content"), str)]
        prompt = users[-1] if users else ""
        with self._lock:
            count = self.requests
            self.requests += 1
        rng = self._np.random.default_rng([self.seed, count])
        text = answer(prompt, rng, self.wide)
        words_in = sum(len(str(m.get("content", "")).split()) for m in messages
                       if isinstance(m, dict))
        return {"id": f"mutation-{count}", "object": "chat.completion",
                "created": int(time.time()), "model": self.model,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                # word counts, not tokens: there is no tokenizer behind this server
                "usage": {"prompt_tokens": words_in, "completion_tokens": len(text.split()),
                          "total_tokens": words_in + len(text.split())}}

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "MutationServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
