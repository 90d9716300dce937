"""The request handler the integrations' small HTTP servers share (``gfsim cap-proxy``, the
mutation server): JSON answers with their length, and no access log on stderr."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

__all__ = ["JsonHandler"]


class JsonHandler(BaseHTTPRequestHandler):
    """``send_json(status, body, extra)``: ``body`` (an object, or bytes already encoded) as
    ``application/json``, with ``extra`` headers."""

    def log_message(self, *args) -> None:  # quiet
        pass

    def send_json(self, status: int, body, extra: dict | None = None) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
