"""A netns path's namespace and whether it can be inspected, from one stat."""

from __future__ import annotations

import pytest

from reaper.host.files import namespace_at, namespace_of, namespace_uninspectable


@pytest.mark.parametrize(
    "path",
    [None, "", "/proc/self/ns/net", "/proc/1/ns/net", "/proc/999999999/ns/net", "/no/such", "relative/x", "/a\x00b"],
)
def test_one_stat_says_what_the_two_questions_say(path: str | None) -> None:
    assert namespace_at(path) == (namespace_of(path), namespace_uninspectable(path))
