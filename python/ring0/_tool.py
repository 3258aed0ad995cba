"""``@ring0.tool``: a Python function as a host tool, its JSON Schema derived from its type hints.

The declaration a decorated function carries (:attr:`Tool.definition`) is the host-tool
declaration of ring0's HTTP agent API (``PUT /v1/sessions/{id}/tools``, ``HostTool`` in the
``ring0-host`` crate): the same fields, the same defaults and the same conversion to the kernel's
tool spec, whether the tool runs in process (:class:`ring0.Kernel`) or is reported to a remote
``ring0 serve --http`` (:class:`ring0.Client`).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

from .errors import ConfigError

try:  # pydantic is optional: models in signatures need it.
    import pydantic as _pydantic
except ImportError:  # pragma: no cover - exercised where pydantic is absent
    _pydantic = None


class Context(TypedDict):
    """What a tool may know about the call it runs (declare a parameter of this type)."""

    call_id: str
    intent_id: str | None
    #: Pass it to any API that honours one: a re-run after an unknown outcome carries the same.
    idempotency_key: str | None
    scope: str
    session_id: str
    principal: str
    timeout_ms: int


EFFECTS = {
    "read": "nullipotent",
    "nullipotent": "nullipotent",
    "idempotent": "idempotent",
    "write": "non_idempotent",
    "non_idempotent": "non_idempotent",
}
AUTHORITIES = ("A0", "A1", "A2", "A3")
STRATEGIES = ("exploration", "exploitation", "neutral")
CONCURRENCY = ("default", "parallel", "sequential")
SETTLEMENTS = ("idempotency_key", "none")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _problem(loc: str, message: str) -> ConfigError:
    return ConfigError(
        {
            "status": "validation_error",
            "message": message,
            "errors": [{"loc": loc, "message": message}],
            "advice": "correct the tool's declaration",
        }
    )


class Tool:
    """A function ring0 runs, with the declaration the model and the kernel see.

    Calling the object calls the function itself, unmediated.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        definition: dict[str, Any],
        *,
        context_param: str | None,
        converters: dict[str, Callable[[Any], Any]],
    ) -> None:
        self.fn = fn
        self.definition = definition
        self.name: str = definition["name"]
        self.description: str = definition.get("description", "")
        self.input_schema: dict[str, Any] = definition["input_schema"]
        self.is_async = inspect.iscoroutinefunction(fn)
        self.context_param = context_param
        self._converters = converters
        self.__wrapped__ = fn
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<ring0.Tool {self.name} effect={self.definition.get('effect')}>"

    # What the native kernel registers: (declaration JSON, callable, is_async, takes_dict,
    # context_param).
    def _entry(self) -> tuple[str, Callable[..., Any], bool, bool, str | None]:
        import json

        if self._converters:
            return (
                json.dumps(self.definition),
                self._call_with_dict,
                self.is_async,
                True,
                self.context_param,
            )
        return (json.dumps(self.definition), self.fn, self.is_async, False, self.context_param)

    def _call_with_dict(self, args: dict[str, Any]) -> Any:
        kwargs = dict(args)
        for name, convert in self._converters.items():
            if name in kwargs and name != self.context_param:
                kwargs[name] = convert(kwargs[name])
        return self.fn(**kwargs)

    def invoke(self, arguments: Mapping[str, Any], context: Context | None = None) -> Any:
        """Calls the function with validated JSON arguments, as ring0 does (converting to the
        parameters' models). Returns what it returns (a coroutine for an async function)."""
        kwargs = dict(arguments)
        for name, convert in self._converters.items():
            if name in kwargs:
                kwargs[name] = convert(kwargs[name])
        if self.context_param is not None:
            kwargs[self.context_param] = context
        return self.fn(**kwargs)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    effect: str = "write",
    authority: str | None = None,
    strategy: Sequence[str] | str | None = None,
    concurrency: str | None = None,
    conflict_key: str | None = None,
    settlement: str | None = None,
    timeout_ms: int | None = None,
    budget: int | None = None,
    schema: Mapping[str, Any] | None = None,
) -> Any:
    """Declares a function as a tool ring0 runs, with its runtime metadata.

    The model sees ``name`` (default: the function's), ``description`` (default: the docstring's
    text before ``Args:``) and the JSON Schema of the arguments (derived from the type hints and
    the docstring's ``Args:`` lines, pydantic models included; or ``schema``). What the model never
    decides:

    - ``effect``: ``"read"`` (nullipotent), ``"idempotent"`` or ``"write"`` (non-idempotent; the
      default). A write is committed to the journal before it runs.
    - ``authority``: ``"A0"``…``"A3"``; default ``"A0"`` for a read, ``"A2"`` otherwise. The grants
      decide what runs and what waits for a person; A3 always waits.
    - ``strategy``: any of ``"exploration"``, ``"exploitation"``, ``"neutral"``; default
      ``["exploration"]`` for a read, none (unknown: the call runs alone in its turn) otherwise.
    - ``concurrency``: ``"default"``, ``"parallel"`` or ``"sequential"``.
    - ``conflict_key``: a template over the arguments (``"account:{to}"``): calls with equal keys
      never overlap.
    - ``settlement``: ``"idempotency_key"`` (the function honours ``Context.idempotency_key``,
      so a call whose outcome is unknown may be run again with the same key) or ``"none"``.
    - ``timeout_ms``, ``budget`` (the model-visible bytes of one result, 256..=49152).

    Use as ``@ring0.tool`` or ``@ring0.tool(effect="read", …)``.
    """

    def make(f: Callable[..., Any], _depth: int = 2) -> Tool:
        return _make(
            f,
            localns=_caller_namespace(f, _depth),
            name=name,
            description=description,
            effect=effect,
            authority=authority,
            strategy=strategy,
            concurrency=concurrency,
            conflict_key=conflict_key,
            settlement=settlement,
            timeout_ms=timeout_ms,
            budget=budget,
            schema=schema,
        )

    if fn is not None:
        return make(fn, 3)
    return make


def _caller_namespace(fn: Callable[..., Any], depth: int) -> dict[str, Any] | None:
    """The locals of the function that declares the tool (``depth`` frames up: the
    decorator's caller), when the tool's hints name something only they hold (`from __future__ import
    annotations` with a class local to that function). Read only then: on CPython before 3.13,
    reading a frame's locals keeps a snapshot of them alive as long as the frame lives."""
    try:
        typing.get_type_hints(fn, include_extras=True)
        return None
    except Exception:  # noqa: BLE001 - unresolved names: look where the tool was declared
        caller = sys._getframe(depth)
        return dict(caller.f_locals) if caller.f_code.co_name != "<module>" else None


def as_tool(obj: Any) -> Tool:
    """A :class:`Tool` as is; a plain function as ``tool(fn)`` (a write, with the defaults)."""
    if isinstance(obj, Tool):
        return obj
    if callable(obj):
        return tool(obj)
    raise TypeError(f"{obj!r} is neither a ring0.Tool nor a function")


def _make(
    fn: Callable[..., Any],
    *,
    localns: dict[str, Any] | None = None,
    name: str | None,
    description: str | None,
    effect: str,
    authority: str | None,
    strategy: Sequence[str] | str | None,
    concurrency: str | None,
    conflict_key: str | None,
    settlement: str | None,
    timeout_ms: int | None,
    budget: int | None,
    schema: Mapping[str, Any] | None,
) -> Tool:
    name = name or getattr(fn, "__name__", None) or ""
    if not _NAME.match(name):
        raise _problem("/name", f"{name!r}: a tool name is 1 to 64 letters, digits, _ . -")
    if effect not in EFFECTS:
        raise _problem("/effect", f"{effect!r}: write one of {', '.join(EFFECTS)}")
    effect_kind = EFFECTS[effect]
    if authority is None:
        authority = "A0" if effect_kind == "nullipotent" else "A2"
    if authority not in AUTHORITIES:
        raise _problem("/authority", f"{authority!r}: write A0, A1, A2 or A3")
    summary, arg_docs = _parse_doc(inspect.getdoc(fn) or "")
    derived, context_param, converters = _signature_schema(fn, arg_docs, localns)
    definition: dict[str, Any] = {
        "name": name,
        "description": description if description is not None else summary,
        "type": "function",
        "input_schema": dict(schema) if schema is not None else derived,
        "effect": effect_kind,
        "authority": authority,
    }
    if strategy is None and effect_kind == "nullipotent":
        # A read gathers information: it may run beside the turn's other reads.
        strategy = ["exploration"]
    if strategy is not None:
        items = [strategy] if isinstance(strategy, str) else list(strategy)
        for s in items:
            if s not in STRATEGIES:
                raise _problem("/strategy", f"{s!r}: write any of {', '.join(STRATEGIES)}")
        definition["strategy"] = items
    if concurrency is not None:
        if concurrency not in CONCURRENCY:
            raise _problem("/concurrency", f"{concurrency!r}: write one of {', '.join(CONCURRENCY)}")
        definition["concurrency"] = concurrency
    if conflict_key is not None:
        definition["conflict_key"] = conflict_key
    if settlement is not None:
        if settlement not in SETTLEMENTS:
            raise _problem("/settlement", f"{settlement!r}: write idempotency_key or none")
        definition["settlement"] = settlement
    if timeout_ms is not None:
        definition["timeout_ms"] = int(timeout_ms)
    if budget is not None:
        definition["observation_budget_bytes"] = int(budget)
    return Tool(fn, definition, context_param=context_param, converters=converters)


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters)\s*:\s*$")
_OTHER_HEADER = re.compile(r"^\s*(Returns|Return|Raises|Yields|Examples?|Notes?)\s*:\s*$")
_ARG_LINE = re.compile(r"^\s*\*{0,2}(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def _parse_doc(doc: str) -> tuple[str, dict[str, str]]:
    """The text before ``Args:`` and each argument's description (Google style)."""
    summary: list[str] = []
    args: dict[str, str] = {}
    section = "summary"
    current: str | None = None
    indent: int | None = None
    for line in doc.splitlines():
        if _ARGS_HEADER.match(line):
            section, current, indent = "args", None, None
            continue
        if _OTHER_HEADER.match(line):
            section = "other"
            continue
        if section == "summary":
            summary.append(line)
        elif section == "args":
            if not line.strip():
                continue
            lead = len(line) - len(line.lstrip())
            m = _ARG_LINE.match(line)
            if m and (indent is None or lead <= indent):
                indent = lead
                current = m.group(1)
                args[current] = m.group(3).strip()
            elif current is not None:
                args[current] = (args[current] + " " + line.strip()).strip()
    return "\n".join(summary).strip(), args


class _Defs:
    """The ``$defs`` the schemas of a signature share (from pydantic models)."""

    def __init__(self) -> None:
        self.defs: dict[str, Any] = {}


def _signature_schema(
    fn: Callable[..., Any], arg_docs: dict[str, str], localns: dict[str, Any] | None = None
) -> tuple[dict[str, Any], str | None, dict[str, Callable[[Any], Any]]]:
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn, localns=localns, include_extras=True)
    except Exception:  # noqa: BLE001 - unresolvable hints: the raw annotations
        hints = {k: v.annotation for k, v in sig.parameters.items()}
    properties: dict[str, Any] = {}
    required: list[str] = []
    context_param: str | None = None
    converters: dict[str, Callable[[Any], Any]] = {}
    defs = _Defs()
    for pname, param in sig.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if pname in ("self", "cls") and param.annotation is inspect.Parameter.empty:
            continue
        hint = hints.get(pname, Any)
        if _is_context(hint):
            context_param = pname
            continue
        loc = f"/input_schema/properties/{pname}"
        prop = _schema(hint, defs, loc)
        doc = arg_docs.get(pname)
        if doc and "description" not in prop:
            prop = {**prop, "description": doc}
        if param.default is inspect.Parameter.empty:
            required.append(pname)
        elif param.default is not None and _is_plain(param.default):
            prop = {**prop, "default": param.default}
        properties[pname] = prop
        convert = _converter(hint)
        if convert is not None:
            converters[pname] = convert
    out: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    if defs.defs:
        out["$defs"] = defs.defs
    if context_param is not None and converters:
        converters[context_param] = lambda v: v
    return out, context_param, converters


def _is_context(hint: Any) -> bool:
    hint = _strip_annotated(hint)
    if hint is Context:
        return True
    if typing.get_origin(hint) in _UNION_TYPES:
        return any(_strip_annotated(a) is Context for a in typing.get_args(hint))
    return False


def _is_plain(value: Any) -> bool:
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


def _strip_annotated(hint: Any) -> Any:
    while typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    return hint


def _is_model(t: Any) -> bool:
    return _pydantic is not None and isinstance(t, type) and issubclass(t, _pydantic.BaseModel)


_UNION_TYPES: tuple[Any, ...] = (typing.Union,)
if hasattr(types, "UnionType"):
    _UNION_TYPES = (typing.Union, types.UnionType)


def _schema(hint: Any, defs: _Defs, loc: str) -> dict[str, Any]:
    """The JSON Schema of one type hint."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        inner = _schema(args[0], defs, loc)
        for meta in args[1:]:
            if isinstance(meta, str):
                inner = {**inner, "description": meta}
            else:
                desc = getattr(meta, "description", None)
                if isinstance(desc, str):
                    inner = {**inner, "description": desc}
        return inner
    if hint is Any or hint is inspect.Parameter.empty or hint is object:
        return {}
    if hint is None or hint is type(None):
        return {"type": "null"}
    if hint is str:
        return {"type": "string"}
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer"}
    if hint is float:
        return {"type": "number"}
    if origin in _UNION_TYPES:
        options = [_schema(a, defs, loc) for a in args]
        return {"anyOf": options}
    if origin is typing.Literal:
        values = list(args)
        out: dict[str, Any] = {"enum": values}
        kinds = {type(v) for v in values}
        if kinds == {str}:
            out["type"] = "string"
        elif kinds == {int}:
            out["type"] = "integer"
        elif kinds == {bool}:
            out["type"] = "boolean"
        return out
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"enum": [m.value for m in hint]}
    if hint in (list, tuple, set, frozenset) or origin in (
        list,
        set,
        frozenset,
        Sequence,
        typing.Sequence,
        typing.List,  # noqa: UP006
    ):
        out = {"type": "array"}
        if args:
            out["items"] = _schema(args[0], defs, loc + "/items")
        if hint in (set, frozenset) or origin in (set, frozenset):
            out["uniqueItems"] = True
        return out
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _schema(args[0], defs, loc + "/items")}
        return {
            "type": "array",
            "prefixItems": [_schema(a, defs, loc + "/items") for a in args],
            "minItems": len(args),
            "maxItems": len(args),
        }
    if hint is dict or origin in (dict, Mapping, typing.Mapping, typing.Dict):  # noqa: UP006
        out = {"type": "object"}
        if len(args) == 2:
            out["additionalProperties"] = _schema(args[1], defs, loc + "/additionalProperties")
        return out
    if typing.is_typeddict(hint):
        hints = typing.get_type_hints(hint)
        required_keys = getattr(hint, "__required_keys__", set(hints))
        return {
            "type": "object",
            "properties": {k: _schema(v, defs, f"{loc}/properties/{k}") for k, v in hints.items()},
            "required": [k for k in hints if k in required_keys],
            "additionalProperties": False,
        }
    if _is_model(hint) or (_pydantic is not None and dataclasses.is_dataclass(hint)):
        return _pydantic_schema(hint, defs)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        hints = typing.get_type_hints(hint)
        fields = dataclasses.fields(hint)
        return {
            "type": "object",
            "properties": {f.name: _schema(hints.get(f.name, Any), defs, loc) for f in fields},
            "required": [
                f.name
                for f in fields
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            ],
            "additionalProperties": False,
        }
    if _pydantic is not None:
        try:
            return _pydantic_schema(hint, defs)
        except Exception as e:  # noqa: BLE001
            raise _problem(loc, f"no JSON Schema for {hint!r}: {e}") from e
    raise _problem(loc, f"no JSON Schema for {hint!r} (install pydantic for richer types)")


def _pydantic_schema(hint: Any, defs: _Defs) -> dict[str, Any]:
    assert _pydantic is not None
    schema = _pydantic.TypeAdapter(hint).json_schema(ref_template="#/$defs/{model}")
    for key, value in schema.pop("$defs", {}).items():
        defs.defs[key] = value
    if _is_model(hint) and schema.get("type") == "object":
        # A model is defined once, under its name, however many parameters use it.
        defs.defs[hint.__name__] = schema
        return {"$ref": f"#/$defs/{hint.__name__}"}
    return schema


def _needs_conversion(hint: Any) -> bool:
    hint = _strip_annotated(hint)
    if _is_model(hint) or (isinstance(hint, type) and issubclass(hint, enum.Enum)):
        return True
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return True
    origin = typing.get_origin(hint)
    if origin in (tuple, set, frozenset) or hint in (tuple, set, frozenset):
        return True
    return any(_needs_conversion(a) for a in typing.get_args(hint) if a is not Ellipsis)


def _converter(hint: Any) -> Callable[[Any], Any] | None:
    """How a validated JSON value becomes the parameter's type, when it is not already."""
    if not _needs_conversion(hint):
        return None
    if _pydantic is not None:
        adapter = _pydantic.TypeAdapter(_strip_annotated(hint))
        return adapter.validate_python
    plain = _strip_annotated(hint)
    if isinstance(plain, type) and issubclass(plain, enum.Enum):
        return plain
    if dataclasses.is_dataclass(plain) and isinstance(plain, type):
        return lambda v: plain(**v)
    return None
