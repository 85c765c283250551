"""The iptables reclaim of a nat chain that is not there (in the netns it runs in: a scratch
one). Usage: gone_chain CHAIN. Prints, by chain name, whether it counted as freed, as JSON."""

from __future__ import annotations

import json
import sys

from reaper.kinds import ReclaimContext, iptables


def main(chain: str) -> None:
    gone = iptables.IptablesChain(
        family="ipv4",
        table="nat",
        chain=chain,
        purpose="masquerade",
        network=None,
        container_id=None,
        rules=(),
        jumps=(),
        backend="nft",
    )
    context = ReclaimContext(
        netns_dirs=(), bin_dirs=(), live_netns=frozenset(), quarantine=None, command_timeout=10.0, done={}
    )
    done = iptables.reclaim([gone], context)
    print(json.dumps({identity[3]: outcome.ok for identity, outcome in done.items()}))


if __name__ == "__main__":
    main(sys.argv[1])
