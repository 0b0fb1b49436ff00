"""Checkpoints on the Hugging Face Hub (or a server that answers as it does), read without downloading
them: config.json, the index and the headers of the shards holding MTP tensors, and for graft the MTP
tensors' bytes, each through HTTP range requests made by huggingface_hub (its endpoint, token,
revision, redirects and retries). huggingface_hub is optional (INSTALL_HINT): it is
imported only when a remote checkpoint is named, and local directories need the standard library alone.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import re
import types
import urllib.parse
from pathlib import Path

from mtpq.checkpoint.files import (
    MAX_INDEX_BYTES,
    CheckpointError,
    CheckpointFiles,
    Header,
    check_header_length,
    parse_header,
    spans_of,
)

# No mtpq package is published: the hub extra comes from a checkout or a git URL, or the library alone.
MIN_HUB_VERSION = "1.0"  # as pyproject.toml's `hub` extra asks
INSTALL_HINT = (
    f"pip install 'huggingface_hub>={MIN_HUB_VERSION}', or in an mtpq checkout pip install '.[hub]' "
    "(from git: pip install 'mtpq[hub] @ git+<the mtpq repository URL>')"
)
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_URL = re.compile(r"https?://", re.IGNORECASE)
# Path segments of a Hub page or file URL that come before a revision: /org/name/tree/REV/...
_REVISION_MARKERS = ("tree", "resolve", "blob")
_ATTEMPTS = 3  # reads of one range cut short mid-body
_RETRIED_STATUSES = (408, 429, 500, 502, 503, 504)  # what huggingface_hub retries a request on
_RETRIES = 2  # huggingface_hub's retries of a request that failed (a timeout, a 5xx), 1 s then 2 s apart
# Seconds without a byte from the server; MTPQ_HUB_TIMEOUT changes it (a slow link, a test).
_TIMEOUT = float(os.environ.get("MTPQ_HUB_TIMEOUT") or 30.0)
_TOKEN_HINT = "set HF_TOKEN (or run `hf auth login`) to a token with access"


@dataclasses.dataclass(frozen=True)
class HubLocation:
    endpoint: str | None  # None: huggingface_hub's (HF_ENDPOINT, else huggingface.co)
    repo_id: str
    revision: str | None  # None: the default branch

    @property
    def name(self) -> str:
        where = f"{self.endpoint}/{self.repo_id}" if self.endpoint else self.repo_id
        return f"{where}@{self.revision}" if self.revision else where


def is_remote(location: str) -> bool:
    """An http(s) URL, or `org/name[@revision]` that is no local path."""
    if is_url(location):
        return True
    repo_id, _, _ = location.partition("@")
    return bool(_REPO_ID.fullmatch(repo_id)) and not Path(location).exists()


def is_url(location: str) -> bool:
    return bool(_URL.match(location))


def parse_location(location: str) -> HubLocation:
    """`org/name[@rev]`, or a URL `https://host/org/name[/tree/REV]` whose host is the endpoint."""
    if not is_url(location):
        repo_id, _, revision = location.partition("@")
        return HubLocation(None, repo_id, revision or None)
    url = urllib.parse.urlsplit(location)
    parts = [urllib.parse.unquote(part) for part in url.path.split("/") if part]
    if len(parts) >= 4 and parts[2] in _REVISION_MARKERS:
        revision = parts[3]
    elif len(parts) == 2:
        revision = None
    else:
        raise CheckpointError(f"{location}: not a repository URL (https://HOST/ORG/NAME[/tree/REVISION])")
    repo_id, _, at = "/".join(parts[:2]).partition("@")
    if not _REPO_ID.fullmatch(repo_id):
        raise CheckpointError(f"{location}: {repo_id!r} is not a repository id (ORG/NAME)")
    return HubLocation(f"{url.scheme}://{url.netloc}", repo_id, revision or at or None)


def _import_hub() -> types.SimpleNamespace:
    """The parts of huggingface_hub used here; a one-line CheckpointError where it is missing or older
    than what they need (http_stream_backoff came with 1.0)."""
    try:
        hub = importlib.import_module("huggingface_hub")
        parts = {name: importlib.import_module(f"huggingface_hub.{name}") for name in ("constants", "errors")}
        utils = importlib.import_module("huggingface_hub.utils")
        return types.SimpleNamespace(
            HfApi=hub.HfApi,
            hf_hub_url=hub.hf_hub_url,
            build_hf_headers=utils.build_hf_headers,
            get_session=utils.get_session,
            hf_raise_for_status=utils.hf_raise_for_status,
            http_stream_backoff=utils.http_stream_backoff,
            **parts,
        )
    except (ImportError, AttributeError):
        needs = f"huggingface_hub {MIN_HUB_VERSION} or newer reads a checkpoint on the Hub: {INSTALL_HINT}"
        raise NotOnHub(needs) from None


class HubFiles(CheckpointFiles):
    """The files of one commit of a Hub repository: the revision is resolved once, so every read is
    of the same commit. Only bytes asked for are fetched; `bytes_fetched` counts them."""

    every_header = False

    def __init__(self, location: str):
        self.hub = _import_hub()
        # Its retries log warnings with tracebacks' words; what failed after them is said here, in one line.
        logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
        self.location = parse_location(location)
        self.name = self.location.name
        self.endpoint = (self.location.endpoint or self.hub.constants.ENDPOINT).rstrip("/")
        # A token goes only to the Hub huggingface_hub is configured for, never to another URL's host.
        self.token = None if self._is_configured_endpoint() else False
        self.transport_error = _transport_error(self.hub)
        self.bytes_fetched = 0
        self._raw_headers: dict[str, bytes] = {}
        api = self.hub.HfApi(endpoint=self.endpoint, token=self.token)
        info = self._call(
            self.name,
            lambda: api.model_info(
                self.location.repo_id, revision=self.location.revision, files_metadata=True, timeout=_TIMEOUT
            ),
        )
        self.commit = info.sha
        self.sizes = {sibling.rfilename: sibling.size for sibling in info.siblings or ()}
        if not self.commit:
            raise CheckpointError(f"{self.name}: the Hub named no commit for this revision")

    def _is_configured_endpoint(self) -> bool:
        return self.location.endpoint is None or _origin(self.endpoint) in {
            _origin(self.hub.constants.ENDPOINT),
            _origin("https://huggingface.co"),
        }

    # --- CheckpointFiles ------------------------------------------------------------------------------

    def path(self, file: str) -> str:
        return f"{self.name}/{file}"

    def exists(self, file: str) -> bool:
        return file in self.sizes

    def safetensors_files(self) -> list[str]:
        # vLLM loads the repository's top-level *.safetensors, as in a local directory
        return sorted(file for file in self.sizes if file.endswith(".safetensors") and "/" not in file)

    def file_size(self, file: str) -> int:
        size = self.sizes.get(file)
        if type(size) is not int:
            raise CheckpointError(f"{self.path(file)}: the Hub gave no size for it")
        return size

    def read_bytes(self, file: str, what: str) -> bytes:
        limit = MAX_INDEX_BYTES
        size = self.file_size(file)
        if size > limit:
            raise CheckpointError(f"{self.path(file)}: {size} bytes, over the {limit} a {what} may have")
        return self.read_range(file, 0, size) if size else b""

    def read_header(self, file: str) -> Header:
        """The 8-byte length, then the header: two range requests. The length is checked against the
        file's size and the limit before the header is asked for."""
        size, where = self.file_size(file), self.path(file)
        length = int.from_bytes(self.read_range(file, 0, 8), "little") if size >= 8 else 0
        check_header_length(where, length, size)
        raw = self.read_range(file, 8, 8 + length)
        header = parse_header(where, raw, size)
        self._raw_headers[file] = raw
        return header

    def data_spans(self, file: str) -> dict[str, tuple[int, int]]:
        raw = self._raw_headers.get(file)
        if raw is None:
            raise CheckpointError(f"{self.path(file)}: its header was not read")
        return spans_of(json.loads(raw), 8 + len(raw))

    def read_range(self, file: str, begin: int, end: int) -> bytes:
        """Bytes [begin, end) of a file of the resolved commit. A server that answers a range request
        with the whole file is refused before its body is read; a connection dropped mid-body is read
        again, and after _ATTEMPTS the file is named."""
        url = self.hub.hf_hub_url(self.location.repo_id, file, revision=self.commit, endpoint=self.endpoint)
        headers = {**self.hub.build_hf_headers(token=self.token), "Range": f"bytes={begin}-{end - 1}"}
        where, failure = self.path(file), ""
        for _ in range(_ATTEMPTS):
            try:
                data = self._call(where, lambda: self._get_range(url, headers, where, begin, end))
            except _Incomplete as error:
                failure = str(error)
                continue
            self.bytes_fetched += len(data)
            return data
        raise CheckpointError(f"{where}: bytes {begin}-{end - 1} could not be read ({failure})")

    def surveyed(self, searched: str) -> str:
        """The series surveys a Hub repository from its header metadata, naming the repository."""
        return self.name

    # --- HTTP through huggingface_hub -------------------------------------------------------------------

    def _get_range(self, url: str, headers: dict, where: str, begin: int, end: int) -> bytes:
        wanted = end - begin
        with self.hub.http_stream_backoff(
            "GET", url, headers=headers, timeout=_TIMEOUT, max_retries=_RETRIES
        ) as response:
            if response.status_code >= 400:
                response.read()  # an error's words are in its (small) body
                self.hub.hf_raise_for_status(response)
            if response.status_code != 206:
                raise CheckpointError(
                    f"{where}: the server answered a range request with HTTP {response.status_code}, "
                    "not 206 Partial Content: refusing to download the whole file"
                )
            expected = f"bytes {begin}-{end - 1}/"
            content_range = response.headers.get("Content-Range", "")
            if not content_range.startswith(expected):
                sent = f"the server sent {content_range!r}"
                raise CheckpointError(f"{where}: asked for {expected[:-1]}, {sent}")
            data = bytearray()
            try:
                for piece in response.iter_bytes():
                    data += piece
                    if len(data) > wanted:
                        more = f"the server sent more than the {wanted} bytes asked for"
                        raise CheckpointError(f"{where}: {more}")
            except self.transport_error as error:
                cut = f"{len(data)} of {wanted} bytes, then {error or type(error).__name__}"
                raise _Incomplete(cut) from None
        if len(data) != wanted:
            raise _Incomplete(f"{len(data)} of {wanted} bytes")
        return bytes(data)

    def _call(self, where: str, request):
        """Run a huggingface_hub request; its errors become one-line CheckpointErrors saying what to do."""
        errors = self.hub.errors
        try:
            return request()
        except errors.GatedRepoError:
            raise CheckpointError(
                f"{where}: {self.location.repo_id} is a gated repository: accept its terms on its page "
                f"({self.endpoint}/{self.location.repo_id}), then {_TOKEN_HINT}"
            ) from None
        except errors.RepositoryNotFoundError:
            raise NotOnHub(
                f"{where}: no repository {self.location.repo_id} on {self.endpoint} (or a private one: "
                f"{_TOKEN_HINT})"
            ) from None
        except errors.RevisionNotFoundError:
            if getattr(self, "commit", None):  # every file is read at the commit first resolved
                raise CheckpointError(
                    f"{where}: commit {self.commit} is no longer served (the revision moved while it was "
                    "read): run again to read the new one"
                ) from None
            raise CheckpointError(
                f"{where}: {self.location.repo_id} has no revision {self.location.revision!r}"
            ) from None
        except errors.RemoteEntryNotFoundError:
            at = f"{self.location.repo_id} at commit {self.commit}"
            raise CheckpointError(f"{where}: not in {at}") from None
        except errors.OfflineModeIsEnabled:
            offline = "HF_HUB_OFFLINE is set, and the checkpoint is on the Hub"
            raise CheckpointError(f"{where}: {offline}") from None
        except errors.HfHubHTTPError as error:
            status = error.response.status_code if error.response is not None else None
            if status in (401, 403):
                raise CheckpointError(
                    f"{where}: access denied (HTTP {status}): if the repository is gated, accept its "
                    f"terms on its page; {_TOKEN_HINT}"
                ) from None
            tries = f" ({_RETRIES + 1} tries)" if status in _RETRIED_STATUSES else ""
            raise CheckpointError(f"{where}: HTTP {status} from {self.endpoint}{tries}") from None
        except self.transport_error as error:
            raise NotOnHub(f"{where}: {self._transport_failure(error)}") from None

    def _transport_failure(self, error: Exception) -> str:
        """What went wrong on the way to the server, after huggingface_hub's retries."""
        library = importlib.import_module(type(error).__module__.partition(".")[0])
        if isinstance(error, getattr(library, "TimeoutException", ())):
            return (
                f"no answer from {self.endpoint} within {_TIMEOUT:g} s (set MTPQ_HUB_TIMEOUT for a slow link)"
            )
        if isinstance(error, getattr(library, "TooManyRedirects", ())):
            return f"{self.endpoint} redirects in a loop ({error})"
        return f"cannot reach {self.endpoint} ({error or type(error).__name__})"


class NotOnHub(CheckpointError):
    """The name could not be read as a Hub repository: no huggingface_hub, no such repository, or no
    answer from the Hub."""


class _Incomplete(CheckpointError):
    """A read that may succeed when tried again: a dropped connection, a short body."""


def _transport_error(hub) -> type[Exception]:
    """The HTTP library's base error (httpx's, or what the installed huggingface_hub uses instead)."""
    library = type(hub.get_session()).__module__.partition(".")[0]
    return importlib.import_module(library).HTTPError


def _origin(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()
