"""A hard dollar cap over a whole run (gfsim.integrations.cap; issue 55, item 3): the ledger
reserves work in flight, refuses what would pass the cap and stays reached. Inside a real
OpenEvolve 0.4.1 run: tests/test_openevolve_surrogate.py."""

import json
import multiprocessing as mp
from pathlib import Path

import pytest

from gfsim.core.errors import GfsimError
from gfsim.integrations.cap import CapReached, DollarCap
from gfsim.replay_logs import load_log


def _records(cap: DollarCap) -> list[dict]:
    return [json.loads(line) for line in Path(cap.ledger).read_text().splitlines()]


def test_work_in_flight_counts_and_a_refusal_stops_everything_after_it(tmp_path):
    cap = DollarCap(1.0, tmp_path / "ledger.jsonl", gpu_usd_per_hour=3600.0)  # $1 a second
    a = cap.reserve("evaluation", 0.4, "a")
    b = cap.reserve("proposal", 0.4, "b")  # 0.8 in flight
    with pytest.raises(CapReached, match=r"\$0.8000 in flight"):
        cap.reserve("forecast", 0.3, "c")
    cap.settle(a, 0.1, seconds=0.1)
    cap.settle(b, 0.1)
    st = cap.status()
    assert st["spent_usd"] == pytest.approx(0.2) and st["in_flight_usd"] == 0
    assert st["settled"]["evaluation"] == pytest.approx(0.1)
    # $0.8 are left now, but the cap was reached: nothing starts any more
    with pytest.raises(CapReached):
        cap.reserve("proposal", 0.01)
    assert [r["kind"] for r in _records(cap)].count("reached") == 1
    assert st["reached"]["what"] == "forecast"
    assert cap.eval_usd(0.5) == pytest.approx(0.5)
    assert cap.eval_reservation() == pytest.approx(0.1)  # the longest evaluation so far


def test_bad_caps_and_a_foreign_ledger_are_refused(tmp_path):
    for bad in (0, -1, float("inf")):
        with pytest.raises(GfsimError, match="usd must be"):
            DollarCap(bad, tmp_path / "l.jsonl")
    with pytest.raises(GfsimError, match=">= 0"):
        DollarCap(1.0, tmp_path / "l.jsonl", gpu_usd_per_hour=-1)
    other = tmp_path / "other.jsonl"
    other.write_text("not json\n")
    with pytest.raises(GfsimError, match="other.jsonl:1"):
        DollarCap(1.0, other).status()


def _grab(args) -> int:
    cap, n = args
    got = 0
    for _ in range(n):
        try:
            ticket = cap.reserve("evaluation", 1.0)
        except CapReached:
            break
        cap.settle(ticket, 1.0, seconds=1.0)
        got += 1
    return got


def test_the_ledger_read_as_it_grows_is_the_ledger_read_whole(tmp_path):
    """Each reservation folds in only the lines appended since the last read (this process's
    reading is kept); what it finds equals a reading of the whole file, written by another
    process or by this one, and a ledger replaced by another is read afresh."""
    import gfsim.integrations.cap as capmod

    path = tmp_path / "ledger.jsonl"
    cap = DollarCap(100.0, path, gpu_usd_per_hour=3600.0)
    for k in range(30):
        t = cap.reserve("evaluation" if k % 3 else "proposal", 0.5, f"w{k}")
        if k % 4:  # (some stay in flight)
            cap.settle(t, 0.25, seconds=0.1 * k if k % 3 else None)
        if k % 7 == 0:  # another process's reading of the same file, from scratch
            here = cap.status()
            capmod._LEDGERS.clear()
            assert cap.status() == here
    whole = cap.status()
    assert capmod._LEDGERS[str(path.resolve())].offset == path.stat().st_size
    capmod._LEDGERS.clear()
    assert cap.status() == whole and whole["in_flight"] == 8
    assert whole["longest_evaluation_s"] == pytest.approx(2.9)
    # replaced by a ledger of its own (another inode): read afresh, not appended to the old
    fresh = tmp_path / "fresh.jsonl"
    DollarCap(100.0, fresh).settle(DollarCap(100.0, fresh).reserve("proposal", 1.0), 0.5)
    fresh.replace(path)
    assert cap.status()["spent_usd"] == pytest.approx(0.5)


def test_processes_sharing_a_cap_never_pass_it(tmp_path):
    cap = DollarCap(15.0, tmp_path / "ledger.jsonl")
    with mp.get_context("fork").Pool(4) as pool:  # (spawn cannot import this test file)
        got = pool.map(_grab, [(cap, 10)] * 4)
    assert sum(got) == 15
    assert cap.status()["spent_usd"] == pytest.approx(15.0)


def test_an_llm_call_settles_its_usage_else_its_reservation(tmp_path):
    """``llm_call``, which OpenEvolve's capped client, the surrogate's forecasts and the cap
    proxy share: the usage reported where there is one, the reservation where there is none or
    the call failed, and no ticket at all where the cap refuses."""
    cap = DollarCap(6.0, tmp_path / "ledger.jsonl", generator_usd_per_m=(1e4, 1e6))
    # 30 bytes of prompt: 30 + TEMPLATE_TOKENS (64) tokens in at $0.01, 2 out at $1
    assert cap.llm_reserve("generator", 30, 2) == pytest.approx(2.94)
    with cap.llm_call("generator", 30, 2, "a") as bill:
        bill.usd = cap.usage_usd("generator", {"prompt_tokens": 5, "completion_tokens": 1})
    with cap.llm_call("generator", 3, 1, "b"):
        pass  # no usage reported: its reservation, $1.67
    with pytest.raises(RuntimeError), cap.llm_call("generator", 3, 1, "c"):
        raise RuntimeError("the server went away")  # failed: its reservation too
    closed = [r["usd"] for r in _records(cap) if r["kind"] == "close"]
    assert closed == pytest.approx([1.05, 1.67, 1.67])  # then $4.39 + $2.94 would pass $6
    with pytest.raises(CapReached), cap.llm_call("generator", 30, 2, "d"):
        raise AssertionError("a refused call never starts")
    assert cap.status()["in_flight"] == 0 and cap.usage_usd("generator", None) is None
    assert [r["what"] for r in _records(cap) if r["kind"] == "open"] == ["proposal"] * 3


def test_the_surrogate_s_forecasts_are_held_to_the_cap(tmp_path):
    """A forecast reserves its prompt at the forecaster's prices and settles the tokens it
    reported; once the cap refuses one, the program is skipped with the cap as its reason."""
    from gfsim.integrations.openevolve import Surrogate
    from gfsim.live.llm.forecaster import Forecast, Forecaster

    class Fixed(Forecaster):
        name, mode, max_tokens = "fixed", "logprobs", 10
        prompt_overhead_bytes = 0  # its prompt is the code, the reference and the task

        def forecast(self, request):
            return Forecast(candidate_id=request.candidate_id, forecaster=self.name,
                            mode=self.mode, probs=[0.0] * 7 + [1.0], input_tokens=100,
                            output_tokens=2)

    # $0.01 a forecast token: a forecast of a program and the reference, 120 bytes each, and
    # no task, reserves 3 x 16 + 240 + 64 tokens in and 10 out ($3.62) and settles the 102 it
    # reported ($1.02)
    cap = DollarCap(6.0, tmp_path / "ledger.jsonl", forecaster_usd_per_m=(1e4, 1e4),
                    gpu_usd_per_hour=0.0)
    gate = Surrogate(lambda path: {"runtime_ns": 1.0}, runtime_metric="runtime_ns",
                     policy="threshold:0.5", forecaster=Fixed(), log=tmp_path / "log.jsonl",
                     cap=cap)
    outs = []
    for i in range(5):
        program = tmp_path / f"p{i}.py"
        program.write_text(f"x = {i}\n" * 20)
        outs.append(gate.stage1(program))
    closed = {r["id"]: r["usd"] for r in _records(cap) if r["kind"] == "close"}
    forecasts = [r for r in _records(cap) if r["kind"] == "open" and r["what"] == "forecast"]
    assert [r["usd"] for r in forecasts] == pytest.approx([3.62] * len(forecasts))
    assert all(closed[r["id"]] == pytest.approx(1.02) for r in forecasts)
    # the first program is the reference (no forecast); after three forecasts ($3.06) a fourth
    # would pass $6.00: the fifth program is skipped with the cap as its reason
    assert len(forecasts) == 3
    skipped = [getattr(o, "metrics", o).get("gfsim_skipped", False) for o in outs]
    assert skipped == [False] * 4 + [True]
    last = load_log(tmp_path / "log.jsonl").decisions.iloc[-1]
    assert last["action"] == "skip" and "dollar cap" in last["reason"]


def test_a_run_resumed_with_a_larger_cap_goes_on_from_what_was_spent(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    first = DollarCap(1.0, ledger)
    first.settle(first.reserve("evaluation", 0.7), 0.7, seconds=1.0)
    with pytest.raises(CapReached):
        first.reserve("proposal", 0.5)
    larger = DollarCap(2.0, ledger)  # the same ledger: $0.70 spent, the $1 cap's refusal
    assert larger.status()["reached"] is None and larger.status()["spent_usd"] == 0.7
    larger.settle(larger.reserve("proposal", 0.5), 0.5)
    with pytest.raises(CapReached, match=r"\$2 is reached: \$1.2000 spent"):
        larger.reserve("proposal", 0.9)
    # a cap stays reached for the dollars it was reached at and less
    with pytest.raises(CapReached, match=r"\$1 is reached"):
        DollarCap(1.0, ledger).reserve("proposal", 0.01)
    with pytest.raises(CapReached, match=r"\$2 is reached"):
        DollarCap(1.5, ledger).reserve("proposal", 0.01)


def test_a_prompt_s_reservation_bounds_its_tokens():
    """A prompt is reserved at a token per UTF-8 byte plus the chat template's tokens
    (``chat_bytes``, ``TEMPLATE_TOKENS``): more than any byte-falling-back tokenizer makes of
    it, whatever the script. Checked here with tiktoken's byte-level BPE where it is installed
    (it is with vLLM's and OpenAI's clients), and for gfsim's own forecast prompts, whose text
    besides the code, the reference and the task stays within PROMPT_TEMPLATE_BYTES."""
    from gfsim.integrations.cap import MESSAGE_TOKENS, chat_bytes, text_bytes
    from gfsim.live.llm.forecaster import ForecastRequest
    from gfsim.live.llm.prompt import PROMPT_TEMPLATE_BYTES, label_messages, tool_messages

    texts = ["def softmax(x):\n    return x.exp() / x.exp().sum()\n", "日本語のカーネル " * 40,
             "émigré naïve café " * 50, "🚀" * 100, "\t \n" * 200]
    for t in texts:
        assert chat_bytes([t]) == text_bytes(t) + MESSAGE_TOKENS >= len(t)
    try:
        import tiktoken
    except ImportError:
        tiktoken = None
    if tiktoken is not None:
        try:
            enc = tiktoken.get_encoding("cl100k_base")
        except Exception:  # noqa: BLE001 - its tables are downloaded on first use
            enc = None
        for t in texts if enc is not None else ():
            assert len(enc.encode(t)) <= text_bytes(t)
    code, reference, task = "x = 1\n" * 50, "y = 2\n" * 40, "softmax over the rows"
    request = ForecastRequest(candidate_id="c", candidate_code=code, reference_code=reference,
                              task=task, hardware={"device_name": "NVIDIA H100 80GB HBM3"},
                              search_id="s", task_name="softmax")
    for messages in (tool_messages(request), label_messages(request, list("12345678"))):
        around = sum(text_bytes(m["content"]) for m in messages) - sum(
            text_bytes(x) for x in (code, reference, task))
        assert 0 < around <= PROMPT_TEMPLATE_BYTES
