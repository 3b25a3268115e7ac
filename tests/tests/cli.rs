//! The real `bagel` CLI against the real server: the contract of its
//! subcommands, flags, JSON keys and exit codes.

use bagel_tests::{ServerProcess, describe_output};
use serde_json::Value;

fn json_of(out: &std::process::Output) -> Value {
    assert!(out.status.success(), "{}", describe_output(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", describe_output(out)))
}

#[tokio::test]
async fn acquire_json_has_the_contract_keys_and_verifies() {
    let server = ServerProcess::start_ready(&[]).await;
    let out = server.cli(&[
        "acquire", "alpha", "beta", "--ttl", "5s", "--owner", "cli", "--json",
    ]);
    let v = json_of(&out);
    for key in [
        "lease_id",
        "token",
        "deadline_us",
        "min_timestamp_us",
        "names",
        "witness",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    let names = v["names"].as_array().unwrap();
    assert_eq!(names.len(), 2);
    for n in names {
        assert!(n["name"].is_string() && n["fencing_token"].as_u64().unwrap() > 0);
        let p = &n["previous"];
        for key in ["lease_id", "watermark_us", "ended", "ended_at_us"] {
            assert!(p.get(key).is_some(), "previous lacks {key}: {p}");
        }
        assert!(["none", "released", "broken", "unknown"].contains(&p["ended"].as_str().unwrap()));
    }
    for key in ["body_b64", "signature_b64", "key_id"] {
        assert!(v["witness"][key].is_string(), "witness lacks {key}");
    }

    // verify-witness accepts the whole acquire JSON and a bare witness.
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    let ok = server.cli_stdin(&["verify-witness"], &text);
    assert!(ok.status.success(), "{}", describe_output(&ok));
    let bare = v["witness"].to_string();
    let ok = server.cli_stdin(&["verify-witness", "-", "--key", &server.public_key_hex], &bare);
    assert!(ok.status.success(), "{}", describe_output(&ok));

    // One flipped byte in the signed body: refused, non-zero exit.
    let mut tampered = v.clone();
    let body = tampered["witness"]["body_b64"].as_str().unwrap().to_owned();
    let mut bytes = base64_decode(&body);
    bytes[10] ^= 0x01;
    tampered["witness"]["body_b64"] = Value::String(base64_encode(&bytes));
    let bad = server.cli_stdin(&["verify-witness"], &tampered.to_string());
    assert!(!bad.status.success(), "{}", describe_output(&bad));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("does NOT verify"));
}

#[tokio::test]
async fn a_refused_acquire_exits_non_zero_naming_holder_and_deadline() {
    let server = ServerProcess::start_ready(&[]).await;
    let held = json_of(&server.cli(&["acquire", "busy", "--ttl", "5s", "--owner", "first", "--json"]));
    let out = server.cli(&["acquire", "busy", "--ttl", "5s"]);
    assert_eq!(out.status.code(), Some(2), "{}", describe_output(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(held["lease_id"].as_str().unwrap()), "{err}");
    assert!(err.contains("\"first\""), "{err}");
    // The deadline as a time people read (issue 53: no raw µs on the
    // terminal); `--json` carries it in µs.
    let deadline = bagel_client::Micros::from_micros(held["deadline_us"].as_u64().unwrap());
    assert!(err.contains(&format!("until {deadline} (in ")), "{err}");
    let out = server.cli(&["acquire", "busy", "--ttl", "5s", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", describe_output(&out));
    let e: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(e["holder"]["deadline_us"], held["deadline_us"], "{e}");
    assert_eq!(e["holder"]["lease_id"], held["lease_id"], "{e}");
    assert_eq!(e["holder"]["owner"], "first", "{e}");
}

#[tokio::test]
async fn renew_upgrade_release_describe_history_server_info() {
    let server = ServerProcess::start_ready(&[]).await;
    let lease = json_of(&server.cli(&["acquire", "c1", "--tentative", "--ttl", "3s", "--json"]));
    let id = lease["lease_id"].as_str().unwrap();
    let token = lease["token"].as_str().unwrap();
    assert_eq!(lease["mode"], "tentative");

    let up = json_of(&server.cli(&["upgrade", "--lease", id, "--token", token, "--json"]));
    assert_eq!(up["mode"], "full");
    let renewed = json_of(&server.cli(&[
        "renew",
        "--lease",
        id,
        "--token",
        token,
        "--ttl",
        "5s",
        "--metadata",
        "dir-7",
        "--json",
    ]));
    assert!(renewed["deadline_us"].as_u64().unwrap() > lease["deadline_us"].as_u64().unwrap());

    let wm = lease["deadline_us"].as_u64().unwrap() - 2_500_000;
    let rel = json_of(&server.cli(&[
        "release",
        "--lease",
        id,
        "--token",
        token,
        "--watermark",
        &wm.to_string(),
        "--json",
    ]));
    assert_eq!(rel["watermark_us"].as_u64(), Some(wm));

    let desc = json_of(&server.cli(&["describe", "c1", "--json"]));
    assert_eq!(desc[0]["previous"]["ended"], "released");
    assert_eq!(desc[0]["previous"]["watermark_us"].as_u64(), Some(wm));
    assert!(desc[0]["holder"].is_null());

    let hist = json_of(&server.cli(&["history", "c1", "--json"]));
    let entries = hist["entries"].as_array().unwrap();
    assert_eq!(entries[0]["event"], "renewed");
    assert_eq!(entries[0]["metadata"], "dir-7");
    assert_eq!(entries[1]["event"], "released");

    let info = json_of(&server.cli(&["server-info", "--json"]));
    assert_eq!(info["ready"], true);
    assert_eq!(info["keys"][0]["ed25519_hex"], server.public_key_hex);
    assert_eq!(info["clock"]["source"], "local");

    // A wrong token is refused with a non-zero exit and a message naming it.
    let out = server.cli(&["release", "--lease", id, "--token", &"0".repeat(32)]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("was released"),
        "{}",
        describe_output(&out)
    );
}

/// Following the README: write under a lease file, then release by id and
/// token without `--watermark`. The release publishes what was written;
/// an explicit watermark below it is refused.
#[tokio::test]
async fn release_publishes_what_bagel_write_wrote() {
    let server = ServerProcess::start_ready(&[]).await;
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let lease_file = dir.path().join("lease.json");
    let run = |args: &[&str]| {
        std::process::Command::new(bagel_tests::bin("bagel"))
            .args(["--server", &server.url])
            .args(args)
            .env("BAGEL_STATE_DIR", state.path())
            .output()
            .expect("bagel")
    };
    let out = run(&["acquire", "ledger-name", "--ttl", "10s", "--json"]);
    let lease = json_of(&out);
    std::fs::write(&lease_file, &out.stdout).unwrap();
    let lease_path = lease_file.to_str().unwrap();
    let out = run(&[
        "write",
        "--store",
        &store,
        "--log",
        "ledger",
        "--lease",
        lease_path,
        "deposit 10",
        "withdraw 3",
    ]);
    assert!(out.status.success(), "{}", describe_output(&out));
    let top: u64 = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().parse::<u64>().unwrap())
        .max()
        .unwrap();
    let (id, token) = (
        lease["lease_id"].as_str().unwrap(),
        lease["token"].as_str().unwrap(),
    );
    let low = (top - 1).to_string();
    let out = run(&["release", "--lease", id, "--token", token, "--watermark", &low]);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("below"),
        "{}",
        describe_output(&out)
    );
    // By the lease file alone, no watermark given.
    let out = run(&["release", "--lease", lease_path, "--json"]);
    let stored = json_of(&out)["watermark_us"].as_u64().unwrap();
    assert!(stored >= top, "stored {stored}, wrote up to {top}");
}

/// A write that fails in a way a retry may fix exits 75 (EX_TEMPFAIL);
/// one that never will exits 1.
#[tokio::test]
async fn write_exit_codes_say_whether_to_retry() {
    let server = ServerProcess::start_ready(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let leases = bagel_tests::TestLeases::default();
    let now = bagel_client::Micros::now();
    let write = |min: bagel_client::Micros, deadline: bagel_client::Micros| {
        let lease = leases.lease("exit", min, deadline);
        let file = dir.path().join(format!("lease-{}.json", min.as_micros()));
        std::fs::write(
            &file,
            serde_json::to_vec(&bagel_tests::lease_json(&lease)).unwrap(),
        )
        .unwrap();
        server.cli(&[
            "write",
            "--store",
            &store,
            "--log",
            "l",
            "--lease",
            file.to_str().unwrap(),
            "m",
        ])
    };
    // The lease starts 30 s ahead of the clock: the writer will not write
    // that far ahead, but later it could.
    let ahead = write(
        now.saturating_add(std::time::Duration::from_secs(30)),
        now.saturating_add(std::time::Duration::from_secs(60)),
    );
    assert_eq!(ahead.status.code(), Some(75), "{}", describe_output(&ahead));
    assert!(
        String::from_utf8_lossy(&ahead.stderr).contains("ahead of the clock"),
        "{}",
        describe_output(&ahead)
    );
    // The lease is over: never.
    let over = write(
        now.saturating_sub(std::time::Duration::from_secs(60)),
        now.saturating_sub(std::time::Duration::from_secs(30)),
    );
    assert_eq!(over.status.code(), Some(1), "{}", describe_output(&over));
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

fn base64_encode(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}

#[test]
fn long_work_shows_progress_on_a_terminal_and_nowhere_else() {
    let dir = tempfile::tempdir().unwrap();
    // Both logs were started by a writer 5 minutes ago (a metronome closes
    // only logs that exist).
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 300;
    for log in ["tty", "pipe"] {
        let marks = dir.path().join(log).join("_start");
        std::fs::create_dir_all(&marks).unwrap();
        std::fs::write(marks.join(started.to_string()), b"").unwrap();
    }
    let store = format!("file://{}", dir.path().display());
    let bagel = bagel_tests::bin("bagel");
    let args = |log: &str| {
        vec![
            "--unsafe-local-clock".to_owned(),
            "metronome".to_owned(),
            "--store".to_owned(),
            store.clone(),
            "--log".to_owned(),
            log.to_owned(),
            "--once".to_owned(),
            "--lookback".to_owned(),
            "120s".to_owned(),
            "--grace".to_owned(),
            "200ms".to_owned(),
        ]
    };
    // On a terminal (a pty from util-linux `script`): a bar counting bags.
    let line = std::iter::once(bagel.display().to_string())
        .chain(args("tty"))
        .collect::<Vec<_>>()
        .join(" ");
    let tty = std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .output()
        .expect("run script(1)");
    let seen = String::from_utf8_lossy(&tty.stdout);
    assert!(tty.status.success(), "{}", describe_output(&tty));
    // 120 s of lookback from the log's start is 119 to 121 seconds, and
    // sealing starts at the minute holding the first: up to 59 more.
    assert!(
        seen.contains("metronome: closing") && (119..=181).any(|n| seen.contains(&format!("/{n} bags"))),
        "no progress bar on a terminal: {seen:?}"
    );
    // Piped: the result line only, nothing on stderr.
    let piped = std::process::Command::new(&bagel)
        .args(args("pipe"))
        .output()
        .unwrap();
    assert!(piped.status.success(), "{}", describe_output(&piped));
    // (But for the warning that --unsafe-local-clock asks for.)
    let stderr = String::from_utf8_lossy(&piped.stderr);
    assert!(
        stderr
            .lines()
            .all(|l| l.starts_with("bagel: UNSAFE: --unsafe-local-clock")),
        "{}",
        describe_output(&piped)
    );
    assert!(String::from_utf8_lossy(&piped.stdout).starts_with("closed "));
}

#[tokio::test]
async fn log_format_json_writes_one_json_object_per_log_line() {
    let server = ServerProcess::start_ready(&[]).await;
    let out = std::process::Command::new(bagel_tests::bin("bagel"))
        .args([
            "--server",
            &server.url,
            "--log-format",
            "json",
            "acquire",
            "jl",
            "--json",
        ])
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe_output(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "debug logging said nothing");
    for line in lines {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        assert!(v["level"].is_string() && v["timestamp"].is_string(), "{line}");
    }
}
