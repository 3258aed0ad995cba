"""Pydantic AI with `Ring0Toolset` around a `FunctionToolset`, driven by a scripted
`FunctionModel` (no LLM)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent, FunctionToolset  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import FunctionModel  # noqa: E402

from ring0.adapters.pydantic_ai import Ring0Toolset  # noqa: E402

METADATA = {
    "lookup": {"effect": "read"},
    "refund": {"effect": "write", "settlement": "idempotency_key"},
    "close_account": {"effect": "write", "authority": "A3"},
}


def toolset(effects, state_dir):
    def lookup(order: str) -> str:
        """Looks an order up."""
        return f"order {order}: shipped"

    def refund(order: str, cents: int) -> str:
        """Refunds an order."""
        effects.record(f"refund:{order}:{cents}")
        return f"refunded {cents}"

    def close_account(user: str) -> str:
        """Closes an account for good."""
        effects.record(f"close:{user}")
        return f"closed {user}"

    return Ring0Toolset(FunctionToolset([lookup, refund, close_account]), state_dir=state_dir,
                        metadata=METADATA)


class Script:
    """A FunctionModel function: the next scripted response each time; keeps what came back."""

    def __init__(self, steps) -> None:
        self.steps = list(steps)
        self.returns: list = []

    def __call__(self, messages, info):
        self.returns = [p for m in messages for p in getattr(m, "parts", [])
                        if isinstance(p, (ToolReturnPart, RetryPromptPart))]
        step = self.steps.pop(0)
        if isinstance(step, str):
            return ModelResponse(parts=[TextPart(step)])
        return ModelResponse(parts=[ToolCallPart(tool_name=n, args=a, tool_call_id=cid) for cid, n, a in step])


def test_a_validation_error_goes_back_to_the_model_to_correct(tmp_path, effects) -> None:
    ts = toolset(effects, tmp_path / "s")
    script = Script([
        [("c1", "refund", {"order": "A", "cents": "lots", "note": "x"})],
        [("c2", "refund", {"order": "A", "cents": 100})],
        "done",
    ])
    result = Agent(FunctionModel(script), toolsets=[ts]).run_sync("refund A")
    assert result.output == "done"
    assert effects.lines() == ["refund:A:100"]
    retry, ret = script.returns
    # A retry prompt for the model, carrying ring0's envelope.
    assert retry.tool_call_id == "c1"
    assert isinstance(retry, RetryPromptPart) or getattr(retry, "outcome", None) == "retried"
    envelope = json.loads(retry.content if isinstance(retry.content, str) else json.dumps(retry.content))
    assert envelope["status"] == "validation_error"
    assert sorted(e["loc"] for e in envelope["errors"]) == ["/cents", "/note"]
    assert isinstance(ret, ToolReturnPart) and ret.content == "refunded 100"


def test_a_call_held_for_approval_then_runs(tmp_path, effects) -> None:
    ts = toolset(effects, tmp_path / "s")
    step = [("c1", "close_account", {"user": "mallory"})]
    script = Script([step, "waiting"])
    Agent(FunctionModel(script), toolsets=[ts]).run_sync("close it")
    assert effects.count() == 0
    assert json.loads(script.returns[-1].content)["status"] == "approval_required"
    [held] = ts.session.pending_approvals()
    ts.session.approve(held["id"])
    script = Script([step, "done"])
    Agent(FunctionModel(script), toolsets=[ts]).run_sync("approved")
    assert script.returns[-1].content == "closed mallory"
    assert effects.lines() == ["close:mallory"]


def test_a_rerun_of_the_same_step_does_not_repeat_the_write(tmp_path, effects) -> None:
    ts = toolset(effects, tmp_path / "s")
    for _ in range(2):
        script = Script([[("c9", "refund", {"order": "Z", "cents": 7})], "done"])
        Agent(FunctionModel(script), toolsets=[ts]).run_sync("refund Z")
        assert script.returns[-1].content == "refunded 7"
    assert effects.lines() == ["refund:Z:7"]
