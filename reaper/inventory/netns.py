"""Pinned network namespaces under the netns dirs."""

from __future__ import annotations

import os
import re
import stat

from reaper.inventory.fsutil import NSFS_MAGIC, PROC_SUPER_MAGIC, describe_oserror, fs_type
from reaper.model import CorruptFile, Holder, NetnsPin, NsKey
from reaper.names import is_runtime_netns_name


def collect_pins(
    dirs: tuple[str, ...],
    holders: dict[NsKey, tuple[Holder, ...]],
    patterns: tuple[re.Pattern[str], ...],
) -> tuple[list[NetnsPin], list[CorruptFile]]:
    pins: list[NetnsPin] = []
    corrupt: list[CorruptFile] = []
    seen_dirs: set[tuple[int, int]] = set()
    for directory in dirs:
        try:
            dst = os.stat(directory)
        except FileNotFoundError:
            continue
        except OSError as err:
            corrupt.append(CorruptFile("netns", directory, describe_oserror(err)))
            continue
        # /var/run/netns and /run/netns are usually the same directory.
        if (dst.st_dev, dst.st_ino) in seen_dirs:
            continue
        seen_dirs.add((dst.st_dev, dst.st_ino))
        try:
            entries = list(os.scandir(directory))
        except OSError as err:
            corrupt.append(CorruptFile("netns", directory, describe_oserror(err)))
            continue
        for entry in entries:
            path = entry.path
            if entry.is_symlink():
                corrupt.append(CorruptFile("netns", path, "symlink, not followed"))
                continue
            try:
                st = os.stat(path)
                ftype = fs_type(path)
            except OSError as err:
                corrupt.append(CorruptFile("netns", path, describe_oserror(err)))
                continue
            if not stat.S_ISREG(st.st_mode):
                if entry.is_dir(follow_symlinks=False):
                    continue
                corrupt.append(CorruptFile("netns", path, "not a regular file"))
                continue
            key = NsKey(st.st_dev, st.st_ino)
            is_ns = ftype in (NSFS_MAGIC, PROC_SUPER_MAGIC)
            pins.append(
                NetnsPin(
                    name=entry.name,
                    path=path,
                    directory=directory,
                    ns=key,
                    is_namespace=is_ns,
                    mtime=st.st_mtime,
                    holders=holders.get(key, ()) if is_ns else (),
                    runtime_named=is_runtime_netns_name(entry.name, patterns),
                )
            )
    return pins, corrupt
