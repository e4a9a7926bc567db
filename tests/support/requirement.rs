//! What a test needs from the machine beyond Rust, and the one rule for when it is missing.
//!
//! Under CI (`CI` set, other than empty, `0` or `false`) TensorFlow, grpcio, NVRTC and the C++
//! compiler are part of the proof: a test that finds one missing FAILS, naming it and how to
//! install it, so the proof cannot vanish as a skip that counts as a pass. Elsewhere it prints
//! `TEST: skipped, ...` and passes. A missing GPU always skips, saying so ([`no_gpu`]): no CI
//! machine has one.

/// Whether the tests run under CI (`CI=true`, as CI services set it).
pub fn under_ci() -> bool {
    std::env::var("CI")
        .is_ok_and(|v| !matches!(v.trim().to_ascii_lowercase().as_str(), "" | "0" | "false"))
}

/// `test` cannot run because `what` is missing; `how` says how to install it. Under CI this
/// panics (the test fails with the reason); otherwise it prints that the test skipped and
/// returns, and the caller returns.
pub fn missing(test: &str, what: &str, how: &str) {
    if under_ci() {
        panic!("{test}: {what}; CI=true requires it ({how})");
    }
    eprintln!("{test}: skipped, {what} ({how}; under CI=true this fails)");
}

/// `test` needs a GPU (or more of them) and `why` says what was found: it skips, saying so,
/// under CI too.
pub fn no_gpu(test: &str, why: &str) {
    eprintln!("{test}: skipped, {why}");
}
