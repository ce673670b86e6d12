//! The listener's certificate is reloaded when its files change; a broken
//! new pair keeps the old one serving.

use std::time::Duration;

use http::StatusCode;
use router_proxy::Mode;
use router_tests::harness::TestProxy;
use router_tests::mocks::mock_latency;

use crate::{chat, h2_client, read, temp_dir, tls_base, tls_connect, tls_settings, Pair, CHAT};

/// The certificate the proxy presents to a client that trusts `trusted`
/// (none when the handshake fails).
async fn presented(addr: std::net::SocketAddr, trusted: &[&Pair]) -> Option<Vec<u8>> {
    let tls = tls_connect(addr, trusted, &[b"h2"]).await.ok()?;
    let der = tls.get_ref().1.peer_certificates()?.first()?.to_vec();
    // And it serves.
    let mut h2 = h2_client(tls).await;
    let a = read(h2.send_request(chat(&tls_base(addr), CHAT)).await.ok()?).await;
    assert_eq!(a.status, StatusCode::OK);
    Some(der)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_pair_is_served_and_a_broken_one_keeps_the_old() {
    let backend = mock_latency("b", 0).await;
    let (a, b) = (Pair::generate(), Pair::generate());
    let dir = temp_dir("reload");
    let files = a.write(&dir);
    let settings = router_proxy::Settings {
        tls_poll_interval: Duration::from_millis(100),
        ..tls_settings(files.clone())
    };
    let policy = router_policy::document::load(
        &crate::one_pool(&backend.url()),
        &router_policy::QueueSettings::default(),
    )
    .unwrap();
    let proxy = TestProxy::start(settings, Mode::Inline(Box::new(policy))).await;
    let addr = proxy.addr();
    let both = [&a, &b];
    assert_eq!(presented(addr, &both).await, Some(a.der.clone()));
    // An open connection keeps working across the change.
    let tls = tls_connect(addr, &[&a], &[b"h2"]).await.unwrap();
    let mut kept = h2_client(tls).await;

    // Replaced: new handshakes present the new certificate.
    b.write(&dir);
    let mut now = None;
    for _ in 0..100 {
        now = presented(addr, &both).await;
        if now.as_deref() == Some(&b.der[..]) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(now, Some(b.der.clone()), "the new certificate is presented");
    let r = read(
        kept.send_request(chat(&tls_base(addr), CHAT))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);

    // Broken: the certificate file half-written, then a key of another
    // pair. Neither is used; b goes on serving.
    std::fs::write(&files.cert, "-----BEGIN CERTIFICATE-----\nMIIB").unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(presented(addr, &both).await, Some(b.der.clone()));
    std::fs::write(&files.cert, &b.cert_pem).unwrap();
    std::fs::write(&files.key, &a.key_pem).unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(presented(addr, &both).await, Some(b.der.clone()));
    // Mended: the next change is tried again.
    a.write(&dir);
    let mut now = None;
    for _ in 0..100 {
        now = presented(addr, &both).await;
        if now.as_deref() == Some(&a.der[..]) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(now, Some(a.der.clone()));
}
