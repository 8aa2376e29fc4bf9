#!/bin/sh
# mutants.sh: the project's own mutation test (make mutants; docs/mutants.md).
#
#   scripts/mutants.sh [--quick] [--no-tests] [--lessons 'GLOB'] [NAME ...]
#
# Each scripts/mutants/NAME.mutant names a source file, a snippet that must
# occur in it exactly once, and what replaces it. For each mutant (all of
# them, or the NAMEs given; NAME may be a comma-separated list):
#   1. the snippet is replaced in a scratch copy of the tree (build/mutants/tree,
#      which keeps its object files: one build is the mutated file's compile
#      and a link);
#   2. every lesson runs headless with the audit on (lesson run --audit), from
#      the repository root, and what caught the mutant is recorded: a lesson
#      claim that turned DISAGREE, an audit invariant (its message), or a
#      guard/crash (a FAIL without the audit, a signal, the time limit);
#   3. only when nothing in the lab caught it, the unit tests of
#      MUTANT_TESTS run with SERVELAB_AUDIT=1 and the first that fails is recorded.
# Then a table (mutant, area, caught by) and the kill counts. Logs:
# build/mutants/logs/NAME/. A mutant whose snippet does not occur exactly
# once, or that does not compile, is an error naming it (exit status 2),
# never a skip. Exit status 1 when any mutant survived.
#
#   --quick      stop at the first lesson that catches a mutant (the table
#                then names the first catcher, not every one)
#   --no-tests   never run the unit tests (a mutant the lab misses: survived)
#   --lessons G  the lessons to run (default: lessons/*.lua)
#   --check      only apply each mutant (its snippets found exactly once), build nothing
set -u
cd "$(dirname "$0")/.." || exit 2
root=$(pwd)
work=$root/build/mutants
tree=$work/tree
quick=0 run_tests=1 check_only=0 lesson_glob='lessons/*.lua' names=""
while [ $# -gt 0 ]; do
    case $1 in
    --quick) quick=1 ;;
    --no-tests) run_tests=0 ;;
    --check) check_only=1 ;;
    --lessons) shift; lesson_glob=${1:?--lessons needs a glob} ;;
    -h | --help) sed -n "2,27p" "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "mutants.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) names="$names $(echo "$1" | tr ',' ' ')" ;;
    esac
    shift
done
JOBS=${JOBS:-2}
LESSON_LIMIT=${LESSON_LIMIT:-60}
# The unit tests run for a mutant the lab missed: the engine's and kernels'
# programs (the others test the lab's drawing and parsing, not the engine).
MUTANT_TESTS=${MUTANT_TESTS:-"tests/engine/test_engine tests/engine/test_engine_fork tests/engine/test_engine_release
 tests/engine/test_scheduler tests/engine/test_kv_blocks tests/engine/test_reference_forward tests/engine/test_quant
 tests/engine/test_model_quant tests/engine/test_tensor_parallel tests/engine/test_sampler tests/engine/test_audit
 tests/kernels/test_matmul tests/kernels/test_attention"}

if [ -z "$names" ]; then
    for f in scripts/mutants/*.mutant; do names="$names $(basename "$f" .mutant)"; done
fi
for n in $names; do
    [ -f "scripts/mutants/$n.mutant" ] || { echo "mutants.sh: no mutant '$n' (scripts/mutants/$n.mutant)" >&2; exit 2; }
done

# One field of a mutant file's header ("# file: engine/scheduler.c").
field() { sed -n "s/^# $2: *//p" "scripts/mutants/$1.mutant" | head -n 1; }

# Writes the mutated text of the mutant's file to $3; exit 3 naming the
# mutant when the snippet does not occur exactly once.
apply_mutant() { # NAME SOURCE OUT
    perl -e '
        my ($name, $source, $out, $spec) = @ARGV;
        open my $m, "<", $spec or die "mutant $name: cannot read $spec\n";
        my (@pairs, $section);
        while (my $line = <$m>) {
            if ($line =~ /^\@\@\@ (original|replacement|end)\s*$/) {
                $section = $1;
                push @pairs, ["", ""] if $section eq "original";
                last if $section eq "end";
                next;
            }
            next unless defined $section;
            $pairs[-1][$section eq "original" ? 0 : 1] .= $line;
        }
        if (!@pairs || ($section // "") ne "end") {
            print STDERR "mutant $name: expected \@\@\@ original / \@\@\@ replacement pairs and \@\@\@ end\n"; exit 3;
        }
        open my $s, "<", $source or do { print STDERR "mutant $name: cannot read $source\n"; exit 3 };
        my $code = do { local $/; <$s> };
        my $k = 0;
        for my $pair (@pairs) {
            my ($from, $to) = @$pair; $k++;
            my $count = () = $code =~ /\Q$from\E/g;
            if ($count != 1) {
                print STDERR "mutant $name: its original snippet $k occurs $count times in $source (expected exactly once)\n";
                exit 3;
            }
            $code =~ s/\Q$from\E/$to/;
        }
        open my $o, ">", $out or die; print $o $code; close $o;
    ' "$1" "$2" "$3" "scripts/mutants/$1.mutant"
}

if [ "$check_only" = 1 ]; then
    status=0
    mkdir -p "$work"
    for n in $names; do
        file=$(field "$n" file)
        if [ -f "$file" ] && apply_mutant "$n" "$file" "$work/mutated"; then
            cmp -s "$file" "$work/mutated" && { echo "mutant $n: its replacement leaves $file unchanged" >&2; status=2; }
        else
            [ -f "$file" ] || echo "mutant $n: '# file: $file' is not a file of this tree" >&2
            status=2
        fi
    done
    [ "$status" = 0 ] && echo "mutants: all $(echo $names | wc -w) apply"
    exit $status
fi

# ---- the scratch tree: sources of this checkout (edits included), its objects -----------------
echo "mutants: building the unmutated tree (make all) ..."
make --no-print-directory -j"$JOBS" all >"$work.build.log" 2>&1 || {
    mkdir -p "$work"; echo "mutants.sh: the unmutated tree does not build (see $work.build.log)" >&2; exit 2
}
rm -rf "$tree" "$work/logs"
mkdir -p "$tree" "$work/logs" "$work/saved"
git ls-files -z --cached --others --exclude-standard | grep -zv '^build/' | xargs -0 tar cf - 2>/dev/null | tar xf - -C "$tree"
mkdir -p "$tree/build/release" "$tree/bin"
cp -a build/release/obj build/release/libservelab.a build/release/libservelab_core.a "$tree/build/release/"
cp -a bin/servelab "$tree/bin/"
find "$tree/build" "$tree/bin" -type f -exec touch {} +
mbin=$tree/bin/servelab

results=$work/results.tsv
: >"$results"
errors=0
for n in $names; do
    file=$(field "$n" file) area=$(field "$n" area) what=$(field "$n" description)
    log=$work/logs/$n
    mkdir -p "$log"
    if [ -z "$file" ] || [ ! -f "$file" ]; then
        echo "mutants.sh: mutant $n: its '# file:' ($file) is not a file of this tree" >&2
        printf '%s\t%s\t%s\t%s\n' "$n" "$area" "ERROR" "no such file '$file'" >>"$results"; errors=$((errors + 1)); continue
    fi
    if ! apply_mutant "$n" "$file" "$work/mutated" 2>"$log/apply.err"; then
        cat "$log/apply.err" >&2
        printf '%s\t%s\t%s\t%s\n' "$n" "$area" "ERROR" "$(head -n 1 "$log/apply.err")" >>"$results"; errors=$((errors + 1)); continue
    fi
    obj=build/release/obj/${file%.c}.o
    case $file in *.c) cp -p "$tree/$obj" "$work/saved/object.o" ;; esac
    cp "$work/mutated" "$tree/$file"
    printf 'mutant %-28s %-14s building ... ' "$n" "$area"
    if ! make --no-print-directory -C "$tree" -j"$JOBS" bin/servelab >"$log/build.log" 2>&1; then
        echo "does not compile"
        echo "mutants.sh: mutant $n does not compile (see $log/build.log)" >&2
        printf '%s\t%s\t%s\t%s\n' "$n" "$area" "ERROR" "does not compile" >>"$results"; errors=$((errors + 1))
    else
        printf 'lessons ... '
        caught="" detail=""
        for lesson in $lesson_glob; do
            name=$(basename "$lesson" .lua)
            timeout -k 5 $((LESSON_LIMIT * 3)) "$mbin" lesson run "$lesson" --headless --audit \
                --time-limit "$LESSON_LIMIT" --output "$work/lesson-output" >"$log/$name.out" 2>&1 </dev/null
            status=$?
            disagree=$(grep -m 1 '^DISAGREE' "$log/$name.out" | sed 's/^DISAGREE \([^ ]*\) .*/\1/')
            audit=$(grep -m 1 -o 'audit: .*' "$log/$name.out" | cut -c 1-110)
            failed=$(grep -m 1 '^FAIL' "$log/$name.out" | sed 's/^FAIL \([^ ]*\) .*/\1/')
            if [ -n "$disagree" ]; then
                caught=${caught:-claim} detail="$detail${detail:+; }$name $disagree DISAGREE"
            elif [ -n "$audit" ]; then
                [ "$caught" = claim ] || caught=audit
                detail="$detail${detail:+; }$name $audit"
            elif [ "$status" -ge 124 ] || [ -n "$failed" ] || [ "$status" -ne 0 ]; then
                [ -n "$caught" ] || caught=guard
                why="exit $status"; [ -n "$failed" ] && why="$failed FAIL: $(grep -m 1 '^FAIL' "$log/$name.out" | sed 's/.* -- //' | cut -c 1-80)"
                detail="$detail${detail:+; }$name $why"
            fi
            [ "$quick" = 1 ] && [ -n "$caught" ] && break
        done
        if [ -z "$caught" ] && [ "$run_tests" = 1 ]; then
            printf 'unit tests ... '
            for t in $MUTANT_TESTS; do
                [ -f "$t.c" ] || continue
                make --no-print-directory -C "$tree" -j"$JOBS" "build/release/$t" >>"$log/build.log" 2>&1 || {
                    caught=test detail="$t does not build"; break; }
                tlog=$log/$(basename "$t").out
                if ! SERVELAB_AUDIT=1 SERVELAB_BIN=$mbin timeout -k 5 600 "$tree/build/release/$t" >"$tlog" 2>&1 </dev/null; then
                    caught=test detail="$t: $(grep -m 1 -E '^\[ +FAILED +\] [a-z_]' "$tlog" | sed 's/^\[ *FAILED *\] //' | cut -c 1-100)"
                    [ "$detail" = "$t: " ] && detail="$t: exit status $(tail -n 1 "$tlog" | cut -c 1-80)"
                    break
                fi
            done
        fi
        [ -n "$caught" ] || caught=survived
        echo "$caught"
        printf '%s\t%s\t%s\t%s\n' "$n" "$area" "$caught" "$detail" >>"$results"
    fi
    # Back to the unmutated source and object: the next mutant is one compile again.
    cp -p "$file" "$tree/$file"
    case $file in *.c) cp "$work/saved/object.o" "$tree/$obj" && touch "$tree/$obj" ;; *) touch "$tree/$file" ;; esac
    printf '%s\n' "$what" >"$log/description"
done

echo
printf '%-30s %-14s %-9s %s\n' MUTANT AREA CAUGHT-BY DETAIL
awk -F '\t' '{ printf "%-30s %-14s %-9s %s\n", $1, $2, $3, $4 }' "$results"
count() { awk -F '\t' -v k="$1" '$3 == k' "$results" | wc -l | tr -d ' '; }
total=$(wc -l <"$results" | tr -d ' ')
echo
echo "mutants: $total; caught by a lesson claim $(count claim), by the audit $(count audit), by a guard or crash" \
    "$(count guard), only by a unit test $(count test), survived $(count survived), errors $(count ERROR)"
[ "$errors" -gt 0 ] && exit 2
[ "$(count survived)" -gt 0 ] && exit 1
exit 0
