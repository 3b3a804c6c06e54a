//! `ringleader dataset add | ls | get | rm`: datasets shared peer to peer.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use clap::Subcommand;
use serde::Deserialize;

use super::{client, Cli};
use crate::api::client::ApiClient;

/// How often `dataset get` asks how the fetch goes. Each request waits on the node up to
/// this long for the fetch to end (`?wait_ms=`), so the command returns as soon as it has,
/// not up to one poll later.
const POLL: Duration = Duration::from_millis(200);

/// `ringleader dataset …`.
#[derive(Debug, Subcommand)]
pub enum DatasetCmd {
    /// Add a file or directory (read on the node you talk to, which becomes its first
    /// holder) under NAME.
    Add {
        /// The dataset's name: letters, digits, '.', '_', '-' (at most 64).
        name: String,
        /// The file or directory (a relative path is made absolute here first).
        path: PathBuf,
        /// Chunk size in MiB, 1 to 4: the unit of transfer and verification (default: 1 MiB
        /// up to 64 GiB, then 2 and 4 MiB, so the manifest stays small).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4))]
        chunk_mib: Option<u32>,
    },
    /// List datasets with their live holders (`--json`: [{name, size_bytes, files, chunks,
    /// root, holders, fetching, added_at, added_on}]).
    Ls,
    /// Fetch a dataset to the node from every holder at once; waits until it is there.
    Get {
        /// The dataset.
        name: String,
        /// Also write its files, byte-identical, under this directory on the node's host.
        #[arg(long)]
        to: Option<PathBuf>,
    },
    /// Remove a dataset's name; holders delete its content.
    Rm {
        /// The dataset.
        name: String,
    },
}

/// A row of `dataset ls --json` as the CLI reads it.
#[derive(Debug, Deserialize)]
struct Row {
    name: String,
    size_bytes: u64,
    files: u64,
    chunks: u64,
    root: String,
    holders: Vec<String>,
    #[serde(default)]
    fetching: Vec<String>,
    #[serde(default)]
    owner: String,
}

/// Runs a dataset command.
pub fn run(cli: &Cli, cmd: &DatasetCmd) -> Result<()> {
    let c = client(cli)?;
    match cmd {
        DatasetCmd::Add {
            name,
            path,
            chunk_mib,
        } => {
            let path = std::path::absolute(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
            let doc: serde_json::Value = c.post_json(
                "/v1/datasets",
                &serde_json::json!({
                    "name": name,
                    "path": path.display().to_string(),
                    "chunk_mib": chunk_mib,
                }),
            )?;
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                println!(
                    "added {name}: {} in {} file(s), {} chunk(s), root {}",
                    human_bytes(doc["size_bytes"].as_u64().unwrap_or(0)),
                    doc["files"],
                    doc["chunks"],
                    doc["root"].as_str().unwrap_or("?")
                );
            }
            Ok(())
        }
        DatasetCmd::Ls => {
            let rows: serde_json::Value = c.get("/v1/datasets")?;
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
                return Ok(());
            }
            let rows: Vec<Row> = serde_json::from_value(rows)?;
            println!(
                "{:<24} {:<16} {:>10} {:>6} {:>7}  {:<16}  HOLDERS",
                "NAME", "OWNER", "SIZE", "FILES", "CHUNKS", "ROOT"
            );
            for r in rows {
                let mut holders = r.holders.join(",");
                if !r.fetching.is_empty() {
                    holders.push_str(&format!(" (fetching: {})", r.fetching.join(",")));
                }
                println!(
                    "{:<24} {:<16} {:>10} {:>6} {:>7}  {:<16}  {}",
                    r.name,
                    r.owner,
                    human_bytes(r.size_bytes),
                    r.files,
                    r.chunks,
                    &r.root[..16.min(r.root.len())],
                    holders
                );
            }
            Ok(())
        }
        DatasetCmd::Get { name, to } => get(cli, &c, name, to.as_deref()),
        DatasetCmd::Rm { name } => {
            let _: serde_json::Value = c.delete(&format!("/v1/datasets/{name}"))?;
            if !cli.json {
                println!("removed {name}");
            } else {
                println!("{}", serde_json::json!({ "removed": name }));
            }
            Ok(())
        }
    }
}

fn get(cli: &Cli, c: &ApiClient, name: &str, to: Option<&Path>) -> Result<()> {
    let to = to
        .map(std::path::absolute)
        .transpose()
        .map_err(|e| anyhow!("--to: {e}"))?;
    let body = serde_json::json!({ "to": to.as_ref().map(|p| p.display().to_string()) });
    let mut status: serde_json::Value = c.post_json(&format!("/v1/datasets/{name}/get"), &body)?;
    let bar = (!cli.json && std::io::stdout().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(status["size_bytes"].as_u64().unwrap_or(0));
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} {prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}\n  {wide_msg}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(name.to_owned());
        bar
    });
    while status["state"] == "fetching" {
        if let Some(bar) = &bar {
            let chunks = status["chunks"].as_u64().unwrap_or(0).max(1);
            let done = status["chunks_done"].as_u64().unwrap_or(0);
            let size = status["size_bytes"].as_u64().unwrap_or(0);
            bar.set_length(size);
            bar.set_position(size * done / chunks);
            let sources: Vec<String> = status["sources"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| {
                    format!(
                        "{} {} MB/s",
                        s["name"].as_str().unwrap_or("?"),
                        s["mb_per_s"]
                    )
                })
                .collect();
            bar.set_message(format!("from {}", sources.join(", ")));
        }
        let asked = Instant::now();
        status = c.get(&format!(
            "/v1/datasets/{name}/get?wait_ms={}",
            POLL.as_millis()
        ))?;
        if status["state"] == "fetching" {
            // A node that answered at once (one that does not wait) is not asked in a spin.
            std::thread::sleep(POLL.saturating_sub(asked.elapsed()));
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    }
    if status["state"] != "done" {
        return Err(anyhow!(
            "fetching {name} failed: {}",
            status["error"].as_str().unwrap_or("unknown error")
        ));
    }
    if !cli.json {
        let sources: Vec<String> = status["sources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["bytes"].as_u64().unwrap_or(0) > 0)
            .map(|s| {
                format!(
                    "{} {}",
                    s["name"].as_str().unwrap_or("?"),
                    human_bytes(s["bytes"].as_u64().unwrap_or(0))
                )
            })
            .collect();
        let bytes = status["bytes"].as_u64().unwrap_or(0);
        if bytes == 0 {
            println!(
                "{name} is on the node: {}",
                status["path"].as_str().unwrap_or("?")
            );
        } else {
            println!(
                "fetched {name}: {} in {:.1} s ({} MB/s) from {}",
                human_bytes(bytes),
                status["elapsed_ms"].as_u64().unwrap_or(0) as f64 / 1000.0,
                status["mb_per_s"],
                sources.join(", ")
            );
        }
        if let Some(to) = to {
            println!("files written under {}", to.display());
        }
    }
    Ok(())
}

/// Bytes as KiB, MiB or GiB with one decimal.
pub fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < units.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_ls_h() {
        assert_eq!(human_bytes(5), "5 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(512 << 20), "512.0 MiB");
    }
}
