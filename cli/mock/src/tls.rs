//! A model endpoint behind TLS, for tests of HTTPS upstreams (feature
//! `tls`): a self-signed certificate for `localhost`, made on start, and a
//! server that answers every request with the path and `Host` it was
//! asked for (so a test sees the base path and the name the proxy sent).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Why the TLS endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum TlsMockError {
    /// The certificate could not be made.
    #[error("certificate: {0}")]
    Certificate(String),
    /// rustls refused the configuration.
    #[error("TLS setup: {0}")]
    Tls(String),
    /// The listener could not be bound.
    #[error("listen: {0}")]
    Listen(#[from] std::io::Error),
}

/// A running TLS echo endpoint.
#[derive(Debug, Clone)]
pub struct TlsEcho {
    /// Its port on 127.0.0.1 (the certificate names `localhost`).
    pub port: u16,
    /// The certificate, PEM: the CA a client must trust.
    pub cert_pem: String,
}

/// Starts a TLS endpoint for `localhost` that answers `{"path", "host"}`.
pub async fn echo() -> Result<TlsEcho, TlsMockError> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])
        .map_err(|e| TlsMockError::Certificate(e.to_string()))?;
    let cert_pem = ck.cert.pem();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| TlsMockError::Tls(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(vec![ck.cert.der().clone()], key)
    .map_err(|e| TlsMockError::Tls(e.to_string()))?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = service_fn(|req: Request<Incoming>| async move {
                    let body = serde_json::json!({
                        "path": req.uri().path(),
                        "host": req.headers().get("host").and_then(|h| h.to_str().ok()),
                    });
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body.to_string()))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    Ok(TlsEcho { port, cert_pem })
}
