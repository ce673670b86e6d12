//! HTTPS to upstreams (rustls): a cloud-style base URL with a path, a
//! certificate verified against the configured roots.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use router_tests::harness::TestProxy;
use tokio::net::TcpListener;

use crate::settings;

/// A TLS server for `localhost` that echoes the path it was asked for.
async fn tls_backend() -> (u16, String) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert_pem = ck.cert.pem();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![ck.cert.der().clone()], key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
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
    (port, cert_pem)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstreams_with_a_base_path() {
    let (port, pem) = tls_backend().await;
    let dir = std::env::temp_dir().join(format!("router-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, pem).unwrap();

    let mut s = settings();
    s.upstream_ca_file = Some(ca);
    let proxy = TestProxy::sidecar(s).await;
    proxy
        .set_backends(&[format!("https://localhost:{port}/api/v1")])
        .await;
    let r = proxy.chat("m").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let body = r.json();
    // The client's /v1/... continues from the endpoint's own /api/v1.
    assert_eq!(body["path"], "/api/v1/chat/completions");
    assert_eq!(body["host"], format!("localhost:{port}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_is_refused() {
    let (port, _pem) = tls_backend().await;
    // Only the webpki roots: the self-signed certificate must not pass.
    let proxy = TestProxy::sidecar(settings()).await;
    proxy
        .set_backends(&[format!("https://localhost:{port}")])
        .await;
    let r = proxy.chat("m").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(r.error_type(), "upstream_error");
}
