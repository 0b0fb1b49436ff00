"""Build the mtpq images with buildah and run their self-check, without a docker engine.

The images are those of the newest release the session's series serves (`newest_pin`: v0.22.1
in the 0.22.1 session, v0.33.0 in the 0.32.0 one). Their real bases cannot be pulled here, so
docker/build.sh builds each image's `mtpq` stage on a local stand-in, cached in buildah storage
under the mtpq cache:

- sm89, sm90 (linux/amd64): a stand-in for vllm/vllm-openai (tests/images/build-standin.sh:
  Debian, Python and the pristine vLLM sources where vllm-openai has them, its entrypoint).
- sm121 (linux/arm64): a stand-in for the sm121-runtime stage (tests/images/build-arm64-debian.sh
  and build-sm121-standin.sh: Debian arm64 with the mtpq aarch64 wheel that `apply.py --wheel`
  makes, pip-installed into a venv). Its stand-in is built, and its `mtpq` stage and self-check
  run, on arm64 under qemu-user (the kernel's binfmt_misc handler for aarch64).

That proves the `mtpq` stage of all three images: the series goes in, the self-check passes,
names the series and fails once a patched file changes, the files equal the series applied to
the pristine sdist, the labels, platform and entrypoint are right; a base the series cannot patch
or would mislabel, a build that bypasses build.sh, or an unpinned release fails and leaves
nothing. Not proven here: anything of the real base images, and the sm121 runtime stage itself
(nvidia/cuda, NVIDIA's apt repository, torch and the wheel's other requirements), which this
machine cannot reach or run.

Part of the default run (.ci/run installs the tools). Needs root, buildah, debootstrap, git and
the aarch64 handler (apt-get install buildah debootstrap git qemu-user-static binfmt-support);
without them these tests fail, they do not skip. Leave them out with:
python3 tests/run.py -m "not images"
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
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from mtpq.core import installed
from mtpq.core.download import cache_root, fetch
from mtpq.core.installed import MISSING
from mtpq.core.pin import load_pins
from mtpq.core.status import ALREADY_APPLIED, CONFLICT

pytestmark = pytest.mark.images

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "docker" / "build.sh"
STANDINS = Path(__file__).resolve().parent / "images"
STANDIN_KEY_LABEL = "mtpq.standin-key"
IMAGE_REPO = "localhost/mtpq-test"
REFUSED_REPO = "localhost/mtpq-test-refused"
CUDA_ARCHES = {"sm89": "sm_89", "sm90": "sm_90", "sm121": "sm_121"}
IMAGE_CPU_ARCHES = {"sm89": "amd64", "sm90": "amd64", "sm121": "arm64"}
MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}
QEMU_AARCH64_HANDLER = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
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


def image_inspect(env: dict[str, str], ref: str) -> dict:
    return json.loads(run(["buildah", "inspect", "--type", "image", ref], env).stdout)["OCIv1"]


def image_config(env: dict[str, str], ref: str) -> dict:
    return image_inspect(env, ref)["config"]


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


def cached_image(env: dict[str, str], ref: str, recipe: list[bytes], build: Callable[[str], None]) -> str:
    """`ref`, built by `build(LABEL=KEY)` unless it exists with the key of `recipe` (script and inputs)."""
    key = hashlib.sha256(b"\0".join(recipe)).hexdigest()[:16]
    existing = run(["buildah", "inspect", "--type", "image", ref], env, ok=False)
    if existing.returncode == 0:
        if json.loads(existing.stdout)["OCIv1"]["config"]["Labels"].get(STANDIN_KEY_LABEL) == key:
            return ref
        run(["buildah", "rmi", "--force", ref], env)
    build(f"{STANDIN_KEY_LABEL}={key}")
    return ref


def standin_key(env: dict[str, str], ref: str) -> bytes:
    return image_config(env, ref)["Labels"][STANDIN_KEY_LABEL].encode()


def image_ids(env: dict[str, str], repo: str) -> list[str]:
    return run(["buildah", "images", "--quiet", "--filter", f"reference={repo}"], env).stdout.split()


def remove_images(env: dict[str, str], repo: str) -> None:
    """Drop every image of `repo` (build.sh gives each two tags); the stand-ins stay."""
    built = image_ids(env, repo)
    if built:
        run(["buildah", "rmi", "--force", *built], env)


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
        for repo in (IMAGE_REPO, REFUSED_REPO):
            remove_images(env, repo)
        run(["buildah", "rmi", "--prune"], env)
        yield env
        remove_images(env, IMAGE_REPO)


@pytest.fixture(scope="session")
def arm64_emulation() -> None:
    """The kernel runs arm64 programs through qemu-user, inside chroots too (binfmt_misc, flag F)."""
    handler = QEMU_AARCH64_HANDLER.read_text() if QEMU_AARCH64_HANDLER.exists() else ""
    flags = re.search(r"^flags: *(\S*)$", handler, re.MULTILINE)
    if not (handler.startswith("enabled") and flags and "F" in flags.group(1)):
        pytest.fail(
            "sm121's stand-in runs arm64 code under qemu-user, which needs the kernel's binfmt_misc "
            "handler for aarch64 (flag F). As root: apt-get install -y --no-install-recommends "
            "qemu-user-static binfmt-support; mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc "
            "if it is not mounted; update-binfmts --enable qemu-aarch64 (.ci/run does this). "
            "Or deselect the image tests with -m 'not images'"
        )


@pytest.fixture(scope="session")
def standin_base(buildah_env: dict[str, str], newest_pin) -> str:
    """The stand-in for vllm/vllm-openai (linux/amd64)."""
    script, mirror, sdist = STANDINS / "build-standin.sh", host_debian_mirror(), newest_pin.artifacts["sdist"]
    ref = f"localhost/mtpq-standin-base:{newest_pin.tag}"
    return cached_image(
        buildah_env,
        ref,
        [script.read_bytes(), mirror.encode(), sdist.sha256.encode()],
        lambda label: run([str(script), ref, label, str(fetch(sdist)), mirror], buildah_env),
    )


@pytest.fixture(scope="session")
def arm64_debian(buildah_env: dict[str, str], arm64_emulation) -> str:
    """Debian linux/arm64 with python3 and git, which the sm121 stand-ins of every release start from."""
    script, mirror = STANDINS / "build-arm64-debian.sh", host_debian_mirror()
    ref = "localhost/mtpq-standin-arm64-debian:bookworm"
    return cached_image(
        buildah_env,
        ref,
        [script.read_bytes(), mirror.encode()],
        lambda label: run([str(script), ref, label, mirror], buildah_env),
    )


@pytest.fixture(scope="session")
def sm121_standin(
    buildah_env: dict[str, str], arm64_debian: str, newest_pin, newest_series, tmp_path_factory
) -> str:
    """The stand-in for the sm121-runtime stage (linux/arm64): the mtpq aarch64 wheel pip-installed."""
    script = STANDINS / "build-sm121-standin.sh"
    ref = f"localhost/mtpq-standin-sm121:{newest_pin.tag}"

    def build(label: str) -> None:
        out = tmp_path_factory.mktemp("dist")
        apply = [sys.executable, str(REPO_ROOT / "apply.py"), "--wheel", "--arch", "aarch64"]
        wheel = run([*apply, "--vllm", newest_pin.version, "--out", str(out)]).stdout.splitlines()[-1]
        run([str(script), ref, label, arm64_debian, wheel], buildah_env)
        Path(wheel).unlink()  # 330 MB; the stand-in holds what the test needs

    # What decides the wheel's bytes (apply.py --wheel is reproducible): the official wheel, the
    # series and the code that packs them.
    recipe = [
        script.read_bytes(),
        standin_key(buildah_env, arm64_debian),
        newest_pin.wheel("aarch64").sha256.encode(),
        newest_series.series_id.encode(),
        (REPO_ROOT / "mtpq" / "apply" / "wheel.py").read_bytes(),
    ]
    return cached_image(buildah_env, ref, recipe, build)


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


def build_sh(repo: str, release, base: str, *names: str) -> list[str]:
    """docker/build.sh building `names` of `release` with buildah on the stand-in `base`."""
    options = ["--builder", "buildah", "--repo", repo, "--vllm", release.version, "--base-image", base]
    return [str(BUILD_SCRIPT), *options, *names]


def working_containers(env: dict[str, str]) -> list[str]:
    return sorted(run(["buildah", "containers", "--quiet"], env).stdout.split())


@dataclass(frozen=True)
class Built:
    tag: str
    base: str  # the stand-in it was built on


def build_images(env: dict[str, str], base: str, release, series, names: list[str]) -> dict[str, Built]:
    tags = {name: f"{IMAGE_REPO}:{release.tag}-{series.series_id}-{name}" for name in names}
    printed = run(build_sh(IMAGE_REPO, release, base, *names), env).stdout.splitlines()
    assert printed[-len(names) :] == [tags[name] for name in names], "build.sh prints the tags it built"
    return {name: Built(tag, base) for name, tag in tags.items()}


@pytest.fixture(scope="session")
def amd64_images(
    buildah_env: dict[str, str], standin_base: str, newest_pin, newest_series
) -> dict[str, Built]:
    return build_images(buildah_env, standin_base, newest_pin, newest_series, ["sm89", "sm90"])


@pytest.fixture(scope="session")
def arm64_images(
    buildah_env: dict[str, str], sm121_standin: str, newest_pin, newest_series
) -> dict[str, Built]:
    return build_images(buildah_env, sm121_standin, newest_pin, newest_series, ["sm121"])


@pytest.fixture(scope="session", params=list(CUDA_ARCHES))
def image_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def image(request: pytest.FixtureRequest, image_name: str) -> Built:
    """The image built by docker/build.sh on its platform's stand-in (sm121's only when asked for)."""
    built = request.getfixturevalue(f"{IMAGE_CPU_ARCHES[image_name]}_images")
    return built[image_name]


@pytest.fixture(scope="session")
def container(buildah_env: dict[str, str], image: Built) -> Iterator[str]:
    """A container of the image, shared by the tests that only read it (vfs copies are slow)."""
    with working_container(buildah_env, image.tag) as name:
        yield name


@pytest.fixture
def scratch_container(buildah_env: dict[str, str], amd64_images: dict[str, Built]) -> Iterator[str]:
    """A container of the sm89 image that the test may change."""
    with working_container(buildah_env, amd64_images["sm89"].tag) as name:
        yield name


@pytest.fixture(scope="session")
def patched_files(newest_series) -> list[str]:
    """The files the series changes, for the tests that need at least one."""
    if not installed.package_files(newest_series):
        pytest.skip("the series changes no file of the vllm package")
    return installed.package_files(newest_series)


@pytest.fixture(scope="session")
def expected_tree(tmp_path_factory: pytest.TempPathFactory, newest_pin, newest_series) -> Path:
    """The patched files as plain `git apply` makes them from the pristine sdist, without mtpq's code."""
    tree = tmp_path_factory.mktemp("expected")
    with tarfile.open(fetch(newest_pin.artifacts["sdist"])) as sdist:
        for relative in installed.package_files(newest_series):
            try:
                member = sdist.extractfile(f"vllm-{newest_pin.version}/{relative}")
            except KeyError:
                continue  # a file the series creates
            (tree / relative).parent.mkdir(parents=True, exist_ok=True)
            (tree / relative).write_bytes(member.read())
    for patch in newest_series.patches:
        run(["git", "apply", "--include=vllm/*", str(patch.path)], cwd=tree)
    return tree


def test_selfcheck_passes_and_names_the_series(
    buildah_env: dict[str, str], container: str, newest_series
) -> None:
    selfcheck = run(["buildah", "run", container, "--", "mtpq-selfcheck"], buildah_env)
    assert f"mtpq series {newest_series.series_id} " in selfcheck.stdout
    for patch in newest_series.patches:
        assert re.search(rf"^\s*{re.escape(patch.name)}\s+{ALREADY_APPLIED}$", selfcheck.stdout, re.MULTILINE)


def test_labels_name_arch_vllm_and_series(
    buildah_env: dict[str, str], image: Built, image_name: str, newest_pin, newest_series
) -> None:
    labels = image_config(buildah_env, image.tag)["Labels"]
    assert labels["mtpq.cuda-arch"] == CUDA_ARCHES[image_name]
    assert labels["mtpq.vllm-version"] == newest_pin.version
    assert labels["mtpq.series-id"] == newest_series.series_id
    assert (
        labels["org.opencontainers.image.version"] == f"{newest_pin.version}+mtpq.{newest_series.series_id}"
    )


def test_image_is_for_its_platform_and_runs_there(
    buildah_env: dict[str, str], image: Built, image_name: str, container: str
) -> None:
    architecture = IMAGE_CPU_ARCHES[image_name]
    inspected = image_inspect(buildah_env, image.tag)
    assert (inspected["os"], inspected["architecture"]) == ("linux", architecture)
    machine = run(["buildah", "run", container, "--", "uname", "-m"], buildah_env).stdout.strip()
    assert machine == MACHINES[architecture]


def test_entrypoint_stays_the_base_images(buildah_env: dict[str, str], image: Built) -> None:
    def launch(ref: str) -> tuple:
        config = image_config(buildah_env, ref)
        return config.get("Entrypoint"), config.get("Cmd"), config.get("WorkingDir")

    assert launch(image.tag) == launch(image.base)


def test_image_files_match_the_series_applied_to_pristine_vllm(
    buildah_env: dict[str, str], container: str, expected_tree: Path, patched_files: list[str]
) -> None:
    """For sm121 these are the mtpq aarch64 wheel's files, as pip installed them."""
    site = vllm_package(buildah_env, container).parent
    for relative in patched_files:
        expected = expected_tree / relative
        assert (site / relative).exists() == expected.exists(), relative
        if expected.exists():
            assert (site / relative).read_bytes() == expected.read_bytes(), relative


def test_sm121_installs_the_torch_the_official_aarch64_wheel_requires(newest_pin) -> None:
    """VLLM_VERSIONS' sm121_torch, which build.sh passes to the sm121-runtime stage, is the wheel's pin."""
    with zipfile.ZipFile(fetch(newest_pin.wheel("aarch64"))) as wheel:
        (metadata,) = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
        required = re.findall(r"^Requires-Dist: torch==(\S+)$", wheel.read(metadata).decode(), re.MULTILINE)
    assert required == [newest_pin.sm121["sm121_torch"]]


def test_images_are_built_for_the_releases_that_pin_their_sm121_inputs(run_apply, newest_pin) -> None:
    """apply.py --image-releases is the workflow's matrix of releases."""
    done = run_apply("--image-releases")
    assert done.returncode == 0, done.stderr
    imaged = [version for version, pin in load_pins().items() if pin.sm121]
    assert done.stdout.split() == imaged
    assert newest_pin.version in imaged


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


def unpinned_vllm(site: Path, release, patched_files: list[str]) -> None:
    version_file = site / "vllm" / "_version.py"
    version_file.write_text(version_file.read_text().replace(f"'{release.version}'", "'0.0.1'"))


def foreign_patched_file(site: Path, release, patched_files: list[str]) -> None:
    (site / patched_files[0]).write_text("# not the file the series was made on\n")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (unpinned_vllm, "vLLM 0.0.1 is outside the releases mtpq carries"),
        (foreign_patched_file, f"{CONFLICT}: "),
    ],
    ids=["unpinned-vllm", "series-does-not-apply"],
)
def test_a_base_the_series_cannot_patch_fails_the_build(
    buildah_env: dict[str, str],
    standin_base: str,
    refused_build,
    newest_pin,
    patched_files: list[str],
    damage,
    message,
) -> None:
    change = functools.partial(damage, release=newest_pin, patched_files=patched_files)
    with variant_of(buildah_env, standin_base, "unpatchable", change) as base:
        refused_build(build_sh(REFUSED_REPO, newest_pin, base, "sm89"), message)


def test_a_base_of_another_release_is_refused_rather_than_mislabelled(
    standin_base: str, refused_build, newest_pin
) -> None:
    """`--vllm` naming another pinned release than the base's, of the same series where there is one:
    its series id is the same, so only the version check keeps the labels true."""
    pins = load_pins()
    others = [pin for pin in pins.values() if pin != newest_pin]
    other = ([pin for pin in others if pin.series_name == newest_pin.series_name] or others)[0]
    refused_build(
        build_sh(REFUSED_REPO, other, standin_base, "sm89"),
        f"build arg version={other.version} does not match the base's vLLM",
    )


def test_a_build_that_bypasses_build_sh_is_refused_rather_than_mislabelled(
    standin_base: str, refused_build
) -> None:
    dockerfile = REPO_ROOT / "docker" / "Dockerfile"
    build = ["buildah", "bud", "--file", str(dockerfile), "--target", "mtpq", "--tag", f"{REFUSED_REPO}:x"]
    refused_build(
        [*build, "--build-arg", f"BASE_IMAGE={standin_base}", str(REPO_ROOT)], "build with docker/build.sh"
    )


def test_a_release_with_no_series_is_refused_naming_the_supported_ones(refused_build) -> None:
    command = [str(BUILD_SCRIPT), "--builder", "buildah", "--repo", REFUSED_REPO, "--vllm", "0.0.1", "sm89"]
    refused_build(command, "vLLM 0.0.1 is outside the releases mtpq carries (0.19.0 to 0.33.0). Supported: ")
