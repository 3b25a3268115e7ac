//! `bagel upgrade`: a tentative lease made full; its lease file (when
//! `--lease` is one) rewritten.

use std::process::ExitCode;

use bagel_cli::contract::LeaseJson;
use bagel_client::LeaseBackend as _;

use super::acquire::{Shown, print_grant};
pub use super::lease_arg::TokenArgs as UpgradeArgs;
use crate::target::Target;

pub async fn run(args: UpgradeArgs, target: &Target) -> anyhow::Result<ExitCode> {
    let backend = target.backend();
    let grant = backend.upgrade_lease(&args.resolve()?).await?;
    let mut json = LeaseJson::from_grant(&grant, target.single_location().as_deref());
    if let Some((path, file)) = args.file()? {
        json.holder_secret = file.holder_secret;
        json.server = json.server.or(file.server);
        crate::lease_file::write(path, &json)?;
    }
    // The token was given (or is in the lease file): never printed back.
    let shown = Shown {
        json: crate::output::json(),
        token: false,
    };
    print_grant(&json, shown);
    Ok(ExitCode::SUCCESS)
}
