//! The documents against the programs: what the docs list is what the
//! programs do, so a change to one that forgets the other fails here.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use router_proxy::Settings;
use router_tests::harness::TestProxy;

/// A file of the repository, as text.
fn repo_file(path: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every metric family a proxy serves is named in docs/data-plane.md
/// (counters as `name_total`, as scrapes show them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_proxy_serves_is_documented() {
    let proxy = TestProxy::sidecar(Settings::default()).await;
    let text = proxy.metrics().await;
    let doc = repo_file("docs/data-plane.md");
    let mut families = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        let shown = if kind == "counter" {
            format!("{name}_total")
        } else {
            name.to_string()
        };
        families.push(shown);
    }
    assert!(families.len() >= 15, "{text}");
    let missing: Vec<&String> = families
        .iter()
        .filter(|f| !doc.contains(&format!("`{f}")))
        .collect();
    assert!(
        missing.is_empty(),
        "served but not in docs/data-plane.md's metrics: {missing:?}"
    );
}

/// Every `CUSTOM_ROUTER_*` variable the proxy reads is in
/// docs/data-plane.md's table.
#[test]
fn every_proxy_variable_is_documented() {
    let doc = repo_file("docs/data-plane.md");
    let mut read = Vec::new();
    for file in ["data-plane/src/settings.rs", "policy/src/guard.rs"] {
        let source = repo_file(file);
        for (i, _) in source.match_indices("\"CUSTOM_ROUTER_") {
            let name: String = source[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if name.len() > "CUSTOM_ROUTER_".len() && !read.contains(&name) {
                read.push(name);
            }
        }
    }
    assert!(read.len() >= 25, "{read:?}");
    let missing: Vec<&String> = read
        .iter()
        .filter(|v| !doc.contains(&format!("`{v}`")))
        .collect();
    assert!(missing.is_empty(), "read but not documented: {missing:?}");
}
