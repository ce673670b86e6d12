//! `otlp-sink`: an OTLP/gRPC trace receiver that counts spans and drops
//! them, so the proxy benchmark can measure the cost of tracing with a real
//! exporter on the other end. Prints `spans: N` every 5 s and at Ctrl-C.
//!
//! `otlp-sink --listen 127.0.0.1:4317`

// A benchmark measures wall time: std's clock is the point here.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};

/// Count and drop OTLP spans.
#[derive(Parser, Debug)]
struct Args {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:4317")]
    listen: SocketAddr,
}

struct Sink {
    spans: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let n: usize = request
            .get_ref()
            .resource_spans
            .iter()
            .flat_map(|r| r.scope_spans.iter())
            .map(|s| s.spans.len())
            .sum();
        self.spans.fetch_add(n as u64, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let spans = Arc::new(AtomicU64::new(0));
    let sink = Sink {
        spans: Arc::clone(&spans),
    };
    let report = Arc::clone(&spans);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            println!("spans: {}", report.load(Ordering::Relaxed));
        }
    });
    eprintln!("otlp-sink listening on {}", args.listen);
    tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(sink))
        .serve_with_shutdown(args.listen, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    println!("spans: {}", spans.load(Ordering::Relaxed));
    Ok(())
}
