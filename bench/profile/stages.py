"""Where the mediated calls of ring0's `mediation` bench spend their CPU time, by pipeline stage.

Reads `perf script -F ip,sym` output of a `perf record --call-graph dwarf` run of the bench and
attributes every sample taken inside `Session::handle_turn` or `Session::run_round` to the
innermost ring0 function on its stack, then groups those functions by stage. Samples outside the
pipeline (building inputs, dropping outputs, registering the catalog, the direct baseline) are
counted apart, so the shares are of the mediated work alone.

    perf record -F 499 --call-graph dwarf,16384 -o perf.data target/release/deps/mediation-HASH
    perf script -i perf.data -F ip,sym > perf.script
    python3 bench/profile/stages.py perf.script
"""

from __future__ import annotations

import collections
import re
import sys

# (stage, pattern of a ring0 function); the first pattern that matches the innermost ring0 frame
# names the stage.
STAGES = [
    ("project: receipt serialized and size-checked", r"ring0_kernel::project|project_round|ring0_core::receipt::.*serialize|ring0_core::observation::.*serialize"),
    ("render: result text for the provider", r"ring0_core::format::(ToolResult::content_text|render)"),
    ("parse: provider turn", r"ring0_core::format::(parse|call_id)|ring0_kernel::round::ingest"),
    ("prepare: canonical JSON and fingerprint", r"ring0_core::canonical|ring0_core::identity"),
    ("prepare: decode, defaults, validate", r"ring0_kernel::(prepare|validate|compat|registry)"),
    ("admit and plan", r"ring0_kernel::(admit|plan)|admit_round|check_tool_choice|RepeatGuard"),
    ("authorize", r"ring0_kernel::policy"),
    ("shape", r"ring0_shape::|ring0_kernel::shape"),
    ("commit and settle (journal)", r"ring0_journal::|ring0_kernel::(commit|settle)"),
    ("dispatch: task, context, tool", r"ring0_kernel::(dispatch|tool)|dispatch_round|CallContext"),
    ("round bookkeeping", r"ring0_kernel::(round|session)|RoundBook|ring0_core::call"),
]
INSIDE = re.compile(r"Session::(handle_turn|run_round)")
RING0 = re.compile(r"ring0_\w+::|RoundBook|CallContext")
BATCHES = {
    "handle_turn_batch": "handle_turn, no-op tool (1 and 64 calls a round)",
    "catalog_batch": "handle_turn, BFCL catalog tool",
    "run_round_batch": "run_round, no-op read and write",
}


def stacks(path: str):
    stack: list[str] = []
    for line in open(path, errors="replace"):
        line = line.strip()
        if not line:
            if stack:
                yield stack
            stack = []
            continue
        parts = line.split(None, 1)
        stack.append(parts[1] if len(parts) > 1 else "")
    if stack:
        yield stack


def main() -> None:
    by_batch: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    outside = 0
    for stack in stacks(sys.argv[1]):
        if not any(INSIDE.search(f) for f in stack):
            outside += 1
            continue
        batch = next((v for k, v in BATCHES.items() if any(k in f for f in stack)), "other")
        frame = next((f for f in stack if RING0.search(f)), "")
        stage = next((s for s, p in STAGES if re.search(p, frame)), "other")
        by_batch[batch][stage] += 1
    print(f"samples outside the pipeline (inputs, baseline, setup): {outside}")
    for batch, counts in sorted(by_batch.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(counts.values())
        print(f"\n{batch}: {total} samples in the pipeline")
        for stage, n in counts.most_common():
            print(f"  {100 * n / total:5.1f}%  {stage}")


if __name__ == "__main__":
    main()
