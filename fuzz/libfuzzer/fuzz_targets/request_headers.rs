//! Fuzz target `request_headers`: the property is `router_fuzz::request_headers` (see its docs
//! and docs/fuzzing.md). No `forbid(unsafe_code)`: `fuzz_target!` expands
//! to the `#[no_mangle]` entry point libFuzzer calls.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| router_fuzz::request_headers(data));
