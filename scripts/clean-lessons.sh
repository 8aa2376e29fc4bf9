#!/bin/sh
# clean-lessons.sh SERVELAB DIR TIME_LIMIT: every lesson in lessons/ run once
# headless with no fault (`lesson run FILE --headless --time-limit S`), all
# cores at a time, the longest first; DIR/NAME.out gets its output (stdout
# then stderr, as one stream) and DIR/NAME.status its exit status. make test
# does this once, and the tests that need the clean runs read them
# (SERVELAB_CLEAN_LESSONS=DIR): test_lesson_cli, test_fault_matrix. Run
# alone, those tests run the lessons themselves.
set -u
if [ "${1:-}" = "--one" ]; then
    bin=$2 dir=$3 limit=$4 lesson=$5
    name=${lesson##*/}
    mkdir -p "$dir/$name.output"
    "$bin" lesson run "$lesson" --headless --time-limit "$limit" --output "$dir/$name.output" \
        >"$dir/$name.out" 2>&1 </dev/null
    echo $? >"$dir/$name.status"
    echo "  LESSON $lesson: $(tail -n 1 "$dir/$name.out")"
    exit 0
fi
bin=$1 dir=$2 limit=$3
rm -rf "$dir"
mkdir -p "$dir" || exit 1
jobs=${TEST_JOBS:-$(nproc 2>/dev/null || echo 2)}
echo "clean lessons: every lessons/*.lua once, $jobs at a time, into $dir/"
# The longest first (CPU of a clean run here: 06 7 s, 11 4.8 s, 04 3.9 s, 01 2.5 s, 02 2.1 s, the others 1.4-1.6 s).
ls lessons/*.lua | awk '{ w = /06-/ ? 9 : /11-/ ? 8.5 : /04-/ ? 8 : /01-/ ? 7 : /02-/ ? 6 : 0; print w, $0 }' |
    sort -k1,1nr -k2 | cut -d' ' -f2 | xargs -n 1 -P "$jobs" sh "$0" --one "$bin" "$dir" "$limit"
