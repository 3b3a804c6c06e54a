use super::*;
use crate::domain::spec::JobSpec;
use crate::domain::state::{ControlResponse, JobId};
use crate::status::UsageDoc;

fn submit(state: &mut ControlState, owner: &str, spec: &str) -> JobId {
    let cmd = ControlCommand::new(
        10,
        Op::Submit(ops::Submit {
            spec: Box::new(JobSpec::parse(spec).unwrap()),
            token: None,
            owner: owner.into(),
        }),
    );
    match state.apply(state.applied_index + 1, &cmd) {
        ControlResponse::Submitted { id } => id,
        other => panic!("{other:?}"),
    }
}

fn spec(name: &str, priority: &str, gpus: u32, workers: u32) -> String {
    format!(
        "name = \"{name}\"\nkind = \"command\"\nworkers = {workers}\npriority = \"{priority}\"\n\
         command = [\"true\"]\n[resources]\ngpus_per_worker = {gpus}\n"
    )
}

use crate::domain::state::ops::testing::set_quota;

#[test]
fn the_queue_lists_waiting_jobs_in_start_order_and_quotas_show_use() {
    let mut state = ControlState::default();
    set_quota(
        &mut state,
        "alice",
        Quota {
            cpus: Some(4),
            ..Quota::default()
        },
    );
    let low = submit(&mut state, "alice", &spec("low", "low", 0, 1));
    let high = submit(&mut state, "bob", &spec("high", "high", 0, 1));
    let normal = submit(&mut state, "bob", &spec("normal", "normal", 0, 1));
    let doc = queue_doc(&state, Usage { cpus: 8, gpus: 0 }, 20);
    let ids: Vec<&str> = doc.jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids, [high.to_string(), normal.to_string(), low.to_string()]);
    assert_eq!(doc.jobs[0].position, 1);
    assert_eq!(doc.jobs[2].owner, "alice");
    assert_eq!(doc.jobs[2].priority_label, "low");

    let rows = quota_rows(&state, 20);
    let users: Vec<&str> = rows.iter().map(|r| r.user.as_str()).collect();
    assert_eq!(users, ["alice"], "no use, no quota: no row for bob");
    assert_eq!(rows[0].quota.cpus, Some(4));
    assert_eq!(rows[0].used, UsageDoc::default());
}
