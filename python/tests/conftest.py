"""Fixtures of the Python package's tests: a state directory per test, an effects file that
counts what write tools really did, and a real `ring0 serve --http` for the Client's tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

# The Agents SDK exports traces to OpenAI unless told not to: these tests talk to no service.
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")


class Effects:
    """A file with one line per effect a tool had: what a re-run must not add to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_text("")

    def record(self, what: str) -> None:
        with self.path.open("a") as f:
            f.write(what + "\n")

    def lines(self) -> list[str]:
        return self.path.read_text().splitlines()

    def count(self, what: str | None = None) -> int:
        return sum(1 for line in self.lines() if what is None or line == what)


@pytest.fixture
def effects(tmp_path: Path) -> Effects:
    return Effects(tmp_path / "effects.txt")


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


def openai_turn(*calls: tuple[str, str, dict]) -> dict:
    """A Chat Completions assistant message with these (call id, tool, arguments) calls."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for cid, name, args in calls
        ],
    }


def content(message: dict) -> dict:
    """The JSON a Chat Completions tool message carries."""
    return json.loads(message["content"])


def observed(message: dict):
    """The tool's own output inside a successful call's result."""
    body = content(message)
    obs = body["outcome"]["observation"]
    return obs["structured"] if obs.get("structured") is not None else obs["text"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def ring0_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`ring0 serve --http` on a free loopback port, its workspace and state of its own."""
    binary = os.environ.get("RING0_BIN")
    if not binary:
        pytest.skip("RING0_BIN names no ring0 binary (scripts/test-python.sh sets it)")
    base = tmp_path_factory.mktemp("serve")
    workspace, state = base / "ws", base / "state"
    workspace.mkdir()
    (workspace / "README.md").write_text("hello from the workspace\n")
    # The tests' host tools: reads and settled writes granted; anything else (A3) falls to the
    # embedded default grant that holds every call for a person.
    (workspace / "ring0.toml").write_text(
        '[[grants]]\nname = "host-reads"\ntools = ["lookup"]\nceiling = "A0"\n\n'
        '[[grants]]\nname = "host-writes"\ntools = ["refund", "slow_refund"]\nceiling = "A2"\n'
    )
    port = _free_port()
    log = (base / "serve.log").open("w")
    proc = subprocess.Popen(
        [binary, "--workspace", str(workspace), "--state-dir", str(state), "serve", "--http",
         f"127.0.0.1:{port}"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/v1/openapi.json", timeout=1).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"ring0 serve did not start: {(base / 'serve.log').read_text()}")
            time.sleep(0.1)
    yield url
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
