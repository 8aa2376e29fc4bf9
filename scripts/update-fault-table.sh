#!/bin/sh
# Regenerates the claim -> faults table in lessons/README.md from what the
# lessons declare (lab.check's breaks_with). Run from the repository root:
#   scripts/update-fault-table.sh [path/to/servelab]
# The table says which faults must turn each claim; whether they do is the
# fault matrix's to say (`servelab lesson faults --matrix`), and only a
# DISAGREE counts: a pair whose check FAILs (a guard, an error or a crash
# stopped it) is printed there as "stopped", not turned.
set -eu
servelab=${1:-bin/servelab}
table=$(mktemp)
out=$(mktemp)
trap 'rm -f "$table" "$out"' EXIT
"$servelab" lesson faults --output "${TMPDIR:-/tmp}/servelab-fault-table" lessons/*.lua >"$table"
awk -v table="$table" '
    /^<!-- fault-table: / { print; while ((getline line < table) > 0) print line; skipping = 1; next }
    /^<!-- end fault-table -->/ { skipping = 0 }
    !skipping { print }
' lessons/README.md >"$out"
cat "$out" >lessons/README.md
echo "lessons/README.md: fault table regenerated ($(grep -c '^| ' "$table") rows); \`$servelab lesson faults --matrix\` says which of them turn to DISAGREE"
