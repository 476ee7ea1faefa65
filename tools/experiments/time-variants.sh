#!/usr/bin/env bash
# Time kernel variants beside the shipped kernels in one run on a TPU: each variant is a copy of this
# tree with one experiment's diff applied (none for the shipped kernels), measured by tools/tpu-measure.py
# into OUT/<name>.json with commit "<COMMIT>+<name>". Variants run in the order given, so put the
# shipped kernels first: a variant counts as faster only against a kernel timed in the same run.
#
#   tools/experiments/time-variants.sh OUT COMMIT DEADLINE_S 'name|diff or empty|tpu-measure arguments' ...
#
# DEADLINE_S bounds the whole run: each variant gets what is left (tpu-measure's --deadline-s), so
# every variant started writes its rows.
set -u
out=$1 commit=$2 deadline=$3
shift 3
start=$(date +%s)
for spec in "$@"; do
    IFS='|' read -r name diff args <<< "$spec"
    left=$(( deadline - ($(date +%s) - start) ))
    if (( left < 30 )); then echo "time-variants: no time left for $name"; continue; fi
    tree=$(mktemp -d)/tree
    cp -r . "$tree"
    if [[ -n "$diff" ]] && ! (cd "$tree" && git apply "$diff"); then
        echo "time-variants: $diff does not apply; $name skipped"; continue
    fi
    echo "== $name (${diff:-shipped}), $left s left"
    # shellcheck disable=SC2086  # the measure's arguments are words
    (cd "$tree" && python3 tools/tpu-measure.py --parts forward --unroll chosen $args \
        --out "$out/$name.json" --commit "$commit+$name" --deadline-s "$left")
done
