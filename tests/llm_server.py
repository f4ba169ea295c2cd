"""A real OpenAI-compatible chat-completions server on 127.0.0.1 that replays a script.

Each request to `/v1/chat/completions` takes the next `Reply` of the script: a completion with
its content and token counts, an HTTP error status, or a reply held back `delay_s` seconds so
the client times out. Every request body is kept in `requests`; a reply's `expect` checks the
request it answers (that a prompt carries the site problem, or a repair the feedback), and
what it finds wrong is collected in `failures` for the test to assert on.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Request = dict[str, Any]


@dataclass(frozen=True)
class Reply:
    content: str = ""
    status: int = 200
    delay_s: float = 0.0
    prompt_tokens: int = 1200
    completion_tokens: int = 300
    expect: Callable[[Request], str | None] | None = None  # a complaint about the request


def prompt_text(request: Request) -> str:
    return "\n".join(m["content"] for m in request["messages"])


def last_user_text(request: Request) -> str:
    return next(m["content"] for m in reversed(request["messages"]) if m["role"] == "user")


def contains(*needles: str, where: Callable[[Request], str] = prompt_text
             ) -> Callable[[Request], str | None]:
    """An `expect` that every needle is in the request's prompt."""

    def check(request: Request) -> str | None:
        text = where(request)
        missing = [n for n in needles if n not in text]
        return f"the prompt lacks {missing!r}" if missing else None

    return check


def closed_port_url() -> str:
    """The URL of a port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that timed out has hung up before its late reply: that is the scenario."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class LlmServer:
    def __init__(self, script: list[Reply]) -> None:
        self.script = list(script)
        self.requests: list[Request] = []
        self.failures: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0  # requests being answered at once, at most
        self.lock = threading.Lock()
        self.httpd = _Server(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> LlmServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _next(self, request: Request) -> Reply | None:
        with self.lock:
            self.requests.append(request)
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            number = len(self.requests)
            if not self.script:
                self.failures.append(f"request {number} came after the script ran out")
                return None
            reply = self.script.pop(0)
            complaint = reply.expect(request) if reply.expect else None
            if complaint:
                self.failures.append(f"request {number}: {complaint}")
            return reply

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                """Quiet: the test output shows only what the tests report."""

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                request = json.loads(self.rfile.read(length))
                if self.path != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                reply = server._next(request)
                try:
                    self._answer(reply, request)
                finally:
                    with server.lock:
                        server.in_flight -= 1

            def _answer(self, reply: Reply | None, request: dict[str, Any]) -> None:
                if reply is None:
                    self._send(500, {"error": {"message": "the script ran out"}})
                    return
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if reply.status != 200:
                    self._send(reply.status, {"error": {"message": f"scripted {reply.status}",
                                                        "type": "scripted"}})
                    return
                self._send(200, {
                    "id": f"chatcmpl-{len(server.requests)}", "object": "chat.completion",
                    "created": 0, "model": request["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": reply.content}}],
                    "usage": {"prompt_tokens": reply.prompt_tokens,
                              "completion_tokens": reply.completion_tokens,
                              "total_tokens": reply.prompt_tokens + reply.completion_tokens},
                })

        return Handler
