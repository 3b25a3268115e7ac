//! The real `bagel` CLI as a careless or unlucky user meets it (issue 13,
//! item 11): a server that never answers, a server frozen under a held
//! lease, a lease file's text given where its path goes, URLs of the wrong
//! scheme, errors that repeat themselves, a mistyped store root or log,
//! and names that display as something else.

use std::io::{BufRead as _, BufReader};
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use bagel_tests::{ServerProcess, bin, cli_no_server, describe_output};

/// A wait that would otherwise be minutes: far above what any of these
/// commands needs when it behaves.
const GENEROUS: Duration = Duration::from_secs(120);

/// Runs `bagel` with `args` and `env`, failing the test if it has not
/// exited within [`GENEROUS`] (then it is killed, and its output shown).
fn bagel_bounded(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin("bagel"));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("spawn bagel");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(GENEROUS) {
        Ok(out) => out.expect("bagel output"),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            let out = rx.recv().expect("output after kill").expect("bagel output");
            panic!(
                "bagel {args:?} still running after {GENEROUS:?}: {}",
                describe_output(&out)
            );
        }
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A listener that accepts connections and never writes a byte; the
/// accepted sockets stay open as long as the process lives.
fn silent_listener() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            held.push(conn);
        }
    });
    format!("http://{addr}")
}

#[test]
fn a_server_that_never_answers_times_out_naming_server_and_timeout() {
    let url = silent_listener();
    // The flag, on acquire.
    let out = bagel_bounded(&["--server", &url, "--timeout", "1s", "acquire", "t1"], &[]);
    assert!(!out.status.success(), "{}", describe_output(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&url) && err.contains("within 1s") && err.contains("--timeout"),
        "{}",
        describe_output(&out)
    );
    // The environment, on another lease command.
    let out = bagel_bounded(&["--server", &url, "describe", "t1"], &[("BAGEL_TIMEOUT", "1s")]);
    assert!(!out.status.success(), "{}", describe_output(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&url) && err.contains("within 1s"),
        "{}",
        describe_output(&out)
    );
}

#[tokio::test]
async fn hold_reports_the_loss_when_the_server_stops_answering() {
    let server = ServerProcess::start_ready(&[]).await;
    let mut child = Command::new(bin("bagel"))
        .args([
            "--server",
            &server.url,
            "acquire",
            "held",
            "--ttl",
            "3s",
            "--hold",
            "--json",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bagel");
    let pid = child.id();
    let lease: serde_json::Value = {
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };
    assert!(lease["deadline_us"].as_u64().is_some(), "{lease}");
    // Holding: then freeze the server, so no renewal is ever answered.
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    err.read_line(&mut first).unwrap();
    assert!(first.contains("holding lease"), "{first:?}");
    server.pause();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut rest);
        let _ = tx.send((child.wait().unwrap(), rest));
    });
    let outcome = tokio::task::spawn_blocking(move || rx.recv_timeout(GENEROUS))
        .await
        .unwrap();
    server.resume();
    let Ok((status, rest)) = outcome else {
        let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        panic!("`acquire --hold` kept holding a lease it could not renew, long past its deadline");
    };
    assert!(!status.success(), "{status:?}: {rest}");
    assert!(rest.contains("lease lost"), "{rest}");
    // It says the lease ran out of time: no renewal was answered before
    // the deadline it had (the one granted, or a later one renewed to).
    assert!(rest.contains("no renewal before the deadline"), "{rest}");
}

#[tokio::test]
async fn lease_given_as_json_text_is_refused_without_echoing_the_token() {
    let server = ServerProcess::start_ready(&[]).await;
    let out = server.cli(&["acquire", "json-text", "--ttl", "5s", "--json"]);
    assert!(out.status.success(), "{}", describe_output(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let token = serde_json::from_str::<serde_json::Value>(&text).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    for args in [
        vec!["release", "--lease", text.as_str()],
        vec!["renew", "--lease", text.as_str(), "--ttl", "5s"],
        vec![
            "write",
            "--store",
            "file:///x",
            "--log",
            "l",
            "--lease",
            text.as_str(),
            "m",
        ],
    ] {
        let out = server.cli(&args);
        assert!(!out.status.success(), "{}", describe_output(&out));
        let err = stderr(&out);
        assert!(!err.contains(&token), "{:?} printed the token: {err}", args[0]);
        assert!(err.contains("path"), "{:?}: {err}", args[0]);
    }
}

#[test]
fn server_urls_other_than_http_or_https_are_refused_naming_the_flag() {
    for (args, flag) in [
        (
            vec!["--server", "ftp://127.0.0.1:21", "describe", "a"],
            "--server",
        ),
        // HOST:PORT is a URL with http:// (see cli_conventions.rs); a
        // bare host is not.
        (vec!["--server", "127.0.0.1", "describe", "a"], "--server"),
        (
            vec![
                "--servers",
                "http://127.0.0.1:1,ftp://127.0.0.1:21",
                "describe",
                "a",
            ],
            "--servers",
        ),
        (
            vec![
                "--servers",
                "http://127.0.0.1:1,http://127.0.0.1:2",
                "--next-servers",
                "gopher://127.0.0.1:70",
                "describe",
                "a",
            ],
            "--next-servers",
        ),
    ] {
        let out = bagel_bounded(&args, &[]);
        assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
        let err = stderr(&out);
        assert!(err.contains(flag), "{args:?}: {err}");
        assert!(
            err.contains("http://") && err.contains("https://"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn error_chains_say_each_cause_once() {
    // A port nobody listens on: connection refused.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let out = bagel_bounded(&["--server", &url, "acquire", "a"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.starts_with("bagel: "))
        .expect("an error line");
    let steps: Vec<&str> = line.trim_start_matches("bagel: ").split(": ").collect();
    for pair in steps.windows(2) {
        assert_ne!(pair[0], pair[1], "repeated step in {line:?}");
    }
    let mut seen = std::collections::HashSet::new();
    for step in &steps {
        assert!(seen.insert(step), "{step:?} twice in {line:?}");
    }
    assert!(
        line.contains(&url) && line.to_lowercase().contains("refused"),
        "{line}"
    );
}

#[tokio::test]
async fn write_refuses_a_store_root_that_does_not_exist() {
    let server = ServerProcess::start_ready(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let out = server.cli(&["acquire", "root-check", "--ttl", "10s", "--json"]);
    assert!(out.status.success(), "{}", describe_output(&out));
    let lease = dir.path().join("lease.json");
    std::fs::write(&lease, &out.stdout).unwrap();
    let lease = lease.to_str().unwrap();
    let missing = dir.path().join("not").join("there");
    let store = format!("file://{}", missing.display());
    let out = server.cli(&["write", "--store", &store, "--log", "l", "--lease", lease, "m"]);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&missing.display().to_string()) && err.contains("does not exist"),
        "{err}"
    );
    assert!(!dir.path().join("not").exists(), "the store tree was created");
    // An existing root: the log's directories inside it are made as written.
    let root = dir.path().join("bags");
    std::fs::create_dir(&root).unwrap();
    let store = format!("file://{}", root.display());
    let out = server.cli(&["write", "--store", &store, "--log", "a/b", "--lease", lease, "m"]);
    assert!(out.status.success(), "{}", describe_output(&out));
    assert!(root.join("a").join("b").is_dir());
}

#[test]
fn read_of_a_log_that_does_not_exist_fails_and_of_an_empty_one_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let out = cli_no_server(&["read", "--store", &store, "--log", "no-such-log"]);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    let err = stderr(&out);
    assert!(
        err.contains("\"no-such-log\"") && err.contains("does not exist"),
        "{err}"
    );
    // Nothing was created by asking.
    assert!(!dir.path().join("no-such-log").exists());
    // A metronome does not create a log nobody has started, and says so.
    let out = cli_no_server(&[
        "--unsafe-local-clock",
        "metronome",
        "--store",
        &store,
        "--log",
        "empty",
        "--once",
    ]);
    assert!(out.status.success(), "{}", describe_output(&out));
    assert!(
        stderr(&out).contains("no writer has started it"),
        "{}",
        describe_output(&out)
    );
    assert!(!dir.path().join("empty").exists());
    // A log that exists but holds no message: a writer marked its start
    // and wrote nothing; a metronome closed its past. Reading it is fine.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let marks = dir.path().join("empty").join("_start");
    std::fs::create_dir_all(&marks).unwrap();
    std::fs::write(marks.join((now - 5).to_string()), b"").unwrap();
    let out = cli_no_server(&[
        "--unsafe-local-clock",
        "metronome",
        "--store",
        &store,
        "--log",
        "empty",
        "--once",
        "--lookback",
        "5s",
        "--grace",
        "200ms",
    ]);
    assert!(out.status.success(), "{}", describe_output(&out));
    let out = cli_no_server(&[
        "read", "--store", &store, "--log", "empty", "--grace", "200ms", "--json",
    ]);
    assert!(out.status.success(), "{}", describe_output(&out));
    let summary: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(summary["messages"], 0, "{summary}");
}

#[tokio::test]
async fn names_that_display_as_something_else_are_refused_before_sending() {
    let server = ServerProcess::start_ready(&[]).await;
    let cases = [
        ("tenant-\u{202E}7", "U+202E"),
        ("a\u{2067}b", "U+2067"),
        ("ten\u{200B}ant", "U+200B"),
        ("\u{FEFF}x", "U+FEFF"),
        ("x\u{7}", "U+0007"),
    ];
    for (name, code_point) in cases {
        for args in [
            vec!["acquire", "ok", name],
            vec!["describe", name],
            vec!["history", name],
            vec!["run", "--name", name, "--", "true"],
        ] {
            let out = server.cli(&args);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {}", describe_output(&out));
            let err = stderr(&out);
            assert!(err.contains(code_point), "{args:?}: {err}");
            let bad = name
                .chars()
                .find(|c| !c.is_ascii_alphanumeric() && *c != '-')
                .unwrap();
            assert!(!err.contains(bad), "{args:?} printed the name raw: {err:?}");
        }
    }
    // Refused by the CLI before sending: the server has no record of any.
    let out = server.cli(&["describe", "ok", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["known"], false, "{v}");
    // The same refusal without any server to ask.
    let out = cli_no_server(&["--server", "http://127.0.0.1:9", "acquire", "a\u{202E}b"]);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    assert!(stderr(&out).contains("U+202E"), "{}", describe_output(&out));
    // A name not in NFC too (issue 52), naming the form to send instead.
    let out = cli_no_server(&["--server", "http://127.0.0.1:9", "acquire", "x/\u{212B}"]);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    assert!(
        stderr(&out).contains("is not in Unicode normalization form C: U+212B at character 2 is U+00C5"),
        "{}",
        describe_output(&out)
    );
    assert!(
        !stderr(&out).contains("127.0.0.1:9"),
        "nothing was sent: {}",
        describe_output(&out)
    );
}
