#!/usr/bin/env bash
# Build the mtpq vLLM images from docker/Dockerfile; see usage below.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: docker/build.sh [OPTIONS] [sm89|sm90|sm121]...

Builds the named images (all three by default) of one pinned vLLM release and prints their tags:
  sm89, sm90  linux/amd64  vllm/vllm-openai:v<version> with the release's series applied in place
  sm121       linux/arm64  CUDA + PyPI torch as VLLM_VERSIONS pins them for the release, and
                           dist/vllm-<version>+mtpq.<series id>-...-aarch64.whl (make it first:
                           python apply.py --wheel --arch aarch64 --vllm <version>)

Options:
  --vllm VERSION            the release (default: the newest in VLLM_VERSIONS); one with no
                            mtpq series is refused, naming the supported ones
  --builder buildx|buildah  docker buildx (default) or buildah; also $MTPQ_BUILDER. buildah
                            takes its storage and isolation from its usual environment
                            variables (STORAGE_DRIVER, BUILDAH_ISOLATION, ...).
  --repo NAME               image repository (default mtpq/vllm-openai; also $MTPQ_IMAGE_REPO)
  --push                    buildx only: push to the registry instead of loading into docker
  --base-image REF          start the named images from REF instead of their usual base (for
                            tests with a stand-in of the image's platform; sm121 then needs no
                            wheel)
  -h, --help                this text

Labels: org.opencontainers.image.source/url come from $MTPQ_SOURCE_URL when set.
EOF
}

die() {
    echo "build.sh: $*" >&2
    exit 2
}

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
builder=${MTPQ_BUILDER:-buildx}
image_repo=${MTPQ_IMAGE_REPO:-mtpq/vllm-openai}
push=false
base_override=
vllm=
images=()
while (($#)); do
    case $1 in
        --vllm) vllm=${2:?--vllm needs a value}; shift 2 ;;
        --builder) builder=${2:?--builder needs a value}; shift 2 ;;
        --repo) image_repo=${2:?--repo needs a value}; shift 2 ;;
        --push) push=true; shift ;;
        --base-image) base_override=${2:?--base-image needs a value}; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        sm89 | sm90 | sm121) images+=("$1"); shift ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
((${#images[@]})) || images=(sm89 sm90 sm121)
case $builder in
    buildx) ;;
    buildah) [[ $push == false ]] || die "--push is for buildx; push buildah images with 'buildah push'" ;;
    *) die "--builder must be buildx or buildah, not '$builder'" ;;
esac

# version, series, series_id, aarch64_wheel (the name apply.py --wheel gives it) and, where pinned,
# sm121_torch and sm121_cuda: see VLLM_VERSIONS.
release_args=(--release-info)
[[ -z $vllm ]] || release_args+=(--vllm "$vllm")
info=$(python3 "$repo_root/apply.py" "${release_args[@]}") || exit 2
declare -A release=()
while IFS='=' read -r key value; do release[$key]=$value; done <<<"$info"
vllm_version=${release[version]}
series_id=${release[series_id]}
revision=$(git -C "$repo_root" rev-parse HEAD 2>/dev/null) || revision=unknown

# build PLATFORM TARGET TAG... : one docker/Dockerfile stage, with the build args in $build_args.
build() {
    local options=(--platform "$1") target=$2 tag arg
    shift 2
    for tag in "$@"; do options+=(--tag "$tag"); done
    for arg in "${build_args[@]}"; do options+=(--build-arg "$arg"); done
    options+=(--file "$repo_root/docker/Dockerfile" --target "$target")
    if [[ $builder == buildah ]]; then
        buildah bud --ignorefile "$repo_root/docker/Dockerfile.dockerignore" "${options[@]}" "$repo_root"
    elif [[ $push == true ]]; then
        docker buildx build "${options[@]}" --push "$repo_root"
    else
        docker buildx build "${options[@]}" --load "$repo_root"
    fi
}

built=()
for image in "${images[@]}"; do
    case $image in
        sm89) platform=linux/amd64 cuda_arch=sm_89 base=docker.io/vllm/vllm-openai:v$vllm_version ;;
        sm90) platform=linux/amd64 cuda_arch=sm_90 base=docker.io/vllm/vllm-openai:v$vllm_version ;;
        sm121) platform=linux/arm64 cuda_arch=sm_121 base=sm121-runtime ;;
    esac
    build_args=(
        "MTPQ_SERIES_ID=$series_id"
        "VLLM_VERSION=$vllm_version"
        "CUDA_ARCH=$cuda_arch"
        "OCI_CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
        "OCI_REVISION=$revision"
        "OCI_SOURCE=${MTPQ_SOURCE_URL:-}"
    )
    if [[ -n $base_override ]]; then
        base=$base_override
    elif [[ $image == sm121 ]]; then
        for key in sm121_torch sm121_cuda; do
            [[ -n ${release[$key]:-} ]] || die "VLLM_VERSIONS pins no $key for vLLM $vllm_version: no sm121 image"
        done
        wheel=dist/${release[aarch64_wheel]}
        [[ -f $repo_root/$wheel ]] ||
            die "sm121 needs $wheel: python apply.py --wheel --arch aarch64 --vllm $vllm_version"
        build_args+=("VLLM_WHEEL=$wheel" "TORCH_VERSION=${release[sm121_torch]}" "CUDA_VERSION=${release[sm121_cuda]}")
        # BuildKit resolves BASE_IMAGE=sm121-runtime to the stage; buildah needs an image.
        if [[ $builder == buildah ]]; then
            base=localhost/mtpq-sm121-runtime:v$vllm_version-$series_id
            build "$platform" sm121-runtime "$base"
        fi
    fi
    build_args+=("BASE_IMAGE=$base")
    tag=$image_repo:v$vllm_version-$series_id-$image
    build "$platform" mtpq "$tag" "$image_repo:v$vllm_version-$image"
    built+=("$tag")
done
printf '%s\n' "${built[@]}"
