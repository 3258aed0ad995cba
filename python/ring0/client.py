"""``ring0.Client``: the same surface as :class:`ring0.Kernel`, over a remote
``ring0 serve --http`` agent API (``/v1``, see docs/api.md).

Your tools are registered with the session (``PUT /v1/sessions/{id}/tools``, the same declaration
``@ring0.tool`` makes); ring0 validates, authorizes, orders and journals every call, hands back
each call of yours as a pending ``run`` action with the prepared arguments, and this client runs
the function here and reports the outcome (``…/outcomes``). Only the standard library is used.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ._bridge import background_loop, to_json_value
from ._kernel import _result_value, tool_definitions
from ._tool import Tool, as_tool
from .errors import ApiError, NotApplied

#: How long one request waits for the turn to finish or to need us (the API's own default).
WAIT_MS = 60_000


class Client:
    """A ``ring0 serve --http`` agent API at ``base_url`` (``http://127.0.0.1:8808``), with an
    optional bearer ``token``."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout: float = 330.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            req.add_header("content-type", "application/json")
        if self.token:
            req.add_header("authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                envelope = json.loads(raw)
            except ValueError:
                envelope = {"status": "http_error", "message": raw.decode(errors="replace")}
            if not isinstance(envelope, dict):
                envelope = {"status": "http_error", "message": str(envelope)}
            envelope.setdefault("errors", [])
            envelope.setdefault("advice", "")
            raise ApiError(envelope, http_status=e.code) from None
        return json.loads(raw) if raw else None

    def session(
        self,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        *,
        format: str = "openai",
        mode: str | None = None,
        scope: str | None = None,
        grants: Mapping[str, Any] | None = None,
        limits: Mapping[str, Any] | None = None,
        approver: Callable[[dict[str, Any]], Any] | None = None,
    ) -> RemoteSession:
        """Creates a session (``POST /v1/sessions``) and registers ``tools`` with it.

        ``grants`` (``{"tools": [...], "ceiling": "A2"}``) only narrow what the server grants the
        principal. Held calls go to ``approver`` (as for :class:`ring0.Kernel`); without one they
        are held: the model is told, :meth:`RemoteSession.approve` approves, and the same call
        made again (the same turn re-run) runs.
        """
        body: dict[str, Any] = {"format": format}
        if mode is not None:
            body["mode"] = mode
        if scope is not None:
            body["scope"] = scope
        if grants is not None:
            body["grants"] = dict(grants)
        if limits is not None:
            body["limits"] = dict(limits)
        created = self._request("POST", "/v1/sessions", body)
        session = RemoteSession(self, created, approver)
        session.set_tools(tools)
        return session


class RemoteSession:
    """A session of a remote ring0: :meth:`handle_turn` runs your tools here when ring0 asks."""

    def __init__(self, client: Client, created: Mapping[str, Any], approver: Any) -> None:
        self.client = client
        self.id: str = created["id"]
        self.scope: str = created["scope"]
        self.principal: str = created["principal"]
        self.format: str = created["format"]
        self.tools: dict[str, Tool] = {}
        self._approver = approver
        self._held: dict[str, dict[str, Any]] = {}
        self._given: list[tuple[str, str, bool]] = []
        self._path = f"/v1/sessions/{self.id}"

    @property
    def info(self) -> dict[str, str]:
        return {"scope": self.scope, "session_id": self.id, "principal": self.principal}

    def set_tools(self, tools: Iterable[Tool | Callable[..., Any]]) -> None:
        """Registers the session's tools, replacing any before."""
        made = [as_tool(t) for t in tools]
        self.client._request("PUT", self._path + "/tools", {"tools": [t.definition for t in made]})
        self.tools = {t.name: t for t in made}

    def catalog(self) -> list[dict[str, Any]]:
        """The tools the session may call: yours and ring0's, under its grants."""
        return self.client._request("GET", self._path + "/tools")["tools"]

    def tool_definitions(self, format: str = "openai") -> list[dict[str, Any]]:
        return tool_definitions(self.catalog(), format)

    def handle_turn(self, format: str | None, message: Any, *, detailed: bool = False) -> Any:
        """Mediates one model turn remotely, running your tools here when ring0 asks, and
        returns the tool-result message(s) in the turn's format (``detailed``: a dict with
        ``message``, ``results``, ``terminated``, ``policy_message``)."""
        return self._run(format, message, detailed, None)

    async def ahandle_turn(self, format: str | None, message: Any, *, detailed: bool = False) -> Any:
        """:meth:`handle_turn` for asyncio: coroutine tools run on the running loop."""
        loop = asyncio.get_running_loop()
        call = functools.partial(self._run, format, message, detailed, loop)
        return await loop.run_in_executor(None, call)

    def call(self, name: str, arguments: Mapping[str, Any] | None = None, *, call_id: str | None = None) -> Any:
        """One call through the remote pipeline; raises :class:`ring0.CallRejected` on error."""
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
        out = self._run("openai", turn, True, None)
        return _result_value(out["results"][0])

    def _run(self, format: str | None, message: Any, detailed: bool, loop: Any) -> Any:
        if isinstance(message, str):
            message = json.loads(message)
        body: dict[str, Any] = {"message": message, "wait_ms": WAIT_MS}
        if format is not None:
            body["format"] = format
        view = self.client._request("POST", self._path + "/turns", body)
        while view["status"] != "complete":
            turn = view["turn"]
            if view["status"] == "running" or not view["pending"]:
                view = self.client._request(
                    "GET", f"{self._path}/turns/{turn}?wait_ms={WAIT_MS}"
                )
                continue
            outcomes = [self._answer(action, loop) for action in view["pending"]]
            view = self.client._request(
                "POST",
                f"{self._path}/turns/{turn}/outcomes",
                {"outcomes": outcomes, "wait_ms": WAIT_MS},
            )
        if not detailed:
            return view["results"]
        return {
            "message": view["results"],
            "results": _results_of(format or self.format, view["results"]),
            "terminated": view.get("terminated"),
            "policy_message": view.get("policy_message"),
        }

    def _answer(self, action: Mapping[str, Any], loop: Any) -> dict[str, Any]:
        if action["kind"] == "approval_required":
            return self._decide(action, loop)
        tool = self.tools.get(action["tool"])
        if tool is None:
            return {
                "id": action["id"],
                "error": {"message": f"no tool {action['tool']!r} here", "maybe_applied": False},
            }
        context = {
            "call_id": action["call_id"],
            "intent_id": action.get("intent_id"),
            "idempotency_key": action.get("idempotency_key"),
            "scope": self.scope,
            "session_id": self.id,
            "principal": self.principal,
            "timeout_ms": max(0, int(action.get("deadline_ms", 0))),
        }
        try:
            value = _await(tool.invoke(action["arguments"], context), loop)
            output = value if isinstance(value, str) else to_json_value(value)
            return {"id": action["id"], "output": output}
        except NotApplied as e:
            return {"id": action["id"], "error": {"message": str(e), "maybe_applied": False}}
        except Exception as e:  # noqa: BLE001 - the outcome of any other failure is unknown
            return {
                "id": action["id"],
                "error": {"message": f"{type(e).__name__}: {e}", "maybe_applied": True},
            }

    def _decide(self, action: Mapping[str, Any], loop: Any) -> dict[str, Any]:
        key = (action["tool"], action.get("args_hash") or "")
        for i, (tool, args_hash, remember) in enumerate(self._given):
            if (tool, args_hash) == key:
                del self._given[i]
                return {"id": action["id"], "approve": True, "remember": remember,
                        "args_hash": args_hash}
        request = {
            "id": action["id"],
            "tool": action["tool"],
            "call_id": action["call_id"],
            "args": action["arguments"],
            "args_hash": action.get("args_hash"),
            "reason": action.get("reason"),
            "summary": action.get("summary"),
            "deadline_ms": action.get("deadline_ms"),
            "session_id": self.id,
            "scope": self.scope,
            "principal": self.principal,
        }
        if self._approver is None:
            self._held[action["id"]] = request
            return {
                "id": action["id"],
                "approve": False,
                "reason": f"held for a person's approval (approval {action['id']}); "
                "the same call made again after it is approved runs",
            }
        try:
            answer = _await(self._approver(request), loop)
        except Exception as e:  # noqa: BLE001
            return {"id": action["id"], "approve": False, "reason": f"the approver failed: {e}"}
        approve, remember, reason = _read_answer(answer)
        out: dict[str, Any] = {"id": action["id"], "approve": approve}
        if approve:
            out["remember"] = remember
            if action.get("args_hash"):
                out["args_hash"] = action["args_hash"]
        else:
            out["reason"] = reason
        return out

    def pending_approvals(self) -> list[dict[str, Any]]:
        """The calls held for a person (answered to the model as not yet approved)."""
        return list(self._held.values())

    def approve(self, approval_id: str, *, remember: bool = False) -> None:
        """Approves a held call: the same call made again runs."""
        request = self._held.pop(approval_id, None)
        if request is None:
            from .errors import NotFound

            raise NotFound(
                {
                    "status": "not_found",
                    "message": f"no call is held for approval {approval_id!r}",
                    "errors": [{"loc": "/approval_id", "message": "not held"}],
                    "advice": "read pending_approvals() for the held calls",
                }
            )
        self._given.append((request["tool"], request["args_hash"] or "", remember))

    def deny(self, approval_id: str, reason: str = "") -> None:
        """Forgets a held call: the same call made again is held again."""
        self._held.pop(approval_id, None)

    def events(self) -> Iterator[dict[str, Any]]:
        """The session's events as the server streams them (blocks for the next one)."""
        req = urllib.request.Request(self.client.base_url + self._path + "/events")
        if self.client.token:
            req.add_header("authorization", f"Bearer {self.client.token}")
        resp = urllib.request.urlopen(req, timeout=self.client.timeout)

        def stream() -> Iterator[dict[str, Any]]:
            with resp:
                data: list[str] = []
                for raw in resp:
                    line = raw.decode("utf-8").rstrip("\r\n")
                    if line.startswith("data:"):
                        data.append(line[5:].lstrip())
                    elif not line and data:
                        yield json.loads("\n".join(data))
                        data = []

        return stream()

    def close(self) -> None:
        """Deletes the session: open turns are cancelled."""
        try:
            self.client._request("DELETE", self._path)
        except ApiError as e:
            if e.http_status != 404:
                raise

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _await(value: Any, loop: Any) -> Any:
    if not inspect.isawaitable(value):
        return value

    async def run() -> Any:
        return await value

    target = loop if loop is not None else background_loop()
    return asyncio.run_coroutine_threadsafe(run(), target).result()


def _read_answer(answer: Any) -> tuple[bool, bool, str]:
    if isinstance(answer, bool):
        return answer, False, "denied by the approver"
    if isinstance(answer, str):
        if answer == "session":
            return True, True, ""
        if answer in ("approve", "once"):
            return True, False, ""
        return False, False, answer
    if isinstance(answer, Mapping):
        return (
            bool(answer.get("approve")),
            bool(answer.get("remember")),
            str(answer.get("reason") or "denied by the approver"),
        )
    return bool(answer), False, "denied by the approver"


def _results_of(format: str, rendered: Any) -> list[dict[str, Any]]:
    """Each call's result (``call_id``, ``content``, ``is_error``) read back from the rendered
    message(s)."""
    out: list[dict[str, Any]] = []
    if format == "anthropic":
        for block in (rendered or {}).get("content", []):
            content = block.get("content")
            if isinstance(content, list):
                content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
            out.append({"call_id": block.get("tool_use_id"), "content": _parse(content),
                        "is_error": bool(block.get("is_error"))})
        return out
    for item in rendered or []:
        text = item.get("content") if format == "openai" else item.get("output")
        value = _parse(text)
        # A call that ran is answered with its receipt, completed; anything else is an error.
        outcome = value.get("outcome") if isinstance(value, dict) else None
        is_error = not (isinstance(outcome, dict) and outcome.get("kind") == "completed")
        out.append({"call_id": item.get("tool_call_id") or item.get("call_id"),
                    "content": value, "is_error": is_error})
    return out


def _parse(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


__all__ = ["Client", "RemoteSession"]
