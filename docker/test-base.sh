#!/usr/bin/env bash
# A stand-in for python:3.11-slim-bookworm, for building the image where Docker Hub cannot be
# reached (CI): Debian bookworm with python3 (3.11), made by debootstrap and `docker import`, plus
# the host's CA bundle (the file $PIP_CERT names, when set) so that pip in the build trusts what
# the host trusts. Used by `make image-test` through the Dockerfile's PYTHON_IMAGE argument.
#
#   docker/test-base.sh [TAG]          (default facegate-base:bookworm; needs root, debootstrap)
#
# An existing TAG is reused: debootstrap runs once per Docker engine. `docker rmi TAG` to remake it.
# DEBIAN_MIRROR overrides debootstrap's default mirror.
set -euo pipefail
tag="${1:-facegate-base:bookworm}"
if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "test-base: $tag exists, reused"
    exit 0
fi
command -v debootstrap >/dev/null || { echo "test-base: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$SECONDS
# python3-venv: the Makefile's `python3 -m venv`; python-is-python3: the HEALTHCHECK's `python`.
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
    bookworm "$work/root" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} >"$work/debootstrap.log" 2>&1 \
    || { tail -n 30 "$work/debootstrap.log" >&2; echo "test-base: debootstrap failed" >&2; exit 1; }
rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"*
tar -C "$work/root" --numeric-owner -c . | docker import --change 'CMD ["python3"]' - "$tag-rootfs" >/dev/null
rm -rf "$work/root"

# The CA bundle layer (on top of the imported root file system, under the final tag).
mkdir "$work/context"
if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
    cp "$PIP_CERT" "$work/context/ca-bundle.crt"
else
    cp /etc/ssl/certs/ca-certificates.crt "$work/context/ca-bundle.crt"
fi
cat >"$work/context/Dockerfile" <<DOCKERFILE
FROM $tag-rootfs
COPY ca-bundle.crt /usr/local/share/ca-bundle.crt
ENV PIP_CERT=/usr/local/share/ca-bundle.crt \\
    LANG=C.UTF-8
CMD ["python3"]
DOCKERFILE
DOCKER_BUILDKIT=0 docker build --quiet --network host -t "$tag" "$work/context" >/dev/null
docker rmi "$tag-rootfs" >/dev/null || true
echo "test-base: made $tag in $((SECONDS - start)) s ($(docker run --rm --network host "$tag" python3 --version))"
