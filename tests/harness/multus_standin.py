#!/usr/bin/python3
"""A stand-in for multus' thin CNI plugin (Debian ships none): its DEL, as far as the tests need.

k8snetworkplumbingwg/multus-cni pkg/multus CmdDel with its saved delegates: decode the config
(cniDir defaulting to /var/lib/cni/multus, binDir to /opt/cni/bin, keys matched without regard
to case as Go's encoding/json matches them); read `<cniDir>/<CNI_CONTAINERID>`, following links;
no file: success, nothing run (upstream would then ask the API server for the pod, which the
lab has none of); else for each delegate, last first, DEL its `Bytes` through libcni with cniDir
as libcni's cache dir: as a config list when its `ConfList` has plugins, else as one plugin
config; the interface its `ifnameRequest`, the first delegate's CNI_IFNAME, else `net<index>`;
each plugin (last first) given the list's name and cniVersion and, from a cniVersion of 0.4.0
on, the cached result `<cniDir>/results/<network>-<container ID>-<ifname>` as prevResult (a
cniCacheV1 entry's `result`, else the whole file); plugins found in binDir, then CNI_PATH. Then
the cached result and the file are removed. Errors are collected and the last one answered.

Test instrumentation only: each DEL appends one JSON line (container ID, the file it read, the
plugin types it ran) to `<this file>.log`, so a test can tell whether it ran.
Installed into a lab's bin dir as `multus`; it imports nothing outside the standard library.
"""

import base64
import contextlib
import json
import os
import subprocess
import sys

DEFAULT_CNI_DIR = "/var/lib/cni/multus"
DEFAULT_BIN_DIR = "/opt/cni/bin"


def go_field(doc: dict[str, object], name: str, default: object) -> object:
    """The value Go's decoder puts in the struct field `name`: the last key matching it
    without regard to case; a JSON null leaves the default."""
    value = default
    for key, item in doc.items():
        if key.casefold() == name.casefold() and item is not None:
            value = item
    return value


def version_at_least(text: object, floor: tuple[int, ...]) -> bool:
    try:
        return tuple(int(p) for p in str(text).split(".")) >= floor
    except ValueError:
        return False


def find(plugin: str, dirs: list[str]) -> str | None:
    if not plugin or "/" in plugin:
        return None
    for directory in dirs:
        candidate = os.path.join(directory, plugin)
        if directory and os.path.isfile(candidate):
            return candidate
    return None


def cached_result(path: str) -> dict[str, object] | None:
    try:
        with open(path, "rb") as cached:
            doc = json.loads(cached.read())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    result = doc.get("result") if doc.get("kind") == "cniCacheV1" else doc
    return result if isinstance(result, dict) else None


def delete() -> int:
    conf = json.loads(sys.stdin.buffer.read())
    cni_dir = go_field(conf, "cniDir", "") or DEFAULT_CNI_DIR
    bin_dir = go_field(conf, "binDir", "") or DEFAULT_BIN_DIR
    container_id = os.environ.get("CNI_CONTAINERID", "")
    path = os.path.normpath(os.path.join("/", str(cni_dir), container_id))
    ran: list[str] = []
    entry: dict[str, object] = {"container_id": container_id, "path": path, "ran": ran}
    try:
        with open(path, "rb") as scratch:
            delegates = json.loads(scratch.read())
    except FileNotFoundError:
        log(entry)
        return 0
    except (OSError, ValueError) as err:
        log(entry)
        return fail(7, f"failed to load netconf: {err}")
    dirs = [str(bin_dir), *os.environ.get("CNI_PATH", "").split(":")]
    errors: list[str] = []
    for index in reversed(range(len(delegates))):
        delegate = delegates[index]
        ifname = go_field(delegate, "ifnameRequest", "") or (
            os.environ.get("CNI_IFNAME", "") if index == 0 else f"net{index}"
        )
        raw = json.loads(base64.b64decode(str(go_field(delegate, "Bytes", ""))))
        conf_list = go_field(delegate, "ConfList", {})
        listed = isinstance(conf_list, dict) and bool(conf_list.get("plugins"))
        name = raw.get("name") if listed else go_field(raw, "name", "")
        version = raw.get("cniVersion") if listed else go_field(raw, "cniVersion", "")
        plugins = raw.get("plugins", []) if listed else [raw]
        result_path = os.path.join(str(cni_dir), "results", f"{name}-{container_id}-{ifname}")
        prev = cached_result(result_path) if version_at_least(version, (0, 4, 0)) else None
        env = dict(os.environ, CNI_COMMAND="DEL", CNI_IFNAME=str(ifname))
        for plugin in reversed(plugins):
            stdin = dict(plugin, name=name, cniVersion=version)
            if prev is not None:
                stdin["prevResult"] = prev
            plugin_type = str(go_field(plugin, "type", ""))
            binary = find(plugin_type, dirs)
            ran.append(plugin_type)
            if binary is None:
                errors.append(f"failed to find plugin {plugin_type!r} in path")
                continue
            out = subprocess.run([binary], input=json.dumps(stdin).encode(), env=env, capture_output=True, check=False)
            if out.returncode != 0:
                errors.append(out.stdout.decode(errors="replace") or out.stderr.decode(errors="replace"))
        with contextlib.suppress(OSError):
            os.remove(result_path)
    log(entry)
    with contextlib.suppress(OSError):
        os.remove(path)
    return fail(999, "; ".join(errors)[:500]) if errors else 0


def log(entry: dict[str, object]) -> None:
    with open(sys.argv[0] + ".log", "a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\n")


def fail(code: int, msg: str) -> int:
    print(json.dumps({"cniVersion": "1.0.0", "code": code, "msg": msg}))
    return 1


def main() -> int:
    command = os.environ.get("CNI_COMMAND")
    if command == "VERSION":
        print(json.dumps({"cniVersion": "1.0.0", "supportedVersions": ["0.3.1", "0.4.0", "1.0.0"]}))
        return 0
    if command == "DEL":
        return delete()
    return fail(4, f"the multus stand-in does only DEL, not {command}")


if __name__ == "__main__":
    sys.exit(main())
