//! `ringleader demo`: a local cluster on this machine, end to end.

use std::time::Duration;

use anyhow::{Context, Result};

use crate::local::LocalCluster;

/// Nodes the demo starts.
const DEMO_NODES: usize = 3;
/// How long the demo waits for the cluster to form, in seconds.
const FORM_WAIT_S: u64 = 30;

/// Starts a local 3-node cluster, prints its status, and stops it cleanly.
pub fn run() -> Result<()> {
    let exe = std::env::current_exe().context("locating the ringleader binary")?;
    let root = tempfile::Builder::new()
        .prefix("ringleader-demo-")
        .tempdir()?;
    let mut cluster = LocalCluster::new(exe, root.path());
    println!(
        "starting a local cluster of {DEMO_NODES} nodes in {}",
        root.path().display()
    );
    cluster.start("demo-1", &[])?;
    for i in 2..=DEMO_NODES {
        cluster.start_joining(&format!("demo-{i}"), &[])?;
    }
    let took = cluster.wait_all(
        Duration::from_secs(FORM_WAIT_S),
        "every node to see all alive",
        |s| s.names_in("alive").len() == DEMO_NODES,
    )?;
    println!(
        "cluster formed in {:.2} s; status from demo-1:\n",
        took.as_secs_f64()
    );
    print!("{}", cluster.status(0)?.to_table());
    println!("\nstopping the cluster");
    cluster.stop_all();
    println!("demo finished");
    Ok(())
}
