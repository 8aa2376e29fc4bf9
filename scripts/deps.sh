#!/bin/sh
# Installs whichever of the given Debian packages are missing.
# As root it runs apt-get (after apt-get update); otherwise it prints the
# exact command to run and fails, so that `make test` stops with a reason.
set -eu
missing=""
for pkg in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $pkg"
    fi
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "deps: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends $missing
else
    echo "deps: missing packages:$missing" >&2
    if command -v sudo >/dev/null 2>&1; then
        echo "deps: run: sudo apt-get update && sudo apt-get install -y$missing" >&2
    else # a minimal system has no sudo
        echo "deps: run as root: apt-get update && apt-get install -y$missing" >&2
    fi
    exit 1
fi
