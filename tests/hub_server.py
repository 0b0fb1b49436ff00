"""A local server that answers as the Hugging Face Hub does, for what huggingface_hub asks of it when
mtpq reads a remote checkpoint: `/api/models/{repo}[/revision/{rev}]` (with `?blobs=true` sizes),
`/{repo}/resolve/{rev}/{file}` (ETag and X-Repo-Commit headers; LFS files redirected with 302 to a
second server, the blob host, as the Hub redirects to its CDN), 206 range answers, and the Hub's
401/403/404 answers with their X-Error-Code. It counts the bytes of every body it serves, so tests
assert what was fetched. 127.0.0.1 only; both servers stop at the end of the test, or by themselves
after LIFETIME seconds.

Repositories are local checkpoint directories (header_checkpoints.py writes them). Faults a test can
switch on per repository: `ignore_range` (a 200 with the whole file), `drop_after` (close the
connection after that many body bytes, `drops` times), `gated`, `private` (a token is needed),
`delay` (seconds of silence before each file's answer), `server_errors` (answer that many file
requests with 503), `redirect_loop` (files redirect to themselves), `fault_file` (the faults hit that
file alone), `before_file` (called before each file request: a test moves the revision there).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

LIFETIME = 300.0  # seconds: a server a test forgot still stops
TOKEN = "hf_test_token"  # the one token private and gated repositories accept
_CHUNK = 1 << 16
_RANGE = re.compile(r"bytes=(\d+)-(\d+)$")
_LFS_SUFFIX = ".safetensors"
API = "(api)"


@dataclass
class HubRepo:
    directory: Path
    revisions: tuple[str, ...] = ("main",)
    gated: bool = False
    private: bool = False
    ignore_range: bool = False
    drop_after: int | None = None
    drops: int = 0  # how many more bodies to cut after drop_after bytes
    delay: float = 0.0
    server_errors: int = 0  # how many more file requests get a 503
    redirect_loop: bool = False
    fault_file: str | None = None  # None: the faults hit every file
    before_file: Callable[[], None] | None = None

    def faulty(self, name: str) -> bool:
        return self.fault_file in (None, name)

    @property
    def commit(self) -> str:
        listing = sorted((p.name, p.stat().st_size) for p in self.directory.iterdir() if p.is_file())
        return hashlib.sha1(repr(listing).encode()).hexdigest()

    def files(self) -> dict[str, int]:
        return {p.name: p.stat().st_size for p in sorted(self.directory.iterdir()) if p.is_file()}


@dataclass
class Served:
    """What the servers sent: body bytes of each repository file (by name) and of the API's answers
    (under API), and every request path."""

    bytes: dict[str, int] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, key: str, count: int) -> None:
        with self.lock:
            self.bytes[key] = self.bytes.get(key, 0) + count

    @property
    def total(self) -> int:
        return sum(self.bytes.values())

    def files(self) -> dict[str, int]:
        return {key: count for key, count in self.bytes.items() if key != API}


class HubServer:
    def __init__(self) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.served = Served()
        self.blobs: dict[str, tuple[Path, HubRepo]] = {}  # blob id -> file, for the blob host
        self._hub = _start(self._hub_handler())
        self._blob_host = _start(self._blob_handler())
        self.endpoint = f"http://127.0.0.1:{self._hub.server_port}"
        self.blob_endpoint = f"http://127.0.0.1:{self._blob_host.server_port}"
        self._timer = threading.Timer(LIFETIME, self.stop)
        self._timer.daemon = True
        self._timer.start()

    def add(self, repo_id: str, directory: Path, **options) -> HubRepo:
        self.repos[repo_id] = HubRepo(Path(directory), **options)
        return self.repos[repo_id]

    def stop(self) -> None:
        self._timer.cancel()
        for server in (self._hub, self._blob_host):
            server.shutdown()
            server.server_close()

    def reset_counts(self) -> None:
        self.served = Served()

    # --- the Hub -------------------------------------------------------------------------------------

    def _find(self, repo_id: str, revision: str) -> tuple[HubRepo | None, str | None]:
        """(repo, error code) for a request of repo_id at revision."""
        repo = self.repos.get(repo_id)
        if repo is None:
            return None, "RepoNotFound"
        if revision not in (*repo.revisions, repo.commit):
            return repo, "RevisionNotFound"
        return repo, None

    def _hub_handler(self):
        hub = self

        class Handler(_Handler):
            owner = hub

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                path = unquote(url.path)
                hub.served.requests.append(path)
                if api := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path):
                    return self.model_info(api[1], api[2] or "main", parse_qs(url.query))
                if resolve := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                    return self.resolve(resolve[1], resolve[2], resolve[3])
                self.fail(404, "RepoNotFound")

            def authorized(self, repo: HubRepo) -> bool:
                return self.headers.get("Authorization") == f"Bearer {TOKEN}"

            def model_info(self, repo_id: str, revision: str, query: dict) -> None:
                repo, error = hub._find(repo_id, revision)
                if repo is not None and repo.private and not self.authorized(repo):
                    error = "RepoNotFound"  # the Hub answers 401 for a private repository without a token
                if error:
                    return self.fail(401 if repo is not None and repo.private else 404, error)
                blobs = query.get("blobs") == ["true"]
                siblings = []
                for name, size in repo.files().items():
                    sibling = {"rfilename": name}
                    if blobs:
                        sibling["size"] = size
                        if name.endswith(_LFS_SUFFIX):
                            sibling["lfs"] = {"size": size, "sha256": "0" * 64, "pointerSize": 134}
                    siblings.append(sibling)
                body = json.dumps(
                    {"id": repo_id, "sha": repo.commit, "private": repo.private, "siblings": siblings}
                )
                self.send_body(200, body.encode(), "application/json")

            def resolve(self, repo_id: str, revision: str, name: str) -> None:
                repo = hub.repos.get(repo_id)
                if repo is not None and repo.before_file:
                    repo.before_file()
                if repo is not None and repo.faulty(name):
                    if repo.delay:
                        time.sleep(repo.delay)
                    if repo.server_errors:
                        repo.server_errors -= 1
                        return self.fail(503, None)
                    if repo.redirect_loop:
                        self.send_response(302)
                        self.send_header("Location", self.path)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return None
                repo, error = hub._find(repo_id, revision)
                if error:
                    return self.fail(401 if error == "RepoNotFound" else 404, error)
                if repo.private and not self.authorized(repo):
                    return self.fail(401, "RepoNotFound")
                if repo.gated and not self.authorized(repo):
                    return self.fail(403 if "Authorization" in self.headers else 401, "GatedRepo")
                file = repo.directory / name
                if "/" in name or not file.is_file():
                    return self.fail(404, "EntryNotFound")
                extra = {"ETag": f'"{hashlib.sha1(name.encode()).hexdigest()}"', "X-Repo-Commit": repo.commit}
                if name.endswith(_LFS_SUFFIX):
                    blob = hashlib.sha256(f"{repo_id}/{repo.commit}/{name}".encode()).hexdigest()
                    hub.blobs[blob] = (file, repo)
                    self.send_response(302)
                    self.send_header("Location", f"{hub.blob_endpoint}/blobs/{blob}?signed=1")
                    for key, value in extra.items():
                        self.send_header(key, value)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                return self.send_file(file, repo, extra)

        return Handler

    def _blob_handler(self):
        hub = self

        class Handler(_Handler):
            owner = hub

            def do_GET(self) -> None:
                path = urlsplit(self.path).path
                hub.served.requests.append(path)
                found = hub.blobs.get(path.rpartition("/")[2])
                if found is None:
                    return self.fail(404, None)
                file, repo = found
                return self.send_file(file, repo, {})

        return Handler


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out as separate writes; with Nagle's algorithm on, the second waits for the
    # client's delayed ACK (40 ms on Linux) on every request of a kept-alive connection.
    disable_nagle_algorithm = True
    owner: HubServer  # the server whose repositories and counts a subclass serves

    def log_message(self, *args) -> None:
        pass

    def fail(self, status: int, code: str | None) -> None:
        body = json.dumps({"error": code or "not found"}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_body(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.owner.served.add(API, len(body))

    def send_file(self, file: Path, repo: HubRepo, extra: dict[str, str]) -> None:
        size = file.stat().st_size
        wanted = _RANGE.match(self.headers.get("Range", ""))
        if wanted and not repo.ignore_range:
            begin, end = int(wanted[1]), int(wanted[2])
            if begin >= size:
                return self.fail(416, None)
            end = min(end, size - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {begin}-{end}/{size}")
        else:
            begin, end = 0, size - 1
            self.send_response(200)
        for key, value in extra.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(end - begin + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        cut = None
        if repo.drops and repo.drop_after is not None and repo.faulty(file.name):
            repo.drops -= 1
            cut = repo.drop_after
        self._stream(file, begin, end + 1, cut)

    def _stream(self, file: Path, begin: int, end: int, cut: int | None) -> None:
        sent = 0
        with open(file, "rb") as data:
            data.seek(begin)
            while begin + sent < end:
                size = min(_CHUNK, end - begin - sent)
                if cut is not None:
                    size = min(size, cut - sent)
                    if size <= 0:
                        self.close_connection = True
                        return
                try:
                    self.wfile.write(data.read(size))
                except OSError:  # the client went away (it refused a 200, say)
                    self.close_connection = True
                    return
                sent += size
                self.owner.served.add(file.name, size)


def _start(handler_class) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def repo_url(server: HubServer, repo_id: str) -> str:
    return f"{server.endpoint}/{quote(repo_id)}"
