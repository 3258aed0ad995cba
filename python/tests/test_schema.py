"""`@ring0.tool` derives the JSON Schema the model sees from type hints, docstrings and pydantic
models, and refuses a declaration the kernel would refuse, with a located envelope."""

from __future__ import annotations

import enum
from typing import Annotated, Literal, Optional, TypedDict

import pydantic
import pytest

import ring0


class Unit(enum.Enum):
    C = "celsius"
    F = "fahrenheit"


class Address(pydantic.BaseModel):
    street: str
    city: str = pydantic.Field(description="The city")


class Filter(TypedDict):
    field: str
    value: int


def test_plain_types_docstrings_and_defaults() -> None:
    @ring0.tool(effect="read")
    def search(
        query: str,
        limit: int = 10,
        exact: bool = False,
        score: float | None = None,
        tags: list[str] = [],  # noqa: B006
        mode: Literal["fast", "deep"] = "fast",
        unit: Unit = Unit.C,
        extra: Annotated[dict[str, int], "free counters"] | None = None,
        ctx: ring0.Context | None = None,
    ) -> list[str]:
        """Searches the index.

        Args:
            query: What to look for,
                over several lines.
            limit: At most this many.
        """
        return []

    d = search.definition
    assert d["name"] == "search"
    assert d["description"] == "Searches the index."
    assert d["effect"] == "nullipotent" and d["authority"] == "A0"
    s = d["input_schema"]
    assert s["additionalProperties"] is False
    assert s["required"] == ["query"]
    p = s["properties"]
    assert "ctx" not in p, "the call context is ring0's to give, not the model's"
    assert p["query"] == {"type": "string", "description": "What to look for, over several lines."}
    assert p["limit"] == {"type": "integer", "description": "At most this many.", "default": 10}
    assert p["exact"] == {"type": "boolean", "default": False}
    assert p["score"] == {"anyOf": [{"type": "number"}, {"type": "null"}]}
    assert p["tags"] == {"type": "array", "items": {"type": "string"}, "default": []}
    assert p["mode"] == {"enum": ["fast", "deep"], "type": "string", "default": "fast"}
    assert p["unit"] == {"enum": ["celsius", "fahrenheit"]}
    assert p["extra"]["anyOf"][0] == {
        "type": "object",
        "additionalProperties": {"type": "integer"},
        "description": "free counters",
    }
    assert search.context_param == "ctx"


def test_pydantic_models_and_typed_dicts_become_schemas_and_arguments() -> None:
    @ring0.tool(effect="write", settlement="idempotency_key", conflict_key="city:{to.city}")
    def ship(to: Address, filters: Optional[list[Filter]] = None) -> dict:  # noqa: UP045
        """Ships a parcel."""
        assert isinstance(to, Address)
        return {"to": to.city}

    s = ship.definition["input_schema"]
    assert s["properties"]["to"] == {"$ref": "#/$defs/Address"}
    assert s["$defs"]["Address"]["properties"]["city"]["description"] == "The city"
    assert s["$defs"]["Address"]["required"] == ["street", "city"]
    assert s["properties"]["filters"]["anyOf"][0]["items"] == {
        "type": "object",
        "properties": {"field": {"type": "string"}, "value": {"type": "integer"}},
        "required": ["field", "value"],
        "additionalProperties": False,
    }
    assert ship.definition["effect"] == "non_idempotent"
    assert ship.definition["authority"] == "A2"
    assert ship.definition["settlement"] == "idempotency_key"
    assert ship.definition["conflict_key"] == "city:{to.city}"
    # ring0 calls it with the model, built from the validated JSON.
    assert ship.invoke({"to": {"street": "1 Main", "city": "Oslo"}}) == {"to": "Oslo"}


def test_the_kernel_registers_the_schema_it_was_given(tmp_path) -> None:
    @ring0.tool(effect="read")
    def lookup(key: str) -> str:
        return key

    @ring0.tool(effect="idempotent", strategy=["exploitation"], concurrency="sequential",
                timeout_ms=5000, budget=1024)
    def put(key: str, value: int) -> None:
        return None

    kernel = ring0.Kernel(tmp_path / "s", [lookup, put])
    specs = {t["name"]: t for t in kernel.catalog()}
    assert specs["lookup"]["input_schema"]["properties"] == {"key": {"type": "string"}}
    assert specs["put"]["effect"] == "idempotent"
    assert specs["put"]["timeout_ms"] == 5000
    assert specs["put"]["observation_budget_bytes"] == 1024
    listed = kernel.session().tool_definitions("anthropic")
    assert {t["name"] for t in listed} == {"lookup", "put"}


@pytest.mark.parametrize(
    ("kwargs", "loc"),
    [
        ({"effect": "delete"}, "/effect"),
        ({"authority": "A9"}, "/authority"),
        ({"strategy": ["bold"]}, "/strategy"),
        ({"settlement": "retry"}, "/settlement"),
        ({"name": "no spaces"}, "/name"),
    ],
)
def test_a_bad_declaration_is_refused_where_it_is_wrong(kwargs, loc) -> None:
    with pytest.raises(ring0.ConfigError) as e:

        @ring0.tool(**kwargs)
        def f(x: int) -> int:
            return x

    assert e.value.kind == "validation_error"
    assert e.value.errors[0]["loc"] == loc


def test_the_kernel_refuses_what_only_it_can_check(tmp_path) -> None:
    @ring0.tool(conflict_key="acct:{", effect="write")
    def pay(to: str) -> None:
        return None

    with pytest.raises(ring0.ConfigError) as e:
        ring0.Kernel(tmp_path / "s", [pay])
    assert e.value.errors[0]["loc"] == "/tools/0/conflict_key"
    assert "conflict" in e.value.advice or e.value.advice

    @ring0.tool(effect="write", timeout_ms=10**9)
    def slow(x: int) -> None:
        return None

    with pytest.raises(ring0.ConfigError) as e:
        ring0.Kernel(tmp_path / "s2", [slow])
    assert e.value.errors[0]["loc"] == "/tools/0/timeout_ms"
    assert e.value.envelope["status"] == "validation_error"


def test_a_bad_grant_is_refused_where_it_is_wrong(tmp_path) -> None:
    @ring0.tool(effect="read")
    def r(x: int) -> int:
        return x

    with pytest.raises(ring0.ConfigError) as e:
        ring0.Kernel(tmp_path / "s", [r], grants=[{"tools": ["*"], "ceiling": "A0", "rules": ["args.x <"]}])
    assert e.value.errors[0]["loc"] == "/grants/0/rules/0"


def test_hints_naming_a_class_local_to_the_declaring_function() -> None:
    class Point(pydantic.BaseModel):
        x: int

    @ring0.tool
    def bare(p: Point) -> int:
        return p.x

    @ring0.tool(effect="read")
    def called(p: Point) -> int:
        return p.x

    for t in (bare, called):
        assert t.definition["input_schema"]["properties"]["p"] == {"$ref": "#/$defs/Point"}
        assert t.invoke({"p": {"x": 3}}) == 3
