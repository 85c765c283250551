#!/usr/bin/python3
"""A stand-in for flannel's CNI plugin (Debian ships none): its DEL does what upstream's does.

flannel-io/cni-plugin (flannel.go cmdDel, flannel_linux.go doCmdDel): decode the plugin config
with dataDir defaulting to /var/lib/cni/flannel (keys matched without regard to case, as Go's
encoding/json matches them); read `<dataDir>/<CNI_CONTAINERID>`, following links (ioutil.ReadFile);
no file: success, nothing run; a file that does not decode as a config: success, nothing run,
the file kept; otherwise run the plugin its `type` names (found in CNI_PATH, invoke.DelegateDel)
with the file's bytes as stdin and this process' environment, CNI_COMMAND=DEL, then remove the
file, and answer what the delegate answered. ADD is not needed by the tests and is refused.

Test instrumentation only: each DEL appends one JSON line (container ID, the file it read, the
type it delegated to or null) to `<this file>.log`, so a test can tell whether it ran.
Installed into a lab's bin dir as `flannel`; it imports nothing outside the standard library.
"""

import contextlib
import json
import os
import subprocess
import sys

DEFAULT_DATA_DIR = "/var/lib/cni/flannel"


def go_field(doc: dict[str, object], name: str, default: object) -> object:
    """The value Go's decoder puts in the struct field `name`: the last key matching it
    without regard to case; a JSON null leaves the default."""
    value = default
    for key, item in doc.items():
        if key.casefold() == name.casefold() and item is not None:
            value = item
    return value


def log(entry: dict[str, object]) -> None:
    with open(sys.argv[0] + ".log", "a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\n")


def fail(code: int, msg: str) -> int:
    print(json.dumps({"cniVersion": "1.0.0", "code": code, "msg": msg}))
    return 1


def find_in_path(plugin: str) -> str | None:
    if not plugin or "/" in plugin:
        return None
    for directory in os.environ.get("CNI_PATH", "").split(":"):
        candidate = os.path.join(directory, plugin)
        if directory and os.path.isfile(candidate):
            return candidate
    return None


def delete() -> int:
    conf = json.loads(sys.stdin.buffer.read())
    data_dir = go_field(conf, "dataDir", DEFAULT_DATA_DIR)
    if not isinstance(data_dir, str):
        return fail(6, "failed to load netconf: dataDir is not a string")
    container_id = os.environ.get("CNI_CONTAINERID", "")
    path = os.path.normpath(os.path.join("/", data_dir, container_id))
    entry: dict[str, object] = {"container_id": container_id, "path": path, "type": None}
    try:
        with open(path, "rb") as scratch:
            data = scratch.read()
    except FileNotFoundError:
        log(entry)
        return 0
    except OSError as err:
        log(entry)
        return fail(5, f"reading {path}: {err}")
    try:
        delegate = json.loads(data)
        plugin_type = go_field(delegate, "type", "") if isinstance(delegate, dict) else None
    except ValueError:
        plugin_type = None
    if not isinstance(plugin_type, str):
        print(f"failed to parse netconf: {path}", file=sys.stderr)
        log(entry)
        return 0
    entry["type"] = plugin_type
    log(entry)
    binary = find_in_path(plugin_type)
    try:
        if binary is None:
            return fail(7, f"failed to find plugin {plugin_type!r} in path")
        env = dict(os.environ, CNI_COMMAND="DEL")
        ran = subprocess.run([binary], input=data, env=env, capture_output=True, check=False)
        sys.stdout.buffer.write(ran.stdout)
        sys.stderr.buffer.write(ran.stderr)
        return ran.returncode
    finally:
        # Upstream removes the file once the delegate was asked, whatever it answered.
        with contextlib.suppress(OSError):
            os.remove(path)


def main() -> int:
    command = os.environ.get("CNI_COMMAND")
    if command == "VERSION":
        print(json.dumps({"cniVersion": "1.0.0", "supportedVersions": ["0.3.1", "0.4.0", "1.0.0"]}))
        return 0
    if command == "DEL":
        return delete()
    return fail(4, f"the flannel stand-in does only DEL, not {command}")


if __name__ == "__main__":
    sys.exit(main())
