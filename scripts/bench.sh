#!/usr/bin/env bash
# Builds the benchmarks (Release) and runs one suite with the settings the docs quote:
#   bash scripts/bench.sh reader      # bench_reader: BM_read*, BM_inflate*
#   bash scripts/bench.sh replay      # bench_replay (once the replay engine exists)
#   bash scripts/bench.sh scale       # the 512-rank job of issue 14: lumos synth, replay (five
#                                     # runs and their median) and inspect timed with their peak
#                                     # RSS (/usr/bin/time), replay also with LUMOS_HUGE_PAGES=1, then
#                                     # replay's phases (bench/scale_phases.cpp), with the default
#                                     # build threads and with one
#   bash scripts/bench.sh whatif      # the 512-rank job with kernel detail: replay and five what-ifs
#                                     # (--scale compute=0.5, --gpu h200-sxm, --layers 48, --dp 16,
#                                     # --pp 16), alternating, three rounds: medians of time and peak
#                                     # RSS, each what-if's ratio to the replay's
#   bash scripts/bench.sh filed       # issue 14's scale targets on this machine: the code the issue
#                                     # measured (7c0b8c7) and this checkout, alternating, on its job
#   bash scripts/bench.sh touch       # first writes to fresh memory, with and without huge pages
#                                     # (bench/first_touch.cpp; why the CLI turns huge pages off)
#   bash scripts/bench.sh release     # whole commands against the previous milestone: `lumos replay
#                                     # TRACE --critical-path` on every single-rank shared trace,
#                                     # its build and this checkout's alternating, three rounds:
#                                     # medians of time and peak RSS, this checkout's ratios
# Extra arguments go to Google Benchmark (e.g. --benchmark_filter=BM_read_mem).
set -euo pipefail
cd "$(dirname "$0")/.."
suite=${1:-reader}
shift || true
cmake --preset bench >/dev/null
# Builds this checkout's lumos (build/bench: $now) and commit $1's in a temporary worktree ($then,
# under $dir, removed on exit); $2 names the suite in errors, $3 what else the old commit needs.
old_beside_head() {
  git cat-file -e "$1^{commit}" 2>/dev/null || { echo "bench.sh $2: needs the history to $1 (a full clone)" >&2; exit 1; }
  cmake --build --preset bench --target lumos >/dev/null
  now=build/bench/examples/lumos
  dir=$(mktemp -d)
  trap 'git worktree remove --force "$dir/src" 2>/dev/null; rm -rf "$dir"' EXIT
  git worktree add --detach "$dir/src" "$1" >/dev/null 2>&1
  cmake -S "$dir/src" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLUMOS_BUILD_TESTS=OFF -DLUMOS_BUILD_PYTHON=OFF >/dev/null ||
    { echo "bench.sh $2: $1 does not configure${3:+ (it needs $3)}" >&2; exit 1; }
  cmake --build "$dir/build" --target lumos >/dev/null
  then=$dir/build/examples/lumos
}
if [ "$suite" = touch ]; then
  cmake --build --preset bench --target first_touch >/dev/null
  exec build/bench/bench/first_touch "$@"
fi
if [ "$suite" = whatif ]; then
  # GPT-3 175B on 512 GPUs with kernel detail (TP 8 x PP 8 x DP 8, 32 micro-batches), every rank
  # written; the what-ifs run on it beside the replay, in turns, so that the machine's drift
  # touches both alike.
  cmake --build --preset bench --target lumos >/dev/null
  lumos=build/bench/examples/lumos
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  echo "lumos synth --model gpt3-175b --tp 8 --pp 8 --dp 8 --global-batch 256 --unfold --gzip --detail kernel; $(nproc) cores"
  "$lumos" synth --model gpt3-175b --tp 8 --pp 8 --dp 8 --global-batch 256 --unfold --gzip --detail kernel --out "$dir/job" >/dev/null
  printf 'traces    %s MiB on disk, %s files\n' "$(du -sm "$dir/job" | cut -f1)" "$(ls "$dir/job" | wc -l)"
  commands=("replay" "whatif --scale compute=0.5" "whatif --gpu h200-sxm" "whatif --layers 48" "whatif --dp 16" "whatif --pp 16")
  : >"$dir/runs"
  for round in 1 2 3; do
    for c in "${commands[@]}"; do
      read -r -a words <<<"$c"
      /usr/bin/time -f "%e %M" -o "$dir/time" "$lumos" "${words[0]}" "$dir/job" "${words[@]:1}" >"$dir/out" 2>&1 || { cat "$dir/out"; exit 1; }
      read -r wall kb <"$dir/time"
      printf '%s\t%s\t%s\n' "$c" "$wall" "$kb" >>"$dir/runs"
    done
  done
  # Medians per command (of 3 runs: the middle one), and each what-if against the replay's.
  median() {  # command, field (2: seconds, 3: KB)
    awk -F '\t' -v c="$1" -v f="$2" '$1 == c { print $f }' "$dir/runs" | sort -n | sed -n 2p
  }
  replay_s=$(median replay 2)
  replay_kb=$(median replay 3)
  printf '%-28s %9s %11s %9s %9s\n' "median of 3 runs" seconds "peak MiB" "x time" "x memory"
  for c in "${commands[@]}"; do
    s=$(median "$c" 2)
    kb=$(median "$c" 3)
    awk -v c="$c" -v s="$s" -v kb="$kb" -v rs="$replay_s" -v rkb="$replay_kb" \
      'BEGIN { printf "%-28s %9.2f %11.0f %9.2f %9.2f\n", c, s, kb / 1024, s / rs, kb / rkb }'
  done
  exit 0
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
if [ "$suite" = release ]; then
  # The previous milestone: the last commit of the section before "Unreleased" in CHANGELOG.md
  # ("Large jobs"); LUMOS_BENCH_BASE names another commit. Needs the history (a full clone).
  base=${LUMOS_BENCH_BASE:-7740157}
  traces=${LUMOS_TRACE_DIR:-../shared/traces}
  [ -d "$traces" ] || { echo "bench.sh release: no shared traces at $traces (set LUMOS_TRACE_DIR)" >&2; exit 1; }
  old_beside_head "$base" release
  # The single-rank sets (the multi-rank ones are jobs of several files, not one trace each).
  mapfile -t files < <(cd "$traces" && find hta_testdata tracelens_H100_B200 -name '*.json.gz' -not -path '*execution_trace*' | sort)
  echo "lumos replay TRACE --critical-path on ${#files[@]} single-rank traces in $traces; $(nproc) cores;" \
       "$base (the previous milestone) against $(git rev-parse --short HEAD)"
  : >"$dir/times"
  for round in 1 2 3; do  # alternating, so that a drift of the machine's speed reaches both alike
    for f in "${files[@]}"; do
      for who in then now; do
        bin=$then; [ "$who" = now ] && bin=$now
        # Wall time from bash's clock (microseconds; /usr/bin/time rounds to 10 ms, longer than
        # the small traces take), peak RSS from /usr/bin/time.
        t0=$EPOCHREALTIME
        /usr/bin/time -f "%M" -o "$dir/time" "$bin" replay "$traces/$f" --critical-path >"$dir/out" 2>&1 || { echo "$who: $f"; cat "$dir/out"; exit 1; }
        t1=$EPOCHREALTIME
        wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f", b - a }')
        read -r kb <"$dir/time"
        printf '%s %s %s %s\n' "$f" "$who" "$wall" "$kb" >>"$dir/times"
      done
    done
  done
  awk '
    { k = $1 SUBSEP $2; n[k]++; t[k, n[k]] = $3; r[k, n[k]] = $4; seen[$1] = 1 }
    function median(a, k,   m, i, j, x, v) {
      m = n[k]
      for (i = 1; i <= m; i++) v[i] = a[k, i]
      for (i = 2; i <= m; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
      return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
    }
    END {
      printf "%-86s %8s %8s %7s %9s %9s %7s\n", "trace (medians of 3 runs)", "then s", "now s", "x time", "then MiB", "now MiB", "x RSS"
      cnt = 0; lt = 0; lm = 0
      for (f in seen) names[++cnt] = f
      for (i = 2; i <= cnt; i++) { x = names[i]; for (j = i - 1; j >= 1 && names[j] > x; j--) names[j + 1] = names[j]; names[j + 1] = x }
      for (i = 1; i <= cnt; i++) {
        f = names[i]
        ts = median(t, f SUBSEP "then"); tn = median(t, f SUBSEP "now")
        ms = median(r, f SUBSEP "then") / 1024; mn = median(r, f SUBSEP "now") / 1024
        xt = ts > 0 ? tn / ts : 1
        printf "%-86s %8.3f %8.3f %7.2f %9.0f %9.0f %7.2f\n", f, ts, tn, xt, ms, mn, mn / ms
        lt += log(xt); lm += log(mn / ms)
      }
      printf "geometric mean over %d traces: time x %.2f, peak RSS x %.2f (this checkout over the previous milestone)\n", cnt, exp(lt / cnt), exp(lm / cnt)
    }' "$dir/times"
  exit 0
fi
if [ "$suite" = filed ]; then
  # Issue 14's scale targets (replay <= 4 s, synth <= 15 s) are times on the machine of the session
  # that filed it, and the machines of this kind differ by up to two and a half times from one
  # session to the next. So the code the issue measured (7c0b8c7, the commit before its first fix)
  # is built again and run here beside this checkout's, on the job it measured: what each command
  # takes here against what the issue says it took there is this machine's factor, and this
  # checkout's times divided by it are what they would be on the issue's machine.
  # Needs the history (a full clone) and, for 7c0b8c7's CMakeLists, the Boost and range-v3 headers
  # (apt-get install libboost-dev librange-v3-dev).
  filed=7c0b8c7
  issue_synth=167 issue_replay=13.4 issue_inspect=1.7  # the issue's text: seconds on its machine
  old_beside_head "$filed" filed "libboost-dev and librange-v3-dev"
  job=(--model gpt3-175b --tp 8 --pp 8 --dp 8 --global-batch 256 --unfold --gzip)
  run() {  # label, command...: appends "label wall-seconds peak-KB" to $dir/times
    /usr/bin/time -f "%e %M" -o "$dir/time" "${@:2}" >"$dir/out" 2>&1 || { cat "$dir/out"; exit 1; }
    read -r wall kb <"$dir/time"
    printf '%s %s %s\n' "$1" "$wall" "$kb" >>"$dir/times"
  }
  echo "lumos synth ${job[*]}; $(nproc) cores; $filed (the issue's code) against $(git rev-parse --short HEAD)"
  run synth-then "$then" synth "${job[@]}" --out "$dir/job-then"
  run synth-now "$now" synth "${job[@]}" --out "$dir/job-now"
  for i in 1 2 3; do  # alternating, so that a drift of the machine's speed reaches both alike
    run replay-then "$then" replay "$dir/job-then"
    run replay-now "$now" replay "$dir/job-then"
    run replay-now-own "$now" replay "$dir/job-now"
    run inspect-then "$then" inspect "$dir/job-then"
    run inspect-now "$now" inspect "$dir/job-then"
    run inspect-now-own "$now" inspect "$dir/job-now"
  done
  printf 'traces: %s MiB (%s), %s MiB (%s)\n' "$(du -sm "$dir/job-then" | cut -f1)" "$filed's synth" \
    "$(du -sm "$dir/job-now" | cut -f1)" "this checkout's synth"
  awk -v is="$issue_synth" -v ir="$issue_replay" -v ii="$issue_inspect" -v then="$filed" -v now="$(git rev-parse --short HEAD)" '
    { n[$1]++; t[$1, n[$1]] = $2; if ($3 + 0 > kb[$1] + 0) kb[$1] = $3 + 0 }
    function median(k,   a, i, j, x, m) {  # of the runs of label k
      m = n[k]
      for (i = 1; i <= m; i++) a[i] = t[k, i]
      for (i = 2; i <= m; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
      return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
    }
    END {
      s = median("synth-then"); r = median("replay-then"); p = median("inspect-then")
      rn = median("replay-now"); ro = median("replay-now-own")
      printf "%-40s %9s %9s %9s\n", "seconds (medians)", "synth", "replay", "inspect"
      printf "%-40s %9.2f %9.2f %9.2f\n", "issue 14, on its machine (its text)", is, ir, ii
      printf "%-40s %9.2f %9.2f %9.2f\n", then " here", s, r, p
      printf "%-40s %9s %9.2f %9.2f\n", now " here, on the job of " then, "", rn, median("inspect-now")
      printf "%-40s %9.2f %9.2f %9.2f\n", now " here, on its own synth job", median("synth-now"), ro, median("inspect-now-own")
      printf "%-40s %7.0f M %7.0f M %7.0f M\n", "peak RSS of " then, kb["synth-then"] / 1024, kb["replay-then"] / 1024, kb["inspect-then"] / 1024
      printf "%-40s %9s %7.0f M %7.0f M\n", "peak RSS of " now ", the job of " then, "", kb["replay-now"] / 1024, kb["inspect-now"] / 1024
      printf "%-40s %7.0f M %7.0f M %7.0f M\n", "peak RSS of " now ", its own job", kb["synth-now"] / 1024, kb["replay-now-own"] / 1024, kb["inspect-now-own"] / 1024
      printf "this machine against the issue machine, %s by command: synth %.2f x, replay %.2f x, inspect %.2f x\n", then, s / is, r / ir, p / ii
      printf "replay of %s on the issue machine, by each factor (on the job of %s; on its own synth job):\n", now, then
      printf "  by synth   %5.2f s; %5.2f s\n", rn * is / s, ro * is / s
      printf "  by replay  %5.2f s; %5.2f s\n", rn * ir / r, ro * ir / r
      printf "  by inspect %5.2f s; %5.2f s\n", rn * ii / p, ro * ii / p
      printf "replay here: %s %.2f x faster than %s (the issue asks %.1f s / 4 s = %.2f x)\n", now, r / rn, then, ir, ir / 4
    }' "$dir/times"
  exit 0
fi
cmake --build --preset bench --target "bench_${suite}" >/dev/null
exec "build/bench/bench/bench_${suite}" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_min_time=0.5 "$@"
