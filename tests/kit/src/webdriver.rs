//! A real headless Chromium for browser tests, driven over the W3C
//! WebDriver HTTP protocol: Debian's `chromium` and `chromium-driver`
//! (or the binaries named by `CHROMIUM_BIN` and `CHROMEDRIVER_BIN`).
//!
//! [`Browser::start`] starts `chromedriver` on a free loopback port as a
//! child (stopped when dropped), opens a session with a headless Chromium
//! (`--headless=new --no-sandbox --disable-gpu`), and offers what the tests
//! need: navigate, find by CSS, click, type, clear a field, read the
//! page's source and an element's text, cookies, alerts, and screenshots
//! (PNG). The client is hyper-util's, over HTTP/1.1: no WebDriver crate.
//!
//! When Chromium or chromedriver is missing, [`Browser::start`] fails
//! with a message saying to run `scripts/install-test-deps`: a browser
//! test never passes without a browser.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use crate::child::ChildGuard;
use crate::BoxError;

/// The key of an element reference in WebDriver's answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long [`Browser::wait_for`] and [`Browser::wait_until_source`] wait.
pub const WAIT: Duration = Duration::from_secs(15);

/// An element of the current page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element(String);

/// A headless Chromium session.
pub struct Browser {
    port: u16,
    session: String,
    client: Client<HttpConnector, Full<Bytes>>,
    _driver: ChildGuard,
}

/// The binary `name` from `env_var`, else the first on `PATH` or in
/// `/usr/bin`; `None` when there is none.
fn binary(names: &[&str], env_var: &str) -> Option<PathBuf> {
    if let Ok(b) = std::env::var(env_var) {
        return Some(PathBuf::from(b));
    }
    let path = std::env::var("PATH").unwrap_or_default();
    for dir in path.split(':').chain(["/usr/bin", "/usr/local/bin"]) {
        for name in names {
            let candidate = Path::new(dir).join(name);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    None
}

const INSTALL: &str = "run scripts/install-test-deps (it installs Debian's chromium and \
                       chromium-driver), or set CHROMIUM_BIN and CHROMEDRIVER_BIN";

impl Browser {
    /// Starts chromedriver and a headless Chromium session (window
    /// 1280x900).
    pub async fn start() -> Result<Self, BoxError> {
        let chromium = binary(&["chromium", "chromium-browser"], "CHROMIUM_BIN")
            .ok_or_else(|| format!("Chromium is not installed: {INSTALL}"))?;
        let driver = binary(&["chromedriver"], "CHROMEDRIVER_BIN")
            .ok_or_else(|| format!("chromedriver is not installed: {INSTALL}"))?;
        let port = crate::server_process::free_port();
        let child = ChildGuard::spawn(
            "chromedriver",
            Command::new(&driver)
                .arg(format!("--port={port}"))
                .arg("--allowed-ips=127.0.0.1")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )?;
        let client = Client::builder(TokioExecutor::new()).build_http();
        let mut browser = Self {
            port,
            session: String::new(),
            client,
            _driver: child,
        };
        let until = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(v) = browser.call(Method::GET, "/status", None).await {
                if v["ready"] == true {
                    break;
                }
            }
            if tokio::time::Instant::now() > until {
                return Err("chromedriver did not become ready within 20 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.to_string_lossy(),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,900",
                         "--no-first-run", "--no-default-browser-check"],
            },
        }}});
        let v = browser.call(Method::POST, "/session", Some(caps)).await?;
        browser.session = v["sessionId"]
            .as_str()
            .ok_or_else(|| format!("no session id in {v}"))?
            .to_string();
        Ok(browser)
    }

    /// One WebDriver call: its `value`, or the error it names.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, BoxError> {
        let body = match (&method, body) {
            (_, Some(b)) => Bytes::from(b.to_string()),
            (&Method::POST, None) => Bytes::from_static(b"{}"),
            _ => Bytes::new(),
        };
        let req = Request::builder()
            .method(method)
            .uri(format!("http://127.0.0.1:{}{path}", self.port))
            .header("content-type", "application/json; charset=utf-8")
            .body(Full::new(body))?;
        let resp = tokio::time::timeout(Duration::from_secs(60), self.client.request(req))
            .await
            .map_err(|_| format!("WebDriver {path}: no answer within 60 s"))??;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| {
            format!(
                "WebDriver {path}: not JSON ({e}): {}",
                String::from_utf8_lossy(&bytes)
            )
        })?;
        let value = v.get("value").cloned().unwrap_or(Value::Null);
        if !status.is_success() {
            return Err(format!(
                "WebDriver {path}: {} {}: {}",
                status,
                value["error"].as_str().unwrap_or(""),
                value["message"].as_str().unwrap_or("")
            )
            .into());
        }
        Ok(value)
    }

    fn at(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    /// Navigates to `url` (returns once the page loaded).
    pub async fn goto(&self, url: &str) -> Result<(), BoxError> {
        self.call(Method::POST, &self.at("/url"), Some(json!({"url": url})))
            .await
            .map(|_| ())
    }

    /// The current page's URL.
    pub async fn url(&self) -> Result<String, BoxError> {
        let v = self.call(Method::GET, &self.at("/url"), None).await?;
        Ok(v.as_str().unwrap_or_default().to_string())
    }

    /// The current page's source (the DOM as serialized now).
    pub async fn source(&self) -> Result<String, BoxError> {
        let v = self.call(Method::GET, &self.at("/source"), None).await?;
        Ok(v.as_str().unwrap_or_default().to_string())
    }

    /// The first element matching the CSS `selector`.
    pub async fn find(&self, selector: &str) -> Result<Element, BoxError> {
        let v = self
            .call(
                Method::POST,
                &self.at("/element"),
                Some(json!({"using": "css selector", "value": selector})),
            )
            .await?;
        v[ELEMENT]
            .as_str()
            .map(|id| Element(id.to_string()))
            .ok_or_else(|| format!("no element reference in {v}").into())
    }

    /// Every element matching the CSS `selector`.
    pub async fn find_all(&self, selector: &str) -> Result<Vec<Element>, BoxError> {
        let v = self
            .call(
                Method::POST,
                &self.at("/elements"),
                Some(json!({"using": "css selector", "value": selector})),
            )
            .await?;
        Ok(v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e[ELEMENT].as_str().map(|id| Element(id.to_string())))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Waits ([`WAIT`] at most) until an element matches `selector`.
    pub async fn wait_for(&self, selector: &str) -> Result<Element, BoxError> {
        let until = tokio::time::Instant::now() + WAIT;
        loop {
            match self.find(selector).await {
                Ok(e) => return Ok(e),
                Err(e) if tokio::time::Instant::now() > until => {
                    return Err(format!("no {selector:?} within {WAIT:?}: {e}").into())
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Waits ([`WAIT`] at most) until the page's source contains `text`.
    pub async fn wait_until_source(&self, text: &str) -> Result<String, BoxError> {
        let until = tokio::time::Instant::now() + WAIT;
        loop {
            let source = self.source().await?;
            if source.contains(text) {
                return Ok(source);
            }
            if tokio::time::Instant::now() > until {
                return Err(format!("the page never showed {text:?}; it shows:\n{source}").into());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Clicks `e`.
    pub async fn click(&self, e: &Element) -> Result<(), BoxError> {
        self.call(
            Method::POST,
            &self.at(&format!("/element/{}/click", e.0)),
            None,
        )
        .await
        .map(|_| ())
    }

    /// Types `text` into `e`.
    pub async fn send_keys(&self, e: &Element, text: &str) -> Result<(), BoxError> {
        self.call(
            Method::POST,
            &self.at(&format!("/element/{}/value", e.0)),
            Some(json!({"text": text})),
        )
        .await
        .map(|_| ())
    }

    /// Empties the form field `e` (a text input or a textarea).
    pub async fn clear(&self, e: &Element) -> Result<(), BoxError> {
        self.call(
            Method::POST,
            &self.at(&format!("/element/{}/clear", e.0)),
            None,
        )
        .await
        .map(|_| ())
    }

    /// `e`'s rendered text.
    pub async fn text(&self, e: &Element) -> Result<String, BoxError> {
        let v = self
            .call(
                Method::GET,
                &self.at(&format!("/element/{}/text", e.0)),
                None,
            )
            .await?;
        Ok(v.as_str().unwrap_or_default().to_string())
    }

    /// The current value of the form field `e` (what was typed into it,
    /// not the `value` attribute it was drawn with).
    pub async fn value(&self, e: &Element) -> Result<String, BoxError> {
        let v = self
            .call(
                Method::GET,
                &self.at(&format!("/element/{}/property/value", e.0)),
                None,
            )
            .await?;
        Ok(v.as_str().unwrap_or_default().to_string())
    }

    /// The value of cookie `name` for the current page (HttpOnly ones
    /// included: WebDriver sees them), if set.
    pub async fn cookie(&self, name: &str) -> Result<Option<Value>, BoxError> {
        let v = self.call(Method::GET, &self.at("/cookie"), None).await?;
        Ok(v.as_array()
            .and_then(|a| a.iter().find(|c| c["name"] == name).cloned()))
    }

    /// The text of an open alert, if one is open.
    pub async fn alert_text(&self) -> Result<Option<String>, BoxError> {
        match self.call(Method::GET, &self.at("/alert/text"), None).await {
            Ok(v) => Ok(Some(v.as_str().unwrap_or_default().to_string())),
            Err(e) if e.to_string().contains("no such alert") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A screenshot of the window, PNG.
    pub async fn screenshot(&self) -> Result<Vec<u8>, BoxError> {
        let v = self
            .call(Method::GET, &self.at("/screenshot"), None)
            .await?;
        let b64 = v.as_str().ok_or("no screenshot in the answer")?;
        Ok(base64::engine::general_purpose::STANDARD.decode(b64)?)
    }

    /// Writes a screenshot of the window to `path` (PNG).
    pub async fn screenshot_to(&self, path: &Path) -> Result<(), BoxError> {
        let png = self.screenshot().await?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, png)?;
        Ok(())
    }

    /// Ends the session (Chromium quits); chromedriver stops when the
    /// browser is dropped.
    pub async fn quit(mut self) -> Result<(), BoxError> {
        let path = self.at("");
        self.session.clear();
        self.call(Method::DELETE, &path, None).await.map(|_| ())
    }
}

impl Drop for Browser {
    /// A session still open (a test that failed) is ended with a plain
    /// blocking DELETE, so that Chromium quits before chromedriver stops.
    fn drop(&mut self) {
        if self.session.is_empty() {
            return;
        }
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let req = format!(
            "DELETE /session/{} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            self.session, self.port
        );
        if s.write_all(req.as_bytes()).is_ok() {
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink);
        }
    }
}
