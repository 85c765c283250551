"""Where the pod's Kubernetes API is, and its service account's credentials, read as every input
is: bounded, never blocking on a FIFO, the token checked before it goes into a header, the CA
parsed before it is trusted. In-cluster access only: a kubeconfig on the node is an admin's.
The client itself is reaper.kubeclient, imported only by what talks to the API."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from msgspec import Struct

from reaper.host.confined import UnfitFile, read_admins

SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
API_TIMEOUT = 5.0
MAX_SECRET_BYTES = 1 << 20
# RFC 6750's b64token: what a service-account token (a JWT) is made of
_BEARER_TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")
# RFC 1123 subdomain, as Kubernetes names nodes
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_node_name(name: str) -> bool:
    """A name Kubernetes could have given a Node (and so safe in an API path)."""
    return len(name) <= 253 and _NODE_NAME.fullmatch(name) is not None


class KubeApiError(Exception):
    """The API cannot be reached or answered wrongly; the message is one line for the operator."""


def in_cluster(env: Mapping[str, str]) -> bool:
    """Running in a pod that may ask the API server (the variables every pod gets)."""
    return bool(env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT"))


def _read_secret(directory: str, name: str) -> bytes:
    path = os.path.join(directory, name)
    try:
        return read_admins(path, MAX_SECRET_BYTES)
    except OSError as err:
        raise KubeApiError(f"cannot read {path}: {err.strerror or err}") from None
    except UnfitFile as err:
        raise KubeApiError(f"cannot read {path}: {err}") from None


class ServiceAccount(Struct, frozen=True, kw_only=True):
    """The API server's address and the pod's credentials, each checked."""

    host: str
    port: int
    token: str
    ca_pem: str
    ca_path: str

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def server(self) -> str:
        return f"https://[{self.host}]:{self.port}" if ":" in self.host else f"https://{self.host}:{self.port}"


def service_account(env: Mapping[str, str]) -> ServiceAccount:
    """The pod's API access (`REAPER_SERVICEACCOUNT_DIR` overrides where the token and CA are);
    KubeApiError with one line when a part of it is missing or unfit."""
    import ssl  # noqa: PLC0415 (only a pod that asks the API needs it)

    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise KubeApiError(f"KUBERNETES_SERVICE_PORT {port[:20]!r} is not a port")
    if not host or any(c in host for c in "/?#@[] \r\n") or len(host) > 253:
        raise KubeApiError(f"KUBERNETES_SERVICE_HOST {host[:60]!r} is not a host")
    sa_dir = env.get("REAPER_SERVICEACCOUNT_DIR") or SERVICEACCOUNT_DIR
    token = _read_secret(sa_dir, "token").decode("ascii", "replace").strip()
    if not _BEARER_TOKEN.fullmatch(token):  # nothing else goes into a header
        raise KubeApiError(f"{sa_dir}/token is not a bearer token")
    ca_pem = _read_secret(sa_dir, "ca.crt").decode("ascii", "replace")
    try:
        ssl.create_default_context().load_verify_locations(cadata=ca_pem)
    except (ssl.SSLError, ValueError) as err:  # ValueError: no certificate in it at all
        raise KubeApiError(f"{sa_dir}/ca.crt is not a CA certificate: {getattr(err, 'reason', None) or err}") from None
    return ServiceAccount(host=host, port=int(port), token=token, ca_pem=ca_pem, ca_path=os.path.join(sa_dir, "ca.crt"))
