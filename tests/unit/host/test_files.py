"""The namespace a netns path a runtime gave names, from one stat."""

from __future__ import annotations

import os

import pytest

from reaper.host.files import namespace_of
from reaper.model import NsKey


def test_a_process_namespace_is_what_stat_says() -> None:
    st = os.stat("/proc/self/ns/net")
    assert namespace_of("/proc/self/ns/net") == NsKey(st.st_dev, st.st_ino)


@pytest.mark.parametrize("path", [None, "", "/proc/999999999/ns/net", "/no/such", "relative/x", "/a\x00b"])
def test_no_namespace(path: str | None) -> None:
    assert namespace_of(path) is None
