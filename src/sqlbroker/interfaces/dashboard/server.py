"""The dashboard's HTTP server (stdlib ``http.server``, one thread per request).

Security model:

- it binds to 127.0.0.1 by default and refuses any other address unless an access token is
  set; with a token every request must carry it (``Authorization: Bearer …``, or the
  ``HttpOnly``, ``SameSite=Strict`` cookie that opening ``/?token=…`` once sets);
- without a token (loopback only) the ``Host`` header must name the address it listens
  on (or ``localhost``), which defeats DNS rebinding; with a token any ``Host`` is
  accepted (a remote dashboard is reached by names the server cannot know), since a
  rebound page holds neither the token nor its cookie, which belongs to another origin;
- a ``POST`` body needs a plain ``Content-Length`` of at most 64 KiB (no chunked body);
- request lines are logged (DEBUG) with a ``token=`` value masked;
- actions are ``POST`` with a JSON body and an ``X-CSRF-Token`` header equal to the random
  token in the page; a cross-site form can send neither, and a cross-origin script cannot
  read the token; an ``Origin`` header, when sent, must be this server;
- the page renders every value as text (``textContent``, SVG built node by node), and a
  strict Content-Security-Policy forbids inline scripts, so data can never become markup.
"""

from __future__ import annotations

import hmac
import http.server
import ipaddress
import json
import logging
import secrets
import socket
import threading
from collections.abc import Sequence
from http import HTTPStatus
from http.cookies import SimpleCookie
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from sqlbroker.app import Broker
from sqlbroker.core.errors import (
    ConfigurationError,
    InvalidOption,
    NotFound,
    SqlbrokerError,
    ValidationError,
)
from sqlbroker.interfaces.dashboard.api import Api, Extension
from sqlbroker.interfaces.dashboard.pages import BUILT_IN
from sqlbroker.storage.url import redact

log = logging.getLogger("sqlbroker.dashboard")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
TOKEN_COOKIE = "sqlbroker_dashboard"
MAX_BODY = 64 * 1024
_STATIC = {
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/app.css": ("app.css", "text/css; charset=utf-8"),
}
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self';"
        " connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _static(name: str) -> bytes:
    return resources.files("sqlbroker.interfaces.dashboard").joinpath("static", name).read_bytes()


class Dashboard:
    """A dashboard for ``broker``. ``start()`` serves from a thread; ``serve_forever()``
    blocks. Raises ``ConfigurationError`` for a non-loopback ``host`` without ``token``."""

    def __init__(
        self,
        broker: Broker,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        token: str | None = None,
        refresh: float = 2.0,
        extensions: Sequence[Extension] = (),
    ) -> None:
        if not is_loopback(host) and not token:
            raise ConfigurationError(
                f"refusing to serve the dashboard on {host} without an access token:"
                " pass --token (or bind to 127.0.0.1)"
            )
        if token is not None and len(token) < 16:
            raise InvalidOption("token", "must be at least 16 characters")
        self.api = Api(broker, {e.name: e for e in (*BUILT_IN, *extensions)})
        self.token = token
        self.csrf = secrets.token_urlsafe(32)
        self.refresh = refresh
        server = _IPv6Server if ":" in host else http.server.ThreadingHTTPServer
        self._server = server((host.strip("[]"), port), _handler_for(self))
        self._server.daemon_threads = True
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{shown}:{self.port}/"

    def add_extension(self, extension: Extension) -> None:
        self.api.extensions[extension.name] = extension

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="sqlbroker-dashboard", daemon=True
        )
        self._thread.start()

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def index(self) -> bytes:
        page = _static("index.html").decode()
        page = page.replace("__CSRF__", self.csrf).replace("__REFRESH__", f"{self.refresh:g}")
        return page.encode()

    def host_allowed(self, host: str) -> bool:
        """Whether a request's ``Host`` header (or an ``Origin``'s host) may be served:
        any with a token, else one naming this server (see the module docstring)."""
        return self.token is not None or host.lower() in self.allowed_hosts()

    def allowed_hosts(self) -> set[str]:
        names = {self.host, f"[{self.host}]"}
        if is_loopback(self.host):
            names |= {"localhost", "127.0.0.1", "[::1]"}
        return {f"{name}:{self.port}" for name in names} | names


class _IPv6Server(http.server.ThreadingHTTPServer):
    """For ``--host ::`` or another IPv6 address (the stdlib server speaks IPv4 only)."""

    address_family = socket.AF_INET6


def _handler_for(dashboard: Dashboard) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(_Handler):
        board = dashboard

    return Handler


class _Handler(http.server.BaseHTTPRequestHandler):
    board: Dashboard
    server_version = "sqlbroker-dashboard"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        # The request line carries the token when a browser opens /?token=… to log in.
        log.debug("%s %s", self.address_string(), redact(format % args))

    # --- responses ---------------------------------------------------------------------------

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in {**_SECURITY_HEADERS, **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, data: Any) -> None:
        body = json.dumps(data, ensure_ascii=False, allow_nan=False).encode()
        self._send(status, body, "application/json; charset=utf-8")

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message})

    # --- checks ------------------------------------------------------------------------------

    def _token_ok(self) -> bool:
        expected = self.board.token
        if expected is None:
            return True
        given = ""
        auth = self.headers.get("Authorization") or ""
        if auth.startswith("Bearer "):
            given = auth[len("Bearer ") :].strip()
        else:
            cookie = SimpleCookie(self.headers.get("Cookie") or "")
            if TOKEN_COOKIE in cookie:
                given = cookie[TOKEN_COOKIE].value
        return hmac.compare_digest(given.encode(), expected.encode())

    def _admit(self, *, token: bool = True) -> bool:
        """Whether to serve the request (else its refusal is sent): the ``Host`` header
        must be allowed, and unless ``token`` is false, the access token given."""
        if not self.board.host_allowed(self.headers.get("Host") or ""):
            self._error(HTTPStatus.MISDIRECTED_REQUEST, "unexpected Host header")
            return False
        if token and not self._token_ok():
            self._error(HTTPStatus.UNAUTHORIZED, "missing or wrong access token")
            return False
        return True

    # --- GET ---------------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = dict(parse_qsl(parts.query))
        if parts.path == "/" and "token" in query and self.board.token is not None:
            self._login(query["token"])
            return
        if not self._admit():
            return
        if parts.path == "/":
            self._send(HTTPStatus.OK, self.board.index(), "text/html; charset=utf-8")
            return
        if parts.path == "/favicon.ico":
            self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
            return
        if parts.path in _STATIC:
            name, content_type = _STATIC[parts.path]
            self._send(HTTPStatus.OK, _static(name), content_type)
            return
        segments = [unquote(s) for s in parts.path.split("/")[1:]]
        if segments[:1] != ["api"]:
            self._error(HTTPStatus.NOT_FOUND, "no such page")
            return
        self._call(lambda: self._read(segments[1:], query))

    def _login(self, token: str) -> None:
        if not self._admit(token=False):
            return
        expected = self.board.token or ""
        if not hmac.compare_digest(token.encode(), expected.encode()):
            self._error(HTTPStatus.UNAUTHORIZED, "wrong access token")
            return
        cookie = f"{TOKEN_COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/"
        self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", {"Location": "/", "Set-Cookie": cookie})

    def _read(self, route: list[str], query: dict[str, str]) -> Any:
        api = self.board.api
        match route:
            case ["overview"]:
                return api.overview()
            case ["subscriptions", name]:
                return api.subscription(name)
            case ["dead"]:
                return api.dead_letters(query)
            case ["dead", dead_id]:
                return api.dead_letter(dead_id)
            case ["audit"]:
                return api.audit()
            case ["extensions"]:
                return {"pages": api.extension_list()}
            case ["extensions", name]:
                return api.extension(name)
        raise NotFound("no such API route")

    # --- POST --------------------------------------------------------------------------------

    def do_POST(self) -> None:
        if not self._admit():
            return
        origin = self.headers.get("Origin")
        if origin is not None and not self._same_origin(origin):
            self._error(HTTPStatus.FORBIDDEN, "cross-origin request refused")
            return
        csrf = self.headers.get("X-CSRF-Token") or ""
        if not hmac.compare_digest(csrf.encode(), self.board.csrf.encode()):
            self._error(HTTPStatus.FORBIDDEN, "missing or wrong CSRF token")
            return
        if not (self.headers.get("Content-Type") or "").startswith("application/json"):
            self._error(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "send application/json")
            return
        length = self._body_length()
        if length is None:
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._error(HTTPStatus.BAD_REQUEST, "the body is not JSON")
            return
        route = [unquote(s) for s in urlsplit(self.path).path.split("/")[1:]]
        if route[:2] != ["api", "dead"] or len(route) != 3 or not isinstance(body, dict):
            self._error(HTTPStatus.NOT_FOUND, "no such action")
            return
        self._call(lambda: self.board.api.act(route[2], body, self._actor(body)))

    def _same_origin(self, origin: str) -> bool:
        netloc = urlsplit(origin).netloc.lower()
        host = (self.headers.get("Host") or "").lower()
        return netloc == host or netloc in self.board.allowed_hosts()

    def _body_length(self) -> int | None:
        """The body's length from a plain decimal ``Content-Length`` of at most
        :data:`MAX_BODY` (none: 0); else the refusal is sent and ``None`` returned. A
        negative or garbled length must not reach ``rfile.read``, where -1 reads to EOF."""
        if self.headers.get("Transfer-Encoding"):
            self._error(HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length")
            return None
        lengths = self.headers.get_all("Content-Length") or ["0"]
        text = lengths[0].strip()
        if len(lengths) != 1 or not text.isascii() or not text.isdigit():
            self._error(HTTPStatus.BAD_REQUEST, "Content-Length must be one decimal number")
            return None
        if int(text) > MAX_BODY:
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request too large")
            return None
        return int(text)

    def _actor(self, body: dict[str, Any]) -> str:
        name = body.get("actor")
        who = name.strip()[:64] if isinstance(name, str) and name.strip() else "anonymous"
        return f"dashboard:{who}@{self.client_address[0]}"

    def _call(self, work: Any) -> None:
        try:
            data = work()
        except NotFound as error:
            self._error(HTTPStatus.NOT_FOUND, str(error))
        except ValidationError as error:
            self._error(HTTPStatus.BAD_REQUEST, str(error))
        except SqlbrokerError as error:
            log.warning("dashboard request failed: %s", error)
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, str(error))
        except Exception:
            log.exception("dashboard request failed")
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error (see the server log)")
        else:
            self._json(HTTPStatus.OK, data)
