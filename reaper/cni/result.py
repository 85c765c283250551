"""What a CNI result (a cached result handed on as prevResult) names, read as the plugins read it.

The plugins are Go: they decode a result into containernetworking/cni's types (`ips`,
`interfaces`, `address`, `name`, `sandbox`...) with encoding/json, which matches an object's key
to a field without regard to case: ASCII letters fold, and so do the two other runes Unicode
folds onto ASCII letters (U+017F LONG S onto `s`, U+212A KELVIN SIGN onto `k`). It prefers a
key spelled exactly as the field, but every key that matches is decoded into that field in turn,
so which one wins depends on the order and the type; a check here weighs them all.

An address is read by its meaning: `net.ParseCIDR` gives an IPv4-mapped IPv6 address as the
IPv4 address it maps, and an IPv6 address has many spellings. So addresses are compared as
(version, integer) keys, the mapped ones folded to IPv4. What cannot be read as a result (not an
object, a list that is not one, an address that is not one) is an error: it is refused, never
read as naming nothing.
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
    """What a result names that a plugin's DEL acts on."""

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
    """The key of an address written with or without a prefix length (`10.0.0.2/24`,
    `FD00::5/64`, `::ffff:10.0.0.2/120`); None when it is no address."""
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
    """The keys of those texts that are addresses (a held text that is none holds nothing a
    result could name)."""
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
    for value in found:
        if not isinstance(value, str):
            raise ResultError(f"{where}.{name} is not a string")
    return found


def result_names(result: Any) -> ResultNames:
    """Every address and host interface a result names, whichever spelling of each key a
    plugin would take; ResultError when it is not a result a plugin could read."""
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
