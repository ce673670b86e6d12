//! A network namespace of the test's own, so that a test can call the
//! proxy from an address that is really not loopback.
//!
//! [`Netns::create`] makes a namespace and a veth pair: one end in the root
//! namespace with `10.213.X.1/30`, the other in the new namespace with
//! `10.213.X.2/30` (X chosen free). A proxy listening on `0.0.0.0` in the
//! root namespace is reached from inside at `10.213.X.1`, and sees the peer
//! `10.213.X.2`. Nothing else is routed: only this /30 and loopback exist
//! in the namespace. Dropping it deletes the pair and the namespace.
//!
//! It needs root and `ip` (iproute2), and `curl` for the client. Without
//! them, [`Netns::create`] prints why the test is skipped and returns
//! `None`; the test returns early. Once those are there, a failure to set
//! the namespace up is a test failure, not a skip.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A network namespace joined to the root namespace by a veth pair.
#[derive(Debug)]
pub struct Netns {
    name: String,
    host_if: String,
    /// The root namespace's end of the pair.
    pub host_ip: Ipv4Addr,
    /// The namespace's end: the peer address the proxy sees.
    pub ns_ip: Ipv4Addr,
}

/// What a client in the namespace got back.
#[derive(Debug, Clone)]
pub struct CurlAnswer {
    /// The HTTP status.
    pub status: u16,
    /// The body.
    pub body: String,
}

impl CurlAnswer {
    /// The body as JSON (panics when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// Why the test cannot run here, or `None` when it can.
fn missing_prerequisite() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("");
    if euid != "0" {
        return Some(format!(
            "not root (effective uid {euid:?}): network namespaces need root"
        ));
    }
    for (program, arg) in [("ip", "-V"), ("curl", "--version")] {
        if Command::new(program).arg(arg).output().is_err() {
            return Some(format!("`{program}` is not installed"));
        }
    }
    None
}

/// Runs `ip ARGS`; panics with its stderr when it fails.
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ip {}: {e}", args.join(" ")));
    assert!(
        out.status.success(),
        "ip {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// True when `10.213.x.0/30` is already used by an address here.
fn subnet_taken(x: u8) -> bool {
    let out = Command::new("ip")
        .args([
            "-o",
            "-4",
            "addr",
            "show",
            "to",
            &format!("10.213.{x}.0/30"),
        ])
        .output();
    out.map(|o| !o.stdout.is_empty()).unwrap_or(true)
}

impl Netns {
    /// Creates a namespace for the test `test`; `None` (after printing why)
    /// when this machine cannot run it.
    pub fn create(test: &str) -> Option<Self> {
        if let Some(why) = missing_prerequisite() {
            eprintln!("SKIPPED {test}: {why}");
            return None;
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let name = format!("router-test-{pid}-{n}");
        // Interface names: 15 bytes at most.
        let host_if = format!("rt{}x{n}h", pid % 100_000);
        let ns_if = format!("rt{}x{n}n", pid % 100_000);
        let start = (pid.wrapping_mul(31).wrapping_add(n * 7) % 256) as u8;
        let x = (0..=255u8)
            .map(|i| start.wrapping_add(i))
            .find(|x| !subnet_taken(*x))
            .unwrap_or_else(|| panic!("no free 10.213.x.0/30 for {test}"));
        let host_ip = Ipv4Addr::new(10, 213, x, 1);
        let ns_ip = Ipv4Addr::new(10, 213, x, 2);
        ip(&["netns", "add", &name]);
        // From here on, Drop cleans up whatever was made.
        let ns = Self {
            name,
            host_if,
            host_ip,
            ns_ip,
        };
        ip(&[
            "link",
            "add",
            &ns.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &ns_if,
        ]);
        ip(&["link", "set", &ns_if, "netns", &ns.name]);
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &ns.host_if]);
        ip(&["link", "set", &ns.host_if, "up"]);
        ip(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{ns_ip}/30"),
            "dev",
            &ns_if,
        ]);
        ip(&["-n", &ns.name, "link", "set", &ns_if, "up"]);
        ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        Some(ns)
    }

    /// Runs curl inside the namespace: `method url` with `headers` and
    /// `body`; panics when curl cannot connect.
    pub async fn curl(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> CurlAnswer {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, "curl", "-sS", "-m", "10"])
            .args(["-X", method, "-o", "-", "-w", "\n%{http_code}"]);
        for (k, v) in headers {
            cmd.arg("-H").arg(format!("{k}: {v}"));
        }
        if !body.is_empty() {
            cmd.args([
                "-H",
                "content-type: application/json",
                "--data-binary",
                body,
            ]);
        }
        cmd.arg(url);
        let shown = format!("{method} {url} from {}", self.ns_ip);
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap_or_else(|e| panic!("{shown}: {e}"))
            .unwrap_or_else(|e| panic!("{shown}: {e}"));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{shown}: curl failed: {}{text}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
        CurlAnswer {
            status: status
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{shown}: no status in {text:?}")),
            body: body.to_string(),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting one end deletes the pair; then the namespace. Errors are
        // ignored: a half-made namespace has less to delete.
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}
