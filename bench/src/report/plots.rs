//! The PNG plots: throughput against clients, and latency CDFs.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result};
use plotters::prelude::*;

use super::{Row, Transport};

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

pub(super) fn plot_throughput(rows: &[Row], path: &Path) -> Result<()> {
    let pts: Vec<&Row> = rows.iter().filter(|r| r.cycles_per_s > 0.0 && !r.paced).collect();
    anyhow::ensure!(!pts.is_empty(), "no data");
    let cmax = pts.iter().map(|r| r.concurrency).max().unwrap_or(1) as f64;
    let ymax = pts.iter().map(|r| r.cycles_per_s).fold(1.0, f64::max);
    let ymin = pts.iter().map(|r| r.cycles_per_s).fold(f64::MAX, f64::min);
    let root = BitMapBackend::new(path, (1000, 650)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Lease cycles per second vs concurrent clients",
            ("sans-serif", 24),
        )
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
        let mut line: Vec<(f64, f64)> = pts
            .iter()
            .filter(|r| r.system == sys && r.names_per_cycle == names && r.transport == transport)
            .map(|r| (r.concurrency as f64, r.cycles_per_s))
            .collect();
        line.sort_by(|a, b| a.0.total_cmp(&b.0));
        let c = series_color(&sys, transport);
        let width = if names == 1 { 3 } else { 1 };
        chart
            .draw_series(LineSeries::new(line.clone(), c.stroke_width(width)))?
            .label(label(&sys, names, transport))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(width)));
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

pub(super) fn plot_cdf(rows: &[Row], path: &Path) -> Result<()> {
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
    let root = BitMapBackend::new(path, (600 * cols as u32, 420 * nrows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let xmin = rows
        .iter()
        .flat_map(|r| r.cdf.iter().map(|p| p.0))
        .fold(f64::MAX, f64::min)
        .max(1.0);
    let xmax = rows
        .iter()
        .flat_map(|r| r.cdf.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    for (panel, &conc) in root.split_evenly((nrows, cols)).iter().zip(&concurrencies) {
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!(
                    "Cycle latency CDF, {conc} client{}",
                    if conc == 1 { "" } else { "s" }
                ),
                ("sans-serif", 20),
            )
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d((xmin / 1.5..xmax * 1.5).log_scale(), 0f64..1f64)?;
        chart
            .configure_mesh()
            .x_desc("latency µs (log)")
            .y_desc("fraction of cycles")
            .x_label_formatter(&|x| format!("{x:.0}"))
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
            chart
                .draw_series(LineSeries::new(r.cdf.clone(), c.stroke_width(width)))?
                .label(label(&sys, names, transport))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(width)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 12))
            .position(SeriesLabelPosition::LowerRight)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// Peak cycles/s against server cores, one line per system (bagel's
/// variants apart), linear axes from 0 so "flat" and "linear" read as such.
pub(super) fn plot_scaling(rows: &[crate::scaling::ScalingRow], path: &Path) -> Result<()> {
    anyhow::ensure!(!rows.is_empty(), "no data");
    // Whole cores on the x axis (no fractional tick labels).
    let xmax = u32::try_from(rows.iter().map(|r| r.server_cores).max().unwrap_or(1)).unwrap_or(u32::MAX - 1);
    let ymax = rows.iter().map(|r| r.cycles_per_s).fold(1.0, f64::max);
    let root = BitMapBackend::new(path, (1000, 650)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Peak single-name cycles/s vs server cores", ("sans-serif", 24))
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
