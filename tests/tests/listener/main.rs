//! The proxy's listener (issue 30, item 11): plaintext HTTP/1.1 and h2c
//! with prior knowledge on one port; TLS (`CUSTOM_ROUTER_TLS_CERT_FILE`,
//! `_KEY_FILE`) with ALPN `h2` and `http/1.1`, its certificate reloaded
//! when the files change; the proxy's caps and guarantees over HTTP/2.
//! Real TLS and HTTP/2 over loopback; certificates made in the test with
//! `rcgen`.

#![allow(clippy::unwrap_used)]

mod bounds;
mod parking;
mod protocols;
mod reload;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use router_proxy::{Settings, TlsFiles};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A self-signed certificate for `localhost` and its key, as PEM.
pub struct Pair {
    /// The certificate.
    pub cert_pem: String,
    /// The key.
    pub key_pem: String,
    /// The certificate's DER (what a client sees).
    pub der: Vec<u8>,
}

impl Pair {
    /// A new pair.
    pub fn generate() -> Self {
        let ck = rcgen::generate_simple_self_signed(vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
        ])
        .unwrap();
        Self {
            cert_pem: ck.cert.pem(),
            key_pem: ck.signing_key.serialize_pem(),
            der: ck.cert.der().to_vec(),
        }
    }

    /// Writes it to `dir` as `tls.crt` and `tls.key`.
    pub fn write(&self, dir: &Path) -> TlsFiles {
        let files = TlsFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        };
        std::fs::write(&files.cert, &self.cert_pem).unwrap();
        std::fs::write(&files.key, &self.key_pem).unwrap();
        files
    }
}

/// A fresh directory for one test's files.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("router-listener-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Settings of a proxy serving TLS with `files`.
pub fn tls_settings(files: TlsFiles) -> Settings {
    Settings {
        tls: Some(files),
        ..Settings::default()
    }
}

/// A policy of one pool, `only`, of the endpoint `url`.
pub fn one_pool(url: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: only
      endpoints: ["{url}"]
  routes:
    - name: r
      chain: [only]
"#
    )
}

/// A TLS connection to `addr` for `localhost`, trusting `trusted`,
/// offering `alpn`.
pub async fn tls_connect(
    addr: SocketAddr,
    trusted: &[&Pair],
    alpn: &[&[u8]],
) -> std::io::Result<TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for p in trusted {
        roots.add(p.der.clone().into()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    connector.connect(name, tcp).await
}

/// An HTTP/2 client over `io` (h2c with prior knowledge on plain TCP).
pub async fn h2_client<S>(io: S) -> hyper::client::conn::http2::SendRequest<Full<Bytes>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    send
}

/// An HTTP/1.1 client over `io`.
pub async fn h1_client<S>(io: S) -> hyper::client::conn::http1::SendRequest<Full<Bytes>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .expect("h1 handshake");
    tokio::spawn(conn);
    send
}

/// A chat completion request to `base` (`http://host:port`, or https).
pub fn chat(base: &str, body: &str) -> Request<Full<Bytes>> {
    Request::post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// A plain chat body.
pub const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// A complete answer.
pub struct Answer {
    /// Status.
    pub status: StatusCode,
    /// Version it came over.
    pub version: Version,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

/// Reads a whole answer.
pub async fn read(resp: http::Response<hyper::body::Incoming>) -> Answer {
    let (parts, body) = resp.into_parts();
    Answer {
        status: parts.status,
        version: parts.version,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// The `http://127.0.0.1:PORT` of a proxy.
pub fn base(addr: SocketAddr) -> String {
    format!("http://127.0.0.1:{}", addr.port())
}

/// The `https://localhost:PORT` of a proxy.
pub fn tls_base(addr: SocketAddr) -> String {
    format!("https://localhost:{}", addr.port())
}
