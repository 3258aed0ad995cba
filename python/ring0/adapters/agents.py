"""The OpenAI Agents SDK: every function tool of an agent goes through ring0.

.. code-block:: python

    from agents import Agent, Runner, function_tool
    from ring0.adapters.agents import Ring0Agents

    ring0_agents = Ring0Agents("state/", metadata={"send_email": {"effect": "write",
                                                                "settlement": "idempotency_key"}})
    agent = ring0_agents.wrap(Agent(name="mail", tools=[send_email, lookup]))
    await Runner.run(agent, "…")

:meth:`Ring0Agents.wrap` returns a clone of the agent whose function tools are mediated: when the
SDK invokes one, the call (with the SDK's call id) is handed to a ring0 session as a one-call
turn; ring0 validates it against the tool's JSON Schema, authorizes it, journals it and only then
lets the SDK's own ``on_invoke_tool`` run it. A refused call (a validation error, a call held for
approval) comes back to the model as ring0's envelope; a call whose step is re-run with the same
call id is answered from the journal.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from agents import Agent, FunctionTool
from agents.tool_context import ToolContext

import ring0

from . import DEFAULT_METADATA, model_view, one_call_turn


class Ring0Agents:
    """A ring0 kernel and session for agents' function tools.

    ``metadata`` maps a tool name to its ring0 metadata (``effect``, ``authority``,
    ``settlement``, ``conflict_key``, ``strategy``, …, as :func:`ring0.tool` takes them);
    ``grants``, ``approver`` and ``approvals`` are the :class:`ring0.Kernel`'s; ``scope`` is the
    session's.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        metadata: Mapping[str, Mapping[str, Any]] | None = None,
        grants: Any = None,
        approver: Callable[[dict[str, Any]], Any] | None = None,
        approvals: str = "hold",
        scope: str = "default",
    ) -> None:
        self.state_dir = state_dir
        self.metadata = dict(metadata or {})
        self._kernel_args = {"grants": grants, "approver": approver, "approvals": approvals}
        self.scope = scope
        self.kernel: ring0.Kernel | None = None
        self.session: ring0.Session | None = None
        self._originals: dict[str, FunctionTool] = {}
        self._contexts: dict[str, ToolContext[Any]] = {}

    def wrap(self, agent: Agent[Any]) -> Agent[Any]:
        """A clone of ``agent`` whose function tools go through ring0 (other tools unchanged)."""
        tools = []
        for t in agent.tools:
            if isinstance(t, FunctionTool):
                self._originals[t.name] = t
                tools.append(self._mediated(t))
            else:
                tools.append(t)
        self._open()
        return agent.clone(tools=tools)

    def _open(self) -> None:
        if self.kernel is not None:
            missing = set(self._originals) - set(self.kernel.tools)
            if not missing:
                return
            raise ring0.ConfigError(
                f"tools {sorted(missing)} were added after the kernel was built; wrap every agent "
                "before the first run, or use another Ring0Agents"
            )
        rtools = [self._ring0_tool(t) for t in self._originals.values()]
        self.kernel = ring0.Kernel(self.state_dir, rtools, **self._kernel_args)
        self.session = self.kernel.session(self.scope)

    def _ring0_tool(self, original: FunctionTool) -> ring0.Tool:
        async def run(ctx: ring0.Context, **arguments: Any) -> Any:
            tool_context = self._contexts.get(ctx["call_id"])
            if tool_context is None:  # a recovery re-run: no SDK context is at hand
                tool_context = ToolContext(
                    context=None,
                    tool_name=original.name,
                    tool_call_id=ctx["call_id"],
                    tool_arguments=json.dumps(arguments),
                )
            return await original.on_invoke_tool(tool_context, json.dumps(arguments))

        meta = {**DEFAULT_METADATA, **self.metadata.get(original.name, {})}
        return ring0.tool(
            run, name=original.name, description=original.description,
            schema=original.params_json_schema, **meta,
        )

    def _mediated(self, original: FunctionTool) -> FunctionTool:
        async def on_invoke_tool(tool_context: ToolContext[Any], arguments: str) -> Any:
            assert self.session is not None
            call_id = tool_context.tool_call_id
            self._contexts[call_id] = tool_context
            try:
                out = await self.session.ahandle_turn(
                    "openai", one_call_turn(call_id, original.name, arguments or "{}"), detailed=True
                )
            finally:
                self._contexts.pop(call_id, None)
            value, _is_error = model_view(out["results"][0])
            return value

        return dataclasses.replace(original, on_invoke_tool=on_invoke_tool)


__all__ = ["Ring0Agents"]
