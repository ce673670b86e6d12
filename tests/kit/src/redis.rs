//! A real Redis server for tests: Debian's `redis-server` package (or the
//! binary named by `REDIS_SERVER_BIN`) on 127.0.0.1, on a free port, with
//! persistence off, plain or TLS only ([`RedisServer::start_tls`]). It can
//! be killed and started again on the same port (a Redis restart: without
//! persistence, its keys are gone).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

/// One Redis server on loopback.
pub struct RedisServer {
    binary: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    /// Serving TLS only, with the certificate and key in `dir`.
    tls: bool,
}

fn find_binary() -> PathBuf {
    crate::server_process::find_binary(
        "redis-server",
        "REDIS_SERVER_BIN",
        "`apt-get install redis-server`, `scripts/install-test-deps`",
    )
}

/// Sends one inline command and returns the first line of the answer.
fn command(port: u16, cmd: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(1)))?;
    s.write_all(format!("{cmd}\r\n").as_bytes())?;
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_string())
}

impl RedisServer {
    /// Starts a fresh server and waits until it answers `PING`.
    pub async fn start(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("router-redis-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut server = Self {
            binary: find_binary(),
            dir,
            port: crate::server_process::free_port(),
            child: None,
            tls: false,
        };
        server.resume().await;
        server
    }

    /// Starts a fresh server that speaks TLS only, with this certificate
    /// and key (PEM), and waits until it listens.
    pub async fn start_tls(name: &str, cert_pem: &str, key_pem: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("router-redis-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for (file, pem) in [("cert.pem", cert_pem), ("key.pem", key_pem)] {
            std::fs::write(dir.join(file), pem).unwrap_or_else(|e| panic!("{file}: {e}"));
        }
        let mut server = Self {
            binary: find_binary(),
            dir,
            port: crate::server_process::free_port(),
            child: None,
            tls: true,
        };
        server.resume().await;
        server
    }

    /// `redis://127.0.0.1:port/0` (`rediss://` with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}/0", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server (SIGKILL: no goodbye to clients).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, and waits until it answers.
    pub async fn resume(&mut self) {
        let log = std::fs::File::create(self.dir.join("redis.log"))
            .unwrap_or_else(|e| panic!("redis log: {e}"));
        let port = self.port.to_string();
        let cert = self.dir.join("cert.pem").to_string_lossy().into_owned();
        let key = self.dir.join("key.pem").to_string_lossy().into_owned();
        let listen: Vec<&str> = if self.tls {
            vec![
                "--port",
                "0",
                "--tls-port",
                &port,
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
                "--tls-ca-cert-file",
                &cert,
                "--tls-auth-clients",
                "no",
            ]
        } else {
            vec!["--port", &port]
        };
        let child = Command::new(&self.binary)
            .args(listen)
            .args([
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                &self.dir.to_string_lossy(),
                "--protected-mode",
                "no",
            ])
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.binary.display()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let up = if self.tls {
                TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            } else {
                command(self.port, "PING").is_ok_and(|l| l == "+PONG")
            };
            if up {
                return;
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                panic!("redis-server did not come up within 20 s:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A string key's value (`GET`), if set.
    pub fn get(&self, key: &str) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        s.write_all(format!("GET {key}\r\n").as_bytes()).ok()?;
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).ok()?;
        let reply = String::from_utf8_lossy(&buf[..n]).to_string();
        let mut lines = reply.lines();
        match lines.next()? {
            "$-1" => None,
            _ => lines.next().map(str::to_string),
        }
    }

    /// Clients connected besides the one asking (`INFO clients`).
    pub fn other_clients(&self) -> u64 {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return 0;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        if s.write_all(b"INFO clients\r\n").is_err() {
            return 0;
        }
        let mut buf = [0u8; 2048];
        let n = s.read(&mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(0, |n| n.saturating_sub(1))
    }

    /// Waits until some client (a proxy) is connected.
    pub async fn wait_for_a_client(&self) {
        crate::wait::eventually(crate::wait::WAIT_AT_MOST, "a client connected", || {
            self.other_clients() > 0
        })
        .await;
    }

    /// One command's reply, for a test to look into the store: a bulk
    /// string's bytes (`None` for a nil), an integer's or a status's text.
    pub fn query(&self, args: &[&str]) -> Option<Vec<u8>> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let mut cmd = format!("*{}\r\n", args.len());
        for a in args {
            cmd.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        s.write_all(cmd.as_bytes()).ok()?;
        let mut reply = Vec::new();
        let mut buf = [0u8; 64 * 1024];
        loop {
            let n = s.read(&mut buf).ok()?;
            if n == 0 {
                return None;
            }
            reply.extend_from_slice(&buf[..n]);
            let Some(eol) = reply.windows(2).position(|w| w == b"\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&reply[1..eol]).to_string();
            match reply[0] {
                b'$' => {
                    let len: i64 = head.parse().ok()?;
                    if len < 0 {
                        return None;
                    }
                    let end = eol + 2 + usize::try_from(len).ok()?;
                    if reply.len() >= end {
                        return Some(reply[eol + 2..end].to_vec());
                    }
                }
                _ => return Some(head.into_bytes()),
            }
        }
    }

    /// A field of `INFO section` (e.g. `stats`, `total_net_output_bytes`).
    pub fn info(&self, section: &str, field: &str) -> Option<u64> {
        let text = String::from_utf8(self.query(&["INFO", section])?).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .and_then(|v| v.trim().parse().ok())
    }

    /// The number of keys matching the glob `pattern` (`KEYS`, counted in
    /// a script: a test store is small).
    pub fn count_keys(&self, pattern: &str) -> u64 {
        self.query(&["EVAL", "return #redis.call('KEYS', ARGV[1])", "0", pattern])
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or_else(|| panic!("KEYS {pattern} failed"))
    }

    /// The number of keys (`DBSIZE`).
    pub fn dbsize(&self) -> u64 {
        command(self.port, "DBSIZE")
            .ok()
            .and_then(|l| l.trim_start_matches(':').trim().parse().ok())
            .unwrap_or_else(|| panic!("DBSIZE failed"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
