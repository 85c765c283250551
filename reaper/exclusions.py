"""What the operator keeps out of the reaper's reach: pods by namespace or name, networks.

Shell globs, whole and case-sensitive, matched against the attachment's network (its key) and
pod (the CNI_ARGS its cache entry keeps: with no entry, only a network exclusion can keep it).
An exclusion only ever keeps: a matching attachment is never reclaimed, whatever it is.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from msgspec import Struct


class Exclusions(Struct, frozen=True, kw_only=True):
    namespaces: tuple[str, ...] = ()  # globs of pod namespaces
    pods: tuple[str, ...] = ()  # globs of NAMESPACE/NAME
    networks: tuple[str, ...] = ()  # globs of network names

    def __bool__(self) -> bool:
        return bool(self.namespaces or self.pods or self.networks)

    def reason(self, *, pod: str | None, network: str | None) -> str | None:
        """Why an attachment of `pod` ("namespace/name" or None) on `network` is excluded; None if none matches."""
        if network is not None:
            for glob in self.networks:
                if fnmatchcase(network, glob):
                    return f"excluded: network {network} matches --exclude-network {glob}"
        if pod is not None:
            namespace = pod.split("/", 1)[0]
            for glob in self.namespaces:
                if fnmatchcase(namespace, glob):
                    return f"excluded: pod {pod} is in a namespace matching --exclude-namespace {glob}"
            for glob in self.pods:
                if fnmatchcase(pod, glob):
                    return f"excluded: pod {pod} matches --exclude-pod {glob}"
        return None


def pod_glob(text: str) -> str:
    """An --exclude-pod value: NAMESPACE/NAME, either part a glob."""
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"{text[:80]!r} is not NAMESPACE/NAME (globs allowed, e.g. kube-system/coredns-*)")
    return text


def name_glob(text: str) -> str:
    """An --exclude-namespace or --exclude-network value: a glob with no "/"."""
    if not text or "/" in text or len(text) > 253:
        raise ValueError(f"{text[:80]!r} is not a name or a glob of names")
    return text
