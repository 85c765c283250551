"""Links dumped by kind: 40 veth pairs and two IFBs made here, then the IFBs asked for (filtered
by the kernel and not) and a kind no link has. Run in a throwaway netns; prints the names each
dump gave, as JSON."""

from __future__ import annotations

import json
import subprocess

from reaper.host.netlink import dump_links_of_kind, links_of_kind


def main() -> None:
    for i in range(40):
        subprocess.run(["ip", "link", "add", f"va{i}", "type", "veth", "peer", "name", f"vb{i}"], check=True)
    subprocess.run(["ip", "link", "add", "bwp0123456789ab", "type", "ifb"], check=True)
    subprocess.run(["ip", "link", "add", "ifbother", "type", "ifb"], check=True)
    out = {
        f"{kind} {filtered}": sorted(link.name for link in links_of_kind(kind, filtered))
        for kind in ("ifb", "nosuchkind")
        for filtered in (True, False)
    }
    out["public"] = sorted(link.name for link in dump_links_of_kind("ifb"))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
