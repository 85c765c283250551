"""What the reaper reads off the wire, round trip: answers built as a runtime writes them (the
lab's fuller messages, tests/harness/cri/api.proto, with fields the reaper skips and fields no
one declares added) read through the reaper's client (its own subset, reaper/runtime/api.proto)
as the values they were built with; any bytes at all read as the runtime's messages read them,
or are that runtime's error, never another view; a list past the sandbox cap is never decoded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import DecodeError, Message
from hypothesis import example, given
from hypothesis import strategies as st

from reaper.runtime import client as client_module
from reaper.runtime.client import CriError, RuntimeClient
from reaper.runtime.cri import CriLiveness, _netns_of
from tests.harness.cri import api_pb2 as pb
from tests.harness.fake_cri import FakeRuntime
from tests.harness.fuzz import FUZZ

texts = st.text(max_size=12)
int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)
GO_ZERO_TIME = -6795364578871345152  # time.Time{}.UnixNano(): a sandbox that failed early
MODES = [pb.POD, pb.CONTAINER, pb.NODE, pb.TARGET]
ENDPOINT = "unix:///nonexistent/cri.sock"


class Answering(RuntimeClient):
    """The reaper's client with its calls answered by `answer` instead of a socket: everything
    from the answer's bytes on is the client's own. The requests it sends are kept."""

    def __init__(self) -> None:
        super().__init__(ENDPOINT, 1.0)
        self.answer = b""
        self.sent: list[tuple[str, bytes]] = []

    def call(self, method: str, request: bytes) -> bytes:
        self.sent.append((method, request))
        return self.answer


@pytest.fixture(scope="module")
def client() -> Any:
    with Answering() as answering:
        yield answering


# ------------------------------------------------------------------------------ views


def list_view(items: Any) -> list[tuple[str, str, str, str, int, int]]:
    """What the reaper reads of each listed sandbox."""
    return [(i.id, i.metadata.name, i.metadata.uid, i.metadata.namespace, i.state, i.created_at) for i in items]


def status_view(answer: Any) -> tuple[int, dict[str, str]]:
    """What the reaper reads of a PodSandboxStatusResponse."""
    return answer.status.linux.namespaces.options.network, dict(answer.info)


def version_view(answer: Any) -> tuple[str, str]:
    return answer.runtime_name, answer.runtime_version


# ------------------------------------------------------------------------------ bytes by hand


def varint(value: int, padding: int = 0) -> bytes:
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


def field(number: int, wire: int, value: int = 0, inner: bytes = b"", pad: int = 0) -> bytes:
    """One field: a varint, a fixed-width value, a length-delimited `inner`, or a group around it."""
    body = {0: varint(value), 1: bytes(8), 2: varint(len(inner)) + inner, 5: bytes(4)}
    if wire == 3:
        return varint(number << 3 | 3, pad) + inner + varint(number << 3 | 4)
    return varint(number << 3 | wire, pad) + body.get(wire, b"")


# Fields no CRI message declares (numbers past upstream's), of every wire type, a group too.
undeclared = st.lists(
    st.builds(
        field,
        st.integers(min_value=100, max_value=2**29 - 1),
        st.sampled_from([0, 1, 2, 3, 5]),
        st.integers(min_value=0, max_value=2**64 - 1),
        st.sampled_from([b"", field(1, 2, inner=b"x"), field(7, 0, 3)]),  # whole fields, for a group
    ),
    max_size=3,
).map(b"".join)


# ------------------------------------------------------------------------------ round trip

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


@given(items=st.lists(st.tuples(sandboxes, undeclared), max_size=5), extra=undeclared)
def test_a_sandbox_list_reads_as_the_runtime_wrote_it(
    client: Answering, items: list[tuple[pb.PodSandbox, bytes]], extra: bytes
) -> None:
    """Each item with fields no one declares after its own, and more at the top level."""
    client.answer = b"".join(field(1, 2, inner=item.SerializeToString() + junk) for item, junk in items) + extra
    assert list_view(client.list_pod_sandboxes()) == list_view([item for item, _ in items])


@given(name=texts, version=texts, api=texts, extra=undeclared)
def test_a_version_reads_as_the_runtime_wrote_it(
    client: Answering, name: str, version: str, api: str, extra: bytes
) -> None:
    sent = pb.VersionResponse(version="0.1.0", runtime_name=name, runtime_version=version, runtime_api_version=api)
    client.answer = sent.SerializeToString() + extra
    assert version_view(client.version()) == (name, version)


@given(
    mode=st.sampled_from(MODES),
    info=st.dictionaries(texts, texts, max_size=4),
    ip=texts,
    sandbox=sandboxes,
    extra=undeclared,
)
def test_a_sandbox_status_reads_as_the_runtime_wrote_it(
    client: Answering, mode: pb.NamespaceMode, info: dict[str, str], ip: str, sandbox: Any, extra: bytes
) -> None:
    status = pb.PodSandboxStatus(
        id=sandbox.id,
        metadata=sandbox.metadata,
        state=sandbox.state,
        created_at=sandbox.created_at,
        network=pb.PodSandboxNetworkStatus(ip=ip, additional_ips=[pb.PodIP(ip=ip)]),
        linux=pb.LinuxPodSandboxStatus(namespaces=pb.Namespace(options=pb.NamespaceOption(network=mode, pid=mode))),
    )
    client.answer = pb.PodSandboxStatusResponse(status=status, info=info).SerializeToString() + extra
    assert status_view(client.pod_sandbox_status("s")) == (mode, info)


def test_the_netns_a_status_gives_host_network_and_a_sandbox_that_failed_early(client: Answering) -> None:
    def status(mode: pb.NamespaceMode) -> bytes:
        namespaces = pb.Namespace(options=pb.NamespaceOption(network=mode))
        info = {"info": '{"sandboxMetadata": {"NetNSPath": "/run/netns/cni-1"}}'}
        answer = pb.PodSandboxStatusResponse(
            status=pb.PodSandboxStatus(linux=pb.LinuxPodSandboxStatus(namespaces=namespaces)), info=info
        )
        return answer.SerializeToString()

    client.answer = status(pb.POD)
    assert _netns_of(ENDPOINT, client.pod_sandbox_status("s")) == "/run/netns/cni-1"
    client.answer = status(pb.NODE)
    assert _netns_of(ENDPOINT, client.pod_sandbox_status("s")) == ""
    client.answer = pb.ListPodSandboxResponse(
        items=[pb.PodSandbox(id="a", created_at=GO_ZERO_TIME)]
    ).SerializeToString()
    assert list_view(client.list_pod_sandboxes()) == [("a", "", "", "", pb.SANDBOX_READY, GO_ZERO_TIME)]


@given(sandbox_id=texts, verbose=st.booleans())
@example(sandbox_id="", verbose=False)
def test_each_request_reads_as_the_runtime_reads_it(client: Answering, sandbox_id: str, verbose: bool) -> None:
    client.sent.clear()
    client.answer = b""
    client.version()
    client.list_pod_sandboxes()
    client.pod_sandbox_status(sandbox_id, verbose)
    (_, version), (_, listing), (_, status) = client.sent
    assert pb.VersionRequest.FromString(version) == pb.VersionRequest(version="v1")
    assert pb.ListPodSandboxRequest.FromString(listing) == pb.ListPodSandboxRequest()  # every sandbox, no filter
    assert pb.PodSandboxStatusRequest.FromString(status) == pb.PodSandboxStatusRequest(
        pod_sandbox_id=sandbox_id, verbose=verbose
    )


# ------------------------------------------------------------------------------ any bytes at all

READERS: list[tuple[type[Message], Callable[[Answering], object], Callable[[Any], object]]] = [
    (pb.VersionResponse, lambda c: version_view(c.version()), version_view),
    (pb.ListPodSandboxResponse, lambda c: list_view(c.list_pod_sandboxes()), lambda m: list_view(m.items)),
    (pb.PodSandboxStatusResponse, lambda c: status_view(c.pod_sandbox_status("s")), status_view),
]


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

# Fields built from parts: numbers at and past the limits, every wire type, varints (tags and
# lengths too) written longer than they need, values past 64 bits, nested, strings not UTF-8.
parts: st.SearchStrategy[bytes] = st.deferred(
    lambda: st.builds(
        lambda number, wire, pad, value, inner: (
            varint(number << 3 | wire, pad)
            + {0: varint(value), 2: varint(len(inner)) + inner, 1: bytes(8), 5: bytes(4)}.get(wire, b"")
        ),
        st.sampled_from([1, 2, 3, 4, 5, 6, 7, 0, 2**29 - 1, 2**29]),
        st.sampled_from([0, 1, 2, 3, 4, 5, 6]),
        st.integers(0, 6),
        st.sampled_from([0, 1, 2, 2**31, 2**63, 2**64 - 1, 2**70]),
        st.lists(parts, max_size=3).map(b"".join) | st.binary(max_size=6) | st.just(b"\xc3\x28"),
    )
)


@FUZZ
@given(st.binary(max_size=200) | mangled | st.lists(parts, max_size=4).map(b"".join))
@example(b"\x08" + b"\xff" * 9 + b"\x01")  # a ten-byte varint: 2**64 - 1, wrapped
@example(b"\x08" + b"\xff" * 10 + b"\x01")  # an eleven-byte varint
@example(b"\x88\x80\x80\x80\x80\x00\x01")  # a tag in six bytes
@example(b"\x0a\x80\x80\x80\x80\x80\x00")  # a length in six bytes
@example(b"\x1a\x02\xc3\x28")  # field 3 as a string that is no UTF-8
@example(b"\x0a\x02\x08")  # a length past the end
@example(b"\x00\x01")  # field number 0
@example(b"\x82\x80\x80\x80\x10\x00")  # a field number over 2**29 - 1
@example(b"\x0b\x0a\x00\x0c")  # a group holding what would be an item
@example(b"\x0c")  # an end of group with no start
@example(b"\x12\x02\x08\x01")  # a map entry with a field of its own
@example(b"\x0a\x03\x0a\x05\x00" + b"\x0a\x03\x00\x00\x00")  # a cut-short status the next one would complete
def test_any_bytes_read_as_protobuf_reads_them_or_fail_as_it_fails(client: Answering, data: bytes) -> None:
    """Read as the runtime's own messages read them (those declare more fields, so they refuse
    more: a string that is no UTF-8 in a field the reaper skips), or the runtime's error: a
    view the runtime did not write is never read."""
    client.answer = data
    for message, ours, theirs in READERS:
        try:
            expected: object = theirs(message.FromString(data))
        except DecodeError:
            expected = None
        try:
            got: object = ours(client)
        except CriError as err:
            assert f"an answer that is no {message.__name__}" in str(err) and "\n" not in str(err)
            assert expected is None, f"{message.__name__}: refused {data!r}, which reads as {expected!r}"
            continue
        if expected is not None:
            assert got == expected


@FUZZ
@given(
    items=st.integers(min_value=0, max_value=8),
    junk=st.lists(undeclared | st.just(field(1, 0, 1)) | st.just(field(1, 3, inner=field(1, 2))), max_size=6),
    data=st.data(),
)
def test_no_list_past_the_cap_is_ever_decoded(items: int, junk: list[bytes], data: st.DataObject) -> None:
    """With a cap of 3: a list protobuf would read as more items than that is always refused
    before it is decoded, whatever else its top level holds (fields of other numbers or wire
    types, items inside a group, which protobuf skips)."""
    parts_ = [field(1, 2, inner=b"") for _ in range(items)] + junk
    answer = b"".join(data.draw(st.permutations(parts_)))
    too_long = client_module._too_long(answer, 3)
    try:
        listed = len(pb.ListPodSandboxResponse.FromString(answer).items)
    except DecodeError:
        return
    if listed > 3:
        assert too_long in ("more than 3 sandboxes", "more than 6 fields")
    else:
        assert too_long in (None, "more than 6 fields")


def test_a_list_counts_two_bytes_an_item_at_least_and_is_walked_only_past_that(monkeypatch: pytest.MonkeyPatch) -> None:
    assert client_module._too_long(b"\x0a\x00" * 4, 3) == "more than 3 sandboxes"
    assert client_module._too_long(b"\x0a\x00" * 3 + b"\x12\x00", 3) is None
    monkeypatch.setattr(client_module, "_varint", None)  # shorter than 2 * (cap + 1): never walked
    assert client_module._too_long(b"\x0a\x00" * 3 + b"\x08", 3) is None


# ------------------------------------------------------------------------------ through a socket


@pytest.mark.parametrize(
    ("answer", "listed"),
    [
        (pb.ListPodSandboxResponse(items=[pb.PodSandbox(id="a" * 64)]).SerializeToString(), ["a" * 64]),
        (b"\x0a\x05\x0a\x03\x0a\x01\xff", None),  # an ID that is no UTF-8
        (b"\x0a\x40\x0a\x01", None),  # cut short
        (b"\x0a\x02\x08", None),  # a length past the end
        (b"\x0b\x0a\x00\x0c", []),  # a group: protobuf skips it, with the item inside
    ],
)
def test_a_runtime_whose_answer_is_no_list_is_an_error_and_decides_nothing(
    tmp_path: Path, answer: bytes, listed: list[str] | None
) -> None:
    with FakeRuntime(tmp_path / "cri.sock", answer, {}) as runtime:
        try:
            with RuntimeClient(runtime.endpoint, 5.0) as real:
                got: list[str] | None = [s.id for s in real.list_pod_sandboxes()]
                error = None
        except CriError as err:
            got, error = None, str(err)
        view = CriLiveness((runtime.endpoint,), 5.0).observe({})
    assert got == listed
    if listed is None:
        assert error is not None and error.startswith(f"ListPodSandbox on {runtime.endpoint}: ")
        assert "an answer that is no ListPodSandboxResponse" in error and "\n" not in error
        assert not view.reachable and view.error is not None and "no ListPodSandboxResponse" in view.error
        assert view.sandboxes == ()
    else:
        assert error is None and view.reachable and [s.id for s in view.sandboxes] == listed
