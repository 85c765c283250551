"""The reaper's netlink writes on a real kernel, in a throwaway netns: links (a veth, an IFB, an
index no link has, the loopback the kernel refuses to delete) and policy rules (IPv4, IPv6 in a
table above 255, one not there), each beside a twin that differs in one field and must stay.
Prints what each delete answered, what is left, and whether pyroute2 was loaded, as JSON."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from reaper.host.netlink import RawRule, delete_links, delete_rules, dump_links, dump_rules

_NO_LINK = 999_999


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True)


def _rule(family: int, priority: int, table: int, src: str, src_len: int) -> RawRule:
    return RawRule(
        family=family,
        priority=priority,
        table=table,
        action=1,
        flags=0,
        tos=0,
        src=src,
        src_len=src_len,
        dst=None,
        dst_len=0,
        suppress_prefixlen=None,
    )


def main() -> None:
    _ip("link", "add", "gone0", "type", "veth", "peer", "name", "gone0p")
    _ip("link", "add", "stay0", "type", "veth", "peer", "name", "stay0p")
    _ip("link", "add", "ifbgone", "type", "ifb")
    _ip("rule", "add", "from", "10.1.0.5", "lookup", "1000", "pref", "500")
    _ip("rule", "add", "from", "10.1.0.5", "lookup", "1000", "pref", "501")  # its twin, one pref on
    _ip("-6", "rule", "add", "from", "fd00::5", "lookup", "70000", "pref", "500")
    _ip("-6", "rule", "add", "from", "fd00::5", "lookup", "70001", "pref", "500")  # its twin, one table on
    by_name = {link.name: link.ifindex for link in dump_links()}
    links = {"veth": by_name["gone0"], "ifb": by_name["ifbgone"], "absent": _NO_LINK, "lo": by_name["lo"]}
    answered = delete_links(list(links.values()))
    rules = [
        _rule(socket.AF_INET, 500, 1000, "10.1.0.5", 32),
        _rule(socket.AF_INET6, 500, 70000, "fd00::5", 128),
        _rule(socket.AF_INET, 600, 1000, "10.9.9.9", 32),  # no such rule
    ]
    rule_answers = delete_rules(rules)
    left_rules = sorted(f"{r.priority} {r.table} {r.src}" for r in dump_rules() if r.src is not None)
    out = {
        "links": {what: answered[index] for what, index in links.items()},
        "left_links": sorted(link.name for link in dump_links()),
        "rules": rule_answers,
        "left_rules": left_rules,
        "pyroute2_loaded": any(name.split(".")[0] == "pyroute2" for name in sys.modules),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
