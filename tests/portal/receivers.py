"""Real local receivers for alert tests: an HTTP server and an SMTP server, each in a
thread on loopback, recording what they were sent.

- ``WebhookReceiver``: ``http.server`` answering each POST with the next of its scripted
  answers (status, headers), the last one repeated; ``requests`` holds what arrived.
- ``SMTPReceiver``: a minimal SMTP server (EHLO/HELO, MAIL, RCPT, DATA, RSET, NOOP, QUIT)
  on ``socketserver``: enough for Django's SMTP backend, with no dependency.
"""

from __future__ import annotations

import socketserver
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class WebhookReceiver:
    answers: list[tuple[int, dict[str, str]]] = field(default_factory=lambda: [(200, {})])
    requests: list[Received] = field(default_factory=list)
    server: Any = None

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> WebhookReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                received = Received(self.path, {k: v for k, v in self.headers.items()}, body)
                receiver.requests.append(received)
                index = min(len(receiver.requests), len(receiver.answers)) - 1
                status, headers = receiver.answers[index]
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            do_GET = do_POST

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Mail:
    sender: str
    recipients: list[str]
    data: str


class _SMTPHandler(socketserver.StreamRequestHandler):
    def _say(self, line: str) -> None:
        self.wfile.write(f"{line}\r\n".encode())

    def handle(self) -> None:
        box: list[Mail] = self.server.box  # type: ignore[attr-defined]
        self._say("220 localhost test SMTP")
        sender, recipients = "", []
        while True:
            raw = self.rfile.readline()
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            verb = line[:4].upper()
            if verb in ("EHLO", "HELO"):
                self._say("250 localhost")
            elif verb == "MAIL":
                sender, recipients = line.partition(":")[2].strip(" <>"), []
                self._say("250 OK")
            elif verb == "RCPT":
                recipients.append(line.partition(":")[2].strip(" <>"))
                self._say("250 OK")
            elif verb == "DATA":
                self._say("354 end with <CRLF>.<CRLF>")
                lines = []
                while True:
                    chunk = self.rfile.readline().decode("utf-8", "replace")
                    if chunk in (".\r\n", ".\n", ""):
                        break
                    lines.append(chunk)
                box.append(Mail(sender, recipients, "".join(lines)))
                self._say("250 queued")
            elif verb in ("RSET", "NOOP"):
                self._say("250 OK")
            elif verb == "QUIT":
                self._say("221 bye")
                return
            else:
                self._say("502 not implemented")


class SMTPReceiver:
    def __init__(self) -> None:
        self.box: list[Mail] = []
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _SMTPHandler)
        self.server.daemon_threads = True
        self.server.box = self.box  # type: ignore[attr-defined]

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def start(self) -> SMTPReceiver:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
