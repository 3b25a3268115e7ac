//! The status page of the real `bagel-server`, loaded in a real headless
//! Chromium (Debian's `chromium`, which `tests/run.sh` installs): the DOM
//! shows the restart countdown while the server waits, and the held count,
//! a recent break and the busiest names once it grants; the page's script
//! runs; the browser logs no console message at all (a blocked resource, a
//! script error or a Content-Security-Policy violation would be one); and
//! a screenshot PNG is taken in the test's temp dir.
//!
//! `BAGEL_STATUS_SCREENSHOT=PATH` also copies the screenshot of the busy
//! server to PATH (how `docs/status-page.png` is made).

use std::path::{Path, PathBuf};
use std::time::Duration;

use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::ServerProcess;

/// Debian's Chromium. Panics, never skips, when it is missing.
fn chromium() -> PathBuf {
    for name in ["chromium", "chromium-browser"] {
        if let Some(path) = std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
        {
            return path;
        }
    }
    panic!(
        "chromium not found on PATH: the status page test needs Debian's chromium \
         (tests/run.sh installs it; by hand: apt-get install chromium)"
    );
}

/// What one headless Chromium run gave.
struct Browser {
    stdout: String,
    /// Lines Chromium logged from the page's console (errors, warnings,
    /// CSP violations, failed loads).
    console: Vec<String>,
}

/// Runs headless Chromium on `url` with `args` (`--dump-dom`,
/// `--screenshot=…`), its profile in `dir`.
async fn chromium_run(url: &str, dir: &Path, args: &[String]) -> Browser {
    let profile = tempfile::tempdir_in(dir).expect("profile dir");
    let out = tokio::process::Command::new(chromium())
        .args([
            "--headless",
            // Tests run as root, where Chromium refuses its sandbox.
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            // Console messages go to stderr as `…:CONSOLE…` lines.
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .current_dir(dir)
        .kill_on_drop(true)
        .output()
        .await
        .expect("run chromium");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "chromium failed: {:?}\n{stderr}",
        out.status
    );
    Browser {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        console: stderr
            .lines()
            .filter(|l| l.contains(":CONSOLE"))
            .map(str::to_owned)
            .collect(),
    }
}

/// Loads `url` twice: the DOM after scripts ran, and a screenshot at
/// `width`×`height` into `dir`. Returns the DOM and the PNG's path.
async fn load(url: &str, dir: &Path, name: &str, width: u32, height: u32) -> (String, PathBuf) {
    let dom = chromium_run(url, dir, &["--dump-dom".to_owned()]).await;
    assert!(dom.console.is_empty(), "console messages: {:#?}", dom.console);
    let png = dir.join(format!("{name}.png"));
    let shot = chromium_run(
        url,
        dir,
        &[
            format!("--window-size={width},{height}"),
            format!("--screenshot={}", png.display()),
        ],
    )
    .await;
    assert!(shot.console.is_empty(), "console messages: {:#?}", shot.console);
    let bytes = std::fs::read(&png).unwrap_or_else(|e| panic!("no screenshot at {}: {e}", png.display()));
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "not a PNG: {}",
        png.display()
    );
    (dom.stdout, png)
}

/// The text of the element with `id` (up to its first child tag or end).
fn text_of<'a>(dom: &'a str, id: &str) -> &'a str {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no element with id {id:?} in:\n{dom}"));
    let rest = &dom[at..];
    let start = rest.find('>').expect("tag end") + 1;
    let end = rest[start..].find('<').expect("text end") + start;
    &rest[start..end]
}

/// The element with `id` and everything up to its closing `</tag>`.
fn element<'a>(dom: &'a str, tag: &str, id: &str) -> &'a str {
    let at = dom
        .find(&format!("<{tag} id=\"{id}\""))
        .unwrap_or_else(|| panic!("no <{tag} id={id:?}> in:\n{dom}"));
    let end = dom[at..].find(&format!("</{tag}>")).expect("closing tag") + at;
    &dom[at..end]
}

fn now_us() -> u64 {
    bagel_proto::Micros::now().as_micros()
}

fn acquire(name: &str, ttl: Duration, owner: &str, mode: pb::Mode, wait: Duration) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names: vec![name.to_owned()],
        deadline_us: now_us() + ttl.as_micros() as u64,
        owner: owner.to_owned(),
        mode: mode.into(),
        wait_us: wait.as_micros() as u64,
        ..Default::default()
    }
}

#[tokio::test]
async fn the_status_page_counts_down_the_restart_wait_in_a_browser() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A long wait, so the page is surely loaded during it.
    let server = ServerProcess::start(&["--http", "127.0.0.1:0", "--max-ttl", "60s"]).await;
    let (dom, _png) = load(
        &format!("{}/", server.http_url()),
        dir.path(),
        "waiting",
        412,
        915,
    )
    .await;

    assert_eq!(text_of(&dom, "ready-state"), "not ready");
    let countdown = text_of(&dom, "countdown");
    let secs: f64 = countdown
        .strip_suffix(" s")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("countdown {countdown:?} is not `N.N s`"));
    assert!(secs > 0.0 && secs <= 60.5, "countdown {countdown:?}");
    assert!(
        dom.contains(r#"data-script="ran""#),
        "the page's script did not run:\n{dom}"
    );
    assert_eq!(text_of(&dom, "held-leases"), "0");
    assert_eq!(text_of(&dom, "public-key"), server.public_key_hex);
}

#[tokio::test]
async fn the_status_page_shows_held_leases_and_a_recent_break_in_a_browser() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start_ready(&["--http", "127.0.0.1:0", "--max-ttl", "60s"]).await;
    let mut client = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    let long = Duration::from_secs(55);
    for (name, mode) in [
        ("orders-eu", pb::Mode::Full),
        ("orders-us", pb::Mode::Full),
        ("ledger-reserve", pb::Mode::Tentative),
    ] {
        client
            .acquire(acquire(name, long, "checkout-7", mode, Duration::ZERO))
            .await
            .unwrap();
    }
    // A holder that misses its deadline, and a successor that waits for it
    // server-side (woken at the deadline) and breaks it.
    let stalled = client
        .acquire(acquire(
            "payments",
            Duration::from_millis(300),
            "stalled-writer",
            pb::Mode::Full,
            Duration::ZERO,
        ))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    let successor = client
        .acquire(acquire(
            "payments",
            long,
            "next-writer",
            pb::Mode::Full,
            Duration::from_secs(10),
        ))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    assert_eq!(
        successor.names[0].previous.as_ref().unwrap().ended(),
        pb::Ended::Broken
    );

    let (dom, png) = load(&format!("{}/", server.http_url()), dir.path(), "busy", 1000, 1400).await;
    assert_eq!(text_of(&dom, "ready-state"), "ready");
    assert!(!dom.contains(r#"id="countdown""#), "no countdown once ready");
    assert_eq!(text_of(&dom, "held-leases"), "4");
    assert_eq!(text_of(&dom, "breaks"), "1");
    let breaks = element(&dom, "table", "recent-breaks");
    assert!(breaks.contains("payments"), "{breaks}");
    assert!(breaks.contains("stalled-writer"), "{breaks}");
    assert!(breaks.contains(&stalled.lease_id[..12]), "{breaks}");
    let busiest = element(&dom, "table", "busiest");
    assert!(busiest.contains("payments"), "{busiest}");
    assert!(dom.contains(r#"<svg id="grants-chart""#), "{dom}");
    assert!(
        dom.contains(r#"data-script="ran""#),
        "the page's script did not run:\n{dom}"
    );

    // Who holds names starting with "orders"? The page's own search (a
    // plain GET, allowed by its CSP's form-action), in a browser.
    let (dom, _) = load(
        &format!("{}/?holder=orders", server.http_url()),
        dir.path(),
        "search",
        1000,
        1400,
    )
    .await;
    let found = element(&dom, "table", "holders");
    for held in ["orders-eu", "orders-us", "checkout-7"] {
        assert!(found.contains(held), "{held} missing from {found}");
    }
    assert!(!found.contains("payments"), "{found}");
    assert!(
        dom.contains(r#"value="orders""#),
        "the box keeps the query: {dom}"
    );
    let (dom, _) = load(
        &format!("{}/?holder=nobody-", server.http_url()),
        dir.path(),
        "search-none",
        1000,
        1400,
    )
    .await;
    assert!(dom.contains(r#"id="holders-none""#), "{dom}");

    if let Some(keep) = std::env::var_os("BAGEL_STATUS_SCREENSHOT") {
        std::fs::copy(&png, &keep).expect("copy the screenshot");
    }
}
