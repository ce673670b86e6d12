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

/// The directory of the workspace's binaries (`target/debug`): this test
/// runs from `target/debug/deps`. `cargo test --workspace` builds every
/// binary before it runs a test.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap().to_path_buf();
    for bin in ["routerctl", "router-proxy", "router-control-plane"] {
        assert!(
            dir.join(bin).exists(),
            "{} is not built: run `cargo build --workspace` (or `cargo test --workspace`)",
            dir.join(bin).display()
        );
    }
    dir
}

/// The fenced `sh` block of `file` whose text contains `marker`.
fn sh_block(file: &str, marker: &str) -> String {
    let text = repo_file(file);
    let mut blocks = text
        .split("```sh\n")
        .skip(1)
        .filter_map(|b| b.split("```").next());
    blocks
        .find(|b| b.contains(marker))
        .unwrap_or_else(|| panic!("{file} has no sh block with {marker:?}"))
        .to_string()
}

/// A README block as a script for the built binaries: `cargo run ... -p
/// NAME --` becomes `NAME`, found on PATH.
fn as_script(block: &str) -> String {
    let mut script = block.to_string();
    for name in ["routerctl", "router-proxy"] {
        for prefix in ["cargo run --release -p ", "cargo run -p "] {
            script = script.replace(&format!("{prefix}{name} -- "), &format!("{name} "));
            script = script.replace(&format!("{prefix}{name} "), &format!("{name} "));
            script = script.replace(&format!("{prefix}{name}\n"), &format!("{name}\n"));
        }
    }
    script
}

/// Runs `script` with bash (`-euo pipefail`) in `dir`, the binaries first
/// on PATH, in a process group of its own that is killed afterwards (the
/// block's background processes with it); its exit status and stdout.
fn run_script(dir: &std::path::Path, script: &str) -> (bool, String, String) {
    run_script_with(dir, script, &[])
}

/// [`run_script`] with more environment variables.
fn run_script_with(
    dir: &std::path::Path,
    script: &str,
    env: &[(&str, String)],
) -> (bool, String, String) {
    use std::os::unix::process::CommandExt;
    let path = format!(
        "{}:{}",
        bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = std::process::Command::new("bash")
        .args(["-c", &format!("set -euo pipefail\n{script}")])
        .current_dir(dir)
        .env("PATH", path)
        .env_remove("ROUTER_TOKEN")
        .env_remove("CUSTOM_ROUTER_ADMIN_TOKEN")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = child.id();
    // The script's own commands end; background servers do not, so the
    // output is read by threads and the wait is for the script itself.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let status = child.wait().unwrap();
    // The background processes of the block, then the pipes close.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", "--", &format!("-{pgid}")])
        .stderr(std::process::Stdio::null())
        .status();
    (status.success(), out.join().unwrap(), err.join().unwrap())
}

/// Issue 20, item 12: the README's offline commands run as written.
#[test]
fn the_readme_policy_commands_run() {
    let block = sh_block(
        "README.md",
        "policy validate -f deploy/examples/agents.yaml",
    );
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let (ok, out, err) = run_script(&root, &as_script(&block));
    assert!(ok, "{block}\nstdout: {out}\nstderr: {err}");
    assert!(out.contains("valid (4 pools, 2 routes)"), "{out}");
    assert!(out.contains("local-medium chosen"), "{out}");
}

/// A port free on loopback now (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The README's examples use the default ports (3000, 8001, 50051). The
/// blocks run as written with those numbers swapped for free ones: a
/// process that happens to hold a default port on the machine running the
/// tests (another checkout's `routerctl up`) cannot fail them, and the
/// defaults themselves are pinned by the `--help` snapshots.
struct FreePorts {
    proxy: u16,
    mock: u16,
    grpc: u16,
}

impl FreePorts {
    fn new() -> Self {
        FreePorts {
            proxy: free_port(),
            mock: free_port(),
            grpc: free_port(),
        }
    }

    /// `script` on these ports, and the variables that point the binaries'
    /// defaults at them.
    fn apply(&self, script: &str) -> (String, Vec<(&'static str, String)>) {
        let FreePorts { proxy, mock, grpc } = *self;
        let script = script
            .replace("localhost:3000", &format!("localhost:{proxy}"))
            .replace("127.0.0.1:8001", &format!("127.0.0.1:{mock}"))
            .replace("--port 8001", &format!("--port {mock}"))
            .replace(
                "routerctl up --data-dir",
                &format!("routerctl up --port {proxy} --grpc 127.0.0.1:{grpc} --data-dir"),
            );
        let env = vec![
            ("CUSTOM_ROUTER_PORT", proxy.to_string()),
            ("ROUTERCTL_SERVER", format!("http://127.0.0.1:{grpc}")),
        ];
        (script, env)
    }
}

/// Issue 20, item 12: the README's sidecar walk-through, as written: a
/// mock, a sidecar, set-backends, a chat call, health and metrics.
#[test]
fn the_readme_sidecar_walk_through_runs() {
    let block = sh_block("README.md", "mock --port 8001 --name gpu-a");
    let dir = std::env::temp_dir().join(format!("router-readme-sidecar-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ports = FreePorts::new();
    let (script, env) = ports.apply(&as_script(&block));
    let (ok, out, err) = run_script_with(&dir, &script, &env);
    assert!(ok, "{block}\nstdout: {out}\nstderr: {err}");
    assert!(out.contains(r#"{"ok":true}"#), "set-backends: {out}");
    assert!(out.contains("chat.completion"), "the chat call: {out}");
    // The mock's default answers streams and embeddings too (issue 30,
    // item 10).
    assert!(out.contains("data: [DONE]"), "the streamed call: {out}");
    assert!(
        out.contains(r#""object":"embedding""#),
        "the embeddings call: {out}"
    );
    assert!(
        out.contains(&format!(r#""addr":"http://127.0.0.1:{}""#, ports.mock)),
        "health: {out}"
    );
    assert!(
        out.contains("custom_router_requests_dispatched_total"),
        "metrics: {out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 20, item 12: the README's "Try it" block against `routerctl up`,
/// as a new user runs it (get, apply the same document: unchanged).
#[test]
fn the_readme_try_it_block_runs_against_routerctl_up() {
    let block = sh_block("README.md", "routerctl -- proxies list");
    let dir = std::env::temp_dir().join(format!("router-readme-up-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "routerctl up --data-dir up-data >up.out 2>up.err &\n\
         up=$!\n\
         for _ in $(seq 300); do curl -sf localhost:3000/_custom_router/health >/dev/null && break; \
         kill -0 $up 2>/dev/null || {{ echo 'routerctl up exited' >&2; exit 1; }}; sleep 0.2; done\n{}",
        as_script(&block)
    );
    let (script, env) = FreePorts::new().apply(&script);
    let (ok, out, err) = run_script_with(&dir, &script, &env);
    let up_err = std::fs::read_to_string(dir.join("up.err")).unwrap_or_default();
    assert!(ok, "{script}\nstdout: {out}\nstderr: {err}\nup: {up_err}");
    assert!(out.contains("chat.completion"), "{out}");
    assert!(out.contains("routerctl-up"), "proxies list: {out}");
    assert!(
        out.contains("unchanged:"),
        "apply of the same document: {out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Compares `actual` with the snapshot `tests/snapshots/NAME.txt`;
/// `UPDATE_SNAPSHOTS=1` writes it instead. A changed flag or message then
/// shows in review as a changed file.
fn assert_snapshot(name: &str, actual: &str) -> Option<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("snapshots")
        .join(format!("{name}.txt"));
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return None;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    (expected != actual).then(|| {
        format!(
            "{name}: differs from {} (UPDATE_SNAPSHOTS=1 cargo test -p router-tests --test docs, then review the diff)\n--- now:\n{actual}",
            path.display()
        )
    })
}

/// A binary's stdout and stderr, run with `args` in a clean environment
/// (no `ROUTER_*`/`CUSTOM_ROUTER_*` variable leaks into `[env: ...]`).
fn output_of(bin: &str, args: &[&str]) -> String {
    let o = std::process::Command::new(bin_dir().join(bin))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .unwrap();
    format!(
        "$ {bin} {}\nexit: {}\n{}{}",
        args.join(" "),
        o.status.code().map_or("signal".into(), |c| c.to_string()),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Issue 20, item 12: every binary's `--help`, and every `routerctl`
/// subcommand's, is pinned.
#[test]
fn help_texts_match_their_snapshots() {
    let mut helps: Vec<(String, String)> = vec![
        (
            "router-proxy".into(),
            output_of("router-proxy", &["--help"]),
        ),
        (
            "router-control-plane".into(),
            output_of("router-control-plane", &["--help"]),
        ),
        ("routerctl".into(), output_of("routerctl", &["--help"])),
    ];
    for sub in [
        &["up"][..],
        &["drill"],
        &["mock"],
        &["approve"],
        &["policy", "validate"],
        &["policy", "apply"],
        &["policy", "get"],
        &["policy", "diff"],
        &["policy", "history"],
        &["policy", "rollback"],
        &["backends", "list"],
        &["backends", "set"],
        &["backends", "drain"],
        &["circuits", "list"],
        &["circuits", "open"],
        &["circuits", "close"],
        &["proxies", "list"],
        &["route", "explain"],
        &["tasks", "list"],
        &["tasks", "approve"],
    ] {
        let mut args = sub.to_vec();
        args.push("--help");
        helps.push((
            format!("routerctl-{}", sub.join("-")),
            output_of("routerctl", &args),
        ));
    }
    let differ: Vec<String> = helps
        .iter()
        .filter_map(|(name, text)| assert_snapshot(&format!("help/{name}"), text))
        .collect();
    assert!(differ.is_empty(), "{}", differ.join("\n\n"));
}

/// Issue 20, item 12: the main error messages are pinned: what a user
/// sees for a bad policy, an unreachable control plane, a bad variable, an
/// exposed control plane without a token.
#[test]
fn main_error_messages_match_their_snapshots() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let bad = std::env::temp_dir().join(format!("router-docs-bad-{}.yaml", std::process::id()));
    std::fs::write(
        &bad,
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - {name: a, max_concurency: 4}\n  routes:\n    - {name: r, chain: [b]}\n",
    )
    .unwrap();
    let bad = bad.to_str().unwrap().to_string();
    let cases: Vec<(&str, String)> = vec![
        (
            "routerctl-validate-bad",
            output_of("routerctl", &["policy", "validate", "-f", &bad]).replace(&bad, "BAD.yaml"),
        ),
        (
            "routerctl-validate-good",
            output_of(
                "routerctl",
                &[
                    "policy",
                    "validate",
                    "-f",
                    root.join("deploy/examples/agents.yaml").to_str().unwrap(),
                ],
            )
            .replace(root.to_str().unwrap(), "ROOT"),
        ),
        (
            "routerctl-unreachable",
            output_of(
                "routerctl",
                &["policy", "history", "--server", "http://127.0.0.1:1"],
            ),
        ),
        (
            "routerctl-approve-no-key",
            output_of(
                "routerctl",
                &["approve", "--route", "governed", "--request-id", "r1"],
            ),
        ),
        (
            "router-control-plane-exposed",
            output_of(
                "router-control-plane",
                &["--listen", "0.0.0.0:0", "--data-dir", "/nonexistent/router"],
            ),
        ),
        (
            "router-proxy-managed-flag-alone",
            output_of("router-proxy", &["--cache-dir", "/tmp/x"]),
        ),
    ];
    let _ = std::fs::remove_file(&bad);
    let differ: Vec<String> = cases
        .iter()
        .filter_map(|(name, text)| assert_snapshot(&format!("errors/{name}"), text))
        .collect();
    assert!(differ.is_empty(), "{}", differ.join("\n\n"));
}

/// Issue 30, item 13: the README's examples use the release build (the
/// one `routerctl up` and the proxy were built with: a debug build would
/// be a second, long build), and so do the examples' comments.
#[test]
fn the_examples_run_the_release_build() {
    let mut debug = Vec::new();
    let mut files = vec!["README.md".to_string()];
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    for dir in ["docs", "deploy/examples"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap().flatten() {
            files.push(format!("{dir}/{}", e.file_name().to_string_lossy()));
        }
    }
    for f in &files {
        let Ok(text) = std::fs::read_to_string(root.join(f)) else {
            continue;
        };
        for (i, line) in text.lines().enumerate() {
            if line.contains("cargo run -p ") {
                debug.push(format!("{f}:{}: {line}", i + 1));
            }
        }
    }
    assert!(
        debug.is_empty(),
        "debug builds in examples:\n{}",
        debug.join("\n")
    );
}

/// Issue 30, item 12: the image section names commands that exist, CI
/// runs the check, and the sizes in docs/deploy.md were measured by the
/// command it names (the one `.ci/check-image` runs).
#[test]
fn the_image_docs_name_the_commands_ci_runs() {
    use std::os::unix::fs::PermissionsExt;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let deploy = repo_file("docs/deploy.md");
    for script in ["scripts/build-image", ".ci/check-image"] {
        assert!(
            deploy.contains(script),
            "docs/deploy.md should name {script}"
        );
        let mode = std::fs::metadata(root.join(script))
            .unwrap_or_else(|e| panic!("{script}: {e}"))
            .permissions()
            .mode();
        assert!(mode & 0o111 != 0, "{script} is not executable");
    }
    assert!(
        repo_file(".ci/run").contains("\n.ci/check-image\n"),
        ".ci/run should run .ci/check-image"
    );
    let containerfile = repo_file("deploy/docker/Containerfile.scratch");
    assert!(containerfile.contains("\nFROM scratch\n"));
    assert!(containerfile.contains("\nUSER 10001:10001\n"));
    assert!(
        repo_file("scripts/build-image").contains("-f deploy/docker/Containerfile.scratch"),
        "scripts/build-image should build the Containerfile"
    );
    assert!(repo_file("deploy/docker/Dockerfile").contains("Containerfile.scratch"));
    let measure = "podman image inspect --format '{{.Size}}'";
    assert!(repo_file(".ci/check-image").contains(measure));
    assert!(
        deploy.contains(measure),
        "docs/deploy.md should give the command that measured the image"
    );
}

/// Issue 30, item 13: the README counts the drill's scenarios right.
#[test]
fn the_readme_counts_the_drills_scenarios() {
    let readme = repo_file("README.md");
    let words = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve",
    ];
    let n = routerctl::drill::Scenario::ALL.len();
    let said = format!("{} scenarios", words[n]);
    assert!(readme.contains(&said), "the README should say {said:?}");
    for (i, w) in words.iter().enumerate() {
        if i != n {
            assert!(!readme.contains(&format!("{w} scenarios")), "{w} scenarios");
        }
    }
}

/// Issue 30, item 13: no paragraph is said twice in the docs (a copy
/// drifts from its original).
#[test]
fn no_paragraph_appears_twice_in_the_docs() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs");
    let mut seen: std::collections::HashMap<String, String> = Default::default();
    let mut twice = Vec::new();
    for e in std::fs::read_dir(&root).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".md") {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap();
        let mut in_code = false;
        let mut para = String::new();
        let mut flush = |para: &mut String| {
            let p = para.split_whitespace().collect::<Vec<_>>().join(" ");
            if p.len() >= 120 && !p.starts_with('|') {
                if let Some(first) = seen.insert(p.clone(), name.clone()) {
                    twice.push(format!("{first} and {name}: {p}"));
                }
            }
            para.clear();
        };
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
                flush(&mut para);
                continue;
            }
            if in_code || line.trim().is_empty() {
                flush(&mut para);
                continue;
            }
            para.push_str(line);
            para.push('\n');
        }
        flush(&mut para);
    }
    assert!(twice.is_empty(), "{}", twice.join("\n\n"));
}

/// Issue 30, item 13: `routerctl --help`'s overview names every command
/// group it has.
#[test]
fn the_routerctl_overview_names_every_command() {
    let help = output_of("routerctl", &["--help"]);
    let (overview, rest) = help.split_once("Usage:").unwrap();
    let commands = rest.split_once("Commands:\n").unwrap().1;
    let mut missing = Vec::new();
    for line in commands.lines().take_while(|l| !l.trim().is_empty()) {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let command = line.starts_with("  ") && !line.starts_with("   ");
        if command && name != "help" && !overview.contains(name) {
            missing.push(name.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "not in the overview: {missing:?}\n{help}"
    );
}

/// Issue 30, item 13: every field of a tenant's `limits` is described in
/// docs/tenants.md.
#[test]
fn every_tenant_limit_is_documented() {
    // The policy loader's "unknown field" error lists the known ones.
    let bad = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - {name: p}\n  routes:\n    - {name: r, chain: [p]}\n  tenants:\n    - {name: t, anonymous: true, limits: {no_such_limit: 1}}\n";
    let err = router_policy::document::load(bad, &router_policy::QueueSettings::default())
        .unwrap_err()
        .to_string();
    let known = err.split_once("expected one of").unwrap().1;
    let fields: Vec<&str> = known.split('`').skip(1).step_by(2).collect();
    assert!(fields.len() >= 8, "{err}");
    let doc = repo_file("docs/tenants.md");
    let missing: Vec<&&str> = fields.iter().filter(|f| !doc.contains(**f)).collect();
    assert!(missing.is_empty(), "not in docs/tenants.md: {missing:?}");
}

/// The metric families a fresh proxy serves (`# TYPE` lines), each as a
/// query names it (counters with `_total`; histograms with `_bucket`,
/// `_sum`, `_count`).
async fn served_series() -> std::collections::BTreeSet<String> {
    let proxy = TestProxy::sidecar(Settings::default()).await;
    let text = proxy.metrics().await;
    let mut out = std::collections::BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        match kind {
            "counter" => {
                out.insert(format!("{name}_total"));
            }
            "histogram" => {
                for s in ["_bucket", "_sum", "_count"] {
                    out.insert(format!("{name}{s}"));
                }
            }
            _ => {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// The `router_*` names in `text`.
fn router_series(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("router_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        // Not the tail of a longer name (`custom_router_...`).
        let before = rest[..at].chars().last();
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

/// Issue 30, item 5: every series the dashboard and the alert rules query
/// is one a proxy serves (a renamed metric fails here, not in front of an
/// on-call engineer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_the_dashboard_and_alerts_query_is_served() {
    let served = served_series().await;
    for file in [
        "deploy/grafana/dashboards/router.json",
        "deploy/prometheus/alerts.yml",
    ] {
        let text = repo_file(file);
        let queries: String = if file.ends_with(".json") {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            let mut exprs = Vec::new();
            fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
                match v {
                    serde_json::Value::Object(m) => {
                        for (k, v) in m {
                            match (k.as_str(), v) {
                                ("expr" | "query", serde_json::Value::String(s)) => {
                                    out.push(s.clone())
                                }
                                _ => walk(v, out),
                            }
                        }
                    }
                    serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
                    _ => {}
                }
            }
            walk(&v, &mut exprs);
            assert!(exprs.len() >= 10, "{file}: {exprs:?}");
            // Every panel reads the datasource the viewer picks.
            assert_eq!(v["templating"]["list"][0]["type"], "datasource");
            for p in v["panels"].as_array().unwrap() {
                assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
            }
            // Tenants, health, suspicion and ejection have panels.
            for series in [
                "router_tenant_requests_total",
                "router_tenant_cost_usd_total",
                "router_endpoint_health",
                "router_endpoint_suspect",
                "router_endpoint_ejected",
            ] {
                assert!(exprs.iter().any(|e| e.contains(series)), "{series}");
            }
            exprs.join("\n")
        } else {
            text.lines()
                .filter(|l| !l.trim_start().starts_with('#') && !l.contains("summary:"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let named = router_series(&queries);
        let unknown: Vec<&String> = named.iter().filter(|n| !served.contains(*n)).collect();
        assert!(
            unknown.is_empty(),
            "{file} queries series no proxy serves: {unknown:?}"
        );
    }
}
