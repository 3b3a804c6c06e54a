//! Emulated hosts for real-process tests: `scripts/netns.sh` namespaces at the addresses
//! `10.77.X.I`, one `ringleader node` in each. Their names and subnet are this test process's
//! own ([`prefix`], [`subnet`]: from its PID), so two test runs on one machine never take
//! each other's hosts. Needs root and `ip netns` ([`usable`]); a test without them prints
//! SKIPPED. Every process is killed by PID and the namespaces removed when [`Hosts`] is
//! dropped, even on failure. Only one test at a time in a process may use them: keep each
//! such test in a test binary of its own.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{atomic::AtomicBool, Arc},
    time::{Duration, Instant},
};

use ringleader::api::{client::ApiClient, status::StatusDoc};

/// Bounded wait of [`Hosts::wait`].
pub const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

fn netns_sh() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/netns.sh")
}

/// This process's namespace names' prefix (`r` and two letters) and subnet (`10.77.X`),
/// both from one number drawn from the PID.
fn run_slot() -> u32 {
    std::process::id() % 250
}

/// The namespaces' prefix: host `i` is namespace `{prefix}{i}`.
pub fn prefix() -> String {
    let slot = run_slot();
    let letter = |n: u32| char::from(b'a' + n as u8);
    format!("r{}{}", letter(slot / 26), letter(slot % 26))
}

/// The hosts' /24, its first three octets.
pub fn subnet() -> String {
    format!("10.77.{}", run_slot())
}

/// Host `i`'s namespace.
pub fn namespace(i: usize) -> String {
    format!("{}{i}", prefix())
}

/// Runs `scripts/netns.sh ARGS` on this process's hosts, asserting it succeeds.
pub fn netns(args: &[&str]) {
    let out = Command::new(netns_sh())
        .env("RL_NETNS_PREFIX", prefix())
        .env("RL_NETNS_SUBNET", subnet())
        .args(args)
        .output()
        .expect("running netns.sh");
    assert!(
        out.status.success(),
        "netns.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether namespaces can be made here: root and `ip netns`.
pub fn usable() -> bool {
    // The effective uid is the second field of the `Uid:` line.
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false);
    let ip = Command::new("ip")
        .args(["netns", "list"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    root && ip
}

/// Host `i` (1-based): its namespace address.
pub fn addr(i: usize) -> String {
    format!("{}.{i}", subnet())
}

/// The address every host of [`Hosts::up_listening_everywhere`] also has.
pub const BRIDGE_ADDR: &str = "172.31.255.1";

/// Where node `i` listens.
fn listen(i: usize, everywhere: bool) -> String {
    if everywhere {
        "0.0.0.0:7070".into()
    } else {
        format!("{}:7070", addr(i))
    }
}

/// The node processes and the namespaces; both are gone when this is dropped.
pub struct Hosts {
    n: usize,
    children: Vec<Child>,
    /// Where the nodes' data directories (`n1`, `n2`, …) are.
    pub dir: tempfile::TempDir,
    /// Set when the hosts go down (a test's background pollers watch it).
    pub stop: Arc<AtomicBool>,
    /// The cluster's admin API token (derived from the key every node is started with).
    pub token: String,
    /// The fingerprint of the nodes' API TLS key (also derived from the key): their APIs on
    /// 10.77.X.I are beyond loopback, so they speak TLS.
    pub tls_pin: ringleader::security::tls::Fingerprint,
}

impl Hosts {
    /// Creates `n` hosts and starts node `n{i}` in host `i` with `extra(i)` arguments
    /// (node 1 alone, the others joining it), each listening on its host's address; `what`
    /// names the temporary directory.
    pub fn up(n: usize, what: &str, extra: impl Fn(usize) -> Vec<String>) -> Hosts {
        Self::start(n, what, false, extra)
    }

    /// As [`Self::up`], but every host also has an interface with the address
    /// [`BRIDGE_ADDR`], the same on each (as a container bridge has), and every node
    /// listens on all of its host's addresses (`0.0.0.0:7070`), so advertises that one too.
    pub fn up_listening_everywhere(n: usize, what: &str) -> Hosts {
        Self::start(n, what, true, |_| Vec::new())
    }

    fn start(
        n: usize,
        what: &str,
        everywhere: bool,
        extra: impl Fn(usize) -> Vec<String>,
    ) -> Hosts {
        netns(&["up", &n.to_string()]);
        let dir = tempfile::Builder::new()
            .prefix(&format!("rl-{what}-"))
            .tempdir()
            .unwrap();
        let key_text = ringleader::cluster::identity::generate_cluster_key();
        let key = ringleader::cluster::identity::parse_cluster_key(&key_text).unwrap();
        let key_file = dir.path().join("cluster.key");
        ringleader::security::modes::write_private(&key_file, key_text.as_bytes()).unwrap();
        let mut hosts = Hosts {
            n,
            children: Vec::new(),
            dir,
            stop: Arc::new(AtomicBool::new(false)),
            token: ringleader::security::bootstrap::admin_token(&key),
            tls_pin: ringleader::security::tls::fingerprint(&key).unwrap(),
        };
        if everywhere {
            for i in 1..=n {
                hosts.add_bridge(i);
            }
        }
        for i in 1..=n {
            let data = hosts.data_dir(i);
            std::fs::create_dir_all(&data).unwrap();
            let log = std::fs::File::create(data.join("node.log")).unwrap();
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", &namespace(i), super::exe(), "node"])
                .args(["--name", &format!("n{i}")])
                .args(["--listen", &listen(i, everywhere)])
                .args(["--api", &format!("{}:7071", addr(i))])
                .arg("--data-dir")
                .arg(&data)
                .arg("--cluster-key")
                .arg(&key_file)
                .args(extra(i));
            if i > 1 {
                cmd.args(["--join", &format!("{}:7070", addr(1))]);
            }
            // `ip netns exec` execs the node: the child's PID is the node's.
            let child = cmd
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("starting a node in its namespace");
            hosts.children.push(child);
        }
        hosts
    }

    /// Gives host `i` an interface (a bridge with no ports) with the address [`BRIDGE_ADDR`].
    fn add_bridge(&self, i: usize) {
        let ns = namespace(i);
        let addr = format!("{BRIDGE_ADDR}/24");
        for args in [
            &["link", "add", "rlbridge0", "type", "bridge"][..],
            &["addr", "add", &addr, "dev", "rlbridge0"],
            &["link", "set", "rlbridge0", "up"],
        ] {
            let out = Command::new("ip")
                .args(["netns", "exec", &ns, "ip"])
                .args(args)
                .output()
                .expect("running ip");
            assert!(out.status.success(), "ip {args:?} in {ns}: {out:?}");
        }
    }

    /// Kills node `i` (SIGKILL, by PID) and reaps it.
    pub fn kill(&mut self, i: usize) {
        let child = &mut self.children[i - 1];
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Node `i`'s data directory.
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("n{i}"))
    }

    /// A client of node `i`'s API (TLS, pinned).
    pub fn client(&self, i: usize) -> ApiClient {
        ApiClient::new(&format!("{}:7071", addr(i)), Some(self.token.clone()))
            .with_tls_pin(Some(self.tls_pin))
    }

    /// Node `i`'s status.
    pub fn status(&self, i: usize) -> anyhow::Result<StatusDoc> {
        self.client(i).status()
    }

    /// Polls the statuses of `hosts` until `cond` holds for each, or panics after [`WAIT`].
    pub fn wait(&self, hosts: &[usize], what: &str, cond: impl Fn(&StatusDoc) -> bool) {
        let start = Instant::now();
        loop {
            let mut last = None;
            for &i in hosts {
                match self.status(i) {
                    Ok(s) if cond(&s) => {}
                    Ok(s) => last = Some(format!("n{i}: {s:?}")),
                    Err(e) => last = Some(format!("n{i}: {e}")),
                }
            }
            let Some(last) = last else {
                eprintln!("{what}: {:.1} s", start.elapsed().as_secs_f64());
                return;
            };
            if start.elapsed() > WAIT {
                panic!(
                    "{what}: not within {WAIT:?}; last view {last}\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// The tails of the node logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for i in 1..=self.n {
            let log =
                std::fs::read_to_string(self.data_dir(i).join("node.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(8).collect();
            out.push_str(&format!("--- n{i}\n"));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new(netns_sh())
            .env("RL_NETNS_PREFIX", prefix())
            .env("RL_NETNS_SUBNET", subnet())
            .arg("down")
            .stdout(Stdio::null())
            .status();
        if std::thread::panicking() {
            // A failed test keeps the whole node logs, not only the tails in its message.
            self.dir.disable_cleanup(true);
            eprintln!("the node logs are kept in {}", self.dir.path().display());
        }
    }
}
