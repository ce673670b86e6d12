//! Turning raw runs into numbers, the text table and the JSON object.

use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::load::{FixedRun, MaxRun};

/// Latency percentiles, in milliseconds.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Percentiles {
    pub(crate) p50: f64,
    pub(crate) p90: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples` (nanoseconds); `None` if empty.
    pub(crate) fn of(samples: &mut [u64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let at = |p: f64| -> f64 {
            let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
            let idx = rank.clamp(1, samples.len()) - 1;
            samples[idx] as f64 / 1e6
        };
        Some(Self {
            p50: at(50.0),
            p90: at(90.0),
            p99: at(99.0),
            max: at(100.0),
        })
    }

    fn to_json(self) -> Value {
        json!({
            "p50_ms": round3(self.p50),
            "p90_ms": round3(self.p90),
            "p99_ms": round3(self.p99),
            "max_ms": round3(self.max),
        })
    }
}

/// The fixed-rate phase, summarised.
#[derive(Clone, Debug)]
pub(crate) struct FixedStats {
    pub(crate) scheduled: u64,
    pub(crate) ok: u64,
    pub(crate) errors: u64,
    pub(crate) achieved_rps: f64,
    /// From the intended send time (coordinated-omission corrected).
    pub(crate) latency: Option<Percentiles>,
    /// From the actual send time.
    pub(crate) service: Option<Percentiles>,
    /// CPU the target used, percent of one core.
    pub(crate) cpu_pct: Option<f64>,
    /// CPU used by other processes on the machine, percent of one core.
    pub(crate) other_cpu_pct: Option<f64>,
}

impl FixedStats {
    /// Summarises a raw run whose measured window was `window_s` seconds.
    pub(crate) fn from_run(mut run: FixedRun, window_s: f64) -> Self {
        let ok = run.latencies_ns.len() as u64;
        let secs = run.elapsed.as_secs_f64();
        Self {
            cpu_pct: pct(run.cpu.first(), window_s),
            other_cpu_pct: other_pct(&run.cpu, window_s),
            scheduled: run.scheduled,
            ok,
            errors: run.errors,
            achieved_rps: if secs > 0.0 { ok as f64 / secs } else { 0.0 },
            latency: Percentiles::of(&mut run.latencies_ns),
            service: Percentiles::of(&mut run.service_ns),
        }
    }
}

/// The max-throughput phase, summarised.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MaxStats {
    pub(crate) ok: u64,
    pub(crate) errors: u64,
    pub(crate) rps: f64,
    /// CPU the target used, percent of one core.
    pub(crate) cpu_pct: Option<f64>,
    /// CPU used by other processes on the machine, percent of one core.
    pub(crate) other_cpu_pct: Option<f64>,
    /// CPU the backend thread used, percent of one core.
    pub(crate) backend_cpu_pct: Option<f64>,
    /// CPU the load generator used, percent of one core.
    pub(crate) client_cpu_pct: Option<f64>,
    /// CPU the target used per successful request, microseconds.
    pub(crate) cpu_us_per_req: Option<f64>,
}

impl MaxStats {
    /// Summarises a raw run over `secs` measured seconds.
    pub(crate) fn from_run(run: &MaxRun, secs: f64) -> Self {
        Self {
            cpu_pct: pct(run.cpu.first(), secs),
            other_cpu_pct: other_pct(&run.cpu, secs),
            backend_cpu_pct: pct(run.cpu.get(1), secs),
            client_cpu_pct: pct(run.cpu.get(2), secs),
            cpu_us_per_req: run
                .cpu
                .first()
                .copied()
                .flatten()
                .filter(|_| run.ok > 0)
                .map(|c| 1e6 * c.as_secs_f64() / run.ok as f64),
            ok: run.ok,
            errors: run.errors,
            rps: if secs > 0.0 {
                run.ok as f64 / secs
            } else {
                0.0
            },
        }
    }
}

/// Everything measured for one target.
#[derive(Clone, Debug, Default)]
pub(crate) struct TargetResult {
    pub(crate) name: &'static str,
    /// Why it could not be measured (or was skipped).
    pub(crate) unavailable: Option<String>,
    /// Things noticed while measuring it.
    pub(crate) warnings: Vec<String>,
    pub(crate) fixed: Option<FixedStats>,
    pub(crate) max: Option<MaxStats>,
    /// Requests the backend answered while this target was measured.
    pub(crate) backend_hits: u64,
    /// Other processes used enough CPU to disturb the numbers.
    pub(crate) disturbed: bool,
    /// CPU use of the whole machine (percent) sampled just before loading.
    pub(crate) busy_before_pct: Option<f64>,
}

/// The run's settings, echoed in the report.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) rate: u64,
    pub(crate) warmup_s: f64,
    pub(crate) duration_s: f64,
    pub(crate) concurrency: usize,
    pub(crate) client_threads: usize,
    pub(crate) nginx_workers: usize,
    pub(crate) rounds: usize,
}

/// The whole report.
#[derive(Clone, Debug)]
pub(crate) struct Report {
    settings: Settings,
    /// Each round's results, targets in run order.
    rounds: Vec<Vec<TargetResult>>,
    /// One result per target: the median over rounds of each number (sums
    /// for counts).
    targets: Vec<TargetResult>,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn median_percentiles(all: &[Percentiles]) -> Option<Percentiles> {
    let field = |f: fn(&Percentiles) -> f64| median(all.iter().map(f).collect());
    Some(Percentiles {
        p50: field(|p| p.p50)?,
        p90: field(|p| p.p90)?,
        p99: field(|p| p.p99)?,
        max: field(|p| p.max)?,
    })
}

/// Folds one target's results over all rounds into one.
fn summarise(name: &'static str, runs: &[&TargetResult]) -> TargetResult {
    let many = runs.len() > 1;
    let mut out = TargetResult {
        name,
        ..TargetResult::default()
    };
    for (i, r) in runs.iter().enumerate() {
        let prefix = if many {
            format!("round {}: ", i + 1)
        } else {
            String::new()
        };
        out.warnings
            .extend(r.warnings.iter().map(|w| format!("{prefix}{w}")));
        out.backend_hits += r.backend_hits;
        out.disturbed |= r.disturbed;
        out.busy_before_pct = match (out.busy_before_pct, r.busy_before_pct) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    let fixed: Vec<&FixedStats> = runs.iter().filter_map(|r| r.fixed.as_ref()).collect();
    let max: Vec<MaxStats> = runs.iter().filter_map(|r| r.max).collect();
    if fixed.is_empty() && max.is_empty() {
        out.unavailable = Some(
            runs.iter()
                .find_map(|r| r.unavailable.clone())
                .unwrap_or_else(|| "not run".into()),
        );
        return out;
    }
    for (i, r) in runs.iter().enumerate() {
        if let Some(why) = &r.unavailable {
            out.warnings
                .push(format!("round {}: not measured: {why}", i + 1));
        }
    }
    if !fixed.is_empty() {
        let lat: Vec<Percentiles> = fixed.iter().filter_map(|f| f.latency).collect();
        let svc: Vec<Percentiles> = fixed.iter().filter_map(|f| f.service).collect();
        out.fixed = Some(FixedStats {
            scheduled: fixed.iter().map(|f| f.scheduled).sum(),
            ok: fixed.iter().map(|f| f.ok).sum(),
            errors: fixed.iter().map(|f| f.errors).sum(),
            achieved_rps: median(fixed.iter().map(|f| f.achieved_rps).collect()).unwrap_or(0.0),
            cpu_pct: median(fixed.iter().filter_map(|f| f.cpu_pct).collect()),
            other_cpu_pct: median(fixed.iter().filter_map(|f| f.other_cpu_pct).collect()),
            latency: median_percentiles(&lat),
            service: median_percentiles(&svc),
        });
    }
    if !max.is_empty() {
        out.max = Some(MaxStats {
            ok: max.iter().map(|m| m.ok).sum(),
            errors: max.iter().map(|m| m.errors).sum(),
            rps: median(max.iter().map(|m| m.rps).collect()).unwrap_or(0.0),
            cpu_pct: median(max.iter().filter_map(|m| m.cpu_pct).collect()),
            other_cpu_pct: median(max.iter().filter_map(|m| m.other_cpu_pct).collect()),
            backend_cpu_pct: median(max.iter().filter_map(|m| m.backend_cpu_pct).collect()),
            client_cpu_pct: median(max.iter().filter_map(|m| m.client_cpu_pct).collect()),
            cpu_us_per_req: median(max.iter().filter_map(|m| m.cpu_us_per_req).collect()),
        });
    }
    out
}

/// One informational goal.
struct Goal {
    name: String,
    value: Option<f64>,
    unit: &'static str,
    pass: Option<bool>,
}

impl Report {
    /// Builds the report and its per-target summary.
    pub(crate) fn new(settings: Settings, rounds: Vec<Vec<TargetResult>>) -> Self {
        let mut names: Vec<&'static str> = Vec::new();
        for t in rounds.iter().flatten() {
            if !names.contains(&t.name) {
                names.push(t.name);
            }
        }
        let targets = names
            .iter()
            .map(|&name| {
                let runs: Vec<&TargetResult> =
                    rounds.iter().flatten().filter(|t| t.name == name).collect();
                summarise(name, &runs)
            })
            .collect();
        Self {
            settings,
            rounds,
            targets,
        }
    }

    fn get(&self, name: &str) -> Option<&TargetResult> {
        self.targets.iter().find(|t| t.name == name)
    }

    fn latency(&self, name: &str) -> Option<Percentiles> {
        self.get(name)?.fixed.as_ref()?.latency
    }

    fn rps(&self, name: &str) -> Option<f64> {
        self.get(name)?.max.map(|m| m.rps)
    }

    fn added(&self, name: &str) -> Option<(f64, f64)> {
        let t = self.latency(name)?;
        let d = self.latency("direct")?;
        Some((t.p50 - d.p50, t.p99 - d.p99))
    }

    fn ratio(&self, a: &str, b: &str) -> Option<f64> {
        let (a, b) = (self.rps(a)?, self.rps(b)?);
        (b > 0.0).then(|| a / b)
    }

    fn goals(&self) -> Vec<Goal> {
        let added = self.added("router");
        let rate = self.settings.rate;
        let lat_goal = |name: String, v: Option<f64>, limit: f64| Goal {
            name,
            value: v,
            unit: "ms",
            pass: v.map(|v| v < limit),
        };
        let tp = self.ratio("router", "nginx");
        vec![
            lat_goal(
                format!("router added p50 < 0.2 ms at {rate} rps"),
                added.map(|a| a.0),
                0.2,
            ),
            lat_goal(
                format!("router added p99 < 1 ms at {rate} rps"),
                added.map(|a| a.1),
                1.0,
            ),
            Goal {
                name: "router throughput >= 0.9 x nginx".into(),
                value: tp,
                unit: "x",
                pass: tp.map(|r| r >= 0.9),
            },
        ]
    }

    /// The report as one JSON object.
    pub(crate) fn to_json(&self) -> Value {
        let s = &self.settings;
        let targets: Vec<Value> = self.targets.iter().map(target_json).collect();
        let rounds: Vec<Value> = self
            .rounds
            .iter()
            .map(|r| Value::Array(r.iter().map(target_json).collect()))
            .collect();
        let added = |name: &str| {
            self.added(name)
                .map(|(p50, p99)| json!({"p50_ms": round3(p50), "p99_ms": round3(p99)}))
        };
        let goals: Vec<Value> = self
            .goals()
            .into_iter()
            .map(|g| {
                json!({
                    "goal": g.name,
                    "value": g.value.map(round3),
                    "unit": g.unit,
                    "result": verdict(g.pass),
                })
            })
            .collect();
        json!({
            "settings": {
                "rate_rps": s.rate,
                "warmup_s": s.warmup_s,
                "duration_s": s.duration_s,
                "concurrency": s.concurrency,
                "client_threads": s.client_threads,
                "nginx_workers": s.nginx_workers,
                "rounds": s.rounds,
                "summary": "median over rounds of each number; counts are summed",
                "latency_origin": "intended send time when behind schedule, else actual send time",
            },
            "targets": targets,
            "rounds": rounds,
            "comparison": {
                "router_added_latency": added("router"),
                "nginx_added_latency": added("nginx"),
                "router_over_nginx_throughput": self.ratio("router", "nginx").map(round3),
                "router_over_direct_throughput": self.ratio("router", "direct").map(round3),
                "nginx_over_direct_throughput": self.ratio("nginx", "direct").map(round3),
            },
            "goals": goals,
        })
    }

    /// The report as a text table.
    pub(crate) fn to_text(&self) -> String {
        let s = &self.settings;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "proxy-bench: fixed rate {} req/s (open loop), then closed loop; warmup {} s, \
             duration {} s, {} connections, {} client thread(s), nginx {} worker(s), {} round(s)",
            s.rate,
            s.warmup_s,
            s.duration_s,
            s.concurrency,
            s.client_threads,
            s.nginx_workers,
            s.rounds
        );
        let _ = writeln!(
            out,
            "latency at the fixed rate from the intended send time (see README); cpu% = CPU of \
             the target (backend thread for direct, proxy process for the others), % of one core{}\n",
            if s.rounds > 1 {
                "; each number is the median over rounds"
            } else {
                ""
            }
        );
        let _ = writeln!(
            out,
            "{:<8} | {:>7} {:>7} {:>7} {:>7} {:>7} {:>6} {:>5} | {:>8} {:>6} {:>5} {:>6}",
            "target",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "max ms",
            "rate/s",
            "errors",
            "cpu%",
            "max rps",
            "errors",
            "cpu%",
            "us/req"
        );
        let _ = writeln!(out, "{}", "-".repeat(101));
        for t in &self.targets {
            if let Some(why) = &t.unavailable {
                let _ = writeln!(out, "{:<8} | not measured: {why}", t.name);
                continue;
            }
            let (lat, rate, ferr, fcpu) = match &t.fixed {
                Some(f) => (f.latency, f.achieved_rps, f.errors, f.cpu_pct),
                None => (None, 0.0, 0, None),
            };
            let cell = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.3}"));
            let cell0 = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.0}"));
            let cell1 = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
            let (mrps, merr) = t.max.map_or((0.0, 0), |m| (m.rps, m.errors));
            let _ = writeln!(
                out,
                "{:<8} | {:>7} {:>7} {:>7} {:>7} {:>7.1} {:>6} {:>5} | {:>8.0} {:>6} {:>5} {:>6}",
                t.name,
                cell(lat.map(|l| l.p50)),
                cell(lat.map(|l| l.p90)),
                cell(lat.map(|l| l.p99)),
                cell(lat.map(|l| l.max)),
                rate,
                ferr,
                cell0(fcpu),
                mrps,
                merr,
                cell0(t.max.and_then(|m| m.cpu_pct)),
                cell1(t.max.and_then(|m| m.cpu_us_per_req))
            );
            if let Some(m) = t.max {
                if t.name != "direct" {
                    let _ = writeln!(
                        out,
                        "{:<8} |   cpu at max rps, % of one core: {} {}, backend {}, load generator {}, other {}",
                        "",
                        t.name,
                        cell0(m.cpu_pct),
                        cell0(m.backend_cpu_pct),
                        cell0(m.client_cpu_pct),
                        cell0(m.other_cpu_pct)
                    );
                } else {
                    let _ = writeln!(
                        out,
                        "{:<8} |   cpu at max rps, % of one core: backend {}, load generator {}, other {}",
                        "",
                        cell0(m.backend_cpu_pct),
                        cell0(m.client_cpu_pct),
                        cell0(m.other_cpu_pct)
                    );
                }
            }
            for w in &t.warnings {
                let _ = writeln!(out, "{:<8} |   warning: {w}", "");
            }
        }
        if self.rounds.len() > 1 {
            let _ = writeln!(
                out,
                "\nper round (p50 / p99 ms at the fixed rate, max rps):"
            );
            for (i, round) in self.rounds.iter().enumerate() {
                let cells: Vec<String> = round
                    .iter()
                    .map(|t| {
                        let lat = t.fixed.as_ref().and_then(|f| f.latency);
                        match (lat, t.max) {
                            (Some(l), Some(m)) => {
                                format!("{} {:.3} / {:.3} / {:.0}", t.name, l.p50, l.p99, m.rps)
                            }
                            _ => format!("{} n/a", t.name),
                        }
                    })
                    .collect();
                let _ = writeln!(out, "  round {}: {}", i + 1, cells.join("  |  "));
            }
        }
        let _ = writeln!(out);
        let ms = |v: Option<(f64, f64)>| {
            v.map_or_else(
                || "n/a".to_string(),
                |(a, b)| format!("p50 {a:+.3} ms, p99 {b:+.3} ms"),
            )
        };
        let x = |v: Option<f64>| v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.3}"));
        let _ = writeln!(
            out,
            "router added latency (router - direct): {}",
            ms(self.added("router"))
        );
        let _ = writeln!(
            out,
            "nginx  added latency (nginx - direct):  {}",
            ms(self.added("nginx"))
        );
        let _ = writeln!(
            out,
            "throughput ratio router/nginx: {}   router/direct: {}   nginx/direct: {}",
            x(self.ratio("router", "nginx")),
            x(self.ratio("router", "direct")),
            x(self.ratio("nginx", "direct"))
        );
        let _ = writeln!(out, "\ngoals (informational):");
        for g in self.goals() {
            let value = g
                .value
                .map_or_else(|| "n/a".to_string(), |v| format!("{v:.3} {}", g.unit));
            let _ = writeln!(out, "  {:<42} {:>12}  {}", g.name, value, verdict(g.pass));
        }
        out
    }
}

fn target_json(t: &TargetResult) -> Value {
    json!({
        "name": t.name,
        "available": t.unavailable.is_none(),
        "unavailable_reason": t.unavailable,
        "warnings": t.warnings,
        "backend_hits": t.backend_hits,
        "disturbed": t.disturbed,
        "machine_busy_before_pct": t.busy_before_pct.map(round3),
        "fixed_rate": t.fixed.as_ref().map(|f| json!({
            "scheduled": f.scheduled,
            "ok": f.ok,
            "errors": f.errors,
            "achieved_rps": round3(f.achieved_rps),
            "cpu_pct_of_one_core": f.cpu_pct.map(round3),
            "other_processes_cpu_pct_of_one_core": f.other_cpu_pct.map(round3),
            "latency": f.latency.map(Percentiles::to_json),
            "service_time": f.service.map(Percentiles::to_json),
        })),
        "max_throughput": t.max.map(|m| json!({
            "ok": m.ok,
            "errors": m.errors,
            "rps": round3(m.rps),
            "cpu_pct_of_one_core": m.cpu_pct.map(round3),
            "backend_cpu_pct_of_one_core": m.backend_cpu_pct.map(round3),
            "load_generator_cpu_pct_of_one_core": m.client_cpu_pct.map(round3),
            "other_processes_cpu_pct_of_one_core": m.other_cpu_pct.map(round3),
            "cpu_us_per_request": m.cpu_us_per_req.map(round3),
        })),
    })
}

/// CPU of everything else on the machine: sources are [target, backend,
/// load generator, machine]; for `direct` the target is the backend.
fn other_pct(cpu: &[Option<std::time::Duration>], secs: f64) -> Option<f64> {
    let [target, backend, client, machine] = cpu else {
        return None;
    };
    let (target, backend, client, machine) = ((*target)?, (*backend)?, (*client)?, (*machine)?);
    let ours = if target == backend {
        backend + client
    } else {
        target + backend + client
    };
    Some(pct(Some(&Some(machine.saturating_sub(ours))), secs)?.max(0.0))
}

/// `cpu` over `secs`, as percent of one core.
fn pct(cpu: Option<&Option<std::time::Duration>>, secs: f64) -> Option<f64> {
    let cpu = (*cpu?)?;
    (secs > 0.0).then(|| 100.0 * cpu.as_secs_f64() / secs)
}

fn verdict(pass: Option<bool>) -> &'static str {
    match pass {
        Some(true) => "PASS",
        Some(false) => "FAIL",
        None => "N/A",
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}
