//! The console over plain HTTP, without a browser: the headers on every
//! answer, sign-in and its refusals, one-time links, sign-out, cookies;
//! and the helpers the browser tests use to forge requests.

use std::net::SocketAddr;

use http::{Method, StatusCode};
use router_control_plane::auth::{OperatorToken, ProxyToken};
use router_control_plane::{start, ConsoleOptions, ControlPlaneOptions};
use router_tests::control::TOKEN;
use router_tests::harness::{TestClient, TestResponse};

/// The value of `name="NAME" value="..."` in a page.
fn field(page: &str, name: &str) -> Option<String> {
    let at = page.find(&format!("name=\"{name}\" value=\""))?;
    let rest = &page[at + name.len() + 15..];
    Some(rest[..rest.find('"')?].to_string())
}

/// The value a `Set-Cookie` of the answer gives cookie `name`.
fn set_cookie(r: &TestResponse, name: &str) -> Option<String> {
    r.headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| c.strip_prefix(&format!("{name}=")))
        .map(|rest| rest.split(';').next().unwrap_or_default().to_string())
}

/// The `Set-Cookie` header of cookie `name`, whole.
fn set_cookie_line(r: &TestResponse, name: &str) -> String {
    r.headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with(&format!("{name}=")))
        .unwrap_or_default()
        .to_string()
}

/// A POST of `body` (a form) with the session cookie `session`.
pub(super) async fn post(
    client: &TestClient,
    url: &str,
    session: &str,
    body: &str,
) -> TestResponse {
    let cookie = format!("router_console={session}");
    client
        .send(
            Method::POST,
            url,
            &[
                ("cookie", cookie.as_str()),
                ("content-type", "application/x-www-form-urlencoded"),
            ],
            body.to_string(),
        )
        .await
}

/// The CSRF token of session `session`, read from its fleet page.
pub(super) async fn csrf_of(client: &TestClient, console: &str, session: &str) -> String {
    let cookie = format!("router_console={session}");
    let page = client
        .send(
            Method::GET,
            &format!("{console}/fleet"),
            &[("cookie", cookie.as_str())],
            "",
        )
        .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text());
    field(&page.text(), "csrf").unwrap_or_else(|| panic!("no csrf field: {}", page.text()))
}

/// Signs in through the form (its double-submit value included) with
/// `token`: the answer.
async fn try_sign_in(client: &TestClient, console: &str, token: &str) -> TestResponse {
    let form = client
        .send(Method::GET, &format!("{console}/signin"), &[], "")
        .await;
    let nonce = set_cookie(&form, "router_console_signin").unwrap();
    assert_eq!(
        field(&form.text(), "nonce").as_deref(),
        Some(nonce.as_str())
    );
    let cookie = format!("router_console_signin={nonce}");
    client
        .send(
            Method::POST,
            &format!("{console}/signin"),
            &[
                ("cookie", cookie.as_str()),
                ("content-type", "application/x-www-form-urlencoded"),
            ],
            format!("nonce={nonce}&token={token}"),
        )
        .await
}

/// Signs in with `token`: the session cookie's value.
pub(super) async fn sign_in(client: &TestClient, console: &str, token: &str) -> String {
    let r = try_sign_in(client, console, token).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text());
    set_cookie(&r, "router_console").unwrap()
}

fn assert_console_headers(r: &TestResponse, what: &str) {
    assert_eq!(
        r.header("content-security-policy"),
        Some("default-src 'self'; frame-ancestors 'none'"),
        "{what}"
    );
    assert_eq!(
        r.header("x-content-type-options"),
        Some("nosniff"),
        "{what}"
    );
    assert_eq!(r.header("referrer-policy"), Some("no-referrer"), "{what}");
    assert_eq!(r.header("cache-control"), Some("no-store"), "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_sessions_links_and_headers_hold_without_a_browser() {
    let dir = std::env::temp_dir().join(format!("router-console-http-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let named = |token: &str, name: &str| OperatorToken {
        token: token.into(),
        name: Some(name.into()),
    };
    let cp = start(ControlPlaneOptions {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        store: router_control_plane::StoreLocation::Embedded(dir.clone()),
        token: Some(TOKEN.into()),
        proxy_tokens: vec![ProxyToken {
            token: "proxy-secret".into(),
            node: None,
        }],
        approver_tokens: vec![named("approver-secret", "abe")],
        viewer_tokens: vec![named("viewer-secret", "vera")],
        console: ConsoleOptions {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            ..ConsoleOptions::default()
        },
        ..Default::default()
    })
    .await
    .unwrap();
    let console = cp.console_url().unwrap();
    let client = TestClient::new();
    let get = |path: &str, session: Option<&str>| {
        let url = format!("{console}{path}");
        let cookie = session.map(|s| format!("router_console={s}"));
        let client = client.clone();
        async move {
            let headers: Vec<(&str, &str)> =
                cookie.iter().map(|c| ("cookie", c.as_str())).collect();
            client.send(Method::GET, &url, &headers, "").await
        }
    };

    // Signed out: pages send to the sign-in form; every answer carries
    // the console's headers, the stylesheet and script included.
    let r = get("/fleet", None).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(r.header("location"), Some("/signin"));
    assert_console_headers(&r, "redirect");
    for (path, kind) in [
        ("/signin", "text/html"),
        ("/static/console.css", "text/css"),
        ("/static/console.js", "text/javascript"),
    ] {
        let r = get(path, None).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert!(
            r.header("content-type").unwrap().starts_with(kind),
            "{path}"
        );
        assert_console_headers(&r, path);
        assert!(!r.text().contains("<script>"), "{path}: inline script");
        assert!(!r.text().contains("style="), "{path}: inline style");
    }

    // Unknown and proxy tokens do not sign in; nor does a POST without the
    // form's own value.
    for (token, status) in [
        ("nope", StatusCode::UNAUTHORIZED),
        ("", StatusCode::UNAUTHORIZED),
        ("proxy-secret", StatusCode::FORBIDDEN),
    ] {
        let r = try_sign_in(&client, &console, token).await;
        assert_eq!(r.status, status, "{token}: {}", r.text());
        assert!(set_cookie(&r, "router_console").is_none(), "{token}");
        assert!(
            !r.text().contains(token) || token.is_empty(),
            "the token is shown"
        );
    }
    let r = client
        .send(
            Method::POST,
            &format!("{console}/signin"),
            &[("content-type", "application/x-www-form-urlencoded")],
            "token=viewer-secret",
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text());

    // A viewer signs in: the cookie is HttpOnly, SameSite=Strict, for 8 h.
    let r = try_sign_in(&client, &console, "viewer-secret").await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(r.header("location"), Some("/fleet"));
    let line = set_cookie_line(&r, "router_console");
    assert!(
        line.ends_with("; HttpOnly; SameSite=Strict; Path=/; Max-Age=28800"),
        "{line}"
    );
    let viewer = set_cookie(&r, "router_console").unwrap();
    let page = get("/fleet", Some(&viewer)).await;
    assert_eq!(page.status, StatusCode::OK);
    assert_console_headers(&page, "fleet");
    assert!(page.text().contains("vera (viewer)"));
    for secret in ["viewer-secret", TOKEN, "approver-secret"] {
        assert!(!page.text().contains(secret), "a token shown");
    }

    // Sign-out needs the CSRF token, then ends the session.
    let csrf = csrf_of(&client, &console, &viewer).await;
    let r = post(&client, &format!("{console}/signout"), &viewer, "").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(get("/fleet", Some(&viewer)).await.status, StatusCode::OK);
    let r = post(
        &client,
        &format!("{console}/signout"),
        &viewer,
        &format!("csrf={csrf}"),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert!(set_cookie_line(&r, "router_console").contains("Max-Age=0"));
    assert_eq!(
        get("/fleet", Some(&viewer)).await.status,
        StatusCode::SEE_OTHER
    );

    // A one-time link signs in once, as the operator who started it.
    let link = cp.console_signin_link().unwrap();
    let path = link.strip_prefix(&console).unwrap().to_string();
    let r = get(&path, None).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text());
    let operator = set_cookie(&r, "router_console").unwrap();
    assert!(get("/fleet", Some(&operator))
        .await
        .text()
        .contains("operator"));
    let again = get(&path, None).await;
    assert_eq!(again.status, StatusCode::FORBIDDEN, "a link works once");
    assert!(set_cookie(&again, "router_console").is_none());

    // Tasks without a shared store: the page says how to get one.
    let tasks = get("/tasks", Some(&operator)).await;
    assert_eq!(tasks.status, StatusCode::OK);
    assert!(tasks.text().contains("--shared-store"), "{}", tasks.text());
    // Tenants too; decisions without a proxy say so; an unknown tenant
    // is a 404.
    let tenants = get("/tenants", Some(&operator)).await;
    assert_eq!(tenants.status, StatusCode::OK);
    assert!(
        tenants.text().contains("--shared-store"),
        "{}",
        tenants.text()
    );
    assert_eq!(
        get("/tenants?tenant=nobody", Some(&operator)).await.status,
        StatusCode::NOT_FOUND
    );
    let decisions = get("/decisions?route=%3Cb%3E", Some(&operator)).await;
    assert_eq!(decisions.status, StatusCode::OK);
    let page = decisions.text();
    assert!(page.contains("No proxy is connected"), "{page}");
    assert!(
        page.contains("value=\"&#60;b&#62;\"") && !page.contains("<b>"),
        "the filter, escaped: {page}"
    );

    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `curl -sk -i` (the console's answer head and body, over TLS).
fn curl(args: &[&str]) -> String {
    let o = std::process::Command::new("curl")
        .args(["-sk", "-i", "--max-time", "10"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("curl (scripts/install-test-deps installs it): {e}"));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Under TLS (the control plane's certificate) the console speaks HTTPS
/// only, and its cookies are `Secure`; a form body past 64 KiB is 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_tls_the_console_serves_https_and_its_cookies_are_secure() {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let dir = std::env::temp_dir().join(format!("router-console-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cp = start(ControlPlaneOptions {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        store: router_control_plane::StoreLocation::Embedded(dir.clone()),
        token: Some(TOKEN.into()),
        viewer_tokens: vec![OperatorToken {
            token: "viewer-secret".into(),
            name: None,
        }],
        tls: Some((ck.cert.pem(), ck.signing_key.serialize_pem())),
        console: ConsoleOptions {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            ..ConsoleOptions::default()
        },
        ..Default::default()
    })
    .await
    .unwrap();
    let console = cp.console_url().unwrap();
    assert!(console.starts_with("https://"), "{console}");
    let url = |path: &str| format!("{console}{path}");
    let form = tokio::task::spawn_blocking({
        let u = url("/signin");
        move || curl(&[&u])
    })
    .await
    .unwrap();
    assert!(form.starts_with("HTTP/1.1 200"), "{form}");
    let nonce = field(&form, "nonce").unwrap();
    assert!(
        form.contains(&format!(
            "router_console_signin={nonce}; HttpOnly; SameSite=Strict; Path=/; Max-Age=600; Secure"
        )),
        "{form}"
    );
    let signed = tokio::task::spawn_blocking({
        let u = url("/signin");
        let cookie = format!("router_console_signin={nonce}");
        let body = format!("nonce={nonce}&token=viewer-secret");
        move || curl(&["-b", &cookie, "--data", &body, &u])
    })
    .await
    .unwrap();
    assert!(signed.starts_with("HTTP/1.1 303"), "{signed}");
    assert!(
        signed.contains("; HttpOnly; SameSite=Strict; Path=/; Max-Age=28800; Secure"),
        "{signed}"
    );
    // Plain HTTP on the TLS port gets no page.
    let plain = tokio::task::spawn_blocking({
        let u = url("/signin").replace("https://", "http://");
        move || curl(&[&u])
    })
    .await
    .unwrap();
    assert!(!plain.contains("router console"), "{plain}");
    // A form body past 64 KiB: 413, nothing read further.
    let big = format!("nonce={nonce}&token={}", "x".repeat(70 * 1024));
    let too_big = tokio::task::spawn_blocking({
        let u = url("/signin");
        let cookie = format!("router_console_signin={nonce}");
        move || curl(&["-b", &cookie, "--data-binary", &big, &u])
    })
    .await
    .unwrap();
    assert!(too_big.starts_with("HTTP/1.1 413"), "{too_big}");
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
