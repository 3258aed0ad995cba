"""Pydantic AI: :class:`Ring0Toolset`, a toolset wrapper whose every call goes through ring0.

.. code-block:: python

    from pydantic_ai import Agent, FunctionToolset
    from ring0.adapters.pydantic_ai import Ring0Toolset

    toolset = Ring0Toolset(FunctionToolset([lookup, refund]), state_dir="state/",
                           metadata={"refund": {"effect": "write", "settlement": "idempotency_key"}})
    agent = Agent(model, toolsets=[toolset])

The wrapped toolset's tools keep their definitions; ring0 validates each call's arguments against
the tool's JSON Schema first (a validation error goes back to the model as a retry prompt carrying
ring0's envelope, every field located), authorizes it (a call held for approval answers the model
with ring0's ``approval_required`` envelope), journals it, and only then lets the wrapped toolset
run it with arguments its own validator built. A step re-run with the same tool call id is
answered from the journal.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic_ai import ModelRetry
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_core import SchemaValidator, core_schema

import ring0

from . import DEFAULT_METADATA, model_view, one_call_turn

# Lets the model's arguments through as they are: ring0 validates them.
_AS_IS = SchemaValidator(core_schema.dict_schema())


@dataclass
class Ring0Toolset(WrapperToolset[Any]):
    """Wraps a toolset so that every call of its tools is mediated by ring0 (see the module).

    ``metadata`` maps a tool name to its ring0 metadata (as :func:`ring0.tool` takes it);
    ``grants``, ``approver`` and ``approvals`` are the :class:`ring0.Kernel`'s, ``scope`` the
    session's.
    """

    state_dir: str | os.PathLike[str] | None = None
    metadata: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    grants: Any = None
    approver: Callable[[dict[str, Any]], Any] | None = None
    approvals: str = "hold"
    scope: str = "default"
    kernel: ring0.Kernel | None = field(default=None, init=False)
    session: ring0.Session | None = field(default=None, init=False)
    _tools: dict[str, ToolsetTool[Any]] = field(default_factory=dict, init=False)
    _calls: dict[str, tuple[Any, ToolsetTool[Any]]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if self.state_dir is None:
            raise ring0.ConfigError(
                "Ring0Toolset needs a state_dir: the journal that keeps a re-run step from "
                "repeating a write lives there"
            )

    def visit_and_replace(
        self, visitor: Callable[[AbstractToolset[Any]], AbstractToolset[Any]]
    ) -> AbstractToolset[Any]:
        # The kernel, its session and journal stay this toolset's.
        self.wrapped = self.wrapped.visit_and_replace(visitor)
        return self

    async def get_tools(self, ctx: Any) -> dict[str, ToolsetTool[Any]]:
        tools = await self.wrapped.get_tools(ctx)
        self._open(tools)
        return {
            name: replace(tool, toolset=self, args_validator=_AS_IS, args_validator_func=None)
            for name, tool in tools.items()
        }

    def _open(self, tools: Mapping[str, ToolsetTool[Any]]) -> None:
        self._tools.update(tools)
        if self.kernel is not None:
            missing = set(tools) - set(self.kernel.tools)
            if missing:
                raise ring0.ConfigError(
                    f"tools {sorted(missing)} appeared after ring0's kernel was built; give the "
                    "toolset every tool before its first run"
                )
            return
        rtools = [self._ring0_tool(name, tool) for name, tool in tools.items()]
        self.kernel = ring0.Kernel(
            self.state_dir, rtools, grants=self.grants, approver=self.approver,
            approvals=self.approvals,
        )
        self.session = self.kernel.session(self.scope)

    def _ring0_tool(self, name: str, tool: ToolsetTool[Any]) -> ring0.Tool:
        async def run(ctx: ring0.Context, **arguments: Any) -> Any:
            held = self._calls.get(ctx["call_id"])
            if held is None:
                raise ring0.NotApplied("no Pydantic AI run is waiting for this call")
            run_ctx, original = held
            validated = original.args_validator.validate_python(arguments)
            if original.args_validator_func is not None:
                await _maybe_await(original.args_validator_func(run_ctx, **validated))
            return await self.wrapped.call_tool(name, validated, run_ctx, original)

        meta = {**DEFAULT_METADATA, **self.metadata.get(name, {})}
        schema = tool.tool_def.parameters_json_schema or {"type": "object", "properties": {}}
        return ring0.tool(
            run, name=name, description=tool.tool_def.description or "", schema=schema, **meta
        )

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
        assert self.session is not None
        call_id = ctx.tool_call_id or f"call_{os.urandom(8).hex()}"
        self._calls[call_id] = (ctx, self._tools[name])
        try:
            out = await self.session.ahandle_turn(
                "openai", one_call_turn(call_id, name, tool_args), detailed=True
            )
        finally:
            self._calls.pop(call_id, None)
        value, is_error = model_view(out["results"][0])
        if is_error:
            envelope = json.loads(value) if isinstance(value, str) and value.startswith("{") else {}
            if envelope.get("status") == "validation_error":
                raise ModelRetry(value)
        return value


async def _maybe_await(value: Any) -> Any:
    import inspect

    if inspect.isawaitable(value):
        return await value
    return value


__all__ = ["Ring0Toolset"]
