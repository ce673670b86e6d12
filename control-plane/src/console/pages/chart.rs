//! Bar charts as SVG, drawn here (no script, no chart library): a series
//! of buckets becomes bars on a plot with its axes, a "nice" top value
//! and two gridlines labelled, and a few bucket names under the x axis.
//! The template (`chart.html`) writes the numbers computed here; every
//! text in it (title, labels, the tooltips) is escaped by askama like
//! the rest of a page.

/// One bucket of a series: its name (the tooltip and the x labels) and
/// its value.
pub(super) struct Point {
    pub(super) label: String,
    pub(super) value: u64,
}

/// A bar, placed.
pub(super) struct Bar {
    pub(super) x: String,
    pub(super) y: String,
    pub(super) w: String,
    pub(super) h: String,
    /// Its value, raw (`data-value`, for tests and people reading the
    /// source).
    pub(super) value: u64,
    /// `label: value`, shown on hover.
    pub(super) tip: String,
}

/// A label under the x axis.
pub(super) struct XLabel {
    pub(super) x: String,
    pub(super) text: String,
}

/// A chart ready for `chart.html`.
pub(super) struct Chart {
    /// Its kind, as a class (`requests-24h`, `spend-30d`...).
    pub(super) kind: &'static str,
    pub(super) title: &'static str,
    pub(super) width: u32,
    pub(super) height: u32,
    pub(super) left: u32,
    pub(super) right: u32,
    pub(super) top: u32,
    pub(super) mid: u32,
    pub(super) bottom: u32,
    /// The top gridline's value and the middle one's, formatted.
    pub(super) y_top: String,
    pub(super) y_mid: String,
    pub(super) bars: Vec<Bar>,
    pub(super) x_labels: Vec<XLabel>,
    /// The series' sum, formatted, and raw (`data-total`).
    pub(super) total: String,
    pub(super) total_raw: u64,
}

const WIDTH: u32 = 420;
const HEIGHT: u32 = 150;
const LEFT: u32 = 56;
const RIGHT: u32 = 8;
const TOP: u32 = 10;
const BOTTOM: u32 = 22;

/// The top of a plot for a highest value `v`: the smallest even number
/// at or above it up to 10 (2 for 0), then the smallest of 2, 5, 10 ×
/// 10^k: always even, so the middle gridline's value is whole.
pub(super) fn nice_ceiling(v: u64) -> u64 {
    if v <= 10 {
        return (v + v % 2).max(2);
    }
    let mut step: u64 = 10;
    loop {
        for m in [2u64, 5, 10] {
            let c = step.saturating_mul(m);
            if c >= v || c == u64::MAX {
                return c;
            }
        }
        if step > u64::MAX / 10 {
            return u64::MAX;
        }
        step *= 10;
    }
}

fn px(v: f64) -> String {
    format!("{v:.1}")
}

/// Lays `points` out as bars; `format` writes a value as people read it;
/// every `label_every`-th bucket (and the last) is named under the axis.
pub(super) fn bars(
    kind: &'static str,
    title: &'static str,
    points: &[Point],
    format: fn(u64) -> String,
    label_every: usize,
) -> Chart {
    let max = points.iter().map(|p| p.value).max().unwrap_or(0);
    let top_value = nice_ceiling(max);
    let plot_w = f64::from(WIDTH - LEFT - RIGHT);
    let plot_h = f64::from(HEIGHT - TOP - BOTTOM);
    let bottom = HEIGHT - BOTTOM;
    let n = points.len().max(1) as f64;
    let slot = plot_w / n;
    let w = (slot * 0.8).max(1.0);
    let bars = points
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let h = plot_h * (p.value as f64 / top_value as f64);
            // A bar that has anything shows at least a sliver.
            let h = if p.value > 0 { h.max(1.0) } else { 0.0 };
            Bar {
                x: px(f64::from(LEFT) + slot * i as f64 + (slot - w) / 2.0),
                y: px(f64::from(bottom) - h),
                w: px(w),
                h: px(h),
                value: p.value,
                tip: format!("{}: {}", p.label, format(p.value)),
            }
        })
        .collect();
    let every = label_every.max(1);
    let x_labels = points
        .iter()
        .enumerate()
        // Every `every`-th, unless the last (always named) is too close.
        .filter(|(i, _)| {
            let last = points.len() - 1;
            *i == last || (i % every == 0 && last - i >= every.div_ceil(2))
        })
        .map(|(i, p)| XLabel {
            x: px(f64::from(LEFT) + slot * (i as f64 + 0.5)),
            text: p.label.clone(),
        })
        .collect();
    let total = points.iter().fold(0u64, |s, p| s.saturating_add(p.value));
    Chart {
        kind,
        title,
        width: WIDTH,
        height: HEIGHT,
        left: LEFT,
        right: WIDTH - RIGHT,
        top: TOP,
        mid: TOP + (bottom - TOP) / 2,
        bottom,
        y_top: format(top_value),
        y_mid: format(top_value / 2),
        bars,
        x_labels,
        total: format(total),
        total_raw: total,
    }
}

/// A count: `950`, `12.5k`, `3.2M`.
pub(super) fn count(v: u64) -> String {
    match v {
        0..=9_999 => v.to_string(),
        10_000..=999_999 => format!("{:.1}k", v as f64 / 1e3),
        _ => format!("{:.1}M", v as f64 / 1e6),
    }
}

/// Micro-USD as dollars: `$0`, `$0.000050`, `$0.0042`, `$12.50`, `$1234k`.
pub(super) fn usd(micros: u64) -> String {
    let d = micros as f64 / 1e6;
    match micros {
        0 => "$0".into(),
        1..=99 => format!("${d:.6}"),
        100..=9_999 => format!("${d:.4}"),
        10_000..=999_999_999 => format!("${d:.2}"),
        _ => format!("${:.0}k", d / 1e3),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tops_are_nice_and_formats_read_well() {
        assert_eq!(nice_ceiling(0), 2);
        assert_eq!(nice_ceiling(1), 2);
        assert_eq!(nice_ceiling(3), 4);
        assert_eq!(nice_ceiling(7), 8);
        assert_eq!(nice_ceiling(11), 20);
        assert_eq!(nice_ceiling(21), 50);
        assert_eq!(nice_ceiling(101), 200);
        assert_eq!(nice_ceiling(501), 1000);
        assert_eq!(nice_ceiling(u64::MAX), u64::MAX);
        assert_eq!(count(950), "950");
        assert_eq!(count(12_500), "12.5k");
        assert_eq!(count(3_200_000), "3.2M");
        assert_eq!(usd(0), "$0");
        assert_eq!(usd(4_200), "$0.0042");
        assert_eq!(usd(12_500_000), "$12.50");
    }

    #[test]
    fn bars_fit_the_plot_and_the_highest_reaches_the_top() {
        let points: Vec<Point> = (0..24)
            .map(|i| Point {
                label: format!("{i:02}:00"),
                value: if i == 5 { 10 } else { i % 3 },
            })
            .collect();
        let c = bars("requests-24h", "Requests", &points, count, 6);
        assert_eq!(c.bars.len(), 24);
        assert_eq!(
            c.total_raw,
            10 + (0..24).filter(|i| *i != 5).map(|i| i % 3).sum::<u64>()
        );
        assert_eq!((c.y_top.as_str(), c.y_mid.as_str()), ("10", "5"));
        let tallest = &c.bars[5];
        assert_eq!(
            tallest.y,
            format!("{:.1}", f64::from(TOP)),
            "reaches the top"
        );
        assert_eq!(c.bars[0].h, "0.0");
        for b in &c.bars {
            let x: f64 = b.x.parse().unwrap();
            let w: f64 = b.w.parse().unwrap();
            assert!(x >= f64::from(LEFT) && x + w <= f64::from(WIDTH - RIGHT) + 0.1);
        }
        // Every 6th bucket and the last are named.
        let named: Vec<&str> = c.x_labels.iter().map(|l| l.text.as_str()).collect();
        assert_eq!(named, ["00:00", "06:00", "12:00", "18:00", "23:00"]);
        // Thirty days by seven: d28 is too close to the last to be named.
        let days: Vec<Point> = (0..30)
            .map(|i| Point {
                label: format!("d{i}"),
                value: 1,
            })
            .collect();
        let c = bars("requests-30d", "Requests", &days, count, 7);
        let named: Vec<&str> = c.x_labels.iter().map(|l| l.text.as_str()).collect();
        assert_eq!(named, ["d0", "d7", "d14", "d21", "d29"]);
        // No data: an empty plot, not a division by zero.
        let c = bars("spend-30d", "Spend", &[], usd, 7);
        assert!(c.bars.is_empty());
        assert_eq!(c.y_top, "$0.000002");
    }
}
