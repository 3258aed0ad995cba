"""Exceptions that carry ring0's error envelope.

Every refusal ring0 reports to a host has the same shape as a refused call the model sees:
``status`` (the kind, one word), ``message``, ``errors`` (each problem located by a JSON pointer,
``{"loc": "/tools/0/conflict_key", "message": "…"}``) and ``advice``. The exception keeps the
whole envelope in :attr:`Ring0Error.envelope`.
"""

from __future__ import annotations

from typing import Any


class Ring0Error(Exception):
    """A refusal with ring0's structured error envelope."""

    def __init__(self, envelope: dict[str, Any] | str, **extra: Any) -> None:
        if isinstance(envelope, str):
            envelope = {"status": "error", "message": envelope, "errors": [], "advice": ""}
        envelope = {**envelope, **extra}
        self.envelope: dict[str, Any] = envelope
        super().__init__(envelope.get("message", ""))

    @property
    def kind(self) -> str:
        """The refusal's kind: ``validation_error``, ``invalid_turn``, ``not_found``, …"""
        return str(self.envelope.get("status", "error"))

    status = kind

    @property
    def message(self) -> str:
        return str(self.envelope.get("message", ""))

    @property
    def errors(self) -> list[dict[str, Any]]:
        """Each problem and where it is: ``[{"loc": "/city", "message": "…"}, …]``."""
        return list(self.envelope.get("errors") or [])

    @property
    def advice(self) -> str:
        return str(self.envelope.get("advice", ""))

    def __str__(self) -> str:
        text = f"{self.kind}: {self.message}"
        locs = [e.get("loc") for e in self.errors if e.get("loc")]
        if locs and all(loc not in self.message for loc in locs):
            text += f" (at {', '.join(map(str, locs))})"
        return text

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.envelope!r})"


class ConfigError(Ring0Error):
    """A tool declaration, a grant, the state directory or another setting is refused."""


class InvalidTurn(Ring0Error):
    """The model's message cannot be read in its format; ``errors[0]["loc"]`` says where."""


class NotFound(Ring0Error):
    """No such held call, session or turn."""


class JournalError(Ring0Error):
    """The journal could not be opened or recovered."""


class ApiError(Ring0Error):
    """A ``ring0 serve --http`` agent API refused a request (``http_status`` is the HTTP code)."""

    @property
    def http_status(self) -> int:
        return int(self.envelope.get("http_status", 0))


class CallRejected(Ring0Error):
    """A call came back as an error (``Session.call``): the envelope is what the model would see,
    e.g. ``status == "validation_error"`` with every field problem in ``errors``."""


class NotApplied(Exception):
    """Raised by a tool to say that it failed *and changed nothing*.

    Any other exception a tool raises leaves the call's outcome unknown (it may have had its
    effect before failing), and ring0 settles it by the tool's ``settlement``: never blindly run
    again. Raise ``NotApplied`` when the tool knows better, so the call settles as failed and may
    be made again.
    """


__all__ = [
    "ApiError",
    "CallRejected",
    "ConfigError",
    "InvalidTurn",
    "JournalError",
    "NotApplied",
    "NotFound",
    "Ring0Error",
]
