"""STAND-IN for a vLLM server whose /health turns 500 mid-run while the process stays up (used only
by the "unhealthy mid-run" fault).

A real vLLM answers /health 200 until its engine dies, and then the process exits too; it cannot be
made to report unhealthy while it keeps serving. This process speaks the small part of vLLM's HTTP
API a trial touches (``/health``, ``/v1/models``, ``/metrics``, ``/version``, streamed
``/v1/completions`` and ``/v1/chat/completions`` that require ``Authorization: Bearer
$VLLM_API_KEY``), streams one token every 0.25 s, never finishes a long request quickly, and turns
``/health`` to 500 ``HEALTH_500_AFTER_S`` seconds (env, default 2) after the first generation
request. It parses ``--host`` and ``--port`` from ``vllm serve``-style argv.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATE = {"first_request": 0.0}
LOCK = threading.Lock()
TOKEN_S = 0.25


def _arg(name: str, default: str) -> str:
    argv = sys.argv[1:]
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else default


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        sys.stdout.write("stand-in: " + (format % args) + "\n")
        sys.stdout.flush()

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _unhealthy(self) -> bool:
        first = STATE["first_request"]
        return bool(first) and time.monotonic() - first > float(os.environ.get("HEALTH_500_AFTER_S", "2"))

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(500 if self._unhealthy() else 200, b"")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": "model", "object": "model"}]}).encode())
        elif self.path == "/metrics":
            self._send(200, b"# stand-in: no metrics\n", "text/plain")
        elif self.path == "/version":
            self._send(200, b'{"version": "stand-in"}')
        else:
            self._send(404, b"{}")

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.headers.get("authorization") != f"Bearer {os.environ.get('VLLM_API_KEY', '')}":
            self._send(401, b'{"error": "Unauthorized"}')
            return
        with LOCK:
            STATE["first_request"] = STATE["first_request"] or time.monotonic()
        chat = self.path.endswith("/chat/completions")
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        try:
            for _ in range(int(body.get("max_tokens") or 16)):
                choice = {"index": 0, "delta": {"content": "a"}} if chat else {"index": 0, "text": "a"}
                self._chunk(f"data: {json.dumps({'choices': [choice]})}\n\n")
                time.sleep(TOKEN_S)
            self._chunk("data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            return

    def _chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def main() -> None:
    server = ThreadingHTTPServer((_arg("--host", "127.0.0.1"), int(_arg("--port", "8000"))), Handler)
    server.daemon_threads = True
    print("stand-in: serving", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
