"""The dollar cap in front of an OpenAI-compatible server (gfsim.integrations.cap_proxy; issue 55,
item 3, ShinkaEvolve's LLM half), over real loopback HTTP: the proxy in front of the mutation
server. Inside a real ShinkaEvolve 0.0.7 run: tests/test_shinka_cap.py."""

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from gfsim.core.errors import GfsimError
from gfsim.integrations.cap import DollarCap
from gfsim.integrations.cap_proxy import REFUSED_MODEL, CapProxy
from gfsim.integrations.mutation_server import MutationServer

# $1 per output token, nothing for input: a call reserves its max_tokens in dollars, and the
# mutation server's answer to a prompt with no program in it is 10 words ("I found no
# task-suite program in the prompt to change."), which it reports as 10 completion tokens: $10
PRICES = {"generator_usd_per_m": (0.0, 1e6)}
ASK = {"model": "m", "messages": [{"role": "user", "content": "no program here"}],
       "max_tokens": 40}


def _ledger(cap: DollarCap) -> list[dict]:
    return [json.loads(line) for line in Path(cap.ledger).read_text().splitlines()]


def _log(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_calls_are_forwarded_while_the_cap_holds_then_refused_never_forwarded(tmp_path):
    cap = DollarCap(100.0, tmp_path / "ledger.jsonl", **PRICES)
    with MutationServer() as up, CapProxy(cap, up.url, log=tmp_path / "proxy.jsonl") as proxy:
        replies = [httpx.post(proxy.url + "/chat/completions", json=ASK) for _ in range(9)]
        # once reached, a call that would fit what is left is refused all the same
        cheap = httpx.post(proxy.url + "/chat/completions", json={**ASK, "max_tokens": 1})
        assert proxy.forwarded == up.requests
    # settled at the usage reported ($10 each), a call reserving $40 fits while spent + 40 <=
    # 100: seven calls (settled at their reservations, only two would have)
    assert [r.status_code for r in replies] == [200] * 7 + [402] * 2
    assert up.requests == 7
    st = cap.status()
    assert st["spent_usd"] == pytest.approx(70.0) and st["in_flight"] == 0
    why = st["reached"]["why"]
    assert "$70.0000 spent" in why and "reserves $40.0000" in why
    for r in [*replies[7:], cheap]:
        assert r.status_code == 402 and r.headers["x-should-retry"] == "false"
        err = r.json()["error"]
        assert err["code"] == "dollar_cap_reached" and why in err["message"]
    # each call the upstream saw had its reservation first; each settled at its usage
    ledger = _ledger(cap)
    opened = {r["id"]: r for r in ledger if r["kind"] == "open"}
    closed = {r["id"]: r for r in ledger if r["kind"] == "close"}
    sent = [r for r in _log(tmp_path / "proxy.jsonl") if r["forwarded"]]
    assert len(sent) == 7 and len(opened) == 7
    for rec in sent:
        assert opened[rec["ticket"]]["t"] <= rec["sent_t"]
        assert rec["usage"]["completion_tokens"] == 10
        assert closed[rec["ticket"]]["usd"] == pytest.approx(10.0) == rec["settled_usd"]
    refused = [r for r in _log(tmp_path / "proxy.jsonl") if not r["forwarded"]]
    assert len(refused) == 3 and all(r["refused"] == why for r in refused)


def test_concurrent_calls_through_two_proxies_never_pass_the_cap(tmp_path):
    """Eight threads, two proxies on one ledger, a slow upstream: the reservations in flight
    count, so what is spent and in flight never passes the cap (a proxy that reserved after
    forwarding would let every call through)."""
    cap = DollarCap(100.0, tmp_path / "ledger.jsonl", **PRICES)
    codes = []
    with MutationServer(delay_s=0.3) as up, CapProxy(cap, up.url) as a, \
            CapProxy(cap, up.url) as b:
        def calls(url):
            for _ in range(3):
                codes.append(httpx.post(url + "/chat/completions", json=ASK,
                                        timeout=30).status_code)

        threads = [threading.Thread(target=calls, args=(p.url,)) for p in (a, b) * 4]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert a.forwarded + b.forwarded == up.requests == codes.count(200)
    assert 1 <= codes.count(200) < len(codes) == 24
    spent, flying, most_flying = 0.0, {}, 0
    for rec in _ledger(cap):  # the ledger in its order: the cap held at every reservation
        if rec["kind"] == "open":
            flying[rec["id"]] = rec["usd"]
            assert spent + sum(flying.values()) <= 100.0
            most_flying = max(most_flying, len(flying))
        elif rec["kind"] == "close":
            del flying[rec["id"]]
            spent += rec["usd"]
    assert most_flying >= 2, "the calls were meant to be in flight together"
    assert cap.status()["spent_usd"] == pytest.approx(spent) and spent <= 100.0


def test_a_call_with_no_usage_reported_settles_its_reservation(tmp_path):
    """The mutation server has no /v1/completions: its 404 comes back as it is, and the call,
    which reported no usage, settles at what it reserved."""
    cap = DollarCap(100.0, tmp_path / "ledger.jsonl", **PRICES)
    with MutationServer() as up, CapProxy(cap, up.url) as proxy:
        r = httpx.post(proxy.url + "/completions", json={"model": "m", "prompt": "x",
                                                         "max_tokens": 25})
    assert r.status_code == 404 and "no route" in r.json()["error"]["message"]
    st = cap.status()
    assert st["spent_usd"] == pytest.approx(25.0) and st["in_flight"] == 0


def test_an_unreachable_upstream_is_one_line_and_settles_at_nothing(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cap = DollarCap(100.0, tmp_path / "ledger.jsonl", **PRICES)
    with CapProxy(cap, f"http://127.0.0.1:{port}/v1", log=tmp_path / "p.jsonl") as proxy:
        r = httpx.post(proxy.url + "/chat/completions", json=ASK)
        assert proxy.forwarded == 0
    msg = r.json()["error"]["message"]
    assert r.status_code == 502 and "\n" not in msg
    assert f"the upstream http://127.0.0.1:{port}/v1 did not answer" in msg
    # reserved, then settled at $0: the call never reached a server
    ledger = _ledger(cap)
    assert [x["kind"] for x in ledger] == ["open", "close"] and ledger[1]["usd"] == 0.0
    assert cap.status()["in_flight"] == 0
    assert _log(tmp_path / "p.jsonl")[0]["forwarded"] is False


def test_a_refusal_as_a_reply_is_a_completion_that_names_the_cap(tmp_path):
    """ShinkaEvolve's answer (it retries every HTTP error): a 200 completion holding the
    refusal, no code in it, from no model."""
    cap = DollarCap(30.0, tmp_path / "ledger.jsonl", **PRICES)  # less than one call's $40
    with MutationServer() as up, CapProxy(cap, up.url, refusal="reply") as proxy:
        chat = httpx.post(proxy.url + "/chat/completions", json=ASK).json()
        text = httpx.post(proxy.url + "/completions", json={"prompt": "x",
                                                            "max_tokens": 40}).json()
        assert up.requests == 0 and proxy.refused == 2
    content = chat["choices"][0]["message"]["content"]
    assert chat["model"] == REFUSED_MODEL and chat["usage"]["completion_tokens"] == 0
    assert "the dollar cap $30 is reached" in content and "```" not in content
    assert text["object"] == "text_completion" and "dollar cap" in text["choices"][0]["text"]


def test_the_openai_client_does_not_retry_a_refusal(tmp_path):
    openai = pytest.importorskip("openai")
    cap = DollarCap(30.0, tmp_path / "ledger.jsonl", **PRICES)
    with MutationServer() as up, CapProxy(cap, up.url) as proxy:
        client = openai.OpenAI(base_url=proxy.url, api_key="none", max_retries=3)
        with pytest.raises(openai.APIStatusError, match="dollar cap") as e:
            client.chat.completions.create(**ASK)
        assert e.value.status_code == 402 and proxy.refused == 1 and up.requests == 0


def test_models_are_forwarded_and_what_is_not_carried_is_refused(tmp_path):
    cap = DollarCap(100.0, tmp_path / "ledger.jsonl", **PRICES)
    with MutationServer() as up, CapProxy(cap, up.url) as proxy:
        assert httpx.get(proxy.url + "/models").json()["data"][0]["id"] == up.model
        streamed = httpx.post(proxy.url + "/chat/completions", json={**ASK, "stream": True})
        other = httpx.post(proxy.url + "/embeddings", json={"input": "x"})
        health = httpx.get(proxy.url.removesuffix("/v1") + "/health").json()
        assert up.requests == 0
    assert streamed.status_code == 400 and "stream" in streamed.json()["error"]["message"]
    assert other.status_code == 404 and health["cap"]["spent_usd"] == 0
    assert not Path(cap.ledger).exists()  # nothing was reserved
    with pytest.raises(GfsimError, match="refusal must be one of error, reply"):
        CapProxy(cap, up.url, refusal="retry")
    with pytest.raises(GfsimError, match="upstream must be an http"):
        CapProxy(cap, "127.0.0.1:8000")


def test_the_command_serves_until_interrupted_and_says_what_was_spent(tmp_path):
    import signal

    with MutationServer() as up:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gfsim", "cap-proxy", "--usd", "5", "--ledger",
             str(tmp_path / "run.ledger"), "--upstream", up.url, "--model", up.model],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            cwd=tmp_path)  # (not the checkout: its gfsim/ would shadow the installed one)
        try:
            # (its first lines say where it serves)
            first = ""
            while "ShinkaEvolve's name" not in first:
                line = proc.stdout.readline()
                assert line, f"cap-proxy ended before serving:\n{first}"
                first += line
            url = first.split("gfsim cap-proxy at ", 1)[1].split()[0]
            assert httpx.post(url + "/chat/completions", json=ASK).status_code == 200
            proc.send_signal(signal.SIGINT)
            rest = proc.communicate(timeout=120)[0]  # (a hang guard)
        finally:
            proc.kill()
    assert proc.returncode == 0, first + rest
    assert f"local/{up.model}@{url}" in first + rest
    assert "1 forwarded, 0 refused" in rest and "cap not reached" in rest


def test_in_front_of_the_real_vllm_server_the_cap_settles_its_reported_usage(tmp_path,
                                                                            vllm_server):
    """The repository's vLLM CPU server (the tiny model) as the upstream, at $1 a token in and
    out: each call reserves its prompt (a token per UTF-8 byte, and the chat template's own
    tokens) and its 8 output tokens, settles at the tokens vLLM reported (its chat template's
    prompt tokens included), never more than it reserved, and once what is spent plus a
    reservation would pass $300, nothing more reaches vLLM."""
    cap = DollarCap(300.0, tmp_path / "ledger.jsonl", generator_usd_per_m=(1e6, 1e6))
    ask = {"model": vllm_server.model, "max_tokens": 8, "temperature": 0.0,
           "messages": [{"role": "user", "content": "Write a Triton softmax kernel."}]}
    with CapProxy(cap, vllm_server.url, log=tmp_path / "proxy.jsonl") as proxy:
        replies = [httpx.post(proxy.url + "/chat/completions", json=ask, timeout=120)
                   for _ in range(12)]
    sent = [r for r in _log(tmp_path / "proxy.jsonl") if r["forwarded"]]
    assert 2 <= len(sent) < 12
    assert [r.status_code for r in replies] == [200] * len(sent) + [402] * (12 - len(sent))
    reserved = {r["id"]: r["usd"] for r in _ledger(cap) if r["kind"] == "open"}
    for rec, reply in zip(sent, replies):
        usage = reply.json()["usage"]
        tokens = usage["prompt_tokens"] + usage["completion_tokens"]
        assert rec["settled_usd"] == pytest.approx(float(tokens))
        assert tokens < reserved[rec["ticket"]]  # a real tokenizer within the reservation
    st = cap.status()
    assert st["spent_usd"] == pytest.approx(sum(r["settled_usd"] for r in sent))
    assert st["spent_usd"] <= 300.0 and st["in_flight"] == 0 and st["reached"]
