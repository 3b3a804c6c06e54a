//! A cluster of real `ringleader node` processes on this host: used by `ringleader demo`,
//! the integration tests and the membership benchmark.
//!
//! Every cluster is keyed: [`LocalCluster::new`] writes a fresh cluster key (0600) under its
//! root, every node is started with `--cluster-key` on it, and the clients send the
//! cluster's admin token. Only a test of `--insecure` itself passes that flag.
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
    /// Extra arguments it was started with (kept for restarts; the cluster key is added at
    /// each start unless they name another).
    pub args: Vec<String>,
    /// What it wrote to `node.json` on its last start.
    pub info: NodeInfo,
    /// The API token its clients send (the cluster's when it was started).
    pub token: Option<String>,
    /// Environment it was started with on top of this process's (kept for restarts).
    pub env: Vec<(String, String)>,
    /// The fingerprint of its API's TLS key (the `tls` line of its `api.token`; `None`
    /// under `--insecure`). Its API speaks TLS on 127.0.0.1 only with `--api-tls on`.
    pub tls_pin: Option<crate::security::tls::Fingerprint>,
    child: Option<Child>,
}

impl LocalNode {
    /// What it has logged so far (`node.log`, kept across restarts; empty if none).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("node.log")).unwrap_or_default()
    }

    /// PID of the running process, if any.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// An API client for this node.
    pub fn client(&self) -> ApiClient {
        ApiClient::new(&self.peer(), self.token.clone()).with_tls_pin(self.tls_pin)
    }

    /// Its API address as clients name it: `https://…` when its API speaks TLS on
    /// loopback (`--api-tls on`), where a bare loopback address means plain http.
    pub fn peer(&self) -> String {
        if self
            .args
            .windows(2)
            .any(|w| w[0] == "--api-tls" && w[1] == "on")
        {
            format!("https://{}", self.info.api_addr)
        } else {
            self.info.api_addr.clone()
        }
    }

    /// The environment a CLI command against this node runs with: `RINGLEADER_PEER` and,
    /// when it has them, `RINGLEADER_TOKEN` and `RINGLEADER_TLS_SHA256`.
    pub fn cli_env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![("RINGLEADER_PEER", self.peer())];
        env.extend(self.token.clone().map(|t| ("RINGLEADER_TOKEN", t)));
        env.extend(
            self.tls_pin
                .map(|p| ("RINGLEADER_TLS_SHA256", p.to_string())),
        );
        env
    }
}

/// Real node processes on 127.0.0.1, each with its own ports and data directory.
pub struct LocalCluster {
    exe: PathBuf,
    root: PathBuf,
    key_file: PathBuf,
    /// The nodes, by index of start.
    pub nodes: Vec<LocalNode>,
    /// The API token the clients of nodes started from now on send: the cluster's admin
    /// token, or one of the test's (pass the node its `--token-file` too). A node started
    /// with its own `--cluster-key` gets that key's admin token, one started with
    /// `--insecure` (and no `--token-file`) none.
    pub token: Option<String>,
    /// Environment added to this process's for nodes started from now on (e.g. the
    /// test-only `RINGLEADER_TEST_GPUS`).
    pub env: Vec<(String, String)>,
}

impl LocalCluster {
    /// A cluster whose nodes run `exe` and keep their data directories under `root`, with a
    /// new cluster key in `root/cluster.key`.
    pub fn new(exe: impl Into<PathBuf>, root: impl Into<PathBuf>) -> Self {
        let root: PathBuf = root.into();
        let key_file = root.join(crate::security::bootstrap::CLUSTER_KEY_FILE);
        let text = crate::cluster::identity::generate_cluster_key();
        let key = crate::cluster::identity::parse_cluster_key(&text)
            .expect("a generated cluster key parses");
        std::fs::create_dir_all(&root)
            .and_then(|()| crate::security::modes::write_private(&key_file, text.as_bytes()))
            .unwrap_or_else(|e| panic!("writing {}: {e}", key_file.display()));
        LocalCluster {
            exe: exe.into(),
            root,
            key_file,
            nodes: Vec::new(),
            token: Some(crate::security::bootstrap::admin_token(&key)),
            env: Vec::new(),
        }
    }

    /// The cluster key file every node is started with (unless its arguments name another).
    pub fn key_file(&self) -> &Path {
        &self.key_file
    }

    /// The arguments a node is started with: the cluster key unless `extra` names a key or
    /// `--insecure`, then `extra`.
    fn node_args(&self, extra: &[String]) -> Vec<String> {
        let mut args = Vec::new();
        if !extra
            .iter()
            .any(|a| a == "--cluster-key" || a == "--insecure")
        {
            args.extend([
                "--cluster-key".to_string(),
                self.key_file.display().to_string(),
            ]);
        }
        args.extend_from_slice(extra);
        args
    }

    /// The token a client of a node started with `args` sends (see [`LocalCluster::token`]).
    fn token_for(&self, args: &[String]) -> Option<String> {
        let value = |flag: &str| args.windows(2).find(|w| w[0] == flag).map(|w| w[1].clone());
        if let Some(file) = value("--token-file") {
            return std::fs::read_to_string(file)
                .ok()
                .and_then(|t| t.parse::<crate::api::auth::TokenFileText>().ok())
                .map(|t| t.token);
        }
        if let Some(file) = value("--cluster-key") {
            if Path::new(&file) != self.key_file {
                return crate::cluster::identity::load_cluster_key(Path::new(&file))
                    .ok()
                    .map(|k| crate::security::bootstrap::admin_token(&k));
            }
        }
        if args.iter().any(|a| a == "--insecure") {
            return None;
        }
        self.token.clone()
    }

    /// A CLI command (`ringleader …`, arguments to add) against node `i`, with its address
    /// and token in the environment.
    pub fn cli(&self, i: usize) -> Command {
        let mut cmd = Command::new(&self.exe);
        cmd.envs(self.nodes[i].cli_env());
        cmd
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
        let args = self.node_args(extra);
        let (child, info) = spawn(&self.exe, name, &dir, &args, &self.env)?;
        let token = self.token_for(&args);
        let tls_pin = tls_pin_in(&dir);
        self.nodes.push(LocalNode {
            name: name.to_string(),
            dir,
            args: extra.to_vec(),
            info,
            token,
            env: self.env.clone(),
            tls_pin,
            child: Some(child),
        });
        Ok(self.nodes.len() - 1)
    }

    /// Starts nodes named `names`, each with its `extra` arguments, all at once, as hosts of
    /// a cluster boot: every process is spawned behind a gate (a shell waiting to read its
    /// standard input, a pipe), then the gate opens for all of them together, so that the
    /// time this harness takes to spawn them (seconds for a hundred on a loaded host) is not
    /// the cluster's. Waits until every one is listening. Returns their indices and the
    /// moment the gate opened.
    pub fn start_many(&mut self, nodes: &[(String, Vec<String>)]) -> Result<(Vec<usize>, Instant)> {
        // Launched but not yet handed to `self.nodes` (whose drop stops them): killed here
        // if anything fails before they are.
        let mut launched: Vec<(usize, PathBuf, Vec<String>, Child)> = Vec::new();
        let result: Result<(Vec<usize>, Instant)> = (|| {
            let (gate_out, gate_in) = std::io::pipe().context("making the start gate")?;
            for (k, (name, extra)) in nodes.iter().enumerate() {
                let dir = self.root.join(name);
                std::fs::create_dir_all(&dir)?;
                let args = self.node_args(extra);
                let gate = Some(gate_out.try_clone()?);
                let child = launch(&self.exe, name, &dir, &args, &self.env, gate)?;
                launched.push((k, dir, args, child));
            }
            drop(gate_out);
            // The end of the pipe: every waiting shell reads EOF and execs its node.
            drop(gate_in);
            let opened = Instant::now();
            let mut indices = Vec::with_capacity(nodes.len());
            while !launched.is_empty() {
                let (k, dir, args, child) = launched.remove(0);
                let (name, extra) = &nodes[k];
                let (child, info) = await_started(child, name, &dir)?;
                let token = self.token_for(&args);
                let tls_pin = tls_pin_in(&dir);
                self.nodes.push(LocalNode {
                    name: name.clone(),
                    dir,
                    args: extra.clone(),
                    info,
                    token,
                    env: self.env.clone(),
                    tls_pin,
                    child: Some(child),
                });
                indices.push(self.nodes.len() - 1);
            }
            Ok((indices, opened))
        })();
        for (_, _, _, mut child) in launched {
            let _ = child.kill();
            let _ = child.wait();
        }
        result
    }

    /// Starts a node that joins through node 0.
    pub fn start_joining(&mut self, name: &str, extra: &[String]) -> Result<usize> {
        let mut args = vec!["--join".to_string(), self.seed_of(0)];
        args.extend_from_slice(extra);
        self.start(name, &args)
    }

    /// Restarts a stopped node with its data directory and arguments (and the cluster key,
    /// unless they name another or `--insecure`).
    pub fn restart(&mut self, i: usize) -> Result<()> {
        if self.nodes[i].child.is_some() {
            bail!("node {} is still running", self.nodes[i].name);
        }
        let args = self.node_args(&self.nodes[i].args);
        let node = &mut self.nodes[i];
        let (child, info) = spawn(&self.exe, &node.name, &node.dir, &args, &node.env)?;
        node.child = Some(child);
        node.info = info;
        node.tls_pin = tls_pin_in(&node.dir);
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

    /// Stops every running node gracefully: SIGTERM to all at once, then each is waited
    /// for (SIGKILL after a grace period).
    pub fn stop_all(&mut self) {
        let children: Vec<Child> = self
            .nodes
            .iter_mut()
            .filter_map(|n| n.child.take())
            .collect();
        for child in &children {
            let _ = sigterm(child);
        }
        for child in children {
            let _ = await_exit(child);
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

/// The TLS pin in a node's `<dir>/api.token` (written before its `node.json`).
fn tls_pin_in(dir: &Path) -> Option<crate::security::tls::Fingerprint> {
    std::fs::read_to_string(dir.join(crate::security::bootstrap::API_TOKEN_FILE))
        .ok()?
        .parse::<crate::api::auth::TokenFileText>()
        .ok()?
        .tls
}

fn stop_gracefully(child: Child) -> Result<std::process::ExitStatus> {
    sigterm(&child)?;
    await_exit(child)
}

fn sigterm(child: &Child) -> Result<()> {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
    Ok(())
}

/// Waits for `child` to exit, SIGKILLing it after [`STOP_WAIT_MS`].
fn await_exit(mut child: Child) -> Result<std::process::ExitStatus> {
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

fn spawn(
    exe: &Path,
    name: &str,
    dir: &Path,
    extra: &[String],
    env: &[(String, String)],
) -> Result<(Child, NodeInfo)> {
    let child = launch(exe, name, dir, extra, env, None)?;
    await_started(child, name, dir)
}

/// Spawns `ringleader node` for `name` in `dir`, logging to `dir/node.log`; behind `gate`
/// (see [`LocalCluster::start_many`]) when one is given: a shell that execs the node once its
/// read of the gate ends.
fn launch(
    exe: &Path,
    name: &str,
    dir: &Path,
    extra: &[String],
    env: &[(String, String)],
    gate: Option<std::io::PipeReader>,
) -> Result<Child> {
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
    let (mut command, stdin) = match gate {
        None => (Command::new(exe), Stdio::null()),
        Some(gate) => {
            let mut sh = Command::new("/bin/sh");
            // `$0` is the node's program, `$@` its arguments.
            sh.args(["-c", "read -r _; exec \"$0\" \"$@\" </dev/null"])
                .arg(exe);
            (sh, Stdio::from(gate))
        }
    };
    command
        .arg("node")
        .args(&defaults)
        .arg("--data-dir")
        .arg(dir)
        .args(extra)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(stdin)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", exe.display()))
}

/// Waits until the node `child` writes its `node.json` (it is listening), or kills it.
fn await_started(mut child: Child, name: &str, dir: &Path) -> Result<(Child, NodeInfo)> {
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

/// Every process of this host with its arguments (from `/proc/PID/cmdline`).
pub fn processes() -> Vec<(u32, Vec<String>)> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
            let raw = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args = raw
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            Some((pid, args))
        })
        .collect()
}

/// `train-worker` processes of job `id` on this host: PID → the `--rank` each started as.
pub fn train_workers(id: &str) -> std::collections::BTreeMap<u32, u32> {
    let mut out = std::collections::BTreeMap::new();
    for (pid, args) in processes() {
        let value = |flag: &str| args.windows(2).find(|w| w[0] == flag).map(|w| w[1].clone());
        if !args.iter().any(|a| a == "train-worker") || value("--job-id").as_deref() != Some(id) {
            continue;
        }
        if let Some(rank) = value("--rank").and_then(|r| r.parse().ok()) {
            out.insert(pid, rank);
        }
    }
    out
}

/// [`train_workers`] of a cluster whose nodes keep their data under `root` (job ids repeat
/// across clusters: another cluster on the host may run a job of the same id).
pub fn train_workers_in(id: &str, root: &Path) -> std::collections::BTreeMap<u32, u32> {
    let mut out = train_workers(id);
    out.retain(|pid, _| {
        let args = processes()
            .into_iter()
            .find(|(p, _)| p == pid)
            .map(|(_, a)| a)
            .unwrap_or_default();
        args.windows(2)
            .find(|w| w[0] == "--data-dir")
            .is_some_and(|w| Path::new(&w[1]).starts_with(root))
    });
    out
}

/// Whether process `pid` exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z")
    })
}

impl LocalCluster {
    /// Every rank log of job `id` on every node, as (path, text).
    pub fn job_logs(&self, id: &str) -> Vec<(PathBuf, String)> {
        let mut out = Vec::new();
        for node in &self.nodes {
            let dir = node.dir.join("jobs").join(id);
            let Ok(generations) = std::fs::read_dir(&dir) else {
                continue;
            };
            for g in generations.flatten() {
                for f in std::fs::read_dir(g.path()).into_iter().flatten().flatten() {
                    if f.path().extension().is_some_and(|e| e == "log") {
                        let text = std::fs::read_to_string(f.path()).unwrap_or_default();
                        out.push((f.path(), text));
                    }
                }
            }
        }
        out
    }

    /// The lines of job `id`'s rank logs (all nodes) that start with `prefix`.
    pub fn job_log_lines(&self, id: &str, prefix: &str) -> Vec<String> {
        self.job_logs(id)
            .iter()
            .flat_map(|(_, t)| t.lines())
            .filter(|l| l.starts_with(prefix))
            .map(str::to_owned)
            .collect()
    }
}

/// Where cgroup v1's `cpu` controller is mounted.
pub const CGROUP_CPU: &str = "/sys/fs/cgroup/cpu";
/// Period of a [`Throttle`]'s CPU quota, microseconds.
const THROTTLE_PERIOD_US: u32 = 100_000;

/// A real straggler: a cgroup v1 `cpu` group capping every thread of a process at a share
/// of one core; the threads go back to the root group and the group is removed when
/// dropped. Needs root and the controller ([`Throttle::available`]).
pub struct Throttle {
    dir: PathBuf,
    pid: u32,
}

impl Throttle {
    /// Whether cgroup v1's `cpu` controller is there and writable.
    pub fn available() -> bool {
        let probe = Path::new(CGROUP_CPU).join("ringleader-probe");
        let ok = std::fs::create_dir_all(&probe).is_ok();
        let _ = std::fs::remove_dir(&probe);
        ok
    }

    /// Caps process `pid` at `percent` of one core.
    pub fn new(pid: u32, percent: u32) -> Result<Throttle> {
        let dir = Path::new(CGROUP_CPU).join(format!("ringleader-throttle-{pid}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let t = Throttle { dir, pid };
        std::fs::write(
            t.dir.join("cpu.cfs_period_us"),
            THROTTLE_PERIOD_US.to_string(),
        )?;
        let quota = THROTTLE_PERIOD_US / 100 * percent.clamp(1, 100);
        std::fs::write(t.dir.join("cpu.cfs_quota_us"), quota.to_string())?;
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
            let tid = task.file_name().to_string_lossy().into_owned();
            let _ = std::fs::write(t.dir.join("tasks"), tid);
        }
        Ok(t)
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        let root = Path::new(CGROUP_CPU).join("tasks");
        if let Ok(tasks) = std::fs::read_to_string(self.dir.join("tasks")) {
            for tid in tasks.lines() {
                let _ = std::fs::write(&root, tid);
            }
        }
        let _ = std::fs::write(&root, self.pid.to_string());
        let _ = std::fs::remove_dir(&self.dir);
    }
}
