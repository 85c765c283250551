"""What the look at one name in a netns dir says of it. Usage: netns_place NETNS_DIR PATH;
prints the answer of reaper.host.netns_paths.NetnsPlaces.look."""

from __future__ import annotations

import sys

from reaper.host.netns_paths import NetnsPlaces


def main(netns_dir: str, path: str) -> None:
    print(NetnsPlaces([netns_dir]).look(path))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
