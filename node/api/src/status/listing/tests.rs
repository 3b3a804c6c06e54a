use super::*;

/// Members and jobs of the size issue 27 names.
const MEMBERS_AT_SIZE: usize = 1_000;
const JOBS_AT_SIZE: usize = 10_000;

#[test]
fn a_small_cluster_gets_its_whole_lists_and_a_summary() {
    let (mut doc, s) = synthetic(3, 5);
    page_status(&mut doc, &s, &StatusQuery::default()).unwrap();
    assert_eq!(doc.members.len(), 3);
    let ids: Vec<&str> = doc.jobs.iter().map(|j| j.id.as_str()).collect();
    let all: Vec<String> = s.jobs.keys().map(|id| id.to_string()).collect();
    assert_eq!(ids, all, "every job, oldest first");
    let sum = doc.summary.unwrap();
    assert_eq!((sum.members_total, sum.jobs_total), (3, 5));
    assert_eq!(sum.members_next, None);
    assert_eq!(sum.jobs_next, None);
    assert_eq!(sum.jobs_by_state["succeeded"], 5);
}

#[test]
fn at_size_the_lists_are_bounded_and_the_summary_counts_everything() {
    let (mut doc, s) = synthetic(MEMBERS_AT_SIZE, JOBS_AT_SIZE);
    page_status(&mut doc, &s, &StatusQuery::default()).unwrap();
    assert_eq!(doc.members.len(), STATUS_ROWS_DEFAULT);
    assert_eq!(doc.jobs.len(), STATUS_ROWS_DEFAULT);
    let sum = doc.summary.clone().unwrap();
    assert_eq!(sum.members_total, MEMBERS_AT_SIZE);
    assert_eq!(
        sum.members_by_state.values().sum::<usize>(),
        MEMBERS_AT_SIZE
    );
    assert_eq!(sum.members_by_state["suspect"], 10);
    assert_eq!(sum.members_by_state["dead"], 10);
    assert_eq!(sum.jobs_total, JOBS_AT_SIZE);
    assert_eq!(sum.jobs_by_state["running"], 500);
    // The newest jobs, oldest first; the cursor is the oldest listed.
    let newest = s.jobs.keys().next_back().unwrap().to_string();
    assert_eq!(doc.jobs.last().unwrap().id, newest);
    assert_eq!(sum.jobs_next.as_deref(), Some(doc.jobs[0].id.as_str()));
    assert_eq!(sum.members_next.as_deref(), Some("m00499"));
    let table = doc.to_table();
    assert!(
        table.contains("members: 1000 (alive 980, suspect 10, dead 10)"),
        "{table}"
    );
    assert!(table.contains("... more members after m00499"), "{table}");
    assert!(table.contains("older jobs before"), "{table}");
}

#[test]
fn pages_walk_every_job_once_and_filters_apply() {
    let (_, s) = synthetic(0, 1_234);
    let mut seen = Vec::new();
    let mut before = None;
    loop {
        let q = JobsQuery {
            limit: Some(100),
            before: before.clone(),
            ..Default::default()
        };
        let (page, next) = jobs(&s, &q).unwrap();
        seen.splice(0..0, page.into_iter().map(|j| j.id));
        match next {
            Some(n) => before = Some(n),
            None => break,
        }
    }
    let all: Vec<String> = s.jobs.keys().map(|id| id.to_string()).collect();
    assert_eq!(seen, all);

    let (mut doc, s) = synthetic(200, 2_000);
    let q = StatusQuery {
        member_state: Some("dead".into()),
        job_state: Some("running".into()),
        limit: Some(10_000),
        ..Default::default()
    };
    page_status(&mut doc, &s, &q).unwrap();
    assert_eq!(doc.members.len(), 2);
    assert!(doc.members.iter().all(|m| m.state == "dead"));
    // The capacity counts every alive member (196 of 8 cpus), not the dead ones listed.
    assert_eq!(
        doc.summary.as_ref().unwrap().capacity,
        UsageDoc {
            cpus: 196 * 8,
            gpus: 0
        }
    );
    assert_eq!(doc.jobs.len(), 100);
    assert!(doc.jobs.iter().all(|j| j.state == "running"));
    let (mut doc, s) = synthetic(10, 0);
    let q = StatusQuery {
        limit: Some(4),
        members_after: Some("m00003".into()),
        ..Default::default()
    };
    page_status(&mut doc, &s, &q).unwrap();
    let names: Vec<&str> = doc.members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["m00004", "m00005", "m00006", "m00007"]);
    assert_eq!(doc.summary.unwrap().members_next.as_deref(), Some("m00007"));
}

#[test]
fn bad_queries_name_their_field() {
    let (doc, s) = synthetic(1, 1);
    let bad = |q: StatusQuery| page_status(&mut doc.clone(), &s, &q).unwrap_err().field;
    assert_eq!(
        bad(StatusQuery {
            limit: Some(0),
            ..Default::default()
        }),
        "limit"
    );
    assert_eq!(
        bad(StatusQuery {
            limit: Some(LIST_ROWS_MAX + 1),
            ..Default::default()
        }),
        "limit"
    );
    assert_eq!(
        bad(StatusQuery {
            member_state: Some("zombie".into()),
            ..Default::default()
        }),
        "member_state"
    );
    assert_eq!(
        bad(StatusQuery {
            job_state: Some("done".into()),
            ..Default::default()
        }),
        "job_state"
    );
    assert_eq!(
        bad(StatusQuery {
            jobs_before: Some("7".into()),
            ..Default::default()
        }),
        "jobs_before"
    );
    let e = jobs(
        &s,
        &JobsQuery {
            state: Some("x".into()),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.field, "state");
    assert!(e.to_string().contains("pending, running"), "{e}");
}

/// `scripts/bench-api.sh`: builds and serializes the status document of a synthetic
/// cluster of 1,000 members and 10,000 jobs (the default page, a filtered one, and the
/// unbounded lists of before), without I/O; prints one `api status …` line for each.
#[test]
fn bench_status_at_size() {
    let (doc, s) = synthetic(MEMBERS_AT_SIZE, JOBS_AT_SIZE);
    let queries = [
        ("default", StatusQuery::default()),
        (
            "filtered",
            StatusQuery {
                member_state: Some("dead".into()),
                job_state: Some("running".into()),
                limit: Some(100),
                ..Default::default()
            },
        ),
        (
            "unbounded",
            StatusQuery {
                limit: Some(LIST_ROWS_MAX),
                ..Default::default()
            },
        ),
    ];
    const RUNS: u32 = 5;
    for (what, q) in queries {
        let start = std::time::Instant::now();
        let mut bytes = 0;
        for _ in 0..RUNS {
            let mut d = doc.clone();
            page_status(&mut d, &s, &q).unwrap();
            bytes = serde_json::to_vec(&d).unwrap().len();
        }
        let ms = start.elapsed().as_secs_f64() * 1e3 / f64::from(RUNS);
        println!(
            "api status members={MEMBERS_AT_SIZE} jobs={JOBS_AT_SIZE} query={what} ms={ms:.1} bytes={bytes}"
        );
    }
}
