//! Whether this run prints for people or for scripts: one global
//! `--output text|json` (`-o`, env `BAGEL_OUTPUT`; `--json` is the same as
//! `-o json`), accepted before or after the subcommand, as etcdctl's and
//! kubectl's `-o`. Commands ask [`json`] instead of each carrying a flag
//! of its own, so that every command takes it in every place alike.

use std::sync::OnceLock;

/// The output format: `text`, lines for people (times as RFC 3339 with a
/// relative hint), or `json` for scripts (times in µs since the epoch;
/// errors on stderr as one JSON object). The variants carry no doc
/// comments of their own: clap would then print every command's help in
/// its long, one-line-per-part layout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    #[default]
    Text,
    Json,
}

static JSON: OnceLock<bool> = OnceLock::new();

/// Records the parsed choice; called once, right after parsing.
pub fn init(output: Output, json_alias: bool) {
    let _ = JSON.set(json_alias || output == Output::Json);
}

/// Whether to print JSON. Before [`init`] (a command line clap refused)
/// this is read from the raw arguments and the environment, so that even
/// a usage error comes out as JSON when JSON was asked for.
pub fn json() -> bool {
    *JSON.get_or_init(|| {
        json_in_args(
            std::env::args_os()
                .skip(1)
                .map(|a| a.to_string_lossy().into_owned()),
        ) || std::env::var("BAGEL_OUTPUT").is_ok_and(|v| v.eq_ignore_ascii_case("json"))
    })
}

/// `--json`, `-o json`, `-ojson`, `--output json` or `--output=json` among
/// `args`, up to a `--` (what follows it is `bagel run`'s command).
fn json_in_args(args: impl IntoIterator<Item = String>) -> bool {
    let mut args = args.into_iter().take_while(|a| a != "--");
    while let Some(a) = args.next() {
        match a.as_str() {
            "--json" | "-ojson" | "--output=json" | "-o=json" => return true,
            "-o" | "--output" if args.next().as_deref() == Some("json") => return true,
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> bool {
        json_in_args(line.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn every_spelling_of_json_output_is_seen_before_parsing() {
        assert!(args("--json acquire x"));
        assert!(args("acquire x --json"));
        assert!(args("-o json acquire x"));
        assert!(args("acquire -ojson x"));
        assert!(args("--output=json describe x"));
        assert!(args("describe --output json x"));
        assert!(!args("-o text describe x"));
        assert!(!args("describe x"));
    }

    #[test]
    fn a_json_flag_of_the_command_bagel_run_starts_is_not_ours() {
        assert!(!args("run --name x -- tool --json"));
        assert!(!args("run --name x -- tool -o json"));
    }
}
