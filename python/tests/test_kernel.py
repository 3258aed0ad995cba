"""The kernel in process: every call of a turn goes through validation, grants, approvals, the
journal and replay; results come back in the turn's format."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import content, observed, openai_turn

import ring0


def make_tools(effects):
    @ring0.tool(effect="read")
    def get_weather(city: str) -> dict:
        """Current temperature of a city."""
        return {"city": city, "celsius": 21}

    @ring0.tool(effect="write", settlement="idempotency_key")
    def send_invoice(to: str, amount: int, ctx: ring0.Context) -> dict:
        """Sends an invoice."""
        effects.record(f"invoice:{to}:{amount}")
        return {"invoice": f"INV-{to}", "key": ctx["idempotency_key"]}

    @ring0.tool(effect="write", authority="A3")
    def delete_account(user: str) -> str:
        """Deletes an account: cannot be undone."""
        effects.record(f"delete:{user}")
        return f"deleted {user}"

    return [get_weather, send_invoice, delete_account]


def test_a_validation_error_comes_back_for_the_model_to_correct(state_dir, effects) -> None:
    session = ring0.Kernel(state_dir, make_tools(effects)).session("t")
    out = session.handle_turn(
        "openai",
        openai_turn(
            ("call_1", "get_weather", {"city": "Paris"}),
            ("call_2", "send_invoice", {"to": "acme", "amount": "ten", "cc": "x"}),
        ),
    )
    assert [m["tool_call_id"] for m in out] == ["call_1", "call_2"]
    assert observed(out[0]) == {"city": "Paris", "celsius": 21}
    error = content(out[1])
    assert error["status"] == "validation_error"
    locs = sorted(e["loc"] for e in error["errors"])
    assert locs == ["/amount", "/cc"], "every error, located"
    assert effects.count() == 0, "a refused call never runs"
    # The model corrects itself and the call runs.
    out = session.handle_turn(
        "openai", openai_turn(("call_3", "send_invoice", {"to": "acme", "amount": 10}))
    )
    assert observed(out[0])["invoice"] == "INV-acme"
    assert effects.lines() == ["invoice:acme:10"]


def test_session_call_raises_the_envelope(state_dir, effects) -> None:
    session = ring0.Kernel(state_dir, make_tools(effects)).session("t")
    assert session.call("get_weather", {"city": "Oslo"})["outcome"]["observation"]["structured"]["city"] == "Oslo"
    with pytest.raises(ring0.CallRejected) as e:
        session.call("get_weather", {"town": "Oslo"})
    assert e.value.kind == "validation_error"
    assert {p["loc"] for p in e.value.errors} == {"/town", "/city"}
    with pytest.raises(ring0.CallRejected) as e:
        session.call("no_such_tool", {})
    assert e.value.kind == "unknown_tool"


def test_a_mutating_call_rerun_in_the_same_turn_does_not_repeat_its_effect(state_dir, effects) -> None:
    kernel = ring0.Kernel(state_dir, make_tools(effects))
    session = kernel.session("order-1")
    turn = openai_turn(("call_9", "send_invoice", {"to": "acme", "amount": 5}))
    first = session.handle_turn("openai", turn)
    again = session.handle_turn("openai", turn)
    assert effects.count("invoice:acme:5") == 1
    assert observed(again[0]) == observed(first[0])
    assert content(again[0])["disposition"] == "replayed"
    # A new session of the same scope (a restarted step) gets the recorded result too.
    again = kernel.session("order-1").handle_turn("openai", turn)
    assert content(again[0])["disposition"] == "replayed"
    assert effects.count() == 1
    # A genuinely new call (a new call id) with the same arguments runs: its predecessor's
    # result was delivered.
    session.handle_turn("openai", openai_turn(("call_10", "send_invoice", {"to": "acme", "amount": 5})))
    assert effects.count("invoice:acme:5") == 2


def test_the_journal_outlives_the_process(state_dir, effects, tmp_path) -> None:
    """The same turn re-run by a new process over the same state directory is answered from
    the journal: the write ran once."""
    script = tmp_path / "step.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            import ring0
            from conftest import Effects, openai_turn
            from test_kernel import make_tools
            effects = Effects.__new__(Effects)
            effects.path = __import__("pathlib").Path({str(effects.path)!r})
            kernel = ring0.Kernel({str(state_dir)!r}, make_tools(effects))
            out = kernel.session("order-7").handle_turn(
                "openai", openai_turn(("call_1", "send_invoice", {{"to": "zed", "amount": 1}})))
            print(json.loads(out[0]["content"])["disposition"])
            """
        )
    )
    runs = [
        subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    assert [r.stdout.strip() for r in runs] == ["dispatched", "replayed"], runs[-1].stderr
    assert effects.count("invoice:zed:1") == 1


def test_a_call_held_for_approval_then_runs(state_dir, effects) -> None:
    session = ring0.Kernel(state_dir, make_tools(effects)).session("t")
    turn = openai_turn(("call_1", "delete_account", {"user": "mallory"}))
    events = session.events()
    out = session.handle_turn("openai", turn)
    held = content(out[0])
    assert held["status"] == "approval_required"
    assert effects.count() == 0
    assert any(e["event"] == "approval_required" for e in events)
    [pending] = session.pending_approvals()
    assert pending["tool"] == "delete_account"
    assert pending["args"] == {"user": "mallory"}
    assert pending["args_hash"]
    session.approve(pending["id"])
    assert session.pending_approvals() == []
    out = session.handle_turn("openai", turn)
    assert observed(out[0]) == "deleted mallory"
    assert effects.lines() == ["delete:mallory"]
    # The approval was for that call only.
    out = session.handle_turn("openai", openai_turn(("call_2", "delete_account", {"user": "eve"})))
    assert content(out[0])["status"] == "approval_required"
    with pytest.raises(ring0.NotFound) as e:
        session.approve("ap_nope")
    assert e.value.kind == "not_found"


def test_a_denied_call_tells_the_model_why(state_dir, effects) -> None:
    session = ring0.Kernel(state_dir, make_tools(effects)).session("t")
    turn = openai_turn(("call_1", "delete_account", {"user": "bob"}))
    session.handle_turn("openai", turn)
    [pending] = session.pending_approvals()
    session.deny(pending["id"], "not on a Friday")
    out = content(session.handle_turn("openai", turn)[0])
    assert out["status"] == "approval_denied"
    assert "not on a Friday" in out["message"]
    assert effects.count() == 0


def test_an_approver_callback_decides_while_the_call_waits(state_dir, effects) -> None:
    asked = []

    def approver(request):
        asked.append(request)
        return request["args"]["user"] != "root"

    session = ring0.Kernel(state_dir, make_tools(effects), approver=approver).session("t")
    blocks = []
    for user in ("bob", "root"):
        out = session.handle_turn(
            "anthropic",
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": f"t-{user}", "name": "delete_account", "input": {"user": user}},
            ]},
        )
        assert out["role"] == "user"
        blocks += out["content"]
    assert [b["is_error"] for b in blocks] == [False, True]
    assert json.loads(blocks[1]["content"])["status"] == "approval_denied"
    assert effects.lines() == ["delete:bob"]
    assert {r["tool"] for r in asked} == {"delete_account"}
    assert all("summary" in r and r["reason"] for r in asked)


def test_wait_mode_is_decided_from_another_thread(state_dir, effects) -> None:
    kernel = ring0.Kernel(state_dir, make_tools(effects), approvals="wait")
    session = kernel.session("t")

    def decide() -> None:
        deadline = time.monotonic() + 10
        while not kernel.pending_approvals():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        kernel.approve(kernel.pending_approvals()[0]["id"])

    t = threading.Thread(target=decide)
    t.start()
    out = session.handle_turn("openai", openai_turn(("c1", "delete_account", {"user": "x"})))
    t.join()
    assert observed(out[0]) == "deleted x"


def test_an_unknown_outcome_is_never_run_again_blindly(state_dir, effects) -> None:
    attempts = []

    @ring0.tool(effect="write", settlement="idempotency_key")
    def charge(amount: int) -> dict:
        attempts.append(amount)
        if amount < 0:
            raise ring0.NotApplied("negative amounts are refused")
        raise ConnectionError("the bank hung up")

    session = ring0.Kernel(state_dir, [charge]).session("t")
    refused = content(session.handle_turn("openai", openai_turn(("c1", "charge", {"amount": -1})))[0])
    assert "negative amounts are refused" in json.dumps(refused)
    assert refused["state"] == "FAILED"
    keys = []

    @ring0.tool(effect="write", settlement="idempotency_key")
    def transfer(amount: int, ctx: ring0.Context) -> dict:
        keys.append(ctx["idempotency_key"])
        raise ConnectionError("the bank hung up")

    session = ring0.Kernel(state_dir.with_name("s2"), [transfer]).session("t")
    turn = openai_turn(("c2", "transfer", {"amount": 7}))
    unknown = content(session.handle_turn("openai", turn)[0])
    assert "the bank hung up" in json.dumps(unknown)
    assert unknown["state"] == "DEAD_LETTER", "left for a person once settling failed"
    # Settled by the tool's settlement: sent again only under the same idempotency key.
    assert len(keys) == 2 and len(set(keys)) == 1
    again = content(session.handle_turn("openai", turn)[0])
    assert again["status"] == "intent_conflict"
    assert len(keys) == 2, "never run again blindly"


def test_formats_responses_and_anthropic(state_dir, effects) -> None:
    session = ring0.Kernel(state_dir, make_tools(effects)).session("t")
    out = session.handle_turn(
        "responses",
        {"output": [
            {"type": "function_call", "call_id": "fc_1", "name": "get_weather",
             "arguments": json.dumps({"city": "Rome"})},
        ]},
    )
    assert out[0]["type"] == "function_call_output" and out[0]["call_id"] == "fc_1"
    assert json.loads(out[0]["output"])["outcome"]["observation"]["structured"]["city"] == "Rome"
    detailed = session.handle_turn(
        "anthropic",
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "tu_1", "name": "get_weather", "input": {"city": "Rome"}}]},
        detailed=True,
    )
    assert detailed["message"]["content"][0]["tool_use_id"] == "tu_1"
    assert detailed["results"][0]["is_error"] is False
    assert detailed["receipts"][0]["tool"] == "get_weather"
    assert detailed["terminated"] is None


def test_an_unreadable_turn_raises_the_envelope(state_dir, effects) -> None:
    session = ring0.Kernel(state_dir, make_tools(effects)).session("t")
    with pytest.raises(ring0.InvalidTurn) as e:
        session.handle_turn("openai", {"role": "assistant", "tool_calls": [{"id": "x"}]})
    assert e.value.kind == "invalid_turn"
    assert e.value.errors[0]["loc"].startswith("$.tool_calls[0]")
    with pytest.raises(ring0.InvalidTurn) as e:
        session.handle_turn("gemini", {})
    assert e.value.errors[0]["loc"] == "/format"
    with pytest.raises(ring0.InvalidTurn):
        session.handle_turn("openai", "{not json")
    assert isinstance(e.value, ring0.Ring0Error)


def test_events_are_the_kernels(state_dir, effects) -> None:
    session = ring0.Kernel(state_dir, make_tools(effects)).session("t")
    events = session.events()
    session.handle_turn("openai", openai_turn(("c1", "get_weather", {"city": "Lima"})))
    names = [e["event"] for e in events]
    assert names[0] == "round_started" and names[-1] == "round_finished"
    assert "call_finished" in names
    assert list(events) == [], "iteration ends when no event is left"
    assert events.get(timeout=0.05) is None


def test_async_tools_and_ahandle_turn(state_dir, effects) -> None:
    loops = []
    running = [0, 0]  # now, most at once

    @ring0.tool(effect="read")
    async def slow_echo(text: str) -> str:
        loops.append(asyncio.get_running_loop())
        running[0] += 1
        running[1] = max(running)
        await asyncio.sleep(0.05)
        running[0] -= 1
        return text.upper()

    kernel = ring0.Kernel(state_dir, [slow_echo])
    session = kernel.session("t")
    # Synchronously: on ring0's background loop; the turn's calls overlap.
    out = session.handle_turn(
        "openai", openai_turn(*[(f"c{i}", "slow_echo", {"text": f"x{i}"}) for i in range(4)])
    )
    assert [observed(m) for m in out] == ["X0", "X1", "X2", "X3"]
    assert running[1] > 1, "reads of one turn run at once"

    async def main() -> list:
        out = await session.ahandle_turn("openai", openai_turn(("a1", "slow_echo", {"text": "hi"})))
        assert loops[-1] is asyncio.get_running_loop(), "the caller's loop runs the coroutine"
        return out

    assert observed(asyncio.run(main())[0]) == "HI"


def test_grants_decide_and_rules_see_the_arguments(state_dir, effects) -> None:
    tools = make_tools(effects)
    grants = [
        {"tools": ["get_weather"], "ceiling": "A0", "rules": ["args.city != 'Atlantis'"]},
        {"tools": ["send_invoice"], "ceiling": "A2", "rate": "2/min"},
    ]
    session = ring0.Kernel(state_dir, tools, grants=grants).session("t")
    out = session.handle_turn(
        "openai",
        openai_turn(
            ("c1", "get_weather", {"city": "Atlantis"}),
            ("c2", "delete_account", {"user": "x"}),
        ),
    )
    assert content(out[0])["status"] == "policy_denied"
    assert content(out[1])["status"] == "unknown_tool", "a tool no grant names is not there"
    assert {t["name"] for t in session.catalog()} == {"get_weather", "send_invoice"}


def test_pydantic_arguments_reach_the_function_as_models(state_dir) -> None:
    import pydantic

    class Line(pydantic.BaseModel):
        sku: str
        qty: int = 1

    @ring0.tool(effect="read")
    def price(lines: list[Line]) -> float:
        assert all(isinstance(x, Line) for x in lines)
        return sum(x.qty * 2.5 for x in lines)

    session = ring0.Kernel(state_dir, [price]).session("t")
    out = session.handle_turn("openai", openai_turn(("c", "price", {"lines": [{"sku": "a", "qty": 2}, {"sku": "b"}]})))
    assert observed(out[0]) == 7.5
    bad = content(session.handle_turn("openai", openai_turn(("d", "price", {"lines": [{"qty": 2}]})))[0])
    assert bad["status"] == "validation_error"
    assert bad["errors"][0]["loc"] == "/lines/0/sku"


def test_a_kernel_refuses_a_state_dir_another_process_writes(state_dir) -> None:
    @ring0.tool(effect="read")
    def r(x: int) -> int:
        return x

    kernel = ring0.Kernel(state_dir, [r])
    with pytest.raises(ring0.ConfigError) as e:
        ring0.Kernel(state_dir, [r])
    assert e.value.errors[0]["loc"] == "/state_dir"
    assert Path(kernel.state_dir, "journal.db").exists()
    kernel.session().handle_turn("openai", openai_turn(("c", "r", {"x": 1})))
    # By default an allowed read is not written to the audit log; anything else is.
    assert Path(kernel.state_dir, "audit.jsonl").read_text() == ""


def test_the_audit_log_records_decisions(state_dir, effects) -> None:
    kernel = ring0.Kernel(state_dir, make_tools(effects), audit="all")
    session = kernel.session()
    session.handle_turn("openai", openai_turn(("c1", "get_weather", {"city": "Oslo"})))
    session.handle_turn("openai", openai_turn(("c2", "delete_account", {"user": "x"})))
    audit = [json.loads(line) for line in Path(kernel.state_dir, "audit.jsonl").read_text().splitlines()]
    assert [(a["tool"], a["decision"]) for a in audit] == [
        ("get_weather", "allowed"), ("delete_account", "held"), ("delete_account", "approval_required")]
