"""Framework adapters: every tool call a framework makes goes through ring0's kernel.

- :mod:`ring0.adapters.agents` — the OpenAI Agents SDK (``openai-agents``): every function tool
  of an agent;
- :mod:`ring0.adapters.langgraph` — LangGraph: a drop-in for ``ToolNode``;
- :mod:`ring0.adapters.pydantic_ai` — Pydantic AI: a toolset wrapper.

Each is imported on its own and needs its framework installed (``pip install ring0[agents]``,
``ring0[langgraph]``, ``ring0[pydantic-ai]``). The tools keep running the framework's way;
ring0 decides whether and when they run: validation against the closed schema (errors come back
to the model to correct), grants and approvals, ordering, the journal (a re-run of the same step
is answered from it, never a second effect), settlement and shaping.

Tool metadata (effect, authority, settlement, …) is given per tool name in ``metadata``, as
``@ring0.tool`` takes it; a tool without any is a write (``effect="write"``), the conservative
default.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: What a tool with no metadata is declared as.
DEFAULT_METADATA: dict[str, Any] = {"effect": "write"}


def model_view(result: Mapping[str, Any]) -> tuple[Any, bool]:
    """What the framework hands the model for one call's result: the tool's own output when it
    ran (its text, or its JSON value), ring0's envelope (JSON text) when the call was refused or
    failed; and whether it is an error."""
    content = result.get("content")
    if result.get("is_error"):
        return (content if isinstance(content, str) else json.dumps(content)), True
    if isinstance(content, Mapping):
        outcome = content.get("outcome")
        if isinstance(outcome, Mapping) and outcome.get("kind") == "completed":
            obs = outcome.get("observation") or {}
            if obs.get("structured") is not None:
                return obs["structured"], False
            return obs.get("text", ""), False
        if isinstance(outcome, Mapping):
            return json.dumps(content), True
    return content, False


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def one_call_turn(call_id: str, name: str, arguments: str | Mapping[str, Any]) -> dict[str, Any]:
    """A Chat Completions assistant message with one call."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {
        "role": "assistant",
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }
