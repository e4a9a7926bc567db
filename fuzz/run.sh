#!/usr/bin/env bash
# Builds the fuzz targets with libFuzzer's coverage instrumentation and runs each one for a
# bounded time over its corpus in fuzz/corpus/<target>/. Stable Rust is enough: the
# instrumentation is LLVM's sancov pass (`-C passes`), no sanitizer (no nightly `-Z` flags).
# A finding stops the script with a non-zero status and leaves the input in
# $FUZZ_WORK/artifacts/<target>/; make it a regression test in tests/hostile.rs and add it to
# the corpus.
#
#   fuzz/run.sh                 # every target, FUZZ_SECONDS (default 30) each
#   fuzz/run.sh tensor_proto    # one target
#   FUZZ_SECONDS=300 fuzz/run.sh run_step
#
# New inputs go to a scratch corpus under $FUZZ_WORK; the repository's corpus is only read
# (merge worthwhile new inputs by hand with `-merge=1`).
set -euo pipefail
cd "$(dirname "$0")"

SECONDS_PER_TARGET="${FUZZ_SECONDS:-30}"
ALL_TARGETS=(tensor_proto graph_def run_step run_graph config channel_answer recv_tensor_response)
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=("${ALL_TARGETS[@]}")
fi
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$PWD/target}"
WORK="${FUZZ_WORK:-$CARGO_TARGET_DIR/fuzz-work}"

# What `cargo fuzz build -s none` passes, minus the nightly-only flags: `--cfg fuzzing` for
# every crate, the coverage instrumentation only for tessera and the targets (rustc-coverage).
export RUSTFLAGS="${RUSTFLAGS:-} --cfg fuzzing"
export FUZZ_COVERAGE_FLAGS="-Cpasses=sancov-module \
 -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
 -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares"
export FUZZ_TARGETS="${ALL_TARGETS[*]}"
export RUSTC_WRAPPER="$PWD/rustc-coverage"

# An explicit --target keeps RUSTFLAGS off build scripts and proc macros (they run on the
# host and have no libFuzzer to link against).
HOST="$(rustc -vV | sed -n 's/^host: //p')"
# The targets build against the same dependency versions as the main crate: its lock file,
# plus whatever the fuzz crate adds (libfuzzer-sys and its build dependencies).
cp ../Cargo.lock Cargo.lock
start=$(date +%s)
cargo build --release --bins --target "$HOST"
echo "fuzz: built the targets in $(( $(date +%s) - start )) s"

for target in "${TARGETS[@]}"; do
  scratch="$WORK/corpus/$target"
  artifacts="$WORK/artifacts/$target"
  mkdir -p "$scratch" "$artifacts" "corpus/$target"
  echo "fuzz: $target for ${SECONDS_PER_TARGET} s"
  # -rss_limit_mb / -malloc_limit_mb: a claimed size that turns into a huge allocation is
  # a finding (a tensor from a proto may take up to 2 GiB by design, so the limits sit above).
  # -timeout: one input taking over 10 s (a hang, a deep recursion) is a finding.
  log="$WORK/$target.log"
  set +e
  "$CARGO_TARGET_DIR/$HOST/release/$target" "$scratch" "corpus/$target" \
    -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=3072 -malloc_limit_mb=2304 \
    -timeout=10 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" >"$log" 2>&1
  status=$?
  set -e
  grep -E '^(INFO: seed corpus|#[0-9]+\s+(INITED|DONE)|stat::(number_of_executed_units|peak_rss_mb))' "$log" || true
  if [ "$status" -ne 0 ]; then
    tail -n 60 "$log" >&2
    echo "fuzz: $target found a failing input (exit $status); see $artifacts and $log" >&2
    exit 1
  fi
done
echo "fuzz: every target ran ${SECONDS_PER_TARGET} s without a finding ($(( $(date +%s) - start )) s in all)"
