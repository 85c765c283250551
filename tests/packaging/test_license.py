"""The license, said once and the same everywhere: the LICENSE file is Apache-2.0's whole text,
pyproject names it as an SPDX expression (the TOML table form is deprecated) with a build backend
that reads that form, and the image's label says the same."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_license_file_is_the_whole_apache_2_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text


def test_pyproject_names_the_license_as_spdx_with_a_backend_that_reads_it() -> None:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert doc["project"]["license"] == "Apache-2.0"
    assert doc["project"]["license-files"] == ["LICENSE"]
    # setuptools reads `license` as an SPDX string from 77.0.0 on.
    (setuptools,) = [r for r in doc["build-system"]["requires"] if r.startswith("setuptools")]
    minimum = re.fullmatch(r"setuptools>=(\d+)(?:\.\d+)*", setuptools)
    assert minimum is not None and int(minimum.group(1)) >= 77


def test_image_label_says_the_same_license() -> None:
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in (ROOT / "Dockerfile").read_text()
