//! The real `bagel` CLI's everyday contract (issue 28): usage errors have
//! their own exit code (2 stays "held by someone else"), commands that
//! change a lease keep its lease file current, `--json` errors are JSON,
//! a default owner, grouped help, shell completions, bounded echoes.

use std::process::{Command, Output};

use bagel_cli::contract::{LeaseJson, ModeJson};
use bagel_tests::{ServerProcess, cli_no_server, describe_output};
use serde_json::Value;

const EXIT_USAGE: i32 = 64;

fn json_of(out: &Output) -> Value {
    assert!(out.status.success(), "{}", describe_output(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", describe_output(out)))
}

/// The one JSON object a `--json` command printed on stderr.
fn json_error(out: &Output) -> Value {
    serde_json::from_slice(&out.stderr)
        .unwrap_or_else(|e| panic!("stderr is not one JSON object ({e}): {}", describe_output(out)))
}

/// `bagel` with a private state directory (where `bagel write` records
/// what it wrote), against `server`.
fn bagel(server: &ServerProcess, state: &std::path::Path, args: &[&str]) -> Output {
    Command::new(bagel_tests::bin("bagel"))
        .args(["--server", &server.url])
        .args(args)
        .env("BAGEL_STATE_DIR", state)
        .env_remove("BAGEL_OWNER")
        .output()
        .expect("run bagel")
}

#[test]
fn usage_errors_exit_64_help_and_version_exit_0() {
    for args in [
        &["acquire", "x", "--no-such-flag"][..],
        &["acquire"][..],
        &[][..],
        &["no-such-command"][..],
        &["acquire", "x", "--ttl", "soon"][..],
    ] {
        let out = cli_no_server(args);
        assert_eq!(
            out.status.code(),
            Some(EXIT_USAGE),
            "{args:?}: {}",
            describe_output(&out)
        );
    }
    for args in [&["--help"][..], &["--version"][..], &["acquire", "--help"][..]] {
        let out = cli_no_server(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", describe_output(&out));
        assert!(!out.stdout.is_empty(), "{args:?}: {}", describe_output(&out));
    }
    // Under --json the usage error is a JSON object too.
    let out = cli_no_server(&["acquire", "x", "--json", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(EXIT_USAGE), "{}", describe_output(&out));
    let e = json_error(&out);
    assert_eq!(e["kind"], "usage", "{e}");
    assert_eq!(e["exit_code"], EXIT_USAGE, "{e}");
    assert!(e["error"].as_str().unwrap().contains("--no-such-flag"), "{e}");
}

#[tokio::test]
async fn held_stays_exit_2_and_is_a_json_object_under_json() {
    let server = ServerProcess::start_ready(&[]).await;
    let state = tempfile::tempdir().unwrap();
    let held = json_of(&bagel(
        &server,
        state.path(),
        &["acquire", "busy", "--ttl", "9s", "--json"],
    ));
    let out = bagel(
        &server,
        state.path(),
        &["acquire", "busy", "--ttl", "5s", "--json"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", describe_output(&out));
    let e = json_error(&out);
    assert_eq!(e["kind"], "held", "{e}");
    assert_eq!(e["exit_code"], 2, "{e}");
    let text = e["error"].as_str().unwrap();
    assert!(text.contains(held["lease_id"].as_str().unwrap()), "{e}");
    // The default owner (host:pid) is named, never `owner ""`.
    assert!(!text.contains("owner \"\""), "{e}");
    let owner = text.split("owner \"").nth(1).unwrap().split('"').next().unwrap();
    let (host, pid) = owner
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("owner not host:pid: {e}"));
    assert!(!host.is_empty() && pid.parse::<u32>().is_ok(), "{e}");

    // Any other error under --json: a JSON object with exit code 1.
    let out = bagel(
        &server,
        state.path(),
        &["renew", "--lease", "no-such-file.lease", "--ttl", "5s", "--json"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    let e = json_error(&out);
    assert_eq!(
        (e["kind"].as_str(), e["exit_code"].as_u64()),
        (Some("error"), Some(1)),
        "{e}"
    );
}

#[tokio::test]
async fn bagel_owner_names_the_holder() {
    let server = ServerProcess::start_ready(&[]).await;
    let out = Command::new(bagel_tests::bin("bagel"))
        .args(["--server", &server.url, "acquire", "owned", "--ttl", "9s"])
        .env("BAGEL_OWNER", "batch-7")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe_output(&out));
    let out = server.cli(&["describe", "owned", "--json"]);
    let v = json_of(&out);
    assert_eq!(v[0]["holder"]["owner"], "batch-7", "{v}");
}

/// Upgrade and renew rewrite the lease file: `bagel write --lease FILE`
/// then writes under the upgraded lease, and the file states the renewed
/// deadline. `renew --json` prints a complete lease file (the old keys
/// kept) that `--lease` reads.
#[tokio::test]
async fn upgrade_and_renew_keep_the_lease_file_current() {
    let server = ServerProcess::start_ready(&[]).await;
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let file = dir.path().join("lease.json");
    let path = file.to_str().unwrap();
    let out = bagel(
        &server,
        state.path(),
        &["acquire", "ledger", "--ttl", "3s", "--tentative", "--json"],
    );
    std::fs::write(&file, json_of(&out).to_string()).unwrap();

    let out = bagel(&server, state.path(), &["upgrade", "--lease", path]);
    assert!(out.status.success(), "{}", describe_output(&out));
    let upgraded: LeaseJson = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(upgraded.mode, ModeJson::Full);
    assert!(upgraded.holder_secret.is_some(), "the holder key is kept");
    let out = bagel(
        &server,
        state.path(),
        &["write", "--store", &store, "--log", "l", "--lease", path, "m"],
    );
    assert!(out.status.success(), "{}", describe_output(&out));

    let out = bagel(
        &server,
        state.path(),
        &["renew", "--lease", path, "--ttl", "9s", "--json"],
    );
    let printed = json_of(&out);
    for key in [
        "deadline_us",
        "witness",
        "lease_id",
        "token",
        "names",
        "min_timestamp_us",
        "mode",
    ] {
        assert!(printed.get(key).is_some(), "renew --json lacks {key}: {printed}");
    }
    let renewed: LeaseJson = serde_json::from_value(printed.clone()).unwrap();
    let on_disk: LeaseJson = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(renewed, on_disk);
    assert!(on_disk.deadline_us > upgraded.deadline_us, "{printed}");
    assert_eq!(on_disk.holder_secret, upgraded.holder_secret);
    assert_eq!(on_disk.names, upgraded.names);

    // By bare id and token, renew --json still prints a lease file that
    // --lease reads (without the holder key, which only the file had).
    let out = bagel(
        &server,
        state.path(),
        &[
            "renew",
            "--lease",
            &on_disk.lease_id,
            "--token",
            &on_disk.token,
            "--ttl",
            "9s",
            "--json",
        ],
    );
    let bare: LeaseJson = serde_json::from_value(json_of(&out)).unwrap();
    assert_eq!(
        (bare.lease_id.as_str(), bare.mode),
        (on_disk.lease_id.as_str(), ModeJson::Full)
    );
    assert_eq!(bare.names, on_disk.names);
    let bare_file = dir.path().join("bare.json");
    std::fs::write(&bare_file, &out.stdout).unwrap();
    let out = bagel(
        &server,
        state.path(),
        &["release", "--lease", bare_file.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", describe_output(&out));
}

#[test]
fn an_oversized_argument_is_never_echoed_whole() {
    let huge = "a".repeat(100_000);
    for args in [
        vec!["release", "--lease", huge.as_str()],
        vec!["acquire", "x", "--ttl", huge.as_str()],
    ] {
        let out = cli_no_server(&args);
        assert!(!out.status.success(), "{}", describe_output(&out));
        assert!(out.stderr.len() < 8_000, "{} bytes of stderr", out.stderr.len());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("100000"), "the length is said: {err}");
    }
}

#[test]
fn help_is_grouped_and_every_argument_explained() {
    let out = cli_no_server(&["metronome", "--help"]);
    assert!(out.status.success(), "{}", describe_output(&out));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("S3 lease store"),
        "S3-lease flags under their own heading: {help}"
    );
    for cmd in [
        "acquire",
        "renew",
        "upgrade",
        "release",
        "run",
        "metronome",
        "write",
        "read",
    ] {
        let out = cli_no_server(&[cmd, "--help"]);
        let help = String::from_utf8_lossy(&out.stdout);
        // An argument line (`  --flag <X>`, indented at most 6) has its
        // text on the same line or, when long, on the next lines, indented
        // deeper; in the long layout (a command whose help has an example)
        // `[env: …]`, `[default: …]` and possible values are indented as
        // that text is, and are not arguments.
        let lines: Vec<&str> = help.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            let indent = line.len() - t.len();
            if indent == 0 || indent > 6 || !(t.starts_with('-') || t.starts_with('<') || t.starts_with('['))
            {
                continue;
            }
            let same_line = t.split("  ").filter(|s| !s.trim().is_empty()).count() > 1;
            let next_line = lines.get(i + 1).is_some_and(|n| {
                let nt = n.trim_start();
                !nt.is_empty() && n.len() - nt.len() > indent && !nt.starts_with('-')
            });
            assert!(same_line || next_line, "`bagel {cmd} --help`: no help for {t:?}");
        }
    }
}

#[test]
fn completions_for_bash_zsh_and_fish() {
    for shell in ["bash", "zsh", "fish"] {
        let out = cli_no_server(&["completions", shell]);
        assert!(out.status.success(), "{}", describe_output(&out));
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            script.contains("acquire") && script.contains("metronome"),
            "{shell}"
        );
    }
    let out = cli_no_server(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(EXIT_USAGE), "{}", describe_output(&out));
}
