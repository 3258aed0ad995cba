"""What the native kernel calls back into Python: running coroutines on an asyncio loop, and
turning objects it does not know into JSON-able ones."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime
import decimal
import enum
import threading
import uuid
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def background_loop() -> asyncio.AbstractEventLoop:
    """The loop coroutine tools run on when the turn was handed over synchronously (a daemon
    thread, started on first use)."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            threading.Thread(target=run, name="ring0-asyncio", daemon=True).start()
            ready.wait()
            _loop = loop
        return _loop


def schedule(coroutine: Any, loop: asyncio.AbstractEventLoop | None, done: Any) -> None:
    """Runs ``coroutine`` on ``loop`` (the caller's) or the background loop; ``done(future)`` is
    called with its outcome."""
    target = loop if loop is not None else background_loop()
    if not asyncio.iscoroutine(coroutine):
        async def wrap(awaitable: Any = coroutine) -> Any:
            return await awaitable

        coroutine = wrap()
    future = asyncio.run_coroutine_threadsafe(coroutine, target)
    future.add_done_callback(done)


def jsonable(obj: Any) -> Any:
    """A form of ``obj`` made of dicts, lists, strings, numbers, booleans and None."""
    dump = getattr(obj, "model_dump", None)
    if callable(dump):  # pydantic v2
        return dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    if isinstance(obj, (datetime.datetime, datetime.date, datetime.time)):
        return obj.isoformat()
    if isinstance(obj, (uuid.UUID, decimal.Decimal, PurePath)):
        return str(obj)
    if isinstance(obj, (bytes, bytearray)):
        try:
            return bytes(obj).decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(bytes(obj)).decode("ascii")
    if isinstance(obj, Mapping):
        return {str(k): v for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return list(obj)
    if hasattr(obj, "__iter__") and not isinstance(obj, (str, bytes)):
        return list(obj)
    raise TypeError(f"a {type(obj).__name__} cannot be sent as JSON")


def to_json_value(obj: Any, _depth: int = 0) -> Any:
    """``obj`` made JSON-able all the way down (what the remote client sends)."""
    if _depth > 128:
        raise ValueError("the value nests deeper than 128 levels")
    if obj is None or isinstance(obj, (str, bool, int, float)):
        return obj
    if isinstance(obj, dict):
        return {str(k): to_json_value(v, _depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json_value(v, _depth + 1) for v in obj]
    return to_json_value(jsonable(obj), _depth + 1)
