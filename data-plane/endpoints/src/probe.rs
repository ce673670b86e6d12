//! Capacity probes: what the backends say about their own load.
//!
//! - `ollama`: `GET /api/ps` lists the models resident in memory and the
//!   VRAM each holds; free VRAM is the configured total minus their sum,
//!   and the resident list lets the balancer prefer an endpoint where the
//!   pool's model is already loaded (a cold load costs seconds).
//! - `vllm`, `sglang`, `tgi`: `GET /metrics` (Prometheus text) gives the
//!   requests waiting inside the server, added to the pool's queue depth
//!   for the `max_queue_depth` gate, the requests running in its batch and
//!   the KV-cache usage, which engine-aware balancing
//!   ([`router_policy::engine_aware`]) goes by. The names read (whatever
//!   the probe's kind: a page has one engine's names):
//!
//!   | signal | vLLM | SGLang | TGI |
//!   |---|---|---|---|
//!   | waiting | `vllm:num_requests_waiting` | `sglang:num_queue_reqs` | `tgi_queue_size` |
//!   | running | `vllm:num_requests_running` | `sglang:num_running_reqs` | `tgi_batch_current_size` |
//!   | KV use (0..1) | `vllm:kv_cache_usage_perc`, older `vllm:gpu_cache_usage_perc` | `sglang:token_usage` | none |
//!
//!   Counts are summed over label sets (data-parallel engines behind one
//!   port), KV usage is the highest. A page is at most 4 MiB, one GET per
//!   endpoint per round, each bounded by the probe's `timeout_ms`: a
//!   bounded cost.
//!
//! Each pool with a `capacity_probe` has one task polling its endpoints in
//! rounds: every endpoint at once, each poll bounded by `timeout_ms` (its
//! own setting, 1 s by default, not the interval), then `interval_ms`
//! before the next round. What the endpoint may do with what the probes
//! said is [`router_policy::probe`]'s rule: a failed probe (refused, timed
//! out, an answer that does not parse) keeps the last answer and counts a
//! failure; `unhealthy_after` failures in a row (3 by default) make the
//! endpoint unusable until a probe answers again; an endpoint never
//! answered, or whose last answer is stale, takes no requests.
//!
//! This module knows nothing of pools: a probe task polls whatever
//! implements [`Probed`] (a pool does) and hands it [`ProbeReading`]s, which
//! the pool keeps and judges with [`ProbeReading::usable`].

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use router_policy::engine_aware::EngineSignals;
use router_policy::probe::ProbeRecord;
use router_policy::{Endpoint, Probe, ProbeKind};
use serde::Deserialize;
use tokio::time::Instant;

use router_upstream::forward::UpstreamClient;

/// Largest probe answer read.
const PROBE_BODY_LIMIT: usize = 4 * 1024 * 1024;

/// What the capacity probes last saw at one endpoint: the last answer (its
/// time and numbers) and the failures since.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProbeReading {
    /// When the last answer came (when the probe failed, if none ever did).
    pub at: Instant,
    /// Whether a probe ever answered, failures in a row since.
    pub record: ProbeRecord,
    /// Free VRAM, MB (Ollama).
    pub vram_free_mb: Option<u64>,
    /// Models resident in memory (Ollama).
    pub resident: Vec<String>,
    /// Requests waiting inside the server (vLLM, SGLang, TGI).
    pub waiting: Option<u32>,
    /// Requests running in the server's batch (vLLM, SGLang, TGI).
    pub running: Option<u32>,
    /// KV-cache usage, 0..1 (vLLM, SGLang).
    pub kv_cache_usage: Option<f64>,
    /// The KV cache's size in tokens (vLLM's `vllm:cache_config_info`:
    /// `num_gpu_blocks × block_size`), for prefix affinity's index.
    pub cache_tokens: Option<u64>,
}

impl ProbeReading {
    /// What the engine said, for engine-aware balancing.
    pub(crate) fn signals(&self) -> EngineSignals {
        EngineSignals {
            waiting: self.waiting,
            running: self.running,
            kv_usage: self.kv_cache_usage,
        }
    }
}

impl ProbeReading {
    /// A failed probe's reading, at `at`, when nothing was known before.
    fn failed(at: Instant) -> Self {
        Self {
            at,
            record: ProbeRecord::default().after_failure(),
            vram_free_mb: None,
            resident: Vec::new(),
            waiting: None,
            running: None,
            kv_cache_usage: None,
            cache_tokens: None,
        }
    }

    /// What to keep after a probe: its answer (`Some`), or, when it failed
    /// (`None`, at `now`), the last answer with one more failure counted.
    pub(crate) fn after(previous: Option<Self>, answer: Option<Self>, now: Instant) -> Self {
        match (answer, previous) {
            (Some(a), previous) => Self {
                record: previous.map_or(a.record, |p| p.record).after_answer(),
                ..a
            },
            (None, Some(p)) => Self {
                record: p.record.after_failure(),
                ..p
            },
            (None, None) => Self::failed(now),
        }
    }

    /// Whether this reading lets the endpoint take requests as of `now`
    /// ([`router_policy::probe::admits`]: answered, fewer than
    /// `unhealthy_after` failures since, the answer not stale).
    #[inline]
    pub(crate) fn usable(&self, probe: &Probe, now: Instant) -> bool {
        router_policy::probe::admits(probe, self.record, now.saturating_duration_since(self.at))
    }
}

/// What a probe task polls, and tells what it saw (a pool).
pub(crate) trait Probed: Send + Sync + 'static {
    /// The endpoints to poll now.
    fn probe_targets(&self) -> Vec<Endpoint>;

    /// Records what the probe saw at `endpoint`: its answer, or `None`
    /// when it failed (see [`ProbeReading::after`]).
    fn record_probe(self: &Arc<Self>, endpoint: &Endpoint, answer: Option<ProbeReading>);
}

#[derive(Deserialize)]
struct OllamaPs {
    #[serde(default)]
    models: Vec<OllamaModel>,
}

#[derive(Deserialize)]
struct OllamaModel {
    #[serde(default)]
    name: String,
    #[serde(default)]
    model: String,
    #[serde(default)]
    size_vram: u64,
}

/// Why a probe got no reading from an endpoint (logged at debug; the
/// endpoint's reading then counts as failed).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    /// The probe's request could not be built.
    #[error("cannot build the probe request: {0}")]
    Request(#[from] http::Error),
    /// The endpoint could not be reached.
    #[error(transparent)]
    Send(#[from] router_upstream::client::UpstreamError),
    /// The endpoint answered, not with a success.
    #[error("status {0}")]
    Status(http::StatusCode),
    /// The answer's body could not be read (or passed the limit).
    #[error("cannot read the answer: {0}")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// No answer within the probe's timeout.
    #[error("probe timed out")]
    TimedOut,
    /// An Ollama `/api/ps` answer that does not parse.
    #[error("bad /api/ps answer: {0}")]
    OllamaPs(#[from] serde_json::Error),
    /// A `/metrics` page without any engine's load.
    #[error("no engine metrics (vllm, sglang, tgi) in the answer")]
    NoEngineMetrics,
}

/// Free VRAM (MB) and resident models from an `/api/ps` answer.
pub(crate) fn parse_ollama_ps(
    body: &[u8],
    vram_total_mb: Option<u64>,
) -> Result<(Option<u64>, Vec<String>), ProbeError> {
    let ps: OllamaPs = serde_json::from_slice(body)?;
    let used_mb: u64 = ps.models.iter().map(|m| m.size_vram / (1024 * 1024)).sum();
    let free = vram_total_mb.map(|t| t.saturating_sub(used_mb));
    let resident = ps
        .models
        .into_iter()
        .flat_map(|m| [m.name, m.model])
        .filter(|n| !n.is_empty())
        .collect();
    Ok((free, resident))
}

/// One sample line of Prometheus text: the metric name and its value
/// (labels skipped, quoted label values may hold spaces and braces; a
/// trailing timestamp ignored). `None` for comments, blanks and lines that
/// do not parse.
fn sample_line(line: &str) -> Option<(&str, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' ', '\t'])?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    if rest.starts_with('{') {
        // Skip to the closing brace outside quotes.
        let mut in_quotes = false;
        let mut escaped = false;
        let mut close = None;
        for (i, c) in rest.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if in_quotes => escaped = true,
                '"' => in_quotes = !in_quotes,
                '}' if !in_quotes => {
                    close = Some(i);
                    break;
                }
                _ => {}
            }
        }
        rest = &rest[close? + 1..];
    }
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    value.is_finite().then_some((name, value))
}

/// An engine's load from its Prometheus `/metrics` page (vLLM, SGLang or
/// TGI names, see the module docs); an error when the page has none of
/// them.
pub(crate) fn parse_engine_metrics(text: &str) -> Result<EngineSignals, ProbeError> {
    let mut waiting: Option<f64> = None;
    let mut running: Option<f64> = None;
    let mut kv: Option<f64> = None;
    for (metric, v) in text.lines().filter_map(sample_line) {
        match metric {
            "vllm:num_requests_waiting" | "sglang:num_queue_reqs" | "tgi_queue_size" => {
                *waiting.get_or_insert(0.0) += v
            }
            "vllm:num_requests_running" | "sglang:num_running_reqs" | "tgi_batch_current_size" => {
                *running.get_or_insert(0.0) += v
            }
            "vllm:gpu_cache_usage_perc" | "vllm:kv_cache_usage_perc" | "sglang:token_usage" => {
                kv = Some(kv.map_or(v, |k: f64| k.max(v)));
            }
            _ => {}
        }
    }
    if waiting.is_none() && running.is_none() && kv.is_none() {
        return Err(ProbeError::NoEngineMetrics);
    }
    let count = |c: Option<f64>| c.map(|c| c.clamp(0.0, f64::from(u32::MAX)).round() as u32);
    Ok(EngineSignals {
        waiting: count(waiting),
        running: count(running),
        kv_usage: kv.map(|k| k.clamp(0.0, 1.0)),
    })
}

/// A label's value in one Prometheus sample line (no escapes in the
/// values this reads: numbers).
fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let open = line.find('{')?;
    let close = line[open..].find('}')? + open;
    line[open + 1..close].split(',').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k.trim() == name).then(|| v.trim().trim_matches('"'))
    })
}

/// The KV cache's size in tokens from vLLM's `vllm:cache_config_info`
/// (a gauge whose labels are the cache config: `num_gpu_blocks` ×
/// `block_size`), summed over its engines; `None` when absent.
pub(crate) fn parse_cache_tokens(text: &str) -> Option<u64> {
    let mut total: Option<u64> = None;
    for line in text
        .lines()
        .filter(|l| l.starts_with("vllm:cache_config_info{"))
    {
        let blocks = label(line, "num_gpu_blocks").and_then(|v| v.parse::<u64>().ok());
        let size = label(line, "block_size").and_then(|v| v.parse::<u64>().ok());
        if let (Some(b), Some(s)) = (blocks, size) {
            total = Some(total.unwrap_or(0).saturating_add(b.saturating_mul(s)));
        }
    }
    total.filter(|t| *t > 0)
}

async fn fetch(
    client: &UpstreamClient,
    uri: http::Uri,
    timeout: Duration,
) -> Result<Bytes, ProbeError> {
    let req = http::Request::get(uri).body(router_upstream::client::OutBody::default())?;
    let work = async {
        let resp = client.request(req).await?;
        if !resp.status().is_success() {
            return Err(ProbeError::Status(resp.status()));
        }
        let body = Limited::new(resp.into_body(), PROBE_BODY_LIMIT)
            .collect()
            .await
            .map_err(ProbeError::Body)?;
        Ok(body.to_bytes())
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| ProbeError::TimedOut)?
}

/// Polls one endpoint once: its answer, `None` when the probe failed
/// (refused, timed out after `probe.timeout`, not parsed).
pub(crate) async fn probe_once(
    client: &UpstreamClient,
    endpoint: &Endpoint,
    probe: &Probe,
) -> Option<ProbeReading> {
    let path = match probe.kind {
        ProbeKind::Ollama => "/api/ps",
        ProbeKind::Vllm | ProbeKind::Sglang | ProbeKind::Tgi => "/metrics",
    };
    let mut reading = ProbeReading {
        record: ProbeRecord::default().after_answer(),
        ..ProbeReading::failed(Instant::now())
    };
    let uri = router_upstream::forward::root_uri(endpoint, path).ok()?;
    let body = match fetch(client, uri, probe.timeout).await {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!(endpoint = %endpoint, error = %e, "capacity probe failed");
            return None;
        }
    };
    let parsed = match probe.kind {
        ProbeKind::Ollama => parse_ollama_ps(&body, probe.vram_total_mb).map(|(free, resident)| {
            reading.vram_free_mb = free;
            reading.resident = resident;
        }),
        ProbeKind::Vllm | ProbeKind::Sglang | ProbeKind::Tgi => {
            parse_engine_metrics(&String::from_utf8_lossy(&body)).map(|s| {
                reading.waiting = s.waiting;
                reading.running = s.running;
                reading.kv_cache_usage = s.kv_usage;
                reading.cache_tokens = parse_cache_tokens(&String::from_utf8_lossy(&body));
            })
        }
    };
    if let Err(e) = parsed {
        tracing::debug!(endpoint = %endpoint, error = %e, "capacity probe answer unusable");
        return None;
    }
    reading.at = Instant::now();
    Some(reading)
}

/// Polls every endpoint of `pool` until the pool is gone or the task is
/// aborted (on a config change that alters the probe): a round polls every
/// endpoint at once and waits for the last (each bounded by
/// `probe.timeout`); the next starts `probe.interval` after the previous
/// one started, or at once when the round took longer.
pub(crate) async fn run<P: Probed>(pool: Weak<P>, client: UpstreamClient, probe: Probe) {
    let mut ticker = tokio::time::interval(probe.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(p) = pool.upgrade() else { return };
        let targets = p.probe_targets();
        drop(p);
        let readings =
            futures_util::future::join_all(targets.iter().map(|e| probe_once(&client, e, &probe)))
                .await;
        let Some(p) = pool.upgrade() else { return };
        for (endpoint, reading) in targets.iter().zip(readings) {
            p.record_probe(endpoint, reading);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ollama_ps_gives_free_vram_and_resident_models() {
        let body = br#"{"models":[
            {"name":"qwen3:8b-q4_K_M","model":"qwen3:8b-q4_K_M","size_vram":6442450944},
            {"name":"llama3:70b","model":"llama3:70b","size_vram":42949672960}]}"#;
        let (free, resident) = parse_ollama_ps(body, Some(65536)).unwrap();
        assert_eq!(free, Some(65536 - 6144 - 40960));
        assert!(resident.contains(&"qwen3:8b-q4_K_M".to_string()));
        assert_eq!(
            parse_ollama_ps(br#"{"models":[]}"#, Some(1000)).unwrap().0,
            Some(1000)
        );
        assert_eq!(parse_ollama_ps(br#"{"models":[]}"#, None).unwrap().0, None);
        assert!(matches!(
            parse_ollama_ps(b"<html>", Some(1)),
            Err(ProbeError::OllamaPs(_))
        ));
    }

    fn signals(waiting: u32, running: u32, kv: Option<f64>) -> EngineSignals {
        EngineSignals {
            waiting: Some(waiting),
            running: Some(running),
            kv_usage: kv,
        }
    }

    /// A vLLM V0 page (0.6-era names), as `curl :8000/metrics` shows it,
    /// cut to the families around the ones read.
    const VLLM_V0: &str = r#"# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_cpu_blocks="2048",num_gpu_blocks="27153",num_gpu_blocks_override="None",sliding_window="None",swap_space_bytes="4294967296"} 1.0
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.8312
# HELP vllm:cpu_cache_usage_perc CPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:cpu_cache_usage_perc gauge
vllm:cpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_to_first_token_seconds_sum{model_name="meta-llama/Llama-3.1-8B-Instruct"} 931.2
"#;

    /// A vLLM V1 page (0.8+): `engine` label, `kv_cache_usage_perc`, two
    /// data-parallel engines behind one port.
    const VLLM_V1_DP2: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 7.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 5.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 0.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.41
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B"} 0.57
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-8B"} 1.234567e+06
"#;

    /// SGLang's page as its production-metrics docs show it (with
    /// `--enable-metrics`), plus the queue and running gauges.
    const SGLANG: &str = r#"# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
# HELP sglang:num_running_reqs The number of running requests
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 9.0
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:num_queue_reqs The number of requests in the waiting queue
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP sglang:cache_hit_rate The cache hit rate
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.007507552643049313
"#;

    /// TGI's page: unlabelled gauges (no KV usage metric exists).
    const TGI: &str = "# TYPE tgi_queue_size gauge\ntgi_queue_size 6\n# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 14\n# TYPE tgi_batch_current_max_tokens gauge\ntgi_batch_current_max_tokens 31744\n";

    #[test]
    fn engine_metrics_are_read_from_real_vllm_sglang_and_tgi_pages() {
        assert_eq!(
            parse_engine_metrics(VLLM_V0).unwrap(),
            signals(4, 12, Some(0.8312))
        );
        assert_eq!(
            parse_engine_metrics(VLLM_V1_DP2).unwrap(),
            signals(2, 12, Some(0.57))
        );
        assert_eq!(
            parse_engine_metrics(SGLANG).unwrap(),
            signals(3, 9, Some(0.28))
        );
        assert_eq!(parse_engine_metrics(TGI).unwrap(), signals(6, 14, None));
        assert!(matches!(
            parse_engine_metrics("up 1\n"),
            Err(ProbeError::NoEngineMetrics)
        ));
        assert!(matches!(
            parse_engine_metrics("<html>oops</html>"),
            Err(ProbeError::NoEngineMetrics)
        ));
    }

    #[test]
    fn sample_lines_skip_labels_with_spaces_and_braces_and_timestamps() {
        assert_eq!(
            sample_line(
                r#"vllm:num_requests_waiting{model_name="my model {x}",a="q\"}"} 3 1700000000000"#
            ),
            Some(("vllm:num_requests_waiting", 3.0))
        );
        assert_eq!(
            sample_line("tgi_queue_size 2.5e+00"),
            Some(("tgi_queue_size", 2.5))
        );
        assert_eq!(sample_line("# HELP x y"), None);
        assert_eq!(sample_line("x NaN"), None);
        assert_eq!(sample_line(r#"x{a="unterminated} 1"#), None);
    }

    /// Issue 28, item 17: a failed probe keeps the last answer (its time
    /// and numbers) and counts a failure; `unhealthy_after` in a row make
    /// the endpoint unusable; one answer clears them.
    #[test]
    fn a_failed_probe_keeps_the_last_answer_and_counts_a_failure() {
        let probe = Probe {
            kind: ProbeKind::Vllm,
            interval: Duration::from_millis(50),
            timeout: Duration::from_secs(1),
            unhealthy_after: 3,
            vram_total_mb: None,
        };
        let t0 = Instant::now();
        let answer = |at: Instant, waiting: u32| ProbeReading {
            at,
            record: ProbeRecord::default().after_answer(),
            waiting: Some(waiting),
            ..ProbeReading::failed(at)
        };
        // Nothing known, a failure: not usable.
        let r = ProbeReading::after(None, None, t0);
        assert_eq!(r.record.failures, 1);
        assert!(!r.usable(&probe, t0));
        // An answer.
        let r = ProbeReading::after(Some(r), Some(answer(t0, 4)), t0);
        assert!(r.usable(&probe, t0));
        // Two failures: the answer and its numbers still count.
        let t1 = t0 + Duration::from_millis(1050);
        let r = ProbeReading::after(Some(r), None, t1);
        let r = ProbeReading::after(Some(r), None, t1 + Duration::from_millis(1050));
        assert_eq!((r.at, r.waiting, r.record.failures), (t0, Some(4), 2));
        assert!(r.usable(&probe, t1 + Duration::from_millis(1050)));
        // The third in a row: unusable.
        let t3 = t0 + Duration::from_millis(3 * 1050);
        let r = ProbeReading::after(Some(r), None, t3);
        assert!(!r.usable(&probe, t3));
        // One answer brings it back, with its own numbers.
        let r = ProbeReading::after(Some(r), Some(answer(t3, 1)), t3);
        assert_eq!((r.record.failures, r.waiting), (0, Some(1)));
        assert!(r.usable(&probe, t3));
        // An answer goes stale after unhealthy_after rounds of interval
        // plus timeout, not three intervals.
        assert!(r.usable(&probe, t3 + Duration::from_millis(3150)));
        assert!(!r.usable(&probe, t3 + Duration::from_millis(3151)));
    }
}
