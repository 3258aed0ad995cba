"""`ring0.Client` against a real `ring0 serve --http`: the host's tools are registered with the
session, run here when ring0 hands their calls back, and mediated like ring0's own."""

from __future__ import annotations

import json
import threading
import time

import pytest
from conftest import openai_turn

import ring0


def tools(effects):
    @ring0.tool(effect="read")
    def lookup(order: str) -> dict:
        """Looks an order up."""
        return {"order": order, "status": "shipped"}

    @ring0.tool(effect="write", settlement="idempotency_key", conflict_key="order:{order}",
                strategy=["exploitation"])
    def refund(order: str, cents: int, ctx: ring0.Context) -> dict:
        """Refunds an order."""
        effects.record(f"refund:{order}:{cents}")
        return {"refunded": cents, "key": ctx["idempotency_key"]}

    @ring0.tool(effect="write", authority="A3")
    async def close_account(user: str) -> str:
        """Closes an account for good."""
        effects.record(f"close:{user}")
        return f"closed {user}"

    return [lookup, refund, close_account]


def body(message: dict) -> dict:
    return json.loads(message["content"])


def test_host_tools_run_here_and_ring0_tools_there(ring0_server, effects) -> None:
    client = ring0.Client(ring0_server)
    with client.session(tools(effects), scope="client-basic") as session:
        names = {t["name"] for t in session.catalog()}
        assert {"lookup", "refund", "read_file"} <= names
        out = session.handle_turn(
            "openai",
            openai_turn(
                ("c1", "lookup", {"order": "A-1"}),
                ("c2", "read_file", {"path": "README.md"}),
            ),
        )
        assert [m["tool_call_id"] for m in out] == ["c1", "c2"]
        assert body(out[0])["outcome"]["observation"]["structured"]["status"] == "shipped"
        assert "hello from the workspace" in out[1]["content"]
        out = session.handle_turn("openai", openai_turn(("c3", "refund", {"order": "A-1", "cents": 500})))
        refund = body(out[0])["outcome"]["observation"]["structured"]
        assert refund["refunded"] == 500 and refund["key"].startswith("r0-")
        assert effects.lines() == ["refund:A-1:500"]


def test_a_validation_error_is_the_models_to_correct(ring0_server, effects) -> None:
    with ring0.Client(ring0_server).session(tools(effects)) as session:
        out = session.handle_turn("openai", openai_turn(("c1", "refund", {"order": "A-1", "cents": "5"})))
        error = body(out[0])
        assert error["status"] == "validation_error"
        assert error["errors"][0]["loc"] == "/cents"
        assert effects.count() == 0
        with pytest.raises(ring0.CallRejected) as e:
            session.call("refund", {"order": 7})
        assert e.value.kind == "validation_error"
        assert {p["loc"] for p in e.value.errors} == {"/order", "/cents"}


def test_a_held_call_is_approved_here_and_then_runs(ring0_server, effects) -> None:
    with ring0.Client(ring0_server).session(tools(effects)) as session:
        turn = openai_turn(("c1", "close_account", {"user": "mallory"}))
        out = session.handle_turn("openai", turn)
        assert body(out[0])["status"] in ("approval_denied", "approval_required")
        assert effects.count() == 0
        [held] = session.pending_approvals()
        assert held["tool"] == "close_account" and held["args"] == {"user": "mallory"}
        session.approve(held["id"])
        out = session.handle_turn("openai", turn)
        assert body(out[0])["outcome"]["observation"]["text"] == "closed mallory"
        assert effects.lines() == ["close:mallory"]


def test_an_approver_decides_remotely_held_calls(ring0_server, effects) -> None:
    asked = []

    def approver(request):
        asked.append(request)
        return request["args"]["user"] == "bob"

    with ring0.Client(ring0_server).session(tools(effects), approver=approver) as session:
        blocks = [
            session.handle_turn(
                "anthropic",
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": f"t{user}", "name": "close_account", "input": {"user": user}},
                ]},
            )["content"][0]
            for user in ("bob", "root")
        ]
        assert [b["is_error"] for b in blocks] == [False, True]
        assert "approval_denied" in json.dumps(blocks[1])
        assert effects.lines() == ["close:bob"]
        assert len(asked) == 2 and all(r["args_hash"] for r in asked)


def test_a_turn_in_flight_is_answered_from_the_journal(ring0_server, effects) -> None:
    """The same turn sent again while its write runs waits for it: the write runs once."""
    gate = threading.Event()

    @ring0.tool(effect="write", settlement="idempotency_key")
    def slow_refund(order: str) -> str:
        effects.record(f"refund:{order}")
        gate.wait(5)
        return "ok"

    client = ring0.Client(ring0_server)
    with client.session([slow_refund], scope="inflight") as session:
        turn = openai_turn(("c1", "slow_refund", {"order": "Z"}))
        results = []
        first = threading.Thread(target=lambda: results.append(session.handle_turn("openai", turn)))
        first.start()
        deadline = time.monotonic() + 30
        while effects.count() == 0:
            assert time.monotonic() < deadline, "the first turn's write never started"
            time.sleep(0.01)
        second_session = client.session([slow_refund], scope="inflight")
        second = threading.Thread(
            target=lambda: results.append(second_session.handle_turn("openai", turn))
        )
        second.start()
        # Let the second turn reach ring0 while the first's write is still running.
        time.sleep(1.0)
        gate.set()
        first.join(10)
        second.join(10)
        second_session.close()
    assert effects.count("refund:Z") == 1
    assert {body(r[0])["outcome"]["observation"]["text"] for r in results} == {"ok"}


def test_refusals_carry_the_apis_envelope(ring0_server) -> None:
    client = ring0.Client(ring0_server)

    @ring0.tool(effect="write", conflict_key="x:{")
    def broken(x: int) -> None:
        return None

    with pytest.raises(ring0.ApiError) as e:
        client.session([broken])
    assert e.value.http_status == 422
    assert e.value.kind == "validation_error"
    assert e.value.errors[0]["loc"] == "/tools/0/conflict_key"
    with pytest.raises(ring0.ApiError) as e:
        client.session(mode="chaotic")
    assert e.value.errors[0]["loc"].startswith("/mode")
    session = client.session()
    with pytest.raises(ring0.ApiError) as e:
        session.handle_turn("openai", {"role": "assistant", "tool_calls": [{"id": 3}]})
    assert e.value.kind == "invalid_turn"
    session.close()
    with pytest.raises(ring0.ApiError) as e:
        session.handle_turn("openai", openai_turn(("c", "lookup", {})))
    assert e.value.http_status == 404 and e.value.kind == "not_found"


def test_events_stream_from_the_server(ring0_server, effects) -> None:
    with ring0.Client(ring0_server).session(tools(effects)) as session:
        stream = session.events()
        session.handle_turn("openai", openai_turn(("c1", "lookup", {"order": "B"})))
        seen = []
        for event in stream:
            seen.append(event["event"])
            if event["event"] == "turn_finished":
                break
        assert "round_started" in seen and "call_finished" in seen
