"""The lab's sandbox image: a static pause binary packed as an OCI image layout tar.

No registry is reachable from the lab machines, so the CRI sandbox image is built here from
tests/harness/lab/pause.c with pure Python (tarfile, hashlib, json) and imported with `ctr`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

PAUSE_IMAGE = "reaper.test/pause:lab"
PAUSE_SOURCE = Path(__file__).with_name("pause.c")
DEFAULT_CACHE_DIR = Path(__file__).resolve().parents[3] / "build" / "pause"

# Bump when the layout written below changes, so an old cached tar is not reused.
_FORMAT = "1"

_MT_INDEX = "application/vnd.oci.image.index.v1+json"
_MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_MT_CONFIG = "application/vnd.oci.image.config.v1+json"
_MT_LAYER = "application/vnd.oci.image.layer.v1.tar"


class ImageBuildError(Exception):
    """The pause binary or its image could not be built."""


@dataclass(frozen=True)
class _Blob:
    media_type: str
    data: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self) -> dict[str, object]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data)}


def _json_bytes(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _tar_bytes(members: list[tuple[str, bytes, int]]) -> bytes:
    """A reproducible tar of regular files: (name, content, mode), owner root, mtime 0."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content, mode in members:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = mode
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def _compile_pause(source: Path, workdir: Path) -> bytes:
    out = workdir / "pause"
    cmd = ["gcc", "-static", "-O2", "-s", "-o", str(out), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ImageBuildError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return out.read_bytes()


def _layout_tar(pause_binary: bytes, image_name: str) -> bytes:
    layer = _Blob(_MT_LAYER, _tar_bytes([("pause", pause_binary, 0o755)]))
    config = _Blob(
        _MT_CONFIG,
        _json_bytes(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {"Entrypoint": ["/pause"], "WorkingDir": "/"},
                "rootfs": {"type": "layers", "diff_ids": [layer.digest]},
            }
        ),
    )
    manifest = _Blob(
        _MT_MANIFEST,
        _json_bytes(
            {
                "schemaVersion": 2,
                "mediaType": _MT_MANIFEST,
                "config": config.descriptor(),
                "layers": [layer.descriptor()],
            }
        ),
    )
    index = {
        "schemaVersion": 2,
        "mediaType": _MT_INDEX,
        "manifests": [
            {
                **manifest.descriptor(),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": image_name,
                    "org.opencontainers.image.ref.name": image_name.rsplit(":", 1)[-1],
                },
            }
        ],
    }
    members = [("oci-layout", _json_bytes({"imageLayoutVersion": "1.0.0"}), 0o644)]
    members += [
        (f"blobs/sha256/{blob.digest.removeprefix('sha256:')}", blob.data, 0o644) for blob in (layer, config, manifest)
    ]
    members.append(("index.json", _json_bytes(index), 0o644))
    return _tar_bytes(members)


def build_pause_image(
    cache_dir: Path = DEFAULT_CACHE_DIR,
    source: Path = PAUSE_SOURCE,
    image_name: str = PAUSE_IMAGE,
) -> Path:
    """Return an OCI layout tar of the pause image, building it unless cached.

    The tar is cached as ``<cache_dir>/pause-<hash>.tar`` where the hash covers the C source,
    the image name and the layout format; a cached tar is reused as is.
    """
    key = hashlib.sha256(source.read_bytes() + b"\0" + image_name.encode() + b"\0" + _FORMAT.encode())
    target = cache_dir / f"pause-{key.hexdigest()[:16]}.tar"
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".build-") as tmp:
        data = _layout_tar(_compile_pause(source, Path(tmp)), image_name)
        staged = Path(tmp) / "image.tar"
        staged.write_bytes(data)
        os.replace(staged, target)
    return target
