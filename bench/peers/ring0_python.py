"""Per-call cost of ring0's Python package on a no-op tool, through `Session.handle_turn`.

The tool is a function decorated with `@ring0.tool(effect="read")` (its schema derived from the
signature), registered in a `ring0.Kernel` over a fresh state directory (SQLite journal, audit
log of every decision but allowed reads, as by default), and called the way a host hands ring0 a model turn: an OpenAI Chat
Completions assistant message (a dict, built before timing, as the peers' inputs are) goes to
`session.handle_turn("openai", message)`, which returns the tool-result messages. Every call goes
through ring0's whole pipeline: parse, validate against the closed schema, authorize (grants,
audit record), plan, dispatch, shape and project the result, render the messages.

Shapes, as the peers': one call per turn, 64 calls per turn, and the BFCL `multiple_115` tool.
"""

from __future__ import annotations

import json
import tempfile

import ring0

from timing import CALLS_PER_BATCH, ROUND_CALLS, measure_sync, report


def noop_fn(x: int) -> dict:
    return {"x": x}


@ring0.tool(effect="read")
def noop(x: int) -> dict:
    """Returns its argument."""
    return {"x": x}


@ring0.tool(effect="read")
def find_restaurants(
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


def message(first: int, n: int) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": "noop", "arguments": json.dumps({"x": i})}}
            for i in range(first, first + n)
        ],
    }


def catalog_message(i: int) -> dict:
    args = {"location": "Manhattan", "food_type": "Thai", "number": i % 50 + 1,
            "dietary_requirements": ["vegan", f"v{i}"]}
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{i}", "type": "function",
         "function": {"name": "find_restaurants", "arguments": json.dumps(args)}}]}


def check(out: list, n: int) -> None:
    if len(out) != n or any('"kind":"completed"' not in m["content"] for m in out):
        raise SystemExit(f"ring0 did not return {n} completed results: {out[:1]!r}")


def main() -> None:
    kernel = ring0.Kernel(tempfile.mkdtemp(prefix="ring0-bench-"), [noop, find_restaurants])
    session = kernel.session("bench")
    # Every decision in the audit log, reads' too: a file write per call.
    quiet = ring0.Kernel(tempfile.mkdtemp(prefix="ring0-bench-"), [noop], audit="all")
    quiet_session = quiet.session("bench")

    def direct_inputs(b: int) -> list[int]:
        base = b * CALLS_PER_BATCH * 50
        return list(range(base, base + CALLS_PER_BATCH * 50))

    def direct_batch(xs: list[int]) -> int:
        for x in xs:
            noop_fn(x)
        return len(xs)

    direct = measure_sync("direct: the tool function called", direct_inputs, direct_batch)

    def batches(per_round: int):
        def make(b: int) -> list[dict]:
            base = b * CALLS_PER_BATCH
            return [message(base + r * per_round, per_round) for r in range(CALLS_PER_BATCH // per_round)]

        return make

    def runner(s: ring0.Session, per_round: int):
        handle = s.handle_turn

        def run(inputs: list[dict]) -> int:
            for m in inputs:
                check(handle("openai", m), per_round)
            return len(inputs) * per_round

        return run

    single = [measure_sync("Session.handle_turn, one call per turn", batches(1), runner(session, 1))]
    quiet_single = measure_sync(
        "Session.handle_turn, one call per turn, audit=\"all\"", batches(1), runner(quiet_session, 1)
    )
    rounds = [
        measure_sync(
            f"Session.handle_turn, {ROUND_CALLS} calls per turn",
            batches(ROUND_CALLS),
            runner(session, ROUND_CALLS),
        )
    ]

    def catalog_inputs(b: int) -> list[dict]:
        base = b * CALLS_PER_BATCH
        return [catalog_message(i) for i in range(base, base + CALLS_PER_BATCH)]

    def catalog_batch(inputs: list[dict]) -> int:
        for m in inputs:
            check(session.handle_turn("openai", m), 1)
        return len(inputs)

    catalog = measure_sync(
        "find_restaurants (BFCL multiple_115), one call per turn", catalog_inputs, catalog_batch
    )
    report("ring0_python", direct, single, rounds)
    print(quiet_single.line())
    print(f"ring0_python_us_per_call_audit_all={quiet_single.median_us:.3f}")
    print(f"ring0_python_cpu_us_per_call_audit_all={quiet_single.cpu_median_us:.3f}")
    print(catalog.line())
    print(f"ring0_python_us_per_call_catalog={catalog.median_us:.3f}")
    print(f"ring0_python_cpu_us_per_call_catalog={catalog.cpu_median_us:.3f}")


if __name__ == "__main__":
    main()
