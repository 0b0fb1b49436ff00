#!/usr/bin/env bash
# Commit a Debian linux/arm64 image for the sm121 stand-in (build-sm121-standin.sh) to start
# from: python3 with venv, and git, which the `mtpq` stage patches with (the real sm121 runtime
# stage lacks it and that stage installs it with apt; here it is installed once, not per build).
# debootstrap unpacks the packages on the host (--foreign); its second stage, which runs their
# maintainer scripts, runs arm64 code in the chroot under qemu-user, through the kernel's
# binfmt_misc handler for aarch64 (registered with the F flag, so the chroot needs no qemu).
#
#   build-arm64-debian.sh IMAGE_REF LABEL=VALUE DEBIAN_MIRROR
#
# Needs root, buildah, debootstrap and that handler; buildah storage comes from its environment.
set -euo pipefail

image_ref=$1 label=$2 mirror=$3
suite=bookworm

container=$(buildah from scratch)
trap 'buildah rm "$container" >/dev/null' EXIT
rootfs=$(buildah mount "$container")
debootstrap --arch=arm64 --foreign --variant=minbase --include=python3,python3-venv,git \
    "$suite" "$rootfs" "$mirror"
chroot "$rootfs" /debootstrap/debootstrap --second-stage
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*

buildah config --os linux --arch arm64 --label "$label" "$container"
buildah commit --quiet "$container" "$image_ref"
