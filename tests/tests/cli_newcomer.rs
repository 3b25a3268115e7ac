//! What a newcomer trips on (issue 53), through the real binaries: a
//! permission refusal says so (its own exit code and JSON kind); every
//! command that prints honours `--json`; an audit with an untrusted key
//! says so once per key instead of reporting forgeries, and never falls
//! back to a server nobody named; human output shows times and durations
//! as people read them and no secret token unless asked; and the smaller
//! items (`bagel run` flags that cannot work are a usage error, relative
//! `--from`/`--to`, man pages for every command, docs that match).

use std::io::BufRead as _;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use bagel_bags::{self as bag, BagConfig};
use bagel_proto::Micros;
use bagel_proto::clock::{AssumedExact, SystemClock};
use bagel_tests::{ServerProcess, cli_no_server, describe_output, unique};
use serde_json::Value;

const EXIT_USAGE: i32 = 64;
/// `EX_NOPERM` (sysexits.h): an access policy refused the caller.
const EXIT_PERMISSION: i32 = 77;

fn json_of(out: &Output) -> Value {
    assert!(out.status.success(), "{}", describe_output(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", describe_output(out)))
}

/// Every line of stdout as JSON (a command that prints one object per
/// line).
fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("line {l:?} is not JSON ({e}): {}", describe_output(out)))
        })
        .collect()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `bagel --server URL ARGS` with a private state directory.
fn bagel(server: &str, state: &std::path::Path, args: &[&str]) -> Output {
    Command::new(bagel_tests::bin("bagel"))
        .args(["--server", server])
        .args(args)
        .env("BAGEL_STATE_DIR", state)
        .env_remove("BAGEL_SERVER")
        .env_remove("BAGEL_OUTPUT")
        .output()
        .expect("run bagel")
}

const SECRET: &str = "tok-newcomer-4f1e";

/// A server whose access policy lets the bearer of [`SECRET`] (identity
/// `ci`) lease and read names under `jobs/` and nothing else.
async fn server_with_policy(dir: &std::path::Path) -> ServerProcess {
    let hash = bagel_proto::hex::encode(&bagel_proto::acl::hash_token(SECRET));
    let policy = format!(
        "[[token]]\nidentity = \"ci\"\nsha256 = \"{hash}\"\n\n[[grant]]\nidentity = \"ci\"\n\
         prefixes = [\"jobs/\"]\npermissions = [\"lease\", \"read\"]\n"
    );
    let acl = dir.join("acl.toml");
    std::fs::write(&acl, policy).unwrap();
    ServerProcess::start_ready(&["--acl", acl.to_str().unwrap()]).await
}

#[tokio::test]
async fn a_permission_refusal_says_so_with_its_own_exit_code_and_kind() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_policy(dir.path()).await;
    let token = dir.path().join("ci.token");
    std::fs::write(&token, format!("{SECRET}\n")).unwrap();
    let token = token.to_str().unwrap();
    let state = tempfile::tempdir().unwrap();
    let ok = bagel(
        &server.url,
        state.path(),
        &["--token-file", token, "acquire", "jobs/1", "--ttl", "5s"],
    );
    assert!(ok.status.success(), "{}", describe_output(&ok));
    for args in [
        &["acquire", "team-b/x", "--ttl", "5s"][..],
        &["describe", "team-b/x"][..],
        &["list", "--prefix", "team-b/"][..],
    ] {
        let mut all = vec!["--token-file", token];
        all.extend_from_slice(args);
        let out = bagel(&server.url, state.path(), &all);
        assert_eq!(
            out.status.code(),
            Some(EXIT_PERMISSION),
            "{args:?}: {}",
            describe_output(&out)
        );
        let said = stderr(&out);
        assert!(said.starts_with("bagel: permission denied"), "{args:?}: {said}");
        assert!(!said.contains("lease not held"), "{args:?}: {said}");
        all.push("--json");
        let out = bagel(&server.url, state.path(), &all);
        assert_eq!(
            out.status.code(),
            Some(EXIT_PERMISSION),
            "{}",
            describe_output(&out)
        );
        let e: Value = serde_json::from_slice(&out.stderr).unwrap();
        assert_eq!(e["kind"], "permission", "{e}");
        assert_eq!(e["exit_code"], EXIT_PERMISSION, "{e}");
    }
    // The exit-code table documents it.
    let cli_md = std::fs::read_to_string(docs_dir().join("cli.md")).unwrap();
    assert!(
        cli_md.contains("| 77 |") && cli_md.contains("\"permission\""),
        "docs/cli.md does not document exit 77 and kind \"permission\""
    );
}

fn docs_dir() -> std::path::PathBuf {
    repo_root().join("docs")
}

fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// A store directory, a lease file under a fresh acquire, and two
/// messages written under it (closed, so a read or an audit sees them).
struct Written {
    _dir: tempfile::TempDir,
    state: tempfile::TempDir,
    store: String,
    log: String,
    lease_file: String,
    write: Output,
}

async fn written(server: &ServerProcess, extra: &[&str]) -> Written {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("bags")).unwrap();
    let store = format!("file://{}", dir.path().join("bags").display());
    let log = unique("newcomer");
    let lease = bagel(
        &server.url,
        state.path(),
        &["acquire", &unique("ledger"), "--ttl", "9s", "--json"],
    );
    let lease_file = dir.path().join("lease.json");
    std::fs::write(&lease_file, json_of(&lease).to_string()).unwrap();
    let lease_file = lease_file.to_str().unwrap().to_owned();
    let mut args = vec![
        "write",
        "--store",
        &store,
        "--log",
        &log,
        "--lease",
        &lease_file,
        "--grace",
        "200ms",
        "one",
        "two",
    ];
    args.extend_from_slice(extra);
    let write = bagel(&server.url, state.path(), &args);
    assert!(write.status.success(), "{}", describe_output(&write));
    let cfg = BagConfig::default().with_grace(Duration::from_millis(200));
    let bags = bag::open_store(&store, &cfg).await.unwrap();
    let until = Micros::now().saturating_add(Duration::from_secs(1));
    bag::close_through(bags.as_ref(), &log, until, &cfg, &AssumedExact(SystemClock))
        .await
        .unwrap();
    Written {
        _dir: dir,
        state,
        store,
        log,
        lease_file,
        write,
    }
}

#[tokio::test]
async fn every_command_that_prints_honours_json() {
    let server = ServerProcess::start_ready(&[]).await;
    let w = written(&server, &["--json"]).await;
    // `write`: one object per message written.
    let lines = json_lines(&w.write);
    assert_eq!(lines.len(), 2, "{}", describe_output(&w.write));
    for l in &lines {
        assert!(l["timestamp_us"].as_u64().unwrap() > 0, "{l}");
        assert!(l["time"].as_str().unwrap().ends_with('Z'), "{l}");
    }
    // `verify-witness`: one object saying what verified.
    let out = bagel(
        &server.url,
        w.state.path(),
        &["verify-witness", &w.lease_file, "--json"],
    );
    let v = json_of(&out);
    assert_eq!(v["verified"], true, "{v}");
    assert_eq!(v["witnesses"][0]["verified"], true, "{v}");
    assert!(v["witnesses"][0]["key_id"].is_string(), "{v}");
    // `metronome --once`: one object with what it closed.
    let out = bagel(
        &server.url,
        w.state.path(),
        &[
            "metronome",
            "--store",
            &w.store,
            "--log",
            &w.log,
            "--once",
            "--json",
        ],
    );
    let v = json_of(&out);
    assert!(v["closed"].is_u64(), "{v}");
    // The long-running metronome cannot print one object: refused, not
    // ignored.
    let out = bagel(
        &server.url,
        w.state.path(),
        &["metronome", "--store", &w.store, "--log", &w.log, "--json"],
    );
    assert_eq!(out.status.code(), Some(EXIT_USAGE), "{}", describe_output(&out));
}

#[tokio::test]
async fn an_audit_with_an_untrusted_key_says_so_once_per_key_and_never_asks_the_default_server() {
    let server = ServerProcess::start_ready(&[]).await;
    let other = ServerProcess::start_ready(&[]).await;
    let w = written(&server, &[]).await;
    let audit = |url: &str, extra: &[&str]| {
        let mut args = vec!["audit", "--store", &w.store, "--log", &w.log, "--grace", "200ms"];
        args.extend_from_slice(extra);
        bagel(url, w.state.path(), &args)
    };
    // Trusting only another server's key: one problem, naming the key.
    let out = audit(&server.url, &["--key", &other.public_key_hex, "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let violations = report["violations"].as_array().unwrap();
    assert_eq!(violations.len(), 1, "{report}");
    assert_eq!(violations[0]["kind"], "untrusted_key", "{report}");
    let detail = violations[0]["detail"].as_str().unwrap();
    assert!(detail.contains("--key"), "{detail}");
    let out = audit(&server.url, &["--key", &other.public_key_hex]);
    let text = stdout(&out);
    assert!(!text.contains("does not verify"), "{text}");
    assert_eq!(text.matches("UNTRUSTED KEY").count(), 1, "{text}");
    // The right key: clean.
    let out = audit(&server.url, &["--key", &server.public_key_hex]);
    assert!(out.status.success(), "{}", describe_output(&out));
    // No --key and no --server: the default server is not asked (as
    // `read` does not), and the audit says what to give.
    let out = Command::new(bagel_tests::bin("bagel"))
        .args(["audit", "--store", &w.store, "--log", &w.log, "--grace", "200ms"])
        .env("BAGEL_STATE_DIR", w.state.path())
        .env_remove("BAGEL_SERVER")
        .env_remove("BAGEL_SERVERS")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(EXIT_USAGE), "{}", describe_output(&out));
    assert!(stderr(&out).contains("--key"), "{}", describe_output(&out));
    // A server named on the command line is asked for its keys.
    let out = audit(&server.url, &[]);
    assert!(out.status.success(), "{}", describe_output(&out));
}

/// No raw µs in text output: times as RFC 3339, durations as people
/// write them.
fn assert_no_raw_micros(text: &str) {
    let raw = first_raw_micros(text);
    assert!(raw.is_none(), "raw µs {raw:?} in: {text}");
}

/// The first "<digits> us" in `text`, if any.
fn first_raw_micros(text: &str) -> Option<String> {
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || "()[],;".contains(c))
        .collect();
    words
        .windows(2)
        .find(|w| !w[0].is_empty() && w[0].chars().all(|c| c.is_ascii_digit()) && w[1] == "us")
        .map(|w| format!("{} {}", w[0], w[1]))
}

#[tokio::test]
async fn text_output_shows_times_for_people_and_no_token_unless_asked() {
    let server = ServerProcess::start_ready(&[]).await;
    let state = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| bagel(&server.url, state.path(), args);
    let info = run(&["server-info"]);
    assert!(info.status.success(), "{}", describe_output(&info));
    assert_no_raw_micros(&stdout(&info));
    // acquire: no token on the terminal unless asked; JSON keeps it.
    let name = unique("secret");
    let out = run(&["acquire", &name, "--ttl", "9s", "--tentative"]);
    assert!(out.status.success(), "{}", describe_output(&out));
    let text = stdout(&out);
    assert!(!text.contains("token     "), "{text}");
    assert_no_raw_micros(&text);
    let other = unique("secret");
    let out = run(&["acquire", &other, "--ttl", "9s", "--tentative", "--json"]);
    let held = json_of(&out);
    let token = held["token"].as_str().unwrap().to_owned();
    assert!(!token.is_empty());
    let file = state.path().join("lease.json");
    std::fs::write(&file, &out.stdout).unwrap();
    let file = file.to_str().unwrap();
    let out = run(&["upgrade", "--lease", file]);
    assert!(out.status.success(), "{}", describe_output(&out));
    assert!(!stdout(&out).contains(&token), "{}", describe_output(&out));
    let out = run(&["acquire", &unique("shown"), "--ttl", "9s", "--show-token"]);
    assert!(stdout(&out).contains("token "), "{}", describe_output(&out));
    // The held error: who and until when, no raw µs.
    let out = run(&["acquire", &other, "--ttl", "5s"]);
    assert_eq!(out.status.code(), Some(2), "{}", describe_output(&out));
    assert_no_raw_micros(&stderr(&out));
    // A released name's watch event does not say "until … (in …)".
    let watched = unique("watched");
    let mut watch = Command::new(bagel_tests::bin("bagel"))
        .args(["--server", &server.url, "watch", &watched, "--progress"])
        .env("BAGEL_STATE_DIR", state.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let lines = std::io::BufReader::new(watch.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in lines.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(20)).expect("watch started");
    assert!(first.ends_with("progress"), "{first}");
    let out = run(&["acquire", &watched, "--ttl", "9s", "--json"]);
    let file = state.path().join("watched.json");
    std::fs::write(&file, json_of(&out).to_string()).unwrap();
    let out = run(&["release", "--lease", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", describe_output(&out));
    assert_no_raw_micros(&stdout(&out));
    let released = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("a released event");
        if line.contains(" released ") {
            break line;
        }
    };
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(!released.contains("(in "), "{released}");
    assert!(!released.contains(" until "), "{released}");
}

#[tokio::test]
async fn bagel_run_with_margins_over_its_ttl_is_a_usage_error() {
    let out = cli_no_server(&["run", "--name", "x", "--ttl", "3s", "--", "true"]);
    assert_eq!(out.status.code(), Some(EXIT_USAGE), "{}", describe_output(&out));
    assert!(stderr(&out).contains("--ttl"), "{}", describe_output(&out));
}

#[tokio::test]
async fn from_and_to_take_relative_times() {
    let server = ServerProcess::start_ready(&[]).await;
    let w = written(&server, &[]).await;
    let out = bagel(
        &server.url,
        w.state.path(),
        &[
            "read", "--store", &w.store, "--log", &w.log, "--grace", "200ms", "--from", "-5m", "--to", "now",
            "--json",
        ],
    );
    let lines = json_lines(&out);
    let messages = lines.iter().filter(|l| l["kind"] == "message").count();
    assert_eq!(messages, 2, "{}", describe_output(&out));
    // An hour ago to ten minutes ago: nothing.
    let out = bagel(
        &server.url,
        w.state.path(),
        &[
            "read", "--store", &w.store, "--log", &w.log, "--grace", "200ms", "--from", "-1h", "--to",
            "-10m", "--json",
        ],
    );
    let lines = json_lines(&out);
    assert_eq!(lines.iter().filter(|l| l["kind"] == "message").count(), 0);
}

#[tokio::test]
async fn metronome_once_counts_only_the_bags_it_closed() {
    let server = ServerProcess::start_ready(&[]).await;
    let w = written(&server, &[]).await;
    // Everything was closed already: a metronome has nothing to close.
    let out = bagel(
        &server.url,
        w.state.path(),
        &[
            "metronome",
            "--store",
            &w.store,
            "--log",
            &w.log,
            "--grace",
            "200ms",
            "--once",
        ],
    );
    assert!(out.status.success(), "{}", describe_output(&out));
    assert!(!stdout(&out).contains("closed "), "{}", describe_output(&out));
}

#[test]
fn man_pages_cover_every_command_at_every_depth() {
    let dir = tempfile::tempdir().unwrap();
    let out = cli_no_server(&["man", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", describe_output(&out));
    // Under --json it says what it wrote as JSON; completions (a script)
    // refuses --json rather than ignore it.
    let again = tempfile::tempdir().unwrap();
    let out = cli_no_server(&["man", again.path().to_str().unwrap(), "--json"]);
    assert!(
        json_of(&out)["pages"].as_u64().unwrap() > 20,
        "{}",
        describe_output(&out)
    );
    let out = cli_no_server(&["completions", "bash", "--json"]);
    assert_eq!(out.status.code(), Some(EXIT_USAGE), "{}", describe_output(&out));
    for (page, says) in [
        ("bagel-acl-check.1", "\\-\\-identity"),
        ("bagel-acl-hash-token.1", "stdin"),
    ] {
        let roff = std::fs::read_to_string(dir.path().join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(roff.contains(says), "{page} lacks {says:?}");
    }
    // The server's page, from its own flags.
    let out = std::process::Command::new(bagel_tests::bin("bagel-server"))
        .arg("--man")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe_output(&out));
    let roff = String::from_utf8_lossy(&out.stdout);
    assert!(
        roff.starts_with(".ie") || roff.contains(".TH bagel-server"),
        "{roff}"
    );
    assert!(
        roff.contains("\\-\\-max\\-ttl") && roff.contains("\\-\\-members"),
        "{roff}"
    );
}

#[test]
fn the_docs_match_the_binaries() {
    let root = repo_root();
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    // Every link from deploy/README.md into another page names a heading
    // that page has.
    let deploy = read("deploy/README.md");
    for link in deploy
        .split("](../")
        .skip(1)
        .map(|rest| rest.split(')').next().unwrap())
    {
        let Some((page, anchor)) = link.split_once('#') else {
            continue;
        };
        let target = read(page);
        let heading = target
            .lines()
            .filter(|l| l.starts_with('#'))
            .any(|l| slug(l.trim_start_matches('#')) == anchor);
        assert!(
            heading,
            "deploy/README.md links to {page}#{anchor}, which has no such heading"
        );
    }
    // Metric names as the server exports them.
    let security = read("docs/security.md");
    for metric in ["bagel_acl_refusals", "bagel_acl_unauthenticated"] {
        for (i, _) in security.match_indices(metric) {
            assert!(
                security[i..].starts_with(&format!("{metric}_total")),
                "docs/security.md names {metric} without _total"
            );
        }
    }
    // User docs say what is true now; history lives in bench/.
    let performance = read("docs/performance.md");
    assert!(
        !performance.contains("Round "),
        "docs/performance.md cites benchmark rounds"
    );
    let operating = read("docs/operating.md");
    assert!(
        !operating.contains("(before:"),
        "docs/operating.md narrates history"
    );
    // No pointer at a DESIGN section the repository does not hold.
    for p in [
        "README.md",
        "docs/operating.md",
        "docs/cli.md",
        "client/bags/src/vouched.rs",
        "proto/src/clock.rs",
    ] {
        assert!(!read(p).contains("DESIGN section"), "{p}");
    }
    let readme = read("README.md");
    assert!(!readme.contains("The last hour ("), "README.md cites a dated run");
    // A file a newcomer opens is not over 900 lines.
    let client = read("client/lease/src/client.rs");
    assert!(
        client.lines().count() < 900,
        "client/lease/src/client.rs is {} lines",
        client.lines().count()
    );
}

/// A heading's anchor as GitHub makes it: lower case, spaces to hyphens,
/// punctuation dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// `bagel run` on a held name under `--json`: the held error is the same
/// JSON object `acquire` gives, with the holder.
#[tokio::test]
async fn bagel_run_on_a_held_name_says_so_in_json() {
    let server = ServerProcess::start_ready(&[]).await;
    let state = tempfile::tempdir().unwrap();
    let name = unique("run-held");
    let held = json_of(&bagel(
        &server.url,
        state.path(),
        &["acquire", &name, "--ttl", "9s", "--json"],
    ));
    let out = bagel(
        &server.url,
        state.path(),
        &["run", "--name", &name, "--json", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", describe_output(&out));
    let e: Value =
        serde_json::from_slice(&out.stderr).unwrap_or_else(|e| panic!("{e}: {}", describe_output(&out)));
    assert_eq!(e["kind"], "held", "{e}");
    assert_eq!(e["holder"]["lease_id"], held["lease_id"], "{e}");
}
