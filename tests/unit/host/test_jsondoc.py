"""JSON others wrote: every way it can be bad is one ValueError, never a failed pass."""

from __future__ import annotations

import json

import pytest

from reaper.host.jsondoc import dumps_compact, dumps_indented, parse_json


@pytest.mark.parametrize(
    ("data", "message"),
    [(b"[" * 100_000, "nested too deeply"), (b'{"a": "\xff"}', "not UTF-8"), (b'{"a": ', "Expecting value")],
)
def test_bad_json_is_a_value_error_with_one_line(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        parse_json(data)
    assert "\n" not in str(err.value)


def test_good_json_is_read() -> None:
    assert parse_json(b'{"a": [1, 2]}') == {"a": [1, 2]}


@pytest.mark.parametrize(
    "data",
    [
        b'{"a": NaN, "b": -Infinity}',  # not JSON, yet json.loads reads it
        b'{"a": "\\ud800"}',  # a lone surrogate escape
        b"\xef\xbb\xbf{}",  # a byte-order mark
        '{"a": 1}'.encode("utf-16"),
        b'{"a": 123456789012345678901234567890, "b": 1e400}',
        b'{"a": 1, "a": 2}',
        b'  [1, 2.5, "x", null, true, {"b": {}}]  ',
    ],
)
def test_what_the_standard_library_reads_reads_the_same(data: bytes) -> None:
    assert repr(parse_json(data)) == repr(json.loads(data))


@pytest.mark.parametrize(
    "doc",
    [
        {"attachments": [{"a": 1, "b": [1.5, None, True, "x"], "c": {}, "d": []}], "e": 0.001},
        {"name": "caf\u00e9", "path": "/var/lib/cni/\udcff"},  # not ASCII; a lone surrogate
        {1: "an int key"},
        [],
        {"version": 3, "attachments": {"c/net1/eth0": [1764512345.123456, 2]}, "sandbox_netns": {}},  # a state
    ],
)
def test_output_is_the_standard_librarys(doc: object) -> None:
    assert dumps_indented(doc) == json.dumps(doc, indent=2).encode("ascii")
    assert dumps_compact(doc) == json.dumps(doc, separators=(",", ":")).encode("ascii")
