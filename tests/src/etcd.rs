//! A real etcd server for tests: Debian's `etcd-server` package (or the
//! binary named by `ETCD_BIN`), one member on 127.0.0.1 with its own data
//! directory, which can be stopped and started again on the same ports
//! with the same data (an etcd restart).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

/// One etcd member on loopback.
pub struct EtcdServer {
    binary: PathBuf,
    data_dir: PathBuf,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port: {e}"))
}

fn find_binary() -> PathBuf {
    if let Ok(b) = std::env::var("ETCD_BIN") {
        return PathBuf::from(b);
    }
    for dir in std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/bin", "/usr/local/bin"])
    {
        let candidate = PathBuf::from(dir).join("etcd");
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "etcd is not installed: these tests need a real etcd \
         (`apt-get install etcd-server`, or set ETCD_BIN)"
    );
}

impl EtcdServer {
    /// Starts a fresh member and waits until it answers.
    pub async fn start(name: &str) -> Self {
        let data_dir =
            std::env::temp_dir().join(format!("router-etcd-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data_dir);
        std::fs::create_dir_all(&data_dir)
            .unwrap_or_else(|e| panic!("{}: {e}", data_dir.display()));
        let mut server = Self {
            binary: find_binary(),
            data_dir,
            client_port: free_port(),
            peer_port: free_port(),
            child: None,
        };
        server.resume().await;
        server
    }

    /// `127.0.0.1:port` of the client API.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// A `--store` URL with this key prefix.
    pub fn store_url(&self, prefix: &str) -> String {
        format!("etcd://{}/{prefix}", self.endpoint())
    }

    /// Kills the member (SIGKILL: no goodbye to clients).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same ports and data, and waits until it answers.
    pub async fn resume(&mut self) {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::File::create(self.data_dir.join("etcd.log"))
            .unwrap_or_else(|e| panic!("etcd log: {e}"));
        let child = Command::new(&self.binary)
            .args([
                "--name",
                "test",
                "--data-dir",
                &self.data_dir.join("data").to_string_lossy(),
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
                "--initial-cluster",
                &format!("test={peer}"),
                "--log-level",
                "warn",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.binary.display()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut c) = etcd_client::Client::connect([client.as_str()], None).await {
                if let Ok(Ok(_)) =
                    tokio::time::timeout(Duration::from_secs(1), c.get("health", None)).await
                {
                    return;
                }
            }
            if Instant::now() > deadline {
                let log =
                    std::fs::read_to_string(self.data_dir.join("etcd.log")).unwrap_or_default();
                panic!("etcd did not come up within 20 s:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A client of this member.
    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([format!("http://{}", self.endpoint())], None)
            .await
            .unwrap_or_else(|e| panic!("etcd client: {e}"))
    }

    /// Compacts the key space at its current revision; returns it.
    pub async fn compact(&self) -> i64 {
        let mut c = self.client().await;
        let revision = c
            .get("health", None)
            .await
            .ok()
            .and_then(|r| r.header().map(|h| h.revision()))
            .unwrap_or_else(|| panic!("etcd has no revision"));
        c.compact(
            revision,
            Some(etcd_client::CompactionOptions::new().with_physical()),
        )
        .await
        .unwrap_or_else(|e| panic!("compaction: {e}"));
        revision
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}
