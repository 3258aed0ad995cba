"""The quick start of docs/python.md: one model turn through ring0, in process."""

import json, tempfile
import ring0

@ring0.tool(effect="read")
def get_weather(city: str) -> dict:
    """Current temperature of a city.

    Args:
        city: The city's name.
    """
    return {"city": city, "celsius": 21}

@ring0.tool(effect="write", settlement="idempotency_key")
def send_invoice(to: str, amount: int, ctx: ring0.Context) -> dict:
    """Sends an invoice."""
    return {"invoice": f"INV-{to}", "idempotency_key": ctx["idempotency_key"]}

kernel = ring0.Kernel(tempfile.mkdtemp(), [get_weather, send_invoice])
session = kernel.session("order-1234")

# The model's message, exactly as OpenAI returned it (one good call, one bad one).
turn = {"role": "assistant", "tool_calls": [
    {"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}},
    {"id": "call_2", "type": "function",
     "function": {"name": "send_invoice", "arguments": json.dumps({"to": "acme", "amount": "ten"})}},
]}
for message in session.handle_turn("openai", turn):   # the tool messages to send the model
    print(message["tool_call_id"], message["content"][:120])
