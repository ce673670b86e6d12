//! `/tenants`: every tenant the current policy names, with its limits,
//! its spend today and this month against its budgets (the counters the
//! proxies keep in the shared store, read as `routerctl tenants usage`
//! reads them), and its requests, tokens and spend over the last 24 hours
//! (hourly) and 30 days (daily) as SVG charts drawn here
//! ([`super::chart`]) from the proxies' hourly rollups
//! ([`router_policy::rollup`]). `/tenants?tenant=NAME`: one tenant.
//!
//! Reads (`router_shared_state::admin::tenants`, one round trip): one
//! pipelined `MGET` per tenant for its spend, and one pipelined `HMGET`
//! per tenant and hour for the charts (up to 720 a tenant: the 30 days);
//! charts are drawn for the first [`CHARTED`] tenants of the page, the
//! others are one click away.

use std::collections::HashMap;

use askama::Template;
use http::StatusCode;
use router_policy::rollup::Totals;
use router_policy::tenant::{Gcra, Tenant};
use router_shared_state::SharedStoreClient;

use super::super::session::Session;
use super::super::{Answer, Console};
use super::chart::{self, Chart, Point};
use super::{error_page, render, Layout};
use crate::hub::now_ms;

/// Tenants charted on one page at most (each costs up to 720 reads).
pub(in crate::console) const CHARTED: usize = 20;

const NO_STORE: &str = "tenants' spend and rollups live in the proxies' shared store: start the control plane with --shared-store (ROUTER_SHARED_STORE) pointing at it";

/// One budget as the page shows it.
pub(super) struct BudgetRow {
    spent: String,
    budget: String,
    /// Percent of the budget spent (0 without one), for the bar.
    percent: u64,
    over: bool,
}

/// One tenant as the page shows it.
pub(super) struct TenantRow {
    name: String,
    /// `requests/min 600 (burst 30)`, ... .
    limits: Vec<String>,
    day: BudgetRow,
    month: BudgetRow,
    /// Reserved by calls in flight today.
    reserved: String,
    requests_24h: String,
    tokens_24h: String,
    spend_24h: String,
    failed_24h: u64,
    charts: Vec<Chart>,
    charted: bool,
}

#[derive(Template)]
#[template(path = "tenants.html")]
struct TenantsPage {
    layout: Layout,
    problem: String,
    tenants: Vec<TenantRow>,
    /// Showing one tenant (`?tenant=`).
    one: bool,
    /// Tenants not charted on this page.
    not_charted: usize,
    day: String,
    month: String,
}

fn per_minute(g: &Gcra) -> (u64, u64) {
    let interval = g.interval.as_nanos().max(1);
    let per_min = (60_000_000_000u128 / interval) as u64;
    let burst = (g.tolerance.as_nanos() / interval) as u64 + 1;
    (per_min, burst)
}

fn limits(t: &Tenant) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(g) = &t.rate {
        let (n, b) = per_minute(g);
        out.push(format!("{n} requests/min (burst {b})"));
    }
    if let Some(g) = &t.token_rate {
        let (n, b) = per_minute(g);
        out.push(format!("{n} tokens/min (burst {b})"));
    }
    if let Some(c) = t.max_concurrent {
        out.push(format!("{c} at once"));
    }
    if !t.routes.is_empty() {
        out.push(format!("routes: {}", t.routes.join(", ")));
    }
    out.push(format!("risk up to {}", t.max_risk.as_str()));
    if t.budgets.any() {
        out.push(if t.budget_fail_open {
            "budget: open while the store is down".into()
        } else {
            "budget: closed while the store is down".into()
        });
    }
    out
}

fn budget_row(spent: i64, budget: Option<u64>) -> BudgetRow {
    let spent = u64::try_from(spent.max(0)).unwrap_or(0);
    match budget {
        None => BudgetRow {
            spent: chart::usd(spent),
            budget: "no budget".into(),
            percent: 0,
            over: false,
        },
        Some(b) => BudgetRow {
            spent: chart::usd(spent),
            budget: chart::usd(b),
            percent: (spent.saturating_mul(100) / b.max(1)).min(100),
            over: spent >= b,
        },
    }
}

/// What the store holds for the page's tenants.
#[derive(Default)]
struct Read {
    /// Per tenant: the day's counter, the month's, reserved in flight.
    spend: Vec<[i64; 3]>,
    /// Per charted tenant: per hour (oldest first), its totals.
    hours: Vec<Vec<Totals>>,
}

async fn read(
    client: &SharedStoreClient,
    tenants: &[Tenant],
    charted: usize,
    hours: &[u64],
    now_s: u64,
) -> Result<Read, String> {
    let names: Vec<&str> = tenants.iter().map(|t| t.name.as_str()).collect();
    let r = client
        .tenants_page(&names, charted, hours, now_s)
        .await
        .map_err(|e| crate::shared_store::message(&e))?;
    Ok(Read {
        spend: r
            .spend
            .iter()
            .map(|c| [c.day, c.month, c.reserved])
            .collect(),
        hours: r.hours,
    })
}

/// The hours the charts need: from the start of the UTC day 29 days ago
/// to the current hour (at most 720), oldest first.
fn chart_hours(now_s: u64) -> Vec<u64> {
    let today = now_s - now_s % 86_400;
    let from = today.saturating_sub(29 * 86_400);
    let this_hour = now_s - now_s % 3600;
    (from..=this_hour).step_by(3600).collect()
}

/// The six charts of a tenant from its hours (`hours[i]` starts at
/// `starts[i]`).
fn charts(starts: &[u64], hours: &[Totals], now_s: u64) -> (Vec<Chart>, Totals) {
    // The last 24 hours, hourly.
    let day_from = (now_s - now_s % 3600).saturating_sub(23 * 3600);
    let last24: Vec<(u64, Totals)> = starts
        .iter()
        .zip(hours)
        .filter(|(s, _)| **s >= day_from)
        .map(|(s, t)| (*s, *t))
        .collect();
    let sum24 = last24
        .iter()
        .fold(Totals::default(), |a, (_, t)| a.plus(*t));
    let hourly = |f: fn(&Totals) -> u64| -> Vec<Point> {
        last24
            .iter()
            .map(|(s, t)| Point {
                label: format!("{:02}:00", (s % 86_400) / 3600),
                value: f(t),
            })
            .collect()
    };
    // The last 30 days, daily.
    let mut days: Vec<(u64, Totals)> = Vec::new();
    for (s, t) in starts.iter().zip(hours) {
        let d = s - s % 86_400;
        match days.last_mut() {
            Some((day, sum)) if *day == d => *sum = sum.plus(*t),
            _ => days.push((d, *t)),
        }
    }
    let daily = |f: fn(&Totals) -> u64| -> Vec<Point> {
        days.iter()
            .map(|(d, t)| {
                let (name, _, _, _) = router_policy::tenant::periods(*d);
                Point {
                    label: name.get(5..).unwrap_or(&name).to_string(),
                    value: f(t),
                }
            })
            .collect()
    };
    let requests = |t: &Totals| t.requests;
    let tokens = |t: &Totals| t.tokens;
    let micros = |t: &Totals| t.micros;
    (
        vec![
            chart::bars(
                "requests-24h",
                "Requests, last 24 hours (UTC)",
                &hourly(requests),
                chart::count,
                6,
            ),
            chart::bars(
                "tokens-24h",
                "Tokens, last 24 hours",
                &hourly(tokens),
                chart::count,
                6,
            ),
            chart::bars(
                "spend-24h",
                "Spend, last 24 hours",
                &hourly(micros),
                chart::usd,
                6,
            ),
            chart::bars(
                "requests-30d",
                "Requests, last 30 days",
                &daily(requests),
                chart::count,
                7,
            ),
            chart::bars(
                "tokens-30d",
                "Tokens, last 30 days",
                &daily(tokens),
                chart::count,
                7,
            ),
            chart::bars(
                "spend-30d",
                "Spend, last 30 days",
                &daily(micros),
                chart::usd,
                7,
            ),
        ],
        sum24,
    )
}

/// Builds the page's rows (without the store: zeros and no charts).
fn rows(tenants: &[Tenant], read: &Read, starts: &[u64], now_s: u64) -> Vec<TenantRow> {
    tenants
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let [day, month, reserved] = read.spend.get(i).copied().unwrap_or_default();
            let (charts, sum) = match read.hours.get(i) {
                Some(h) => charts(starts, h, now_s),
                None => (Vec::new(), Totals::default()),
            };
            TenantRow {
                name: t.name.clone(),
                limits: limits(t),
                day: budget_row(day.saturating_sub(reserved), t.budgets.per_day),
                month: budget_row(month.saturating_sub(reserved), t.budgets.per_month),
                reserved: chart::usd(u64::try_from(reserved).unwrap_or(0)),
                requests_24h: chart::count(sum.requests),
                tokens_24h: chart::count(sum.tokens),
                spend_24h: chart::usd(sum.micros),
                failed_24h: sum.failed,
                charted: !charts.is_empty(),
                charts,
            }
        })
        .collect()
}

/// `GET /tenants` and `GET /tenants?tenant=NAME`.
pub(in crate::console) async fn get(console: &Console, s: &Session, query: Option<&str>) -> Answer {
    let Some(hub) = console.hub.upgrade() else {
        return error_page(
            StatusCode::SERVICE_UNAVAILABLE,
            "the control plane is shutting down",
        );
    };
    let wanted: HashMap<String, String> = query
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let mut tenants = hub.tenants();
    let one = match wanted.get("tenant").filter(|t| !t.is_empty()) {
        Some(name) => {
            tenants.retain(|t| &t.name == name);
            if tenants.is_empty() {
                return error_page(StatusCode::NOT_FOUND, "the policy names no such tenant");
            }
            true
        }
        None => false,
    };
    let now_s = u64::try_from(now_ms() / 1000).unwrap_or(0);
    let starts = chart_hours(now_s);
    let charted = tenants.len().min(CHARTED);
    let (read, problem) = match &console.shared_store {
        None => (Read::default(), NO_STORE.to_string()),
        Some(client) => match read(client, &tenants, charted, &starts, now_s).await {
            Ok(r) => (r, String::new()),
            Err(e) => (Read::default(), e),
        },
    };
    let (day, _, month, _) = router_policy::tenant::periods(now_s);
    let rows = rows(&tenants, &read, &starts, now_s);
    render(
        StatusCode::OK,
        &TenantsPage {
            layout: Layout::new("Tenants", "tenants", s, true)
                .every(super::TENANTS_REFRESH_SECONDS),
            problem,
            not_charted: tenants.len() - charted,
            tenants: rows,
            one,
            day,
            month,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_charts_cover_24_hours_and_30_days_and_sum_them() {
        // 2024-02-29T23:30:00Z.
        let now = 1_709_249_400;
        let starts = chart_hours(now);
        assert_eq!(starts.len(), 720, "29 whole days and today's 24 hours");
        let mut hours = vec![Totals::default(); starts.len()];
        // One request an hour, the last one with 10 tokens and 5 micros.
        for h in &mut hours {
            h.requests = 1;
        }
        if let Some(last) = hours.last_mut() {
            last.tokens = 10;
            last.micros = 5;
        }
        let (charts, sum) = charts(&starts, &hours, now);
        assert_eq!(sum.requests, 24);
        assert_eq!((sum.tokens, sum.micros), (10, 5));
        let kinds: Vec<&str> = charts.iter().map(|c| c.kind).collect();
        assert_eq!(
            kinds,
            [
                "requests-24h",
                "tokens-24h",
                "spend-24h",
                "requests-30d",
                "tokens-30d",
                "spend-30d"
            ]
        );
        assert_eq!(charts[0].bars.len(), 24);
        assert_eq!(charts[3].bars.len(), 30);
        assert!(charts[3].bars.iter().all(|b| b.value == 24));
        assert_eq!(
            charts[3].x_labels.last().map(|l| l.text.as_str()),
            Some("02-29")
        );
        assert_eq!(
            charts[0].x_labels.first().map(|l| l.text.as_str()),
            Some("00:00")
        );
    }

    #[test]
    fn limits_and_budgets_read_as_people_say_them() {
        let g = router_policy::tenant::Gcra {
            interval: Duration::from_millis(100),
            tolerance: Duration::from_millis(2900),
        };
        assert_eq!(per_minute(&g), (600, 30));
        let b = budget_row(1_500_000, Some(1_000_000));
        assert!(b.over);
        assert_eq!(b.percent, 100);
        let b = budget_row(250_000, Some(1_000_000));
        assert_eq!((b.percent, b.over), (25, false));
        assert_eq!(budget_row(-5, None).budget, "no budget");
    }
}
