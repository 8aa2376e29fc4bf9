#!/bin/sh
# Regenerates the claim -> faults table in lessons/README.md from what the
# lessons declare (lab.check's breaks_with). Run from the repository root:
#   scripts/update-fault-table.sh [path/to/servelab]
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
echo "lessons/README.md: fault table regenerated ($(grep -c '^| ' "$table") rows)"
