//! The bag commands, one file each (its flags, its run, its printer):
//! write, read, metronome, audit, summarize, retain. The flags they share
//! (`--store`, the timing, a read's range) are in `args`.

mod args;
mod audit;
mod metronome;
mod read;
mod retain;
mod summarize;
mod write;

use std::process::ExitCode;

#[derive(clap::Subcommand, Debug)]
pub enum BagCommand {
    /// Write messages under a lease; prints each message's timestamp once
    /// its batch is committed.
    ///
    /// Example: `printf 'a\nb\n' | bagel write --store file:///srv/bags --log orders --lease lease.json`
    Write(write::WriteArgs),
    /// Read a time range of a log in timestamp order, checking every message.
    ///
    /// Example: `bagel read --store file:///srv/bags --log orders --from 2026-11-27T17:00:00Z`
    Read(read::ReadArgs),
    /// Close every past bag of the given logs, continuously or once.
    ///
    /// Example: `bagel metronome --store file:///srv/bags --log orders`
    Metronome(metronome::MetronomeArgs),
    /// Check a time range of a log from the stored messages and witnesses
    /// alone: signatures, chains of grants, overlaps, out-of-lease
    /// timestamps, watermarks, signed times. Exits 1 on any violation.
    ///
    /// Example: `bagel audit --store file:///srv/bags --log orders --from 2026-11-27T17:00:00Z`
    Audit(audit::AuditArgs),
    /// Turn closed stretches of a log into one summary object each (whole
    /// minutes), sealing past-due minutes first. Idempotent: any number may
    /// run at once; readers then read those minutes from the summary.
    /// Without --from, resumes at the oldest stretch not yet summarized.
    ///
    /// Example: `bagel summarize --store file:///srv/bags --log orders`
    Summarize(summarize::SummarizeArgs),
    /// Remove old bags that a summary holds, once the summary checks
    /// against them (and, optionally, old summaries). Never removes what
    /// no summary holds. A summary that does not check, or is corrupt,
    /// keeps its bags (a KEPT line) and the run goes on with the others,
    /// then exits 1.
    ///
    /// Example: `bagel retain --store file:///srv/bags --log orders --keep-bags 1d`
    Retain(retain::RetainArgs),
}

pub use crate::globals::Globals;

pub async fn run(cmd: BagCommand, g: Globals<'_>) -> anyhow::Result<ExitCode> {
    match cmd {
        BagCommand::Write(a) => write::run(a, &g).await,
        BagCommand::Read(a) => read::run(a, &g).await,
        BagCommand::Metronome(a) => metronome::run(a, &g).await,
        BagCommand::Audit(a) => audit::run(a, &g).await,
        BagCommand::Summarize(a) => summarize::run(a, &g).await,
        BagCommand::Retain(a) => retain::run(a, &g).await,
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, Parser};

    #[derive(Parser)]
    struct Bags {
        #[command(subcommand)]
        command: super::BagCommand,
    }

    /// Every bag command takes `--store` in the same forms, from the one
    /// shared flag.
    #[test]
    fn every_bag_command_takes_every_store_form() {
        let bags = Bags::command();
        let mut commands = 0;
        for command in bags.get_subcommands() {
            let store = command
                .get_arguments()
                .find(|a| a.get_long() == Some("store"))
                .unwrap_or_else(|| panic!("bagel {} has no --store", command.get_name()));
            let help = store.get_help().map(ToString::to_string).unwrap_or_default();
            for form in ["file:///", "s3://", "nfs://"] {
                assert!(
                    help.contains(form),
                    "bagel {} --store: {help}",
                    command.get_name()
                );
            }
            assert_eq!(store.get_env().and_then(|e| e.to_str()), Some("BAGEL_STORE"));
            commands += 1;
        }
        assert_eq!(commands, 6);
    }
}
