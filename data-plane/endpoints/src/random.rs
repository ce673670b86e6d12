//! Random bytes from the system's source (`ring`'s `SystemRandom`): task
//! ids and run secrets, idempotency owners, the health checks' jitter, a
//! pool's first pick among equals.
//!
//! The system source (`getrandom`) fails only on a system without one; the
//! bytes are then zero, as they were at each of these places before they
//! shared this function.

/// `N` random bytes.
pub fn bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    b
}

/// A random `u64`.
pub fn u64() -> u64 {
    u64::from_le_bytes(bytes())
}
