"""Direct cleanup in the kernel and on disk, for whatever a plugin's DEL could not free.

Every action compares before it deletes: a pin only if it is still the same namespace and
nothing lives in it, a veth only if its index, name and peer are unchanged, a lease only if,
under the network directory's lock, it still names the orphan, a chain only if it is still
there, a cache file only if it still names the attachment.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import shutil
import stat
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from pyroute2 import AsyncIPRoute

from reaper.inventory.fsutil import NSFS_MAGIC, PROC_SUPER_MAGIC, UnfitFile, fs_type, read_file_nofollow
from reaper.inventory.hostlocal import parse_lease
from reaper.inventory.iptables import IptablesTools, iptables_tools, parse_save
from reaper.inventory.links import dump_links_and_nsids
from reaper.inventory.procs import describe, netns_members
from reaper.model import NsKey
from reaper.reclaim.quarantine import Quarantine

MNT_DETACH = 2
LOCK_WAIT = 10.0
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


@dataclass(frozen=True)
class Done:
    """What happened to one resource: ok, or why not. `quarantined` is where a file went."""

    ok: bool
    error: str | None = None
    quarantined: str | None = None


OK = Done(True)


def _fail(message: str) -> Done:
    return Done(False, message)


# ------------------------------------------------------------------------------ netns pins


@dataclass(frozen=True)
class PinTarget:
    path: str
    ns: NsKey
    stale: bool


def _inside(path: str, dirs: Iterable[str]) -> bool:
    parent = os.path.realpath(os.path.dirname(path))
    return any(parent == os.path.realpath(d) for d in dirs)


def unpin_all(
    targets: list[PinTarget], netns_dirs: tuple[str, ...], live_netns: set[NsKey], bin_dirs: tuple[str, ...]
) -> dict[str, Done]:
    """Unmount and unlink every pin at once, so the kernel drops their veths in one batch."""
    members = netns_members()
    done: dict[str, Done] = {}
    for target in targets:
        done[target.path] = _unpin(target, netns_dirs, live_netns, members, bin_dirs)
    return done


def _unpin(
    target: PinTarget,
    netns_dirs: tuple[str, ...],
    live_netns: set[NsKey],
    members: dict[NsKey, set[int]],
    bin_dirs: tuple[str, ...],
) -> Done:
    path = target.path
    if not _inside(path, netns_dirs):
        return _fail("not directly inside a netns dir")
    try:
        lst = os.lstat(path)
    except FileNotFoundError:
        return OK
    if stat.S_ISLNK(lst.st_mode):
        return _fail("a symlink now; not followed")
    try:
        st = os.stat(path)
        is_ns = fs_type(path) in (NSFS_MAGIC, PROC_SUPER_MAGIC)
    except OSError as err:
        return _fail(err.strerror or str(err))
    if target.stale:
        if is_ns:
            return _fail("a namespace is mounted on it now")
    else:
        if not is_ns:
            return _fail("no namespace is mounted on it any more")
        key = NsKey(st.st_dev, st.st_ino)
        if key != target.ns:
            return _fail("it pins another namespace now")
        if key in live_netns:
            return _fail("a live sandbox names this netns")
        inside = [h for h in describe(members.get(key, ()), bin_dirs).values() if h.keeps_netns_busy]
        if inside:
            return _fail(f"pid {inside[0].pid} ({inside[0].comm}) is inside")
        if _libc.umount2(os.fsencode(path), MNT_DETACH) != 0:
            code = ctypes.get_errno()
            if code != errno.EINVAL:  # EINVAL: not a mount point (already unmounted)
                return _fail(f"umount: {os.strerror(code)}")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as err:
        return _fail(f"unlink: {err.strerror}")
    return OK


# ----------------------------------------------------------------------------------- veths


@dataclass(frozen=True)
class VethTarget:
    ifindex: int
    name: str
    peer_netnsid: int | None


async def _delete_links(indexes: list[int]) -> dict[int, str | None]:
    results: dict[int, str | None] = {}
    ipr = AsyncIPRoute()
    try:
        await ipr.setup_endpoint()
        for index in indexes:
            try:
                await ipr.link("del", index=index)
                results[index] = None
            except Exception as err:
                code = getattr(err, "code", None)
                results[index] = None if code == errno.ENODEV else str(err)
    finally:
        ipr.close()
    return results


def delete_veths(targets: list[VethTarget]) -> dict[int, Done]:
    """Delete host veths that outlived their pin (their netns is held elsewhere)."""
    links, _ = dump_links_and_nsids(lambda _links: [])
    by_index = {link.ifindex: link for link in links}
    done: dict[int, Done] = {}
    to_delete = []
    for target in targets:
        link = by_index.get(target.ifindex)
        if link is None:
            done[target.ifindex] = OK  # gone with its namespace
        elif link.kind != "veth" or link.name != target.name or link.link_netnsid != target.peer_netnsid:
            done[target.ifindex] = _fail("index now belongs to another link; left alone")
        else:
            to_delete.append(target.ifindex)
    if to_delete:
        for index, error in asyncio.run(_delete_links(to_delete)).items():
            done[index] = OK if error is None else _fail(error)
    return done


def wait_links_gone(indexes: set[int], timeout: float) -> set[int]:
    """Veths die shortly after their namespace; wait for the kernel, return those left."""
    deadline = time.monotonic() + timeout
    left = set(indexes)
    while left:
        links, _ = dump_links_and_nsids(lambda _links: [])
        left &= {link.ifindex for link in links}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return left


# ---------------------------------------------------------------------------------- leases


@dataclass(frozen=True)
class LeaseTarget:
    path: str
    container_id: str
    ifname: str | None


@contextlib.contextmanager
def _locked(directory: str, timeout: float = LOCK_WAIT) -> Iterator[None]:
    """flock(LOCK_EX) on <network dir>/lock, as host-local takes it."""
    fd = os.open(os.path.join(directory, "lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"lock {directory}/lock held for over {timeout:g}s") from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)


def release_leases(
    targets: list[LeaseTarget], quarantine: Quarantine | None, lock_wait: float = LOCK_WAIT
) -> dict[str, Done]:
    """Remove leases that still name their orphan, one lock hold per network directory."""
    by_dir: dict[str, list[LeaseTarget]] = defaultdict(list)
    for target in targets:
        by_dir[os.path.dirname(target.path)].append(target)
    done: dict[str, Done] = {}
    for directory, group in by_dir.items():
        try:
            with _locked(directory, lock_wait):
                for target in group:
                    done[target.path] = _release(target, quarantine)
        except (OSError, TimeoutError) as err:
            for target in group:
                done.setdefault(target.path, _fail(str(err)))
    return done


def _release(target: LeaseTarget, quarantine: Quarantine | None) -> Done:
    try:
        cid, ifname = parse_lease(read_file_nofollow(target.path, 4096))
    except FileNotFoundError:
        return OK
    except (OSError, UnfitFile, ValueError) as err:
        return _fail(f"cannot re-read: {err}")
    if cid != target.container_id or (target.ifname is not None and ifname is not None and ifname != target.ifname):
        return _fail("now names another container; left alone")
    return _remove_file(target.path, quarantine)


def _remove_file(path: str, quarantine: Quarantine | None) -> Done:
    try:
        if quarantine is not None:
            return Done(True, None, quarantine.move(path))
        os.unlink(path)
    except FileNotFoundError:
        return OK
    except OSError as err:
        return _fail(err.strerror or str(err))
    return OK


# ---------------------------------------------------------------------------------- chains


@dataclass(frozen=True)
class ChainTarget:
    family: str
    table: str
    chain: str
    backend: str = "default"


def _restore_input(table: str, chains: Iterable[str], fresh: dict[str, tuple[tuple[str, ...], tuple[str, ...]]]) -> str:
    lines = [f"*{table}"]
    for chain in chains:
        _rules, jumps = fresh[chain]
        lines.extend("-D " + jump[3:] for jump in jumps)
        lines.append(f"-F {chain}")
        lines.append(f"-X {chain}")
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def _run(argv: list[str], input_text: str | None, timeout: float) -> tuple[int, str, str]:
    try:
        proc = subprocess.run(argv, input=input_text, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} timed out after {timeout:g}s"
    except OSError as err:
        return 127, "", f"{argv[0]}: {err.strerror}"
    return proc.returncode, proc.stdout, proc.stderr


def remove_chains(targets: list[ChainTarget], timeout: float) -> dict[tuple[str, str, str], Done]:
    """Each chain and the rules that jump to it, in one iptables-restore --noflush per family,
    backend and table; if that batch is refused, one restore per chain so one bad rule blocks
    no other. Keys: (family, backend, chain)."""
    done: dict[tuple[str, str, str], Done] = {}
    tools: dict[tuple[str, str], IptablesTools] = {(t.family, t.backend): t for t in iptables_tools()}
    groups: dict[tuple[str, str], list[ChainTarget]] = defaultdict(list)
    for target in targets:
        groups[(target.family, target.backend)].append(target)
    for (family, backend), group in groups.items():
        tool = tools.get((family, backend))
        if tool is None:
            done.update({(t.family, t.backend, t.chain): _fail(f"no {backend} iptables tools here") for t in group})
            continue
        code, out, err = _run([tool.save, "-t", "nat"], None, timeout)
        if code != 0:
            done.update({(t.family, t.backend, t.chain): _fail(f"iptables-save: {err.strip()[:200]}") for t in group})
            continue
        fresh = {c.chain: (c.rules, c.jumps) for c in parse_save(out, tool.family, backend)}
        for t in group:
            if t.chain not in fresh:
                done[(t.family, t.backend, t.chain)] = OK
        by_table: dict[str, list[ChainTarget]] = defaultdict(list)
        for t in group:
            if t.chain in fresh:
                by_table[t.table].append(t)
        for table, chains in by_table.items():
            argv = [tool.restore, "-w", "5", "--noflush"]
            code, _, err = _run(argv, _restore_input(table, [t.chain for t in chains], fresh), timeout)
            if code == 0:
                done.update({(t.family, t.backend, t.chain): OK for t in chains})
                continue
            for t in chains:
                code, _, err = _run(argv, _restore_input(table, [t.chain], fresh), timeout)
                last = err.strip().splitlines()[-1][:300] if err.strip() else f"exit {code}"
                done[(t.family, t.backend, t.chain)] = OK if code == 0 else _fail(last)
    return done


# ------------------------------------------------------------------------------------- nft


@dataclass(frozen=True)
class NftTarget:
    family: str
    table: str
    chain: str
    handle: int
    container_id: str


def delete_nft_rules(targets: list[NftTarget], timeout: float) -> dict[tuple[str, str, str, int], Done]:
    """Delete rules by handle, after checking each handle still carries its container ID."""
    done: dict[tuple[str, str, str, int], Done] = {}
    nft = shutil.which("nft")
    by_table: dict[tuple[str, str], list[NftTarget]] = defaultdict(list)
    for t in targets:
        by_table[(t.family, t.table)].append(t)
    for (family, table), group in by_table.items():
        keys = [(t.family, t.table, t.chain, t.handle) for t in group]
        if nft is None:
            done.update({k: _fail("nft not installed") for k in keys})
            continue
        code, out, err = _run([nft, "-j", "list", "table", family, table], None, timeout)
        if code != 0:
            # The table is gone, and the rules with it.
            done.update({k: OK if "No such file" in err else _fail(err.strip()[:200]) for k in keys})
            continue
        comments = _nft_comments(out)
        batch: dict[tuple[str, str, str, int], str] = {}
        for t, key in zip(group, keys, strict=True):
            comment = comments.get((t.chain, t.handle))
            if comment is None:
                done[key] = OK
            elif t.container_id not in comment:
                done[key] = _fail("handle now carries another rule; left alone")
            else:
                batch[key] = f"delete rule {family} {table} {t.chain} handle {t.handle}"
        if not batch:
            continue
        code, _, err = _run([nft, "-f", "-"], "\n".join(batch.values()) + "\n", timeout)
        if code == 0:
            done.update({k: OK for k in batch})
            continue
        for key, line in batch.items():  # one at a time, so one refusal blocks no other
            code, _, err = _run([nft, "-f", "-"], line + "\n", timeout)
            done[key] = OK if code == 0 else _fail(err.strip()[:200])
    return done


def _nft_comments(text: str) -> dict[tuple[str, int], str]:
    try:
        items = json.loads(text).get("nftables", [])
    except (ValueError, AttributeError):
        return {}
    out = {}
    for item in items:
        rule = item.get("rule") if isinstance(item, dict) else None
        if isinstance(rule, dict) and isinstance(rule.get("handle"), int):
            out[(str(rule.get("chain")), rule["handle"])] = str(rule.get("comment", ""))
    return out


# ------------------------------------------------------------------------------ cache files


@dataclass(frozen=True)
class CacheTarget:
    path: str
    container_id: str
    network: str
    ifname: str
    corrupt: bool


def remove_cache_files(
    targets: list[CacheTarget], quarantine: Quarantine | None, still_names: Callable[[bytes, CacheTarget], bool]
) -> dict[str, Done]:
    done: dict[str, Done] = {}
    for target in targets:
        try:
            data = read_file_nofollow(target.path, 4 << 20)
        except FileNotFoundError:
            done[target.path] = OK
            continue
        except (OSError, UnfitFile) as err:
            done[target.path] = _fail(f"cannot re-read: {err}")
            continue
        if not still_names(data, target):
            done[target.path] = _fail("now names another attachment; left alone")
            continue
        done[target.path] = _remove_file(target.path, quarantine)
    return done
