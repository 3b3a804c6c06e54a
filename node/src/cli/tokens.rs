//! `ringleader token create | ls | revoke` and `ringleader member remove`: the cluster's
//! access list (see `api::tokens`). Making and revoking tokens and removing members need
//! the admin token (the node's `<data-dir>/api.token`).

use anyhow::{anyhow, Result};
use clap::Subcommand;
use serde::Deserialize;

use super::{client, Cli};

/// `ringleader token …`.
#[derive(Debug, Subcommand)]
pub enum TokenCmd {
    /// Make a random API token named NAME and print it, once: the cluster keeps only its
    /// hash. Needs the admin token. The new token works on every node for everything but
    /// token and member changes, until revoked.
    Create {
        /// The token's name: letters, digits, '.', '_', '-' (at most 64 bytes).
        name: String,
    },
    /// List tokens: name, when made, by whom, the first digits of the hash (`--json`:
    /// [{name, created_at_ms, created_by, hash_prefix}]).
    Ls,
    /// Revoke the token NAME: every node refuses it within about a second. Needs the admin
    /// token.
    Revoke {
        /// The token's name.
        name: String,
    },
}

/// `ringleader member …`.
#[derive(Debug, Subcommand)]
pub enum MemberCmd {
    /// Remove a member from the cluster for good: it leaves the Raft voters and learners,
    /// gets no new ranks, and its messages are refused. Needs the admin token. The host
    /// still holds the cluster key: `ringleader key rotate` afterwards shuts it out.
    Remove {
        /// The member's name or peer id (see `ringleader status`).
        member: String,
    },
}

/// A row of `GET /v1/tokens`.
#[derive(Debug, Deserialize)]
struct Row {
    name: String,
    created_at_ms: u64,
    created_by: String,
    hash_prefix: String,
}

/// Runs a token command.
pub fn run(cli: &Cli, cmd: &TokenCmd) -> Result<()> {
    let c = client(cli)?;
    match cmd {
        TokenCmd::Create { name } => {
            let v: serde_json::Value =
                c.post_json("/v1/tokens", &serde_json::json!({ "name": name }))?;
            if cli.json {
                println!("{v}");
            } else {
                let token = v["token"]
                    .as_str()
                    .ok_or_else(|| anyhow!("no token in the answer"))?;
                eprintln!("token {name:?} created; it is shown only now:");
                println!("{token}");
            }
        }
        TokenCmd::Ls => {
            let v: serde_json::Value = c.get("/v1/tokens")?;
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let rows: Vec<Row> = serde_json::from_value(v)?;
            println!("{:<24} {:<16} {:<24} HASH", "NAME", "CREATED_MS", "BY");
            for r in rows {
                println!(
                    "{:<24} {:<16} {:<24} {}…",
                    r.name, r.created_at_ms, r.created_by, r.hash_prefix
                );
            }
        }
        TokenCmd::Revoke { name } => {
            let v: serde_json::Value = c.delete(&format!("/v1/tokens/{name}"))?;
            if cli.json {
                println!("{v}");
            } else {
                println!("token {name:?} revoked");
            }
        }
    }
    Ok(())
}

/// Runs a member command.
pub fn run_member(cli: &Cli, cmd: &MemberCmd) -> Result<()> {
    let c = client(cli)?;
    match cmd {
        MemberCmd::Remove { member } => {
            let v: serde_json::Value = c.post(&format!("/v1/members/{member}/remove"), "")?;
            if cli.json {
                println!("{v}");
            } else {
                println!(
                    "{member} removed ({})",
                    v["removed"].as_str().unwrap_or("?")
                );
            }
        }
    }
    Ok(())
}
