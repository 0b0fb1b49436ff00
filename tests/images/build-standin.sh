#!/usr/bin/env bash
# Commit a small local stand-in for vllm/vllm-openai that buildah can build docker/Dockerfile's
# `mtpq` stage on: Debian with Python 3, vLLM's Python files where vllm-openai installs them
# (/usr/local/lib/python3.X/dist-packages) and vllm-openai's entrypoint and working directory.
# No torch, CUDA or GPU: the self-check reads files and never imports vllm.
#
#   build-standin.sh IMAGE_REF LABEL=VALUE VLLM_SDIST DEBIAN_MIRROR
#
# Needs root, buildah and debootstrap; buildah storage comes from its environment variables.
set -euo pipefail

image_ref=$1 label=$2 sdist=$3 mirror=$4
suite=bookworm

container=$(buildah from scratch)
trap 'buildah rm "$container" >/dev/null' EXIT
rootfs=$(buildah mount "$container")
debootstrap --variant=minbase --include=python3 "$suite" "$rootfs" "$mirror"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*

python=$(chroot "$rootfs" python3 -c 'import sys; print("python%d.%d" % sys.version_info[:2])')
site=$rootfs/usr/local/lib/$python/dist-packages
mkdir -p "$site"
tar -xzf "$sdist" -C "$site" --strip-components=1 --no-same-owner "$(basename "$sdist" .tar.gz)/vllm"

buildah config --entrypoint '["vllm", "serve"]' --workingdir /vllm-workspace --label "$label" "$container"
buildah commit --quiet "$container" "$image_ref"
