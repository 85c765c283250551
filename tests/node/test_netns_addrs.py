"""Reading the addresses of other network namespaces on a real kernel, each from inside it: a
pin's and a process's namespace each give their own addresses; a pin swapped for another
namespace, a symlink, or a pid that is gone give an error, never another namespace's addresses
(but a namespace found only through processes that have all exited reads as empty);
the deadline ends the reading; and the calling thread never leaves its namespace."""

from __future__ import annotations

from tests.harness.probe import run_probe
from tests.harness.probes import netns_addresses


def test_each_namespace_is_read_from_inside_it_and_only_the_one_found_there() -> None:
    out = run_probe(netns_addresses, timeout=120)
    assert out["got"] == {
        "here": [["10.77.0.9", "127.0.0.1", "::1"], None],
        "a": [["10.77.0.1", "127.0.0.1", "::1"], None],
        "b": [["127.0.0.1", "::1", "fd00:77::1"], None],
        "proc": [["10.77.0.3", "127.0.0.1", "::1"], None],
        "swapped": [[], "another namespace is there now"],
        "symlink": [[], "not a namespace pin now"],  # the link itself, never followed
        "fallback": [["10.77.0.3", "127.0.0.1", "::1"], None],
        "beneath": [["10.77.0.1", "127.0.0.1", "::1"], None],
        "beneath, through a link": [[], "Too many levels of symbolic links"],  # never followed
    }
    assert out["late"] == [[], "not read by the deadline"]
    assert out["gone"] == [[], True]
    # Every process the namespace was found through has exited, and nothing else held it.
    assert out["left"] == [[], None]
    assert out["pin_gone"] is True
    assert out["home"] is True and out["readers"] == [], "the caller stays home; the reader thread ended"
