//! The scale benchmark at a small N, as CI runs it (the 128-node runs are the book's Scale
//! page's, by hand): `ringleader-bench scale 8` forms 8 real nodes (the `ringleader` binary beside
//! it, which `cargo test --workspace` builds), kills one and the chief, runs a wide job and prints
//! its one line with every figure. The figures themselves are the benchmark's; this checks
//! that it runs to the end and says what the book says it says.

use std::process::Command;

/// The figures of a `scale` line, in order.
const FIELDS: [&str; 11] = [
    "converge_s",
    "detect_s",
    "failover_s",
    "submit_ms_p50",
    "submit_ms_p99",
    "wide_job_s",
    "status_ms",
    "chief_cpu_pct",
    "node_rss_mb",
    "idle_cpu_pct",
    "chief_kib_per_entry",
];

#[test]
fn bench_scale_at_8_nodes_prints_every_figure() {
    let out = Command::new(env!("CARGO_BIN_EXE_ringleader-bench"))
        .args(["scale", "8", "--submits", "10"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ringleader-bench failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = text;
    let line = out
        .lines()
        .find(|l| l.starts_with("scale "))
        .unwrap_or_else(|| panic!("no scale line: {out}"));
    let mut words = line.split_whitespace();
    assert_eq!(words.next(), Some("scale"));
    assert_eq!(words.next(), Some("nodes=8"), "{line}");
    for (word, field) in words.zip(FIELDS) {
        let (name, value) = word.split_once('=').unwrap_or_else(|| panic!("{line}"));
        assert_eq!(name, field, "{line}");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|e| panic!("{name}={value}: {e} in {line}"));
        assert!(
            value.is_finite() && value >= 0.0,
            "{name}={value} in {line}"
        );
    }
    assert_eq!(
        line.split_whitespace().count(),
        2 + FIELDS.len(),
        "every figure, nothing else: {line}"
    );
}
