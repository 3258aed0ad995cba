"""LangGraph with `Ring0ToolNode` in `ToolNode`'s place, a scripted agent node (no LLM) and a
checkpointer, so a step can really be re-run from its checkpoint."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode, tools_condition  # noqa: E402

from ring0.adapters.langgraph import Ring0ToolNode  # noqa: E402


def make_tools(effects):
    @tool
    def lookup(order: str) -> str:
        """Looks an order up."""
        return f"order {order}: shipped"

    @tool
    def refund(order: str, cents: int) -> str:
        """Refunds an order."""
        effects.record(f"refund:{order}:{cents}")
        return f"refunded {cents}"

    @tool
    def close_account(user: str) -> str:
        """Closes an account for good."""
        effects.record(f"close:{user}")
        return f"closed {user}"

    return [lookup, refund, close_account]


METADATA = {
    "lookup": {"effect": "read"},
    "refund": {"effect": "write", "settlement": "idempotency_key"},
    "close_account": {"effect": "write", "authority": "A3"},
}


def graph(node, script):
    """agent → tools → agent …: the agent node answers with the next scripted message."""
    steps = list(script)

    def agent(state: MessagesState) -> dict:
        step = steps.pop(0)
        if isinstance(step, str):
            return {"messages": [AIMessage(content=step)]}
        return {"messages": [AIMessage(content="", tool_calls=[
            {"name": n, "args": a, "id": cid, "type": "tool_call"} for cid, n, a in step])]}

    b = StateGraph(MessagesState)
    b.add_node("agent", agent)
    b.add_node("tools", node)
    b.add_edge(START, "agent")
    b.add_conditional_edges("agent", tools_condition)
    b.add_edge("tools", "agent")
    return b.compile(checkpointer=InMemorySaver())


def tool_messages(state) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def test_it_is_a_tool_node(tmp_path, effects) -> None:
    node = Ring0ToolNode(make_tools(effects), state_dir=tmp_path / "s", metadata=METADATA)
    assert isinstance(node, ToolNode)
    assert set(node.tools_by_name) == {"lookup", "refund", "close_account"}


def test_a_validation_error_goes_back_to_the_model_to_correct(tmp_path, effects) -> None:
    node = Ring0ToolNode(make_tools(effects), state_dir=tmp_path / "s", metadata=METADATA)
    g = graph(node, [
        [("c1", "refund", {"order": "A", "cents": "lots"}), ("c2", "lookup", {"order": "A"})],
        [("c3", "refund", {"order": "A", "cents": 100})],
        "done",
    ])
    state = g.invoke({"messages": [HumanMessage("refund A")]}, {"configurable": {"thread_id": "t"}})
    msgs = tool_messages(state)
    assert [m.tool_call_id for m in msgs] == ["c1", "c2", "c3"]
    assert msgs[0].status == "error"
    error = json.loads(msgs[0].content)
    assert error["status"] == "validation_error" and error["errors"][0]["loc"] == "/cents"
    assert msgs[1].content == "order A: shipped" and msgs[1].status == "success"
    assert msgs[2].content == "refunded 100"
    assert effects.lines() == ["refund:A:100"]


def test_a_call_held_for_approval_then_runs(tmp_path, effects) -> None:
    node = Ring0ToolNode(make_tools(effects), state_dir=tmp_path / "s", metadata=METADATA)
    step = [("c1", "close_account", {"user": "mallory"})]
    g = graph(node, [step, "waiting", step, "done"])
    config = {"configurable": {"thread_id": "t"}}
    state = g.invoke({"messages": [HumanMessage("close it")]}, config)
    held = tool_messages(state)[-1]
    assert held.status == "error" and json.loads(held.content)["status"] == "approval_required"
    assert effects.count() == 0
    [pending] = node.session.pending_approvals()
    node.session.approve(pending["id"])
    state = g.invoke({"messages": [HumanMessage("approved, go on")]}, config)
    assert tool_messages(state)[-1].content == "closed mallory"
    assert effects.lines() == ["close:mallory"]


def test_a_step_rerun_from_its_checkpoint_does_not_repeat_the_write(tmp_path, effects) -> None:
    node = Ring0ToolNode(make_tools(effects), state_dir=tmp_path / "s", metadata=METADATA)
    g = graph(node, [[("c9", "refund", {"order": "Z", "cents": 7})], "done", "done again"])
    config = {"configurable": {"thread_id": "t"}}
    g.invoke({"messages": [HumanMessage("refund Z")]}, config)
    assert effects.lines() == ["refund:Z:7"]
    # Re-run the graph from the checkpoint just before the tools step (time travel).
    before_tools = next(s for s in g.get_state_history(config) if s.next == ("tools",))
    state = g.invoke(None, before_tools.config)
    assert tool_messages(state)[-1].content == "refunded 7"
    assert effects.lines() == ["refund:Z:7"], "the re-run step was answered from the journal"


def test_the_node_runs_async_too(tmp_path, effects) -> None:
    import asyncio

    node = Ring0ToolNode(make_tools(effects), state_dir=tmp_path / "s", metadata=METADATA)
    g = graph(node, [[("a1", "lookup", {"order": "Q"})], "done"])
    state = asyncio.run(g.ainvoke({"messages": [HumanMessage("q")]}, {"configurable": {"thread_id": "a"}}))
    assert tool_messages(state)[-1].content == "order Q: shipped"
