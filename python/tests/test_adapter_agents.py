"""The OpenAI Agents SDK's function tools through ring0, driven by a scripted `Model` (no LLM)."""

from __future__ import annotations

import asyncio
import json

import pytest

agents = pytest.importorskip("agents")

from agents import Agent, ModelResponse, ModelSettings, Runner, Usage, function_tool  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from openai.types.responses import (  # noqa: E402
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from ring0.adapters.agents import Ring0Agents  # noqa: E402


class Script(Model):
    """A model that answers each request with the next scripted output, and records what the
    tools answered (the `function_call_output` items of its input)."""

    def __init__(self, steps: list[list[tuple[str, str, dict]] | str]) -> None:
        self.steps = list(steps)
        self.seen: list[dict] = []

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema,
                           handoffs, tracing, *, previous_response_id=None, conversation_id=None,
                           prompt=None):
        if isinstance(input, list):
            self.seen = [i for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"]
        step = self.steps.pop(0)
        if isinstance(step, str):
            output = [ResponseOutputMessage(
                id="msg", role="assistant", status="completed", type="message",
                content=[ResponseOutputText(type="output_text", text=step, annotations=[])])]
        else:
            output = [ResponseFunctionToolCall(type="function_call", call_id=cid, name=name,
                                               arguments=json.dumps(args), id=f"fc_{cid}")
                      for cid, name, args in step]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError


def make_agent(effects):
    @function_tool
    def send_invoice(to: str, amount: int) -> str:
        """Sends an invoice.

        Args:
            to: Customer.
            amount: In cents.
        """
        effects.record(f"invoice:{to}:{amount}")
        return f"sent {amount} to {to}"

    @function_tool
    def wipe_disk(device: str) -> str:
        """Erases a device."""
        effects.record(f"wipe:{device}")
        return f"wiped {device}"

    return Agent(name="billing", instructions="bill", tools=[send_invoice, wipe_disk])


METADATA = {
    "send_invoice": {"effect": "write", "settlement": "idempotency_key"},
    "wipe_disk": {"effect": "write", "authority": "A3"},
}


def run(agent, model) -> str:
    return asyncio.run(Runner.run(agent.clone(model=model, model_settings=ModelSettings()), "go")).final_output


def outputs(model) -> list:
    return [json.loads(o["output"]) if o["output"].startswith("{") else o["output"] for o in model.seen]


def test_a_validation_error_goes_back_to_the_model_to_correct(tmp_path, effects) -> None:
    agent = Ring0Agents(tmp_path / "s", metadata=METADATA).wrap(make_agent(effects))
    model = Script([
        [("c1", "send_invoice", {"to": "acme", "amount": "ten"})],
        [("c2", "send_invoice", {"to": "acme", "amount": 10})],
        "done",
    ])
    assert run(agent, model) == "done"
    assert effects.lines() == ["invoice:acme:10"]
    # The model saw the correctable envelope for c1, then the result of c2.
    assert model.seen[-1]["output"] == "sent 10 to acme"
    first = json.loads(model.seen[0]["output"])
    assert first["status"] == "validation_error" and first["errors"][0]["loc"] == "/amount"


def test_a_call_held_for_approval_then_runs(tmp_path, effects) -> None:
    guard = Ring0Agents(tmp_path / "s", metadata=METADATA)
    agent = guard.wrap(make_agent(effects))
    step = [("c1", "wipe_disk", {"device": "/dev/sdz"})]
    model = Script([step, "waiting"])
    run(agent, model)
    assert effects.count() == 0
    assert json.loads(model.seen[0]["output"])["status"] == "approval_required"
    [held] = guard.session.pending_approvals()
    assert held["tool"] == "wipe_disk" and held["args"] == {"device": "/dev/sdz"}
    guard.session.approve(held["id"])
    model = Script([step, "done"])
    run(agent, model)
    assert effects.lines() == ["wipe:/dev/sdz"]
    assert model.seen[0]["output"] == "wiped /dev/sdz"


def test_a_rerun_of_the_same_step_does_not_repeat_the_write(tmp_path, effects) -> None:
    agent = Ring0Agents(tmp_path / "s", metadata=METADATA).wrap(make_agent(effects))
    step = [("c7", "send_invoice", {"to": "zed", "amount": 3})]
    for _ in range(2):  # the same model output handled twice: a retried step
        model = Script([step, "done"])
        run(agent, model)
        assert model.seen[0]["output"] == "sent 3 to zed"
    assert effects.lines() == ["invoice:zed:3"]
