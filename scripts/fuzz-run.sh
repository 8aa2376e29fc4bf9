#!/bin/sh
# fuzz-run.sh BUILD SECONDS TIMEOUT "FLAGS" NAME...: every harness for SECONDS
# from its seeds (tests/fuzz/corpus/NAME) and what earlier runs found
# (BUILD/corpus/NAME), as many at a time as there are cores (FUZZ_JOBS): each
# harness is one process on one core either way, so two at a time on two
# cores halves the wall time (7 x 20 s) without shortening any harness's run.
# stdout and stderr of the code under test are closed (-close_fd_mask=3);
# libFuzzer's report and any sanitizer report still reach BUILD/NAME.log.
# Exits 1 if any harness found a crash, leak or timeout, after showing it.
set -u
if [ "${1:-}" = "--one" ]; then
    build=$2 seconds=$3 timeout=$4 flags=$5 name=$6
    mkdir -p "$build/corpus/$name"
    # shellcheck disable=SC2086 # FLAGS is a list of libFuzzer options
    if "$build/bin/$name" -max_total_time="$seconds" -timeout="$timeout" -print_final_stats=1 -close_fd_mask=3 \
        -artifact_prefix="$build/artifacts/$name-" $flags "$build/corpus/$name" "tests/fuzz/corpus/$name" \
        >"$build/$name.log" 2>&1; then
        echo "== $name: $seconds s (log: $build/$name.log)"
        grep -E '^#[0-9]+[[:space:]]+DONE|^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$build/$name.log"
    else
        echo "!! $name FAILED (log: $build/$name.log):"
        tail -n 60 "$build/$name.log"
        touch "$build/failed-$name"
    fi
    exit 0
fi
build=$1 seconds=$2 timeout=$3 flags=$4
shift 4
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}
mkdir -p "$build/artifacts"
rm -f "$build"/failed-*
echo "fuzz: $# harnesses, $seconds s each, $jobs at a time"
# Each harness's report is printed whole when it ends (xargs runs them apart).
printf '%s\n' "$@" | xargs -P "$jobs" -I NAME sh "$0" --one "$build" "$seconds" "$timeout" "$flags" NAME
if ls "$build"/failed-* >/dev/null 2>&1; then
    echo "fuzz: FAILED: $(ls "$build"/failed-* | sed 's|.*/failed-||' | tr '\n' ' ')"
    echo "reproducers:"
    ls -l "$build/artifacts"
    exit 1
fi
echo "fuzz: all $# harnesses clean"
