#!/bin/sh
# Installs whichever of the given Debian packages are missing.
# As root it runs apt-get (after apt-get update); otherwise it prints the
# exact command to run and fails, so that `make test` stops with a reason.
# PACKAGE:PROGRAM counts as present when PROGRAM is on the PATH as well
# (nodejs from NodeSource brings its own npm, which Debian's npm conflicts with).
#
# deps.sh --npm DIR: `npm ci` in DIR unless node_modules already holds what
# DIR/package-lock.json pins (a failure, e.g. offline, is reported and left
# to the test that needs the modules, which then says NOT RUN and why).
set -eu
if [ "${1:-}" = "--npm" ]; then
    dir=$2
    if ! command -v npm >/dev/null 2>&1; then
        echo "deps: npm is not installed: cannot install the packages of $dir (make test-deps)" >&2
        exit 1
    fi
    # npm ci keeps node_modules/.package-lock.json, a copy of the lock's packages, in step.
    if [ -f "$dir/node_modules/.package-lock.json" ] &&
        node -e '
            const fs = require("fs"), dir = process.argv[1];
            const want = JSON.parse(fs.readFileSync(dir + "/package-lock.json")).packages;
            const have = JSON.parse(fs.readFileSync(dir + "/node_modules/.package-lock.json")).packages;
            for (const k of Object.keys(want)) if (k && (!have[k] || have[k].version !== want[k].version)) process.exit(1);
        ' "$dir" 2>/dev/null; then
        exit 0
    fi
    echo "deps: npm ci in $dir (the versions package-lock.json pins)"
    if ! (cd "$dir" && timeout 300 npm ci --no-audit --no-fund --loglevel=error); then
        echo "deps: npm ci failed in $dir (offline?): the tests that need it will say NOT RUN" >&2
    fi
    exit 0
fi
missing=""
for entry in "$@"; do
    pkg=${entry%%:*}
    program=${entry#*:}
    if [ "$program" != "$entry" ] && command -v "$program" >/dev/null 2>&1; then continue; fi
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
