#!/usr/bin/env bash
# Builds the benchmarks (Release) and runs one suite with the settings the docs quote:
#   bash scripts/bench.sh reader      # bench_reader: BM_read*, BM_inflate*
#   bash scripts/bench.sh replay      # bench_replay (once the replay engine exists)
# Extra arguments go to Google Benchmark (e.g. --benchmark_filter=BM_read_mem).
set -euo pipefail
cd "$(dirname "$0")/.."
suite=${1:-reader}
shift || true
cmake --preset bench >/dev/null
cmake --build --preset bench --target "bench_${suite}" >/dev/null
exec "build/bench/bench/bench_${suite}" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_min_time=0.5 "$@"
