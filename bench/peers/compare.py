"""Reads the outputs of the peer benchmarks and of ring0's `mediation` bench and prints ring0's
per-call overhead as a fraction of each peer's, and whether the targets hold.

Targets: ring0's per-call cost, doing its whole pipeline, is at most 1.0x the OpenAI Agents SDK
function-tool path's, for the no-op tool (one call, and a round of 64) and for a tool of a
realistic catalog (BFCL); the older, stricter aim of 1/20 of the fastest peer is printed too.

Usage: compare.py FILE...   (each FILE holds one benchmark's output)
"""

from __future__ import annotations

import re
import sys

TARGET_FRACTION = 1 / 20

PEERS = {
    "langgraph": "LangGraph ToolNode",
    "openai_agents": "OpenAI Agents SDK function tool",
}


def figures(paths: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                m = re.fullmatch(r"([a-z0-9_]+)=([0-9.]+)", line.strip())
                if m:
                    out[m.group(1)] = float(m.group(2))
    return out


def need(values: dict[str, float], key: str) -> float:
    if key not in values:
        sys.exit(f"compare.py: no `{key}=` line in the benchmark outputs")
    return values[key]


def ratio(fraction: float) -> str:
    """`1/12.5` when ring0 is cheaper, `4.5x` when it is dearer."""
    return f"1/{1 / fraction:.1f}" if fraction <= 1 else f"{fraction:.1f}x"


def against_agents_sdk(values: dict[str, float], clock: str, key: str) -> None:
    """ring0 against the Agents SDK by one clock (`key` is its infix in the figures' names)."""
    print()
    print(f"ring0 against the OpenAI Agents SDK by {clock} (target: at most 1.0x)")
    shapes = [
        ("one call", "overhead_us_per_call", "us_per_call"),
        ("64-call round", "overhead_us_per_call_round64", "us_per_call_round64"),
        ("realistic catalog tool", "overhead_us_per_call_catalog", "us_per_call_catalog"),
    ]
    for label, ours, theirs in shapes:
        ours, theirs = f"ring0_{key}{ours}", f"openai_agents_{key}{theirs}"
        if ours not in values or theirs not in values:
            print(f"{label:<28} not measured (no `{ours}=` or `{theirs}=` line)")
            continue
        x = values[ours] / values[theirs]
        verdict = "MET" if x <= 1.0 else "NOT MET"
        print(
            f"{label:<28} ring0 {values[ours]:>8.3f} µs, Agents SDK {values[theirs]:>8.3f} µs: "
            f"{x:.2f}x  {verdict}"
        )


def python_package(values: dict[str, float]) -> None:
    """ring0's Python package (the whole per-call cost of `Session.handle_turn`, tool included)
    against the peers' whole per-call cost. Targets: at most 1.0x the Agents SDK, 1/20 of
    LangGraph's ToolNode."""
    if "ring0_python_us_per_call" not in values:
        return
    print()
    print("ring0's Python package (Session.handle_turn, whole per-call cost) against the peers")
    targets = [("openai_agents", "OpenAI Agents SDK function tool", 1.0, "1.0x"),
               ("langgraph", "LangGraph ToolNode", 1 / 20, "1/20")]
    shapes = [("one call", "us_per_call"), ("64-call round", "us_per_call_round64"),
              ("realistic catalog tool", "us_per_call_catalog")]
    for clock, key in (("wall clock", ""), ("CPU time", "cpu_")):
        print(f"  by {clock}:")
        for label, suffix in shapes:
            ours = values.get(f"ring0_python_{key}{suffix}")
            if ours is None:
                continue
            for peer, name, target, shown in targets:
                theirs = values.get(f"{peer}_{key}{suffix}")
                if theirs is None:
                    continue
                x = ours / theirs
                verdict = "MET" if x <= target else "NOT MET"
                print(f"    {label:<24} ring0 {ours:>8.3f} µs vs {name} {theirs:>8.3f} µs: "
                      f"{x:.3f}x ({ratio(x)})  target {shown}: {verdict}")
                if not key:
                    print(f"ring0_python_vs_{peer}_{suffix}={x:.4f}")


def main() -> None:
    values = figures(sys.argv[1:])
    ring0 = need(values, "ring0_overhead_us_per_call")
    ring0_round = need(values, "ring0_overhead_us_per_call_round64")
    print()
    print("ring0 per-call overhead against its peers (lower fraction is better)")
    print(f"{'':<44} {'one call':>12} {'64-call round':>16}")
    print(f"{'ring0 (overhead, µs/call)':<44} {ring0:>12.3f} {ring0_round:>16.3f}")
    peers = {}
    for key, name in PEERS.items():
        single = need(values, f"{key}_us_per_call")
        round_ = need(values, f"{key}_us_per_call_round64")
        peers[name] = single
        print(f"{name + ' (µs/call)':<44} {single:>12.3f} {round_:>16.3f}")
        print(
            f"{'  ring0 as a fraction of it':<44} {ring0 / single:>12.4f} {ring0_round / round_:>16.4f}"
            f"   ({ratio(ring0 / single)} and {ratio(ring0_round / round_)})"
        )
    fastest_name, fastest = min(peers.items(), key=lambda kv: kv[1])
    fraction = ring0 / fastest
    holds = fraction <= TARGET_FRACTION
    print()
    print(f"fastest peer: {fastest_name}, {fastest:.3f} µs/call")
    print(
        f"target ring0 <= 1/20 of the fastest peer ({fastest * TARGET_FRACTION:.3f} µs/call): "
        f"{'HOLDS' if holds else 'DOES NOT HOLD'} (ring0 is {fraction:.4f} of it: {ratio(fraction)})"
    )
    print(f"ring0_fraction_of_fastest_peer={fraction:.4f}")
    for clock, key in (("wall clock", ""), ("CPU time", "cpu_")):
        against_agents_sdk(values, clock, key)
    python_package(values)
    print(f"target_holds={'true' if holds else 'false'}")


if __name__ == "__main__":
    main()
