//! Item 9: a credential that is present but is not a valid key (another
//! scheme, a key in the wrong place, bytes that are not text, an empty
//! `Bearer`) was served as the anonymous tenant. Any credential present
//! and not a key is 401 now.

use std::io::{Read, Write};

use router_mock::Behavior;
use router_tests::mocks::mock;
use router_tests::proxy_process::ProxyProcess;

/// Sends `request` as raw bytes and returns the answer's status code.
fn raw_status(port: u16, request: &[u8]) -> u16 {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    s.write_all(request).unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap();
    std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap()
}

fn request_with(authorization: &[u8]) -> Vec<u8> {
    let body = super::chat_body("");
    let mut r = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(b"authorization: ");
    r.extend_from_slice(authorization);
    r.extend_from_slice(b"\r\n\r\n");
    r.extend_from_slice(body.as_bytes());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_that_is_not_a_key_is_refused_even_with_an_anonymous_tenant() {
    let backend = mock("local", Behavior::Json).await;
    let mut tenants = vec![super::tenant("team-a", "rt_team_a", "")];
    tenants.push("    - name: guests\n      anonymous: true\n".into());
    let doc = super::policy(&[("local", &backend.url(), "")], "", &tenants);
    let proxy = ProxyProcess::start("credentials", &doc, &[]);
    let no_credential = {
        let body = super::chat_body("");
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    // No credential at all: the anonymous tenant. A real key: its tenant.
    assert_eq!(raw_status(proxy.port, no_credential.as_bytes()), 200);
    assert_eq!(
        raw_status(proxy.port, &request_with(b"Bearer rt_team_a")),
        200
    );
    for shape in [
        &b"Basic cnRfdGVhbV9hOg=="[..],
        b"Token rt_team_a",
        b"Bearer \xff\xfe\xfd",
        b"Bearer ",
        b"Bearer",
        b"rt_team_a",
    ] {
        assert_eq!(
            raw_status(proxy.port, &request_with(shape)),
            401,
            "{:?}",
            String::from_utf8_lossy(shape)
        );
    }
    assert_eq!(backend.stats().received, 2);
}
