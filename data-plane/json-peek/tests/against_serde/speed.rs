//! Time and instructions per call against serde_json, on the benchmark's
//! bodies: run by hand (ignored), in release builds.

use super::*;

/// Time per call on the bench bodies, against serde_json. Meaningful in
/// release builds only:
/// `cargo test --release -p router-json-peek --test against_serde speed --
/// --ignored --nocapture`.
#[test]
#[ignore]
fn speed_against_serde() {
    use std::hint::black_box;
    fn ns_per_call<T>(f: impl Fn() -> T) -> f64 {
        const CALLS: u32 = 200_000;
        (0..3)
            .map(|_| {
                #[allow(clippy::disallowed_types)] // a wall-clock micro-benchmark
                let start = std::time::Instant::now();
                for _ in 0..CALLS {
                    black_box(f());
                }
                start.elapsed().as_secs_f64() * 1e9 / f64::from(CALLS)
            })
            .fold(f64::INFINITY, f64::min)
    }
    let answer = BENCH_ANSWER.as_bytes();
    let rows = [
        (
            "request",
            ns_per_call(|| {
                serde_json::from_slice::<reference::BodyPeek<'_>>(black_box(BENCH_REQUEST))
            }),
            ns_per_call(|| peek_request(black_box(BENCH_REQUEST))),
        ),
        (
            "answer",
            ns_per_call(|| serde_json::from_slice::<reference::AnswerPeek>(black_box(answer))),
            ns_per_call(|| peek_answer(black_box(answer))),
        ),
    ];
    for (body, serde, ours) in rows {
        println!(
            "{body}: serde_json {serde:.0} ns, json_peek {ours:.0} ns ({:.1}x)",
            serde / ours
        );
    }
}

/// Calls for [`callgrind_loop`]: instructions per call are the
/// profile's total over this many.
const CALLGRIND_CALLS: u32 = 10_000;

/// A loop for callgrind, to count instructions per call on the bench
/// bodies (`JSON_PEEK_BODY=request` for the request, else the answer):
/// `cargo test --release -p router-json-peek --test against_serde --no-run`,
/// then
/// `JSON_PEEK_BODY=request valgrind --tool=callgrind
/// --toggle-collect=router_json_peek::request::peek_request <test binary>
/// --ignored --exact speed::callgrind_loop` (or
/// `router_json_peek::answer::peek_answer`
/// and no `JSON_PEEK_BODY`), and divide the total by
/// [`CALLGRIND_CALLS`]: the counts of the functions alone, as a profile
/// of the proxy has them.
#[test]
#[ignore]
fn callgrind_loop() {
    use std::hint::black_box;
    #[inline(never)]
    fn answer_calls(b: &[u8]) {
        for _ in 0..CALLGRIND_CALLS {
            drop(black_box(peek_answer(black_box(b))));
        }
    }
    #[inline(never)]
    fn request_calls(b: &[u8]) {
        for _ in 0..CALLGRIND_CALLS {
            drop(black_box(peek_request(black_box(b))));
        }
    }
    if std::env::var("JSON_PEEK_BODY").as_deref() == Ok("request") {
        request_calls(BENCH_REQUEST);
    } else {
        answer_calls(BENCH_ANSWER.as_bytes());
    }
}
