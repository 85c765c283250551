"""The CRI v1 messages the reaper sends and reads, in protobuf's wire format, written out.

Three requests (Version, ListPodSandbox, PodSandboxStatus) and the few fields of their answers
the reaper reads. The protobuf runtime and the message classes it builds cost a one-shot 35 ms
of its start to import (`python -X importtime`), for messages this small. Field numbers are the
upstream api.proto's (k8s.io/cri-api, package runtime.v1; tests/harness/cri/api.proto is the
subset, and the tests check every decode against protobuf's own, bit for bit).

Decoded as protobuf does (protobuf.dev/programming-guides/encoding; the Python runtime, upb,
where the guide is silent): unknown fields, and a field sent with a wire type its declaration
does not have, are skipped; of a scalar sent twice the last one counts; an embedded message
sent twice is the two merged (the fields of both, in order, each occurrence whole on its own);
a map entry's key sent twice keeps the last value, and an entry with a field of its own is left
out of the map. Stricter than protobuf only where no runtime writes: a group (wire types 3 and
4, proto2 only) is refused. Anything malformed is a WireError: cut short, a varint over ten
bytes (a tag or a length over five), a field number of 0 or over 2**29 - 1, a string that is
no UTF-8.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from msgspec import Struct

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_U64 = (1 << 64) - 1
_MAX_FIELD = (1 << 29) - 1

# PodSandboxState and NamespaceMode values the reaper reads
SANDBOX_READY = 0
NAMESPACE_NODE = 2


class WireError(ValueError):
    """Bytes that are no message of the type they answer with."""


class TooMany(WireError):
    """A list with more items than the reader takes."""


class Version(Struct, frozen=True):
    runtime_name: str
    runtime_version: str


class PodSandboxMetadata(Struct, frozen=True):
    name: str
    uid: str
    namespace: str


class PodSandbox(Struct, frozen=True):
    """A ListPodSandbox item."""

    id: str
    metadata: PodSandboxMetadata
    state: int
    created_at: int  # nanoseconds since the epoch; Go's zero time when it failed early


class PodSandboxStatus(Struct, frozen=True):
    network_mode: int  # status.linux.namespaces.options.network (a NamespaceMode)
    info: dict[str, str]  # the verbose info


def _varint(buf: bytes, pos: int, most: int = 10) -> tuple[int, int]:
    """The varint at `pos` (modulo 2**64, as protobuf keeps it) and where the next field
    starts; `most` bytes at most (a tag or a length: 5, as protobuf's own reader allows)."""
    value = shift = 0
    for at in range(pos, min(pos + most, len(buf))):
        byte = buf[at]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & _U64, at + 1
        shift += 7
    raise WireError(f"a varint cut short or over {most} bytes")


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field in turn: an int for a varint, the bytes
    of a length-delimited field; fixed-width fields give 0 (the reaper reads none)."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos, most=5)
        number, wire = key >> 3, key & 7
        if not 0 < number <= _MAX_FIELD:
            raise WireError(f"field number {number}")
        value: int | bytes = 0
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
        elif wire == _LEN:
            size, pos = _varint(buf, pos, most=5)
            if size > end - pos:
                raise WireError("cut short in a length-delimited field")
            value, pos = buf[pos : pos + size], pos + size
        elif wire in (_I64, _I32):
            pos += 8 if wire == _I64 else 4
            if pos > end:
                raise WireError("cut short in a fixed-width field")
        else:
            raise WireError(f"wire type {wire} (a group, or none)")
        yield number, wire, value


def _text(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("a string that is no UTF-8") from None


def _int32(value: int) -> int:
    return ((value & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000


def _int64(value: int) -> int:
    return (value ^ (1 << 63)) - (1 << 63)


def _merged(occurrences: Iterable[bytes]) -> Iterator[tuple[int, int, int | bytes]]:
    """The fields of a message sent more than once, all of them in order: merged, as protobuf
    merges them (each occurrence must be whole on its own)."""
    for occurrence in occurrences:
        yield from _fields(occurrence)


def _embedded(occurrences: Iterable[bytes], number: int) -> list[bytes]:
    """Every occurrence of embedded message `number` in a message sent as `occurrences`."""
    return [v for n, w, v in _merged(occurrences) if n == number and w == _LEN and isinstance(v, bytes)]


# ---------------------------------------------------------------------------------- requests


def _length_delimited(number: int, data: bytes) -> bytes:
    return _encode_varint(number << 3 | _LEN) + _encode_varint(len(data)) + data


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def version_request() -> bytes:
    """VersionRequest{version: "v1"}"""
    return _length_delimited(1, b"v1")


def list_pod_sandbox_request() -> bytes:
    """ListPodSandboxRequest{}: every sandbox, no filter."""
    return b""


def pod_sandbox_status_request(sandbox_id: str, verbose: bool) -> bytes:
    """PodSandboxStatusRequest{pod_sandbox_id, verbose}"""
    out = _length_delimited(1, sandbox_id.encode("utf-8")) if sandbox_id else b""
    return out + (b"\x10\x01" if verbose else b"")


# ---------------------------------------------------------------------------------- answers


def version(buf: bytes) -> Version:
    """VersionResponse: runtime_name = 2, runtime_version = 3."""
    name = version_text = ""
    for number, wire, value in _fields(buf):
        if wire == _LEN and isinstance(value, bytes):
            if number == 2:
                name = _text(value)
            elif number == 3:
                version_text = _text(value)
    return Version(name, version_text)


def pod_sandboxes(buf: bytes, most: int | None = None) -> list[PodSandbox]:
    """ListPodSandboxResponse: items = 1, each a PodSandbox. TooMany past `most` items, raised
    as the next one is met: tiny items cost far more decoded than on the wire, so they are
    counted as they are decoded, never all decoded first."""
    items: list[PodSandbox] = []
    for number, wire, value in _fields(buf):
        if number == 1 and wire == _LEN and isinstance(value, bytes):
            if most is not None and len(items) >= most:
                raise TooMany(f"more than {most:,} sandboxes")
            items.append(_pod_sandbox(value))
    return items


def _pod_sandbox(buf: bytes) -> PodSandbox:
    """PodSandbox: id = 1, metadata = 2, state = 3, created_at = 4."""
    sandbox_id, metadata, state, created_at = "", [], 0, 0
    for number, wire, value in _fields(buf):
        if isinstance(value, bytes):
            if number == 1:
                sandbox_id = _text(value)
            elif number == 2:
                metadata.append(value)
        elif wire == _VARINT:
            if number == 3:
                state = _int32(value)
            elif number == 4:
                created_at = _int64(value)
    return PodSandbox(sandbox_id, _metadata(metadata), state, created_at)


def _metadata(occurrences: list[bytes]) -> PodSandboxMetadata:
    """PodSandboxMetadata: name = 1, uid = 2, namespace = 3."""
    texts = ["", "", ""]
    for number, wire, value in _merged(occurrences):
        if wire == _LEN and isinstance(value, bytes) and 1 <= number <= 3:
            texts[number - 1] = _text(value)
    return PodSandboxMetadata(*texts)


def pod_sandbox_status(buf: bytes) -> PodSandboxStatus:
    """PodSandboxStatusResponse: status = 1 (its linux = 6, namespaces = 1, options = 2,
    network = 1), info = 2 (map entries: key = 1, value = 2)."""
    info: dict[str, str] = {}
    status: list[bytes] = []
    for number, wire, value in _fields(buf):
        if wire != _LEN or not isinstance(value, bytes):
            continue
        if number == 1:
            status.append(value)
        elif number == 2:
            entry = _map_entry(value)
            if entry is not None:
                info[entry[0]] = entry[1]
    options = status
    for number in (6, 1, 2):  # PodSandboxStatus.linux, .namespaces, .options
        options = _embedded(options, number)
    mode = 0
    for number, wire, value in _merged(options):
        if number == 1 and wire == _VARINT and isinstance(value, int):
            mode = _int32(value)
    return PodSandboxStatus(mode, info)


def _map_entry(buf: bytes) -> tuple[str, str] | None:
    """A map<string, string> entry: key = 1, value = 2. One with any other field is left out of
    the map, as protobuf's own (upb) leaves it out."""
    key = text = ""
    unknown = False
    for number, wire, value in _fields(buf):  # read whole: a malformed entry is an error
        if wire != _LEN or not isinstance(value, bytes) or number not in (1, 2):
            unknown = True
        elif number == 1:
            key = _text(value)
        else:
            text = _text(value)
    return None if unknown else (key, text)
