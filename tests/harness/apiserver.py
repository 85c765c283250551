"""A stand-in for the Kubernetes API server's one call the reaper makes (GET a Node), over real
TLS with a CA of the test's own, and a service-account dir (token, ca.crt) as the kubelet
mounts it into a pod. No API server package exists for this machine; the Node documents it
serves follow core/v1's Node as the API returns it (kind, apiVersion, metadata, spec, status).
"""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TOKEN = "reaper-test-token"


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
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
