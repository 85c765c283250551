"""Running CNI plugins with the exec protocol: no shell, only from the bin dirs, bounded.

DEL runs every plugin of a list, last first, past failures (libcni stops at the first):
docs/design.md, "What a DEL sends, and how a result is read".
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Mapping
from typing import Any

from msgspec import Struct

from reaper.cni.requests import DelRequest, at_least, plugin_stdin
from reaper.host.confined import open_root
from reaper.host.files import describe_oserror
from reaper.host.jsondoc import parse_json
from reaper.kinds.netconf import ConfigError, plugin_list
from reaper.names import PLUGIN_TYPE

# The plugins' PATH, the system dirs only, unless reaper.host.iptables_backend puts a dir first.
PLUGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_OUTPUT = 1 << 20


class PluginFailure(Exception):
    """A plugin could not be run, failed, or timed out; the message is one line."""

    def __init__(self, plugin: str, message: str, code: int | None = None) -> None:
        super().__init__(f"{plugin}: {message}")
        self.plugin = plugin
        self.code = code


class PluginEnv(Struct, frozen=True, kw_only=True):
    command: str  # DEL, STATUS
    container_id: str
    netns: str
    ifname: str
    args: tuple[tuple[str, str], ...]
    bin_dirs: tuple[str, ...]
    path: str = PLUGIN_PATH  # the plugin's PATH, where it finds iptables

    def environ(self) -> dict[str, str]:
        env = {"CNI_COMMAND": self.command, "CNI_PATH": ":".join(self.bin_dirs), "PATH": self.path}
        if self.container_id:
            env["CNI_CONTAINERID"] = self.container_id
        if self.command != "STATUS":  # STATUS is about the plugin, not an attachment
            env["CNI_NETNS"] = self.netns
            env["CNI_IFNAME"] = self.ifname
            env["CNI_ARGS"] = ";".join(f"{k}={v}" for k, v in self.args)
        return env


def find_plugin(plugin_type: str, bin_dirs: tuple[str, ...]) -> str:
    """The executable for `plugin_type` in the first bin dir that has it; a bin dir that is a
    symlink is refused, links inside followed (as libcni's FindInPath)."""
    if not PLUGIN_TYPE.fullmatch(plugin_type):
        raise PluginFailure(plugin_type[:60], "invalid plugin type name")
    refused = []
    for directory in bin_dirs:
        try:
            root_fd = open_root(directory)
        except FileNotFoundError:
            continue
        except OSError as err:
            refused.append(f"{directory} {describe_oserror(err)}")
            continue
        try:
            st = os.stat(plugin_type, dir_fd=root_fd)
        except OSError:
            continue
        finally:
            os.close(root_fd)
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o111:
            return os.path.join(directory, plugin_type)
    where = "; ".join(refused) if refused else ":".join(bin_dirs)
    raise PluginFailure(plugin_type, f"not found in {where}")


def _error_message(stdout: bytes, stderr: bytes, returncode: int) -> tuple[str, int | None]:
    text = stdout.decode("utf-8", "replace").strip()
    try:
        doc = parse_json(text) if text else None
    except ValueError:
        doc = None
    if isinstance(doc, dict) and ("msg" in doc or "code" in doc):
        code = doc.get("code") if isinstance(doc.get("code"), int) else None
        msg = str(doc.get("msg", "")).strip()
        details = str(doc.get("details", "") or "").strip()
        return (f"{msg} ({details})" if details else msg) or f"exit {returncode}", code
    err = stderr.decode("utf-8", "replace").strip() or text
    line = err.splitlines()[-1] if err else f"exit {returncode}"
    return line[:500], None


STOP_GRACE = 5.0  # seconds a running plugin gets once the agent is asked to stop
KILL_WAIT = 5.0  # seconds to reap a plugin after SIGKILL (it cannot refuse; this bounds a D state)
PIPE_CHUNK = 65536
_WAIT_STEP = 0.5  # seconds between looks at the stop flag while a plugin runs


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """The plugin and everything it started; its pipes are not read again."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(KILL_WAIT)


def _exchange(
    proc: subprocess.Popen[bytes], data: bytes, plugin_type: str, timeout: float, stop: threading.Event | None
) -> tuple[bytes, bytes]:
    """(stdout, stderr) once the plugin exited, each capped at MAX_OUTPUT as it arrives, every
    wait bounded by the deadline."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    deadline = time.monotonic() + timeout
    out_fd, err_fd, in_fd = proc.stdout.fileno(), proc.stderr.fileno(), proc.stdin.fileno()
    read: dict[int, bytearray] = {out_fd: bytearray(), err_fd: bytearray()}
    todo = memoryview(data)
    with selectors.DefaultSelector() as selector:
        for fd in (out_fd, err_fd, in_fd):
            os.set_blocking(fd, False)
        for fd in read:
            selector.register(fd, selectors.EVENT_READ)
        selector.register(in_fd, selectors.EVENT_WRITE)
        while len(selector.get_map()) > 0:
            if stop is not None and stop.is_set():
                deadline = min(deadline, time.monotonic() + STOP_GRACE)
            left = deadline - time.monotonic()
            if left <= 0:
                _kill(proc)
                why = "stopping" if stop is not None and stop.is_set() else f"timed out after {timeout:g}s"
                raise PluginFailure(plugin_type, f"{why}, killed")
            for key, _ in selector.select(min(_WAIT_STEP, left)):
                if key.fd == in_fd:
                    try:
                        todo = todo[os.write(key.fd, todo[:PIPE_CHUNK]) :]
                    except BrokenPipeError:
                        todo = todo[len(todo) :]  # it stopped reading: what it says next tells why
                    if not todo:
                        selector.unregister(key.fd)
                        proc.stdin.close()
                    continue
                chunk = os.read(key.fd, PIPE_CHUNK)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                read[key.fd] += chunk
                if len(read[key.fd]) > MAX_OUTPUT:
                    _kill(proc)
                    raise PluginFailure(plugin_type, f"printed more than {MAX_OUTPUT} bytes, killed")
    try:
        proc.wait(max(KILL_WAIT, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise PluginFailure(plugin_type, f"timed out after {timeout:g}s, killed") from None
    return bytes(read[out_fd]), bytes(read[err_fd])


def run_plugin(
    plugin_type: str,
    conf: Mapping[str, Any],
    env: PluginEnv,
    timeout: float,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """The plugin's parsed JSON stdout ({} for none). Its own process group, so a timeout kills
    what it started too; once `stop` is set, STOP_GRACE more seconds (DEL is idempotent)."""
    binary = find_plugin(plugin_type, env.bin_dirs)
    try:
        proc = subprocess.Popen(
            [binary],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env.environ(),
            cwd="/",
            start_new_session=True,
            close_fds=True,
        )
    except OSError as err:
        raise PluginFailure(plugin_type, f"cannot execute: {err.strerror}") from None
    try:
        stdout, stderr = _exchange(proc, json.dumps(conf).encode(), plugin_type, timeout, stop)
    finally:
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    if proc.returncode != 0:
        message, code = _error_message(stdout, stderr, proc.returncode)
        raise PluginFailure(plugin_type, message, code)
    text = stdout.decode("utf-8", "replace").strip()
    if not text:
        return {}
    try:
        doc = parse_json(text)
    except ValueError:
        raise PluginFailure(plugin_type, f"printed something that is not JSON: {text[:80]!r}") from None
    return doc if isinstance(doc, dict) else {}


class PluginOutcome(Struct, frozen=True):
    plugin: str
    ok: bool
    error: str | None


def del_network(
    request: DelRequest,
    bin_dirs: tuple[str, ...],
    timeout: float,
    stop: threading.Event | None = None,
    *,
    path: str = PLUGIN_PATH,
) -> tuple[PluginOutcome, ...]:
    """DEL every plugin of the list, last first, past failures (not past `stop`), `path` their PATH."""
    try:
        name, version, plugins = plugin_list(request.config)
    except ConfigError as err:
        return (PluginOutcome("(config)", False, f"{request.source}: {err}"),)
    env = PluginEnv(
        command="DEL",
        container_id=request.container_id,
        netns=request.netns,
        ifname=request.ifname,
        args=request.cni_args,
        bin_dirs=bin_dirs,
        path=path,
    )
    outcomes = []
    for plugin in reversed(plugins):
        plugin_type = str(plugin["type"])
        if stop is not None and stop.is_set():
            outcomes.append(PluginOutcome(plugin_type, False, f"{plugin_type}: not run, stopping"))
            continue
        try:
            run_plugin(plugin_type, plugin_stdin(plugin, name, version, request), env, timeout, stop)
        except PluginFailure as err:
            outcomes.append(PluginOutcome(plugin_type, False, str(err)))
        else:
            outcomes.append(PluginOutcome(plugin_type, True, None))
    return tuple(outcomes)


STATUS_FROM = (1, 1, 0)  # the CNI version that brought the STATUS verb


def network_status(
    config: bytes,
    bin_dirs: tuple[str, ...],
    timeout: float,
    stop: threading.Event | None = None,
    *,
    path: str = PLUGIN_PATH,
) -> str | None:
    """The CNI 1.1 STATUS verb as libcni's GetStatusNetworkList asks it, stopping at the first
    error: that plugin's error, one line; None when all are available, the list predates STATUS
    or the config is unreadable (its DEL reports that)."""
    try:
        name, version, plugins = plugin_list(config)
    except ConfigError:
        return None
    if not at_least(version, STATUS_FROM):
        return None
    env = PluginEnv(command="STATUS", container_id="", netns="", ifname="", args=(), bin_dirs=bin_dirs, path=path)
    for plugin in plugins:
        conf = {**plugin, "name": name, "cniVersion": version}
        try:
            run_plugin(str(plugin["type"]), conf, env, timeout, stop)
        except PluginFailure as err:
            return str(err) if err.code is None else f"{err} (code {err.code})"
    return None
