//! A multi-turn agent session as Claude Code sends it (issue 29): a
//! system prompt with `cache_control`, tools, thinking, `tool_use` /
//! `tool_result` turns and an image, streamed, with its key as
//! `x-api-key` and its session header, through a tenant with a budget.
//!
//! First through the chain "Anthropic pool answering 529, then a local
//! OpenAI-compatible pool": every turn is answered by the local pool
//! within its deadline (after Claude's 529, or passing Claude over while
//! its endpoint is suspect), as a well-formed Anthropic stream, and the
//! tenant's spend is exactly what the answers' usage costs. Then against
//! an Anthropic pool that caches the prompt: the first turn writes the
//! cache, the next ones read it, and the cached tokens are counted once
//! and priced at their own rates.

use std::time::Duration;

use http::{Method, StatusCode};
use router_dialect::check::anthropic_stream;
use router_mock::Behavior;
use router_policy::document::Price;
use router_policy::tenant::micros;
use router_policy::usage::Tokens;
use router_proxy::Settings;
use router_tests::harness::{eventually, tenant_item, TestProxy, TestResponse};
use router_tests::mocks::mock;
use router_tests::redis::RedisServer;
use serde_json::{json, Value};
use tokio::time::Instant;

const MODEL: &str = "claude-sonnet-4-5";
const KEY: &str = "rt_agent_key";
const DEADLINE_MS: u64 = 5_000;

/// The prices of the two pools.
const CLAUDE_PRICE: Price = Price {
    input_per_1k_usd: 3.0,
    output_per_1k_usd: 15.0,
    cache_read_per_1k_usd: 0.3,
    cache_write_per_1k_usd: 3.75,
};
const LOCAL_PRICE: Price = Price {
    input_per_1k_usd: 0.2,
    output_per_1k_usd: 0.6,
    cache_read_per_1k_usd: 0.2,
    cache_write_per_1k_usd: 0.2,
};

/// Claude (`provider: anthropic`), then, when given, the local pool; a
/// tenant `team-a` with a day budget; the route's deadline.
fn policy(claude: &str, local: Option<&str>) -> String {
    std::env::set_var("TEST_AGENT_SESSION_CLAUDE_API_KEY", "sk-ant-pool-key");
    let (local_pool, chain) = match local {
        Some(u) => (
            format!(
                "    - name: local\n      model: qwen3\n      endpoints: [\"{u}\"]\n      price: {{input_per_1k_usd: 0.2, output_per_1k_usd: 0.6}}\n"
            ),
            "claude, local",
        ),
        None => (String::new(), "claude"),
    };
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: claude
      provider: anthropic
      model: claude-sonnet-4-5-20250929
      endpoints: ["{claude}"]
      api_key_env: TEST_AGENT_SESSION_CLAUDE_API_KEY
      price: {{input_per_1k_usd: 3.0, output_per_1k_usd: 15.0, cache_read_per_1k_usd: 0.3, cache_write_per_1k_usd: 3.75}}
{local_pool}  routes:
    - name: agents
      match: {{model: ["{MODEL}"]}}
      chain: [{chain}]
      deadline_ms: {DEADLINE_MS}
  tenants:
{}"#,
        tenant_item("team-a", KEY, "budget_usd_per_day: 100")
    )
}

/// The session's fixed part: Claude Code's system prompt (cached), its
/// tools, thinking.
fn request(messages: &[Value]) -> Value {
    json!({
        "model": MODEL,
        "max_tokens": 4096,
        "stream": true,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "system": [
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
            {"type": "text", "text": "Use the tools to read files. ".repeat(60),
             "cache_control": {"type": "ephemeral"}}
        ],
        "tools": [{
            "name": "Read",
            "description": "Reads a file from the local filesystem.",
            "input_schema": {"type": "object", "properties": {"text": {"type": "string"}},
                             "required": ["text"]}
        }],
        "metadata": {"user_id": "user_abc_account_def_session_0f3c"},
        "messages": messages,
    })
}

/// One turn as Claude Code sends it.
async fn turn(proxy: &TestProxy, body: &Value) -> (TestResponse, Duration) {
    let headers = [
        ("content-type", "application/json"),
        ("anthropic-version", "2023-06-01"),
        (
            "anthropic-beta",
            "claude-code-20250219,interleaved-thinking-2025-05-14",
        ),
        ("x-api-key", KEY),
        ("x-claude-code-session-id", "0f3c9a57-session"),
        ("x-app", "cli"),
    ];
    let t0 = Instant::now();
    let r = proxy
        .client
        .send(
            Method::POST,
            &proxy.url("/v1/messages?beta=true"),
            &headers,
            body.to_string(),
        )
        .await;
    (r, t0.elapsed())
}

/// A 1x1 PNG: the screenshot of the last turn.
const IMAGE_PNG_BASE64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/PchI7wAAAABJRU5ErkJggg==";

/// Today's spend key of `team-a`.
fn spend_key() -> String {
    let now = router_policy::wall_clock::since_epoch().as_secs();
    format!(
        "router:spend:team-a:{}",
        router_policy::tenant::periods(now).0
    )
}

/// Runs the session against `proxy`: each turn checked (answered within
/// the deadline, a well-formed Anthropic stream); the streams' summaries.
async fn run_session(proxy: &TestProxy) -> Vec<router_dialect::check::Said> {
    let mut history = vec![json!({"role": "user", "content": [
        {"type": "text", "text": "List the files in this project."}
    ]})];
    let mut said = Vec::new();
    for step in 0..3 {
        let (r, took) = turn(proxy, &request(&history)).await;
        assert_eq!(r.status, StatusCode::OK, "turn {step}: {}", r.text());
        assert!(
            took < Duration::from_millis(DEADLINE_MS),
            "turn {step} took {took:?}"
        );
        assert_eq!(
            r.header("content-type"),
            Some("text/event-stream"),
            "turn {step}"
        );
        let s =
            anthropic_stream(&r.body).unwrap_or_else(|e| panic!("turn {step}: {e}: {}", r.text()));
        assert!(s.error.is_none(), "turn {step}: {:?}", s.error);
        // The assistant's turn goes into the history as the client got it.
        let mut content = Vec::new();
        if !s.text.is_empty() {
            content.push(json!({"type": "text", "text": s.text}));
        }
        for (id, name, input) in &s.tools {
            let input: Value = serde_json::from_str(input)
                .unwrap_or_else(|e| panic!("turn {step}: tool input {input:?} is not JSON: {e}"));
            content.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
        }
        history.push(json!({"role": "assistant", "content": content}));
        let next = match (step, s.tools.first()) {
            // The tool's result, as Claude Code sends it back.
            (0, Some((id, _, _))) => json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": id, "content": "Cargo.toml src/ tests/"}
            ]}),
            (0, None) => panic!("turn 0 called no tool: {}", r.text()),
            // A screenshot, then a question about it.
            _ => json!({"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": IMAGE_PNG_BASE64}},
                {"type": "text", "text": "What does this screenshot show?"}
            ]}),
        };
        history.push(next);
        said.push(s);
    }
    said
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_session_falls_over_from_an_overloaded_claude_to_a_local_pool_with_exact_spend(
) {
    let redis = RedisServer::start("agent-session-529").await;
    let claude = mock("claude", Behavior::Status(529)).await;
    let local = mock("local", Behavior::Chat).await;
    let proxy = TestProxy::on_store(
        &redis,
        Settings::default(),
        &policy(&claude.url(), Some(&local.url())),
    )
    .await;
    let said = run_session(&proxy).await;

    // Turn 0 called the tool, turn 1 answered from its result.
    assert_eq!(said[0].stop_reason.as_deref(), Some("tool_use"));
    assert_eq!(said[0].tools[0].1, "Read");
    assert_eq!(said[1].stop_reason.as_deref(), Some("end_turn"));
    assert_eq!(said[1].text, "tool said: Cargo.toml src/ tests/");

    // Every turn: Claude's 529 first, then the local pool.
    let lines = proxy.log.wait_for(3).await;
    let sent = local.requests();
    assert_eq!(sent.len(), 3);
    let mut expected_spend = 0;
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["final_route"], "local", "turn {i}: {line}");
        // Claude answers 529; once it did, its endpoint is suspect and
        // later turns pass it over while the local pool is clean (saying
        // so), instead of paying for another 529 first.
        let tried_claude = line["attempts"][0]["pool"] == "claude";
        if tried_claude {
            assert_eq!(line["attempts"][0]["status"], 529, "turn {i}: {line}");
        } else {
            assert_eq!(
                line["walk"][0]["note"], "passed_over_marked",
                "turn {i}: {line}"
            );
            assert_eq!(line["walk"][0]["pool"], "claude", "turn {i}: {line}");
            let reason = line["reason"].as_str().unwrap_or_default();
            assert!(
                reason.contains("claude: skipped, every endpoint suspect"),
                "turn {i}: {line}"
            );
        }
        assert!(i > 0 || tried_claude, "turn 0 went to Claude first: {line}");
        // The dialect in, and the one each attempt spoke.
        assert_eq!(line["dialect"], "anthropic", "turn {i}");
        let attempts = line["attempts"].as_array().unwrap();
        let last = attempts.last().unwrap();
        assert_eq!(last["dialect"], "openai", "turn {i}: {line}");
        if attempts.len() == 2 {
            assert_eq!(attempts[0]["dialect"], "anthropic", "turn {i}: {line}");
        }
        // The local pool got the turn in OpenAI's dialect: the tool result
        // as a `tool` message, the image as a data URL, no thinking.
        let body: Value = serde_json::from_slice(&sent[i].body).unwrap();
        assert_eq!(body["model"], "qwen3");
        assert!(body.get("thinking").is_none(), "turn {i}: {body}");
        if i == 1 {
            let tool = body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["role"] == "tool")
                .unwrap_or_else(|| panic!("no tool message: {body}"));
            assert_eq!(tool["content"], "Cargo.toml src/ tests/");
        }
        if i == 2 {
            let last = body["messages"].as_array().unwrap().last().unwrap();
            assert_eq!(
                last["content"][0]["image_url"]["url"],
                format!("data:image/png;base64,{IMAGE_PNG_BASE64}")
            );
        }
        // The backend's usage (the mock counts its body's bytes / 4), what
        // the client was told, and what the route log says, all agree.
        let prompt = (sent[i].body.len() as u64).div_ceil(4);
        let usage = said[i].usage.expect("usage in the stream");
        assert_eq!(usage.prompt(), prompt, "turn {i}");
        assert_eq!(line["tokens_in"], prompt, "turn {i}");
        assert_eq!(line["tokens_out"], usage.output, "turn {i}");
        let tokens = Tokens {
            prompt,
            output: usage.output,
            cache_read: 0,
            cache_write: 0,
        };
        expected_spend += micros(LOCAL_PRICE.cost_of(&tokens));
    }
    // Claude generated nothing (529s): the spend is the local answers'.
    assert!(claude.stats().received >= 1);
    eventually(
        Duration::from_secs(5),
        "the session's spend settled",
        || redis.get(&spend_key()) == Some(expected_spend.to_string()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_session_on_claude_counts_its_cached_prompt_once_at_its_own_prices() {
    let redis = RedisServer::start("agent-session-cache").await;
    let claude = mock("claude", Behavior::Anthropic).await;
    let proxy =
        TestProxy::on_store(&redis, Settings::default(), &policy(&claude.url(), None)).await;
    let said = run_session(&proxy).await;
    let lines = proxy.log.wait_for(3).await;
    let mut expected_spend = 0;
    let mut read_total = 0;
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["final_route"], "claude", "turn {i}: {line}");
        let u = said[i].usage.expect("usage in the stream");
        // Turn 0 writes the cached system prompt, the later ones read it.
        if i == 0 {
            assert!(u.cache_write > 100 && u.cache_read == 0, "turn 0: {u:?}");
        } else {
            assert!(u.cache_read > 100 && u.cache_write == 0, "turn {i}: {u:?}");
        }
        read_total += u.cache_read;
        // The route log's input is the whole prompt, the cache parts of it
        // named apart: never counted twice.
        assert_eq!(line["tokens_in"], u.prompt(), "turn {i}: {line}");
        assert_eq!(line["tokens_out"], u.output, "turn {i}");
        let (read, write) = (
            line["cache_read_tokens"].as_u64().unwrap_or(0),
            line["cache_write_tokens"].as_u64().unwrap_or(0),
        );
        assert_eq!((read, write), (u.cache_read, u.cache_write), "turn {i}");
        let tokens = Tokens {
            prompt: u.prompt(),
            output: u.output,
            cache_read: u.cache_read,
            cache_write: u.cache_write,
        };
        let cost = CLAUDE_PRICE.cost_of(&tokens);
        assert_eq!(line["cost_usd"].as_f64(), Some(cost), "turn {i}");
        expected_spend += micros(cost);
    }
    eventually(
        Duration::from_secs(5),
        "the session's spend settled",
        || redis.get(&spend_key()) == Some(expected_spend.to_string()),
    )
    .await;
    // The metrics count the cache reads as part of the input, once.
    let metrics = proxy.metrics().await;
    let line = format!(r#"router_tokens_total{{pool="claude",kind="cache_read"}} {read_total}"#);
    assert!(metrics.contains(&line), "{line} not in {metrics}");
}
