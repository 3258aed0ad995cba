"""Shared timing loop for the peer benchmarks, shaped like ring0's `mediation` bench.

Each batch is timed by the wall clock and by the process's CPU time (all its threads), as
ring0's bench times its one thread; on a machine shared with other work the CPU figures are the
ones to compare.

Each shape runs WARMUP_BATCHES untimed batches, then SAMPLES timed batches of CALLS_PER_BATCH
calls; the figure is the median per-call time over the timed batches, printed with the fastest
and slowest batch. Inputs are built before each batch so only the framework call is timed.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

WARMUP_BATCHES = 3
SAMPLES = 21
CALLS_PER_BATCH = 2048
ROUND_CALLS = 64


class Result:
    def __init__(self, label: str, per_call_ns: Sequence[float], cpu_per_call_ns: Sequence[float]) -> None:
        self.label = label
        self.samples = sorted(per_call_ns)
        self.cpu_samples = sorted(cpu_per_call_ns)

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples) / 1000.0

    @property
    def cpu_median_us(self) -> float:
        return statistics.median(self.cpu_samples) / 1000.0

    def line(self) -> str:
        return (
            f"{self.label:<58} {self.median_us:>9.3f} µs/call"
            f"  (batches {self.samples[0] / 1000:.3f}–{self.samples[-1] / 1000:.3f})"
            f"  cpu {self.cpu_median_us:.3f} µs/call"
        )


def measure_async(
    label: str,
    make_inputs: Callable[[int], list[Any]],
    run_batch: Callable[[list[Any]], Awaitable[int]],
) -> Result:
    """Times `run_batch(inputs)`, which returns how many calls it made, on one event loop."""

    async def main() -> tuple[list[float], list[float]]:
        out, cpu = [], []
        for b in range(WARMUP_BATCHES + SAMPLES):
            inputs = make_inputs(b)
            start, start_cpu = time.perf_counter_ns(), time.process_time_ns()
            calls = await run_batch(inputs)
            elapsed, elapsed_cpu = time.perf_counter_ns() - start, time.process_time_ns() - start_cpu
            if b >= WARMUP_BATCHES:
                out.append(elapsed / calls)
                cpu.append(elapsed_cpu / calls)
        return out, cpu

    return Result(label, *asyncio.run(main()))


def measure_sync(
    label: str,
    make_inputs: Callable[[int], list[Any]],
    run_batch: Callable[[list[Any]], int],
) -> Result:
    out, cpu = [], []
    for b in range(WARMUP_BATCHES + SAMPLES):
        inputs = make_inputs(b)
        start, start_cpu = time.perf_counter_ns(), time.process_time_ns()
        calls = run_batch(inputs)
        elapsed, elapsed_cpu = time.perf_counter_ns() - start, time.process_time_ns() - start_cpu
        if b >= WARMUP_BATCHES:
            out.append(elapsed / calls)
            cpu.append(elapsed_cpu / calls)
    return Result(label, out, cpu)


def report(peer: str, direct: Result, single: list[Result], rounds: list[Result]) -> None:
    """Prints the figures and the machine-readable lines run.sh reads.

    The peer's per-call figure is the fastest of its single-call variants, taken whole: the
    no-op tool's own time is not subtracted (it is the `direct` line, a fraction of a percent).
    """
    print(f"{peer}: no-op tool, one integer argument, no model, no network")
    print(direct.line())
    for r in single + rounds:
        print(r.line())
    best = min(single, key=lambda r: r.median_us)
    best_round = min(rounds, key=lambda r: r.median_us)
    print(f"{peer}_direct_us_per_call={direct.median_us:.4f}")
    print(f"{peer}_us_per_call={best.median_us:.3f}")
    print(f"{peer}_us_per_call_round{ROUND_CALLS}={best_round.median_us:.3f}")
    print(f"{peer}_cpu_direct_us_per_call={direct.cpu_median_us:.4f}")
    print(f"{peer}_cpu_us_per_call={min(r.cpu_median_us for r in single):.3f}")
    print(f"{peer}_cpu_us_per_call_round{ROUND_CALLS}={min(r.cpu_median_us for r in rounds):.3f}")
