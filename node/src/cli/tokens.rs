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
    /// hash. Needs an admin token. The new token works on every node, until revoked, for
    /// what its role allows: `admin` everything; `user` submitting, every job's summary,
    /// and cancelling, logs, metrics and checkpoints of its user's own jobs; `viewer`
    /// summaries only.
    Create {
        /// The token's name: letters, digits, '.', '_', '-' (at most 64 bytes).
        name: String,
        /// The user it belongs to (the same rule; default: NAME). A user's jobs are those
        /// any of its tokens submitted.
        #[arg(long, value_name = "USER")]
        user: Option<String>,
        /// What it may do.
        #[arg(long, value_parser = ["admin", "user", "viewer"], default_value = "user")]
        role: String,
    },
    /// List tokens: name, user, role, when made, by whom, the first digits of the hash
    /// (`--json`: [{name, user, role, created_at_ms, created_by, hash_prefix}]).
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
    #[serde(default)]
    user: String,
    #[serde(default)]
    role: String,
    created_at_ms: u64,
    created_by: String,
    hash_prefix: String,
}

/// Runs a token command.
pub fn run(cli: &Cli, cmd: &TokenCmd) -> Result<()> {
    let c = client(cli)?;
    match cmd {
        TokenCmd::Create { name, user, role } => {
            let v: serde_json::Value = c.post_json(
                "/v1/tokens",
                &serde_json::json!({ "name": name, "user": user, "role": role }),
            )?;
            if cli.json {
                println!("{v}");
            } else {
                let token = v["token"]
                    .as_str()
                    .ok_or_else(|| anyhow!("no token in the answer"))?;
                let user = v["user"].as_str().unwrap_or(name);
                eprintln!(
                    "token {name:?} created for user {user} (role {role}); it is shown only now:"
                );
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
            println!(
                "{:<24} {:<16} {:<7} {:<16} {:<24} HASH",
                "NAME", "USER", "ROLE", "CREATED_MS", "BY"
            );
            for r in rows {
                println!(
                    "{:<24} {:<16} {:<7} {:<16} {:<24} {}…",
                    r.name, r.user, r.role, r.created_at_ms, r.created_by, r.hash_prefix
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
