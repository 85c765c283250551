{{/*
cni-reaper.platforms: where each platform keeps what the agent needs, as YAML read with fromYaml
by cni-reaper.layout. Every value names the file of the platform's own sources it was read from
(PLATFORMS.md has the same table, and what could not be confirmed). Per platform:
  socketDirs     the CRI socket directories, mounted so that discovery finds the sockets in them
                 (no --runtime-endpoint: every runtime that answers there is asked). wait: the
                 pod waits until the dir exists (hostPath type Directory), for the runtime the
                 platform always runs; the others are created if missing (DirectoryOrCreate).
  netnsDirs, ipamDirs, cniConfDir, cniBinDirs: as the values of the same names.
  namespacesDirs CRI-O's namespaces_dir where CRI-O always runs: its ipc, uts, user and pid pins
                 are in <dir>/<type>ns (the value namespacesDirs).
  statePaths     what the platform's plugins keep beside the CNI dirs (state, daemon sockets),
                 mounted like the IPAM dirs: writable, read-only in scan mode.
  readOnlyPaths  mounted read-only before the bin dirs, e.g. where a bin dir's symlinks point.
/run and /var/run are one directory on every platform here (/var/run is a link to /run), so the
runtime dirs are mounted under /run whichever spelling the platform's sources use.
*/}}
{{- define "cni-reaper.platforms" -}}
kubeadm:
  socketDirs:
    # kubernetes/kubernetes cmd/kubeadm/app/constants/constants_unix.go: CRISocketContainerd
    # unix:///var/run/containerd/containerd.sock, CRISocketCRIO unix:///var/run/crio/crio.sock.
    # kubeadm takes either (its runtime detection asks both), so neither is waited for.
    - {path: /run/containerd, wait: false}
    - {path: /run/crio, wait: false}
  # containerd/containerd internal/cri/server/sandbox_run.go: netnsMountDir /var/run/netns
  # unless netns_mounts_under_state_dir (pins cni-<uuid>); CRI-O: namespaces_dir /var/run plus
  # netns (its default as generated crio.conf files show it; not read in cri-o's own source).
  netnsDirs: [/var/run/netns]
  namespacesDirs: []
  # containernetworking/plugins host-local's default dataDir.
  ipamDirs: [/var/lib/cni/networks]
  # containerd/containerd internal/cri/config/config_unix.go DefaultRuntimeConfig:
  # NetworkPluginConfDir /etc/cni/net.d, NetworkPluginBinDirs /opt/cni/bin. CRI-O's network_dir
  # and plugin_dirs defaults are taken to be the same (not read in cri-o's source).
  cniConfDir: /etc/cni/net.d
  cniBinDirs: [/opt/cni/bin]
  statePaths: []
  readOnlyPaths: []
k3s:
  socketDirs:
    # k3s-io/k3s pkg/agent/config/config_linux.go applyContainerdStateAndAddress: state
    # /run/k3s/containerd, address <state>/containerd.sock.
    - {path: /run/k3s/containerd, wait: true}
  netnsDirs: [/var/run/netns]
  namespacesDirs: []
  ipamDirs: [/var/lib/cni/networks]
  # k3s-io/k3s pkg/agent/config/config.go: CNIConfDir = <data-dir>/agent/etc/cni/net.d;
  # pkg/datadir/datadir.go: DefaultDataDir /var/lib/rancher/k3s (as root).
  cniConfDir: /var/lib/rancher/k3s/agent/etc/cni/net.d
  # k3s-io/k3s pkg/agent/config/config.go: CNIBinDir = the dir of the host-local found on PATH;
  # cmd/k3s/main.go puts <data-dir>/data/cni first on PATH (a stable dir of links to the
  # multicall binary in <data-dir>/data/<hash>/bin). Releases before that dir existed found
  # host-local in <data-dir>/data/<hash>/bin: set cniBinDirs to that dir there.
  cniBinDirs: [/var/lib/rancher/k3s/data/cni]
  statePaths: []
  # The links in data/cni point into data/<hash>/bin: mounted so that they resolve in the pod.
  readOnlyPaths: [/var/lib/rancher/k3s/data]
rke2:
  socketDirs:
    # rancher/rke2 pkg/executor/staticpod/spw.go ContainerdSock and Dockerfile
    # CONTAINER_RUNTIME_ENDPOINT: /run/k3s/containerd/containerd.sock (rke2 runs k3s' agent).
    - {path: /run/k3s/containerd, wait: true}
  netnsDirs: [/var/run/netns]
  namespacesDirs: []
  ipamDirs: [/var/lib/cni/networks]
  # rancher/rke2 pkg/cli/defaults/defaults.go sets flannel-backend none, so k3s' agent
  # (pkg/agent/config/config.go) sets no CNI dirs and containerd keeps its defaults;
  # bundle/bin/rke2-uninstall.sh removes /etc/cni and /opt/cni/bin, where rke2's CNI charts
  # install.
  cniConfDir: /etc/cni/net.d
  cniBinDirs: [/opt/cni/bin]
  statePaths: []
  readOnlyPaths: []
microk8s:
  socketDirs:
    # canonical/microk8s microk8s-resources/default-args/containerd: --address
    # ${SNAP_COMMON}/run/containerd.sock; SNAP_COMMON is /var/snap/microk8s/common. The socket
    # sits in the run dir itself, beside containerd's state dir.
    - {path: /var/snap/microk8s/common/run, wait: true}
  netnsDirs: [/var/run/netns]
  namespacesDirs: []
  ipamDirs: [/var/lib/cni/networks]
  # canonical/microk8s microk8s-resources/default-args/containerd-template.toml:
  # conf_dir ${SNAP_DATA}/args/cni-network, bin_dir ${SNAP_DATA}/opt/cni/bin; SNAP_DATA is the
  # revision's dir, which /var/snap/microk8s/current links to.
  cniConfDir: /var/snap/microk8s/current/args/cni-network
  cniBinDirs: [/var/snap/microk8s/current/opt/cni/bin]
  statePaths:
    # Calico (the default CNI): canonical/microk8s
    # upgrade-scripts/000-switch-to-calico/resources/calico.yaml: nodename_file
    # /var/snap/microk8s/current/var/lib/calico/nodename, calico-node's /var/run/calico and
    # /var/lib/calico host paths under /var/snap/microk8s/current.
    - /var/snap/microk8s/current/var/lib/calico
    - /var/snap/microk8s/current/var/run/calico
    # Flannel (non-HA clusters): canonical/microk8s
    # microk8s-resources/default-args/flannel-template.conflist: dataDir
    # ${SNAP_COMMON}/var/lib/cni/flannel, subnetFile ${SNAP_COMMON}/run/flannel/subnet.env
    # (the run dir is mounted already, as the socket dir).
    - /var/snap/microk8s/common/var/lib/cni/flannel
  readOnlyPaths: []
kind:
  socketDirs:
    # kubernetes-sigs/kind images/base/files/etc/crictl.yaml: runtime-endpoint
    # unix:///run/containerd/containerd.sock.
    - {path: /run/containerd, wait: true}
  netnsDirs: [/var/run/netns]
  namespacesDirs: []
  # kubernetes-sigs/kind images/kindnetd/cmd/kindnetd/cni.go: kindnet's host-local dataDir
  # /run/cni-ipam-state (in /etc/cni/net.d/10-kindnet.conflist).
  ipamDirs: [/var/lib/cni/networks, /run/cni-ipam-state]
  cniConfDir: /etc/cni/net.d
  # kubernetes-sigs/kind images/base/Dockerfile: the plugins are copied to /opt/cni/bin.
  cniBinDirs: [/opt/cni/bin]
  statePaths: []
  readOnlyPaths: []
openshift:
  socketDirs:
    # openshift/machine-config-operator templates/worker/01-worker-kubelet/_base/units/
    # kubelet.service.yaml: --container-runtime-endpoint=/var/run/crio/crio.sock.
    - {path: /run/crio, wait: true}
  # CRI-O's pins: openshift/cluster-network-operator bindata/network/multus/multus.yaml and
  # bindata/network/ovn-kubernetes/self-hosted/ovnkube-node.yaml mount /run/netns for them.
  netnsDirs: [/var/run/netns]
  # openshift/machine-config-operator templates/worker/01-worker-container-runtime/_base/files/
  # crio.yaml sets no namespaces_dir, so CRI-O's default: /var/run (cri-o/cri-o
  # docs/crio.conf.5.md); pins in /var/run/{ipc,uts,user,pid}ns beside /var/run/netns.
  namespacesDirs: [/var/run]
  ipamDirs: [/var/lib/cni/networks]
  # openshift/machine-config-operator templates/worker/01-worker-container-runtime/_base/files/
  # crio.yaml [crio.network]: network_dir /etc/kubernetes/cni/net.d/, plugin_dirs
  # [/var/lib/cni/bin]; cluster-network-operator pkg/network/multus.go: SystemCNIConfDir,
  # CNIBinDir the same.
  cniConfDir: /etc/kubernetes/cni/net.d
  cniBinDirs: [/var/lib/cni/bin]
  statePaths:
    # openshift/cluster-network-operator pkg/network/multus.go: MultusSocketParentDir
    # /run/multus (the thick plugin's socket), MultusCNIConfDir /var/run/multus/cni/net.d
    # (the default network's config, which multus' DEL delegates to).
    - /run/multus
    # openshift/cluster-network-operator bindata/network/ovn-kubernetes/self-hosted/
    # ovnkube-node.yaml: host path /run/ovn-kubernetes, where ovnkube-node serves the CNI
    # requests ovn-k8s-cni-overlay's DEL sends.
    - /run/ovn-kubernetes
  readOnlyPaths: []
gke:
  socketDirs:
    # kubernetes/kubernetes cluster/gce/gci/configure-helper.sh (the GCE node scripts; GKE's
    # own node configuration is not public): containerd at its default address.
    - {path: /run/containerd, wait: true}
  netnsDirs: [/var/run/netns]
  namespacesDirs: []
  ipamDirs: [/var/lib/cni/networks]
  # kubernetes/kubernetes cluster/gce/gci/configure-helper.sh: [plugins...cri.cni] bin_dir
  # ${KUBE_HOME}/bin, conf_dir /etc/cni/net.d; KUBE_HOME=/home/kubernetes.
  cniConfDir: /etc/cni/net.d
  cniBinDirs: [/home/kubernetes/bin]
  statePaths: []
  readOnlyPaths: []
eks:
  socketDirs:
    # awslabs/amazon-eks-ami nodeadm/internal/containerd/config.template.toml: [grpc] address
    # /run/containerd/containerd.sock (nodeadm/internal/containerd/config.go, the kubelet's).
    - {path: /run/containerd, wait: true}
  netnsDirs: [/var/run/netns]
  namespacesDirs: []
  ipamDirs: [/var/lib/cni/networks]
  # awslabs/amazon-eks-ami nodeadm/internal/containerd/config.template.toml: bin_dir
  # /opt/cni/bin, conf_dir /etc/cni/net.d.
  cniConfDir: /etc/cni/net.d
  cniBinDirs: [/opt/cni/bin]
  statePaths: []
  readOnlyPaths: []
aks:
  socketDirs:
    # Azure/AgentBaker parts/linux/cloud-init/artifacts/cse_config.sh: the kubelet's
    # --container-runtime-endpoint=unix:///run/containerd/containerd.sock.
    - {path: /run/containerd, wait: true}
  netnsDirs: [/var/run/netns]
  namespacesDirs: []
  ipamDirs: [/var/lib/cni/networks]
  # Azure/AgentBaker pkg/agent/baker.go (containerd config template): bin_dir /opt/cni/bin,
  # conf_dir /etc/cni/net.d.
  cniConfDir: /etc/cni/net.d
  cniBinDirs: [/opt/cni/bin]
  statePaths: []
  readOnlyPaths: []
talos:
  socketDirs:
    # siderolabs/talos pkg/machinery/constants/constants.go: CRIContainerdAddress
    # /run/containerd/containerd.sock (the CRI containerd; the system one is under /system).
    - {path: /run/containerd, wait: true}
  netnsDirs: [/var/run/netns]
  namespacesDirs: []
  ipamDirs: [/var/lib/cni/networks]
  # siderolabs/talos hack/cri-containerd.toml sets no CNI dirs (containerd's defaults);
  # Dockerfile copies the plugins to /opt/cni/bin; internal/app/machined/pkg/controllers/k8s/
  # internal/k8stemplates/flannel.go writes /etc/cni/net.d/10-flannel.conflist.
  cniConfDir: /etc/cni/net.d
  cniBinDirs: [/opt/cni/bin]
  statePaths: []
  readOnlyPaths: []
{{- end }}

{{/*
cni-reaper.layout: the dirs the agent is given and the host paths it needs, as YAML (fromYaml).
A value the user set (non-empty) wins; else the platform's; with no platform, the chart's
generic defaults (containerd's and the CNI plugins' own, one pinned endpoint), as before
platforms existed. runtimeEndpoint pins one socket (--runtime-endpoint: only it is asked, and
its dir is mounted); without it, the socket dirs are mounted and discovery finds every runtime
serving in them.
*/}}
{{- define "cni-reaper.layout" -}}
{{- $v := .Values }}
{{- $generic := dict
  "socketDirs" (list)
  "netnsDirs" (list "/var/run/netns")
  "namespacesDirs" (list)
  "ipamDirs" (list "/var/lib/cni/networks")
  "cniConfDir" "/etc/cni/net.d"
  "cniBinDirs" (list "/opt/cni/bin")
  "statePaths" (list)
  "readOnlyPaths" (list)
}}
{{- $base := $generic }}
{{- $endpoint := $v.runtimeEndpoint }}
{{- if $v.platform }}
{{- $platforms := include "cni-reaper.platforms" . | fromYaml }}
{{- if not (hasKey $platforms $v.platform) }}
{{- fail (printf "platform %q is not one of: %s" $v.platform (keys $platforms | sortAlpha | join ", ")) }}
{{- end }}
{{- $base = get $platforms $v.platform }}
{{- else if not $endpoint }}
{{- $endpoint = "unix:///run/containerd/containerd.sock" }}
{{- end }}
{{- /* A pinned endpoint is the only runtime asked: the platform's other socket dirs are not
mounted for it. runtimeSocketDirs, when given, replaces the platform's list. */}}
{{- $socketDirs := ternary (list) $base.socketDirs (not (empty $endpoint)) }}
{{- with $v.runtimeSocketDirs }}
{{- $socketDirs = list }}
{{- range . }}
{{- $socketDirs = append $socketDirs (dict "path" . "wait" false) }}
{{- end }}
{{- end }}
runtimeEndpoint: {{ $endpoint | toJson }}
socketDirs: {{ $socketDirs | toJson }}
netnsDirs: {{ $v.netnsDirs | default $base.netnsDirs | toJson }}
namespacesDirs: {{ $v.namespacesDirs | default $base.namespacesDirs | toJson }}
ipamDirs: {{ $v.ipamDirs | default $base.ipamDirs | toJson }}
cniConfDir: {{ $v.cniConfDir | default $base.cniConfDir | toJson }}
cniBinDirs: {{ $v.cniBinDirs | default $base.cniBinDirs | toJson }}
statePaths: {{ concat $base.statePaths ($v.extraHostPaths | default list) | toJson }}
readOnlyPaths: {{ $base.readOnlyPaths | toJson }}
{{- end }}
