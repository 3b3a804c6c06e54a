//! Elastic training in one process, over the in-memory backend: a lost rank's survivors
//! re-form and go on exactly like a fresh run of the new world from the same commit, and
//! re-form the same way over an NCCL-like device group; a
//! joiner gets the state by broadcast; a rank stopped at a step boundary (a preemption's
//! leaver) costs its peers no step; one stopped while joining ends with its newest commit;
//! survivors blocked on a silent rank leave for the
//! next generation at once; the agreement picks the newest common commit; a
//! stale generation cannot connect; control lines parse or are refused by name.
//!
//! The test plays the node: it reads the workers' events and hands out generations. Every
//! wait has a deadline.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{mpsc as std_mpsc, Arc};
use std::time::{Duration, Instant};

use collective::{Communicator, Limits};
use common::{on_group, runtime};
use tokio::sync::mpsc;
use trainer::elastic::{
    agree, forward_control_lines, generation_channel, parse_control_line, reformable, CommitLog,
    Control, ControlLineError, ElasticEvent, ElasticRun, ElasticSummary, Generation,
    GenerationSource, Holding, MemoryRing, RestoreSource, RingConnector, TcpConnector,
    ABORT_GRACE_MS, GENERATION_LINE_BYTES_MAX,
};
use trainer::{
    DataCursor, DataSpec, Event, ModelSpec, NamedTensor, OptimizerKind, StateMeta,
    SufficientFactors, TrainError, TrainParams, TrainSpec, TrainState, Trainer, STATE_FORMAT,
};

/// Deadline for any one event the test waits for, s.
const EVENT_DEADLINE_S: u64 = 60;
/// Steps of every run.
const TOTAL_STEPS: u64 = 36;
/// Commit cadence, steps.
const COMMIT_EVERY: u64 = 4;

fn spec(optimizer: OptimizerKind) -> TrainSpec {
    let mut s = TrainSpec {
        model: ModelSpec {
            hidden: vec![32],
            ..ModelSpec::default()
        },
        data: DataSpec::default(),
        train: TrainParams {
            epochs: 5,
            max_steps: Some(TOTAL_STEPS),
            batch_per_worker: 16,
            optimizer,
            lr: if optimizer == OptimizerKind::Sgd {
                0.05
            } else {
                0.003
            },
            warmup_epochs: 0.2,
            eval_every_epochs: 0,
            sufficient_factors: SufficientFactors::Auto,
            ..TrainParams::default()
        },
        ..TrainSpec::default()
    };
    s.checkpoint.commit_every_steps = COMMIT_EVERY;
    s.checkpoint.every_steps = 0;
    s
}

fn generation(generation: u64, rank: usize, world: usize) -> Generation {
    Generation {
        generation,
        rank,
        addrs: (0..world)
            .map(|r| SocketAddr::from(([127, 0, 0, 1], 20_000 + r as u16)))
            .collect(),
        secret: "s".into(),
        batch_workers: None,
    }
}

/// What a rank thread reports to the test.
#[derive(Debug)]
struct Report {
    rank_id: usize,
    event: ElasticEvent,
}

/// What becomes of a worker.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fate {
    /// It runs to its end.
    Runs,
    /// Dropped mid-run (like a killed process: its links close) at the first await after
    /// this step.
    KilledAfter(u64),
    /// No longer driven from the first await after this step (like a stopped process or a
    /// dead host: its links stay open and silent) until the test drops [`Worker::release`].
    StoppedAfter(u64),
}

/// One elastic worker on its own thread and runtime.
struct Worker {
    control: mpsc::Sender<Control>,
    handle: std::thread::JoinHandle<Option<ElasticSummary>>,
    /// Dropping it ends a stopped worker (its links close then).
    release: tokio::sync::oneshot::Sender<()>,
}

fn start_worker(
    id: usize,
    spec: &TrainSpec,
    ring: &MemoryRing,
    first: Generation,
    delay: Duration,
    fate: Fate,
    reports: std_mpsc::Sender<Report>,
) -> Worker {
    start_worker_with(id, spec, ring, first, delay, fate, None, reports)
}

/// [`start_worker`], with the run's abort grace when `abort_grace` is set.
#[allow(clippy::too_many_arguments)]
fn start_worker_with(
    id: usize,
    spec: &TrainSpec,
    ring: &MemoryRing,
    first: Generation,
    delay: Duration,
    fate: Fate,
    abort_grace: Option<Duration>,
    reports: std_mpsc::Sender<Report>,
) -> Worker {
    let (control, source) = generation_channel();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let (spec, ring) = (spec.clone(), ring.clone());
    let kill_after = match fate {
        Fate::Runs => None,
        Fate::KilledAfter(s) | Fate::StoppedAfter(s) => Some(s),
    };
    let handle = std::thread::spawn(move || {
        // An NCCL double's waits block the thread while its watchdog runs on the runtime.
        let rt = runtime(ring.gives_nccl_doubles());
        rt.block_on(async move {
            let mut run =
                ElasticRun::new(spec, source, ring).with_faults(trainer::faults::Faults {
                    step_delay: delay,
                    ..Default::default()
                });
            if let Some(g) = abort_grace {
                run = run.with_abort_grace(g);
            }
            let (kill_tx, mut kill_rx) = tokio::sync::oneshot::channel::<()>();
            let mut kill_tx = Some(kill_tx);
            let fut = run.run(first, None, |e| {
                if let (Some(k), ElasticEvent::Train { event, .. }) = (kill_after, e) {
                    if matches!(event, Event::Step(m) if m.step >= k) {
                        if let Some(tx) = kill_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                }
                let _ = reports.send(Report {
                    rank_id: id,
                    event: e.clone(),
                });
            });
            tokio::pin!(fut);
            tokio::select! {
                biased;
                _ = &mut kill_rx => {}
                r = &mut fut => return Some(r.expect("elastic run")),
            }
            if matches!(fate, Fate::StoppedAfter(_)) {
                // Silent: the run is kept, with its links open, but never polled again.
                let _ = released.await;
            }
            None
        })
    });
    Worker {
        control,
        handle,
        release,
    }
}

/// Ranks `0..world` of generation 0, each with `delay` per step, running to their end.
fn start_ring(
    spec: &TrainSpec,
    ring: &MemoryRing,
    world: usize,
    delay: Duration,
    reports: &std_mpsc::Sender<Report>,
) -> Vec<Worker> {
    (0..world)
        .map(|r| {
            start_worker(
                r,
                spec,
                ring,
                generation(0, r, world),
                delay,
                Fate::Runs,
                reports.clone(),
            )
        })
        .collect()
}

/// Waits until `n` ranks have committed step `step`.
fn wait_committed(
    reports: &std_mpsc::Receiver<Report>,
    log: &mut Vec<Report>,
    n: usize,
    step: u64,
) {
    wait_for(reports, log, n, |r| {
        matches!(
            r.event,
            ElasticEvent::Train {
                event: Event::Committed(s),
                ..
            } if s == step
        )
    });
}

/// Each worker's summary once it has finished.
fn finished(workers: Vec<Worker>) -> Vec<ElasticSummary> {
    workers
        .into_iter()
        .map(|w| {
            let end = w.handle.join().unwrap().expect("finished");
            drop(w.control);
            end
        })
        .collect()
}

/// Waits (with a deadline) until `pred` has held for `n` reports; returns those.
fn wait_for(
    reports: &std_mpsc::Receiver<Report>,
    log: &mut Vec<Report>,
    n: usize,
    pred: impl Fn(&Report) -> bool,
) -> Vec<usize> {
    let deadline = std::time::Instant::now() + Duration::from_secs(EVENT_DEADLINE_S);
    let mut hits: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, r)| pred(r))
        .map(|(i, _)| i)
        .collect();
    while hits.len() < n {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let r = reports
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("waiting for {n} events: {e}; seen {log:#?}"));
        if pred(&r) {
            hits.push(log.len());
        }
        log.push(r);
    }
    hits
}

/// The state after `steps` steps of a plain run of `world` ranks.
fn plain_state(spec: &TrainSpec, world: usize, steps: u64) -> TrainState {
    let spec = spec.clone();
    on_group(world, move |c| {
        let spec = spec.clone();
        async move {
            let mut t = Trainer::new(&spec, c)?;
            for _ in 0..steps {
                t.step().await?;
            }
            t.snapshot()
        }
    })
    .into_iter()
    .next()
    .unwrap()
    .unwrap()
}

/// A fresh run of `world` ranks from `state` to the end: each rank's final state and
/// rank 0's losses by step.
fn fresh_from(
    spec: &TrainSpec,
    world: usize,
    state: &TrainState,
) -> (Vec<TrainState>, HashMap<u64, f64>) {
    let (spec, state) = (spec.clone(), Arc::new(state.clone()));
    let out = on_group(world, move |c| {
        let (spec, state) = (spec.clone(), state.clone());
        async move {
            let mut t = Trainer::new(&spec, c)?;
            t.restore(&state)?;
            let mut losses = HashMap::new();
            t.run(None, |e| {
                if let Event::Step(m) = e {
                    losses.insert(m.step, m.loss);
                }
            })
            .await?;
            Ok::<_, TrainError>((t.snapshot()?, losses))
        }
    });
    let mut states = Vec::new();
    let mut losses = HashMap::new();
    for (r, o) in out.into_iter().enumerate() {
        let (s, l) = o.unwrap();
        if r == 0 {
            losses = l;
        }
        states.push(s);
    }
    (states, losses)
}

/// Losses by step that `rank_id` reported in `generation`.
fn losses(log: &[Report], rank_id: usize, generation: u64) -> HashMap<u64, f64> {
    log.iter()
        .filter(|r| r.rank_id == rank_id)
        .filter_map(|r| match &r.event {
            ElasticEvent::Train {
                generation: g,
                event: Event::Step(m),
                ..
            } if *g == generation => Some((m.step, m.loss)),
            _ => None,
        })
        .collect()
}

fn resumed(log: &[Report], rank_id: usize, generation: u64) -> trainer::elastic::Resumed {
    log.iter()
        .find_map(|r| match &r.event {
            ElasticEvent::Resumed(x) if r.rank_id == rank_id && x.generation == generation => {
                Some(x.clone())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("rank {rank_id} never resumed in generation {generation}"))
}

fn assert_same_state(a: &TrainState, b: &TrainState, what: &str) {
    assert_eq!(a.meta.step, b.meta.step, "{what}: step");
    assert_eq!(a.meta.cursor, b.meta.cursor, "{what}: cursor");
    assert_eq!(a.params, b.params, "{what}: parameters (bit-identical)");
    assert_eq!(a.optimizer, b.optimizer, "{what}: optimizer state");
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = v.collect();
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Generation 0 of 3 ranks on `ring`; rank 2 is dropped (killed) during step 11.
fn three_with_rank_2_killed_after_10(
    spec: &TrainSpec,
    ring: &MemoryRing,
    tx: &std_mpsc::Sender<Report>,
) -> Vec<Worker> {
    (0..3)
        .map(|r| {
            let fate = if r == 2 {
                Fate::KilledAfter(10)
            } else {
                Fate::Runs
            };
            start_worker(
                r,
                spec,
                ring,
                generation(0, r, 3),
                Duration::ZERO,
                fate,
                tx.clone(),
            )
        })
        .collect()
}

/// Gives ranks 0 and 1 of `workers` generation 1 of 2 and waits for their ends (and for
/// rank 2, killed, to have none).
fn reform_survivors_of_rank_2(workers: Vec<Worker>) -> Vec<ElasticSummary> {
    for (r, w) in workers.iter().enumerate().take(2) {
        w.control
            .blocking_send(Control::Generation(generation(1, r, 2)))
            .unwrap();
    }
    let mut workers = workers.into_iter();
    let ends = (0..2)
        .map(|_| {
            workers
                .next()
                .unwrap()
                .handle
                .join()
                .unwrap()
                .expect("finished")
        })
        .collect();
    assert!(
        workers.next().unwrap().handle.join().unwrap().is_none(),
        "rank 2 was killed"
    );
    ends
}

/// The issue's point 7: 3 ranks train with commits; rank 2 is lost; the survivors re-form
/// as generation 1 of 2 from their newest common commit and train to the end, bit-identical
/// to a fresh 2-rank run from that commit, with the same losses.
#[test]
fn survivors_of_a_lost_rank_match_a_fresh_run_from_the_commit() {
    let spec = spec(OptimizerKind::Sgd);
    let ring = MemoryRing::new(Limits::default());
    let (tx, rx) = std_mpsc::channel();
    let mut log = Vec::new();
    // Phase 1: generation 0 of 3; rank 2 dies during step 11.
    let workers = three_with_rank_2_killed_after_10(&spec, &ring, &tx);
    // Phase 2: both survivors report the failure, naming rank 2 when they saw it go.
    let failed = wait_for(&rx, &mut log, 2, |r| {
        matches!(r.event, ElasticEvent::Failed { generation: 0, .. })
    });
    let lost: Vec<Option<usize>> = failed
        .iter()
        .map(|&i| match &log[i].event {
            ElasticEvent::Failed { lost_rank, .. } => *lost_rank,
            _ => unreachable!(),
        })
        .collect();
    assert!(lost.contains(&Some(2)), "lost ranks reported: {lost:?}");
    // Phase 3: the node's next generation: the two survivors, same ranks.
    let ends = reform_survivors_of_rank_2(workers);
    drop(tx);
    log.extend(rx.try_iter());

    // Phase 4: the re-form restored the same commit on both, from memory.
    let (r0, r1) = (resumed(&log, 0, 1), resumed(&log, 1, 1));
    let c = r0.restored_step;
    assert_eq!(r1.restored_step, c);
    assert_eq!((r0.world, r0.rank, r1.rank), (2, 0, 1));
    assert_eq!(r0.source, RestoreSource::Memory);
    assert_eq!(r1.source, RestoreSource::Memory);
    // A failed step that changed nothing leaves the last whole step committed (the
    // runner's commit after a failure): step 10, or 11 when rank 2's share of step 11 had
    // left before it was dropped and the survivors completed it.
    assert!((10..=11).contains(&c), "restored {c}");
    assert!(r0.step >= 10 && r0.steps_lost == r0.step - c, "{r0:?}");
    assert_eq!(ends[0].steps_lost, r0.steps_lost);
    assert_eq!(ends[0].reforms, 1);

    // Phase 5: the same as a fresh 2-rank run from the commit (which a plain 3-rank run
    // reproduces bit for bit).
    let commit = plain_state(&spec, 3, c);
    let (fresh, fresh_losses) = fresh_from(&spec, 2, &commit);
    for (r, end) in ends.iter().enumerate() {
        let state = end.state.as_ref().unwrap();
        assert_eq!(state.meta.step, TOTAL_STEPS);
        assert_same_state(state, &fresh[r], &format!("rank {r}"));
    }
    let elastic_losses = losses(&log, 0, 1);
    assert_eq!(elastic_losses.len() as u64, TOTAL_STEPS - c);
    for (step, loss) in &elastic_losses {
        assert_eq!(Some(loss), fresh_losses.get(step), "loss at step {step}");
    }
    // Loss keeps falling across the re-form.
    let before = losses(&log, 0, 0);
    let early = mean((1..=4).map(|s| before[&s]));
    let late = mean((TOTAL_STEPS - 3..=TOTAL_STEPS).map(|s| elastic_losses[&s]));
    assert!(late < early * 0.7, "loss {early} -> {late}");
}

/// The same loss over an NCCL-like device group ([`collective::NcclDouble`]: work completes
/// on enqueue, a lost peer blocks the wait instead of failing it): the survivors' waits end
/// only by their watchdogs' abort, which names rank 2; they report the loss, drop (abort)
/// the blocked group instead of waiting on it, re-form as generation 1 of 2 with a new
/// group, lose no step beyond the one cut short, and end it normally (barrier, finalize).
#[test]
fn survivors_of_a_lost_rank_reform_over_an_nccl_like_device_group() {
    let spec = spec(OptimizerKind::Sgd);
    let ring = MemoryRing::new(Limits::default()).with_nccl_doubles();
    let (tx, rx) = std_mpsc::channel();
    let mut log = Vec::new();
    // Phase 1: generation 0 of 3 over the doubles; rank 2 dies during step 11.
    let workers = three_with_rank_2_killed_after_10(&spec, &ring, &tx);
    // Phase 2: both survivors' blocked waits end; they report the failure naming rank 2.
    let failed = wait_for(&rx, &mut log, 2, |r| {
        matches!(r.event, ElasticEvent::Failed { generation: 0, .. })
    });
    for &i in &failed {
        match &log[i].event {
            ElasticEvent::Failed { lost_rank, .. } => {
                assert_eq!(*lost_rank, Some(2), "{:?}", log[i])
            }
            _ => unreachable!(),
        }
    }
    // Phase 3: the next generation, the two survivors, each with a new device group.
    let ends = reform_survivors_of_rank_2(workers);
    drop(tx);
    log.extend(rx.try_iter());
    // Phase 4: both restored the same whole commit from memory and trained to the end.
    let (r0, r1) = (resumed(&log, 0, 1), resumed(&log, 1, 1));
    assert_eq!(r0.restored_step, r1.restored_step);
    assert_eq!(r0.source, RestoreSource::Memory);
    let c = r0.restored_step;
    assert!((10..=11).contains(&c), "restored {c}");
    assert!(r0.steps_lost <= 1, "{r0:?}");
    for end in &ends {
        assert_eq!(end.reforms, 1);
        assert_eq!(end.state.as_ref().unwrap().meta.step, TOTAL_STEPS);
    }
    // The group averages as the ring does: the survivors hold the same parameters.
    assert_same_state(
        ends[0].state.as_ref().unwrap(),
        ends[1].state.as_ref().unwrap(),
        "ranks 0 and 1",
    );
}

/// A joiner: 2 ranks become 3 while healthy; the new rank, with no state, receives the
/// agreed commit by broadcast; all three equal a fresh 3-rank run from that commit.
#[test]
fn a_joiner_gets_the_state_by_broadcast_and_matches_a_fresh_run() {
    let spec = spec(OptimizerKind::Adamw);
    let ring = MemoryRing::new(Limits::default());
    let (tx, rx) = std_mpsc::channel();
    let mut log = Vec::new();
    // Slow steps, so the run is far from its end when the new generation arrives.
    let delay = Duration::from_millis(20);
    let mut workers = start_ring(&spec, &ring, 2, delay, &tx);
    wait_committed(&rx, &mut log, 2, 8);
    for (r, w) in workers.iter().enumerate() {
        w.control
            .blocking_send(Control::Generation(generation(1, r, 3)))
            .unwrap();
    }
    workers.push(start_worker(
        2,
        &spec,
        &ring,
        generation(1, 2, 3),
        delay,
        Fate::Runs,
        tx.clone(),
    ));
    let ends = finished(workers);
    drop(tx);
    log.extend(rx.try_iter());

    let joined: Vec<_> = (0..3).map(|r| resumed(&log, r, 1)).collect();
    let c = joined[0].restored_step;
    assert!(c >= 8, "restored {c}");
    for (r, j) in joined.iter().enumerate() {
        assert_eq!((j.restored_step, j.world, j.rank), (c, 3, r), "{j:?}");
    }
    assert_eq!(joined[2].source, RestoreSource::Broadcast);
    assert_eq!(joined[0].source, RestoreSource::Memory);
    let commit = plain_state(&spec, 2, c);
    let (fresh, fresh_losses) = fresh_from(&spec, 3, &commit);
    for (r, end) in ends.iter().enumerate() {
        assert_same_state(end.state.as_ref().unwrap(), &fresh[r], &format!("rank {r}"));
    }
    for (step, loss) in losses(&log, 2, 1) {
        assert_eq!(
            Some(&loss),
            fresh_losses.get(&step),
            "joiner's loss at {step}"
        );
    }
}

/// A preemption's shrink: rank 2 is told to stop (it leaves at its step boundary) and
/// only then do ranks 0 and 1 get generation 1 without it. The leaver ends its ring
/// without an abort (its peers may still be reading the step's last frames), so the
/// survivors lose no step: they restore from memory the step the leaver stopped at.
#[test]
fn a_rank_stopped_at_a_step_boundary_costs_its_peers_no_step() {
    let spec = spec(OptimizerKind::Adamw);
    let ring = MemoryRing::new(Limits::default());
    let (tx, rx) = std_mpsc::channel();
    let mut log = Vec::new();
    let mut workers = start_ring(&spec, &ring, 3, Duration::from_millis(20), &tx);
    wait_committed(&rx, &mut log, 3, 8);
    let leaver = workers.pop().unwrap();
    leaver.control.blocking_send(Control::Stop).unwrap();
    let left = leaver.handle.join().unwrap().expect("stopped");
    assert!(left.step >= 8 && left.step < TOTAL_STEPS, "{left:?}");
    for (r, w) in workers.iter().enumerate() {
        w.control
            .blocking_send(Control::Generation(generation(1, r, 2)))
            .unwrap();
    }
    let ends = finished(workers);
    drop(tx);
    log.extend(rx.try_iter());
    for (r, end) in ends.iter().enumerate() {
        let j = resumed(&log, r, 1);
        assert_eq!(j.source, RestoreSource::Memory, "{j:?}");
        assert_eq!(
            (j.restored_step, j.steps_lost),
            (left.step, 0),
            "rank {r} restores the step the leaver stopped at: {j:?}"
        );
        assert_eq!(end.steps_lost, 0, "{end:?}");
    }
}

/// A source whose next generation is already waiting (`pending`) while its watcher never
/// fires: what a worker sees when a join fails in the instant a newer generation arrives
/// (a peer that left for it closed its links).
struct AlreadyWaiting(Option<Generation>);

impl GenerationSource for AlreadyWaiting {
    async fn next(
        &mut self,
        after: u64,
    ) -> Result<Option<Generation>, trainer::elastic::ElasticError> {
        Ok(self.0.take().filter(|g| g.generation > after))
    }

    fn pending(&mut self, after: u64) -> Option<Control> {
        self.0
            .take()
            .filter(|g| g.generation > after)
            .map(Control::Generation)
    }

    async fn arrived(&mut self, _: u64) {
        std::future::pending().await
    }
}

/// Rank 0 of a generation of 2 whose peer never comes fails its join (the agreement's
/// deadline) while generation 1 (itself alone) already waits: the failed join is the
/// superseded generation's end, not a loss to report, and it trains on in generation 1.
/// Before, it reported generation 0 failed.
#[test]
fn a_join_that_fails_once_a_newer_generation_waits_is_not_reported() {
    let ring = MemoryRing::new(Limits {
        connect_timeout_ms: 300,
        op_timeout_ms: 300,
        ..Limits::for_test()
    });
    let mut events = Vec::new();
    let end = runtime(false)
        .block_on(async {
            ElasticRun::new(
                spec(OptimizerKind::Sgd),
                AlreadyWaiting(Some(generation(1, 0, 1))),
                ring,
            )
            .run(generation(0, 0, 2), None, |e| events.push(e.clone()))
            .await
        })
        .expect("ran");
    let failed: Vec<&ElasticEvent> = events
        .iter()
        .filter(|e| matches!(e, ElasticEvent::Failed { .. }))
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
    assert_eq!(end.generation, 1);
    assert!(end.finished.is_some(), "{end:?}");
}

/// A requeue while a re-form never formed: ranks 0 and 1 leave generation 0 for
/// generation 1, rank 1 is stopped before it joins, and rank 0 (its generation's ops time
/// out) is stopped too. Its run still ends with the state it reached, its newest commit,
/// for the requeue's checkpoint (before, none: the retry went back to the last periodic
/// checkpoint).
#[test]
fn a_rank_stopped_while_joining_ends_with_its_newest_commit() {
    let limits = Limits {
        op_timeout_ms: 2_000,
        connect_timeout_ms: 2_000,
        ..Limits::default()
    };
    let (peer_end, end, _) = stop_peer_then_rank0_joining(OptimizerKind::Adamw, limits, 8);
    assert!(end.finished.is_none(), "{end:?}");
    let state = end.state.as_ref().expect("its newest commit");
    assert!(
        state.meta.step >= 8 && state.meta.step <= end.step,
        "{:?} at step {}",
        state.meta,
        end.step
    );
    assert_eq!(
        state.meta.step, peer_end.step,
        "the step both ranks completed"
    );
}

/// A generation whose peer never comes (its rank was stopped: a requeue) holds its rank in
/// the join (the connect over TCP; here, in memory, the agreement's first exchange) until
/// the deadline, unless a newer generation or a stop ends the join: the stop ends it at
/// once, long before [`NEVER_COMES_MS`].
#[test]
fn a_stop_ends_a_join_whose_peer_never_comes() {
    let limits = Limits {
        connect_timeout_ms: NEVER_COMES_MS,
        op_timeout_ms: NEVER_COMES_MS,
        ..Limits::for_test()
    };
    let (_, end, took) = stop_peer_then_rank0_joining(OptimizerKind::Sgd, limits, 4);
    assert!(
        took < Duration::from_millis(NEVER_COMES_MS / 4),
        "the stop waited for the join's deadline: {took:?}"
    );
    assert!(end.finished.is_none(), "{end:?}");
    assert!(
        end.state.is_some(),
        "it ends with its newest commit: {end:?}"
    );
}

/// A ring of 2 on `limits` commits step `committed`; rank 1 is stopped (its end returned
/// first); rank 0 is given generation 1 (rank 1 will never join it) and then stopped. Also
/// returns how long rank 0 took to end after its stop.
fn stop_peer_then_rank0_joining(
    optimizer: OptimizerKind,
    limits: Limits,
    committed: u64,
) -> (ElasticSummary, ElasticSummary, Duration) {
    let spec = spec(optimizer);
    let ring = MemoryRing::new(limits);
    let (tx, rx) = std_mpsc::channel();
    let mut log = Vec::new();
    let mut workers = start_ring(&spec, &ring, 2, Duration::from_millis(20), &tx);
    wait_committed(&rx, &mut log, 2, committed);
    let peer = workers.pop().unwrap();
    peer.control.blocking_send(Control::Stop).unwrap();
    let peer_end = peer.handle.join().unwrap().expect("stopped");
    let rank0 = workers.pop().unwrap();
    rank0
        .control
        .blocking_send(Control::Generation(generation(1, 0, 2)))
        .unwrap();
    rank0.control.blocking_send(Control::Stop).unwrap();
    let asked = Instant::now();
    let end = rank0.handle.join().unwrap().expect("stopped");
    (peer_end, end, asked.elapsed())
}

/// The connect and operation deadlines in [`a_stop_ends_a_join_whose_peer_never_comes`],
/// ms: a stop that waited for them would take minutes.
const NEVER_COMES_MS: u64 = 120_000;

/// Wall-time bound on the survivors' whole recovery from a silent rank, s: far below the
/// collective's op timeout in the test ([`SILENT_OP_TIMEOUT_MS`]), which is all that would
/// end the blocked step without the abort (the in-memory transport has no silence bound).
const SILENT_RECOVERY_S: u64 = 15;
/// The op timeout while a rank is silent, ms.
const SILENT_OP_TIMEOUT_MS: u64 = 60_000;

/// Rank 2 goes silent (no longer driven, links open: a stopped process or a dead host),
/// so ranks 0 and 1 block inside a step's allreduce. Generation 1 (ranks 0 and 1) arrives
/// on their control channels: each aborts its blocked step after the abort grace, reports
/// no failure (nobody is known lost: the generation was superseded), and both restore
/// their newest common commit from memory and finish, well before the op timeout.
#[test]
fn survivors_blocked_on_a_silent_rank_leave_for_a_newer_generation_at_once() {
    let mut silent = SilentThird::start(None);
    let sent = Instant::now();
    silent.send_generation_1();
    silent.wait_resumed();
    let recovered = sent.elapsed();
    println!(
        "survivors resumed generation 1 after {recovered:?} (abort grace {ABORT_GRACE_MS} ms)"
    );
    let (log, ends) = silent.finish(sent + Duration::from_secs(SILENT_RECOVERY_S));
    let finished = sent.elapsed();
    assert!(
        finished < Duration::from_secs(SILENT_RECOVERY_S),
        "finished {finished:?} after generation 1 was sent"
    );
    assert_left_without_loss(&log, &ends);
}

/// As above, but the silent rank's links close (its process dies) after generation 1 has
/// arrived and before the survivors' abort grace ends: their blocked step fails with
/// `PeerLost` instead of `Aborted`. That is the superseded generation's end too, not a
/// loss to report (the node refuses one against an older generation, and a rank that a
/// peer saw leave first would be named lost although it lives: the same happens when a
/// peer's abort closes its links before its abort frame arrives). Before, the survivors
/// reported rank 2 lost in generation 0.
#[test]
fn a_peer_lost_after_a_newer_generation_arrived_is_not_reported() {
    let silent = SilentThird::start(Some(Duration::from_millis(NEVER_COMES_MS)));
    let sent = Instant::now();
    silent.send_generation_1();
    // Each survivor's watcher has taken generation 1 off its channel (the step is now
    // superseded) when the channel's room is back.
    let deadline = sent + Duration::from_secs(EVENT_DEADLINE_S);
    while silent
        .workers
        .iter()
        .take(2)
        .any(|w| w.control.capacity() < w.control.max_capacity())
    {
        assert!(Instant::now() < deadline, "generation 1 never taken");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (log, ends) = silent.finish(deadline);
    assert_left_without_loss(&log, &ends);
}

/// Three ranks of generation 0; rank 2 goes silent after step [`SilentThird::AFTER`] (in
/// the compute delay of the next step, before any of its gradients leave), so ranks 0 and
/// 1 block inside that step's allreduce.
struct SilentThird {
    workers: Vec<Worker>,
    tx: std_mpsc::Sender<Report>,
    rx: std_mpsc::Receiver<Report>,
    log: Vec<Report>,
}

impl SilentThird {
    const AFTER: u64 = 6;

    /// Starts the ring (the survivors with `abort_grace`, else the default) and returns
    /// once the survivors have reported step [`Self::AFTER`]. Nothing between that report
    /// and the start of the next step yields, so a watcher cannot see a generation sent
    /// now before that step starts: the survivors leave from inside the blocked step, not
    /// at a step boundary.
    fn start(abort_grace: Option<Duration>) -> Self {
        let spec = spec(OptimizerKind::Sgd);
        let ring = MemoryRing::new(Limits {
            op_timeout_ms: SILENT_OP_TIMEOUT_MS,
            ..Limits::for_test()
        });
        let (tx, rx) = std_mpsc::channel();
        let workers: Vec<Worker> = (0..3)
            .map(|r| {
                let (fate, delay, grace) = if r == 2 {
                    (
                        Fate::StoppedAfter(Self::AFTER),
                        Duration::from_millis(1),
                        None,
                    )
                } else {
                    (Fate::Runs, Duration::ZERO, abort_grace)
                };
                start_worker_with(
                    r,
                    &spec,
                    &ring,
                    generation(0, r, 3),
                    delay,
                    fate,
                    grace,
                    tx.clone(),
                )
            })
            .collect();
        let mut silent = SilentThird {
            workers,
            tx,
            rx,
            log: Vec::new(),
        };
        wait_for(&silent.rx, &mut silent.log, 2, |r| {
            r.rank_id < 2
                && matches!(
                    r.event,
                    ElasticEvent::Train {
                        generation: 0,
                        event: Event::Step(ref m),
                        ..
                    } if m.step == Self::AFTER
                )
        });
        silent
    }

    /// The node's next generation, the two survivors.
    fn send_generation_1(&self) {
        for (r, w) in self.workers.iter().enumerate().take(2) {
            w.control
                .blocking_send(Control::Generation(generation(1, r, 2)))
                .unwrap();
        }
    }

    fn wait_resumed(&mut self) {
        wait_for(
            &self.rx,
            &mut self.log,
            2,
            |r| matches!(r.event, ElasticEvent::Resumed(ref x) if x.generation == 1),
        );
    }

    /// Ends the silent rank (its links close: nobody may still listen), waits for the
    /// survivors to finish by `deadline`, and returns every report and their ends.
    fn finish(mut self, deadline: Instant) -> (Vec<Report>, Vec<ElasticSummary>) {
        let silent = self.workers.pop().unwrap();
        drop(silent.release);
        assert!(
            silent.handle.join().unwrap().is_none(),
            "rank 2 was stopped"
        );
        let mut log = self.log;
        let ends: Vec<ElasticSummary> = self
            .workers
            .into_iter()
            .map(|w| {
                while !w.handle.is_finished() {
                    assert!(
                        Instant::now() < deadline,
                        "survivors still running: {log:#?}"
                    );
                    if let Ok(r) = self.rx.recv_timeout(Duration::from_millis(50)) {
                        log.push(r);
                    }
                }
                w.handle.join().unwrap().expect("finished")
            })
            .collect();
        drop(self.tx);
        log.extend(self.rx.try_iter());
        (log, ends)
    }
}

/// No failure reported (the step was left for the newer generation), the newest common
/// commit restored from memory, and the run finished.
fn assert_left_without_loss(log: &[Report], ends: &[ElasticSummary]) {
    let failures: Vec<&Report> = log
        .iter()
        .filter(|r| matches!(r.event, ElasticEvent::Failed { .. }))
        .collect();
    assert!(failures.is_empty(), "failures reported: {failures:#?}");
    let (r0, r1) = (resumed(log, 0, 1), resumed(log, 1, 1));
    assert_eq!((r0.world, r0.rank, r1.rank), (2, 0, 1));
    assert_eq!(r0.source, RestoreSource::Memory);
    assert_eq!(r1.source, RestoreSource::Memory);
    assert_eq!(r0.restored_step, r1.restored_step);
    // The step left changed nothing, so the survivors committed the one before it when
    // they left (not only their periodic commit): no step lost.
    let silent_after = SilentThird::AFTER;
    assert_eq!(r0.restored_step, silent_after);
    assert_eq!((r0.step, r0.steps_lost), (silent_after, 0), "{r0:?}");
    let last_step_0 = log
        .iter()
        .filter_map(|r| match &r.event {
            ElasticEvent::Train {
                generation: 0,
                event: Event::Step(m),
                ..
            } => Some(m.step),
            _ => None,
        })
        .max();
    assert_eq!(
        last_step_0,
        Some(silent_after),
        "a step after the silence completed"
    );
    for (r, end) in ends.iter().enumerate() {
        assert_eq!(end.reforms, 1, "rank {r}");
        let state = end.state.as_ref().unwrap();
        assert_eq!(state.meta.step, TOTAL_STEPS, "rank {r}");
    }
    assert_same_state(
        ends[0].state.as_ref().unwrap(),
        ends[1].state.as_ref().unwrap(),
        "ranks 0 and 1",
    );
}

fn synthetic(step: u64, v: f32) -> Arc<TrainState> {
    Arc::new(TrainState {
        meta: StateMeta {
            format: STATE_FORMAT,
            step,
            epoch: 0,
            cursor: DataCursor {
                epoch: 0,
                offset: step as usize,
            },
            rng: step,
            world: 3,
            optimizer: OptimizerKind::Sgd,
            optimizer_steps: step,
            arch: trainer::Arch::Mlp,
            num_params: 2,
            metrics: HashMap::new(),
        },
        params: vec![NamedTensor {
            name: "w".into(),
            shape: vec![2],
            data: vec![v, step as f32],
        }],
        optimizer: vec![],
    })
}

fn log_of(states: &[Arc<TrainState>]) -> CommitLog {
    let mut log = CommitLog::new(3);
    for s in states {
        log.push(s.clone());
    }
    log
}

/// Runs [`agree`] on an in-memory group, rank `r` holding `holdings[r]` (commits, last
/// generation, step reached); returns (restored step, source, the state's first value).
fn agree_on(
    holdings: Vec<(Vec<Arc<TrainState>>, Option<u64>, u64)>,
) -> Vec<(Option<u64>, RestoreSource, Option<f32>, u64)> {
    let world = holdings.len();
    let holdings = Arc::new(holdings);
    on_group(world, move |mut c: Communicator| {
        let holdings = holdings.clone();
        async move {
            let (states, last, reached) = &holdings[c.rank()];
            let log = log_of(states);
            let h = Holding {
                log: &log,
                last_generation: *last,
                step_reached: *reached,
            };
            let a = agree(&mut c, h).await.unwrap();
            // The communicator is returned, so that it is dropped only when every rank is
            // done: a closed link fails a peer's operation still in flight.
            let got = (
                a.state.as_ref().map(|s| s.meta.step),
                a.source,
                a.state.as_ref().map(|s| s.params[0].data[0]),
                a.group_step,
            );
            (got, c)
        }
    })
    .into_iter()
    .map(|(got, _)| got)
    .collect()
}

/// The agreement restores the newest commit every holder has, moves it to those that lack
/// it, ignores ranks that missed a generation, and says when nobody holds anything.
#[test]
fn agreement_picks_the_newest_common_commit() {
    use RestoreSource::{Broadcast, Fresh, Memory};
    let s = |step| synthetic(step, 1.0);
    // Rank 0 committed once more than rank 1; rank 2 is a joiner.
    let got = agree_on(vec![
        (vec![s(4), s(8), s(12)], Some(0), 13),
        (vec![s(4), s(8)], Some(0), 12),
        (vec![], None, 0),
    ]);
    assert_eq!(
        got,
        vec![
            (Some(8), Memory, Some(1.0), 13),
            (Some(8), Memory, Some(1.0), 13),
            (Some(8), Broadcast, Some(1.0), 13),
        ]
    );
    // Rank 1 missed generation 1: its commit at 8 is another history (value 2), ignored.
    let got = agree_on(vec![
        (vec![synthetic(8, 1.0)], Some(1), 9),
        (vec![synthetic(8, 2.0), synthetic(12, 2.0)], Some(0), 12),
    ]);
    assert_eq!(
        got,
        vec![
            (Some(8), Memory, Some(1.0), 12),
            (Some(8), Broadcast, Some(1.0), 12)
        ]
    );
    // No step in common: the newest anyone holds.
    let got = agree_on(vec![
        (vec![s(12), s(16)], Some(0), 17),
        (vec![s(4), s(8)], Some(0), 9),
    ]);
    assert_eq!(got[0].0, Some(16));
    assert_eq!((got[1].0, got[1].1), (Some(16), Broadcast));
    // Nobody holds anything: the caller falls back to the checkpoint or a fresh start.
    let got = agree_on(vec![(vec![], None, 0), (vec![], None, 0)]);
    assert_eq!(got, vec![(None, Fresh, None, 0), (None, Fresh, None, 0)]);
}

/// A rank still configured for generation 0 cannot join generation 1: the handshake
/// refuses it, both sides fail to connect (a re-formable error: they wait for the next
/// generation). The collective's own test covers the refusal frame by frame
/// (`collective/tests/tcp.rs`, `handshake_refuses_wrong_secret_and_stale_generation`).
#[tokio::test]
async fn a_stale_generation_cannot_connect() {
    let addrs: Vec<SocketAddr> = (0..2)
        .map(|_| SocketAddr::from(([127, 0, 0, 1], collective::testing::unused_local_port())))
        .collect();
    let limits = Limits {
        connect_timeout_ms: 1_500,
        ..Limits::for_test()
    };
    let mut connector = TcpConnector {
        group_id: 9,
        limits,
    };
    let g = |generation, rank| Generation {
        generation,
        rank,
        addrs: addrs.clone(),
        secret: "s".into(),
        batch_workers: None,
    };
    let mut other = connector.clone();
    let (new, stale) = (g(1, 0), g(0, 1));
    let (a, b) = tokio::join!(connector.connect(&new), other.connect(&stale));
    for r in [a, b] {
        let e = r.expect_err("a stale generation must not connect");
        assert!(reformable(&e), "{e}");
    }
}

#[test]
fn control_lines_parse_or_are_refused_by_name() {
    let g = generation(3, 1, 2);
    assert_eq!(
        parse_control_line(&g.to_line()),
        Ok(Control::Generation(g.clone()))
    );
    let line = r#"ringleader-generation {"generation":1,"rank":0,"addrs":["127.0.0.1:20001","127.0.0.1:20002"],"secret":"ab12"}"#;
    let Ok(Control::Generation(p)) = parse_control_line(line) else {
        panic!("documented example refused");
    };
    assert_eq!(
        (p.generation, p.rank, p.world(), p.secret.as_str()),
        (1, 0, 2, "ab12")
    );
    assert_eq!(parse_control_line("ringleader-stop\n"), Ok(Control::Stop));

    let err = |l: &str| parse_control_line(l).unwrap_err();
    assert!(matches!(err("hello"), ControlLineError::Unknown(_)));
    assert!(matches!(
        err("ringleader-generationx {}"),
        ControlLineError::Unknown(_)
    ));
    let e = err(r#"ringleader-generation {"generation":1,"rank":0,"addrs":[]}"#);
    assert!(e.to_string().contains("secret"), "{e}");
    let e =
        err(r#"ringleader-generation {"generation":1,"rank":0,"addrs":["nowhere"],"secret":""}"#);
    assert!(matches!(e, ControlLineError::Json(_)), "{e}");
    let e = err(
        r#"ringleader-generation {"generation":1,"rank":2,"addrs":["127.0.0.1:1","127.0.0.1:2"],"secret":""}"#,
    );
    assert!(e.to_string().contains("rank 2 of 2"), "{e}");
    let e = err(
        r#"ringleader-generation {"generation":1,"rank":0,"addrs":["127.0.0.1:1"],"secret":"","x":1}"#,
    );
    assert!(e.to_string().contains("unknown field"), "{e}");
    let huge = format!(
        "ringleader-generation {}",
        " ".repeat(GENERATION_LINE_BYTES_MAX)
    );
    assert!(matches!(
        err(&huge),
        ControlLineError::TooLong {
            max: GENERATION_LINE_BYTES_MAX,
            ..
        }
    ));

    // A stream: bad and oversized lines are skipped, the end of input is a stop.
    let text = format!(
        "{}\ngarbage\n{huge}\n{}\n",
        g.to_line(),
        generation(4, 0, 1).to_line()
    );
    let (tx, mut source) = generation_channel();
    forward_control_lines(std::io::Cursor::new(text), tx);
    assert_eq!(
        source.pending(0),
        Some(Control::Stop),
        "a stop wins over pending generations"
    );
    // Waiting reads the queued generations first, newer than asked only, then the end.
    let (tx, mut source) = generation_channel();
    let lines = format!("{}\n{}\n", generation(4, 0, 1).to_line(), g.to_line());
    forward_control_lines(std::io::Cursor::new(lines), tx);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        assert_eq!(source.next(0).await.unwrap().map(|g| g.generation), Some(4));
        // Generation 3 is older than 4: skipped; then the end of input.
        assert_eq!(source.next(4).await.unwrap(), None);
    });
}

/// A state restored into a bigger world whose global batch no longer fits in the rest of
/// the epoch starts the next epoch; the step budget and the learning-rate schedule are
/// those of the new world from the restored step on.
#[test]
fn restoring_into_another_world_rebases_cursor_budget_and_schedule() {
    let mut spec = spec(OptimizerKind::Sgd);
    spec.train.max_steps = None;
    spec.train.epochs = 2;
    // World 2, batch 16: 46 steps per epoch over the 1500 digits; after 45 the cursor is
    // at 1440, where a world-4 global batch of 64 no longer fits.
    let state = Arc::new(plain_state(&spec, 2, 45));
    assert_eq!(
        state.meta.cursor,
        DataCursor {
            epoch: 0,
            offset: 1440
        }
    );
    let s = spec.clone();
    let got = on_group(4, move |c| {
        let (spec, state) = (s.clone(), state.clone());
        async move {
            let mut t = Trainer::new(&spec, c)?;
            t.restore(&state)?;
            let (cursor, total) = (t.cursor(), t.total_steps());
            let m = t.step().await?;
            // A commit of this world-4 run restored into world 4 again keeps its budget.
            let commit = t.commit()?;
            let mut again = Trainer::new(&spec, t.into_communicator().await?)?;
            again.restore(&commit)?;
            Ok::<_, TrainError>((cursor, total, m.lr, again.total_steps()))
        }
    });
    let (cursor, total, lr, total_again) = *got[0].as_ref().unwrap();
    assert_eq!(total_again, total, "not 2 × 23 from the step count alone");
    assert_eq!(
        cursor,
        DataCursor {
            epoch: 1,
            offset: 0
        }
    );
    // 23 steps of 64 in the last epoch.
    assert_eq!(total, 45 + 23);
    let schedule = trainer::LrSchedule::new(&spec.train, 4, 23, 68);
    assert_eq!(lr, schedule.lr(45));
    assert!(schedule.peak() == 4.0 * spec.train.lr);
}

/// Training a step again after a re-form rewrites its checkpoint: the new one loads.
#[test]
fn a_checkpoint_of_the_same_step_is_rewritten_whole() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = trainer::CheckpointStore::from_url("memory://", "job-e").unwrap();
        store.write(&synthetic(12, 1.0)).await.unwrap();
        store.write(&synthetic(12, 2.0)).await.unwrap();
        let back = store.load_latest().await.unwrap().unwrap();
        assert_eq!(back.params, synthetic(12, 2.0).params);
    });
}
