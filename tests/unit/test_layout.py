"""Layout detection reads each runtime's config as the runtime does; flags and variables win.

The configs below are written in the shapes their producers write (citations in each test):
containerd's `containerd config default` and migration rules, k3s' and microk8s' templates,
CRI-O's crio.conf and drop-ins."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from reaper.layout import detect_layout
from reaper.settings import add_options, settings_from
from tests.harness.procs import believed_process, host_proc


def _write(root: Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def test_a_node_without_runtime_configs_detects_nothing(tmp_path: Path) -> None:
    layout = detect_layout(str(tmp_path))
    assert layout.runtimes == () and layout.problems == ()


def test_containerd_1x_with_netns_under_the_state_dir(tmp_path: Path) -> None:
    # containerd 1.7 pkg/cri/config/config.go: CniConfig bin_dir/conf_dir; sandbox_run.go puts
    # pins in <state>/io.containerd.grpc.v1.cri/netns with netns_mounts_under_state_dir.
    _write(
        tmp_path,
        "/etc/containerd/config.toml",
        'version = 2\nstate = "/run/ctd"\n[plugins."io.containerd.grpc.v1.cri"]\n'
        "  netns_mounts_under_state_dir = true\n"
        '[plugins."io.containerd.grpc.v1.cri".cni]\n  bin_dir = "/usr/lib/cni"\n  conf_dir = "/etc/cni/other"\n',
    )
    (runtime,) = detect_layout(str(tmp_path)).runtimes
    assert (runtime.runtime, runtime.conf_dir, runtime.bin_dirs) == ("containerd", "/etc/cni/other", ("/usr/lib/cni",))
    assert runtime.netns_dir == "/run/ctd/io.containerd.grpc.v1.cri/netns"
    assert runtime.sources == ("/etc/containerd/config.toml",)


def test_containerd_2x_bin_dirs_and_imports(tmp_path: Path) -> None:
    # containerd 2.1+: [plugins."io.containerd.cri.v1.runtime".cni] bin_dirs (a list); `imports`
    # globs, relative to the file, loaded breadth-first, later files winning.
    _write(tmp_path, "/etc/containerd/config.toml", 'version = 3\nimports = ["conf.d/*.toml"]\n')
    _write(
        tmp_path,
        "/etc/containerd/conf.d/10-cni.toml",
        'version = 3\n[plugins."io.containerd.cri.v1.runtime".cni]\n'
        '  bin_dirs = ["/opt/cni/bin", "/usr/libexec/cni"]\n',
    )
    _write(
        tmp_path,
        "/etc/containerd/conf.d/20-conf.toml",
        'version = 3\n[plugins."io.containerd.cri.v1.runtime".cni]\n  conf_dir = "/etc/cni/custom"\n',
    )
    (runtime,) = detect_layout(str(tmp_path)).runtimes
    assert runtime.bin_dirs == ("/opt/cni/bin", "/usr/libexec/cni") and runtime.conf_dir == "/etc/cni/custom"
    assert runtime.netns_dir == "/var/run/netns"
    assert runtime.sources[1:] == ("/etc/containerd/conf.d/10-cni.toml", "/etc/containerd/conf.d/20-conf.toml")


def test_containerd_version_1_config_keys_the_plugin_by_its_bare_id(tmp_path: Path) -> None:
    # services/server/config/config.go: version 1 keys plugins by ID, so [plugins.cri.cni].
    _write(tmp_path, "/etc/containerd/config.toml", '[plugins.cri.cni]\n  conf_dir = "/etc/cni/v1"\n')
    (runtime,) = detect_layout(str(tmp_path)).runtimes
    assert runtime.conf_dir == "/etc/cni/v1" and runtime.bin_dirs == ("/opt/cni/bin",)


def test_k3s_and_microk8s_layouts(tmp_path: Path) -> None:
    # k3s pkg/agent/templates (version 2): cni bin_dir/conf_dir in its data dir; microk8s
    # containerd-template.toml: ${SNAP_DATA}/opt/cni/bin and ${SNAP_DATA}/args/cni-network.
    _write(
        tmp_path,
        "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".cni]\n'
        '  bin_dir = "/var/lib/rancher/k3s/data/cni"\n  conf_dir = "/var/lib/rancher/k3s/agent/etc/cni/net.d"\n',
    )
    _write(
        tmp_path,
        "/var/snap/microk8s/current/args/containerd.toml",
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".cni]\n'
        '  bin_dir = "/var/snap/microk8s/current/opt/cni/bin"\n'
        '  conf_dir = "/var/snap/microk8s/current/args/cni-network"\n',
    )
    k3s, microk8s = detect_layout(str(tmp_path)).runtimes
    assert (k3s.runtime, k3s.conf_dir, k3s.bin_dirs) == (
        "k3s",
        "/var/lib/rancher/k3s/agent/etc/cni/net.d",
        ("/var/lib/rancher/k3s/data/cni",),
    )
    assert microk8s.runtime == "microk8s" and microk8s.conf_dir == "/var/snap/microk8s/current/args/cni-network"


def test_crio_drop_ins_override_in_lexical_order(tmp_path: Path) -> None:
    # CRI-O pkg/config: crio.conf, then every file under crio.conf.d walked in lexical order;
    # plugin_dirs is replaced whole, the deprecated plugin_dir appended; namespaces_dir/netns.
    _write(tmp_path, "/etc/crio/crio.conf", '[crio.network]\nnetwork_dir = "/etc/cni/a"\nplugin_dirs = ["/opt/a"]\n')
    _write(tmp_path, "/etc/crio/crio.conf.d/01-b.conf", '[crio.network]\nplugin_dirs = ["/opt/b"]\n')
    _write(tmp_path, "/etc/crio/crio.conf.d/00-c", '[crio.network]\nnetwork_dir = "/etc/cni/c"\n')
    _write(tmp_path, "/etc/crio/crio.conf.d/02/x.conf", '[crio.network]\nplugin_dir = "/opt/old"\n')
    _write(tmp_path, "/etc/crio/crio.conf.d/03.conf", '[crio.runtime]\nnamespaces_dir = "/run/crio-ns"\n')
    (runtime,) = detect_layout(str(tmp_path)).runtimes
    assert runtime.runtime == "cri-o" and runtime.conf_dir == "/etc/cni/c"
    assert runtime.bin_dirs == ("/opt/b", "/opt/old") and runtime.netns_dir == "/run/crio-ns/netns"


@pytest.mark.parametrize(
    "text",
    [
        "version = [",
        "\xff",
        '[plugins."io.containerd.grpc.v1.cri".cni]\nconf_dir = "relative/dir"\nbin_dir = 7\n',
    ],
)
def test_a_config_that_cannot_be_read_as_the_runtime_reads_it_is_a_problem_not_a_crash(
    tmp_path: Path, text: str
) -> None:
    path = tmp_path / "etc/containerd/config.toml"
    path.parent.mkdir(parents=True)
    path.write_text(text, errors="surrogateescape")
    layout = detect_layout(str(tmp_path))
    if layout.runtimes:  # readable, but its values are not paths: the defaults stand
        assert layout.runtimes[0].conf_dir == "/etc/cni/net.d" and layout.runtimes[0].bin_dirs == ("/opt/cni/bin",)
    else:
        assert len(layout.problems) == 1 and "config.toml" in layout.problems[0]


def test_a_config_that_is_a_symlink_is_followed_as_the_runtime_follows_it(tmp_path: Path) -> None:
    elsewhere = tmp_path / "store" / "config.toml"  # NixOS links /etc files into its store
    elsewhere.parent.mkdir()
    elsewhere.write_text('[plugins.cri.cni]\nconf_dir = "/etc/cni/linked"\n')
    link = tmp_path / "etc/containerd/config.toml"
    link.parent.mkdir(parents=True)
    link.symlink_to(elsewhere)
    (runtime,) = detect_layout(str(tmp_path)).runtimes
    assert runtime.conf_dir == "/etc/cni/linked"


def test_a_fifo_for_a_config_is_a_problem_and_never_blocks(tmp_path: Path) -> None:
    path = tmp_path / "etc/containerd/config.toml"
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    layout = detect_layout(str(tmp_path))
    assert layout.runtimes == () and "not a regular file" in layout.problems[0]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_options(parser, ("paths", "output"))
    return parser.parse_args(list(argv))


def test_flags_and_variables_win_over_what_is_detected(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "/etc/containerd/config.toml",
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".cni]\n'
        '  bin_dir = "/usr/lib/cni"\n  conf_dir = "/etc/cni/x"\n',
    )
    layout = detect_layout(str(tmp_path))
    detected = settings_from(_args(), {}, layout)
    assert detected.find.conf_dir == "/etc/cni/x" and detected.find.bin_dirs == ("/usr/lib/cni",)
    assert dict(detected.origins)["--cni-bin-dir"].startswith("containerd (/etc/containerd/config.toml")
    flagged = settings_from(_args("--cni-bin-dir", "/opt/mine"), {"REAPER_CNI_CONF_DIR": "/etc/env"}, layout)
    assert flagged.find.bin_dirs == ("/opt/mine",) and flagged.find.conf_dir == "/etc/env"
    assert dict(flagged.origins) == {
        "--cni-conf-dir": "REAPER_CNI_CONF_DIR",
        "--cni-bin-dir": "flag",
        "--netns-dir": dict(detected.origins)["--netns-dir"],
    }
    plain = settings_from(_args(), {}, None)
    assert plain.find.bin_dirs == ("/opt/cni/bin",) and dict(plain.origins)["--cni-bin-dir"] == "default"


def test_the_runtime_that_serves_comes_first(tmp_path: Path) -> None:
    """A k3s node that also carries a stock /etc/containerd/config.toml (a package left it):
    the dirs of the runtime whose socket is there win."""
    _write(tmp_path, "/etc/containerd/config.toml", '[plugins.cri.cni]\nconf_dir = "/etc/cni/stock"\n')
    _write(
        tmp_path,
        "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".cni]\n'
        '  conf_dir = "/var/lib/rancher/k3s/agent/etc/cni/net.d"\n',
    )
    assert detect_layout(str(tmp_path)).conf_dir == "/etc/cni/stock", "neither serves: the fixed order"
    _write(tmp_path, "/run/k3s/containerd/containerd.sock", "")
    layout = detect_layout(str(tmp_path))
    assert [r.runtime for r in layout.runtimes] == ["k3s", "containerd"]
    assert layout.conf_dir == "/var/lib/rancher/k3s/agent/etc/cni/net.d"


def test_every_present_runtimes_conf_dir_is_the_nodes_own(tmp_path: Path) -> None:
    """containerd and CRI-O during a migration: both runtimes' dirs, the serving one's first,
    and a variable naming a conf dir leaves the other out."""
    _write(
        tmp_path,
        "/etc/containerd/config.toml",
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".cni]\n  conf_dir = "/etc/cni/ctd"\n',
    )
    _write(
        tmp_path,
        "/etc/crio/crio.conf",
        '[crio.network]\nnetwork_dir = "/etc/crio/net.d"\nplugin_dirs = ["/usr/libexec/cni"]\n'
        '[crio.runtime]\nnamespaces_dir = "/var/run/crio-ns"\n',
    )
    _write(tmp_path, "/var/run/crio/crio.sock", "")
    layout = detect_layout(str(tmp_path))
    assert layout.conf_dirs == ("/etc/crio/net.d", "/etc/cni/ctd") and layout.conf_dir == "/etc/crio/net.d"
    assert layout.bin_dirs == ("/usr/libexec/cni", "/opt/cni/bin")
    assert layout.netns_dirs == ("/var/run/crio-ns/netns", "/var/run/netns")
    detected = settings_from(_args(), {}, layout)
    assert detected.find.conf_dirs == ("/etc/crio/net.d", "/etc/cni/ctd")
    assert detected.find.conf_dir == "/etc/crio/net.d"
    flagged = settings_from(_args("--cni-conf-dir", "/etc/mine"), {}, layout)
    assert flagged.find.conf_dirs == ("/etc/mine",)
    env = settings_from(_args(), {"REAPER_CNI_CONF_DIR": "/etc/env"}, layout)
    assert env.find.conf_dirs == ("/etc/env",)


def test_two_runtimes_sharing_a_conf_dir_name_it_once(tmp_path: Path) -> None:
    # Docker's containerd (CRI on) and k3s, both left at /etc/cni/net.d.
    _write(tmp_path, "/etc/containerd/config.toml", "version = 2\n")
    _write(tmp_path, "/var/lib/rancher/k3s/agent/etc/containerd/config.toml", "version = 2\n")
    layout = detect_layout(str(tmp_path))
    assert [r.runtime for r in layout.runtimes] == ["containerd", "k3s"]
    assert layout.conf_dirs == ("/etc/cni/net.d",)
    assert layout.netns_dirs == ("/var/run/netns",)


def test_cri_dockerd_beside_containerd_adds_dockers_netns_dir(tmp_path: Path) -> None:
    """Docker's containerd (CRI on) and cri-dockerd: both runtimes' dirs; cri-dockerd has no
    config, so it is there when its socket is."""
    _write(tmp_path, "/etc/containerd/config.toml", "version = 2\n")
    assert [r.runtime for r in detect_layout(str(tmp_path)).runtimes] == ["containerd"]
    _write(tmp_path, "/run/cri-dockerd.sock", "")
    layout = detect_layout(str(tmp_path))
    assert [r.runtime for r in layout.runtimes] == ["cri-dockerd", "containerd"]
    assert layout.netns_dirs == ("/var/run/docker/netns", "/var/run/netns")
    assert layout.runtimes[0].sources == ("/run/cri-dockerd.sock",)


def test_k3s_with_docker_uses_k3s_cni_dirs(tmp_path: Path) -> None:
    _write(tmp_path, "/run/k3s/cri-dockerd/cri-dockerd.sock", "")
    (runtime,) = detect_layout(str(tmp_path)).runtimes
    assert runtime.runtime == "k3s --docker" and runtime.netns_dir == "/var/run/docker/netns"
    assert runtime.conf_dir == "/var/lib/rancher/k3s/agent/etc/cni/net.d"


def test_containerd_runtime_handlers_conf_dirs_are_conf_dirs_too(tmp_path: Path) -> None:
    # containerd pkg/cri/config Runtime.NetworkPluginConfDir, `toml:"cni_conf_dir"`, per handler
    # under the CRI plugin's containerd.runtimes (1.x) and the 2.x runtime plugin's.
    _write(
        tmp_path,
        "/etc/containerd/config.toml",
        'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata]\n'
        '  runtime_type = "io.containerd.kata.v2"\n  cni_conf_dir = "/etc/kata/net.d"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n',
    )
    _write(
        tmp_path,
        "/etc/containerd/conf.d/gvisor.toml",
        'version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runsc]\n'
        '  cni_conf_dir = "/etc/gvisor/net.d"\n',
    )
    layout = detect_layout(str(tmp_path))
    (runtime,) = layout.runtimes
    assert runtime.conf_dir == "/etc/cni/net.d"
    assert runtime.handler_conf_dirs == ("/etc/kata/net.d", "/etc/gvisor/net.d")
    assert layout.conf_dirs == ("/etc/cni/net.d", "/etc/kata/net.d", "/etc/gvisor/net.d")
    assert settings_from(_args(), {}, layout).find.more_conf_dirs == ("/etc/kata/net.d", "/etc/gvisor/net.d")


def _proc(tmp_path: Path, *processes: tuple[int, list[str], int], name: str = "proc") -> str:
    """A stand-in /proc (beside `tmp_path`) whose pid 1 has `tmp_path` for its root, with
    (pid, argv, uid)s."""
    proc = tmp_path.parent / f"{tmp_path.name}-{name}"
    host_proc(proc, tmp_path)
    for pid, argv, uid in processes:
        believed_process(proc, pid, tmp_path, argv, uid)
    return str(proc)


def test_a_containerd_started_with_its_own_config_is_a_runtime_of_its_own(tmp_path: Path) -> None:
    """containerd --config (-c) elsewhere than any known install; --state and --address win over
    the file's, as containerd applies its flags after its config."""
    _write(
        tmp_path,
        "/opt/ctd/config.toml",
        'version = 2\nstate = "/run/from-file"\n[plugins."io.containerd.grpc.v1.cri"]\n'
        "  netns_mounts_under_state_dir = true\n"
        '[plugins."io.containerd.grpc.v1.cri".cni]\n  conf_dir = "/opt/ctd/net.d"\n',
    )
    _write(tmp_path, "/run/ctd2/ctd.sock", "")
    argv = ["containerd", "-c", "/opt/ctd/config.toml", "--state=/run/ctd2", "--address", "/run/ctd2/ctd.sock"]
    assert detect_layout(str(tmp_path)).runtimes == (), "without the process table: no such file is known"
    (runtime,) = detect_layout(str(tmp_path), _proc(tmp_path, (40, argv, 0))).runtimes
    assert runtime.runtime == "containerd (pid 40)" and runtime.conf_dir == "/opt/ctd/net.d"
    assert runtime.netns_dir == "/run/ctd2/io.containerd.grpc.v1.cri/netns"
    assert runtime.serving and runtime.socket == "/run/ctd2/ctd.sock"
    assert runtime.sources == ("/opt/ctd/config.toml", "containerd (pid 40) command line")


def test_a_runtime_process_the_hosts_init_could_not_have_started_says_nothing(tmp_path: Path) -> None:
    _write(tmp_path, "/opt/ctd/config.toml", '[plugins.cri.cni]\nconf_dir = "/opt/ctd/net.d"\n')
    proc = _proc(tmp_path, (40, ["containerd", "--config=/opt/ctd/config.toml"], 1000), (41, ["crio"], 1000))
    assert detect_layout(str(tmp_path), proc).runtimes == ()


def test_a_known_installs_containerd_process_adds_its_flags_to_that_install(tmp_path: Path) -> None:
    # k3s starts its containerd with -c <its config> -a <its socket> --state <its state>.
    k3s = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"
    _write(tmp_path, k3s, 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\nnetns_mounts_under_state_dir = true\n')
    proc = _proc(tmp_path, (50, ["containerd", "-c", k3s, "--state", "/run/k3s/other"], 0))
    (runtime,) = detect_layout(str(tmp_path), proc).runtimes
    assert runtime.runtime == "k3s" and runtime.netns_dir == "/run/k3s/other/io.containerd.grpc.v1.cri/netns"


def test_crio_flags_win_over_its_files(tmp_path: Path) -> None:
    """crio --config, --config-dir, --cni-config-dir, --cni-plugin-dir (repeatable, commas),
    --namespaces-dir: the files named by the flags are read, then the other flags win."""
    _write(tmp_path, "/etc/crio/crio.conf", '[crio.network]\nnetwork_dir = "/etc/not-read"\n')
    _write(tmp_path, "/opt/crio/crio.conf", '[crio.network]\nnetwork_dir = "/opt/crio/net.d"\n')
    _write(tmp_path, "/opt/crio/d/10.conf", '[crio.runtime]\nnamespaces_dir = "/run/from-drop-in"\n')
    argv = ["crio", "--config", "/opt/crio/crio.conf", "-d", "/opt/crio/d"]
    (runtime,) = detect_layout(str(tmp_path), _proc(tmp_path, (60, argv, 0))).runtimes
    assert runtime.conf_dir == "/opt/crio/net.d" and runtime.netns_dir == "/run/from-drop-in/netns"
    assert runtime.sources == ("/opt/crio/crio.conf", "/opt/crio/d/10.conf", "crio (pid 60) command line")
    argv += ["--cni-config-dir=/flag/net.d", "--cni-plugin-dir", "/flag/a,/flag/b", "--cni-plugin-dir=/flag/c"]
    argv += ["--namespaces-dir", "/run/flag-ns"]
    (runtime,) = detect_layout(str(tmp_path), _proc(tmp_path, (60, argv, 0), name="again")).runtimes
    assert runtime.conf_dir == "/flag/net.d" and runtime.bin_dirs == ("/flag/a", "/flag/b", "/flag/c")
    assert runtime.netns_dir == "/run/flag-ns/netns"


def test_talos_cri_containerd_and_its_conf_d(tmp_path: Path) -> None:
    # Talos: the CRI containerd reads /etc/cri/containerd.toml, which imports /etc/cri/conf.d.
    _write(tmp_path, "/etc/cri/containerd.toml", 'version = 2\nimports = ["/etc/cri/conf.d/*.toml"]\n')
    _write(
        tmp_path,
        "/etc/cri/conf.d/cri.toml",
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".cni]\n  conf_dir = "/etc/cni/talos"\n',
    )
    (runtime,) = detect_layout(str(tmp_path)).runtimes
    assert runtime.runtime == "talos" and runtime.conf_dir == "/etc/cni/talos"


def test_dockers_containerd_without_cri_beside_k3s_adds_no_dirs(tmp_path: Path) -> None:
    """The containerd.io package's config disables CRI: that containerd runs no pod, so k3s'
    dirs are the node's; once CRI is on again, both runtimes' are."""
    _write(tmp_path, "/etc/containerd/config.toml", 'disabled_plugins = ["cri"]\n')
    _write(
        tmp_path,
        "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".cni]\n'
        '  conf_dir = "/var/lib/rancher/k3s/agent/etc/cni/net.d"\n',
    )
    layout = detect_layout(str(tmp_path))
    assert [r.runtime for r in layout.runtimes] == ["k3s"]
    _write(tmp_path, "/etc/containerd/config.toml", 'version = 2\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n')
    assert [r.runtime for r in detect_layout(str(tmp_path)).runtimes] == ["k3s"]
    _write(tmp_path, "/etc/containerd/config.toml", "version = 2\ndisabled_plugins = []\n")
    assert detect_layout(str(tmp_path)).conf_dirs == ("/etc/cni/net.d", "/var/lib/rancher/k3s/agent/etc/cni/net.d")


def test_cri_dockerd_flags_name_its_cni_dirs(tmp_path: Path) -> None:
    # cri-dockerd --cni-conf-dir, --cni-bin-dir (comma-separated); Docker still makes the pins.
    _write(tmp_path, "/run/cri-dockerd.sock", "")
    argv = ["cri-dockerd", "--network-plugin=cni", "--cni-conf-dir", "/etc/dd/net.d", "--cni-bin-dir=/dd/a,/dd/b"]
    (runtime,) = detect_layout(str(tmp_path), _proc(tmp_path, (70, argv, 0))).runtimes
    assert (runtime.conf_dir, runtime.bin_dirs) == ("/etc/dd/net.d", ("/dd/a", "/dd/b"))
    assert runtime.netns_dir == "/var/run/docker/netns"
    assert runtime.sources == ("/run/cri-dockerd.sock", "cri-dockerd (pid 70) command line")
    (untrusted,) = detect_layout(str(tmp_path), _proc(tmp_path, (70, argv, 1000), name="user")).runtimes
    assert untrusted.conf_dir == "/etc/cni/net.d"
