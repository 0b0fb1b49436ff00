#!/usr/bin/env bash
# Commit a stand-in for docker/Dockerfile's sm121-runtime stage: what that stage does to
# nvidia/cuda, done to a Debian arm64 image (build-arm64-debian.sh) minus CUDA and torch, i.e.
# the mtpq aarch64 wheel pip-installed (--no-deps) into the venv /opt/venv, first on PATH, and
# vllm-openai's entrypoint and working directory. pip runs on arm64 under qemu-user.
#
#   build-sm121-standin.sh IMAGE_REF LABEL=VALUE BASE_REF MTPQ_AARCH64_WHEEL
#
# Needs root, buildah and the kernel's binfmt_misc handler for aarch64.
set -euo pipefail

image_ref=$1 label=$2 base=$3 wheel=$4
venv=/opt/venv

container=$(buildah from "$base")
trap 'buildah rm "$container" >/dev/null' EXIT
# pip wants the wheel's own file name; --no-index: nothing comes from the network.
buildah run --volume "$wheel:/mnt/$(basename "$wheel"):ro" "$container" -- sh -c "
    python3 -m venv $venv && $venv/bin/pip install --quiet --no-index --no-deps --no-compile \
        --disable-pip-version-check /mnt/$(basename "$wheel")"

buildah config --env VIRTUAL_ENV="$venv" --env PATH="$venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --entrypoint '["vllm", "serve"]' --workingdir /vllm-workspace --label "$label" "$container"
buildah commit --quiet "$container" "$image_ref"
