//! `/`: the status page, for a person with a browser (a phone will do).
//!
//! Server-rendered HTML with no build step: the page is complete without
//! its script, refreshes itself every few seconds (`<meta refresh>`), and
//! its one stylesheet and one script come from this server. The
//! Content-Security-Policy forbids everything else (no CDN, no inline
//! script, nothing outside the machine), so a browser would say so if the
//! page ever tried. The script only ticks the restart countdown between
//! refreshes.
//!
//! Everything a client sent (names, owners) is escaped; ids the tests and
//! people can rely on: `ready-state`, `countdown`, `held-leases`,
//! `grants-chart`, `busiest`, `recent-breaks`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bagel_proto::Micros;

use super::{Http, NotReady, RATE_WINDOW, Snapshot};
use crate::table::{BreakEvent, Tracked};

/// How often the page reloads itself.
const REFRESH_SECS: u32 = 5;
/// Busiest names shown.
const TOP_N: usize = 10;

/// What the browser may load: this server's stylesheet, script and icon.
const CSP: &str = "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; \
                   base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Names held shown by the page's "who holds" search.
const HOLDERS_SHOWN: usize = 20;

/// `key`'s value in a URL query (`+` and `%XX` decoded); `None` when absent
/// or not UTF-8.
fn query_param(uri: &axum::http::Uri, key: &str) -> Option<String> {
    let query = uri.query()?;
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k != key {
            continue;
        }
        let b = v.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            match b[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(hi), Some(lo)) => {
                        out.push((hi * 16 + lo) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                },
                c => out.push(c),
            }
            i += 1;
        }
        return String::from_utf8(out).ok();
    }
    None
}

/// `/holders?prefix=P[&page_token=T][&limit=N]`: who holds the names
/// starting with P (a whole name is its own prefix), as the JSON of the
/// gRPC `List` (the same core and bounds), for the page's search and for
/// scripts.
pub(super) async fn holders(State(state): State<Arc<Http>>, uri: axum::http::Uri) -> Response {
    let prefix = query_param(&uri, "prefix").unwrap_or_default();
    let after = query_param(&uri, "page_token").unwrap_or_default();
    let limit = query_param(&uri, "limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let limits = &state.inner.cfg.limits;
    let checked = crate::validate::prefix("prefix", &prefix, limits)
        .and_then(|_| crate::validate::prefix("page_token", &after, limits));
    if let Err(e) = checked {
        let body = serde_json::json!({ "error": crate::error::bounded(e.to_string()) });
        return json_response(StatusCode::BAD_REQUEST, body.to_string());
    }
    // A turn among the `List` pages (see `Inner::off_workers`).
    let read = Arc::clone(&state.inner)
        .off_workers(side_port(), move |inner| inner.list_page(&prefix, &after, limit));
    let page = match read.await {
        Ok(page) => page,
        Err(crate::error::Error::ShuttingDown) => return super::shutting_down(),
        // Too many searches waiting for a turn.
        Err(e) => {
            let body = serde_json::json!({ "error": crate::error::bounded(e.to_string()) });
            return json_response(StatusCode::SERVICE_UNAVAILABLE, body.to_string());
        }
    };
    let names: Vec<_> = page
        .names
        .iter()
        .map(|n| {
            let h = n.holder.clone().unwrap_or_default();
            serde_json::json!({
                "name": n.name,
                "lease_id": h.lease_id,
                "owner": h.owner,
                "mode": if h.mode == bagel_proto::pb::Mode::Tentative as i32 { "tentative" } else { "full" },
                "deadline_us": h.deadline_us,
                "fencing_token": h.fencing_token,
            })
        })
        .collect();
    let body = serde_json::json!({
        "names": names,
        "next_page_token": page.next_page_token,
        "max_page_size": page.max_page_size,
    });
    json_response(StatusCode::OK, body.to_string())
}

/// The side port's searches take `List` turns as one identity of their own.
fn side_port() -> Arc<str> {
    Arc::from("(side port)")
}

fn json_response(code: StatusCode, body: String) -> Response {
    (
        code,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

pub(super) async fn page(State(state): State<Arc<Http>>, uri: axum::http::Uri) -> Response {
    let holder = query_param(&uri, "holder").filter(|h| !h.is_empty());
    let interval = state.inner.cfg.status_interval;
    let Some(snapshot) = state.snapshot(super::Reuse::Within(interval)).await else {
        return super::shutting_down();
    };
    let me = Arc::clone(&state);
    // A search is a `List` page: it waits for a turn among them too.
    let turn = match holder {
        Some(_) => match state.inner.list_turns.turn(&side_port()).await {
            Ok(turn) => Some(turn),
            Err(e @ crate::error::Error::Limit { .. }) => {
                let message = crate::error::bounded(e.to_string()) + "\n";
                return super::text(StatusCode::SERVICE_UNAVAILABLE, message);
            }
            Err(_) => return super::shutting_down(),
        },
        None => None,
    };
    let Ok(html) = tokio::task::spawn_blocking(move || {
        let _turn = turn;
        render(&me, &snapshot, holder.as_deref())
    })
    .await
    else {
        return super::shutting_down();
    };
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::CACHE_CONTROL, "no-store"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        html,
    )
        .into_response()
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "max-age=300"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

pub(super) async fn css() -> Response {
    asset("text/css; charset=utf-8", include_str!("status.css"))
}

pub(super) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", include_str!("status.js"))
}

pub(super) async fn favicon() -> Response {
    asset("image/svg+xml", include_str!("favicon.svg"))
}

/// Escapes text for HTML element content and quoted attribute values.
/// `s` for HTML text or an attribute value: markup escaped, and every
/// character a name or owner may not hold (`bagel_proto::names`: controls,
/// bidirectional overrides, invisible and blank characters, combining
/// diacritics) shown as `\u{…}`. The page shows what clients sent and
/// what a search asked for; none of it may reorder or hide the text
/// around it, whatever got past the rules (a query, an older record).
fn esc(s: &str) -> String {
    let s = bagel_proto::names::shown(s);
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `3 h 4 min`, `12.5 s`: a duration for people.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 86_400 {
        format!("{} d {} h", s / 86_400, s % 86_400 / 3600)
    } else if s >= 3600 {
        format!("{} h {} min", s / 3600, s % 3600 / 60)
    } else if s >= 60 {
        format!("{} min {} s", s / 60, s % 60)
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// `2026-11-21 05:51:52Z`: a time for people (seconds are enough here).
fn when(t: Micros) -> String {
    let full = t.to_string();
    match (full.get(..10), full.get(11..19)) {
        (Some(day), Some(time)) => format!("{day} {time}Z"),
        _ => full,
    }
}

fn render(state: &Http, s: &Snapshot, holder: Option<&str>) -> String {
    let inner = &*state.inner;
    let cfg = &inner.cfg;
    let signer = &inner.witness.signer;
    let started = inner.table.config().started;
    let clock = inner.time.status();
    let rates = state.grant_rates();
    let conflicts = state.conflict_rates();
    let recent_conflicts = &conflicts[conflicts.len().saturating_sub(10)..];
    let conflict_rate = if recent_conflicts.is_empty() {
        0.0
    } else {
        recent_conflicts.iter().sum::<f64>() / recent_conflicts.len() as f64
    };
    let busiest = inner.table.busiest(TOP_N);
    let mut breaks = inner.table.recent_breaks();
    breaks.reverse();

    let mut h = String::with_capacity(16 * 1024);
    let title = esc(&cfg.server_id);
    let _ = write!(
        h,
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="refresh" content="{REFRESH_SECS}">
<title>{title} · bagel</title>
<link rel="icon" href="/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="/status.css">
</head>
<body>
<header><h1>{title}</h1><p class="sub">bagel lease server · version {version} · up {uptime}</p></header>
"#,
        version = esc(env!("CARGO_PKG_VERSION")),
        uptime = human(s.now.duration_since(started)),
    );

    // Readiness, and why not.
    match &s.not_ready {
        None => h.push_str(
            r#"<section class="banner ok"><strong id="ready-state">ready</strong> — granting leases</section>
"#,
        ),
        Some(why) => {
            let _ = write!(
                h,
                r#"<section class="banner wait"><strong id="ready-state">not ready</strong> — "#
            );
            match why {
                NotReady::RestartWait(left) => {
                    let _ = write!(
                        h,
                        r#"restart wait: grants start in <strong id="countdown" data-remaining-ms="{ms}">{secs:.1} s</strong>, at {at}. A restarted server waits out any lease its previous incarnation may have granted (max TTL {ttl:?} + clock tolerance {tol:?})."#,
                        ms = left.as_millis(),
                        secs = left.as_secs_f64(),
                        at = when(inner.table.config().ready_at),
                        ttl = cfg.max_ttl,
                        tol = cfg.clock_tolerance,
                    );
                }
                NotReady::Clock(detail) => {
                    let _ = write!(h, r#"clock off: {}"#, esc(detail));
                }
                NotReady::Starting => h.push_str("the restart wait is over; starting to grant"),
            }
            h.push_str("</section>\n");
        }
    }
    if cfg.unsafe_skip_restart_wait {
        h.push_str(
            r#"<section class="banner bad">UNSAFE: started with --unsafe-skip-restart-wait; a previous incarnation's leases may overlap this one's.</section>
"#,
        );
    }

    // Key numbers.
    let held = s.census.held_leases;
    // The card shows a short average: one second is too jumpy to read.
    let recent = &rates[rates.len().saturating_sub(10)..];
    let recent_rate = if recent.is_empty() {
        0.0
    } else {
        recent.iter().sum::<f64>() / recent.len() as f64
    };
    let _ = write!(
        h,
        r#"<section class="cards">
<div class="card"><span class="label">held leases</span><span class="value" id="held-leases">{held}</span><span class="detail">{full} full · {tent} tentative</span></div>
<div class="card"><span class="label">names held</span><span class="value" id="held-names">{names_held}</span><span class="detail">{known} known</span></div>
<div class="card"><span class="label">grants/s</span><span class="value" id="grant-rate">{rate}</span><span class="detail">last 10 s · {grants} since start</span></div>
<div class="card"><span class="label">conflicts/s</span><span class="value" id="conflict-rate">{conflict_rate}</span><span class="detail">acquires refused, name held · last 10 s</span></div>
<div class="card"><span class="label">waiters</span><span class="value" id="waiters">{waiters}</span><span class="detail">acquires waiting for a name</span></div>
<div class="card"><span class="label">breaks</span><span class="value" id="breaks">{breaks_full}</span><span class="detail">missed deadlines since start</span></div>
<div class="card"><span class="label">clock</span><span class="value {clock_class}" id="clock-state">{clock_word}</span><span class="detail">± {bound}</span></div>
</section>
"#,
        held = held.total(),
        full = held.full,
        tent = held.tentative,
        names_held = s.census.held_names.total(),
        known = s.census.names,
        rate = format_rate(recent_rate),
        conflict_rate = format_rate(conflict_rate),
        grants = s.counts.grants.total(),
        waiters = s.waiters,
        breaks_full = s.counts.breaks.full,
        clock_class = if clock.healthy { "good" } else { "warn" },
        clock_word = if clock.healthy { "ok" } else { "off" },
        bound = if clock.error_bound_us == u64::MAX {
            "unknown".to_owned()
        } else {
            human(Duration::from_micros(clock.error_bound_us))
        },
    );

    // Grants/s chart.
    h.push_str(r#"<section><h2>Grants per second, last minute</h2>"#);
    chart(&mut h, &rates);
    h.push_str("</section>\n");

    holders_section(&mut h, inner, holder);

    // Busiest names and recent breaks.
    busiest_table(&mut h, &busiest);
    breaks_table(&mut h, &breaks, s.now);

    // About this server.
    let _ = write!(
        h,
        r#"<section><h2>Server</h2><dl class="facts">
<dt>server id</dt><dd>{id}</dd>
<dt>version</dt><dd>{version}</dd>
<dt>key id</dt><dd><code id="key-id">{key_id}</code></dd>
<dt>public key (ed25519)</dt><dd><code id="public-key">{public_key}</code></dd>
<dt>started</dt><dd>{started} (up {uptime})</dd>
<dt>TTL range</dt><dd>{min_ttl:?} to {max_ttl:?}</dd>
<dt>time</dt><dd>{clock_detail}</dd>
<dt>forgotten floor</dt><dd>{floor}</dd>
<dt>memory</dt><dd>{rss}</dd>
</dl></section>
<footer><a href="/metrics">/metrics</a> · <a href="/healthz">/healthz</a> · <a href="/readyz">/readyz</a> · refreshes every {REFRESH_SECS} s · {now}</footer>
<script src="/status.js"></script>
</body>
</html>
"#,
        id = esc(&cfg.server_id),
        version = esc(env!("CARGO_PKG_VERSION")),
        key_id = esc(signer.key_id()),
        public_key = hex(signer.verifying_key().as_bytes()),
        started = when(started),
        uptime = human(s.now.duration_since(started)),
        min_ttl = cfg.min_ttl,
        max_ttl = cfg.max_ttl,
        clock_detail = esc(&clock.detail),
        floor = when(inner.table.forgotten_floor()),
        rss = s.process.resident_bytes.map_or("unknown".to_owned(), |b| format!(
            "{:.1} MiB resident",
            b as f64 / 1048576.0
        )),
        now = when(s.now),
    );
    h
}

/// "Who holds X?": a search by name or prefix (a GET of this page, so it
/// works without the script and survives the page's refresh), answered
/// from the same core as the gRPC `List`.
fn holders_section(h: &mut String, inner: &crate::service::Inner, holder: Option<&str>) {
    let value = holder.map(esc).unwrap_or_default();
    let _ = write!(
        h,
        r#"<section><h2>Who holds…?</h2>
<form method="get" action="/" class="search"><input type="search" name="holder" id="holder-query" value="{value}" placeholder="name or prefix" aria-label="name or prefix"> <button type="submit">search</button></form>
"#
    );
    if let Some(q) = holder {
        let page = match crate::validate::prefix("holder", q, &inner.cfg.limits) {
            Ok(q) => inner.list_page(&q, "", HOLDERS_SHOWN),
            Err(e) => {
                let _ = write!(h, r#"<p class="bad">{}</p></section>"#, esc(&e.to_string()));
                return;
            }
        };
        if page.names.is_empty() {
            let _ = write!(
                h,
                r#"<p id="holders-none">no name starting with “{value}” is held</p>"#
            );
        } else {
            h.push_str(
                r#"<table id="holders"><thead><tr><th>name</th><th>owner</th><th>mode</th><th>until</th><th>lease</th></tr></thead><tbody>"#,
            );
            for n in &page.names {
                let hd = n.holder.clone().unwrap_or_default();
                let mode = if hd.mode == bagel_proto::pb::Mode::Tentative as i32 {
                    "tentative"
                } else {
                    "full"
                };
                let _ = write!(
                    h,
                    "<tr><td>{}</td><td>{}</td><td>{mode}</td><td>{}</td><td><code>{}</code></td></tr>",
                    esc(&n.name),
                    esc(&hd.owner),
                    when(Micros::from_micros(hd.deadline_us)),
                    esc(&hd.lease_id)
                );
            }
            h.push_str("</tbody></table>");
            if !page.next_page_token.is_empty() {
                let _ = write!(
                    h,
                    r#"<p class="sub">first {HOLDERS_SHOWN} shown; all of them: <code>bagel list --prefix …</code> or <code>/holders?prefix=…</code></p>"#
                );
            }
        }
    }
    h.push_str(
        "</section>
",
    );
}

fn format_rate(r: f64) -> String {
    if r >= 100.0 || r.fract() == 0.0 {
        format!("{r:.0}")
    } else {
        format!("{r:.1}")
    }
}

/// An inline SVG area chart of grants/s, one point per second.
fn chart(h: &mut String, rates: &[f64]) {
    const W: f64 = 600.0;
    const H: f64 = 120.0;
    const TOP: f64 = 12.0;
    let max = rates.iter().copied().fold(0.0_f64, f64::max);
    let scale = nice_ceiling(max);
    let step = W / (RATE_WINDOW - 1) as f64;
    // Right-aligned: the newest second is at the right edge.
    let x0 = W - step * (rates.len().saturating_sub(1)) as f64;
    let points: Vec<(f64, f64)> = rates
        .iter()
        .enumerate()
        .map(|(i, r)| (x0 + step * i as f64, H - (r / scale) * (H - TOP)))
        .collect();
    let _ = write!(
        h,
        r#"<svg id="grants-chart" class="chart" viewBox="0 0 {W} {vh}" preserveAspectRatio="none" role="img" aria-label="grants per second over the last minute; peak {peak}">"#,
        vh = H + 2.0,
        peak = format_rate(max),
    );
    let _ = write!(
        h,
        r#"<line class="axis" x1="0" y1="{H}" x2="{W}" y2="{H}"/><line class="grid" x1="0" y1="{TOP}" x2="{W}" y2="{TOP}"/>"#
    );
    if points.len() >= 2 {
        let line: Vec<String> = points.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = write!(
            h,
            r#"<polygon class="area" points="{first_x:.1},{H} {line} {last_x:.1},{H}"/><polyline class="line" points="{line}"/>"#,
            first_x = points[0].0,
            last_x = points[points.len() - 1].0,
            line = line.join(" "),
        );
    }
    h.push_str("</svg>");
    // Labels in HTML, not in the SVG: SVG text scales with the chart and
    // would be unreadable on a phone or huge on a wide screen.
    let _ = write!(
        h,
        r#"<div class="chart-axis"><span>−{RATE_WINDOW} s</span><span>top line {scale}/s · peak {peak}/s</span><span>now</span></div>"#,
        scale = format_rate(scale),
        peak = format_rate(max),
    );
}

/// 1, 2 or 5 times a power of ten, at least `v` (and at least 1).
fn nice_ceiling(v: f64) -> f64 {
    if v <= 1.0 {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|c| *c >= v)
        .unwrap_or(10.0 * p)
}

fn busiest_table(h: &mut String, busiest: &[Tracked]) {
    h.push_str(
        r#"<section><h2>Busiest names</h2><p class="note">By grants, recent ones counting most (halved every minute); a bounded sketch, so counts are at most the ± figure too high.</p>"#,
    );
    if busiest.is_empty() {
        h.push_str(r#"<p class="empty" id="busiest">no grants yet</p></section>"#);
        return;
    }
    let top = busiest[0].grants.max(1);
    h.push_str(r#"<table id="busiest"><thead><tr><th>name</th><th class="num">grants</th><th></th></tr></thead><tbody>"#);
    for t in busiest {
        let _ = write!(
            h,
            r#"<tr><td class="name">{name}</td><td class="num">{g}{err}</td><td class="bar"><meter min="0" max="{top}" value="{g}"></meter></td></tr>"#,
            name = esc(&t.name),
            g = t.grants,
            err = if t.error > 0 {
                format!(" ±{}", t.error)
            } else {
                String::new()
            },
        );
    }
    h.push_str("</tbody></table></section>\n");
}

fn breaks_table(h: &mut String, breaks: &[BreakEvent], now: Micros) {
    h.push_str(
        r#"<section><h2>Recent breaks</h2><p class="note">Names whose holder missed its deadline without releasing; the next holder inherited the deadline as its watermark.</p>"#,
    );
    if breaks.is_empty() {
        h.push_str(r#"<p class="empty" id="recent-breaks">none since start</p></section>"#);
        return;
    }
    h.push_str(
        r#"<div class="scroll"><table id="recent-breaks"><thead><tr><th>name</th><th>holder (owner)</th><th>deadline</th><th>found</th><th>taken by</th></tr></thead><tbody>"#,
    );
    for b in breaks {
        let lease = b.lease.to_string();
        let by = b.by.to_string();
        let _ = write!(
            h,
            r#"<tr><td class="name">{name}</td><td><code title="{lease}">{lease_short}…</code> ({owner})</td><td>{deadline}</td><td>{ago} ago</td><td><code title="{by}">{by_short}…</code></td></tr>"#,
            name = esc(&b.name),
            lease_short = &lease[..lease.len().min(12)],
            owner = esc(&b.owner),
            deadline = when(b.deadline),
            ago = human(now.duration_since(b.at)),
            by_short = &by[..by.len().min(12)],
        );
    }
    h.push_str("</tbody></table></div></section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_clients_send() {
        assert_eq!(
            esc(r#"<script>"a" & 'b'</script>"#),
            "&lt;script&gt;&quot;a&quot; &amp; &#39;b&#39;&lt;/script&gt;"
        );
        assert_eq!(
            esc("CN=a\u{202e}<b\u{ad}\u{e0041}"),
            "CN=a\\u{202e}&lt;b\\u{ad}\\u{e0041}"
        );
    }

    #[test]
    fn chart_scale_is_round() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(3.0), 5.0);
        assert_eq!(nice_ceiling(12.0), 20.0);
        assert_eq!(nice_ceiling(5000.0), 5000.0);
        assert_eq!(nice_ceiling(5001.0), 10000.0);
    }

    #[test]
    fn chart_draws_one_point_per_second() {
        let mut h = String::new();
        chart(&mut h, &[0.0, 10.0, 5.0]);
        assert!(h.contains(r#"<polyline class="line" points=""#), "{h}");
        assert!(h.contains("top line 10/s · peak 10/s"), "{h}");
    }
}
