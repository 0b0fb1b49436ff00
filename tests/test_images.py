"""Build the mtpq images with buildah and run their self-check, without a docker engine.

vllm/vllm-openai cannot be pulled here, so docker/build.sh builds each image on a local
stand-in for it (tests/images/build-standin.sh: Debian, Python and the pristine vLLM sources
where vllm-openai has them, with its entrypoint), cached in buildah storage under the mtpq
cache. That proves the `mtpq` stage of all three images: the series goes in, the self-check
passes, names the series and fails once a patched file changes, the labels are right and the
entrypoint is left alone; a base the series cannot patch, or a build that bypasses build.sh,
fails and leaves nothing. sm121's `mtpq` stage runs on a copy of the stand-in whose vLLM
files already carry the series, as the mtpq wheel installs them. Not proven here: anything of
the real base images, and the sm121 runtime stage (CUDA 13, torch and the aarch64 wheel on
linux/arm64, which this amd64 machine can neither pull nor run).

Part of the default run (.ci/run installs the tools). Needs root, buildah, debootstrap and git
(apt-get install buildah debootstrap git); without them these tests fail, they do not skip.
Leave them out with: python3 tests/run.py -m "not images"
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mtpq.download import cache_root, fetch
from mtpq.installed import MISSING
from mtpq.status import ALREADY_APPLIED, CONFLICT

pytestmark = pytest.mark.images

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "docker" / "build.sh"
STANDIN_SCRIPT = Path(__file__).resolve().parent / "images" / "build-standin.sh"
STANDIN_KEY_LABEL = "mtpq.standin-key"
IMAGE_REPO = "localhost/mtpq-test"
REFUSED_REPO = "localhost/mtpq-test-refused"
CUDA_ARCHES = {"sm89": "sm_89", "sm90": "sm_90", "sm121": "sm_121"}
FALLBACK_DEBIAN_MIRROR = "http://deb.debian.org/debian"
_APT_DEBIAN_URI = re.compile(r"^(?:deb(?:\s+\[[^\]]*\])?|URIs:)\s+(\S+/debian)/?(?:\s|$)", re.MULTILINE)
_FIND_VLLM = "import importlib.util as u; print(u.find_spec('vllm').submodule_search_locations[0])"


def run(
    command: list[str], env: dict[str, str] | None = None, *, ok: bool = True, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    if ok and result.returncode != 0:
        pytest.fail(
            f"{shlex.join(command)} exited {result.returncode}\n"
            f"--- stdout (end) ---\n{result.stdout[-6000:]}\n--- stderr (end) ---\n{result.stderr[-6000:]}"
        )
    return result


def host_debian_mirror() -> str:
    """The Debian archive this host's apt uses: debootstrap can reach what apt reaches."""
    apt = Path("/etc/apt")
    for path in [
        apt / "sources.list",
        *sorted(apt.glob("sources.list.d/*.list")),
        *sorted(apt.glob("sources.list.d/*.sources")),
    ]:
        if path.is_file() and (match := _APT_DEBIAN_URI.search(path.read_text())):
            return match.group(1)
    return FALLBACK_DEBIAN_MIRROR


def package_files(series) -> list[str]:
    """The series' files inside the vllm package, relative to site-packages."""
    return [path for path in series.files if path.startswith("vllm/")]


def image_config(env: dict[str, str], ref: str) -> dict:
    return json.loads(run(["buildah", "inspect", "--type", "image", ref], env).stdout)["OCIv1"]["config"]


@contextmanager
def working_container(env: dict[str, str], image: str) -> Iterator[str]:
    name = run(["buildah", "from", image], env).stdout.strip()
    try:
        yield name
    finally:
        run(["buildah", "rm", name], env)


def vllm_package(env: dict[str, str], container: str) -> Path:
    """Host path of the container's installed vllm package (vfs mounts are plain directories)."""
    rootfs = Path(run(["buildah", "mount", container], env).stdout.strip())
    package = run(["buildah", "run", container, "--", "python3", "-c", _FIND_VLLM], env).stdout.strip()
    return rootfs / package.lstrip("/")


@pytest.fixture(scope="session")
def buildah_env() -> Iterator[dict[str, str]]:
    """Environment for buildah: storage of its own under the mtpq cache, vfs and chroot."""
    # A failure, not a skip: a green run must mean the images were built (.ci/run installs these).
    missing = [tool for tool in ("buildah", "debootstrap", "git") if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"the image build test needs {', '.join(missing)}: as root, apt-get install -y "
            f"--no-install-recommends {' '.join(missing)}; or deselect it with -m 'not images'"
        )
    if os.geteuid() != 0:
        pytest.fail(
            "the image build test needs root (debootstrap, buildah's chroot isolation); "
            "or deselect it with -m 'not images'"
        )
    root = cache_root() / "images"
    root.mkdir(parents=True, exist_ok=True)
    storage_conf = root / "storage.conf"
    # vfs and chroot need no overlayfs, fuse or user namespaces, so this runs inside containers.
    storage_conf.write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{root / "storage"}"\nrunroot = "{root / "run"}"\n'
    )
    env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(storage_conf), "BUILDAH_ISOLATION": "chroot"}
    with (root / "lock").open("w") as lock:
        # One test session at a time owns the storage, so it may clear what an interrupted one left.
        fcntl.flock(lock, fcntl.LOCK_EX)
        run(["buildah", "rm", "--all"], env)
        run(["buildah", "rmi", "--prune"], env)
        yield env


@pytest.fixture(scope="session")
def standin_base(buildah_env: dict[str, str], pin) -> str:
    """The stand-in for vllm/vllm-openai, rebuilt only when its recipe or inputs change."""
    mirror = host_debian_mirror()
    inputs = b"\0".join(
        [STANDIN_SCRIPT.read_bytes(), mirror.encode(), pin.artifacts["sdist"].sha256.encode()]
    )
    key = hashlib.sha256(inputs).hexdigest()[:16]
    ref = f"localhost/mtpq-standin-base:{pin.tag}"
    existing = run(["buildah", "inspect", "--type", "image", ref], buildah_env, ok=False)
    if existing.returncode == 0:
        if json.loads(existing.stdout)["OCIv1"]["config"]["Labels"].get(STANDIN_KEY_LABEL) == key:
            return ref
        run(["buildah", "rmi", "--force", ref], buildah_env)
    sdist = fetch(pin.artifacts["sdist"])
    run([str(STANDIN_SCRIPT), ref, f"{STANDIN_KEY_LABEL}={key}", str(sdist), mirror], buildah_env)
    return ref


@contextmanager
def variant_of(env: dict[str, str], base: str, suffix: str, change: Callable[[Path], None]) -> Iterator[str]:
    """`base` committed as `<base>-<suffix>` after `change(site-packages)`; removed afterwards."""
    ref = f"{base}-{suffix}"
    with working_container(env, base) as name:
        change(vllm_package(env, name).parent)
        run(["buildah", "commit", "--quiet", name, ref], env)
    try:
        yield ref
    finally:
        run(["buildah", "rmi", ref], env)


@pytest.fixture(scope="session")
def prepatched_base(
    buildah_env: dict[str, str], standin_base: str, series, expected_tree: Path
) -> Iterator[str]:
    """The stand-in with vLLM as the mtpq wheel installs it for sm121: the series already in."""

    def install_patched_files(site: Path) -> None:
        for relative in package_files(series):
            if (expected_tree / relative).exists():
                shutil.copyfile(expected_tree / relative, site / relative)
            else:
                (site / relative).unlink(missing_ok=True)

    with variant_of(buildah_env, standin_base, "prepatched", install_patched_files) as ref:
        yield ref


def image_ids(env: dict[str, str], repo: str) -> list[str]:
    return run(["buildah", "images", "--quiet", "--filter", f"reference={repo}"], env).stdout.split()


def build_sh(repo: str, base: str, *names: str) -> list[str]:
    """docker/build.sh building `names` with buildah on the stand-in `base`."""
    return [str(BUILD_SCRIPT), "--builder", "buildah", "--repo", repo, "--base-image", base, *names]


def working_containers(env: dict[str, str]) -> list[str]:
    return sorted(run(["buildah", "containers", "--quiet"], env).stdout.split())


def remove_images(env: dict[str, str], repo: str) -> None:
    """Drop every image of `repo` (build.sh gives each two tags); the stand-ins stay."""
    built = image_ids(env, repo)
    if built:
        run(["buildah", "rmi", "--force", *built], env)


@pytest.fixture(scope="session")
def images(
    buildah_env: dict[str, str], standin_base: str, prepatched_base: str, pin, series
) -> Iterator[dict[str, str]]:
    """name -> tag of the three images, built by docker/build.sh on the stand-ins."""
    tags = {name: f"{IMAGE_REPO}:{pin.tag}-{series.series_id}-{name}" for name in CUDA_ARCHES}
    remove_images(buildah_env, IMAGE_REPO)
    for base, names in ((standin_base, ["sm89", "sm90"]), (prepatched_base, ["sm121"])):
        printed = run(build_sh(IMAGE_REPO, base, *names), buildah_env).stdout.splitlines()
        assert printed[-len(names) :] == [tags[name] for name in names], "build.sh prints the tags it built"
    yield tags
    remove_images(buildah_env, IMAGE_REPO)


@pytest.fixture(scope="session", params=list(CUDA_ARCHES))
def image_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def container(buildah_env: dict[str, str], images: dict[str, str], image_name: str) -> Iterator[str]:
    """A container of the image, shared by the tests that only read it (vfs copies are slow)."""
    with working_container(buildah_env, images[image_name]) as name:
        yield name


@pytest.fixture
def scratch_container(buildah_env: dict[str, str], images: dict[str, str]) -> Iterator[str]:
    """A container of the sm89 image that the test may change."""
    with working_container(buildah_env, images["sm89"]) as name:
        yield name


@pytest.fixture(scope="session")
def patched_files(series) -> list[str]:
    """The files the series changes, for the tests that need at least one."""
    if not package_files(series):
        pytest.skip("patches/series changes no file of the vllm package")
    return package_files(series)


@pytest.fixture(scope="session")
def expected_tree(tmp_path_factory: pytest.TempPathFactory, pin, series) -> Path:
    """The patched files as plain `git apply` makes them from the pristine sdist, without mtpq's code."""
    tree = tmp_path_factory.mktemp("expected")
    with tarfile.open(fetch(pin.artifacts["sdist"])) as sdist:
        for relative in package_files(series):
            try:
                member = sdist.extractfile(f"vllm-{pin.version}/{relative}")
            except KeyError:
                continue  # a file the series creates
            (tree / relative).parent.mkdir(parents=True, exist_ok=True)
            (tree / relative).write_bytes(member.read())
    for patch in series.patches:
        run(["git", "apply", "--include=vllm/*", str(patch.path)], cwd=tree)
    return tree


def test_selfcheck_passes_and_names_the_series(buildah_env: dict[str, str], container: str, series) -> None:
    selfcheck = run(["buildah", "run", container, "--", "mtpq-selfcheck"], buildah_env)
    assert f"mtpq series {series.series_id} " in selfcheck.stdout
    for patch in series.patches:
        assert re.search(rf"^\s*{re.escape(patch.name)}\s+{ALREADY_APPLIED}$", selfcheck.stdout, re.MULTILINE)


def test_labels_name_arch_vllm_and_series(
    buildah_env: dict[str, str], images: dict[str, str], image_name: str, pin, series
) -> None:
    labels = image_config(buildah_env, images[image_name])["Labels"]
    assert labels["mtpq.cuda-arch"] == CUDA_ARCHES[image_name]
    assert labels["mtpq.vllm-version"] == pin.version
    assert labels["mtpq.series-id"] == series.series_id
    assert labels["org.opencontainers.image.version"] == f"{pin.version}+mtpq.{series.series_id}"


def test_entrypoint_stays_the_base_images(
    buildah_env: dict[str, str], standin_base: str, images: dict[str, str], image_name: str
) -> None:
    def launch(ref: str) -> tuple:
        config = image_config(buildah_env, ref)
        return config.get("Entrypoint"), config.get("Cmd"), config.get("WorkingDir")

    assert launch(images[image_name]) == launch(standin_base)


def test_image_files_match_the_series_applied_to_pristine_vllm(
    buildah_env: dict[str, str], container: str, expected_tree: Path, patched_files: list[str]
) -> None:
    site = vllm_package(buildah_env, container).parent
    for relative in patched_files:
        expected = expected_tree / relative
        assert (site / relative).exists() == expected.exists(), relative
        if expected.exists():
            assert (site / relative).read_bytes() == expected.read_bytes(), relative


def test_selfcheck_fails_once_a_patched_file_changes(
    buildah_env: dict[str, str], scratch_container: str, patched_files: list[str]
) -> None:
    site = vllm_package(buildah_env, scratch_container).parent
    with (site / patched_files[0]).open("a") as patched:
        patched.write("# changed after patching\n")
    selfcheck = run(["buildah", "run", scratch_container, "--", "mtpq-selfcheck"], buildah_env, ok=False)
    assert selfcheck.returncode != 0
    assert MISSING in selfcheck.stdout


@pytest.fixture
def refused_build(buildah_env: dict[str, str]) -> Iterator[Callable[[list[str], str], None]]:
    """Run a build that must fail naming `message`, and leave no image or working container."""

    def check(command: list[str], message: str) -> None:
        containers_before = working_containers(buildah_env)
        done = run(command, buildah_env, ok=False)
        output = done.stdout + done.stderr
        assert done.returncode != 0 and message in output, output[-6000:]
        assert working_containers(buildah_env) == containers_before, "the failed build left a container"
        assert not image_ids(buildah_env, REFUSED_REPO), "the failed build left an image"

    yield check
    remove_images(buildah_env, REFUSED_REPO)


def other_vllm_release(site: Path, pin, patched_files: list[str]) -> None:
    version_file = site / "vllm" / "_version.py"
    version_file.write_text(version_file.read_text().replace(f"'{pin.version}'", "'0.0.1'"))


def foreign_patched_file(site: Path, pin, patched_files: list[str]) -> None:
    (site / patched_files[0]).write_text("# not the file the series was made on\n")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (other_vllm_release, "this series targets vLLM {version}, but"),
        (foreign_patched_file, f"{CONFLICT}: "),
    ],
    ids=["other-vllm-version", "series-does-not-apply"],
)
def test_a_base_the_series_cannot_patch_fails_the_build(
    buildah_env: dict[str, str],
    standin_base: str,
    refused_build,
    pin,
    patched_files: list[str],
    damage,
    message,
) -> None:
    change = functools.partial(damage, pin=pin, patched_files=patched_files)
    with variant_of(buildah_env, standin_base, "unpatchable", change) as base:
        refused_build(build_sh(REFUSED_REPO, base, "sm89"), message.format(version=pin.version))


def test_a_build_that_bypasses_build_sh_is_refused_rather_than_mislabelled(
    standin_base: str, refused_build
) -> None:
    dockerfile = REPO_ROOT / "docker" / "Dockerfile"
    build = ["buildah", "bud", "--file", str(dockerfile), "--target", "mtpq", "--tag", f"{REFUSED_REPO}:x"]
    refused_build(
        [*build, "--build-arg", f"BASE_IMAGE={standin_base}", str(REPO_ROOT)], "build with docker/build.sh"
    )
