#!/bin/sh
# Runs each test binary given, from the repository root, printing its cmocka
# output; then one total line "tests: N passed, M failed, K skipped, G not
# run". A binary that crashes or exits non-zero without a cmocka summary
# counts as one failure. Exit status 77 means "could not run here" (the GPU
# tests on a machine without a CUDA device): that binary is reported as not
# run; nothing it printed counts as passed, and it fails nothing either.
set -u
passed=0
failed=0
skipped=0
not_run=0
status=0
for bin in "$@"; do
    echo "== $bin"
    out=$("$bin" 2>&1)
    rc=$?
    printf '%s\n' "$out"
    if [ "$rc" -eq 77 ]; then
        echo "-- $bin: NOT RUN (exit 77): $(printf '%s\n' "$out" | grep -m 1 'NOT RUN' || echo 'no reason given')"
        not_run=$((not_run + 1))
        continue
    fi
    p=$(printf '%s\n' "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -n 1)
    f=$(printf '%s\n' "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | tail -n 1)
    s=$(printf '%s\n' "$out" | sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' | tail -n 1)
    passed=$((passed + ${p:-0}))
    failed=$((failed + ${f:-0}))
    skipped=$((skipped + ${s:-0}))
    if [ "$rc" -ne 0 ]; then
        status=1
        if [ -z "${f:-}" ]; then
            echo "!! $bin exited with status $rc"
            failed=$((failed + 1))
        fi
    fi
done
echo "tests: $passed passed, $failed failed, $skipped skipped, $not_run not run"
[ "$not_run" -eq 0 ] || echo "NOT RUN: $not_run test program(s) could not run on this machine (see the '-- ... NOT RUN' lines)"
exit $status
