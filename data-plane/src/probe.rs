//! Capacity probes: what the backends say about their own load.
//!
//! - `ollama`: `GET /api/ps` lists the models resident in memory and the
//!   VRAM each holds; free VRAM is the configured total minus their sum,
//!   and the resident list lets the balancer prefer an endpoint where the
//!   pool's model is already loaded (a cold load costs seconds).
//! - `vllm`: `GET /metrics` (Prometheus text) gives the requests waiting
//!   inside the server (`vllm:num_requests_waiting`), added to the pool's
//!   queue depth for the `max_queue_depth` gate, and the KV-cache usage.
//!
//! Each pool with a `capacity_probe` has one task polling its endpoints
//! every `interval_ms`, each poll bounded by the interval. A probe that
//! fails (refused, timed out, an answer that does not parse) marks the
//! endpoint unhealthy; data older than three intervals counts as unknown,
//! which is not healthy: the endpoint takes no requests until a probe
//! succeeds again.
//!
//! This module knows nothing of pools: a probe task polls whatever
//! implements [`Probed`] (a pool does) and hands it [`ProbeReading`]s, which
//! the pool keeps and judges with [`ProbeReading::usable`].

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use router_policy::{Endpoint, Probe, ProbeKind, Scheme};
use serde::Deserialize;
use tokio::time::Instant;

use crate::forward::UpstreamClient;

/// Largest probe answer read.
const PROBE_BODY_LIMIT: usize = 4 * 1024 * 1024;

/// A reading older than this many probe intervals counts as unknown.
const STALE_INTERVALS: u32 = 3;

/// What a capacity probe last saw at one endpoint.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProbeReading {
    /// When.
    pub at: Instant,
    /// The probe answered and parsed.
    pub healthy: bool,
    /// Free VRAM, MB (Ollama).
    pub vram_free_mb: Option<u64>,
    /// Models resident in memory (Ollama).
    pub resident: Vec<String>,
    /// Requests waiting inside the server (vLLM).
    pub waiting: Option<u32>,
    /// KV-cache usage, 0..1 (vLLM).
    pub kv_cache_usage: Option<f64>,
}

impl ProbeReading {
    /// Whether this reading lets the endpoint take requests as of `now`:
    /// the probe answered, no more than three of `probe`'s intervals ago.
    #[inline]
    pub(crate) fn usable(&self, probe: &Probe, now: Instant) -> bool {
        self.healthy && now.saturating_duration_since(self.at) <= probe.interval * STALE_INTERVALS
    }
}

/// What a probe task polls, and tells what it saw (a pool).
pub(crate) trait Probed: Send + Sync + 'static {
    /// The endpoints to poll now.
    fn probe_targets(&self) -> Vec<Endpoint>;

    /// Records what the probe saw at `endpoint`.
    fn record_probe(self: &Arc<Self>, endpoint: &Endpoint, reading: ProbeReading);
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

/// Free VRAM (MB) and resident models from an `/api/ps` answer.
pub(crate) fn parse_ollama_ps(
    body: &[u8],
    vram_total_mb: Option<u64>,
) -> Result<(Option<u64>, Vec<String>), String> {
    let ps: OllamaPs =
        serde_json::from_slice(body).map_err(|e| format!("bad /api/ps answer: {e}"))?;
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

/// Waiting requests and KV-cache usage from vLLM's `/metrics`.
pub(crate) fn parse_vllm_metrics(text: &str) -> Result<(Option<u32>, Option<f64>), String> {
    let mut waiting: Option<f64> = None;
    let mut kv: Option<f64> = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let metric = name.split('{').next().unwrap_or("");
        let Ok(v) = value.trim().parse::<f64>() else {
            continue;
        };
        match metric {
            "vllm:num_requests_waiting" => *waiting.get_or_insert(0.0) += v,
            "vllm:gpu_cache_usage_perc" | "vllm:kv_cache_usage_perc" => {
                kv = Some(kv.map_or(v, |k: f64| k.max(v)));
            }
            _ => {}
        }
    }
    if waiting.is_none() && kv.is_none() {
        return Err("no vllm metrics in the answer".into());
    }
    Ok((waiting.map(|w| w.max(0.0).round() as u32), kv))
}

fn probe_uri(endpoint: &Endpoint, path: &str) -> Result<http::Uri, http::Error> {
    let scheme = match endpoint.scheme() {
        Scheme::Http => "http",
        Scheme::Https => "https",
    };
    http::Uri::builder()
        .scheme(scheme)
        .authority(endpoint.authority())
        .path_and_query(path)
        .build()
}

async fn fetch(
    client: &UpstreamClient,
    uri: http::Uri,
    timeout: Duration,
) -> Result<Bytes, String> {
    let req = http::Request::get(uri)
        .body(crate::upstream::OutBody::default())
        .map_err(|e| e.to_string())?;
    let work = async {
        let resp = client.request(req).await.map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("status {}", resp.status()));
        }
        let body = Limited::new(resp.into_body(), PROBE_BODY_LIMIT)
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok(body.to_bytes())
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| "probe timed out".to_string())?
}

/// Polls one endpoint once.
pub(crate) async fn probe_once(
    client: &UpstreamClient,
    endpoint: &Endpoint,
    probe: &Probe,
) -> ProbeReading {
    let path = match probe.kind {
        ProbeKind::Ollama => "/api/ps",
        ProbeKind::Vllm => "/metrics",
    };
    let mut reading = ProbeReading {
        at: Instant::now(),
        healthy: false,
        vram_free_mb: None,
        resident: Vec::new(),
        waiting: None,
        kv_cache_usage: None,
    };
    let Ok(uri) = probe_uri(endpoint, path) else {
        return reading;
    };
    let body = match fetch(client, uri, probe.interval).await {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!(endpoint = %endpoint, error = %e, "capacity probe failed");
            return reading;
        }
    };
    let parsed = match probe.kind {
        ProbeKind::Ollama => parse_ollama_ps(&body, probe.vram_total_mb).map(|(free, resident)| {
            reading.vram_free_mb = free;
            reading.resident = resident;
        }),
        ProbeKind::Vllm => parse_vllm_metrics(&String::from_utf8_lossy(&body)).map(|(w, kv)| {
            reading.waiting = w;
            reading.kv_cache_usage = kv;
        }),
    };
    match parsed {
        Ok(()) => reading.healthy = true,
        Err(e) => {
            tracing::debug!(endpoint = %endpoint, error = %e, "capacity probe answer unusable")
        }
    }
    reading.at = Instant::now();
    reading
}

/// Polls every endpoint of `pool` until the pool is gone or the task is
/// aborted (on a config change that alters the probe).
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
        assert!(parse_ollama_ps(b"<html>", Some(1)).is_err());
    }

    #[test]
    fn vllm_metrics_give_waiting_and_kv_usage() {
        let text = "# HELP vllm:num_requests_waiting x\n\
                    vllm:num_requests_waiting{model_name=\"m\"} 3.0\n\
                    vllm:num_requests_running{model_name=\"m\"} 7.0\n\
                    vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.82\n";
        assert_eq!(parse_vllm_metrics(text).unwrap(), (Some(3), Some(0.82)));
        assert!(parse_vllm_metrics("up 1\n").is_err());
    }

    #[test]
    fn a_reading_counts_while_healthy_and_at_most_three_intervals_old() {
        let probe = Probe {
            kind: ProbeKind::Vllm,
            interval: Duration::from_secs(1),
            vram_total_mb: None,
        };
        let at = Instant::now();
        let reading = ProbeReading {
            at,
            healthy: true,
            vram_free_mb: None,
            resident: Vec::new(),
            waiting: Some(2),
            kv_cache_usage: None,
        };
        assert!(reading.usable(&probe, at));
        assert!(reading.usable(&probe, at + Duration::from_secs(3)));
        assert!(!reading.usable(&probe, at + Duration::from_millis(3001)));
        let failed = ProbeReading {
            healthy: false,
            ..reading
        };
        assert!(!failed.usable(&probe, at));
    }
}
