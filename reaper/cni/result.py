"""What a CNI result (a cached result handed on as prevResult) names, read as the plugins read it.

Keys match as Go's encoding/json folds them, every spelling weighed; addresses compare as
(version, integer) keys, IPv4-mapped folded to IPv4; what is no readable result is ResultError.
Why: docs/design.md, "What a DEL sends, and how a result is read".
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from msgspec import Struct

AddressKey = tuple[int, int]  # (IP version, the address as an integer)

_GO_FOLDS = {"\u017f": "s", "\u212a": "k"}
_MAPPED = 0xFFFF << 32  # ::ffff:0:0/96, the IPv4-mapped IPv6 addresses
_V4_BITS = (1 << 32) - 1


class ResultError(ValueError):
    """A result no plugin could read as one: refused rather than read as naming nothing."""


class ResultNames(Struct, frozen=True):
    addresses: tuple[tuple[str, AddressKey], ...]  # (as written, its key)
    host_ifnames: tuple[str, ...]  # interfaces not in a sandbox (a netns), as a host veth is


def go_fold(key: str) -> str:
    """`key` as encoding/json folds it to match a struct field (equal folds: the same field)."""
    return "".join(_GO_FOLDS.get(c, c.lower() if c.isascii() else c) for c in key)


def fields(obj: Mapping[str, Any], name: str) -> list[Any]:
    """The value of every key of `obj` that Go's decoder would put in the field `name`."""
    folded = go_fold(name)
    return [value for key, value in obj.items() if isinstance(key, str) and go_fold(key) == folded]


def _fold_mapped(key: AddressKey) -> AddressKey:
    version, value = key
    if version == 6 and value >> 32 == _MAPPED >> 32:
        return 4, value & _V4_BITS
    return key


def address_key(text: str) -> AddressKey | None:
    """The key of an address with or without a prefix length (`::ffff:10.0.0.2/120`); None for no address."""
    for family, version in ((socket.AF_INET, 4), (socket.AF_INET6, 6)):
        try:  # inet_pton first: ipaddress builds an object per call, and a node has thousands of leases
            return _fold_mapped((version, int.from_bytes(socket.inet_pton(family, text), "big")))
        except (OSError, ValueError):  # ValueError: an embedded NUL
            continue
    try:
        ip = ipaddress.ip_interface(text).ip
    except ValueError:
        return None
    return _fold_mapped((ip.version, int(ip)))


def address_keys(texts: Iterable[str]) -> frozenset[AddressKey]:
    return frozenset(key for text in texts if (key := address_key(text)) is not None)


def _objects(value: Any, where: str) -> Iterator[Mapping[str, Any]]:
    """The objects of a list field: null is Go's empty list; anything else is an error."""
    if value is None:
        return
    if not isinstance(value, list):
        raise ResultError(f"{where} is not a list")
    for n, item in enumerate(value):
        if not isinstance(item, dict):
            raise ResultError(f"{where}[{n}] is not an object")
        yield item


def _strings(obj: Mapping[str, Any], name: str, where: str) -> list[str]:
    found = fields(obj, name)
    if not all(isinstance(value, str) for value in found):
        raise ResultError(f"{where}.{name} is not a string")
    return found


def result_names(result: Any) -> ResultNames:
    """Every address and host interface a result names in any spelling a plugin takes; ResultError
    when no plugin could read it."""
    if not isinstance(result, dict):
        raise ResultError("it is not an object")
    addresses: list[tuple[str, AddressKey]] = []
    for ips in fields(result, "ips"):
        for n, ip in enumerate(_objects(ips, "ips")):
            texts = _strings(ip, "address", f"ips[{n}]")
            if not texts:
                raise ResultError(f"ips[{n}] has no address")
            for text in texts:
                key = address_key(text)
                if key is None:
                    raise ResultError(f"ips[{n}].address {text[:80]!r} is not an address")
                addresses.append((text, key))
    host: list[str] = []
    for interfaces in fields(result, "interfaces"):
        for n, iface in enumerate(_objects(interfaces, "interfaces")):
            names = _strings(iface, "name", f"interfaces[{n}]")
            sandboxes = _strings(iface, "sandbox", f"interfaces[{n}]")
            # On the host unless every spelling of `sandbox` puts it in a namespace.
            if not sandboxes or not all(sandboxes):
                host.extend(names)
    return ResultNames(tuple(addresses), tuple(host))
