"""Per-call cost of an OpenAI Agents SDK function tool on a no-op tool.

The tool is made with `@function_tool` (the SDK derives its strict JSON schema and a pydantic
model from the signature) and invoked the way the SDK's runner invokes it, without a model:
`FunctionTool.on_invoke_tool(ToolContext, arguments_json)`. The SDK's runner calls the tools of
one model response concurrently with asyncio, so the round shape gathers 64 such invocations.

The ToolContext of each call and the argument strings are built before timing (they stand for
what the runner has in hand when a model response arrives), so the SDK's own per-call work is
what is measured: parsing and validating the JSON arguments, calling the function and
serializing its result.
"""

from __future__ import annotations

import asyncio
import json

from agents import function_tool
from agents.tool_context import ToolContext

from timing import CALLS_PER_BATCH, ROUND_CALLS, measure_async, report


async def noop_fn(x: int) -> dict:
    return {"x": x}


@function_tool
async def noop(x: int) -> dict:
    """Returns its argument."""
    return {"x": x}


@function_tool
async def find_restaurants(
    location: str, food_type: str, number: int, dietary_requirements: list[str] | None = None
) -> dict:
    """Locate nearby restaurants based on location and food preferences.

    Args:
        location: The specific location or area.
        food_type: The type of food preferred.
        number: Number of results to return.
        dietary_requirements: Special dietary requirements, e.g. vegan, gluten-free.
    """
    return {
        "location": location,
        "food_type": food_type,
        "number": number,
        "dietary_requirements": dietary_requirements,
    }


def catalog_invocation(i: int) -> tuple[ToolContext, str]:
    """The BFCL case `multiple_115`'s ground-truth call, as ring0's bench sends it."""
    args = json.dumps(
        {
            "location": "Manhattan",
            "food_type": "Thai",
            "number": i % 50 + 1,
            "dietary_requirements": ["vegan", f"v{i}"],
        }
    )
    ctx = ToolContext(
        context=None, tool_name="find_restaurants", tool_call_id=f"call_{i}", tool_arguments=args
    )
    return ctx, args


def invocation(i: int) -> tuple[ToolContext, str]:
    args = json.dumps({"x": i})
    ctx = ToolContext(context=None, tool_name="noop", tool_call_id=f"call_{i}", tool_arguments=args)
    return ctx, args


def check(out: object, x: int) -> None:
    if out != {"x": x} and out != json.dumps({"x": x}):
        raise SystemExit(f"the function tool returned {out!r} for x={x}")


def main() -> None:
    def direct_inputs(b: int) -> list[int]:
        base = b * CALLS_PER_BATCH * 50
        return list(range(base, base + CALLS_PER_BATCH * 50))

    async def direct_batch(xs: list[int]) -> int:
        for x in xs:
            await noop_fn(x)
        return len(xs)

    direct = measure_async("direct: the tool function awaited", direct_inputs, direct_batch)

    def inputs(b: int) -> list[tuple[int, ToolContext, str]]:
        base = b * CALLS_PER_BATCH
        return [(i, *invocation(i)) for i in range(base, base + CALLS_PER_BATCH)]

    async def one_by_one(batch: list[tuple[int, ToolContext, str]]) -> int:
        for i, ctx, args in batch:
            check(await noop.on_invoke_tool(ctx, args), i)
        return len(batch)

    async def gathered(batch: list[tuple[int, ToolContext, str]]) -> int:
        for r in range(0, len(batch), ROUND_CALLS):
            part = batch[r : r + ROUND_CALLS]
            outs = await asyncio.gather(*(noop.on_invoke_tool(ctx, args) for _, ctx, args in part))
            for (i, _, _), out in zip(part, outs, strict=True):
                check(out, i)
        return len(batch)

    single = [measure_async("FunctionTool.on_invoke_tool, one call at a time", inputs, one_by_one)]
    rounds = [
        measure_async(
            f"FunctionTool.on_invoke_tool, {ROUND_CALLS} calls gathered",
            inputs,
            gathered,
        )
    ]
    def catalog_inputs(b: int) -> list[tuple[int, ToolContext, str]]:
        base = b * CALLS_PER_BATCH
        return [(i, *catalog_invocation(i)) for i in range(base, base + CALLS_PER_BATCH)]

    async def catalog_one_by_one(batch: list[tuple[int, ToolContext, str]]) -> int:
        for i, ctx, args in batch:
            out = await find_restaurants.on_invoke_tool(ctx, args)
            if "Manhattan" not in str(out):
                raise SystemExit(f"find_restaurants returned {out!r} for call {i}")
        return len(batch)

    catalog = measure_async(
        "find_restaurants (BFCL multiple_115), one call at a time",
        catalog_inputs,
        catalog_one_by_one,
    )
    report("openai_agents", direct, single, rounds)
    print(catalog.line())
    print(f"openai_agents_us_per_call_catalog={catalog.median_us:.3f}")
    print(f"openai_agents_cpu_us_per_call_catalog={catalog.cpu_median_us:.3f}")


if __name__ == "__main__":
    main()
