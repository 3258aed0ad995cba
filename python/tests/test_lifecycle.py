"""A kernel dropped while another kernel's turn runs (Python's garbage collector runs wherever it
runs, inside a tool too) goes quietly."""

from __future__ import annotations

import gc
import time

from conftest import openai_turn

import ring0


def test_a_kernel_collected_inside_another_kernels_turn(tmp_path) -> None:
    @ring0.tool(effect="read")
    def noop(x: int) -> int:
        return x

    doomed = [ring0.Kernel(tmp_path / "a", [noop])]
    doomed.append(doomed[0].session())
    doomed.append(doomed)  # a cycle: only the collector frees it

    @ring0.tool(effect="read")
    def collect(x: int) -> int:
        gc.collect()
        return x

    session = ring0.Kernel(tmp_path / "b", [collect]).session()
    del doomed
    out = session.handle_turn("openai", openai_turn(("c1", "collect", {"x": 1})))
    assert '"kind":"completed"' in out[0]["content"]
    # The collected kernel's journal is freed (its runtime stops on a thread of its own).
    deadline = time.monotonic() + 10
    while True:
        try:
            ring0.Kernel(tmp_path / "a", [noop])
            break
        except ring0.ConfigError:
            assert time.monotonic() < deadline, "the collected kernel's journal was never freed"
            time.sleep(0.05)
