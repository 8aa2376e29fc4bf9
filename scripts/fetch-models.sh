#!/bin/sh
# Fetches models servelab can run, for users with internet access: the
# tinyllamas checkpoints and one small real GGUF (SmolLM2-135M-Instruct,
# Q8_0, about 145 MB: `servelab generate --model models/<it> --chat`).
# Nothing in the build or the tests needs them. Without a network it says
# so once and exits 1; nothing half-downloaded is left behind.
set -u
dir=${1:-models}
base=https://huggingface.co/karpathy/tinyllamas/resolve/main
tok=https://raw.githubusercontent.com/karpathy/llama2.c/master
smollm=https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/resolve/main/smollm2-135m-instruct-q8_0.gguf
mkdir -p "$dir"
offline=0
fetch() { # url dest
    if [ -s "$2" ]; then echo "models: $2 already present"; return 0; fi
    if [ $offline -ne 0 ]; then return 1; fi
    if command -v curl >/dev/null 2>&1; then
        curl -fsSL --connect-timeout 15 -o "$2.part" "$1"
    elif command -v wget >/dev/null 2>&1; then
        wget -q -T 15 -O "$2.part" "$1"
    else
        echo "models: neither curl nor wget is installed" >&2; offline=1; return 1
    fi
    status=$?
    if [ $status -ne 0 ]; then
        rm -f "$2.part"
        # curl 6/7/28 and wget 4: no name resolution, no connection, timed out
        case $status in 6|7|28|4) offline=1
            echo "models: no network (could not reach $(echo "$1" | cut -d/ -f3)); fetch the files by hand into $dir/" >&2 ;;
        *)  echo "models: could not download $1 -> $2 (exit $status)" >&2 ;;
        esac
        return 1
    fi
    mv "$2.part" "$2" && echo "models: fetched $2"
}
# A GGUF starts with "GGUF": anything else (an error page) is removed.
check_gguf() {
    [ -s "$1" ] || return 1
    if [ "$(head -c 4 "$1")" != "GGUF" ]; then
        echo "models: $1 is not a GGUF file (an error page?); removed" >&2; rm -f "$1"; return 1
    fi
}
ok=0
fetch "$base/stories260K/stories260K.bin" "$dir/stories260K.bin" || ok=1
fetch "$base/stories260K/tok512.bin" "$dir/tok512.bin" || ok=1
fetch "$base/stories15M.bin" "$dir/stories15M.bin" || ok=1
fetch "$tok/tokenizer.bin" "$dir/tokenizer.bin" || ok=1
{ fetch "$smollm" "$dir/smollm2-135m-instruct-q8_0.gguf" && check_gguf "$dir/smollm2-135m-instruct-q8_0.gguf"; } || ok=1
if [ $ok -ne 0 ]; then
    echo "models: some downloads failed; servelab still runs on its synthetic presets (--model small)" >&2
    exit 1
fi
