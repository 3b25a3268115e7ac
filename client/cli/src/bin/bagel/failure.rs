//! How the CLI says it failed: the exit codes, and the one place an error
//! reaches stderr, as a `bagel: ...` line or, under `--json`, as one JSON
//! object (`{"error", "kind", "exit_code"}`) that a script can parse
//! without scraping text.
//!
//! Usage errors get their own exit code (64, `EX_USAGE`) because 2 means
//! "held by someone else": a retry-on-2 loop must not spin on a typo.

use std::process::ExitCode;

/// A command line clap refuses (unknown flag, missing argument, bad value).
pub const EXIT_USAGE: u8 = 64;

/// An access policy refused the caller (`EX_NOPERM`): a script tells "ask
/// for the grant" from "the lease is gone" (1) and "held" (2).
pub const EXIT_PERMISSION: u8 = 77;

/// How a command's error is reported: its JSON `kind` and its exit code.
/// A policy's refusal anywhere in the chain is `permission` (77); a
/// usage error the command found itself, `usage` (64); anything else is
/// `error` (1).
pub fn classify(e: &anyhow::Error) -> (&'static str, u8) {
    if e.chain().any(|s| {
        matches!(
            s.downcast_ref(),
            Some(bagel_client::Error::PermissionDenied { .. })
        )
    }) {
        ("permission", EXIT_PERMISSION)
    } else if e.chain().any(|s| s.is::<Usage>()) {
        ("usage", EXIT_USAGE)
    } else {
        ("error", 1)
    }
}

/// A command line that parses but cannot work (flags that contradict each
/// other, a flag a mode needs missing): a usage error (64) like one clap
/// refuses, found by the command.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// Fails with a [`Usage`] error.
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Usage(message.into()))
}

/// The longest argument value an error echoes whole; longer ones are cut,
/// saying how long they were (a 100 kB `--lease` must not make a 500 kB
/// error).
pub const MAX_ECHO: usize = 200;

/// The longest error text printed: a backstop for messages that echo
/// values this module never saw (clap's, a server's).
const MAX_MESSAGE: usize = 4096;

/// Whether errors go out as JSON: as the output (see `crate::output`),
/// also for a command line clap refuses.
pub fn json_errors() -> bool {
    crate::output::json()
}

/// Prints an error (`kind` is a stable word scripts may match: `usage`,
/// `held`, `permission`, `error`) and returns the exit code to exit with.
pub fn report(kind: &str, exit_code: u8, message: &str) -> ExitCode {
    report_with(kind, exit_code, message, serde_json::Map::new())
}

/// [`report`], with more keys in the JSON object (what a script needs of
/// the refusal, which the text says in words).
pub fn report_with(
    kind: &str,
    exit_code: u8,
    message: &str,
    extra: serde_json::Map<String, serde_json::Value>,
) -> ExitCode {
    let message = bounded(message.trim_end());
    if json_errors() {
        let mut out = serde_json::json!({ "error": message, "kind": kind, "exit_code": exit_code });
        if let Some(obj) = out.as_object_mut() {
            obj.extend(extra);
        }
        eprintln!("{out}");
    } else {
        eprintln!("bagel: {message}");
    }
    ExitCode::from(exit_code)
}

/// A value from the command line for an error message: quoted and
/// escaped as `{:?}` does, and cut to [`MAX_ECHO`] bytes, saying how long
/// it was.
pub fn echo(value: &str) -> String {
    if value.len() <= MAX_ECHO {
        return format!("{value:?}");
    }
    let mut end = MAX_ECHO;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}... ({} bytes, cut)", &value[..end], value.len())
}

/// `message`, cut in the middle when it is over [`MAX_MESSAGE`] bytes.
fn bounded(message: &str) -> String {
    if message.len() <= MAX_MESSAGE {
        return message.to_owned();
    }
    let floor = |mut i: usize| {
        while !message.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let head = floor(MAX_MESSAGE / 2);
    let tail = floor(message.len() - MAX_MESSAGE / 4);
    format!(
        "{} ... ({} bytes of the message cut) ... {}",
        &message[..head],
        tail - head,
        &message[tail..]
    )
}

/// `text` with every command-line argument over [`MAX_ECHO`] bytes that
/// it quotes cut, saying how long it was (clap echoes a refused value
/// whole).
fn without_long_args(text: &str) -> String {
    let mut text = text.to_owned();
    for arg in std::env::args().skip(1).filter(|a| a.len() > MAX_ECHO) {
        let mut end = MAX_ECHO;
        while !arg.is_char_boundary(end) {
            end -= 1;
        }
        text = text.replace(&arg, &format!("{}... ({} bytes, cut)", &arg[..end], arg.len()));
    }
    text
}

/// Handles what clap refuses or answers itself: help and version are
/// printed on stdout with exit 0; anything else is a usage error.
pub fn clap_failure(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            ExitCode::SUCCESS
        }
        _ if json_errors() => {
            let text = without_long_args(&e.render().to_string());
            // clap's first line is the error; the rest is usage and a hint.
            let first = text.lines().next().unwrap_or_default();
            report("usage", EXIT_USAGE, first.trim_start_matches("error: "))
        }
        _ => {
            let text = without_long_args(&e.render().to_string());
            eprint!("{}", bounded(&text));
            ExitCode::from(EXIT_USAGE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_cut_saying_how_long() {
        assert_eq!(echo("lease.json"), "\"lease.json\"");
        let long = "x".repeat(100_000);
        let e = echo(&long);
        assert!(e.len() < MAX_ECHO + 40 && e.contains("100000 bytes"), "{e}");
        let m = bounded(&"é".repeat(10_000));
        assert!(m.len() < MAX_MESSAGE + 100 && m.contains("cut"), "{m}");
    }
}
