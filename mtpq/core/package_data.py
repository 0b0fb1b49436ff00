"""The files the mtpq package carries, found with importlib.resources: the pins (VLLM_VERSIONS) and the
series (patches/), which a checkout keeps at its top level and mtpq/ links to (symlinks) and a wheel
carries inside mtpq/ (pyproject.toml), and the upstream tools' records beside their modules."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def package_path(package: str, name: str) -> Path:
    """A file or directory that `package` carries, links resolved (in a checkout, mtpq/patches is the
    top-level patches/): pip installs mtpq unzipped, so each one is a path other programs can read."""
    return Path(str(files(package).joinpath(name))).resolve()
