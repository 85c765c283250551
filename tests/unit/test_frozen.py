"""@frozen_record behaves as @dataclass(frozen=True) does, but for its quicker __init__."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from reaper.frozen import frozen_record
from reaper.model import AttachmentKey, ResourceRef


@frozen_record
class Point:
    x: int
    y: int = 0
    label: str = dataclasses.field(default="", repr=False)


@dataclasses.dataclass(frozen=True)
class SamePoint:
    x: int
    y: int = 0
    label: str = dataclasses.field(default="", repr=False)


def test_a_record_is_what_the_frozen_dataclass_would_be() -> None:
    p = Point(1)
    assert (p.x, p.y, p.label) == (1, 0, "")
    assert p == Point(1, 0) != Point(1, 2)
    assert hash(p) == hash(Point(1, 0, ""))
    assert repr(p) == repr(SamePoint(1)).replace("SamePoint", "Point")
    assert dataclasses.replace(p, y=5) == Point(1, 5)
    assert dataclasses.astuple(p) == dataclasses.astuple(SamePoint(1))
    assert pickle.loads(pickle.dumps(ResourceRef("veth", "v", None))) == ResourceRef("veth", "v", None)
    assert Point(x=3, label="a") == Point(3, 0, "a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del p.y
    with pytest.raises(TypeError):
        Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Point(1, 2, "a", 4)  # type: ignore[call-arg]


def test_order_is_the_dataclass_order() -> None:
    keys = [AttachmentKey("b", None, None), AttachmentKey("a", "n", "eth0"), AttachmentKey("a", "m", "eth0")]
    assert [k.network for k in sorted(keys)] == ["m", "n", None]


def test_what_the_quick_init_cannot_do_is_refused() -> None:
    with pytest.raises(TypeError, match="plain defaults"):

        @frozen_record
        class WithFactory:
            items: list[int] = dataclasses.field(default_factory=list)

    with pytest.raises(TypeError, match="__post_init__"):

        @frozen_record
        class WithPostInit:
            x: int

            def __post_init__(self) -> None:
                pass
