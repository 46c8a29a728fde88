#!/usr/bin/env bash
# Runs every fuzz target for a bounded time: CI's fuzzing step (see fuzz/README.md).
#
#   fuzz/ci.sh [SECONDS]   seconds per target (default: $LINEAGE_FUZZ_SECONDS, else 60)
#
# Installs the pinned cargo-fuzz if it is missing, builds the targets on the nightly toolchain
# against the committed Cargo.lock, then runs each one from its committed seeds (fuzz/seeds), the
# inputs of bugs found before (fuzz/regressions/<target>, which must keep passing) and the corpus
# it has grown on this machine (fuzz/corpus/<target>, not committed). A crash, a hang (no answer
# within 30 s) or running out of memory (8 GiB, see fuzz/README.md) fails the step after every target has run; the input is
# saved under fuzz/artifacts/<target>/ and printed here, gzipped and in base64, so it outlives the
# machine, and the summary repeats why (a hang names the store call it hung in). Reads nothing from
# stdin.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-${LINEAGE_FUZZ_SECONDS:-60}}
cargo_fuzz_version=0.13.2

if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz ${cargo_fuzz_version}" ]; then
    echo "installing cargo-fuzz ${cargo_fuzz_version}"
    cargo install cargo-fuzz --version "${cargo_fuzz_version}" --locked </dev/null
fi
cargo +nightly --version
cargo fuzz --version

# The committed lock file must be current: a fresh clone builds exactly what was fuzzed here.
if ! cargo +nightly metadata --manifest-path fuzz/Cargo.toml --locked --format-version 1 \
    >/dev/null </dev/null; then
    echo "fuzz/Cargo.lock is out of date (a workspace crate's dependencies changed): run" \
        "'cargo +nightly fetch --manifest-path fuzz/Cargo.toml' and commit fuzz/Cargo.lock"
    exit 1
fi
# Optimized, no sanitizer: Lineage's crates forbid unsafe code, and the fuzzer runs several times
# faster without AddressSanitizer (fuzz/Cargo.toml keeps debug assertions and overflow checks on
# in Lineage's code).
build_flags=(-O --sanitizer none)
cargo +nightly fuzz build "${build_flags[@]}" </dev/null

triple=$(rustc +nightly -vV | sed -n 's/^host: //p')
bin_dir="fuzz/target/${triple}/release"
mapfile -t targets < <(cargo +nightly fuzz list </dev/null)
# A failed or empty listing must not pass as "every target fuzzed".
if [ "${#targets[@]}" -eq 0 ]; then
    echo "fuzz/ci.sh: cargo fuzz list named no targets" >&2
    exit 1
fi

seeds_of() {
    case "$1" in
        open_store | cli_open) echo fuzz/seeds/stores ;;
        *) echo "fuzz/seeds/$1" ;;
    esac
}

# libFuzzer's progress lines, new functions and recommended dictionary stay in the raw log only.
quiet='^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)|^[[:space:]]+NEW_FUNC|^".*" # Uses: |^###### '
failed=()
summary=()
for target in "${targets[@]}"; do
    echo "== fuzz ${target} (${seconds} s)"
    corpus="fuzz/corpus/${target}"
    artifacts="fuzz/artifacts/${target}"
    mkdir -p "$corpus" "$artifacts"
    dirs=("$corpus")
    for extra in "$(seeds_of "$target")" "fuzz/regressions/${target}"; do
        if [ -d "$extra" ]; then dirs+=("$extra"); fi
    done
    marker=$(mktemp)
    log=$(mktemp)
    started=$SECONDS
    set +e
    "${bin_dir}/${target}" "${dirs[@]}" \
        -max_total_time="$seconds" -timeout=30 -rss_limit_mb=8192 -print_final_stats=1 \
        -artifact_prefix="${artifacts}/" </dev/null 2>&1 |
        tee "$log" | grep -Ev "$quiet"
    status=${PIPESTATUS[0]}
    set -e
    # What a run that crashed early did not print stays unknown ("?").
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    cov=$({ grep -Eo 'cov: [0-9]+ ft: [0-9]+' "$log" || true; } | tail -n 1)
    new=$(find "$artifacts" -type f -newer "$marker" | sort)
    # Why it failed, in the summary too: a long input printed below can push the rest of the log
    # out of a truncated view (the watchdog's hang report names the store call that hung).
    why=$({ grep -E '^lineage-fuzz: |panicked at|^==[0-9]+== ERROR' "$log" || true; } | tail -n 4)
    rm -f "$log" "$marker"
    summary+=("${target}: ${runs:-?} runs in $((SECONDS - started)) s, ${cov:-no coverage line}, exit ${status}")
    if [ "$status" -ne 0 ] && [ -n "$why" ]; then
        summary+=("$(sed 's/^/    /' <<<"$why")")
    fi
    if [ "$status" -ne 0 ]; then
        failed+=("$target")
        if [ -z "$new" ]; then
            echo "fuzz ${target} failed (exit ${status}) without saving an input"
        fi
        for input in $new; do
            echo "fuzz ${target} failed (exit ${status}); the input is ${input}" \
                "($(wc -c <"$input") bytes, sha256 $(sha256sum "$input" | cut -d' ' -f1))."
            echo "Reproduce: fuzz/target/<host>/release/${target} ${input} (RUST_BACKTRACE=1 for" \
                "the stack of a contained panic), or: cargo +nightly fuzz run ${build_flags[*]} ${target} ${input}"
            echo "Recreate it elsewhere: base64 -d <<'EOF' | gunzip > ${input##*/}"
            gzip -9c "$input" | base64 -w 76
            echo "EOF"
        done
    fi
done

echo "== fuzzing summary"
printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzzing failed: ${failed[*]}"
    exit 1
fi
