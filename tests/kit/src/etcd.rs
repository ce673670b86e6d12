//! A real etcd server for tests: Debian's `etcd-server` package (or the
//! binary named by `ETCD_BIN`), one member on 127.0.0.1 with its own data
//! directory, which can be stopped and started again on the same ports
//! with the same data (an etcd restart). It may serve TLS and require
//! client certificates ([`EtcdServer::start_tls`]), and require users
//! ([`EtcdServer::enable_auth`]).

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
    tls: Option<EtcdTls>,
    /// More flags for the member.
    args: Vec<String>,
    root_password: Option<String>,
}

/// TLS for a member (PEM): it serves `server_cert`, and requires client
/// certificates signed by `ca` (`--client-cert-auth`), such as `client_cert`,
/// which [`EtcdServer::client`] presents.
#[derive(Clone)]
pub struct EtcdTls {
    /// The CA of the server's and the clients' certificates.
    pub ca: String,
    /// The member's certificate (for 127.0.0.1) and key.
    pub server_cert: String,
    /// The member's key.
    pub server_key: String,
    /// A client certificate for the helper's own client.
    pub client_cert: String,
    /// Its key.
    pub client_key: String,
}

fn find_binary() -> PathBuf {
    crate::server_process::find_binary(
        "etcd",
        "ETCD_BIN",
        "`apt-get install etcd-server`, `scripts/install-test-deps`",
    )
}

impl EtcdServer {
    /// Starts a fresh member and waits until it answers.
    pub async fn start(name: &str) -> Self {
        Self::start_with(name, None, &[]).await
    }

    /// Starts a fresh member serving TLS to clients, which must present a
    /// certificate signed by `tls.ca`.
    pub async fn start_tls(name: &str, tls: EtcdTls) -> Self {
        Self::start_with(name, Some(tls), &[]).await
    }

    /// Starts a fresh member that forgets an auth token once it has not
    /// been used for `secs` seconds (etcd's `--auth-token-ttl`, 300 by
    /// default).
    pub async fn start_with_token_ttl(name: &str, secs: u32) -> Self {
        Self::start_with(name, None, &["--auth-token-ttl".into(), secs.to_string()]).await
    }

    async fn start_with(name: &str, tls: Option<EtcdTls>, args: &[String]) -> Self {
        let data_dir =
            std::env::temp_dir().join(format!("router-etcd-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data_dir);
        std::fs::create_dir_all(&data_dir)
            .unwrap_or_else(|e| panic!("{}: {e}", data_dir.display()));
        let mut server = Self {
            binary: find_binary(),
            data_dir,
            client_port: crate::server_process::free_port(),
            peer_port: crate::server_process::free_port(),
            child: None,
            tls,
            args: args.to_vec(),
            root_password: None,
        };
        server.resume().await;
        server
    }

    /// Turns authentication on: a `root` user, and `user` with `password`
    /// whose role may read and write only keys under `prefix`. From then
    /// on [`client`](Self::client) signs in as root.
    pub async fn enable_auth(&mut self, user: &str, password: &str, prefix: &str) {
        let c = self.client().await;
        let root_password = "root-password";
        let role = format!("{user}-role");
        fn fail(step: &str, e: router_etcd::Error) -> ! {
            panic!("etcd auth set-up, {step}: {e}")
        }
        c.user_add("root", root_password)
            .await
            .unwrap_or_else(|e| fail("user add root", e));
        c.user_grant_role("root", "root")
            .await
            .unwrap_or_else(|e| fail("grant root", e));
        c.role_add(role.as_str())
            .await
            .unwrap_or_else(|e| fail("role add", e));
        c.role_grant_permission(
            role.as_str(),
            router_etcd::pb::authpb::Permission::read_write_prefix(prefix),
        )
        .await
        .unwrap_or_else(|e| fail("grant permission", e));
        c.user_add(user, password)
            .await
            .unwrap_or_else(|e| fail("user add", e));
        c.user_grant_role(user, role.as_str())
            .await
            .unwrap_or_else(|e| fail("grant role", e));
        c.auth_enable()
            .await
            .unwrap_or_else(|e| fail("auth enable", e));
        self.root_password = Some(root_password.to_string());
    }

    /// `127.0.0.1:port` of the client API.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// A `--store` URL with this key prefix (`etcds://` with TLS).
    pub fn store_url(&self, prefix: &str) -> String {
        let scheme = if self.tls.is_some() { "etcds" } else { "etcd" };
        format!("{scheme}://{}/{prefix}", self.endpoint())
    }

    /// The URL of the client API.
    fn client_url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// The helper's own client options: its certificate, and root once
    /// authentication is on.
    fn client_options(&self) -> router_etcd::Options {
        router_etcd::Options {
            tls: self.tls.as_ref().map(|tls| router_etcd::Tls {
                ca_pem: tls.ca.clone(),
                identity: Some((tls.client_cert.clone(), tls.client_key.clone())),
            }),
            user: self
                .root_password
                .as_ref()
                .map(|password| ("root".to_string(), password.clone())),
            ..router_etcd::Options::default()
        }
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
        let client = self.client_url();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::File::create(self.data_dir.join("etcd.log"))
            .unwrap_or_else(|e| panic!("etcd log: {e}"));
        let mut command = Command::new(&self.binary);
        if let Some(tls) = &self.tls {
            let write = |name: &str, pem: &str| {
                let path = self.data_dir.join(name);
                std::fs::write(&path, pem).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                path.to_string_lossy().into_owned()
            };
            command.args([
                "--cert-file".to_string(),
                write("server.pem", &tls.server_cert),
                "--key-file".to_string(),
                write("server-key.pem", &tls.server_key),
                "--trusted-ca-file".to_string(),
                write("ca.pem", &tls.ca),
                "--client-cert-auth".to_string(),
            ]);
        }
        let child = command
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
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.binary.display()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let connected = tokio::time::timeout(
                Duration::from_secs(1),
                router_etcd::Client::connect(std::slice::from_ref(&client), self.client_options()),
            )
            .await;
            if let Ok(Ok(c)) = connected {
                if let Ok(Ok(_)) = tokio::time::timeout(
                    Duration::from_secs(1),
                    c.range(router_etcd::pb::etcdserverpb::RangeRequest::key("health")),
                )
                .await
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
    pub async fn client(&self) -> router_etcd::Client {
        tokio::time::timeout(
            Duration::from_secs(5),
            router_etcd::Client::connect(&[self.client_url()], self.client_options()),
        )
        .await
        .unwrap_or_else(|_| panic!("etcd client: no answer within 5 s"))
        .unwrap_or_else(|e| panic!("etcd client: {e}"))
    }

    /// Compacts the key space at its current revision; returns it.
    pub async fn compact(&self) -> i64 {
        let c = self.client().await;
        let revision = c
            .range(router_etcd::pb::etcdserverpb::RangeRequest::key("health"))
            .await
            .ok()
            .and_then(|r| r.header.map(|h| h.revision))
            .unwrap_or_else(|| panic!("etcd has no revision"));
        c.compact(revision, true)
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
