"""The GPU kit: vLLM 0.22.1's CUDA wheel patched with the series and the dependency wheels a run on an
air-gapped H100/H200 host needs beside what the host has, in parts the device tool can carry.

    python3 -m benchmarks.gpu_kit build          # here: .gpukit/ (parts, manifest.json, host-commands.json)
    python3 -m benchmarks.gpu_kit install --kit DIR --site DIR   # there: reassemble, verify, install

The device tool carries at most 64 MiB a call (the ~2 MiB working tree included), so the kit is one
payload (an uncompressed tar: the patched vLLM tree as tar.xz, the dependency wheels, the official
wheel's originals of the files the series changes) cut into parts of PART_BYTES. The host copies one
part a call into HOST_KIT; the last call installs and runs benchmarks.gpu_run.

The dependency wheels are found by trying: the payload installed into a venv that mirrors the host's
Python and packages (HOST_PACKAGES), `benchmarks.gpu_run --dry-run` run in it, and the wheel providing
each module it misses added from vLLM's resolved requirements, until the dry run passes. What trying
found is kept in LOCK (committed): a build starts from it, so one dry run confirms it, and trying adds
only what a change to the run now imports; `build --relock` finds the set again from nothing.
"""

from __future__ import annotations

import argparse
import difflib
import filecmp
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

from mtpq.core.download import cache_root, fetch, pip_environment, scratch_dir, sha256_of
from mtpq.core.errors import MtpqError
from mtpq.core.pin import Artifact, load_pins

ROOT = Path(__file__).resolve().parent.parent
VERSION = "0.22.1"
KIT = ROOT / ".gpukit"
MANIFEST = "manifest.json"
LOCK = ROOT / "benchmarks" / "gpu_kit.lock.json"
HOST_COMMANDS = "host-commands.json"
# 64 MiB a call, less the working tree and the manifest.
PART_BYTES = 60 * 2**20
HOST_KIT = "/tmp/mtpq-kit"
HOST_SITE = "/tmp/site"
# The Python the host runs (3.12.3 there), for the mirror venv; any 3.12 will do.
MIRROR_PYTHON = os.environ.get("MTPQ_HOST_PYTHON", "/root/.pyenv/versions/3.12.1/bin/python3")
# What the host has installed (its image's package list), versions where known: neither in the kit nor
# downloaded.
HOST_PACKAGES = {
    **dict.fromkeys(
        "absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi "
        "charset-normalizer click cloudpickle cuda-bindings cuda-core cuda-pathfinder cuda-toolkit "
        "cupy-cuda13x einops filelock fsspec grpcio h11 hf-xet httpcore httpx idna jinja2 markupsafe msgpack "
        "networkx ninja numba numba-cuda opencv-python-headless packaging pandas pillow pip "
        "prometheus-client protobuf psutil py-cpuinfo pyyaml regex requests rich sentencepiece setuptools "
        "sympy tiktoken tqdm typer typing-extensions urllib3 uvloop wheel xxhash yarl zipp pytest".split()
    ),
    "torch": "2.11.0",
    "torchaudio": "2.11.0",
    "torchvision": "0.26.0",
    "triton": "3.6.0",
    "transformers": "5.17.0",
    "safetensors": "0.8.0",
    "huggingface-hub": "1.33.0",
    "numpy": "2.5.2",
    "tokenizers": "0.23.2",
}
# Not in the host's package list, so taken as absent there, though the newest typer requires them:
# the mirror venv drops them after pip installs them.
HOST_ABSENT = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection")
# The CUDA 13 libraries torch pulls in (nvidia-*-cu13, nvidia-cublas, ...) are the host's too; the
# compiler pieces of cuda-toolkit's extras and the CUTLASS DSL are not among its listed packages.
HOST_NVIDIA = re.compile(r"nvidia-(?!cutlass-dsl|cudnn-frontend|ml-py|cuda-nvcc|cuda-cccl|cuda-crt|nvvm)")
# Files of the wheels (vLLM's, its dependencies') an H100/H200 run of LLM() never loads, and why.
TRIMMED = {
    "xgrammar/lib/libxgrammar.a": "the static library C++ builds link xgrammar with; Python loads "
    "xgrammar/libxgrammar_bindings.so",
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": "FlashAttention 2: on SM90 vLLM runs FA3 "
    "(vllm/v1/attention/backends/fa_utils.py: get_flash_attn_version); FA2 only for ALiBi or batch "
    "invariance, and its import is guarded (FA2_AVAILABLE)",
    "vllm/vllm-rs": "the Rust frontend binary of the OpenAI server (VLLM_RUST_FRONTEND_PATH), not LLM()'s",
    **{
        f"vllm/third_party/deep_gemm/_C.cpython-{tag}-x86_64-linux-gnu.so": "DeepGEMM for another CPython"
        for tag in ("310", "311", "313", "314")
    },
}
_PIP_DOWNLOAD_TAGS = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"]
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")
# A traceback's frame in the dry run's site: the top-level package of the module that imports.
_IMPORTER = re.compile(r'File "[^"]*/site/(\w+)[/.]')


class KitError(MtpqError, RuntimeError):
    pass


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def on_host(name: str) -> bool:
    return normalized(name) in HOST_PACKAGES or bool(HOST_NVIDIA.match(normalized(name)))


# --- build (this machine) ------------------------------------------------------------------------


def _run(command: list, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(list(map(str, command)), capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise KitError(
            f"{Path(str(command[0])).name} {' '.join(map(str, command[1:4]))} ... failed: "
            f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}"
        )
    return done


def kit_cache(*parts: str) -> Path:
    """The kit's folder of the mtpq cache (made on first use): what building it downloads or derives."""
    folder = cache_root().joinpath("gpukit", *parts)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def compressed_tree(tree: Path, patched: Path) -> Path:
    """The trimmed tree as tar.xz, cached by the patched wheel's bytes (apply.py --wheel makes the same
    bytes from the same series) and the trims."""
    trims = sorted(name for name in TRIMMED if name.startswith("vllm/"))
    key = hashlib.sha256(f"{sha256_of(patched)} {trims}".encode()).hexdigest()[:12]
    compressed = kit_cache() / f"vllm-{VERSION}-{key}.tar.xz"
    if not compressed.exists():
        print("compressing the trimmed vLLM tree (xz, a few minutes on 2 cores)", flush=True)
        part = compressed.with_suffix(".part")
        with part.open("wb") as out:
            tar = subprocess.Popen(["tar", "-C", tree, "-cf", "-", "."], stdout=subprocess.PIPE)
            subprocess.run(["xz", "-T2", "-6"], stdin=tar.stdout, stdout=out, check=True)
            if tar.wait() != 0:
                raise KitError("tar of the vLLM tree failed")
        part.replace(compressed)
    return compressed


def series_id() -> str:
    return _run([sys.executable, ROOT / "apply.py", "--series-id", "--vllm", VERSION]).stdout.split()[-1]


def resolved_requirements(official: Path, constrained: bool = True) -> list[dict]:
    """pip's resolution of the official wheel's requirements for CPython 3.12 on this platform: each
    dist's name, version, file and sha256 (the pool the kit's wheels come from). Constrained to LOCK's
    versions, so that a newer release of a locked dependency on PyPI leaves the kit as it is, unless
    the set is being found again. Cached."""
    locked = json.loads(LOCK.read_text()) if constrained and LOCK.exists() else []
    constraints = "".join(f"{item['name']}=={item['version']}\n" for item in locked)
    key = hashlib.sha256(f"{sha256_of(official)}\0{constraints}".encode()).hexdigest()[:12]
    report = kit_cache() / f"resolution-{key}.json"
    if not report.exists():
        with scratch_dir("gpukit-resolve") as scratch:
            venv = scratch / "venv"
            _run([host_python(), "-m", "venv", venv])
            (scratch / "constraints.txt").write_text(constraints)
            _run(
                [
                    venv / "bin" / "pip",
                    "install",
                    "-qq",
                    "--dry-run",
                    "--ignore-installed",
                    "--report",
                    scratch / "report.json",
                    "--constraint",
                    scratch / "constraints.txt",
                    official,
                ],
                env=pip_environment(),
            )
            (scratch / "report.json").replace(report)
    return [
        {
            "name": normalized(item["metadata"]["name"]),
            "version": item["metadata"]["version"],
            "filename": item["download_info"]["url"].rsplit("/", 1)[-1],
            "sha256": item["download_info"]["archive_info"]["hashes"]["sha256"],
        }
        for item in json.loads(report.read_text())["install"]
        if normalized(item["metadata"]["name"]) != "vllm"
    ]


def mirror_venv(resolved: list[dict]) -> Path:
    """A venv with the host's Python and those of its packages vLLM's requirements name (at the host's
    versions where known), their own requirements resolved by pip. Cached."""
    specs = sorted(
        f"{item['name']}=={HOST_PACKAGES[item['name']]}" if HOST_PACKAGES.get(item["name"]) else item["name"]
        for item in resolved
        if on_host(item["name"])
    )
    key = hashlib.sha256("\n".join([MIRROR_PYTHON, *specs, *HOST_ABSENT]).encode()).hexdigest()[:12]
    venv = kit_cache() / f"host-venv-{key}"
    if not (venv / ".mtpq-ready").exists():
        shutil.rmtree(venv, ignore_errors=True)
        print(f"building the host's mirror venv in {venv} (once)", flush=True)
        _run([host_python(), "-m", "venv", venv])
        _run([venv / "bin" / "python", "-m", "pip", "install", "-q", *specs], env=pip_environment())
        _run([venv / "bin" / "python", "-m", "pip", "uninstall", "-q", "-y", *HOST_ABSENT])
        (mirror_site,) = venv.glob("lib/python3*/site-packages")
        link_identical_files(mirror_site, Path(sysconfig.get_paths()["purelib"]))
        (venv / ".mtpq-ready").touch()
    return venv


def link_identical_files(tree: Path, reference: Path) -> None:
    """Hard-link each large file of `tree` to its byte-identical twin at the same path under `reference`:
    the Python running the build pins the same torch as the host where it is the test bed, and then
    shares its CUDA libraries (~3 GB) with the mirror venv. Nothing is linked across filesystems."""
    for path in tree.rglob("*"):
        twin = reference / path.relative_to(tree)
        if not (path.is_file() and not path.is_symlink() and twin.is_file()):
            continue
        mine, theirs = path.stat(), twin.stat()
        if mine.st_size < 2**20 or mine.st_size != theirs.st_size or mine.st_ino == theirs.st_ino:
            continue
        if filecmp.cmp(path, twin, shallow=False):
            link = path.with_name(f"{path.name}.mtpq-link")
            try:
                os.link(twin, link)
            except OSError:
                return
            link.replace(path)


def host_python() -> str:
    """The Python 3.12 the mirror venvs are made with (the host runs 3.12)."""
    if not Path(MIRROR_PYTHON).is_file():
        raise KitError(f"no Python 3.12 at {MIRROR_PYTHON}: set MTPQ_HOST_PYTHON to one")
    return MIRROR_PYTHON


def mirror_python() -> Path:
    official = fetch(load_pins()[VERSION].artifact("wheel-x86_64"))
    return mirror_venv(resolved_requirements(official)) / "bin" / "python"


def write_stock(official: Path, patched: Path, stock: Path) -> None:
    """stock/originals/: the official wheel's bytes of each vllm/ file the series changes;
    stock/added.txt: the files it adds."""
    with zipfile.ZipFile(official) as old, zipfile.ZipFile(patched) as new:
        old_names = {name for name in old.namelist() if name.startswith("vllm/")}
        new_names = {name for name in new.namelist() if name.startswith("vllm/")}
        for name in sorted(old_names & new_names):
            if old.read(name) != new.read(name):
                (stock / "originals" / name).parent.mkdir(parents=True, exist_ok=True)
                (stock / "originals" / name).write_bytes(old.read(name))
        (stock / "added.txt").write_text("".join(f"{name}\n" for name in sorted(new_names - old_names)))


def stock_tree(site: Path, stock: Path) -> Path:
    """site's vllm/ as the official wheel has it, beside site (first on PYTHONPATH for stock runs): hard
    links to site's files, the originals (`write_stock`) in place of the changed ones, the added ones
    gone."""
    tree = site.with_name(f"{site.name}-stock")
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(site / "vllm", tree / "vllm", copy_function=os.link)
    for original in (stock / "originals").rglob("*"):
        if original.is_file():
            target = tree / original.relative_to(stock / "originals")
            target.unlink(missing_ok=True)  # a hard link to the patched file: replace, never write through
            shutil.copyfile(original, target)
    for name in (stock / "added.txt").read_text().split():
        (tree / name).unlink()
    return tree


def unpack_trimmed(wheel: Path, into: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            if info.filename in TRIMMED or info.is_dir():
                continue
            archive.extract(info, into)
            if mode := info.external_attr >> 16:  # zipfile drops the executable bits of shared objects
                os.chmod(into / info.filename, mode)


def trimmed_wheel(wheel: Path) -> Path:
    """The wheel without its TRIMMED files (and their RECORD lines), cached; the wheel itself if it has
    none."""
    with zipfile.ZipFile(wheel) as archive:
        if not TRIMMED.keys() & set(archive.namelist()):
            return wheel
        trimmed = kit_cache("trimmed") / wheel.name
        if not trimmed.exists():
            part = trimmed.with_suffix(".part")
            with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as out:
                for info in archive.infolist():
                    if info.filename in TRIMMED:
                        continue
                    data = archive.read(info)
                    if info.filename.endswith(".dist-info/RECORD"):
                        lines = data.decode().splitlines(keepends=True)
                        data = "".join(line for line in lines if line.split(",")[0] not in TRIMMED).encode()
                    out.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            part.replace(trimmed)
    return trimmed


def top_level_modules(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        names = {name.split("/")[0] for name in archive.namelist()}
    return {name.removesuffix(".py").split(".")[0] for name in names if ".dist-info" not in name}


def requirement_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        lines = archive.read(metadata).decode().splitlines()
    return {
        normalized(re.split(r"[ ;<>=!~\[(]", line.split(":", 1)[1].strip())[0])
        for line in lines
        if line.startswith("Requires-Dist:")
    }


def fetched_dependency(item: dict) -> dict:
    """A resolved dist with its wheel downloaded (sha256-verified, cached) and its trimmed wheel."""
    wheel = fetch(Artifact(item["name"], item["filename"], item["sha256"]))
    return {**item, "wheel": trimmed_wheel(wheel), "fetched": wheel}


def provider(module: str, pool: list[dict], tried: set[str], preferred: set[str]) -> dict:
    """The resolved dist whose wheel holds top-level `module`: the importer's requirements (`preferred`)
    first, then candidates by name likeness, each downloaded (sha256-verified, cached) and looked into."""
    ranked = sorted(
        (item for item in pool if item["name"] not in tried),
        key=lambda item: (
            item["name"] not in preferred,
            -difflib.SequenceMatcher(None, normalized(module), item["name"]).ratio(),
        ),
    )
    for item in ranked[: len(preferred) + 8]:
        found = fetched_dependency(item)
        if module in top_level_modules(found["fetched"]):
            return found
    raise KitError(f"no requirement of vLLM {VERSION} provides the module {module!r} the dry run misses")


def install_wheels(python: Path, wheels: list[Path], site: Path) -> None:
    """As the host installs them (the device README's --target install)."""
    if wheels:
        _run(
            [
                python,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--no-cache-dir",
                "--upgrade",
                "--target",
                site,
                *wheels,
            ]
        )


def dry_run(python: Path, site: Path, scratch: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, [site, ROOT]))}
    command = [python, "-m", "benchmarks.gpu_run", "--dry-run", "--site", site, "--out", scratch / "dry-run"]
    return subprocess.run(list(map(str, command)), capture_output=True, text=True, env=env, cwd=ROOT)


def dependencies_by_trying(
    vllm_tree: Path, stock: Path, python: Path, pool: list[dict], scratch: Path, start: list[dict]
) -> list[dict]:
    """Install the trimmed vLLM tree (and the stock one beside it) and the `start` dists, dry-run, add
    the dist of each missing module, until it passes."""
    site = scratch / "site"
    shutil.copytree(vllm_tree, site, copy_function=os.link)
    stock_tree(site, stock)
    chosen = [fetched_dependency(item) for item in start]
    install_wheels(python, [item["wheel"] for item in chosen], site)
    while True:
        done = dry_run(python, site, scratch)
        missing = _MISSING_MODULE.findall(done.stdout + done.stderr)
        if done.returncode == 0:
            return chosen
        if not missing:
            tail = (done.stdout + done.stderr).strip().splitlines()[-20:]
            raise KitError("the dry run failed, not on a missing module:\n" + "\n".join(tail))
        module = missing[-1].split(".")[0]
        importer = _IMPORTER.findall(done.stdout + done.stderr)[-1:]
        wheels = [
            item["wheel"] for item in chosen if importer and importer[0] in top_level_modules(item["wheel"])
        ]
        preferred = requirement_names(wheels[0]) if wheels else set()
        found = provider(module, pool, {item["name"] for item in chosen}, preferred)
        print(f"  the dry run misses {module!r}: adding {found['filename']}", flush=True)
        chosen.append(found)
        install_wheels(python, [found["wheel"]], site)


def write_payload(payload: Path, vllm_xz: Path, wheels: list[Path], stock: Path) -> None:
    with tarfile.open(payload, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(vllm_xz, "vllm.tar.xz")
        for wheel in wheels:
            tar.add(wheel, f"wheels/{wheel.name}")
        tar.add(stock, "stock")


def split(payload: Path, kit: Path) -> list[dict]:
    parts = []
    with payload.open("rb") as stream:
        while chunk := stream.read(PART_BYTES):
            name = f"part-{len(parts) + 1:02d}"
            (kit / name).write_bytes(chunk)
            parts.append({"name": name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    return parts


def parts_needed(size: int) -> int:
    return -(-size // PART_BYTES)


def host_commands(parts: list[dict]) -> list[dict]:
    """The device tool's calls, in order: each copies its part into the kit directory; the last also
    installs the kit and runs benchmarks.gpu_run, writing to $OUT. MTPQ_KIT and MTPQ_SITE, unset on the
    host, move both for the dry run (tests/test_gpu_kit.py runs these very commands)."""
    kit, site = f"${{MTPQ_KIT:-{HOST_KIT}}}", f"${{MTPQ_SITE:-{HOST_SITE}}}"
    calls = []
    for index, part in enumerate(parts, start=1):
        command = f'mkdir -p "{kit}" && cp .gpukit/{part["name"]} "{kit}/"'
        carry = [f".gpukit/{part['name']}"]
        if index == len(parts):
            carry.append(f".gpukit/{MANIFEST}")
            command = (
                f'set -o pipefail; {command} && cp .gpukit/{MANIFEST} "{kit}/" && '
                "export PYTHONUNBUFFERED=1 && "
                f'python3 -m benchmarks.gpu_kit install --kit "{kit}" --site "{site}" 2>&1 '
                '| tee "$OUT/install.log" && '
                f'PYTHONPATH="{site}" python3 -m benchmarks.gpu_run --site "{site}" --out "$OUT" 2>&1 '
                '| tee "$OUT/run.log"'
            )
        calls.append({"command": command, "carry": carry, "timeout_s": 600 if index == len(parts) else 120})
    return calls


def inputs_key() -> str:
    """What the kit is made from: the series, the trims, the host's packages and the lock (`build`
    remakes it whatever the key, after a change to what the run imports)."""
    digest = hashlib.sha256(series_id().encode())
    digest.update(json.dumps([TRIMMED, HOST_PACKAGES, HOST_ABSENT, HOST_NVIDIA.pattern, PART_BYTES]).encode())
    digest.update(LOCK.read_bytes() if LOCK.exists() else b"")
    return digest.hexdigest()[:16]


def locked_dependencies(pool: list[dict]) -> list[dict]:
    """LOCK's dists, as the pool resolves them now (a dist vLLM no longer requires drops out)."""
    locked = {item["filename"] for item in json.loads(LOCK.read_text())} if LOCK.exists() else set()
    return [item for item in pool if item["filename"] in locked]


def write_lock(dependencies: list[dict]) -> bool:
    """LOCK holding `dependencies` (name, version, file, sha256; by name); True where that changed it."""
    fields = ("name", "version", "filename", "sha256")
    entries = sorted(
        ({key: item[key] for key in fields} for item in dependencies), key=lambda item: item["name"]
    )
    text = json.dumps(entries, indent=2) + "\n"
    if LOCK.exists() and LOCK.read_text() == text:
        return False
    LOCK.write_text(text)
    return True


def build(kit: Path = KIT, relock: bool = False) -> dict:
    pin = load_pins()[VERSION]
    official = fetch(pin.artifact("wheel-x86_64"))
    with scratch_dir("gpukit") as scratch:
        print("patching the wheel (apply.py --wheel)", flush=True)
        _run(
            [
                sys.executable,
                ROOT / "apply.py",
                "--wheel",
                "--vllm",
                VERSION,
                "--arch",
                "x86_64",
                "--out",
                scratch / "wheel",
            ]
        )
        (patched,) = (scratch / "wheel").glob("*.whl")
        tree = scratch / "vllm"
        unpack_trimmed(patched, tree)
        vllm_xz = compressed_tree(tree, patched)
        pool = [item for item in resolved_requirements(official, not relock) if not on_host(item["name"])]
        python = mirror_python()
        stock = scratch / "stock"
        write_stock(official, patched, stock)
        start = [] if relock else locked_dependencies(pool)
        print(
            f"finding the dependency wheels by trying (dry runs in the host's mirror venv), from "
            f"{len(start)} locked in {LOCK.name}",
            flush=True,
        )
        wheels = dependencies_by_trying(tree, stock, python, pool, scratch, start)
        if write_lock(wheels):
            print(f"{LOCK.relative_to(ROOT)} now holds what trying found: commit it", flush=True)
        key = inputs_key()  # after the lock is written: ensure_kit compares against it
        payload = scratch / "payload.tar"
        write_payload(payload, vllm_xz, [item["wheel"] for item in wheels], stock)
        shutil.rmtree(kit, ignore_errors=True)
        kit.mkdir(parents=True)
        parts = split(payload, kit)
        dependency_bytes = sum(item["wheel"].stat().st_size for item in wheels)
        untrimmed_bytes = patched.stat().st_size + sum(item["fetched"].stat().st_size for item in wheels)
        manifest = {
            "inputs": key,
            "vllm": VERSION,
            "wheel": patched.name,
            "parts": parts,
            "dependencies": json.loads(LOCK.read_text()),
            "trimmed": TRIMMED,
            # Parts needed: the patched wheel and the dependency wheels as they are, against the kit's.
            "sizes": {
                "wheel_zip_bytes": patched.stat().st_size,
                "vllm_tar_xz_bytes": vllm_xz.stat().st_size,
                "dependency_bytes": dependency_bytes,
                "parts_untrimmed_zip": parts_needed(untrimmed_bytes),
                "parts": len(parts),
            },
        }
    (kit / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    (kit / HOST_COMMANDS).write_text(json.dumps(host_commands(parts), indent=2) + "\n")
    return manifest


def ensure_kit(kit: Path = KIT) -> dict:
    """The kit in `kit`, built unless it is made from what is here now."""
    manifest = kit / MANIFEST
    if manifest.exists() and json.loads(manifest.read_text()).get("inputs") == inputs_key():
        return json.loads(manifest.read_text())
    return build(kit)


# --- install (the host, and the dry run) --------------------------------------------------------


def verified_parts(kit: Path) -> list[Path]:
    """The manifest's parts in order, each present and whole; else one line naming the part."""
    manifest = json.loads((kit / MANIFEST).read_text())
    by_digest = {part["sha256"]: part["name"] for part in manifest["parts"]}
    paths = []
    for part in manifest["parts"]:
        path = kit / part["name"]
        if not path.is_file():
            raise KitError(f"{part['name']} is missing from {kit} (copy it with its host command)")
        digest = sha256_of(path)
        if digest != part["sha256"]:
            if other := by_digest.get(digest):
                raise KitError(f"{part['name']} holds {other}'s bytes: parts out of order")
            raise KitError(f"{part['name']} is damaged: sha256 {digest}, the manifest says {part['sha256']}")
        paths.append(path)
    return paths


class _Parts:
    """The parts read as one stream."""

    def __init__(self, paths: list[Path]):
        self.paths = iter(paths)
        self.current = None

    def read(self, size: int = -1) -> bytes:
        while True:
            if self.current is None:
                path = next(self.paths, None)
                if path is None:
                    return b""
                self.current = path.open("rb")
            if data := self.current.read(size):
                return data
            self.current.close()
            self.current = None


def install(kit: Path, site: Path) -> None:
    """Install the kit into `site` (for PYTHONPATH) and the stock vLLM beside it (`stock_tree`)."""
    payload = kit / "payload"
    shutil.rmtree(payload, ignore_errors=True)
    try:
        with tarfile.open(fileobj=_Parts(verified_parts(kit)), mode="r|") as tar:
            tar.extractall(payload, filter="tar")
    except tarfile.ReadError as error:  # parts whole by the manifest, but not a kit's tar stream
        raise KitError(f"the parts in {kit} are not a kit's tar stream ({error}): rebuild the kit") from None
    site.mkdir(parents=True, exist_ok=True)
    install_wheels(Path(sys.executable), sorted((payload / "wheels").glob("*.whl")), site)
    with tarfile.open(payload / "vllm.tar.xz") as tar:
        tar.extractall(site, filter="tar")
    stock = stock_tree(site, payload / "stock")
    print(f"installed into {site}; stock vLLM in {stock}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    building = sub.add_parser("build", help="make the kit (on this machine)")
    building.add_argument("--kit", type=Path, default=KIT, help=f"default: {KIT}")
    building.add_argument(
        "--relock", action="store_true", help=f"find the dependency wheels from nothing, not from {LOCK.name}"
    )
    installing = sub.add_parser("install", help="install a kit (on the host)")
    installing.add_argument("--kit", type=Path, default=Path(HOST_KIT))
    installing.add_argument("--site", type=Path, default=Path(HOST_SITE))
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            manifest = build(args.kit, args.relock)
            for call in json.loads((args.kit / HOST_COMMANDS).read_text()):
                print(json.dumps(call))
            print(json.dumps(manifest["sizes"]))
        else:
            install(args.kit, args.site)
    except MtpqError as error:
        print(f"gpu_kit: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
