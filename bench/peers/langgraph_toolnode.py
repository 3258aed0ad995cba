"""Per-call cost of LangGraph's ToolNode on a no-op tool.

The node is invoked the way a graph invokes it, without a model: its input is an AIMessage that
holds the tool calls, and the config carries the LangGraph Runtime the node needs (outside a
compiled graph it must be supplied by the caller). The message is built before timing, so the
node's own work is what is measured: reading the calls, validating arguments against the tool's
schema, running the tool and wrapping the results as ToolMessages.

Both tool flavours are measured: an async tool through `ainvoke` and a sync tool through
`invoke` (which runs calls on a thread pool). The faster is the figure compared.
"""

from __future__ import annotations

import asyncio

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.prebuilt import ToolNode
from langgraph.runtime import Runtime

from timing import CALLS_PER_BATCH, ROUND_CALLS, measure_async, measure_sync, report

# The key under which a compiled graph hands the node its Runtime.
CONFIG_KEY_RUNTIME = "__pregel_runtime"


async def noop_fn(x: int) -> dict:
    return {"x": x}


@tool
async def noop(x: int) -> dict:
    """Returns its argument."""
    return {"x": x}


@tool("noop")
def noop_sync(x: int) -> dict:
    """Returns its argument."""
    return {"x": x}


def message(first: int, n: int) -> dict:
    calls = [
        {"name": "noop", "args": {"x": i}, "id": f"call_{i}", "type": "tool_call"}
        for i in range(first, first + n)
    ]
    return {"messages": [AIMessage(content="", tool_calls=calls)]}


def batches(per_round: int):
    def make(b: int) -> list[dict]:
        base = b * CALLS_PER_BATCH
        return [message(base + r * per_round, per_round) for r in range(CALLS_PER_BATCH // per_round)]

    return make


def check(out: dict, n: int) -> None:
    msgs = out["messages"]
    if len(msgs) != n or any(not isinstance(m, ToolMessage) or m.status != "success" for m in msgs):
        raise SystemExit(f"ToolNode did not return {n} successful ToolMessages: {msgs!r}")


def main() -> None:
    config = {"configurable": {CONFIG_KEY_RUNTIME: Runtime()}}
    async_node = ToolNode([noop])
    sync_node = ToolNode([noop_sync])

    def direct_inputs(b: int) -> list[int]:
        base = b * CALLS_PER_BATCH * 50
        return list(range(base, base + CALLS_PER_BATCH * 50))

    async def direct_batch(xs: list[int]) -> int:
        for x in xs:
            await noop_fn(x)
        return len(xs)

    direct = measure_async("direct: the tool function awaited", direct_inputs, direct_batch)

    def async_runner(per_round: int):
        async def run(inputs: list[dict]) -> int:
            for inp in inputs:
                check(await async_node.ainvoke(inp, config), per_round)
            return len(inputs) * per_round

        return run

    def sync_runner(per_round: int):
        def run(inputs: list[dict]) -> int:
            for inp in inputs:
                check(sync_node.invoke(inp, config), per_round)
            return len(inputs) * per_round

        return run

    single = [
        measure_async("ToolNode.ainvoke, async tool, one call per message", batches(1), async_runner(1)),
        measure_sync("ToolNode.invoke, sync tool, one call per message", batches(1), sync_runner(1)),
    ]
    rounds = [
        measure_async(
            f"ToolNode.ainvoke, async tool, {ROUND_CALLS} calls per message",
            batches(ROUND_CALLS),
            async_runner(ROUND_CALLS),
        ),
        measure_sync(
            f"ToolNode.invoke, sync tool, {ROUND_CALLS} calls per message",
            batches(ROUND_CALLS),
            sync_runner(ROUND_CALLS),
        ),
    ]
    report("langgraph", direct, single, rounds)


if __name__ == "__main__":
    main()
