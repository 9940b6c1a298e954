#!/usr/bin/env bash
# Runs every cargo-fuzz target for N seconds (default 60), one after another, and stops at the
# first crash (cargo-fuzz leaves the input under fuzz/artifacts/<target>/; turn each into a test
# under tests/). Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
#   fuzz/run.sh 60            every target, 60 s each
#   fuzz/run.sh 60 openai     one target
set -euo pipefail
seconds=${1:-60}
shift || true
cd "$(dirname "$0")"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
for target in "${targets[@]}"; do
    echo "fuzz: $target for ${seconds}s" >&2
    mkdir -p "corpus/$target"
    # -rss_limit_mb: the deep-nesting inputs are meant to be refused, not to exhaust memory.
    cargo +nightly fuzz run "$target" "corpus/$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1
done
