//! `/metrics` in the format the scraper asks for: the classic Prometheus
//! text format (0.0.4) by default, OpenMetrics 1.0 when the `Accept`
//! header asks for `application/openmetrics-text` (as Prometheus does).
//!
//! Why both: Prometheus itself prefers OpenMetrics, but much that reads
//! `/metrics` does not (`promtool check metrics`, older agents, `curl` by
//! an operator): promtool refused our OpenMetrics with `unknown metric
//! type "info"`, and in the classic format a counter's `# HELP` must name
//! its `_total` series.
//!
//! Both side ports (bagel-server's and the metronome's) encode with
//! `prometheus-client`, which writes OpenMetrics only; [`to_prometheus`]
//! rewrites that text to the classic format. The rewrite is small because
//! the two formats share the sample lines (names, label escaping, values)
//! and differ only in metadata: no `# UNIT` and no `# EOF`; a counter
//! family is named after its `_total` series; an `info` family is a gauge
//! named after its `_info` series; `unknown` is `untyped`.

/// The content type of the classic Prometheus text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The content type of OpenMetrics text.
pub const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A text exposition format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4.
    Prometheus,
    /// OpenMetrics text 1.0.
    OpenMetrics,
}

impl Format {
    /// The format for a request with this `Accept` header: OpenMetrics when
    /// it accepts `application/openmetrics-text` at least as much as
    /// `text/plain` (`q` values compared, wildcards counting for
    /// `text/plain`), the classic format otherwise (no header, `*/*`, a
    /// browser's header).
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Prometheus;
        };
        let (mut openmetrics, mut text) = (0.0_f32, 0.0_f32);
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .map_or(1.0, |(_, v)| v.trim().parse::<f32>().unwrap_or(0.0));
            match media.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(q),
                "text/plain" | "text/*" | "*/*" => text = text.max(q),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= text {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    /// Its `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => PROMETHEUS_TEXT,
            Format::OpenMetrics => OPENMETRICS_TEXT,
        }
    }

    /// `openmetrics` (prometheus-client's output) in this format.
    pub fn render(self, openmetrics: String) -> String {
        match self {
            Format::Prometheus => to_prometheus(&openmetrics),
            Format::OpenMetrics => openmetrics,
        }
    }
}

/// OpenMetrics text as prometheus-client writes it, in the classic
/// Prometheus text format (see the module docs for what changes).
pub fn to_prometheus(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // The family being copied: (its OpenMetrics name, its type).
    let mut family: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            // The TYPE line comes next and says how to name the family;
            // hold the help until then.
            family = Some((name, help));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let help = match family {
                Some((held, help)) if held == name => Some(help),
                _ => None,
            };
            let (series, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "gauge" | "histogram" | "summary" => (name.to_owned(), kind),
                _ => (name.to_owned(), "untyped"),
            };
            if let Some(help) = help {
                out.push_str(&format!("# HELP {series} {help}\n"));
            }
            out.push_str(&format!("# TYPE {series} {kind}\n"));
            family = Some((name, kind));
            continue;
        }
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        // A counter's creation time has no place in the classic format.
        if let Some((name, "counter")) = family {
            let sample = line.split(['{', ' ']).next().unwrap_or("");
            if sample.strip_prefix(name) == Some("_created") {
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation() {
        use Format::*;
        assert_eq!(Format::negotiate(None), Prometheus);
        assert_eq!(Format::negotiate(Some("*/*")), Prometheus);
        assert_eq!(Format::negotiate(Some("text/plain")), Prometheus);
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text")),
            OpenMetrics
        );
        // Prometheus 2.42's scrape header.
        assert_eq!(
            Format::negotiate(Some(
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,\
                 text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
            )),
            OpenMetrics
        );
        assert_eq!(
            Format::negotiate(Some(
                "text/plain;version=0.0.4,application/openmetrics-text;q=0.5"
            )),
            Prometheus
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;q=0")),
            Prometheus
        );
    }

    #[test]
    fn families_are_renamed_and_openmetrics_only_lines_dropped() {
        let om = "# HELP a_grants Grants.\n# TYPE a_grants counter\na_grants_total{mode=\"full\"} 1\n\
                  a_grants_created 1.5\n\
                  # HELP a_server This server.\n# TYPE a_server info\na_server_info{version=\"1\"} 1\n\
                  # HELP a_up_seconds Up.\n# TYPE a_up_seconds gauge\n# UNIT a_up_seconds seconds\n\
                  a_up_seconds 2.5\n# HELP a_x X.\n# TYPE a_x unknown\na_x 1\n# EOF\n";
        assert_eq!(
            to_prometheus(om),
            "# HELP a_grants_total Grants.\n# TYPE a_grants_total counter\na_grants_total{mode=\"full\"} 1\n\
             # HELP a_server_info This server.\n# TYPE a_server_info gauge\na_server_info{version=\"1\"} 1\n\
             # HELP a_up_seconds Up.\n# TYPE a_up_seconds gauge\na_up_seconds 2.5\n\
             # HELP a_x X.\n# TYPE a_x untyped\na_x 1\n"
        );
    }
}
