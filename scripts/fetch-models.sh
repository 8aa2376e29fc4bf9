#!/bin/sh
# Fetches the tinyllamas checkpoints that servelab can run, for users with
# internet access. Nothing in the build or the tests needs them.
set -u
dir=${1:-models}
base=https://huggingface.co/karpathy/tinyllamas/resolve/main
tok=https://raw.githubusercontent.com/karpathy/llama2.c/master
mkdir -p "$dir"
fetch() { # url dest
    if [ -s "$2" ]; then echo "models: $2 already present"; return 0; fi
    if command -v curl >/dev/null 2>&1; then
        curl -fsSL --connect-timeout 15 -o "$2.part" "$1"
    elif command -v wget >/dev/null 2>&1; then
        wget -q -T 15 -O "$2.part" "$1"
    else
        echo "models: neither curl nor wget is installed" >&2; return 1
    fi || { rm -f "$2.part"; echo "models: could not download it (no network?); fetch it by hand: $1 -> $2" >&2; return 1; }
    mv "$2.part" "$2" && echo "models: fetched $2"
}
ok=0
fetch "$base/stories260K/stories260K.bin" "$dir/stories260K.bin" || ok=1
fetch "$base/stories260K/tok512.bin" "$dir/tok512.bin" || ok=1
fetch "$base/stories15M.bin" "$dir/stories15M.bin" || ok=1
fetch "$tok/tokenizer.bin" "$dir/tokenizer.bin" || ok=1
if [ $ok -ne 0 ]; then
    echo "models: some downloads failed; servelab still runs on its synthetic presets (--model small)" >&2
    exit 1
fi
