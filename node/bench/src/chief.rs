//! `ringleader-bench chief`: the chief's pure decision and the state's apply at size, with no
//! I/O (a sans-IO benchmark): `members` alive members and `jobs` command jobs of 1 to 4
//! workers. Prints
//!
//! - `apply members=M jobs=J entries=E us_per_entry=…` for the submits and placements that
//!   build the state, and `apply … kind=metric` for metric reports into it;
//! - `decide members=M jobs=J pending=J ms=…` for the one decision that places every job;
//! - `decide members=M jobs=J ms_p50=… ms_p99=…` for the decision over the settled state
//!   (every job running, nothing to do: what the chief runs every period).

use std::time::Instant;

use anyhow::{anyhow, Result};
use clap::Args;
use libp2p::PeerId;

use ringleader::{
    chief,
    cluster::{membership::State, meta::NodeMeta, net::MemberView},
    domain::state::{ops, ControlCommand, ControlResponse, ControlState, Op},
    jobs::JobSpec,
};

/// Benchmark options.
#[derive(Clone, Debug, Args)]
pub struct BenchChiefArgs {
    /// Alive members.
    #[arg(long, default_value_t = 1_000)]
    pub members: usize,
    /// Command jobs.
    #[arg(long, default_value_t = 10_000)]
    pub jobs: usize,
    /// Decisions timed over the settled state.
    #[arg(long, default_value_t = 50)]
    pub runs: usize,
}

/// CPUs each simulated member offers (enough for every job to fit).
const MEMBER_CPUS: u32 = 64;

fn member(i: usize) -> MemberView {
    MemberView {
        id: PeerId::random(),
        incarnation: 0,
        state: State::Alive,
        meta: NodeMeta {
            name: format!("node-{i:05}"),
            p2p_addrs: Vec::new(),
            api_addr: format!("10.0.{}.{}:7071", i / 256, i % 256),
            data_addr: format!("10.0.{}.{}:7072", i / 256, i % 256),
            datasets_addr: format!("10.0.{}.{}:7073", i / 256, i % 256),
            datasets: Vec::new(),
            cpus: MEMBER_CPUS,
            memory_mb: 262_144,
            gpus: Vec::new(),
            labels: Default::default(),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        meta_version: 0,
        state_since_ms: 0,
    }
}

fn apply(state: &mut ControlState, cmd: &ControlCommand) -> Result<()> {
    let index = state.applied_index + 1;
    match state.apply(index, cmd) {
        ControlResponse::Applied | ControlResponse::Submitted { .. } => Ok(()),
        other => Err(anyhow!("{} not applied: {other:?}", index)),
    }
}

/// The `q` quantile (0..=1) of `v`, sorted in place.
fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Runs the benchmark and prints its lines.
pub fn run(args: &BenchChiefArgs) -> Result<()> {
    let (m, j) = (args.members, args.jobs);
    let members: Vec<MemberView> = (0..m).map(member).collect();
    let specs: Vec<JobSpec> = (0..4)
        .map(|w| {
            JobSpec::parse(&format!(
                "name = \"bench\"\nkind = \"command\"\nworkers = {}\ncommand = [\"true\"]\n",
                w + 1
            ))
        })
        .collect::<Result<_, _>>()?;
    let submits: Vec<ControlCommand> = (0..j)
        .map(|i| ControlCommand {
            op: Op::Submit(ops::Submit {
                spec: Box::new(specs[i % specs.len()].clone()),
                token: None,
                owner: ringleader::domain::state::users::admin_user(),
            }),
            at_ms: 1,
        })
        .collect();
    let mut state = ControlState::default();
    let t = Instant::now();
    for cmd in &submits {
        apply(&mut state, cmd)?;
    }
    let submit_s = t.elapsed().as_secs_f64();

    let mut secret = || "ab".repeat(32);
    let t = Instant::now();
    let places = chief::decide(&state, &members, 2, &mut secret);
    println!(
        "decide members={m} jobs={j} pending={} ms={:.1}",
        state.pending().count(),
        t.elapsed().as_secs_f64() * 1e3
    );
    let t = Instant::now();
    for cmd in &places {
        apply(&mut state, cmd)?;
    }
    let place_s = t.elapsed().as_secs_f64();
    let entries = submits.len() + places.len();
    println!(
        "apply members={m} jobs={j} entries={entries} us_per_entry={:.1}",
        (submit_s + place_s) * 1e6 / entries as f64
    );
    let running = state.jobs.values().filter(|x| x.generation == 1).count();
    if running != j {
        return Err(anyhow!("only {running} of {j} jobs were placed"));
    }

    let metrics: Vec<ControlCommand> = state
        .jobs
        .values()
        .map(|job| ControlCommand {
            op: Op::Metric(ops::Metric {
                id: job.id,
                generation: job.generation,
                name: "loss".into(),
                value: 0.5,
                step: Some(1),
            }),
            at_ms: 3,
        })
        .collect();
    let t = Instant::now();
    for cmd in &metrics {
        apply(&mut state, cmd)?;
    }
    println!(
        "apply members={m} jobs={j} entries={} kind=metric us_per_entry={:.1}",
        metrics.len(),
        t.elapsed().as_secs_f64() * 1e6 / metrics.len() as f64
    );

    let mut ms = Vec::with_capacity(args.runs);
    for run in 0..args.runs.max(1) {
        let t = Instant::now();
        let cmds = chief::decide(&state, &members, 4 + run as u64, &mut secret);
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        if !cmds.is_empty() {
            return Err(anyhow!("settled state, yet decide proposed {cmds:?}"));
        }
    }
    println!(
        "decide members={m} jobs={j} ms_p50={:.2} ms_p99={:.2}",
        quantile(&mut ms, 0.5),
        quantile(&mut ms, 0.99)
    );
    Ok(())
}
