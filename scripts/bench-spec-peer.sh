#!/bin/sh
# Speculative decoding in servelab beside llama.cpp's (issue 45, item 6):
# decode tokens per second with and without speculation, for a quantized
# draft of the same model and for prompt lookup, on the same GGUF file,
# each program on 2 threads, greedy, in interleaved runs (servelab,
# llama.cpp, servelab, llama.cpp, ...). Each figure is the median over the
# rounds, with the range; acceptance is guesses kept / guesses drafted.
#
# usage: scripts/bench-spec-peer.sh LLAMA_BIN_DIR [MODEL.gguf]
#   LLAMA_BIN_DIR  llama.cpp's build/bin, with llama-cli, llama-speculative,
#                  llama-lookup and llama-quantize (built elsewhere, never in
#                  this repository; this script builds nothing)
#   MODEL.gguf     default ../shared/gguf/stories260K-f32.gguf
# environment:
#   SERVELAB=bin/servelab  the servelab binary
#   ROUNDS=5               interleaved rounds
#   TOKENS=128             new tokens per run
#   K=4                    guesses per step, both programs
#   THREADS=2              threads of each program (llama.cpp: -t and -td)
#   KEEP=DIR               keep every run's output in DIR
#
# The drafts differ, and the table says how:
#   servelab   draft:w4a16:g32:kK: the project's own RTN quantizer, 4-bit
#              weights with an fp16 scale per 32, made at load time.
#   llama.cpp  llama-quantize Q3_K_S of the same file, written into build/:
#              stories260K's rows of 64 and 172 are not multiples of 256, so
#              llama-quantize falls back to IQ4_NL (4-bit, a scale per 32)
#              for 31 matrices, F16 for the 5 ffn_down (172 columns) and Q8_0
#              for the output; Q4_0 and Q8_0 refuse the 172 columns outright.
#   lookup     servelab lookup:2:kK (the last 2 tokens matched); llama-lookup
#              with --draft-max K (its n-grams of 1 to 4 tokens).
# On a machine shared with other work, llama.cpp's threads wait for each
# other at every operation of the graph: at a load of 12 on 2 cores,
# llama-cli on stories260K ran 28 tok/s on 2 threads and 7959 on 1. Run
# THREADS=1 beside the 2-thread table there.
# Decode time is what each program calls decode: servelab, the wall time of
# its steps after the prefill step (from --trace), over the tokens they
# appended; llama-cli, its eval time; llama-speculative and llama-lookup,
# their "decoded N tokens in T seconds" (draft passes included).
set -u

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 LLAMA_BIN_DIR [MODEL.gguf] (see the comment at the top)" >&2
    exit 2
fi
llama_bin=$1
model=${2:-../shared/gguf/stories260K-f32.gguf}
servelab=${SERVELAB:-bin/servelab}
rounds=${ROUNDS:-5}
tokens=${TOKENS:-128}
k=${K:-4}
threads=${THREADS:-2}
prompt="Once upon a time, there was a little girl named Lily. She loved to play"
for tool in llama-cli llama-speculative llama-lookup llama-quantize; do
    [ -x "$llama_bin/$tool" ] || { echo "$0: $llama_bin/$tool is not an executable (llama.cpp's build/bin)" >&2; exit 2; }
done
[ -r "$model" ] || { echo "$0: cannot read $model" >&2; exit 2; }
[ -x "$servelab" ] || { echo "$0: $servelab is not built (make, or set SERVELAB=...)" >&2; exit 2; }

work=${KEEP:-$(mktemp -d)}
mkdir -p "$work" build/spec-peer
cleanup() { [ -n "${KEEP:-}" ] || rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

draft=build/spec-peer/$(basename "$model" .gguf)-q3_k_s.gguf
if [ ! -s "$draft" ]; then
    "$llama_bin/llama-quantize" "$model" "$draft" Q3_K_S >"$work/quantize.log" 2>&1 ||
        { echo "$0: llama-quantize failed: $(tail -3 "$work/quantize.log")" >&2; exit 1; }
fi

# ---- one run of each, printing "TOKENS SECONDS DRAFTED ACCEPTED" -----------------------

# servelab generate with --trace: the steps after the prefill step, their
# wall time, and the tokens they appended (a verifying step appends its
# "emitted" tokens; a plain decode step one per decode row).
servelab_run() {
    name=$1
    shift
    "$servelab" generate --model "$model" --prompt "$prompt" -n "$tokens" --threads "$threads" \
        --trace "$work/$name.trace" "$@" >"$work/$name.out" 2>"$work/$name.err" ||
        { echo "$0: servelab generate $*: $(tail -2 "$work/$name.err")" >&2; echo "- - - -"; return; }
    awk '
    function field(name,    at, rest) {
        at = index($0, "\"" name "\":")
        if (at == 0) return -1
        rest = substr($0, at + length(name) + 3)
        return rest + 0
    }
    field("prefill_tokens") == 0 {
        ns += field("wall_ns")
        drafted_now = field("drafted") # the step-level spec group comes before the sequences
        if (drafted_now > 0) { appended += field("emitted"); drafted += drafted_now; accepted += field("accepted") }
        else appended += field("decode_tokens")
    }
    END { if (ns > 0) printf "%d %.6f %d %d\n", appended, ns / 1e9, drafted, accepted; else print "- - - -" }
    ' "$work/$name.trace"
}

llama_common="-m $model -p \"$prompt\" -n $tokens -t $threads --temp 0 --top-k 1 -c 512 -s 1"

llama_plain() {
    name=$1
    eval "\"$llama_bin/llama-cli\" $llama_common -no-cnv --no-warmup" </dev/null >"$work/$name.out" 2>"$work/$name.err"
    # "eval time =    1802.21 ms /   127 runs   (...)": the decode steps after the prompt.
    sed -n 's/.*[^t] eval time = *\([0-9.]*\) ms \/ *\([0-9]*\) runs.*/\2 \1/p' "$work/$name.err" |
        awk '{ printf "%d %.6f 0 0\n", $1, $2 / 1000 } END { if (NR == 0) print "- - - -" }'
}

# llama-speculative and llama-lookup end with "decoded N tokens in T seconds",
# n_drafted and n_accept.
llama_spec_numbers() {
    awk '
    /decoded .* tokens in .* seconds/ { for (i = 1; i <= NF; i++) { if ($i == "decoded") n = $(i + 1); if ($i == "in") t = $(i + 1) } }
    /^n_drafted/ { d = $NF }
    /^n_accept/ { a = $NF }
    END { if (n == "") print "- - - -"; else printf "%d %.6f %d %d\n", n, t, d, a }
    ' "$1"
}

llama_draft() {
    name=$1
    eval "\"$llama_bin/llama-speculative\" $llama_common -md $draft -td $threads --draft-max $k --draft-min 0 --draft-p-min 0" \
        </dev/null >"$work/$name.out" 2>"$work/$name.err"
    llama_spec_numbers "$work/$name.err"
}

llama_lookup() {
    name=$1
    eval "\"$llama_bin/llama-lookup\" $llama_common --draft-max $k" </dev/null >"$work/$name.out" 2>"$work/$name.err"
    llama_spec_numbers "$work/$name.err"
}

echo "servelab generate and llama.cpp, $rounds rounds interleaved, $tokens tokens, k = $k; runs in $work" >&2
round=1
: >"$work/rows.txt"
while [ "$round" -le "$rounds" ]; do
    for mode in plain draft lookup; do
        echo "round $round of $rounds: $mode" >&2
        case $mode in
        plain) s=$(servelab_run "servelab.$mode.$round") ;;
        draft) s=$(servelab_run "servelab.$mode.$round" --speculative "draft:w4a16:g32:k$k") ;;
        lookup) s=$(servelab_run "servelab.$mode.$round" --speculative "lookup:2:k$k") ;;
        esac
        echo "servelab $mode $s" >>"$work/rows.txt"
        case $mode in
        plain) l=$(llama_plain "llama.$mode.$round") ;;
        draft) l=$(llama_draft "llama.$mode.$round") ;;
        lookup) l=$(llama_lookup "llama.$mode.$round") ;;
        esac
        echo "llama.cpp $mode $l" >>"$work/rows.txt"
    done
    round=$((round + 1))
done

# ---- the table --------------------------------------------------------------------------

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1)
echo "### Speculative decoding: servelab generate and llama.cpp, $(basename "$model"), $(date -u '+%Y-%m-%d %H:%M UTC')"
echo
echo "Machine: ${cpu:-unknown CPU}, $(nproc) cores; load after the runs: $(uptime | sed 's/.*load average: //')."
echo "Each program on $threads threads, greedy, $tokens new tokens after the same prompt, k = $k guesses; $rounds rounds"
echo "interleaved (servelab, llama.cpp, ...); decode tok/s as the median over the rounds [min - max]. Drafts:"
echo "servelab draft:w4a16:g32 (its RTN quantizer at load), llama.cpp $(basename "$draft") (IQ4_NL/F16/Q8_0, see"
echo "the script); lookup: servelab lookup:2, llama-lookup's 1- to 4-grams. llama.cpp: $llama_bin."
echo
awk '
function sorted(key,    n, i, j, held) {
    n = count[key]
    for (i = 1; i <= n; i++) v[i] = values[key, i]
    for (i = 2; i <= n; i++) { held = v[i]; for (j = i - 1; j >= 1 && v[j] > held; j--) v[j + 1] = v[j]; v[j + 1] = held }
    return n
}
function median(key,    n) { n = sorted(key); if (n == 0) return -1; return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
function low(key) { return sorted(key) ? v[1] : -1 }
function high(key,    n) { n = sorted(key); return n ? v[n] : -1 }
$3 != "-" && $4 > 0 {
    key = $1 SUBSEP $2
    count[key]++; values[key, count[key]] = $3 / $4
    tokens[key] += $3; drafted[key] += $5; accepted[key] += $6
}
$3 == "-" { failed[$1 SUBSEP $2]++ }
END {
    print "| program | speculation | decode tok/s, median [range] | runs | tokens per run | guesses kept | acceptance | speedup |"
    print "|---|---|---:|---:|---:|---:|---:|---:|"
    split("servelab llama.cpp", programs, " ")
    split("plain draft lookup", modes, " ")
    for (p = 1; p <= 2; p++) {
        base = median(programs[p] SUBSEP "plain")
        for (m = 1; m <= 3; m++) {
            key = programs[p] SUBSEP modes[m]
            if (count[key] == 0) { printf "| %s | %s | failed (%d runs) | 0 | | | | |\n", programs[p], modes[m], failed[key]; continue }
            rate = median(key)
            acceptance = drafted[key] > 0 ? sprintf("%.1f%%", 100 * accepted[key] / drafted[key]) : "-"
            kept = m > 1 ? sprintf("%d of %d", accepted[key], drafted[key]) : "-"
            speedup = base > 0 && m > 1 ? sprintf("%.2fx", rate / base) : "-"
            printf "| %s | %s | %.1f [%.1f - %.1f] | %d | %.0f | %s | %s | %s |\n", programs[p], modes[m], rate, low(key), high(key),
                count[key], tokens[key] / count[key], kept, acceptance, speedup
        }
    }
}' "$work/rows.txt"
