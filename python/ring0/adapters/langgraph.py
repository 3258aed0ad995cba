"""LangGraph: :class:`Ring0ToolNode`, a drop-in for ``langgraph.prebuilt.ToolNode``.

.. code-block:: python

    from ring0.adapters.langgraph import Ring0ToolNode

    tools = Ring0ToolNode([search, send_email], state_dir="state/",
                          metadata={"search": {"effect": "read"},
                                    "send_email": {"effect": "write", "authority": "A3"}})
    builder.add_node("tools", tools)          # where ToolNode([...]) was
    builder.add_conditional_edges("agent", tools_condition)

It is a ``ToolNode`` (so ``tools_condition``, ``create_react_agent(model, tools=node)`` and graph
checkpoints treat it as one), but the tool calls of the last ``AIMessage`` are handed to a ring0
session as one turn: validated against each tool's JSON Schema (a validation error comes back as
an error ``ToolMessage`` for the model to correct), authorized, ordered, journaled, run (the
LangChain tool's own ``invoke``), settled and shaped. A step re-run from a checkpoint carries the
same call ids, so its writes are answered from the journal instead of run again.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.prebuilt import ToolNode
from langgraph.runtime import Runtime

import ring0

from . import DEFAULT_METADATA, as_text, model_view


def _turn(tool_calls: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    import json

    return {
        "role": "assistant",
        "tool_calls": [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c.get("args") or {})}}
            for c in tool_calls
        ],
    }


def _ring0_tool(tool: BaseTool, meta: Mapping[str, Any]) -> ring0.Tool:
    parameters = convert_to_openai_tool(tool)["function"].get("parameters") or {
        "type": "object", "properties": {}}
    coroutine = getattr(tool, "coroutine", None)
    func = getattr(tool, "func", None)
    if func is None and coroutine is not None:
        async def run(**arguments: Any) -> Any:
            return await tool.ainvoke(arguments)
    else:
        def run(**arguments: Any) -> Any:  # type: ignore[misc]
            return tool.invoke(arguments)

    return ring0.tool(run, name=tool.name, description=tool.description, schema=parameters, **meta)


class Ring0ToolNode(ToolNode):
    """A ``ToolNode`` whose calls go through ring0 (see the module's doc).

    ``metadata`` maps a tool name to its ring0 metadata (as :func:`ring0.tool` takes it; a tool
    may also carry it as ``tool.metadata["ring0"]``); ``grants``, ``approver`` and ``approvals``
    are the :class:`ring0.Kernel`'s, ``scope`` the session's. Pass ``kernel`` and ``scope`` to
    share one kernel between nodes.
    """

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable[..., Any]],
        *,
        state_dir: str | os.PathLike[str] | None = None,
        metadata: Mapping[str, Mapping[str, Any]] | None = None,
        grants: Any = None,
        approver: Callable[[dict[str, Any]], Any] | None = None,
        approvals: str = "hold",
        scope: str = "default",
        name: str = "tools",
        tags: list[str] | None = None,
        messages_key: str = "messages",
    ) -> None:
        super().__init__(tools, name=name, tags=tags, messages_key=messages_key)
        metadata = dict(metadata or {})
        rtools = []
        for t in self.tools_by_name.values():
            own = (t.metadata or {}).get("ring0", {}) if isinstance(t.metadata, Mapping) else {}
            rtools.append(_ring0_tool(t, {**DEFAULT_METADATA, **own, **metadata.get(t.name, {})}))
        if state_dir is None:
            raise ring0.ConfigError(
                "Ring0ToolNode needs a state_dir: the journal that keeps a re-run step from "
                "repeating a write lives there"
            )
        self.kernel = ring0.Kernel(
            state_dir, rtools, grants=grants, approver=approver, approvals=approvals
        )
        self.session = self.kernel.session(scope)

    def _messages(self, tool_calls: Sequence[Mapping[str, Any]], out: Mapping[str, Any]) -> list[ToolMessage]:
        messages = []
        for call, result in zip(tool_calls, out["results"], strict=True):
            value, is_error = model_view(result)
            messages.append(
                ToolMessage(
                    content=as_text(value),
                    name=call["name"],
                    tool_call_id=call["id"],
                    status="error" if is_error else "success",
                )
            )
        return messages

    def _func(self, input: Any, config: RunnableConfig, runtime: Runtime) -> Any:  # noqa: A002
        tool_calls, input_type = self._parse_input(input)
        if not tool_calls:
            return self._combine_tool_outputs([], input_type)
        out = self.session.handle_turn("openai", _turn(tool_calls), detailed=True)
        return self._combine_tool_outputs(self._messages(tool_calls, out), input_type)

    async def _afunc(self, input: Any, config: RunnableConfig, runtime: Runtime) -> Any:  # noqa: A002
        tool_calls, input_type = self._parse_input(input)
        if not tool_calls:
            return self._combine_tool_outputs([], input_type)
        out = await self.session.ahandle_turn("openai", _turn(tool_calls), detailed=True)
        return self._combine_tool_outputs(self._messages(tool_calls, out), input_type)


__all__ = ["Ring0ToolNode"]
