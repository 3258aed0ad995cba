"""ring0: the supervisor between an AI model's tool calls and the world, in your Python process.

Declare your tools with :func:`tool`, build a :class:`Kernel` over a state directory, open a
:class:`Session` and hand it each model turn; it returns the tool-result message(s) to send the
model. Every call is validated against its closed JSON Schema (errors the model can correct come
back as its result), authorized by the grants (a person approves what they hold), ordered,
committed to the journal before a write runs (so a re-run of the same turn never repeats it),
run, settled, shaped and projected. :class:`Client` does the same against a remote
``ring0 serve --http``.
"""

from __future__ import annotations

from . import errors
from ._kernel import Events, Kernel, Session, tool_definitions
from ._tool import Context, Tool, as_tool, tool
from .client import Client, RemoteSession
from .errors import (
    ApiError,
    CallRejected,
    ConfigError,
    InvalidTurn,
    JournalError,
    NotApplied,
    NotFound,
    Ring0Error,
)

from ._ring0 import __version__  # noqa: E402  (the native module's version is the package's)

__all__ = [
    "ApiError",
    "CallRejected",
    "Client",
    "ConfigError",
    "Context",
    "Events",
    "InvalidTurn",
    "JournalError",
    "Kernel",
    "NotApplied",
    "NotFound",
    "RemoteSession",
    "Ring0Error",
    "Session",
    "Tool",
    "__version__",
    "as_tool",
    "errors",
    "tool",
    "tool_definitions",
]
