//! Random numbers for spreading work out (not for secrets): the health
//! checks' jitter, a pool's first pick among equals.

/// A random `u64` from the system's source (zero if it has none to give:
/// then things are merely not spread, which is harmless).
pub(crate) fn u64() -> u64 {
    let mut bytes = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
    u64::from_le_bytes(bytes)
}
