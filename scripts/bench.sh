#!/usr/bin/env bash
# Builds the benchmarks (Release) and runs one suite with the settings the docs quote:
#   bash scripts/bench.sh reader      # bench_reader: BM_read*, BM_inflate*
#   bash scripts/bench.sh replay      # bench_replay (once the replay engine exists)
#   bash scripts/bench.sh scale       # the 512-rank job of issue 14: lumos synth, replay (five
#                                     # runs and their median) and inspect timed with their peak
#                                     # RSS (/usr/bin/time), replay also with LUMOS_HUGE_PAGES=1, then
#                                     # replay's phases (bench/scale_phases.cpp), with the default
#                                     # build threads and with one
#   bash scripts/bench.sh touch       # first writes to fresh memory, with and without huge pages
#                                     # (bench/first_touch.cpp; why the CLI turns huge pages off)
# Extra arguments go to Google Benchmark (e.g. --benchmark_filter=BM_read_mem).
set -euo pipefail
cd "$(dirname "$0")/.."
suite=${1:-reader}
shift || true
cmake --preset bench >/dev/null
if [ "$suite" = touch ]; then
  cmake --build --preset bench --target first_touch >/dev/null
  exec build/bench/bench/first_touch "$@"
fi
if [ "$suite" = scale ]; then
  # GPT-3 175B on 512 GPUs (TP 8 x PP 8 x DP 8, 32 micro-batches), every rank written.
  cmake --build --preset bench --target lumos scale_phases >/dev/null
  lumos=build/bench/examples/lumos
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  timed() {  # label, command...: wall seconds and peak resident memory of one run
    local label=$1
    shift
    /usr/bin/time -f "%e %M" -o "$dir/time" "$@" >"$dir/out" 2>&1 || { cat "$dir/out"; exit 1; }
    read -r wall kb <"$dir/time"
    printf '%-9s %8.2f s  %8.0f MiB peak RSS\n' "$label" "$wall" "$(awk -v k="$kb" 'BEGIN { print k / 1024 }')"
  }
  echo "lumos synth --model gpt3-175b --tp 8 --pp 8 --dp 8 --global-batch 256 --unfold --gzip; $(nproc) cores"
  timed synth "$lumos" synth --model gpt3-175b --tp 8 --pp 8 --dp 8 --global-batch 256 --unfold --gzip --out "$dir/job"
  printf '%-9s %8s MiB on disk, %s files\n' traces "$(du -sm "$dir/job" | cut -f1)" "$(ls "$dir/job" | wc -l)"
  # A baseline from the same run, since the machines of this kind differ by twice and more from
  # one session to the next: gzip -dc of every file of the job, one process per core.
  timed baseline sh -c "ls '$dir/job'/*.json.gz | xargs -P $(nproc) -n 16 gzip -dc >/dev/null"
  baseline=$wall
  # Five runs of replay, the median reported with the range: on this kind of machine (a
  # virtual one whose freed memory goes back to the host) one run varies by a tenth or more, the
  # first after synth most (its 2.2 GB have just been freed).
  walls=()
  for i in 1 2 3 4 5; do
    timed "replay#$i" "$lumos" replay "$dir/job"
    walls+=("$wall")
  done
  printf '%s\n' "${walls[@]}" | sort -n | awk -v b="$baseline" '{ w[NR] = $1 } END {
    m = w[(NR + 1) / 2]
    printf "replay    %8.2f s  median of %d runs (%.2f to %.2f s)\n", m, NR, w[1], w[NR]
    printf "replay    %8.2f x the baseline (median)\n", m / b }'
  timed replay+hp env LUMOS_HUGE_PAGES=1 "$lumos" replay "$dir/job"  # huge pages (allocator.hpp)
  timed inspect "$lumos" inspect "$dir/job"
  build/bench/bench/scale_phases "$dir/job"
  build/bench/bench/scale_phases "$dir/job" 1
  exit 0
fi
cmake --build --preset bench --target "bench_${suite}" >/dev/null
exec "build/bench/bench/bench_${suite}" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_min_time=0.5 "$@"
