#!/bin/sh
# flip-study.sh RUNS [LESSON.lua ...]: does any lesson's verdict flip on a
# clean engine?
#
# Runs every lesson (lessons/*.lua unless named) RUNS times, headless, with
# no fault. The first half of the runs is "quiet" (whatever else the machine
# runs: its load is recorded); the second half runs beside two neighbours
# this script starts and always stops (trap EXIT): a busy loop, and a loop
# that streams a 256 MiB buffer through memory. Each lesson's claims and
# verdicts are recorded per run with the 1-minute load average at its start.
#
# Prints, per claim, how many runs gave PASS, DISAGREE, FAIL and UNDECIDED,
# and FLIP where one run gave PASS and another DISAGREE or FAIL (UNDECIDED,
# a timing too noisy to decide, is counted apart and is not a flip); then
# the load averages of each run. Exit status: 0 no flip, 1 any flip (or a
# lesson that never reported a claim), 2 a usage error.
#
# SERVELAB_BIN (default bin/servelab) is the binary; FLIP_DIR (default
# build/flip-study) gets every run's output (RUN-PHASE-LESSON.out) and
# verdicts.tsv. The machine profile is read (or measured) once before the
# first run, so every run judges against the same one (servelab machine).
set -u
usage() {
    echo "usage: scripts/flip-study.sh RUNS [LESSON.lua ...]  (RUNS: an even number, 2 to 200)" >&2
    exit 2
}
[ $# -ge 1 ] || usage
runs=$1
shift
case $runs in '' | *[!0-9]*) usage ;; esac
[ "$runs" -ge 2 ] && [ "$runs" -le 200 ] && [ $((runs % 2)) -eq 0 ] || usage
if [ $# -gt 0 ]; then lessons="$*"; else lessons=$(ls lessons/*.lua); fi
for lesson in $lessons; do
    [ -f "$lesson" ] || { echo "flip-study: no lesson file '$lesson'" >&2; exit 2; }
done
bin=${SERVELAB_BIN:-bin/servelab}
[ -x "$bin" ] || { echo "flip-study: no servelab binary at '$bin' (make all, or set SERVELAB_BIN)" >&2; exit 2; }
dir=${FLIP_DIR:-build/flip-study}
rm -rf "$dir"
mkdir -p "$dir" || exit 2
table="$dir/verdicts.tsv"
loads="$dir/loads.tsv"
: >"$table"
: >"$loads"

# ---- the neighbours -----------------------------------------------------------------------
neighbour_pids=""
stop_neighbours() {
    for pid in $neighbour_pids; do kill "$pid" 2>/dev/null; done
    for pid in $neighbour_pids; do wait "$pid" 2>/dev/null; done
    neighbour_pids=""
}
trap stop_neighbours EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# The memory streamer: copies one 128 MiB half of a buffer onto the other,
# over and over (256 MiB: far past any L3, so every copy goes to memory).
streamer="$dir/stream-neighbour"
cat >"$dir/stream-neighbour.c" <<'EOF'
#include <stdlib.h>
#include <string.h>
int main(void) {
    size_t half = (size_t)128 << 20;
    char* buffer = malloc(2 * half);
    if (!buffer) return 1;
    memset(buffer, 1, 2 * half);
    for (unsigned long i = 0;; i++) {
        memcpy(buffer + (i % 2) * half, buffer + ((i + 1) % 2) * half, half);
        buffer[i % half] = (char)i; /* keeps the copies from being optimised away */
    }
}
EOF
if ! ${CC:-cc} -O2 -o "$streamer" "$dir/stream-neighbour.c" 2>"$dir/stream-neighbour.err"; then
    echo "flip-study: cannot compile the memory-streaming neighbour: $(head -n 1 "$dir/stream-neighbour.err")" >&2
    exit 2
fi
start_neighbours() {
    sh -c 'while :; do :; done' &
    neighbour_pids="$!"
    "$streamer" &
    neighbour_pids="$neighbour_pids $!"
}

load1() { cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo "?"; }

# ---- the runs -----------------------------------------------------------------------------
# One profile for every run, read or measured before any neighbour starts.
"$bin" machine >"$dir/machine.txt" 2>&1 || { cat "$dir/machine.txt" >&2; exit 2; }
echo "flip study: $runs runs ($((runs / 2)) quiet, $((runs / 2)) beside a busy loop and a memory streamer) of:" $lessons
sed 's/^/  /' "$dir/machine.txt"
missing=0
run=1
while [ "$run" -le "$runs" ]; do
    phase=quiet
    if [ "$run" -gt $((runs / 2)) ]; then
        phase=neighbours
        [ -n "$neighbour_pids" ] || start_neighbours
    fi
    run_max=0
    run_first=$(load1)
    for lesson in $lessons; do
        name=$(basename "$lesson" .lua)
        out="$dir/$run-$phase-$name.out"
        load=$(load1)
        run_max=$(awk -v a="$run_max" -v b="$load" 'BEGIN { print (b + 0 > a + 0) ? b : a }')
        "$bin" lesson run "$lesson" --headless --time-limit 300 >"$out" 2>&1 </dev/null
        status=$?
        # Every verdict line starts with its word and the claim's id.
        found=$(awk -v run="$run" -v phase="$phase" -v lesson="$name" -v load="$load" '
            /^(PASS|DISAGREE|FAIL|UNDECIDED) / { print run "\t" phase "\t" lesson "\t" $2 "\t" $1 "\t" load; n++ }
            END { exit n == 0 }' "$out" | tee -a "$table" | wc -l)
        if [ "$found" -eq 0 ]; then
            echo "flip-study: run $run: $lesson reported no claim (exit status $status): $(tail -n 1 "$out")" >&2
            missing=$((missing + 1))
        fi
    done
    printf '%s\t%s\t%s\t%s\n' "$run" "$phase" "$run_first" "$run_max" >>"$loads"
    echo "  run $run ($phase): load $run_first at its start, at most $run_max"
    run=$((run + 1))
done
stop_neighbours

# ---- the table ----------------------------------------------------------------------------
echo
printf '%-28s %-18s %5s %9s %5s %10s  %s\n' lesson claim PASS DISAGREE FAIL UNDECIDED flip
awk -F'\t' '
    { key = $3 "\t" $4; if (!(key in seen)) { seen[key] = 1; order[++n] = key } count[key, $5]++ }
    END {
        flips = 0
        for (i = 1; i <= n; i++) {
            key = order[i]
            split(key, part, "\t")
            p = count[key, "PASS"] + 0; d = count[key, "DISAGREE"] + 0
            f = count[key, "FAIL"] + 0; u = count[key, "UNDECIDED"] + 0
            flip = p > 0 && d + f > 0
            flips += flip
            printf "%-28s %-18s %5d %9d %5d %10d  %s\n", part[1], part[2], p, d, f, u, flip ? "FLIP" : "-"
        }
        printf "\n%d claims, %d with a flip\n", n, flips
        exit flips > 0
    }' "$table"
flipped=$?
echo
echo "load averages (1 minute) at each run's start and the highest at any lesson's start:"
awk -F'\t' '{ printf "  run %2d %-10s %6s %6s\n", $1, $2, $3, $4 }' "$loads"
awk -F'\t' '{ s[$2] += $3; m[$2] = ($4 + 0 > m[$2] + 0) ? $4 : m[$2]; c[$2]++ }
    END { for (p in c) printf "  %s: mean %.2f at the runs'"'"' starts, highest %s\n", p, s[p] / c[p], m[p] }' "$loads"
echo "verdicts per run: $table"
[ "$flipped" -eq 0 ] && [ "$missing" -eq 0 ] && exit 0
exit 1
