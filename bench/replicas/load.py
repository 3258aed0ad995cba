"""Closed-loop load on ring0 replicas: CONCURRENCY threads, each sending stateless 2026-07-28
`tools/call`s of the mutating `cx__record` (each with a key of its own) to the replicas in turn
over keep-alive connections, for DURATION_S seconds after a warm-up. Prints one JSON object:
the calls answered, errors, and calls per second.

Usage: load.py DURATION_S CONCURRENCY ADDR [ADDR ...]   (ADDR: host:port of a replica)
"""
import http.client
import itertools
import json
import sys
import threading
import time
import uuid

WARMUP_S = 2.0

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"}}
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
           "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call",
           "Mcp-Name": "cx__record"}


def worker(n, addrs, stop, counts):
    conns = {}
    for i in itertools.count():
        if stop.is_set():
            return
        addr = addrs[(n + i) % len(addrs)]
        key = f"b-{uuid.uuid4().hex}"
        body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                           "params": {"name": "cx__record", "arguments": {"text": key},
                                      "_meta": dict(META, **{"io.ring0/idempotency-key": key})}})
        try:
            conn = conns.get(addr) or http.client.HTTPConnection(addr, timeout=60)
            conns[addr] = conn
            conn.request("POST", "/mcp", body, dict(HEADERS, Host=addr))
            resp = conn.getresponse()
            data = resp.read()
            ok = resp.status == 200 and b'"isError":false' in data.replace(b" ", b"")
        except Exception:  # noqa: BLE001 - counted as an error; a new connection next time
            conns.pop(addr, None)
            ok = False
        counts[n][0 if ok else 1] += 1
        counts[n][2 if ok else 3] = time.monotonic()


def main():
    duration, concurrency, addrs = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    stop = threading.Event()
    counts = [[0, 0, 0, 0] for _ in range(concurrency)]
    threads = [threading.Thread(target=worker, args=(n, addrs, stop, counts), daemon=True)
               for n in range(concurrency)]
    for t in threads:
        t.start()
    time.sleep(WARMUP_S)
    start_ok = sum(c[0] for c in counts)
    start_err = sum(c[1] for c in counts)
    began = time.monotonic()
    time.sleep(duration)
    ok = sum(c[0] for c in counts) - start_ok
    err = sum(c[1] for c in counts) - start_err
    elapsed = time.monotonic() - began
    stop.set()
    print(json.dumps({"replicas": len(addrs), "concurrency": concurrency, "calls": ok,
                      "errors": err, "seconds": round(elapsed, 2),
                      "calls_per_s": round(ok / elapsed, 1)}))


main()
