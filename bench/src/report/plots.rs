//! The PNG plots: throughput against clients, latency tails, scaling.
//! Each says under its title what the machine was and how the spread
//! between rounds is drawn, so a plot read alone is not read as more than
//! it is.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::{Machine, Pinning, Report, Row, Transport};
use crate::cpus::Cpus;

pub(super) fn load_font(path: &Path) -> Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    // plotters keeps fonts for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow::anyhow!("{} is not a usable font", path.display()))
}

fn color(system: &str) -> RGBColor {
    match system {
        "bagel" => RGBColor(214, 39, 40),
        "etcd" => RGBColor(31, 119, 180),
        "redis" => RGBColor(44, 160, 44),
        "redis-io" => RGBColor(23, 190, 207),
        "s3" => RGBColor(148, 103, 189),
        "bagel-s3" => RGBColor(255, 127, 14),
        _ => RGBColor(90, 90, 90),
    }
}

/// (system, names, transport) series of the closed-loop points, in a
/// stable order.
fn series(rows: &[Row]) -> Vec<(String, usize, Transport)> {
    let set: BTreeSet<(String, usize, Transport)> = rows
        .iter()
        .filter(|r| !r.paced)
        .map(|r| (r.system.clone(), r.names_per_cycle, r.transport))
        .collect();
    set.into_iter().collect()
}

fn label(system: &str, names: usize, transport: Transport) -> String {
    format!(
        "{system}{}, {names} name{}",
        transport.word().map_or(String::new(), |v| format!(" {v}")),
        if names == 1 { "" } else { "s" }
    )
}

/// Batched series are drawn in a lighter shade of their system's color,
/// session series in a darker one.
fn series_color(system: &str, transport: Transport) -> RGBColor {
    let c = color(system);
    match transport {
        Transport::Batched => RGBColor(c.0 / 2 + 127, c.1 / 2 + 127, c.2 / 2 + 127),
        Transport::Session => RGBColor(c.0 / 2, c.1 / 2, c.2 / 2),
        Transport::Unary => c,
    }
}

fn plural(n: usize, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

/// Where the servers and the load generator ran, from the report's own
/// record of the run (`--server-cpus`, `--client-cpus`): e.g. "2 cores
/// shared by clients and servers (unpinned)".
pub(super) fn setup(machine: &Machine, pinning: &Pinning) -> String {
    let parse = |s: &Option<String>| s.as_deref().and_then(|s| Cpus::parse(s).ok());
    match (parse(&pinning.server_cpus), parse(&pinning.client_cpus)) {
        (None, None) => format!(
            "{} shared by clients and servers (unpinned)",
            plural(machine.cores, "core")
        ),
        (Some(s), None) => format!(
            "servers pinned to CPUs {s}, clients unpinned on all {} (shared)",
            plural(machine.cores, "core")
        ),
        // `machine.cores` was counted after the load generator was
        // pinned: it is the clients' count then, so it is not used.
        (None, Some(c)) => format!("clients pinned to CPUs {c}, servers unpinned (shared)"),
        (Some(s), Some(c)) => {
            let shared = s.0.iter().any(|cpu| c.0.contains(cpu));
            format!(
                "servers pinned to CPUs {s}, clients to CPUs {c} ({})",
                if shared { "shared" } else { "not shared" }
            )
        }
    }
}

/// Rounds per point over the rows (all the same in one run).
fn rounds(rows: &[Row]) -> usize {
    rows.iter().map(|r| r.rounds).max().unwrap_or(1)
}

/// A title over a subtitle in smaller type; the area below them.
fn titled<'a>(
    root: &DrawingArea<BitMapBackend<'a>, Shift>,
    title: &str,
    subtitle: &str,
) -> Result<DrawingArea<BitMapBackend<'a>, Shift>> {
    root.fill(&WHITE)?;
    let area = root.titled(title, ("sans-serif", 24))?;
    Ok(area.titled(
        subtitle,
        ("sans-serif", 15).into_font().color(&RGBColor(70, 70, 70)),
    )?)
}

pub(super) fn plot_throughput(report: &Report, path: &Path) -> Result<()> {
    let rows = &report.rows;
    let pts: Vec<&Row> = rows.iter().filter(|r| r.cycles_per_s > 0.0 && !r.paced).collect();
    anyhow::ensure!(!pts.is_empty(), "no data");
    let cmax = pts.iter().map(|r| r.concurrency).max().unwrap_or(1) as f64;
    let ymax = pts
        .iter()
        .map(|r| r.cycles_per_s.max(r.cycles_per_s_max))
        .fold(1.0, f64::max);
    let ymin = pts
        .iter()
        .map(|r| r.cycles_per_s.min(r.cycles_per_s_min))
        .filter(|v| *v > 0.0)
        .fold(f64::MAX, f64::min);
    let n = rounds(rows);
    let spread = if n > 1 {
        format!("each point the median of {n} rounds, bars from the slowest round to the fastest")
    } else {
        "one round per point: no spread measured (--rounds)".to_string()
    };
    let root = BitMapBackend::new(path, (1000, 680)).into_drawing_area();
    let area = titled(
        &root,
        "Lease cycles per second vs concurrent clients",
        &format!("{}; {spread}", setup(&report.machine, &report.pinning)),
    )?;
    let mut chart = ChartBuilder::on(&area)
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(75)
        .build_cartesian_2d(
            (0.8f64..cmax * 1.25).log_scale(),
            // Headroom above the highest series for the legend.
            (ymin / 2.0..ymax * 12.0).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("concurrent clients")
        .y_desc("cycles/s")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 15))
        .draw()?;
    for (sys, names, transport) in series(rows) {
        let mut points: Vec<&Row> = pts
            .iter()
            .copied()
            .filter(|r| r.system == sys && r.names_per_cycle == names && r.transport == transport)
            .collect();
        points.sort_by_key(|r| r.concurrency);
        let line: Vec<(f64, f64)> = points
            .iter()
            .map(|r| (r.concurrency as f64, r.cycles_per_s))
            .collect();
        let c = series_color(&sys, transport);
        let width = if names == 1 { 3 } else { 1 };
        chart
            .draw_series(LineSeries::new(line.clone(), c.stroke_width(width)))?
            .label(label(&sys, names, transport))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(width)));
        chart.draw_series(line.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
        // The spread between rounds: a capped bar from the slowest to the
        // fastest round.
        for r in points.iter().filter(|r| r.rounds > 1 && r.cycles_per_s_min > 0.0) {
            let x = r.concurrency as f64;
            let (lo, hi) = (r.cycles_per_s_min, r.cycles_per_s_max);
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x, lo), (x, hi)],
                c.stroke_width(2),
            )))?;
            chart.draw_series([lo, hi].map(|y| {
                EmptyElement::at((x, y)) + PathElement::new(vec![(-6, 0), (6, 0)], c.stroke_width(2))
            }))?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

/// (latency µs, fraction of cycles slower): the CDF's tail, for a log
/// axis. The last point (the slowest cycle, none slower) has no place on
/// it.
fn tail(cdf: &[(f64, f64)]) -> Vec<(f64, f64)> {
    cdf.iter()
        .filter(|p| p.1 < 1.0)
        .map(|&(us, q)| (us, 1.0 - q))
        .collect()
}

/// The outline of the band between the fastest and the slowest round's
/// tails: at each quantile, the lowest latency of any round, then the
/// highest on the way back. `None` with fewer than two rounds.
fn tail_band(rounds: &[Vec<(f64, f64)>]) -> Option<Vec<(f64, f64)>> {
    let tails: Vec<Vec<(f64, f64)>> = rounds.iter().map(|r| tail(r)).collect();
    let len = tails.iter().map(Vec::len).min()?;
    if tails.len() < 2 || len == 0 {
        return None;
    }
    let at = |i: usize, pick: fn(f64, f64) -> f64, start: f64| {
        (tails.iter().map(|t| t[i].0).fold(start, pick), tails[0][i].1)
    };
    let mut outline: Vec<(f64, f64)> = (0..len).map(|i| at(i, f64::min, f64::INFINITY)).collect();
    outline.extend((0..len).rev().map(|i| at(i, f64::max, 0.0)));
    Some(outline)
}

/// A fraction of cycles as a percent and the percentile it marks:
/// 0.01 is "1% p99" (and 1, every cycle, just "100%").
fn tail_label(y: f64) -> String {
    let trim = |v: f64| {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    let (percent, percentile) = (trim(y * 100.0), trim(100.0 - y * 100.0));
    if percentile == "0" {
        format!("{percent}%")
    } else {
        format!("{percent}% p{percentile}")
    }
}

/// The lowest fraction the tail plot shows: one cycle in 20,000, below
/// the p99.99 point every CDF has.
const TAIL_FLOOR: f64 = 5e-5;

pub(super) fn plot_cdf(report: &Report, path: &Path) -> Result<()> {
    let rows = &report.rows;
    let concurrencies: Vec<usize> = rows
        .iter()
        .filter(|r| !r.cdf.is_empty())
        .map(|r| r.concurrency)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    anyhow::ensure!(!concurrencies.is_empty(), "no data");
    let cols = concurrencies.len().min(2);
    let nrows = concurrencies.len().div_ceil(cols);
    let n = rounds(rows);
    let spread = if n > 1 {
        format!("lines: the median round's; shaded: from the fastest to the slowest of {n} rounds")
    } else {
        "one round per point: no spread measured (--rounds)".to_string()
    };
    let root = BitMapBackend::new(path, (600 * cols as u32, 420 * nrows as u32 + 60)).into_drawing_area();
    let area = titled(
        &root,
        "Lease cycle latency tails: the fraction of cycles slower than x (log-log)",
        &format!("{}; {spread}", setup(&report.machine, &report.pinning)),
    )?;
    let all = rows
        .iter()
        .flat_map(|r| r.cdf_rounds.iter().flatten().chain(&r.cdf));
    let xmin = all.clone().map(|p| p.0).fold(f64::MAX, f64::min).max(1.0);
    let xmax = all.map(|p| p.0).fold(1.0, f64::max);
    for (panel, &conc) in area.split_evenly((nrows, cols)).iter().zip(&concurrencies) {
        let mut chart = ChartBuilder::on(panel)
            .caption(plural(conc, "client"), ("sans-serif", 20))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(95)
            .build_cartesian_2d(
                (xmin / 1.5..xmax * 1.5).log_scale(),
                (TAIL_FLOOR..1f64).log_scale(),
            )?;
        chart
            .configure_mesh()
            .x_desc("cycle latency µs (log)")
            .y_desc("cycles slower (log)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| tail_label(*y))
            .label_style(("sans-serif", 13))
            .draw()?;
        for (sys, names, transport) in series(rows) {
            let Some(r) = rows.iter().find(|r| {
                r.system == sys
                    && r.names_per_cycle == names
                    && r.transport == transport
                    && r.concurrency == conc
                    && !r.paced
            }) else {
                continue;
            };
            if r.cdf.is_empty() {
                continue;
            }
            let c = series_color(&sys, transport);
            let width = if names == 1 { 2 } else { 1 };
            if let Some(band) = tail_band(&r.cdf_rounds) {
                chart.draw_series(std::iter::once(Polygon::new(band, c.mix(0.15).filled())))?;
            }
            chart
                .draw_series(LineSeries::new(tail(&r.cdf), c.stroke_width(width)))?
                .label(label(&sys, names, transport))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(width)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 12))
            // Where a tail plot has no curve: slow and common.
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// Peak cycles/s against server cores, one line per system (bagel's
/// variants apart), linear axes from 0 so "flat" and "linear" read as such.
pub(super) fn plot_scaling(report: &Report, path: &Path) -> Result<()> {
    let rows = &report.scaling;
    anyhow::ensure!(!rows.is_empty(), "no data");
    // Whole cores on the x axis (no fractional tick labels).
    let xmax = u32::try_from(rows.iter().map(|r| r.server_cores).max().unwrap_or(1)).unwrap_or(u32::MAX - 1);
    let ymax = rows.iter().map(|r| r.cycles_per_s).fold(1.0, f64::max);
    let shared: BTreeSet<usize> = rows
        .iter()
        .filter(|r| r.clients_share_server_cpus)
        .map(|r| r.server_cores)
        .collect();
    let clients = if shared.is_empty() {
        "clients on other CPUs at every point".to_string()
    } else {
        let at: Vec<String> = shared.iter().map(ToString::to_string).collect();
        format!(
            "clients on the CPUs left, sharing the server's at {} (none left)",
            at.join(", ")
        )
    };
    let root = BitMapBackend::new(path, (1000, 680)).into_drawing_area();
    let area = titled(
        &root,
        "Peak single-name cycles/s vs server cores",
        &format!(
            "{}the server pinned to its cores, {clients}; one round per point",
            // Counted after the load generator was pinned, if it was: then
            // not the machine's.
            match report.pinning.client_cpus {
                None => format!("{} in all; ", plural(report.machine.cores, "core")),
                Some(_) => String::new(),
            }
        ),
    )?;
    let mut chart = ChartBuilder::on(&area)
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(75)
        .build_cartesian_2d(0u32..xmax + 1, 0f64..ymax * 1.3)?;
    chart
        .configure_mesh()
        .x_desc("server cores (pinned CPUs)")
        .y_desc("peak cycles/s")
        .x_labels(xmax as usize + 2)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 15))
        .draw()?;
    let labels: BTreeSet<(String, Transport, String)> = rows
        .iter()
        .map(|r| (r.system.clone(), r.transport, r.label.clone()))
        .collect();
    for (sys, transport, label) in labels {
        let mut line: Vec<(u32, f64)> = rows
            .iter()
            .filter(|r| r.label == label)
            .map(|r| (u32::try_from(r.server_cores).unwrap_or(u32::MAX), r.cycles_per_s))
            .collect();
        line.sort_by_key(|p| p.0);
        let c = series_color(&sys, transport);
        chart
            .draw_series(LineSeries::new(line.clone(), c.stroke_width(3)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
        chart.draw_series(line.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_says_how_clients_and_servers_shared_the_cpus() {
        let machine = Machine {
            cores: 2,
            ..Default::default()
        };
        let pinned = |s: Option<&str>, c: Option<&str>| Pinning {
            server_cpus: s.map(String::from),
            client_cpus: c.map(String::from),
            client_threads: 1,
        };
        assert_eq!(
            setup(&machine, &pinned(None, None)),
            "2 cores shared by clients and servers (unpinned)"
        );
        assert_eq!(
            setup(&machine, &pinned(Some("0"), None)),
            "servers pinned to CPUs 0, clients unpinned on all 2 cores (shared)"
        );
        assert_eq!(
            setup(&machine, &pinned(None, Some("1"))),
            "clients pinned to CPUs 1, servers unpinned (shared)"
        );
        assert_eq!(
            setup(&machine, &pinned(Some("0-3"), Some("4-7"))),
            "servers pinned to CPUs 0-3, clients to CPUs 4-7 (not shared)"
        );
        assert_eq!(
            setup(&machine, &pinned(Some("0-3"), Some("3,4"))),
            "servers pinned to CPUs 0-3, clients to CPUs 3-4 (shared)"
        );
        let one = Machine {
            cores: 1,
            ..Default::default()
        };
        assert_eq!(
            setup(&one, &pinned(None, None)),
            "1 core shared by clients and servers (unpinned)"
        );
    }

    #[test]
    fn tails_count_the_cycles_slower_and_the_band_spans_the_rounds() {
        let fast = vec![(100.0, 0.5), (200.0, 0.99), (400.0, 1.0)];
        let slow = vec![(150.0, 0.5), (900.0, 0.99), (1000.0, 1.0)];
        let t = tail(&fast);
        assert_eq!(t.len(), 2, "the slowest cycle has no place on a log axis");
        assert!(
            (t[0].1 - 0.5).abs() < 1e-12 && (t[1].1 - 0.01).abs() < 1e-12,
            "{t:?}"
        );
        assert_eq!(tail_band(std::slice::from_ref(&fast)), None, "one round: no band");
        let band = tail_band(&[fast, slow]).unwrap();
        let xs: Vec<f64> = band.iter().map(|p| p.0).collect();
        assert_eq!(xs, [100.0, 200.0, 900.0, 150.0]);
        assert_eq!(tail_label(0.01), "1% p99");
        assert_eq!(tail_label(0.001), "0.1% p99.9");
        assert_eq!(tail_label(0.5), "50% p50");
        assert_eq!(tail_label(1.0), "100%");
    }
}
