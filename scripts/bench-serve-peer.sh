#!/bin/sh
# servelab serve against llama.cpp's llama-server on the same GGUF file,
# measured by the same client (servelab bench-serve) with the same workload
# (issue 32): the servers run in turn, interleaved (servelab, llama.cpp,
# servelab, llama.cpp, ...), each on 2 threads, and the side-by-side table
# gives the median over the rounds. Then the lab's points on servelab serve
# alone: paged against contiguous KV, chunked prefill on and off, prefix
# caching on and off.
#
# usage: scripts/bench-serve-peer.sh LLAMA_SERVER MODEL.gguf
#   LLAMA_SERVER  path of llama.cpp's llama-server (built elsewhere; this
#                 script never builds llama.cpp)
#   MODEL.gguf    e.g. stories110m-f16.gguf (servelab serve loads it too)
# environment:
#   SERVELAB=bin/servelab  the servelab binary
#   ROUNDS=2               interleaved rounds per server
#   LAB_POINTS=1           0 skips the servelab-only lab points
#   KEEP=DIR               keep every bench-serve report in DIR
#   CONCURRENCIES=1,4,16,32  the sweep (ascending; llama-server gets -np of the last)
#
# Sized for about 8 minutes on 2 idle cores (stories110m fp16): prompts of
# 64 tokens, 64 output tokens, max(8, 2 x C) requests at concurrency C.
# Prints markdown, ready to paste.
set -u

if [ $# -ne 2 ]; then
    echo "usage: $0 LLAMA_SERVER MODEL.gguf (see the comment at the top)" >&2
    exit 2
fi
llama_server=$1
model=$2
servelab=${SERVELAB:-bin/servelab}
rounds=${ROUNDS:-2}
lab_points=${LAB_POINTS:-1}
[ -x "$llama_server" ] || { echo "$0: $llama_server is not an executable (llama-server)" >&2; exit 2; }
[ -r "$model" ] || { echo "$0: cannot read $model" >&2; exit 2; }
[ -x "$servelab" ] || { echo "$0: $servelab is not built (make, or set SERVELAB=...)" >&2; exit 2; }
command -v curl >/dev/null 2>&1 || { echo "$0: needs curl, to wait for llama-server's /health" >&2; exit 2; }

threads=2
concurrencies=${CONCURRENCIES:-1,4,16,32}
max_concurrency=${concurrencies##*,}
prompt_tokens=64
output_tokens=64
# KV memory is the same for both: llama-server's -c 8192 f16 cache is
# 12 layers x 2 (K, V) x 768 x 2 bytes x 8192 tokens = 288 MiB, room for
# 32 slots of 256 tokens (each request needs 128).
context_tokens=8192
kv_mem=288MiB

work=${KEEP:-$(mktemp -d)}
mkdir -p "$work"
server_pid=

stop_server() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null
        wait "$server_pid" 2>/dev/null
        server_pid=
    fi
}
cleanup() {
    stop_server
    [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# servelab serve with extra options; sets url.
# --read-timeout 600, llama-server's own default: with serve's 10 s a request
# still queued after 10 s had its connection closed (52 of 64 at concurrency
# 32 with contiguous KV on a loaded machine).
start_servelab() {
    "$servelab" serve --port 0 --model "$model" --threads "$threads" --read-timeout 600 "$@" \
        >"$work/serve.out" 2>"$work/serve.err" &
    server_pid=$!
    i=0
    while [ $i -lt 240 ]; do
        port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/serve.out")
        if [ -n "$port" ]; then
            url=http://127.0.0.1:$port
            return 0
        fi
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.5
        i=$((i + 1))
    done
    echo "$0: servelab serve did not start: $(cat "$work/serve.err")" >&2
    exit 1
}

start_llama() {
    port=$((20000 + $$ % 20000))
    "$llama_server" -m "$model" --host 127.0.0.1 --port "$port" -np "$max_concurrency" -c "$context_tokens" \
        -t "$threads" -tb "$threads" -cb >"$work/llama.out" 2>&1 &
    server_pid=$!
    url=http://127.0.0.1:$port
    i=0
    while [ $i -lt 240 ]; do
        curl -sf "$url/health" >/dev/null 2>&1 && return 0
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.5
        i=$((i + 1))
    done
    echo "$0: llama-server did not become healthy: $(tail -5 "$work/llama.out")" >&2
    exit 1
}

# bench-serve with the given options against $url; the markdown table into $1.
# The idle and total limits make a stuck server cost minutes, not the night.
bench() {
    out=$1
    shift
    "$servelab" bench-serve --url "$url" --prompt-len "$prompt_tokens" --output-len "$output_tokens" --seed 1 \
        --idle-timeout 120 --timeout 600 "$@" >"$out" 2>"$out.err"
    status=$?
    if [ $status -ne 0 ]; then
        echo "note: bench-serve exited $status for $(basename "$out"): $(tail -2 "$out.err")" >&2
    fi
}

echo "servelab bench-serve against llama-server: $rounds rounds, interleaved; reports in $work" >&2
round=1
while [ "$round" -le "$rounds" ]; do
    for server in servelab llama; do
        echo "round $round of $rounds: $server" >&2
        if [ $server = servelab ]; then start_servelab --kv-mem "$kv_mem"; else start_llama; fi
        bench "$work/$server.$round.md" --sweep-concurrency "$concurrencies"
        stop_server
    done
    round=$((round + 1))
done

if [ "$lab_points" = 1 ]; then
    echo "lab points: paged / contiguous, chunked prefill, prefix caching" >&2
    # The same 128 MiB of KV: contiguous reserves each request's 1024-token
    # maximum (3 at once), paged only the blocks in use.
    start_servelab --kv-mem 128MiB
    bench "$work/lab.paged.md" --sweep-concurrency 32
    stop_server
    start_servelab --kv-mem 128MiB --kv contiguous
    bench "$work/lab.contiguous.md" --sweep-concurrency 32
    stop_server
    # Long prompts (up to 768 tokens) arriving at 4/s among decoding
    # requests, 128 tokens a step: unchunked, a 768-token prompt stalls
    # every decoder for one long step.
    for chunking in on off; do
        flag=; [ $chunking = off ] && flag=--no-chunked-prefill
        start_servelab --kv-mem "$kv_mem" --max-batched-tokens 128 $flag
        prompt_tokens=uniform:32:768
        bench "$work/lab.chunked-$chunking.md" --sweep-concurrency 16 --rate 4 --requests 24
        prompt_tokens=64
        stop_server
    done
    # A 256-token system prompt shared by every request.
    for caching in on off; do
        flag=; [ $caching = off ] && flag=--no-prefix-caching
        start_servelab --kv-mem "$kv_mem" $flag
        prompt_tokens=320 output_tokens=16
        bench "$work/lab.prefix-$caching.md" --sweep-concurrency 4 --shared-prefix 256 --requests 16
        prompt_tokens=64 output_tokens=64
        stop_server
    done
fi

# ---- the tables ------------------------------------------------------------------

# Rows "| C | requests | failed | req/s | out tok/s | TTFT p50 | TTFT p99 |
# TPOT p50 | TPOT p99 | ITL p99 | E2E p50 |" of each report, prefixed
# with the server's name; medians over the rounds by awk (portable: no asort).
for server in servelab llama; do
    round=1
    while [ "$round" -le "$rounds" ]; do
        grep '^| [0-9]' "$work/$server.$round.md" 2>/dev/null | sed "s/^/$server /"
        round=$((round + 1))
    done
done >"$work/rows.txt"

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1)
echo "### servelab serve and llama-server, $(basename "$model"), $(date -u '+%Y-%m-%d %H:%M UTC')"
echo
echo "Machine: ${cpu:-unknown CPU}, $(nproc) cores; load before the table: $(uptime | sed 's/.*load average: //')."
echo "Both servers on $threads threads, one at a time, interleaved over $rounds rounds; each figure is the median"
echo "of the $rounds rounds. Workload: prompts of 64 tokens (ids), 64 output tokens (ignore_eos), max(8, 2 x C)"
echo "requests at concurrency C, all sent at once. llama-server: -np $max_concurrency -c $context_tokens -cb;"
echo "servelab serve: --kv-mem $kv_mem (the same KV memory)."
echo
awk -v order_list="$(echo "$concurrencies" | tr , ' ')" '
function median(key,    n, i, j, v, held) {
    n = count[key]
    if (n == 0) return "-"
    for (i = 1; i <= n; i++) v[i] = values[key, i]
    for (i = 2; i <= n; i++) { held = v[i]; for (j = i - 1; j >= 1 && v[j] > held; j--) v[j + 1] = v[j]; v[j + 1] = held }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
function add(key, value) { count[key]++; values[key, count[key]] = value + 0 }
{
    split($0, f, "|"); server = $1; c = f[2] + 0
    seen[c] = 1
    add(server SUBSEP c SUBSEP "tput", f[6]); add(server SUBSEP c SUBSEP "ttft50", f[7])
    add(server SUBSEP c SUBSEP "ttft99", f[8]); add(server SUBSEP c SUBSEP "tpot50", f[9])
    failed[server SUBSEP c] += f[4]
}
END {
    print "| concurrency | servelab out tok/s | llama-server out tok/s | servelab TTFT p50 ms | llama-server TTFT p50 ms | servelab TTFT p99 ms | llama-server TTFT p99 ms | servelab TPOT p50 ms | llama-server TPOT p50 ms |"
    print "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    n_order = split(order_list, order, " ")
    for (k = 1; k <= n_order; k++) {
        c = order[k]
        if (!(c in seen)) continue
        printf "| %d", c
        split("tput ttft50 ttft99 tpot50", metric, " ")
        for (m = 1; m <= 4; m++)
            for (s = 1; s <= 2; s++) {
                server = s == 1 ? "servelab" : "llama"
                value = median(server SUBSEP c SUBSEP metric[m])
                printf " | %s", value == "-" ? "-" : sprintf("%.1f", value)
            }
        printf " |\n"
    }
    for (key in failed) if (failed[key] > 0) { split(key, part, SUBSEP); printf "\nfailed requests: %s at concurrency %d: %d (see the reports)\n", part[1], part[2], failed[key] }
}' "$work/rows.txt"

if [ "$lab_points" = 1 ]; then
    echo
    echo "### The lab's points, servelab serve alone (one run each)"
    echo
    echo "| experiment | run | concurrency | requests | failed | output tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | ITL p99 ms |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    for entry in "paged KV vs contiguous, 128 MiB of KV:paged:lab.paged" \
        "paged KV vs contiguous, 128 MiB of KV:contiguous:lab.contiguous" \
        "chunked prefill, prompts up to 768 at 4/s, 128 tokens/step:on:lab.chunked-on" \
        "chunked prefill, prompts up to 768 at 4/s, 128 tokens/step:off:lab.chunked-off" \
        "prefix caching, 256-token shared system prompt:on:lab.prefix-on" \
        "prefix caching, 256-token shared system prompt:off:lab.prefix-off"; do
        what=${entry%%:*}
        rest=${entry#*:}
        run=${rest%%:*}
        file=${rest#*:}
        grep '^| [0-9]' "$work/$file.md" 2>/dev/null | head -1 |
            awk -F'|' -v what="$what" -v run="$run" '{ printf "| %s | %s | %d | %d | %d | %.1f | %.1f | %.1f | %.2f | %.2f |\n", what, run, $2, $3, $4, $6, $7, $8, $9, $11 }'
    done
fi
