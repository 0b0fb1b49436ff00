#!/usr/bin/env bash
# Build the mtpq vLLM images from docker/Dockerfile; see usage below.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: docker/build.sh [OPTIONS] [sm89|sm90|sm121]...

Builds the named images (all three by default) and prints their tags:
  sm89, sm90  linux/amd64  vllm/vllm-openai:v<VLLM_VERSION> with the series applied in place
  sm121       linux/arm64  CUDA 13 + PyPI torch + dist/vllm-<VLLM_VERSION>+mtpq.<series>-...
                           aarch64 wheel (make it first: python apply.py --wheel --arch aarch64)

Options:
  --builder buildx|buildah  docker buildx (default) or buildah; also $MTPQ_BUILDER. buildah
                            takes its storage and isolation from its usual environment
                            variables (STORAGE_DRIVER, BUILDAH_ISOLATION, ...).
  --repo NAME               image repository (default mtpq/vllm-openai; also $MTPQ_IMAGE_REPO)
  --push                    buildx only: push to the registry instead of loading into docker
  --base-image REF          start every image from REF, on REF's own platform, instead of its
                            usual base (for tests with a stand-in; sm121 then needs no wheel)
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
images=()
while (($#)); do
    case $1 in
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

vllm_version=$(sed -n 's/^VLLM_VERSION=//p' "$repo_root/VLLM_VERSION")
series_id=$(python3 "$repo_root/apply.py" --series-id)
revision=$(git -C "$repo_root" rev-parse HEAD 2>/dev/null) || revision=unknown

# build PLATFORM TARGET TAG... : one docker/Dockerfile stage, with the build args in $build_args.
build() {
    local platform=$1 target=$2 options=() tag arg
    shift 2
    [[ -z $platform ]] || options+=(--platform "$platform")
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
        sm89) platform=linux/amd64 cuda_arch=sm_89 base=vllm/vllm-openai:v$vllm_version ;;
        sm90) platform=linux/amd64 cuda_arch=sm_90 base=vllm/vllm-openai:v$vllm_version ;;
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
        platform='' base=$base_override
    elif [[ $image == sm121 ]]; then
        wheel=dist/vllm-$vllm_version+mtpq.$series_id-cp38-abi3-manylinux_2_28_aarch64.whl
        [[ -f $repo_root/$wheel ]] || die "sm121 needs $wheel: python apply.py --wheel --arch aarch64"
        build_args+=("VLLM_WHEEL=$wheel")
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
