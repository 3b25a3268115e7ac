//! The conventions users of etcdctl, consul and kubectl bring to the real
//! `bagel` CLI: one global `--output` (`-o`, `BAGEL_OUTPUT`, `--json`)
//! before or after the subcommand, `HOST:PORT` wherever a server URL goes,
//! times people can read, a quiet exit on a closed pipe, and a piped
//! `bagel write` that stores each line within its linger, not at end of
//! input.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Command, Output, Stdio};

use bagel_cli::contract::LeaseJson;
use bagel_tests::{ServerProcess, describe_output};
use serde_json::Value;

/// `bagel` with a private state directory, the environment's own
/// `BAGEL_*` settings removed, and `envs` set.
fn bagel(state: &std::path::Path, envs: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(bagel_tests::bin("bagel"))
        .args(args)
        .env("BAGEL_STATE_DIR", state)
        .env_remove("BAGEL_OWNER")
        .env_remove("BAGEL_OUTPUT")
        .env_remove("BAGEL_SERVER")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run bagel")
}

fn host_port(server: &ServerProcess) -> String {
    server.addr.to_string()
}

#[tokio::test]
async fn every_spelling_of_json_output_before_or_after_the_subcommand_prints_a_lease_file() {
    let server = ServerProcess::start_ready(&[]).await;
    let state = tempfile::tempdir().unwrap();
    let url = server.url.as_str();
    /// Environment variables, and the command line.
    type Spelling<'a> = (&'a [(&'a str, &'a str)], Vec<&'a str>);
    let spellings: [Spelling; 6] = [
        (
            &[],
            vec!["--json", "--server", url, "acquire", "o-1", "--ttl", "5s"],
        ),
        (
            &[],
            vec!["-o", "json", "--server", url, "acquire", "o-2", "--ttl", "5s"],
        ),
        (
            &[],
            vec![
                "--server", url, "acquire", "o-3", "--ttl", "5s", "--output", "json",
            ],
        ),
        (
            &[],
            vec!["--server", url, "acquire", "o-4", "--ttl", "5s", "-ojson"],
        ),
        (
            &[],
            vec!["--server", url, "acquire", "o-5", "--ttl", "5s", "--json"],
        ),
        (
            &[("BAGEL_OUTPUT", "json")],
            vec!["--server", url, "acquire", "o-6", "--ttl", "5s"],
        ),
    ];
    for (envs, args) in spellings {
        let out = bagel(state.path(), envs, &args);
        assert!(
            out.status.success(),
            "{args:?} {envs:?}: {}",
            describe_output(&out)
        );
        let lease: LeaseJson = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{args:?} {envs:?}: not a lease file ({e}): {}",
                describe_output(&out)
            )
        });
        assert_eq!(lease.names.len(), 1);
    }
    // Text stays the default, and `-o text` overrides the environment.
    let out = bagel(
        state.path(),
        &[("BAGEL_OUTPUT", "json")],
        &["-o", "text", "--server", url, "describe", "o-1"],
    );
    assert!(out.status.success(), "{}", describe_output(&out));
    assert!(
        serde_json::from_slice::<Value>(&out.stdout).is_err(),
        "{}",
        describe_output(&out)
    );
    // A usage error under any spelling is one JSON object on stderr.
    for args in [
        &["-o", "json", "acquire", "x", "--no-such-flag"][..],
        &["--json", "acquire", "x", "--no-such-flag"][..],
    ] {
        let out = bagel(state.path(), &[], args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", describe_output(&out));
        let error: Value = serde_json::from_slice(&out.stderr)
            .unwrap_or_else(|e| panic!("{args:?}: stderr not JSON ({e}): {}", describe_output(&out)));
        assert_eq!(error["kind"], "usage", "{error}");
    }
    // `-o` of the command `bagel run` starts is that command's own.
    let out = bagel(
        state.path(),
        &[],
        &[
            "--server",
            url,
            "run",
            "--name",
            "o-run",
            "--",
            "sh",
            "-c",
            "echo -o json",
        ],
    );
    assert!(out.status.success(), "{}", describe_output(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "-o json");
}

#[tokio::test]
async fn host_and_port_are_accepted_wherever_a_server_url_is() {
    let server = ServerProcess::start_ready(&[]).await;
    let state = tempfile::tempdir().unwrap();
    let bare = host_port(&server);
    let out = bagel(
        state.path(),
        &[],
        &["--server", &bare, "acquire", "hp-1", "--ttl", "5s"],
    );
    assert!(
        out.status.success(),
        "--server HOST:PORT: {}",
        describe_output(&out)
    );
    let out = bagel(state.path(), &[("BAGEL_SERVER", &bare)], &["describe", "hp-1"]);
    assert!(
        out.status.success(),
        "BAGEL_SERVER=HOST:PORT: {}",
        describe_output(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("held by lease"),
        "{}",
        describe_output(&out)
    );
    let out = bagel(state.path(), &[], &["--servers", &bare, "describe", "hp-1"]);
    assert!(
        out.status.success(),
        "--servers HOST:PORT: {}",
        describe_output(&out)
    );
    // What is neither a URL nor HOST:PORT is still refused, by name.
    let out = bagel(state.path(), &[], &["--server", "localhost", "describe", "hp-1"]);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a URL"),
        "{}",
        describe_output(&out)
    );
}

#[tokio::test]
async fn text_output_reads_as_people_speak_of_time_and_holders() {
    let server = ServerProcess::start_ready(&[]).await;
    let state = tempfile::tempdir().unwrap();
    let url = server.url.as_str();
    let out = bagel(
        state.path(),
        &[],
        &["--server", url, "acquire", "tx-1", "--ttl", "9s"],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", describe_output(&out));
    assert!(text.contains("previous: no previous holder"), "{text}");
    assert!(
        !text.contains("ended at 0") && !text.contains("lease \"\""),
        "{text}"
    );
    let deadline = text
        .lines()
        .find(|l| l.starts_with("deadline"))
        .expect("a deadline line");
    assert!(
        deadline.contains("Z (in "),
        "RFC 3339 and a relative hint: {deadline}"
    );

    let out = bagel(state.path(), &[], &["--server", url, "describe", "tx-never"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("no previous holder"), "{}", describe_output(&out));

    // A renewal that would shorten the lease keeps the later deadline and
    // says so.
    let out = bagel(
        state.path(),
        &[],
        &["--server", url, "-o", "json", "acquire", "tx-2", "--ttl", "9s"],
    );
    assert!(out.status.success(), "{}", describe_output(&out));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lease.json");
    std::fs::write(&file, &out.stdout).unwrap();
    let before: LeaseJson = serde_json::from_slice(&out.stdout).unwrap();
    let out = bagel(
        state.path(),
        &[],
        &[
            "--server",
            url,
            "renew",
            "--lease",
            file.to_str().unwrap(),
            "--ttl",
            "1s",
        ],
    );
    assert!(out.status.success(), "{}", describe_output(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("kept the later deadline"),
        "{}",
        describe_output(&out)
    );
    let after: LeaseJson = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert!(after.deadline_us >= before.deadline_us, "never shortened");

    // A run that wrote nothing says so, not "watermark 1970-01-01…".
    let out = bagel(
        state.path(),
        &[],
        &["--server", url, "run", "--name", "tx-run", "--", "true"],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}", describe_output(&out));
    assert!(
        said.contains("released, no watermark") && !said.contains("1970"),
        "{said}"
    );
}

#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let mut child = Command::new(bagel_tests::bin("bagel"))
        .args(["completions", "bash"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bagel");
    // Read one line, then close the pipe, as `| head -1` does.
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(!first.is_empty());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{stderr}"
    );
    assert!(
        out.status.success() || out.status.code() == Some(141),
        "status {:?}: {stderr}",
        out.status
    );
}

#[tokio::test]
async fn a_piped_write_stores_each_line_within_its_linger_not_at_end_of_input() {
    let server = ServerProcess::start_ready(&[]).await;
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let out = bagel(
        state.path(),
        &[],
        &[
            "--server",
            &server.url,
            "--json",
            "acquire",
            "piped",
            "--ttl",
            "9s",
        ],
    );
    assert!(out.status.success(), "{}", describe_output(&out));
    let file = dir.path().join("lease.json");
    std::fs::write(&file, &out.stdout).unwrap();
    // `timeout`: a writer that holds its lines until end of input would
    // otherwise leave this test waiting for an acknowledgement forever.
    let mut writer = Command::new("timeout")
        .arg("60")
        .arg(bagel_tests::bin("bagel"))
        .args(["--server", &server.url, "write", "--store", &store, "--log", "l"])
        .args(["--lease", file.to_str().unwrap(), "--linger", "50ms"])
        .env("BAGEL_STATE_DIR", state.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bagel write");
    let mut stdin = writer.stdin.take().unwrap();
    let mut stdout = BufReader::new(writer.stdout.take().unwrap());
    // Two lines, one at a time, with input left open: each comes back
    // acknowledged (its timestamp printed) while more input could follow.
    for line in ["first", "second"] {
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
        let mut ack = String::new();
        let read = stdout.read_line(&mut ack).unwrap();
        assert!(read > 0, "bagel write ended before acknowledging {line:?}");
        let stamp: u64 = ack
            .split_whitespace()
            .next()
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| {
                panic!("not a timestamp line: {ack:?}");
            });
        assert!(stamp > 0);
    }
    drop(stdin);
    let out = writer.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", describe_output(&out));
}

/// `bagel man DIR` writes a page for bagel and one per subcommand, from
/// the definitions `--help` prints (each leads with what it does and an
/// example).
#[test]
fn man_pages_are_written_from_the_help() {
    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("man1");
    let out = bagel_tests::cli_no_server(&["man", pages.to_str().unwrap()]);
    assert!(out.status.success(), "{}", describe_output(&out));
    for (page, says) in [
        ("bagel.1", "Leases with absolute deadlines"),
        ("bagel-acquire.1", "Acquire a lease on one or more names"),
        ("bagel-run.1", "bagel run \\-\\-name leader"),
        ("bagel-write.1", "\\-\\-linger"),
    ] {
        let roff = std::fs::read_to_string(pages.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(
            roff.starts_with(".ie") || roff.contains(".TH"),
            "{page} is not a man page"
        );
        assert!(roff.contains(says), "{page} lacks {says:?}");
    }
    for sub in [
        "acquire", "renew", "release", "list", "watch", "write", "read", "audit", "run",
    ] {
        let out = bagel_tests::cli_no_server(&[sub, "--help"]);
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            help.contains("Example: `bagel ") || help.contains("| bagel "),
            "`bagel {sub} --help` has no example: {help}"
        );
    }
}

/// `bagel run --name N -- bagel write --lease "$BAGEL_LEASE_FILE"` fed by
/// a pipe: `bagel run` renews the lease and rewrites the file; the
/// writer follows it. It read the file once, so every batch after the
/// first TTL was refused ("at or past the lease deadline") while the lease
/// was alive and renewed.
#[tokio::test]
async fn a_piped_writer_under_bagel_run_writes_past_its_first_ttl() {
    let server = ServerProcess::start_ready(&[]).await;
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let bagel = bagel_tests::bin("bagel");
    let script = format!(
        "exec {} write --store {store} --log l --lease \"$BAGEL_LEASE_FILE\" --linger 20ms",
        bagel.display()
    );
    let mut run = Command::new("timeout")
        .arg("60")
        .arg(&bagel)
        .args([
            "--server",
            &server.url,
            "run",
            "--name",
            "piped-under-run",
            "--ttl",
            "1s",
        ])
        .args([
            "--fence-margin",
            "150ms",
            "--kill-grace",
            "150ms",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .env("BAGEL_STATE_DIR", state.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bagel run");
    let mut stdin = run.stdin.take().unwrap();
    let mut stdout = BufReader::new(run.stdout.take().unwrap());
    // Lines until three TTLs have passed on the lease's own witness clock
    // (the acknowledged timestamps): each one acknowledged.
    let mut first = None;
    for i in 0.. {
        writeln!(stdin, "line-{i}").unwrap();
        stdin.flush().unwrap();
        let mut ack = String::new();
        assert!(
            stdout.read_line(&mut ack).unwrap() > 0,
            "the writer ended at line {i}"
        );
        let stamp: u64 = ack
            .split_whitespace()
            .next()
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("line {i} not acknowledged: {ack:?}"));
        let first = *first.get_or_insert(stamp);
        // One line at a time, each sent once the last is acknowledged
        // (each waits out its --linger): the three TTLs take renewals.
        if stamp > first + 3_000_000 {
            break;
        }
    }
    drop(stdin);
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", describe_output(&out));
}

/// `bagel-server --help` groups its flags by purpose, and every flag can
/// be set from the environment (`BAGEL_<FLAG>`), as a unit file or a
/// container sets them.
#[test]
fn the_servers_help_is_grouped_and_every_flag_has_an_environment_variable() {
    let out = Command::new(bagel_tests::bin("bagel-server"))
        .arg("--help")
        .output()
        .expect("bagel-server --help");
    assert!(out.status.success(), "{}", describe_output(&out));
    let help = String::from_utf8_lossy(&out.stdout);
    for heading in [
        "Listening:",
        "Leases:",
        "Watch and List:",
        "Connections and sessions:",
        "TLS and access:",
    ] {
        assert!(help.lines().any(|l| l == heading), "no {heading:?} group: {help}");
    }
    // Each flag's entry runs from its `--flag` line to the next flag's.
    let mut flags = 0;
    let mut entries = help.split("\n      --").skip(1);
    for entry in entries.by_ref() {
        let flag = entry.split_whitespace().next().unwrap_or("");
        // An action, like --help and --version, not a setting.
        if flag == "man" {
            continue;
        }
        // `BAGEL_<FLAG>`, or the list form the CLI shares
        // (`--roughtime-key`: `BAGEL_ROUGHTIME_KEYS`).
        let env = format!("[env: BAGEL_{}", flag.replace('-', "_").to_uppercase());
        assert!(entry.contains(&env), "--{flag} has no {env}…]: {entry}");
        flags += 1;
    }
    assert!(flags > 40, "only {flags} flags found: {help}");
}
