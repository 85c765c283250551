{{/* Chart name, truncated to a DNS label. */}}
{{- define "cni-reaper.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, with the chart name unless the release already has it. */}}
{{- define "cni-reaper.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "cni-reaper.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cni-reaper.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cni-reaper.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "cni-reaper.labels" -}}
helm.sh/chart: {{ include "cni-reaper.chart" . }}
{{ include "cni-reaper.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: node-agent
{{- end }}

{{- define "cni-reaper.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cni-reaper.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The agent's image. The default repository, `cni-reaper` with no tag, names an image no registry
serves: rendered, every pod would sit in ImagePullBackOff. Refused here instead, saying what to set
(the release workflow writes its pushed image into values.yaml, so a packaged release renders).
*/}}
{{- define "cni-reaper.image" -}}
{{- if and (eq .Values.image.repository "cni-reaper") (not .Values.image.tag) }}
{{- fail (printf "image: cni-reaper:%s is a placeholder no registry serves; build the image (README: Build and push the image), push it and give --set image.repository=REGISTRY/cni-reaper (and image.tag, default the chart's appVersion); an image loaded on the nodes by hand: --set image.tag=TAG" .Chart.AppVersion) }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The metrics port: metricsPort, or with 0 the platform's default. OpenShift reserves host ports
9000-9999 for its own components (its docs' host port table), and the agent binds the node IP
(hostNetwork): a port there is refused on that platform.
*/}}
{{- define "cni-reaper.metricsPort" -}}
{{- $openshift := eq (.Values.platform | default "") "openshift" }}
{{- $port := int (.Values.metricsPort | default 0) }}
{{- if eq $port 0 }}
{{- $port = ternary 19753 9753 $openshift }}
{{- end }}
{{- if and $openshift (ge $port 9000) (le $port 9999) }}
{{- fail (printf "metricsPort %d: OpenShift reserves host ports 9000-9999 for its own components and the agent listens on the node (hostNetwork); pick another, or leave metricsPort 0 for 19753" $port) }}
{{- end }}
{{- $port }}
{{- end }}

{{/* The CRI socket's host path, from an endpoint (unix:///path). */}}
{{- define "cni-reaper.criSocket" -}}
{{- if not (hasPrefix "unix:///" .) }}
{{- fail (printf "runtimeEndpoint %q must look like unix:///run/containerd/containerd.sock" .) }}
{{- end }}
{{- clean (trimPrefix "unix://" .) }}
{{- end }}

{{/*
cni-reaper.addMount: add one host path to $state.mounts unless a mount already there covers it:
the same path or a parent, with at least the same access and the same (or Bidirectional)
propagation. Called with (list $state $mount); candidates are added most permissive first, so a
covered path needs no mount of its own and no two mounts share a mountPath.
*/}}
{{- define "cni-reaper.addMount" -}}
{{- $state := index . 0 }}
{{- $m := index . 1 }}
{{- if not (isAbs $m.path) }}
{{- fail (printf "%s: %q must be an absolute path" $m.name $m.path) }}
{{- end }}
{{- $_ := set $m "path" (clean $m.path) }}
{{- $covered := false }}
{{- range $state.mounts }}
{{- $under := or (eq .path $m.path) (hasPrefix (printf "%s/" (trimSuffix "/" .path)) $m.path) }}
{{- /* The same access, not "at least": a read-only path (a CNI bin or conf dir) under a writable
mount (the cache dir in reap mode covers /var/lib/cni/bin, OpenShift's bin dir) gets a read-only
mount of its own beneath it. The runtimes mount the deeper path last (containerd's CRI
WithMounts and CRI-O's addOCIBindMounts sort the mounts by number of path parts), so it wins. */}}
{{- $access := eq (not .readOnly) (not $m.readOnly) }}
{{- $propagation := or (not $m.propagation) (eq (default "" .propagation) $m.propagation) (eq (default "" .propagation) "Bidirectional") }}
{{- if and $under $access $propagation }}
{{- $covered = true }}
{{- end }}
{{- end }}
{{- if not $covered }}
{{- range $state.mounts }}
{{- if eq .path $m.path }}
{{- fail (printf "%s and %s are the same host path %s but need different mounts" .name $m.name $m.path) }}
{{- end }}
{{- end }}
{{- $_ := set $state "mounts" (append $state.mounts $m) }}
{{- end }}
{{- end }}

{{/*
cni-reaper.hostMounts: every host path the agent needs, each mounted at the same path in the
container. Fills $state.mounts (call with a dict holding "root" = the top context and "mounts"
= an empty list) with dicts of name, path, type (hostPath type), readOnly and propagation.
In scan mode nothing of the node's CNI state is writable: read-only mounts, and the netns dirs
with HostToContainer propagation (pins made after the pod started must still show up as
mounts, or they would look like stale files).
*/}}
{{- define "cni-reaper.hostMounts" -}}
{{- $v := .root.Values }}
{{- $layout := include "cni-reaper.layout" .root | fromYaml }}
{{- $scan := eq $v.mode "scan" }}
{{- $propagation := ternary "HostToContainer" "Bidirectional" $scan }}
{{- range $i, $p := $layout.netnsDirs }}
{{- include "cni-reaper.addMount" (list $ (dict "name" (printf "netns-%d" $i) "path" $p "type" "DirectoryOrCreate" "readOnly" $scan "propagation" $propagation)) }}
{{- end }}
{{- /* CRI-O's other pins, <namespaces_dir>/{ipc,uts,user,pid}ns/<name> (cri-o/cri-o
internal/config/nsmgr/nsmgr_linux.go, dirForType and NewPodNamespaces): unpinned like the netns
pins, so mounted like them. */}}
{{- range $i, $d := $layout.namespacesDirs }}
{{- range $type := list "ipc" "uts" "user" "pid" }}
{{- include "cni-reaper.addMount" (list $ (dict "name" (printf "ns-%d-%s" $i $type) "path" (printf "%s/%sns" (trimSuffix "/" $d) $type) "type" "DirectoryOrCreate" "readOnly" $scan "propagation" $propagation)) }}
{{- end }}
{{- end }}
{{- include "cni-reaper.addMount" (list $ (dict "name" "cni-cache" "path" $v.cniCacheDir "type" "DirectoryOrCreate" "readOnly" $scan)) }}
{{- range $i, $p := $layout.ipamDirs }}
{{- include "cni-reaper.addMount" (list $ (dict "name" (printf "ipam-%d" $i) "path" $p "type" "DirectoryOrCreate" "readOnly" $scan)) }}
{{- end }}
{{- /* The platform's plugin state and daemon sockets, and extraHostPaths (values.yaml: platform). */}}
{{- range $i, $p := $layout.statePaths }}
{{- include "cni-reaper.addMount" (list $ (dict "name" (printf "host-path-%d" $i) "path" $p "type" "DirectoryOrCreate" "readOnly" $scan)) }}
{{- end }}
{{- include "cni-reaper.addMount" (list $ (dict "name" "state" "path" (dir $v.stateFile) "type" "DirectoryOrCreate" "readOnly" false)) }}
{{- if and $v.quarantineDir (not $scan) }}
{{- include "cni-reaper.addMount" (list $ (dict "name" "quarantine" "path" $v.quarantineDir "type" "DirectoryOrCreate" "readOnly" false)) }}
{{- end }}
{{- /*
The CRI socket's directory, not the socket file: a runtime restart replaces the socket, and a
file bind mount would keep pointing at the dead one. HostToContainer, so the mounts the runtime
makes and removes under its state dir (container rootfs) are never held by this pod. A pinned
endpoint's dir must exist (the pod waits for it); of a platform's socket dirs, those of the
runtime it always runs too, the others are created if missing, and discovery asks whichever
runtime serves in them.
*/}}
{{- with $layout.runtimeEndpoint }}
{{- include "cni-reaper.addMount" (list $ (dict "name" "cri-socket-dir" "path" (dir (include "cni-reaper.criSocket" .)) "type" "Directory" "readOnly" false "propagation" "HostToContainer")) }}
{{- end }}
{{- range $i, $s := $layout.socketDirs }}
{{- include "cni-reaper.addMount" (list $ (dict "name" (printf "cri-socket-dir-%d" $i) "path" $s.path "type" (ternary "Directory" "DirectoryOrCreate" (eq $s.wait true)) "readOnly" false "propagation" "HostToContainer")) }}
{{- end }}
{{- include "cni-reaper.addMount" (list $ (dict "name" "xtables-lock" "path" $v.xtablesLock "type" "FileOrCreate" "readOnly" false)) }}
{{- range $i, $p := $layout.readOnlyPaths }}
{{- include "cni-reaper.addMount" (list $ (dict "name" (printf "platform-ro-%d" $i) "path" $p "type" "Directory" "readOnly" true)) }}
{{- end }}
{{- include "cni-reaper.addMount" (list $ (dict "name" "cni-conf" "path" $layout.cniConfDir "type" "DirectoryOrCreate" "readOnly" true)) }}
{{- range $i, $p := $layout.cniBinDirs }}
{{- include "cni-reaper.addMount" (list $ (dict "name" (printf "cni-bin-%d" $i) "path" $p "type" "DirectoryOrCreate" "readOnly" true)) }}
{{- end }}
{{- /* The tuning plugin's backups of what it changed (reaper/kinds/tuning.py). */}}
{{- include "cni-reaper.addMount" (list $ (dict "name" "cni-tuning" "path" "/run/cni/tuning" "type" "DirectoryOrCreate" "readOnly" $scan)) }}
{{- /* What the preset's plugins need for their DEL (values.yaml: cniPreset). */}}
{{- range $i, $p := (get (include "cni-reaper.presetPaths" . | fromYaml) "paths") }}
{{- include "cni-reaper.addMount" (list $ (dict "name" (printf "preset-%d" $i) "path" $p "type" "DirectoryOrCreate" "readOnly" $scan)) }}
{{- end }}
{{- end }}

{{/*
cni-reaper.presetPaths: the host paths a CNI's DEL needs beside the CNI dirs, as YAML
{paths: [...]}. Calico: its datastore files and socket dir; Cilium: the agent's socket dir;
Multus (thick plugin): the daemon's socket dir; Flannel: subnet.env (the range gauges); AWS VPC
CNI: ipamd listens on the host's loopback, which the agent (host network) reaches as it is.
*/}}
{{- define "cni-reaper.presetPaths" -}}
{{- $presets := dict
  "none" (list)
  "calico" (list "/var/run/calico" "/var/lib/calico")
  "cilium" (list "/var/run/cilium")
  "multus" (list "/run/multus")
  "flannel" (list "/run/flannel")
  "aws-vpc-cni" (list)
}}
paths: {{ get $presets (.root.Values.cniPreset | default "none") | toJson }}
{{- end }}
