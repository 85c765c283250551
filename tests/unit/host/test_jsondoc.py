"""JSON others wrote: every way it can be bad is one ValueError, never a failed pass."""

from __future__ import annotations

import pytest

from reaper.host.jsondoc import parse_json


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
