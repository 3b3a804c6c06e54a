//! `ringleader key rotate`: a new cluster key for every live member (see `rotation`), through
//! `POST /v1/key/rotate`. Needs the admin token (the node's `<data-dir>/api.token`); after it
//! the old admin token is refused everywhere and each member's `api.token` holds the new one.

use anyhow::Result;
use clap::Subcommand;

use super::{client, Cli};

/// `ringleader key …`.
#[derive(Debug, Subcommand)]
pub enum KeyCmd {
    /// Make a new cluster key and give it to every live member that was not removed, over
    /// the members' encrypted streams; once each has it, every member switches to it (the
    /// old key is still accepted for 30 s, then refused). The admin token changes with the
    /// key: the old one is refused from then on and every member's `<data-dir>/api.token`
    /// holds the new one. A removed member never gets the new key, so it is shut out; a
    /// member that was down needs the new `cluster.key` copied from a member (restart it with
    /// `--cluster-key FILE`). Needs the admin token. If a member does not take the key,
    /// nothing is switched: run it again.
    Rotate,
}

/// Runs a key command.
pub fn run(cli: &Cli, cmd: &KeyCmd) -> Result<()> {
    let c = client(cli)?;
    match cmd {
        KeyCmd::Rotate => {
            let v: serde_json::Value = c.post("/v1/key/rotate", "")?;
            if cli.json {
                println!("{v}");
            } else {
                let members = v["members"].as_array().map_or(0, Vec::len);
                println!(
                    "cluster key rotated to epoch {} (fingerprint {}), given to {members} member(s); \
                     the old admin token is refused from now on",
                    v["epoch"],
                    v["fingerprint"].as_str().unwrap_or("?")
                );
            }
        }
    }
    Ok(())
}
