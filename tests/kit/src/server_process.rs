//! What the real-server helpers ([`crate::etcd`], [`crate::redis`]) share:
//! a free port, and the server's binary.

use std::net::TcpListener;
use std::path::PathBuf;

/// A free port on 127.0.0.1 (bound, then let go: the server binds it
/// next).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port: {e}"))
}

/// The binary `name`: from the variable `env_var` when set, else the first
/// on `PATH` (then `/usr/bin`, `/usr/local/bin`). Panics with `install`,
/// how to get it, when there is none.
pub fn find_binary(name: &str, env_var: &str, install: &str) -> PathBuf {
    if let Ok(b) = std::env::var(env_var) {
        return PathBuf::from(b);
    }
    for dir in std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/bin", "/usr/local/bin"])
    {
        let candidate = PathBuf::from(dir).join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!("{name} is not installed: these tests need a real one ({install}, or set {env_var})");
}
