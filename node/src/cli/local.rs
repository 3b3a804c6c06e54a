//! A cluster of real `ringleader node` processes on this host: used by `ringleader demo`,
//! the integration tests and the membership benchmark.
//!
//! Every process it starts is stopped by PID when the cluster is dropped, whatever happened.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};

use crate::{
    api::{client::ApiClient, status::StatusDoc},
    node::NodeInfo,
};

/// How long a node may take to write its `node.json` after being spawned, in milliseconds.
const START_WAIT_MS: u64 = 20_000;
/// Poll period while waiting on a condition, in milliseconds.
const POLL_MS: u64 = 50;
/// How long a SIGTERM'd node may take to exit before it is killed, in milliseconds.
const STOP_WAIT_MS: u64 = 5_000;

/// One node process of the cluster.
pub struct LocalNode {
    /// The `--name` it was given.
    pub name: String,
    /// Its `--data-dir`.
    pub dir: PathBuf,
    /// Extra arguments it was started with (kept for restarts).
    pub args: Vec<String>,
    /// What it wrote to `node.json` on its last start.
    pub info: NodeInfo,
    child: Option<Child>,
}

impl LocalNode {
    /// PID of the running process, if any.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// An API client for this node.
    pub fn client(&self) -> ApiClient {
        ApiClient::new(&self.info.api_addr, None)
    }
}

/// Real node processes on 127.0.0.1, each with its own ports and data directory.
pub struct LocalCluster {
    exe: PathBuf,
    root: PathBuf,
    /// The nodes, by index of start.
    pub nodes: Vec<LocalNode>,
}

impl LocalCluster {
    /// A cluster whose nodes run `exe` and keep their data directories under `root`.
    pub fn new(exe: impl Into<PathBuf>, root: impl Into<PathBuf>) -> Self {
        LocalCluster {
            exe: exe.into(),
            root: root.into(),
            nodes: Vec::new(),
        }
    }

    /// The seed address of node `i` (`host:port`, its first p2p address).
    pub fn seed_of(&self, i: usize) -> String {
        self.nodes[i].info.p2p_addrs[0].clone()
    }

    /// Starts a node named `name` with `extra` arguments (e.g. `--join`), on 127.0.0.1 with
    /// ports the OS picks, and waits until it is listening.
    pub fn start(&mut self, name: &str, extra: &[String]) -> Result<usize> {
        let dir = self.root.join(name);
        std::fs::create_dir_all(&dir)?;
        let (child, info) = spawn(&self.exe, name, &dir, extra)?;
        self.nodes.push(LocalNode {
            name: name.to_string(),
            dir,
            args: extra.to_vec(),
            info,
            child: Some(child),
        });
        Ok(self.nodes.len() - 1)
    }

    /// Starts a node that joins through node 0.
    pub fn start_joining(&mut self, name: &str, extra: &[String]) -> Result<usize> {
        let mut args = vec!["--join".to_string(), self.seed_of(0)];
        args.extend_from_slice(extra);
        self.start(name, &args)
    }

    /// Restarts a stopped node with its data directory and arguments.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        let node = &mut self.nodes[i];
        if node.child.is_some() {
            bail!("node {} is still running", node.name);
        }
        let (child, info) = spawn(&self.exe, &node.name, &node.dir, &node.args)?;
        node.child = Some(child);
        node.info = info;
        Ok(())
    }

    /// kill -9 node `i` and reap it.
    pub fn kill9(&mut self, i: usize) -> Result<()> {
        if let Some(mut child) = self.nodes[i].child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// SIGTERM node `i` (a graceful leave) and wait for it to exit.
    pub fn terminate(&mut self, i: usize) -> Result<std::process::ExitStatus> {
        let child = self.nodes[i]
            .child
            .take()
            .ok_or_else(|| anyhow!("node {i} is not running"))?;
        stop_gracefully(child)
    }

    /// Indices of running nodes.
    pub fn running(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].child.is_some())
            .collect()
    }

    /// Status of node `i`.
    pub fn status(&self, i: usize) -> Result<StatusDoc> {
        self.nodes[i].client().status()
    }

    /// Polls the running nodes' statuses until `cond` holds for every one, or the deadline.
    /// Returns the time it took.
    pub fn wait_all(
        &self,
        within: Duration,
        what: &str,
        cond: impl Fn(&StatusDoc) -> bool,
    ) -> Result<Duration> {
        let start = Instant::now();
        let mut last = String::new();
        loop {
            let mut all = true;
            for i in self.running() {
                match self.status(i) {
                    Ok(s) if cond(&s) => {}
                    Ok(s) => {
                        all = false;
                        last = format!(
                            "{}: {:?}",
                            s.node.name,
                            s.members
                                .iter()
                                .map(|m| (&m.name, &m.state))
                                .collect::<Vec<_>>()
                        );
                    }
                    Err(e) => {
                        all = false;
                        last = e.to_string();
                    }
                }
            }
            if all {
                return Ok(start.elapsed());
            }
            if start.elapsed() > within {
                bail!("timed out after {within:?} waiting for {what}; last view: {last}");
            }
            std::thread::sleep(Duration::from_millis(POLL_MS));
        }
    }

    /// Stops every running node gracefully (SIGTERM, then SIGKILL after a grace period).
    pub fn stop_all(&mut self) {
        for node in &mut self.nodes {
            if let Some(child) = node.child.take() {
                let _ = stop_gracefully(child);
            }
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn stop_gracefully(mut child: Child) -> Result<std::process::ExitStatus> {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
    let deadline = Instant::now() + Duration::from_millis(STOP_WAIT_MS);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() > deadline {
            child.kill()?;
            return Ok(child.wait()?);
        }
        std::thread::sleep(Duration::from_millis(POLL_MS));
    }
}

fn spawn(exe: &Path, name: &str, dir: &Path, extra: &[String]) -> Result<(Child, NodeInfo)> {
    let _ = std::fs::remove_file(dir.join(crate::node::NODE_INFO_FILE));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("node.log"))
        .context("opening node.log")?;
    // Defaults for this host, unless the caller set the flag itself.
    let mut defaults: Vec<&str> = vec!["--name", name];
    for flag in ["--listen", "--api", "--data"] {
        if !extra.iter().any(|a| a == flag) {
            defaults.extend([flag, "127.0.0.1:0"]);
        }
    }
    let mut child = Command::new(exe)
        .arg("node")
        .args(&defaults)
        .arg("--data-dir")
        .arg(dir)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", exe.display()))?;
    let deadline = Instant::now() + Duration::from_millis(START_WAIT_MS);
    loop {
        if let Ok(info) = NodeInfo::read(dir) {
            if info.pid == child.id() {
                return Ok((child, info));
            }
        }
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(dir.join("node.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            bail!(
                "node {name} exited at start ({status}): {}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("node {name} did not start within {START_WAIT_MS} ms");
        }
        std::thread::sleep(Duration::from_millis(POLL_MS));
    }
}
