//! The `router-proxy` binary as a separate process, the way an outside
//! attacker meets it: started with a policy file on a free port, its route
//! log read from its stdout, its memory and CPU read from `/proc`.
//!
//! The binary is the one `cargo test --workspace` builds beside the test
//! executables (`target/<profile>/router-proxy`).

// A child process lives on real time; its readiness and log are waited
// for with std's clock.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running `router-proxy` process (killed when dropped).
pub struct ProxyProcess {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
    lines: Arc<Mutex<Vec<String>>>,
}

/// Where the workspace's binaries are (beside `target/<profile>/deps`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current exe: {e}"));
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .unwrap_or_else(|| panic!("{} has no grandparent", exe.display()))
        .to_path_buf();
    let bin = dir.join("router-proxy");
    assert!(
        bin.exists(),
        "{} is not built: run `cargo build --workspace` (or `cargo test --workspace`)",
        bin.display()
    );
    dir
}

impl ProxyProcess {
    /// Starts the proxy in standalone mode with `policy` (YAML) and the
    /// extra environment `env`, and waits until it answers.
    pub fn start(name: &str, policy: &str, env: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!("router-proxy-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let file = dir.join("policy.yaml");
        std::fs::write(&file, policy).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        // A port picked free can be taken before the proxy binds it (an
        // outgoing connection of another test gets it as its ephemeral
        // port): a proxy that exits at once is started again on another.
        for _ in 0..5 {
            // (Written again each try: a proxy that exited took its
            // directory with it.)
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            std::fs::write(&file, policy).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let port = crate::server_process::free_port();
            let stderr = std::fs::File::create(dir.join("stderr.log"))
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            let mut cmd = Command::new(bin_dir().join("router-proxy"));
            cmd.arg("--policy")
                .arg(&file)
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .env("CUSTOM_ROUTER_PORT", port.to_string())
                .env("RUST_LOG", "warn")
                .stdout(Stdio::piped())
                .stderr(stderr);
            for (k, v) in env {
                cmd.env(k, v);
            }
            let mut child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start router-proxy: {e}"));
            let lines = Arc::new(Mutex::new(Vec::new()));
            if let Some(out) = child.stdout.take() {
                let lines = Arc::clone(&lines);
                std::thread::spawn(move || {
                    for line in BufReader::new(out).lines().map_while(Result::ok) {
                        lines.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                    }
                });
            }
            let mut proxy = Self {
                child,
                port,
                dir: dir.clone(),
                lines,
            };
            let until = Instant::now() + Duration::from_secs(20);
            loop {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return proxy;
                }
                if let Ok(Some(_)) = proxy.child.try_wait() {
                    let why = std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
                    assert!(
                        why.contains("in use"),
                        "router-proxy exited at start: {why}"
                    );
                    break;
                }
                assert!(
                    Instant::now() < until,
                    "router-proxy did not listen on {port}: {}",
                    std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("router-proxy found no free port in five tries");
    }

    /// What it has logged so far (stderr, `RUST_LOG=warn`).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default()
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its resident memory, KiB (`VmRSS`).
    pub fn rss_kib(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// CPU time used so far (user + system), in clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        // Fields after the command name (which is in parentheses).
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the whole line: 12 and
        // 13 after the name.
        let tick = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        tick(11) + tick(12)
    }

    /// The route log lines (JSON) printed so far.
    pub fn route_lines(&self) -> Vec<Value> {
        self.lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v.get("request_id").is_some())
            .collect()
    }

    /// Waits until `n` route lines are printed, and returns them.
    pub fn wait_for_lines(&self, n: usize) -> Vec<Value> {
        let until = Instant::now() + crate::harness::WAIT_AT_MOST;
        loop {
            let lines = self.route_lines();
            if lines.len() >= n {
                return lines;
            }
            assert!(
                Instant::now() < until,
                "{} route lines, waited for {n}: {lines:?}",
                lines.len()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
