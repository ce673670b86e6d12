//! Sending the drill's requests: one client request, retried as a client
//! would within the last try's grace, and its streamed ending read.

use super::*;

/// How long past the deadline a retrying client waits on its last try.
pub(super) const LAST_TRY_GRACE: Duration = Duration::from_millis(250);

/// A client that retries: the request goes to proxy `first mod N`; with no
/// answer within `client_timeout`, a failed connection or a `503`, the
/// same request (same key, what is left of `deadline`) goes to the next
/// proxy, at most 3 tries. The outcome is the last try's, timed from the
/// first send.
#[allow(clippy::too_many_arguments)]
pub(super) async fn send_retrying(
    client: &Client<HttpConnector, Full<Bytes>>,
    urls: &[String],
    first: usize,
    id: String,
    at: Instant,
    deadline: Duration,
    client_timeout: Duration,
    stream: bool,
) -> Outcome {
    let mut last = None;
    for try_no in 0..3 {
        let left = deadline.saturating_sub(at.elapsed());
        if left.is_zero() {
            break;
        }
        let url = &urls[(first + try_no) % urls.len()];
        // The last try waits for the router's own answer at the deadline
        // (a 504 arrives just as `left` runs out), with a grace a real
        // client allows: giving up at the same instant is a race the
        // drill would count as the router's failure.
        let wait = if try_no == 2 || client_timeout >= left {
            left + LAST_TRY_GRACE
        } else {
            client_timeout
        };
        let sent = send(client, url, id.clone(), at, Some(left), stream);
        match tokio::time::timeout(wait, sent).await {
            Ok(out) if out.status == 503 || out.status == 0 => {
                last = Some(Outcome {
                    retries: try_no,
                    ..out
                })
            }
            Ok(out) => {
                return Outcome {
                    retries: try_no,
                    ..out
                }
            }
            // The client gives up on this proxy (its request is dropped:
            // the connection closes) and retries on the next.
            Err(_) => {}
        }
    }
    last.unwrap_or(Outcome {
        id,
        sent_at: at,
        status: 0,
        route: None,
        error: Some("client timeout".into()),
        elapsed: at.elapsed(),
        retries: 2,
        ending: None,
        leaked: false,
    })
}

/// Sends one request; `deadline_left`: a retry's `X-Router-Deadline-Ms`
/// and `Idempotency-Key` (else the request id goes as `X-Request-Id`).
pub(super) async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &str,
    id: String,
    at: Instant,
    deadline_left: Option<Duration>,
    stream: bool,
) -> Outcome {
    let body = format!(
        r#"{{"model":"drill","stream":{stream},"messages":[{{"role":"user","content":"request {id}"}}]}}"#
    );
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(url)
        .header("content-type", "application/json");
    req = match deadline_left {
        Some(left) => req.header("idempotency-key", id.as_str()).header(
            "x-router-deadline-ms",
            left.as_millis().clamp(1, u128::from(u64::MAX)).to_string(),
        ),
        None => req.header("x-request-id", id.as_str()),
    };
    let req = req.body(Full::new(Bytes::from(body)));
    let mut out = Outcome {
        id,
        sent_at: at,
        status: 0,
        route: None,
        error: None,
        elapsed: Duration::ZERO,
        retries: 0,
        ending: None,
        leaked: false,
    };
    let Ok(req) = req else {
        out.error = Some("bad request".into());
        return out;
    };
    match client.request(req).await {
        Ok(resp) => {
            out.status = resp.status().as_u16();
            out.route = resp
                .headers()
                .get("x-router-route")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let body = resp.into_body().collect().await.map(|b| b.to_bytes());
            out.elapsed = at.elapsed();
            if stream && out.status == 200 {
                let text = body
                    .as_ref()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default();
                out.ending = Some(stream_ending(&text));
                // The mocks' error text: a backend's, never to be passed on.
                out.leaked = text.contains("CUDA");
            }
            if out.status != StatusCode::OK.as_u16() {
                out.error = body
                    .ok()
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .and_then(|v| v["error"]["type"].as_str().map(str::to_string))
                    .or_else(|| Some(format!("status_{}", out.status)));
            }
        }
        Err(e) => {
            out.elapsed = at.elapsed();
            out.error = Some(format!("transport: {e}"));
        }
    }
    out
}

/// How a streamed answer's text ends: `done`, the type of its last error
/// event, or `unfinished`.
pub(super) fn stream_ending(text: &str) -> String {
    if text.ends_with("data: [DONE]\n\n") {
        return "done".into();
    }
    let last = text.trim_end().rsplit("\n\n").next().unwrap_or_default();
    if last.starts_with("event: error") {
        if let Some(data) = last.split("data: ").nth(1) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(data) {
                if let Some(t) = v["error"]["type"].as_str() {
                    return t.to_string();
                }
            }
        }
    }
    "unfinished".into()
}

pub(super) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[rank]
}
