#!/usr/bin/env bash
# Copy the result tables of a finished `posbench run ci` into the committed baseline.
#   scripts/refresh_baseline.sh [SOURCE_DIR] [BASELINE_DIR]
# Defaults: runs/ci -> results/baseline/ci. Only tables and provenance are copied, never weights.
set -euo pipefail
src=${1:-runs/ci}
dest=${2:-results/baseline/ci}
for f in extrapolation.csv runs.csv provenance.json; do
  if [ ! -f "$src/$f" ]; then
    echo "error: $src/$f is missing; run 'posbench run ci --out $src' first" >&2
    exit 2
  fi
done
mkdir -p "$dest"
cp "$src/extrapolation.csv" "$src/runs.csv" "$src/provenance.json" "$dest/"
[ -f "$src/report.md" ] && cp "$src/report.md" "$dest/"
[ -f "$src/extrapolation.png" ] && cp "$src/extrapolation.png" "$dest/"
echo "baseline refreshed in $dest from $src"
