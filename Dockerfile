# cni-reaper node agent: `reaper run`, deployed by charts/cni-reaper as a privileged DaemonSet.
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/cni-reaper:0.1.0 --push .
# (README: "Build and push the image"; .github/workflows/release.yml does the same on a v* tag.)
#
# Reproducible by two pins, neither of which expires:
# - BASE is pinned by the digest of its multi-arch index, so every build, on every platform, starts
#   from the same bytes. Bump tag and digest together, deliberately, from
#   `docker buildx imagetools inspect python:3.11-slim-bookworm` (the index digest, on its
#   first "Digest:" line); this one is python:3.11.17-slim-bookworm's as published in October 2026.
# - DEBIAN_SNAPSHOT=base installs the Debian packages below from the snapshot.debian.org state
#   the base was itself built from (image/apt-snapshot.sh reads it from the base's sources), so the
#   digest fixes every version too. No `package=version` pins: they break the build when a point
#   release replaces the version, while a snapshot never changes. The versions installed are
#   written to /usr/share/cni-reaper/debian-packages.txt in the image, to compare two builds by.
#   A newer snapshot (a security fix before a new base): --build-arg DEBIAN_SNAPSHOT=20261201T000000Z.
#   DEBIAN_SNAPSHOT=live installs from the base's own mirror, whatever it holds that day: for a
#   base that names no snapshot or a builder that cannot reach snapshot.debian.org.
#
# Both stages use the same base, so the venv's interpreter link (/usr/local/bin/python3.11) is
# valid in the final image. BASE replaces it with another Debian bookworm that has python3, venv
# and pip with `python` on PATH (the project's image test builds on a debootstrap tree, as no image
# can be pulled there, with DEBIAN_SNAPSHOT=live): the link is then that base's interpreter, still
# valid as both stages share it.
ARG BASE=python:3.11.17-slim-bookworm@sha256:0a310eeecf4e1f5a0743f9a6520c90c88d089c903ca5fd283f501e3a805f5f89
ARG DEBIAN_SNAPSHOT=base

FROM ${BASE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY requirements/runtime.lock requirements/build.lock ./requirements/
COPY reaper ./reaper

# The dependencies from the lock (every version pinned, every file checked by its hash) into a
# venv that the final stage copies whole, then the project's wheel, built with the locked build
# backend in a venv of its own (not copied). Binary wheels only (grpcio has them): no compiler.
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --no-cache-dir --require-hashes --only-binary=:all: -r requirements/build.lock \
 && /opt/build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels . \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --require-hashes --only-binary=:all: -r requirements/runtime.lock \
 && /opt/venv/bin/pip install --no-cache-dir --no-deps /wheels/*.whl


FROM ${BASE}

LABEL org.opencontainers.image.title="cni-reaper" \
      org.opencontainers.image.description="Finds and reclaims leaked container-network resources on Kubernetes nodes" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"

# What the agent (and the CNI plugins whose DEL it runs) execute besides Python:
#   iptables  iptables-save/-restore and ip6tables-*, for the CNI-* and CNI-DN-* nat chains
#             (Debian's default is the nf_tables backend; the legacy one is in the same package,
#             and both are needed: each pass with a plugin DEL picks the one the node uses, as
#             kube-proxy's iptables-wrapper does, and gives it to the plugins, see
#             reaper/host/iptables_backend.py)
#   nftables  nft, for the nftables backend's cni_plugins_masquerade / cni_hostport rules
#   iproute2  ip, for plugins that shell out to it and for debugging inside the pod
# util-linux (nsenter, mount tools) is already in the base image: it is Essential in bookworm.
# Versions: whatever DEBIAN_SNAPSHOT's archive holds (see the top of this file), recorded in
# /usr/share/cni-reaper/debian-packages.txt; the base's apt sources are put back after.
ARG DEBIAN_SNAPSHOT
# hadolint ignore=DL3008
RUN --mount=type=bind,source=image/apt-snapshot.sh,target=/run/apt-snapshot.sh \
    sh /run/apt-snapshot.sh pin "${DEBIAN_SNAPSHOT}" \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      iptables \
      nftables \
      iproute2 \
 && sh /run/apt-snapshot.sh record /usr/share/cni-reaper/debian-packages.txt \
 && rm -rf /var/lib/apt/lists/*

COPY --from=builder /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# Root, on purpose: the agent cannot run as any other user. It unmounts netns pins in the host's
# mount namespace and enters pod network namespaces (CAP_SYS_ADMIN), deletes links and edits
# iptables/nftables over netlink in the host network namespace (CAP_NET_ADMIN, CAP_NET_RAW),
# reads /proc/<pid>/ns of every process on the node (CAP_SYS_PTRACE), and removes root-owned
# leases and cache files under /var/lib/cni. Those capabilities must be held in the host's
# namespaces, which a non-root user (even with file capabilities) in a user namespace never is;
# the chart runs the container privileged for the same reasons.
# hadolint ignore=DL3002
USER 0:0

# /metrics, /healthz and /readyz (the chart binds them to the node IP with --listen).
EXPOSE 9753

ENTRYPOINT ["reaper"]
# The agent, report-only: `reaper run` scans unless told --mode reap (or REAPER_MODE=reap, as the
# chart's mode=reap sets it).
CMD ["run"]
