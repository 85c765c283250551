"""The reaper's own CRI decoding (reaper.runtime.wire) against protobuf's, bit for bit.

Two references: the CRI messages as the lab builds them (tests/harness/cri/api.proto), so that
what a runtime sends reads the same; and the answers with only the fields the reaper reads
(reader.proto), so that any bytes at all, decoded by both, give the same values or an error
from both. The one difference allowed: a group (wire type 3, proto2 only), which protobuf
skips and the reaper refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import DecodeError, Message
from hypothesis import example, given
from hypothesis import strategies as st

from reaper.runtime import wire
from tests.harness.cri import api_pb2 as pb
from tests.harness.cri import reader_pb2 as reader
from tests.harness.fuzz import FUZZ

texts = st.text(max_size=12)
int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)
int32s = st.integers(min_value=-(2**31), max_value=2**31 - 1)
ROOT = Path(__file__).resolve().parents[3]
GO_ZERO_TIME = -6795364578871345152
MODES = [pb.POD, pb.CONTAINER, pb.NODE, pb.TARGET]  # time.Time{}.UnixNano(): a sandbox that failed early


def _sandbox_of(m: Any) -> wire.PodSandbox:
    meta = wire.PodSandboxMetadata(m.metadata.name, m.metadata.uid, m.metadata.namespace)
    return wire.PodSandbox(m.id, meta, m.state, m.created_at)


# ------------------------------------------------------------------------------ requests


@given(sandbox_id=texts, verbose=st.booleans())
@example(sandbox_id="", verbose=False)
def test_each_request_is_the_bytes_protobuf_writes(sandbox_id: str, verbose: bool) -> None:
    assert wire.version_request() == pb.VersionRequest(version="v1").SerializeToString()
    assert wire.list_pod_sandbox_request() == pb.ListPodSandboxRequest().SerializeToString()
    status = pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=verbose).SerializeToString()
    assert wire.pod_sandbox_status_request(sandbox_id, verbose) == status


# ------------------------------------------------------------------------------ answers a runtime sends

sandboxes = st.builds(
    lambda sid, name, uid, ns, attempt, state, created, labels, handler: pb.PodSandbox(
        id=sid,
        metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=ns, attempt=attempt),
        state=state,
        created_at=created,
        labels=labels,
        annotations=labels,
        runtime_handler=handler,
    ),
    texts,
    texts,
    texts,
    texts,
    st.integers(min_value=0, max_value=2**32 - 1),
    st.sampled_from([pb.SANDBOX_READY, pb.SANDBOX_NOTREADY]),
    int64s | st.just(GO_ZERO_TIME),
    st.dictionaries(texts, texts, max_size=3),
    texts,
)


@given(name=texts, version=texts, api=texts)
def test_a_version_reads_as_protobuf_reads_it(name: str, version: str, api: str) -> None:
    sent = pb.VersionResponse(version="0.1.0", runtime_name=name, runtime_version=version, runtime_api_version=api)
    assert wire.version(sent.SerializeToString()) == wire.Version(name, version)


@given(st.lists(sandboxes, max_size=5))
def test_a_sandbox_list_reads_as_protobuf_reads_it(items: list[pb.PodSandbox]) -> None:
    data = pb.ListPodSandboxResponse(items=items).SerializeToString()
    assert wire.pod_sandboxes(data) == [_sandbox_of(m) for m in pb.ListPodSandboxResponse.FromString(data).items]


@given(
    mode=st.sampled_from(MODES),
    info=st.dictionaries(texts, texts, max_size=4),
    ip=texts,
    sandbox=sandboxes,
)
def test_a_sandbox_status_reads_as_protobuf_reads_it(
    mode: pb.NamespaceMode, info: dict[str, str], ip: str, sandbox: Any
) -> None:
    status = pb.PodSandboxStatus(
        id=sandbox.id,
        metadata=sandbox.metadata,
        state=sandbox.state,
        created_at=sandbox.created_at,
        network=pb.PodSandboxNetworkStatus(ip=ip, additional_ips=[pb.PodIP(ip=ip)]),
        linux=pb.LinuxPodSandboxStatus(namespaces=pb.Namespace(options=pb.NamespaceOption(network=mode, pid=mode))),
    )
    data = pb.PodSandboxStatusResponse(status=status, info=info).SerializeToString()
    assert wire.pod_sandbox_status(data) == wire.PodSandboxStatus(mode, info)


def test_a_host_network_sandbox_and_a_sandbox_that_failed_early_read_as_they_are() -> None:
    host = pb.PodSandboxStatusResponse(
        status=pb.PodSandboxStatus(
            linux=pb.LinuxPodSandboxStatus(namespaces=pb.Namespace(options=pb.NamespaceOption(network=pb.NODE)))
        )
    )
    assert wire.pod_sandbox_status(host.SerializeToString()).network_mode == wire.NAMESPACE_NODE
    failed = pb.ListPodSandboxResponse(items=[pb.PodSandbox(id="a", created_at=GO_ZERO_TIME)])
    (item,) = wire.pod_sandboxes(failed.SerializeToString())
    assert item.created_at == GO_ZERO_TIME and item.state == wire.SANDBOX_READY


# ------------------------------------------------------------------------------ any bytes at all

READERS: list[tuple[type[Message], Callable[[bytes], object], Callable[[Any], object]]] = [
    (reader.VersionResponse, wire.version, lambda m: wire.Version(m.runtime_name, m.runtime_version)),
    (reader.ListPodSandboxResponse, wire.pod_sandboxes, lambda m: [_sandbox_of(i) for i in m.items]),
    (
        reader.PodSandboxStatusResponse,
        wire.pod_sandbox_status,
        lambda m: wire.PodSandboxStatus(m.status.linux.namespaces.options.network, dict(m.info)),
    ),
]


def _both(
    data: bytes, message: type[Message], ours: Callable[[bytes], object], theirs: Callable[[Any], object]
) -> None:
    try:
        expected: object = theirs(message.FromString(data))
    except DecodeError:
        expected = DecodeError
    try:
        got: object = ours(data)
    except wire.WireError as err:
        if expected is not DecodeError and "wire type 3" in str(err):
            return  # a group: protobuf skips it, the reaper refuses it
        got = DecodeError
    assert got == expected


def _valid(n: int) -> bytes:
    status = pb.PodSandboxStatus(
        id="s" * n,
        linux=pb.LinuxPodSandboxStatus(namespaces=pb.Namespace(options=pb.NamespaceOption(network=MODES[n % 4]))),
    )
    answer = pb.PodSandboxStatusResponse(status=status, info={"info": '{"x":1}', "k" * n: "v"})
    items = [pb.PodSandbox(id="a" * n, metadata=pb.PodSandboxMetadata(name="web", uid="u"), created_at=-n)]
    return answer.SerializeToString() + pb.ListPodSandboxResponse(items=items).SerializeToString()


# Valid answers, then cut, spliced and with bytes changed: every reader sees each of them.
mangled = st.builds(
    lambda n, cut, at, junk: _valid(n)[:cut] + junk + _valid(n)[at:],
    st.integers(min_value=0, max_value=20),
    st.integers(min_value=0, max_value=120),
    st.integers(min_value=0, max_value=120),
    st.binary(max_size=12),
)


def _varint(value: int, padding: int) -> bytes:
    """`value` as a varint, written `padding` bytes longer than it needs to be."""
    out = bytearray()
    while True:
        out.append(value & 0x7F)
        value >>= 7
        if not value and not padding:
            return bytes(out)
        out[-1] |= 0x80
        if not value:
            return bytes(out) + b"\x80" * (padding - 1) + b"\x00"


# Fields built from parts: numbers at and past the limits, every wire type, varints (tags and
# lengths too) written longer than they need, values past 64 bits, nested, strings not UTF-8.
def _field(number: int, wire: int, pad: int, pad_value: int, value: int, inner: bytes) -> bytes:
    body = {0: _varint(value, pad_value), 2: _varint(len(inner), pad_value) + inner, 1: bytes(8), 5: bytes(4)}
    return _varint(number << 3 | wire, pad) + body.get(wire, b"")


fields: st.SearchStrategy[bytes] = st.deferred(
    lambda: st.builds(
        _field,
        st.sampled_from([1, 2, 3, 4, 5, 6, 7, 0, 2**29 - 1, 2**29]),
        st.sampled_from([0, 1, 2, 3, 4, 5, 6]),
        st.integers(0, 6),
        st.integers(0, 10),
        st.sampled_from([0, 1, 2, 2**31, 2**63, 2**64 - 1, 2**70]),
        st.lists(fields, max_size=3).map(b"".join) | st.binary(max_size=6) | st.just(b"\xc3\x28"),
    )
)


@FUZZ
@given(st.binary(max_size=200) | mangled | st.lists(fields, max_size=4).map(b"".join))
@example(b"\x08" + b"\xff" * 9 + b"\x01")  # a ten-byte varint: 2**64 - 1, wrapped
@example(b"\x08" + b"\xff" * 10 + b"\x01")  # an eleven-byte varint
@example(b"\x88\x80\x80\x80\x00\x01")  # a tag in five bytes
@example(b"\x88\x80\x80\x80\x80\x00\x01")  # a tag in six
@example(b"\x0a\x80\x80\x80\x80\x00")  # a length in five bytes
@example(b"\x0a\x80\x80\x80\x80\x80\x00")  # a length in six
@example(b"\x1a\x02\xc3\x28")  # field 3 as a string that is no UTF-8
@example(b"\x0a\x02\x08")  # a length past the end
@example(b"\x00\x01")  # field number 0
@example(b"\xfa\xff\xff\xff\x0f\x00")  # the largest field number, 2**29 - 1
@example(b"\x82\x80\x80\x80\x10\x00")  # one over it
@example(b"\x0b\x0c")  # an empty group
@example(b"\x0c")  # an end of group with no start
@example(b"\x12\x02\x08\x01")  # a map entry with a field of its own: left out of the map
@example(b"\x12\x09\x0a\x04info\x08\x73\x73")  # one that is malformed after that field
@example(b"\x0a\x03\x0a\x05\x00" + b"\x0a\x03\x00\x00\x00")  # a cut-short status the next one would complete
def test_any_bytes_read_as_protobuf_reads_them_or_fail_as_it_fails(data: bytes) -> None:
    for message, ours, theirs in READERS:
        _both(data, message, ours, theirs)


@pytest.mark.parametrize("data", [b"\x0a\x05\x0a\x03\x0a\x01\xff", b"\x12\x04\x0a\x02\xc3\x28"])
def test_a_string_that_is_no_utf8_where_the_reaper_reads_is_an_error(data: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.pod_sandboxes(data) if data[0] == 0x0A else wire.pod_sandbox_status(data)


# In a fresh interpreter, beside a runtime that answers Version well and ListPodSandbox with the
# bytes it is given (and an empty status): the client's answer, and what the liveness view makes of it.
HOSTILE_RUNTIME = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
import grpc
from reaper.runtime.client import CriError, RuntimeClient
from reaper.runtime.cri import CriLiveness
from tests.harness.cri import api_pb2 as pb

endpoint, answer = f"unix://{sys.argv[1]}", bytes.fromhex(sys.argv[2])
version = pb.VersionResponse(runtime_name="hostile", runtime_version="1").SerializeToString()
handlers = {
    "Version": grpc.unary_unary_rpc_method_handler(lambda req, ctx: version),
    "ListPodSandbox": grpc.unary_unary_rpc_method_handler(lambda req, ctx: answer),
    "PodSandboxStatus": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b""),  # no netns
}
server = grpc.server(ThreadPoolExecutor(max_workers=2))
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("runtime.v1.RuntimeService", handlers),))
server.add_insecure_port(endpoint)
server.start()
try:
    with RuntimeClient(endpoint, 5.0) as client:
        listed = [s.id for s in client.list_pod_sandboxes()]
        error = None
except CriError as err:
    listed, error = None, str(err)
view = CriLiveness((endpoint,), 5.0).observe({})
server.stop(grace=None)
print(json.dumps({"listed": listed, "error": error, "reachable": view.reachable, "why": view.error}))
"""


@pytest.mark.parametrize(
    ("answer", "listed"),
    [
        (pb.ListPodSandboxResponse(items=[pb.PodSandbox(id="a" * 64)]).SerializeToString(), ["a" * 64]),
        (b"\x0a\x05\x0a\x03\x0a\x01\xff", None),  # an ID that is no UTF-8
        (b"\x0a\x40\x0a\x01", None),  # cut short
        (b"\x0b\x0c", None),  # a group
    ],
)
def test_a_runtime_whose_answer_is_no_list_is_an_error_and_decides_nothing(
    tmp_path: Path, answer: bytes, listed: list[str] | None
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", HOSTILE_RUNTIME, str(tmp_path / "cri.sock"), answer.hex()],
        capture_output=True, text=True, timeout=120, check=True, cwd=ROOT,
    )  # fmt: skip
    out = json.loads(proc.stdout)
    assert out["listed"] == listed
    if listed is None:
        assert "ListPodSandbox on unix://" in out["error"] and "no ListPodSandboxResponse" in out["error"]
        assert not out["reachable"] and "no ListPodSandboxResponse" in out["why"]
    else:
        assert out["error"] is None and out["reachable"]
