"""The kernel in process: :class:`Kernel`, :class:`Session` and :class:`Events`."""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from . import _ring0
from ._tool import Tool, as_tool
from .errors import CallRejected

Message = Any
"""A model's message as the provider returned it: a dict (or list of output items), or its JSON
text."""


class Kernel:
    """ring0's kernel inside this process: your tools, the journal, the grants, approvals.

    ``state_dir`` holds the SQLite journal (``journal.db``: every mutating call is committed
    there before it runs, and its result recorded, so a re-run of the same turn — after a crash,
    or a framework re-running a step — is answered from it instead of run again) and the
    hash-chained audit log of authorization decisions (``audit.jsonl``; ``audit="writes"``, the
    default, records every decision but the allowed calls of read-only tools; ``"all"`` every
    one, at the cost of a file write per call; ``"off"`` none). Use a directory of its own that
    outlives the process; ``ring0 journal ls --state-dir DIR`` reads it.

    ``grants``: a list of dicts ``{"tools": ["send_*"], "ceiling": "A2", "approval": False,
    "approval_scope": "session", "rules": ["args.amount < 100"], "rate": "60/min",
    "unattended": False, "principals": [...], "name": "..."}``; the first grant naming a tool
    decides its calls. Without grants, every tool is granted up to A3, and a call is held for a
    person when the tool is A3, or acts (A1/A2) without a settlement.

    Held calls are decided by ``approver`` (a callable, or coroutine function, given the request
    dict: ``tool``, ``args``, ``args_hash``, ``reason``, ``summary``…; it answers ``True``,
    ``"session"``, ``False``, a reason string, or ``{"approve": …, "remember": …, "reason": …}``),
    or, without one, by ``approvals``: ``"hold"`` (the default: the call comes back to the model
    as ``approval_required``; once :meth:`approve` is called, the same call made again runs) or
    ``"wait"`` (the call waits for :meth:`approve` / :meth:`deny` from another thread or task).
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        tools: Iterable[Tool | Callable[..., Any]] = (),
        *,
        grants: Sequence[Mapping[str, Any]] | None = None,
        approver: Callable[[dict[str, Any]], Any] | None = None,
        approvals: str = "hold",
        approval_timeout: float = 300.0,
        audit: str | bool = "writes",
    ) -> None:
        self.tools: dict[str, Tool] = {}
        for t in tools:
            t = as_tool(t)
            self.tools[t.name] = t
        self._native = _ring0.NativeKernel(
            os.fspath(state_dir),
            [t._entry() for t in self.tools.values()],
            json.dumps(list(grants)) if grants is not None else None,
            approvals,
            approver,
            max(1, int(approval_timeout * 1000)),
            {True: "all", False: "off"}.get(audit, audit) if isinstance(audit, bool) else audit,
        )

    @property
    def state_dir(self) -> str:
        return os.fspath(self._native.state_dir)

    def session(
        self,
        scope: str = "default",
        *,
        mode: str = "safe_parallel",
        principal: str | None = None,
        session_id: str | None = None,
        attempt_epoch: int = 0,
        keyed: bool = True,
        max_concurrent_tools: int | None = None,
    ) -> Session:
        """A session: one agent run.

        ``scope`` is the user-intent scope of its calls (part of every call's identity): a
        session opened later with the same scope — in this process or the next — gets recorded
        results for calls that already ran, never second effects. ``keyed`` (default) journals
        each call under the provider's call id within the scope, so handing the same model turn
        over again never repeats a write; without it, an identical write whose result was
        delivered runs again (a genuine repeat).
        """
        native = self._native.session(
            scope, mode, principal, session_id, attempt_epoch, keyed, max_concurrent_tools
        )
        return Session(native, self)

    def pending_approvals(self) -> list[dict[str, Any]]:
        """Every call held for a person now."""
        return self._native.pending_approvals()

    def approve(self, approval_id: str, *, remember: bool = False) -> None:
        """Approves a held call (``remember``: identical calls of its session too, where the
        grant offers it)."""
        self._native.decide(approval_id, True, remember, "")

    def deny(self, approval_id: str, reason: str = "") -> None:
        """Denies a held call; the model is told ``reason``."""
        self._native.decide(approval_id, False, False, reason)

    def catalog(self) -> list[dict[str, Any]]:
        """Every tool's spec as the kernel registered it."""
        return self._native.tools()


class Session:
    """One agent run over a :class:`Kernel` (or, from :class:`ring0.Client`, a remote one)."""

    def __init__(self, native: Any, kernel: Kernel) -> None:
        self._native = native
        self.kernel = kernel
        # The hot path: bound once.
        self._handle = native.handle_turn

    @property
    def info(self) -> dict[str, str]:
        """``scope``, ``session_id`` and ``principal``."""
        return self._native.info

    @property
    def scope(self) -> str:
        return self._native.info["scope"]

    def handle_turn(self, format: str, message: Message, *, detailed: bool = False) -> Any:
        """Mediates every call of one model turn and returns the tool-result message(s) in the
        same ``format`` (``"openai"``: a list of ``role: tool`` messages; ``"responses"``: a list
        of ``function_call_output`` items; ``"anthropic"``: one ``user`` message of
        ``tool_result`` blocks). With ``detailed``, a dict: ``message``, ``results`` (each call's
        ``call_id``, ``tool``, ``content``, ``is_error``), ``terminated``, ``policy_message`` and
        ``receipts``.

        Coroutine tools run on a background asyncio loop; from async code use
        :meth:`ahandle_turn`.
        """
        if detailed:
            return self._handle(format, message, None, True)
        return self._handle(format, message)

    async def ahandle_turn(
        self, format: str, message: Message, *, detailed: bool = False
    ) -> Any:
        """:meth:`handle_turn` for asyncio: coroutine tools run on the running loop."""
        loop = asyncio.get_running_loop()
        call = functools.partial(self._handle, format, message, loop, detailed)
        return await loop.run_in_executor(None, call)

    def call(self, name: str, arguments: Mapping[str, Any] | None = None, *, call_id: str | None = None) -> Any:
        """One call through the whole pipeline, as if the model had made it: returns the result
        the model would see (parsed JSON, or text), or raises :class:`ring0.CallRejected` with
        the error envelope (a validation error names every field problem)."""
        cid = call_id or f"call_{os.urandom(8).hex()}"
        turn = {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(dict(arguments or {}))},
                }
            ],
        }
        out = self._handle("openai", turn, None, True)
        return _result_value(out["results"][0])

    def events(self) -> Events:
        """The session's events from now on (``round_started``, ``call_started``,
        ``call_finished``, ``call_rejected``, ``approval_required``, ``receipt``,
        ``round_finished``, …; never argument values)."""
        return Events(self._native.events())

    def pending_approvals(self) -> list[dict[str, Any]]:
        """The calls of this session held for a person now."""
        return self._native.pending_approvals()

    def approve(self, approval_id: str, *, remember: bool = False) -> None:
        """Approves a held call of this session."""
        self._native.decide(approval_id, True, remember, "")

    def deny(self, approval_id: str, reason: str = "") -> None:
        """Denies a held call of this session."""
        self._native.decide(approval_id, False, False, reason)

    def cancel(self) -> None:
        """Cancels the turn in progress: running calls settle, nothing new starts."""
        self._native.cancel()

    def user_message(self) -> None:
        """Say a genuine new user message arrived: lifts a repeat-guard termination."""
        self._native.user_message()

    def catalog(self) -> list[dict[str, Any]]:
        """The tools this session may call: ``name``, ``description``, ``input_schema``."""
        return self._native.catalog()

    def tool_definitions(self, format: str = "openai") -> list[dict[str, Any]]:
        """The tools this session may call, as the provider's request takes them."""
        return tool_definitions(self.catalog(), format)


def tool_definitions(catalog: Iterable[Mapping[str, Any]], format: str) -> list[dict[str, Any]]:
    out = []
    for t in catalog:
        if format == "openai":
            out.append(
                {
                    "type": "function",
                    "function": {
                        "name": t["name"],
                        "description": t["description"],
                        "parameters": t["input_schema"],
                    },
                }
            )
        elif format == "responses":
            out.append(
                {
                    "type": "function",
                    "name": t["name"],
                    "description": t["description"],
                    "parameters": t["input_schema"],
                }
            )
        elif format == "anthropic":
            out.append(
                {"name": t["name"], "description": t["description"], "input_schema": t["input_schema"]}
            )
        else:
            raise ValueError(f"{format!r}: write openai, responses or anthropic")
    return out


def _result_value(result: Mapping[str, Any]) -> Any:
    content = result.get("content")
    if result.get("is_error"):
        envelope = content if isinstance(content, dict) else {"status": "error", "message": str(content)}
        envelope = {"errors": [], "advice": "", **envelope}
        envelope.setdefault("message", envelope.get("status", "error"))
        raise CallRejected(envelope)
    return content


class Events:
    """A subscription to a session's events.

    Iterating yields the events already sent and stops when there are none left; :meth:`get`
    waits for the next one; ``async for`` waits too.
    """

    def __init__(self, native: Any) -> None:
        self._native = native

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        event = self._native.try_next()
        if event is None:
            raise StopIteration
        return event

    def get(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next event, waiting at most ``timeout`` seconds; ``None`` if none came."""
        return self._native.wait(timeout)

    def __aiter__(self) -> Events:
        return self

    async def __anext__(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        while True:
            event = self._native.try_next()
            if event is None:
                event = await loop.run_in_executor(None, self._native.wait, 0.25)
            if event is not None:
                return event
