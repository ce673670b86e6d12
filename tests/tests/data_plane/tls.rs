//! HTTPS to upstreams (rustls): a cloud-style base URL with a path, a
//! certificate verified against the configured roots.

use http::StatusCode;
use router_tests::harness::TestProxy;

use crate::settings;

/// A TLS server for `localhost` that echoes the path it was asked for
/// (the mock crate's, `router_mock::tls`).
async fn tls_backend() -> (u16, String) {
    let echo = router_mock::tls::echo().await.expect("the TLS mock starts");
    (echo.port, echo.cert_pem)
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
