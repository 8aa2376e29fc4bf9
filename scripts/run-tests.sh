#!/bin/sh
# Runs the test programs given, from the repository root, TEST_JOBS at a
# time (default: every core), the longest first (the times of the previous
# run, else a static list), and streams each line of their output as it
# comes, prefixed with the program's name: "[lab/ui/test_lab_tmux] ...".
# Each program's whole output is also kept in TEST_LOG_DIR (default
# build/test-logs), one NAME.log per program.
#
# At the end: every failed test by name with its log, the ten slowest
# programs with their times, then one total line, always the last:
#   tests: N passed, M failed, K skipped, G not run
# A program that crashes or exits non-zero without a cmocka summary counts
# as one failure. Exit status 77 means "could not run here" (the GPU tests
# on a machine without a CUDA device): that program is reported as not run;
# nothing it printed counts as passed, and it fails nothing either.
# The runner exits 1 when anything failed, else 0.
#
# Environment: TEST_JOBS, TEST_LOG_DIR, TEST_TIMES (the times file, default
# TEST_LOG_DIR.times: "milliseconds program cpu-seconds" per line, rewritten
# each run).
set -u

# The name a program is shown and logged under: its path below tests/
# (build/release/tests/lab/ui/test_lab_tmux -> lab/ui/test_lab_tmux), else
# its file name.
name_of() {
    case "$1" in
    */tests/*) printf '%s\n' "${1#*/tests/}" ;;
    tests/*) printf '%s\n' "${1#tests/}" ;;
    *) printf '%s\n' "${1##*/}" ;;
    esac
}

now_ms() { date +%s%3N; }

# ---- one program (run by xargs -P): output to NAME.log and, prefixed, to stdout
if [ "${1:-}" = "--one" ]; then
    bin=$2
    log=$3
    name=$(name_of "$bin")
    start=$(now_ms)
    { "$bin" </dev/null 2>&1; echo $? >"$log.rc"; } | tee "$log" | sed -u "s|^|[$name] |"
    end=$(now_ms)
    echo $((end - start)) >"$log.ms"
    # CPU seconds (user + system) of the program and all it waited for:
    # the shell's `times`, second line "XmY.YYs XmY.YYs" (children).
    times >"$log.cpu"
    sed -n 2p "$log.cpu" | awk '{ n = 0; for (i = 1; i <= 2; i++) { split($i, p, "m"); n += p[1] * 60 + p[2] }
        printf "%.1f\n", n }' >"$log.cpu.new" && mv "$log.cpu.new" "$log.cpu"
    rc=$(cat "$log.rc" 2>/dev/null || echo 1)
    case "$rc" in
    0) word=ok ;;
    77) word="NOT RUN" ;;
    *) word="FAILED (exit $rc)" ;;
    esac
    printf -- '-- %s: %s in %d.%d s (%s s CPU)\n' "$name" "$word" $(((end - start) / 1000)) $(((end - start) % 1000 / 100)) \
        "$(cat "$log.cpu" 2>/dev/null)"
    exit 0
fi

logs=${TEST_LOG_DIR:-build/test-logs}
times=${TEST_TIMES:-$logs.times}
jobs=${TEST_JOBS:-$(nproc 2>/dev/null || echo 2)}
mkdir -p "$logs" || exit 1
rm -f "$logs"/*.log "$logs"/*.log.rc "$logs"/*.log.ms "$logs"/*.log.cpu

log_of() { printf '%s/%s.log\n' "$logs" "$(name_of "$1" | tr '/' '.')"; }

# Longest first: the last run's time of each program; one never timed gets
# the estimate below (the long ones at the time of writing, in ms), or 0.
[ -f "$times" ] || : >"$times"
order=$(for bin in "$@"; do printf '%s\n' "$bin"; done | awk -v times="$times" '
    BEGIN {
        while ((getline line < times) > 0) { split(line, f, " "); if (f[2] != "") t[f[2]] = f[1] }
        guess["lessons/test_fault_matrix"] = 150000; guess["lab/ui/test_dashboard_fit"] = 120000
        guess["lab/lesson/test_hostile_lessons"] = 80000; guess["lab/lesson/test_lesson_cli"] = 70000
        guess["lab/quiz/test_quiz_cli"] = 60000; guess["lab/serve/test_serve"] = 50000
    }
    {
        name = $0; sub(/^.*\/tests\//, "", name); sub(/^tests\//, "", name)
        ms = ($0 in t) ? t[$0] : ((name in guess) ? guess[name] : 0)
        printf "%d %d %s\n", ms, NR, $0
    }' | sort -k1,1nr -k2,2n | cut -d' ' -f3-)

total=$#
echo "run-tests: $total programs, $jobs at a time, longest first; logs in $logs/"
started=$(now_ms)
for bin in $order; do printf '%s\n%s\n' "$bin" "$(log_of "$bin")"; done |
    xargs -n 2 -P "$jobs" sh "$0" --one
finished=$(now_ms)

# ---- the summary, from the logs
passed=0
failed=0
skipped=0
not_run=0
status=0
failures=""
not_run_lines=""
new_times=""
for bin in "$@"; do
    name=$(name_of "$bin")
    log=$(log_of "$bin")
    rc=$(cat "$log.rc" 2>/dev/null || echo 1)
    ms=$(cat "$log.ms" 2>/dev/null || echo 0)
    cpu=$(cat "$log.cpu" 2>/dev/null || echo 0)
    new_times="$new_times$ms $bin $cpu
"
    if [ "$rc" -eq 77 ]; then
        reason=$(grep -m 1 'NOT RUN' "$log" 2>/dev/null || echo 'no reason given')
        not_run_lines="$not_run_lines-- $bin: NOT RUN (exit 77): $reason
"
        not_run=$((not_run + 1))
        continue
    fi
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" 2>/dev/null | tail -n 1)
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" 2>/dev/null | tail -n 1)
    s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" 2>/dev/null | tail -n 1)
    passed=$((passed + ${p:-0}))
    failed=$((failed + ${f:-0}))
    skipped=$((skipped + ${s:-0}))
    if [ "$rc" -ne 0 ]; then
        status=1
        # cmocka lists each failed test after its count: "[  FAILED  ] test_x".
        names=$(sed -n 's/^\[  FAILED  \] \([A-Za-z_][A-Za-z0-9_.-]*\)$/\1/p' "$log" 2>/dev/null | awk '!seen[$0]++' | tr '\n' ' ')
        if [ -z "${f:-}" ]; then
            failed=$((failed + 1))
            names="${names}(exited with status $rc without a cmocka summary; the end of its log below)"
        fi
        failures="$failures!! $name: $names
   log: $log
"
    fi
done

# The times of this run, plus those of programs not run this time.
{
    printf '%s' "$new_times"
    for bin in "$@"; do printf '\t%s\n' "$bin"; done | awk -F'\t' 'NR == FNR { skip[$2] = 1; next }
        { split($0, f, " "); if (!(f[2] in skip)) print }' - "$times"
} >"$times.new" 2>/dev/null && mv "$times.new" "$times"

echo
cpu_total=$(printf '%s' "$new_times" | awk '{ n += $3 } END { printf "%.0f", n }')
echo "== summary ($total programs, $jobs at a time: $(((finished - started) / 1000)) s; $cpu_total s of CPU; load: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null))"
echo "slowest programs (wall, CPU):"
printf '%s' "$new_times" | sort -k1,1nr | head -n 10 |
    awk '{ name = $2; if (!sub(/^.*\/tests\//, "", name)) sub(/^.*\//, "", name); printf "  %6.1f s  %6.1f s  %s\n", $1 / 1000, $3, name }'
[ -z "$not_run_lines" ] || printf '%s' "$not_run_lines"
if [ -n "$failures" ]; then
    echo "FAILED:"
    printf '%s' "$failures"
    for bin in "$@"; do
        log=$(log_of "$bin")
        rc=$(cat "$log.rc" 2>/dev/null || echo 1)
        if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ] && ! grep -q '^\[  FAILED  \] [0-9]' "$log" 2>/dev/null; then
            echo "-- the end of $log:"
            tail -n 15 "$log" 2>/dev/null
        fi
    done
fi
# Skips for want of llama2.c's or llama.cpp's own files (a clone without
# ../shared): said once for the whole run, with what brings them.
missing_programs=""
for bin in "$@"; do
    grep -q "skipping the tests that need llama2.c's or llama.cpp's own files" "$(log_of "$bin")" 2>/dev/null &&
        missing_programs="$missing_programs ${bin##*/}"
done
[ -z "$missing_programs" ] ||
    echo "SKIPPED for want of llama2.c's/llama.cpp's files (no ../shared/models, no ./models):$missing_programs; 'make models' fetches stories260K, and ../shared beside the clone brings the reference outputs"
[ "$not_run" -eq 0 ] || echo "NOT RUN: $not_run test program(s) could not run on this machine (see the '-- ... NOT RUN' lines)"
echo "tests: $passed passed, $failed failed, $skipped skipped, $not_run not run"
exit $status
