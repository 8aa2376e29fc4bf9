#!/bin/sh
# curl against `servelab serve`: a completion, a streamed chat, an error.
# Starts its own server on a free loopback port (--port 0) and stops it.
#   sh tests/serve/curl_test.sh   (SERVELAB_BIN, SERVELAB_MODEL from the environment)
set -u
bin=${SERVELAB_BIN:-bin/servelab}
model=${SERVELAB_MODEL:-../shared/models/stories260K.bin}
scratch=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$scratch"' EXIT
"$bin" serve --port 0 --model "$model" --kv-dtype fp32 >"$scratch/out" 2>"$scratch/err" &
pid=$!
port=""
for _ in $(seq 300); do
    port=$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\).*/\1/p' "$scratch/out")
    [ -n "$port" ] && break
    sleep 0.2
done
fail() { echo "FAIL: $*"; exit 1; }
[ -n "$port" ] || fail "no port line: $(cat "$scratch/out" "$scratch/err")"
url=http://127.0.0.1:$port
c() { curl -sS --max-time 60 "$@"; }

echo "\$ curl $url/v1/completions -d '{\"model\":\"stories260K\",\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":0}'"
out=$(c "$url/v1/completions" -H 'Content-Type: application/json' \
      -d '{"model":"stories260K","prompt":"Once upon a time","max_tokens":12,"temperature":0}') || fail "curl failed"
echo "$out"
echo "$out" | grep -q '"text":", there was a little girl named Lily' || fail "unexpected completion"
echo "$out" | grep -q '"usage":{"prompt_tokens":5,"completion_tokens":12,"total_tokens":17}' || fail "usage"

echo "\$ curl -N $url/v1/chat/completions -d '{...\"stream\":true}'"
out=$(c -N "$url/v1/chat/completions" -H 'Content-Type: application/json' \
      -d '{"model":"stories260K","messages":[{"role":"user","content":"Hi"}],"max_tokens":6,"temperature":0,"stream":true}') ||
    fail "curl failed"
echo "$out"
echo "$out" | head -n 1 | grep -q '^data: {.*"delta":{"role":"assistant","content":""}' || fail "first chunk"
echo "$out" | grep -q '"finish_reason":"length"' || fail "no finish_reason"
[ "$(echo "$out" | tail -n 1)" = "data: [DONE]" ] || fail "not ended by data: [DONE]"

echo "\$ curl -w '%{http_code}' $url/v1/completions -d '{\"model\":\"stories260K\",\"prompt\":\"Hi\",\"max_tokens\":0}'"
out=$(c -w ' %{http_code}' "$url/v1/completions" -d '{"model":"stories260K","prompt":"Hi","max_tokens":0}')
echo "$out"
echo "$out" | grep -q '"param":"max_tokens".* 400$' || fail "expected a 400 naming max_tokens"

out=$(c "$url/health") || fail "health"
echo "$out" | grep -q '"kv_blocks_used":0' || fail "blocks still used: $out"
kill "$pid"
wait "$pid"
status=$?
[ "$status" -eq 0 ] || fail "serve exited with $status: $(cat "$scratch/err")"
pid=""
echo "PASS: curl"
