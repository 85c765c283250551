"""A stand-in for the Kubernetes API server's calls the reaper makes, over real TLS with a CA of
the test's own, and a service-account dir (token, ca.crt) as the kubelet mounts it into a pod:
GET a Node, and POST and PATCH an events.k8s.io/v1 Event. No API server package exists for this
machine; the Node documents it serves follow core/v1's Node as the API returns it (kind,
apiVersion, metadata, spec, status), and an Event is answered as the API answers it (the object
as stored: the body with a uid, a resourceVersion and a creationTimestamp).

It can also refuse every Event write (`refuse_events`, e.g. 403 as an API server answers a
service account without the RBAC rule) or hold each one unanswered until the test lets go
(`hang`), to show what an API that is down or stuck costs the agent.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TOKEN = "reaper-test-token"
EVENTS = "/apis/events.k8s.io/v1/namespaces/default/events"
# How long a held write waits for the test to let go: a backstop for a test that never does,
# beyond any call a test holds on purpose (the test lets go, or the client's deadline ends it).
HOLD_LIMIT = 300.0


def node_doc(name: str, *pod_cidrs: str) -> dict[str, object]:
    """A Node as `GET /api/v1/nodes/NAME` returns it, trimmed to what a real one always has."""
    spec: dict[str, object] = {"providerID": f"kind://docker/test/{name}"}
    if pod_cidrs:
        spec["podCIDR"] = pod_cidrs[0]
        spec["podCIDRs"] = list(pod_cidrs)
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": "0f6c1f7e-3b8e-4d5c-9f1a-2b3c4d5e6f70",
            "labels": {"kubernetes.io/os": "linux"},
        },
        "spec": spec,
        "status": {"addresses": [{"type": "InternalIP", "address": "172.18.0.2"}], "images": []},
    }


@dataclass
class ApiServer:
    """What it serves (path -> status, body) and what it was asked (path, Authorization)."""

    host: str
    port: int
    sa_dir: Path
    routes: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    seen: list[tuple[str, str]] = field(default_factory=list)
    # Event writes as received: (method, path, Content-Type, the JSON body)
    writes: list[tuple[str, str, str, dict[str, object]]] = field(default_factory=list)
    events: dict[str, dict[str, object]] = field(default_factory=dict)  # stored, by name
    refuse_events: int | None = None  # answer every Event write with this status
    hang: threading.Event | None = None  # while set to an unset Event, writes wait for it
    received: threading.Condition = field(default_factory=threading.Condition)

    def posted(self) -> list[dict[str, object]]:
        """The bodies of the Events POSTed, in order."""
        return [body for method, _, _, body in self.writes if method == "POST"]

    def wait_for_writes(self, count: int, timeout: float = 10.0) -> bool:
        with self.received:
            return self.received.wait_for(lambda: len(self.writes) >= count, timeout)

    def env(self) -> dict[str, str]:
        """The variables a pod gets, and where its service-account files are."""
        return {
            "KUBERNETES_SERVICE_HOST": self.host,
            "KUBERNETES_SERVICE_PORT": str(self.port),
            "REAPER_SERVICEACCOUNT_DIR": str(self.sa_dir),
        }

    def serve_node(self, name: str, *pod_cidrs: str) -> None:
        self.routes[f"/api/v1/nodes/{name}"] = (200, json.dumps(node_doc(name, *pod_cidrs)).encode())


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_pki(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it: (ca.crt, server.crt, server.key)."""
    ca_key, ca_crt = directory / "ca.key", directory / "ca.crt"
    key, csr, crt = directory / "server.key", directory / "server.csr", directory / "server.crt"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca_crt),
             "-days", "2", "-subj", "/CN=reaper-test-ca")  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    ext = directory / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(crt), "-days", "2", "-extfile", str(ext))  # fmt: skip
    return ca_crt, crt, key


@contextmanager
def api_server(directory: Path) -> Iterator[ApiServer]:
    """Serve on 127.0.0.1 (a free port) until the block ends; the service-account dir holds the
    token and the CA that signed the server's certificate."""
    ca_crt, crt, key = make_pki(directory)
    sa_dir = directory / "serviceaccount"
    sa_dir.mkdir()
    (sa_dir / "token").write_text(TOKEN)
    (sa_dir / "ca.crt").write_bytes(ca_crt.read_bytes())
    state = ApiServer("127.0.0.1", 0, sa_dir)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.seen.append((self.path, self.headers.get("Authorization", "")))
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                status, body = 401, b'{"kind":"Status","code":401,"reason":"Unauthorized"}'
            else:
                status, body = state.routes.get(self.path, (404, b'{"kind":"Status","code":404}'))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self._write("POST")

        def do_PATCH(self) -> None:
            self._write("PATCH")

        def _write(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            body = json.loads(raw) if raw else {}
            with state.received:
                state.writes.append((method, self.path.split("?")[0], self.headers.get("Content-Type", ""), body))
                state.received.notify_all()
            if state.hang is not None:
                state.hang.wait(HOLD_LIMIT)  # never answered while the test holds it
                return
            status, answer = self._event(method, body)
            self._answer(status, json.dumps(answer).encode())

        def _event(self, method: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
            path = self.path.split("?")[0]
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                return 401, {"kind": "Status", "code": 401, "reason": "Unauthorized"}
            if state.refuse_events is not None:
                return state.refuse_events, {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "message": 'events.events.k8s.io is forbidden: User "system:serviceaccount:x:y" cannot create',
                    "reason": "Forbidden",
                    "code": state.refuse_events,
                }
            if method == "POST" and path == EVENTS:
                meta = body.get("metadata")
                name = meta.get("name") if isinstance(meta, dict) else None
                if not isinstance(name, str) or name in state.events:
                    return 409, {"kind": "Status", "code": 409, "reason": "AlreadyExists"}
                stored = {**body, "metadata": {**meta, "uid": str(uuid.uuid4()), "resourceVersion": "1"}}  # type: ignore[dict-item]
                state.events[name] = stored
                return 201, stored
            name = path.removeprefix(EVENTS + "/")
            if method == "PATCH" and path.startswith(EVENTS + "/") and name in state.events:
                state.events[name] = {**state.events[name], **body}  # a merge patch, one level deep
                return 200, state.events[name]
            return 404, {"kind": "Status", "code": 404, "reason": "NotFound"}

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(crt, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        if state.hang is not None:
            state.hang.set()  # let held handlers end, so the server can stop
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
