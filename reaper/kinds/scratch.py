"""Files a plugin keeps for each container it attached, named by the container ID:
`<dir>/<container ID>` (flannel's, multus'), or a name holding it (tuning's: ScratchFormat.owner).

Not a kind: what the kinds that read such files share. A file is read beneath its root, without
following a symlink or blocking on a FIFO, bounded in size. A name that is no container ID is a
corrupt record, never a resource; content the plugin would not have written is still its
container's, with the reason. Reclaiming removes only the very file judged (same name, inode,
stamps and reading): its content names no container. docs/design.md, "In depth: the kinds".
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Generic, TypeVar

from msgspec import Struct

from reaper.host.confined import UnfitFile, read_at, read_beneath
from reaper.host.files import DirLister, describe_oserror
from reaper.host.memo import FileMemo, Stamp, stamp
from reaper.host.quarantine import Quarantine, remove_or_quarantine
from reaper.kinds import Found, Kind, Look, optional
from reaper.kinds.netconf import ConfigError, plugin_list
from reaper.model import ContainerTie, CorruptFile, DetailValue, Done, Identity, NetworkConfig, ResourceRef
from reaper.names import is_cni_id, is_path

C = TypeVar("C")

MAX_SCRATCH_BYTES = 4 << 20

# A file made in its place, or written since, differs in at least one of its stamp's fields.
stamp_of = stamp


class ScratchFile(Struct, Generic[C], frozen=True, kw_only=True):
    """One per-container file of a plugin's (`<dir>/<container ID>`, by default)."""

    container_id: str  # the container ID its name carries (the whole name, by default)
    path: str
    root: str  # the root it was found beneath, and every later access is confined to
    mtime: float
    stamp: Stamp  # the file as it was read: only that file is ever removed
    content: C | None  # what it says; None when it is not what the plugin writes
    corrupt: str | None = None  # why it is not


def whole_name(name: str) -> str:
    """The container ID a file named by it alone carries; ValueError when the name is none."""
    if not is_cni_id(name):
        raise ValueError("file name is not a container ID")
    return name


class ScratchFormat(Struct, Generic[C], frozen=True):
    """A plugin's per-container file: the kind that reads it and its parser, which raises
    ValueError (one line, the reason) on anything the plugin would not have written."""

    kind: str
    parse: Callable[[bytes], C]
    limit: int = MAX_SCRATCH_BYTES
    # The container ID a file's name carries; ValueError (the reason) when none: a corrupt record.
    owner: Callable[[str], str] = whole_name


def go_join(directory: str, name: str) -> str:
    """The absolute path a plugin opens for Go's filepath.Join(directory, name), run with the
    root as its working dir (as the reaper runs plugins): cleaned, a relative dir taken from /."""
    path = os.path.normpath(os.path.join("/", directory, name))
    return "/" + path.lstrip("/")  # POSIX keeps a leading "//"; Go does not


def config_dirs(configs: Iterable[NetworkConfig], types: Collection[str], key: str) -> list[str]:
    """The directory `key` names in every plugin of one of `types` in the node's configs, as
    Go's filepath.Join cleans it; relative or impossible paths are not used."""
    dirs: list[str] = []
    for config in configs:
        try:
            _, _, plugins = plugin_list(config.raw)
        except ConfigError:
            continue
        for plugin in plugins:
            value = plugin.get(key)
            if plugin.get("type") not in types or not (isinstance(value, str) and value[:1] == "/" and is_path(value)):
                continue
            directory = go_join(value, "")
            if directory not in dirs:
                dirs.append(directory)
    return dirs


def config_roots(kind: str, look: Look, types: Collection[str], key: str) -> tuple[list[str], list[CorruptFile]]:
    """The dirs `key` names in the node's configs (config_dirs), each to be read as a root of its
    own, and those refused: a dir that is, or holds, a dir the reaper reads for another reason
    (`/`, the cache dir, ...) holds files that are not the plugin's alone."""
    options = look.options
    own = [os.path.normpath(d) for d in (options.cache_dir, *options.conf_dirs, *options.ipam_dirs)]
    own += [os.path.normpath(d) for d in (*options.netns_dirs, *options.bin_dirs)]
    dirs: list[str] = []
    refused: list[CorruptFile] = []
    for directory in config_dirs(look.configs, types, key):
        if any(d == directory or d.startswith(directory.rstrip("/") + "/") for d in own):
            refused.append(CorruptFile(kind, directory, f"a {key} that is or holds a dir the reaper reads; not read"))
        else:
            dirs.append(directory)
    return dirs, refused


def find_files(
    fmt: ScratchFormat[C], look: Look, types: Collection[str], key: str, default: tuple[str, str]
) -> Found[ScratchFile[C]]:
    """The files in the `default` (root, directory) and in each dir `key` names in the node's
    plugins of `types` (config_roots: each a root of its own), and the dirs refused."""
    named, refused = config_roots(fmt.kind, look, types, key)
    dirs = [default, *((d, d) for d in named if (d, d) != default)]
    files, corrupt = collect(fmt, dirs, look.memo.of(fmt.kind))
    return Found(tuple(files), (*refused, *corrupt))


def parse_content(fmt: ScratchFormat[C], data: bytes) -> tuple[C | None, str | None]:
    """(content, None), or (None, why it is not what the plugin writes)."""
    if not data.strip():
        return None, "empty file"
    try:
        return fmt.parse(data), None
    except ValueError as err:
        return None, str(err)[:200]


def _read(
    fmt: ScratchFormat[C], dir_fd: int, name: str, path: str, root: str, lst: os.stat_result
) -> ScratchFile[C] | CorruptFile:
    try:
        container_id = fmt.owner(name)
    except ValueError as err:
        return CorruptFile(fmt.kind, path, str(err)[:200])
    if stat.S_ISLNK(lst.st_mode):
        return CorruptFile(fmt.kind, path, "symlink, not followed")
    if not stat.S_ISREG(lst.st_mode):  # not even opened: a device's open can do things
        return CorruptFile(fmt.kind, path, "not a regular file")
    try:
        data, st = read_at(dir_fd, name, fmt.limit)
    except (OSError, UnfitFile) as err:
        return CorruptFile(fmt.kind, path, describe_oserror(err) if isinstance(err, OSError) else str(err))
    parsed = parse_content(fmt, data)
    return ScratchFile(
        container_id=container_id,
        path=path,
        root=root,
        mtime=st.st_mtime,
        stamp=stamp_of(st),
        content=parsed[0],
        corrupt=parsed[1],
    )


def collect(
    fmt: ScratchFormat[C], dirs: Iterable[tuple[str, str]], memo: FileMemo[object] | None = None
) -> tuple[list[ScratchFile[C]], list[CorruptFile]]:
    """Every file in each (root, directory), the directory reached beneath its root; each
    directory is read once however many times it is named."""
    memo = memo if memo is not None else FileMemo()
    files: list[ScratchFile[C]] = []
    lister = DirLister(fmt.kind)
    corrupt = lister.corrupt
    for root, directory in dirs:
        for dir_fd, entry in lister.scan(root, directory):
            path = os.path.join(directory, entry.name)
            try:
                lst = entry.stat(follow_symlinks=False)
            except OSError as err:
                corrupt.append(CorruptFile(fmt.kind, path, describe_oserror(err)))
                continue
            if stat.S_ISDIR(lst.st_mode):  # multus' results/, and nothing of the plugin's
                continue
            known = memo.get(path, lst)
            found: ScratchFile[C] | CorruptFile
            if isinstance(known, CorruptFile) or (isinstance(known, ScratchFile) and known.root == root):
                found, fresh = known, False
            else:
                found, fresh = _read(fmt, dir_fd, entry.name, path, root, lst), True
            if isinstance(found, CorruptFile):
                if corrupt.append(found) and fresh:
                    memo.put(path, lst, found)  # only what is listed: junk costs no memory
                continue
            if fresh:
                memo.put(path, lst, found)
            files.append(found)
    return files, list(corrupt.records())


def _remove(fmt: ScratchFormat[C], file: ScratchFile[C], quarantine: Quarantine | None) -> Done:
    try:
        data, st = read_beneath(file.root, file.path, fmt.limit)
    except FileNotFoundError:
        return Done.freed()
    except (OSError, UnfitFile) as err:
        return Done.left(f"cannot re-read: {err}")
    if stamp_of(st) != file.stamp:
        return Done.left("replaced or written since it was judged; left alone")
    if parse_content(fmt, data) != (file.content, file.corrupt):
        return Done.left("now says something else than when it was judged; left alone")
    return remove_or_quarantine(file.root, file.path, st, quarantine)


def reclaim(
    fmt: ScratchFormat[C], files: Sequence[ScratchFile[C]], quarantine: Quarantine | None
) -> dict[Identity, Done]:
    """Remove (or quarantine) each file that is still the one judged."""
    return {(fmt.kind, file.path): _remove(fmt, file, quarantine) for file in files}


Details = dict[str, DetailValue]


def file_kind(
    fmt: ScratchFormat[C],
    find: Callable[[Look], Found[ScratchFile[C]]],
    details: Callable[[ScratchFile[C]], Details],
    *,
    last: bool,
) -> Kind[ScratchFile[C]]:
    """The kind of one plugin's per-container files. Identity: the path. Tie: the container ID
    of its name (ContainerTie: a lone file of a dead container is an attachment of its own).
    `details`: what the report shows of its content beside the path (and the corruption)."""

    def identity(file: ScratchFile[C]) -> Identity:
        return (fmt.kind, file.path)

    def ref(file: ScratchFile[C]) -> ResourceRef:
        shown: Details = {"path": file.path, **details(file), **optional(corrupt=file.corrupt)}
        return ResourceRef(
            kind=fmt.kind, name=file.container_id, created_at=file.mtime, details=shown, identity=identity(file)
        )

    return Kind(
        name=fmt.kind,
        find=find,
        identity=identity,
        ref=ref,
        tie=lambda file: ContainerTie(file.container_id),
        reclaim=lambda files, ctx: reclaim(fmt, files, ctx.quarantine),
        last=last,
        quarantinable=True,
    )
