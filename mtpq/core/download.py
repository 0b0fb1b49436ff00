"""Fetch artifacts from a PyPI simple index, sha256-verified, into a user cache."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from mtpq import output
from mtpq.core import crashsafe
from mtpq.core.errors import MtpqError
from mtpq.core.pin import Artifact

DEFAULT_INDEX_URL = "https://pypi.org/simple"
CHUNK = 1 << 20
_PART = ".mtpq-part-"  # a download in progress


class DownloadError(MtpqError, RuntimeError):
    pass


def cache_root() -> Path:
    """$MTPQ_CACHE_DIR, else $XDG_CACHE_HOME/mtpq, else ~/.cache/mtpq."""
    if explicit := os.environ.get("MTPQ_CACHE_DIR"):
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "mtpq"


def _scratch_root() -> Path:
    return cache_root() / "tmp"


def scratch_dir(kind: str):
    """A private scratch directory for one run, `<cache>/tmp/<pid>-<random>.<kind>`, removed after use."""
    return crashsafe.private_path(_scratch_root(), "", f".{kind}", is_dir=True)


def sweep_scratch() -> None:
    """Remove the scratch directories of runs that were killed."""
    crashsafe.sweep_leftovers(_scratch_root(), "")


def index_url() -> str:
    """$MTPQ_INDEX_URL, else the index pip is configured with (PIP_INDEX_URL, pip.conf), else PyPI."""
    configured = os.environ.get("MTPQ_INDEX_URL") or pip_index_url(
        os.environ.get("PIP_INDEX_URL"), os.environ.get("PIP_CONFIG_FILE")
    )
    return (configured or DEFAULT_INDEX_URL).rstrip("/")


# pip's precedence among the places `pip config list` reports an index-url in: its environment
# variable, then the install command's section, then the global one.
_PIP_INDEX_KEYS = (":env:.index-url", "install.index-url", "global.index-url")


@functools.cache
def pip_index_url(environment_url: str | None, config_file: str | None) -> str | None:
    """The index-url pip's own configuration names (keyed by the variables that change it), or None.
    Asked of `pip config` so every place pip reads (files, environment) counts; without pip, None."""
    if environment_url:
        return environment_url
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = {}
    for line in done.stdout.splitlines() if done.returncode == 0 else ():
        key, _, value = line.partition("=")
        found[key] = value.strip().strip("'\"")
    return next((found[key].split()[0] for key in _PIP_INDEX_KEYS if found.get(key)), None)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class _AnchorParser(HTMLParser):
    """Collects href targets of a PEP 503 project page."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs += [value for name, value in attrs if name == "href" and value]


@dataclass(frozen=True)
class IndexFile:
    url: str
    sha256: str | None  # the hash the index publishes for it, if any


def _project_files(project: str) -> dict[str, IndexFile]:
    """filename -> where it is and its published sha256, from the index's page for `project`
    (PEP 691 JSON or PEP 503 HTML)."""
    page_url = f"{index_url()}/{project}/"
    request = urllib.request.Request(
        page_url,
        headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        body = response.read().decode()
    if body.lstrip().startswith("{"):
        return {
            f["filename"]: IndexFile(urllib.parse.urljoin(page_url, f["url"]), f["hashes"].get("sha256"))
            for f in json.loads(body)["files"]
        }
    parser = _AnchorParser()
    parser.feed(body)
    files = {}
    for href in parser.hrefs:
        absolute, _, fragment = urllib.parse.urljoin(page_url, href).partition("#")
        filename = urllib.parse.unquote(urllib.parse.urlsplit(absolute).path.rsplit("/", 1)[-1])
        algorithm, _, digest = fragment.partition("=")
        files[filename] = IndexFile(absolute, digest if algorithm == "sha256" else None)
    return files


def published_artifacts(project: str) -> list[Artifact]:
    """Every file the index lists for `project` with the sha256 it publishes for it (a file without
    one is left out: nothing could verify its download)."""
    try:
        files = _project_files(project)
    except (urllib.error.URLError, OSError) as error:
        raise DownloadError(f"cannot list {project} on {index_url()} ({error})") from error
    return [Artifact(project, name, file.sha256) for name, file in files.items() if file.sha256]


def fetch(artifact: Artifact) -> Path:
    """Return a cached, verified copy of `artifact`, downloading it if needed.

    A download whose sha256 differs from the artifact's is refused and nothing is kept.
    """
    target = cache_root() / "downloads" / artifact.filename
    crashsafe.sweep_leftovers(target.parent, _PART)
    if target.exists():
        if sha256_of(target) == artifact.sha256:
            return target
        target.unlink()  # a damaged cache entry is ours to replace
    try:
        listed = _project_files(artifact.project).get(artifact.filename)
        if listed is None:
            raise DownloadError(f"{artifact.filename} is not listed on {index_url()}/{artifact.project}/")
        with crashsafe.private_path(target.parent, _PART) as part_path:
            digest = hashlib.sha256()
            with urllib.request.urlopen(listed.url, timeout=120) as response, part_path.open("wb") as part:
                total = int(response.headers.get("Content-Length") or 0) or None
                size = f" ({total / 2**20:.1f} MiB)" if total else ""
                output.note(f"downloading {artifact.filename}{size} from {listed.url} into {target.parent}")
                progress = output.Progress(f"downloading {artifact.filename}", total)
                while chunk := response.read(CHUNK):
                    digest.update(chunk)
                    part.write(chunk)
                    progress.add(len(chunk))
                progress.finish()
            if digest.hexdigest() != artifact.sha256:
                raise DownloadError(
                    f"sha256 mismatch for {artifact.filename} from {listed.url}: "
                    f"got {digest.hexdigest()}, expected {artifact.sha256}; refusing it"
                )
            part_path.chmod(0o644)
            part_path.replace(target)
    except (urllib.error.URLError, OSError) as error:
        raise DownloadError(
            f"cannot download {artifact.filename} from {index_url()} ({error}); "
            f"no verified copy in {target.parent}. Connect to the network, set MTPQ_INDEX_URL "
            f"to a mirror, or place the file there."
        ) from error
    return target


def pip_environment() -> dict[str, str]:
    """pip on one index alone, index_url()'s: the lock's hashes name that index's files, and the rest
    of a machine's pip configuration (extra indexes, find-links with local builds of torch) would
    offer others."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    return {
        **env,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": index_url(),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
