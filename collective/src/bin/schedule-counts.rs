//! Prints the allreduce schedules' round and byte counts from the sans-IO schedules
//! (`collective::hierarchy`), one line per algorithm and size:
//!
//! `schedule algo=ALGO ranks=N hosts=H ranks_per_host=L bytes=S rounds=… rank_mib=…
//! host_nic_mib=… local_mib=…`
//!
//! for N = 64, 256, 1024 ranks, 8 a host, and a 64 MiB buffer (counts, not measurements).

use collective::hierarchy::{
    flat_ring_cost, hierarchical_cost, recursive_doubling_cost, Cost, Hierarchy,
};

/// Ranks a host in the printed placements (8 GPUs a host).
const RANKS_PER_HOST: usize = 8;
/// Buffer size of the printed counts (bytes).
const BYTES: f64 = (64u64 << 20) as f64;

fn main() {
    for n in [64usize, 256, 1024] {
        let placement: Vec<usize> = (0..n).map(|r| r / RANKS_PER_HOST).collect();
        let h = Hierarchy::new(&placement);
        let rows: [(&str, Cost); 3] = [
            ("ring", flat_ring_cost(&h, BYTES)),
            ("hierarchical", hierarchical_cost(&h, BYTES)),
            ("recursive_doubling", recursive_doubling_cost(&h, BYTES)),
        ];
        for (algo, c) in rows {
            let mib = |b: f64| b / f64::from(1u32 << 20);
            println!(
                "schedule algo={algo} ranks={n} hosts={} ranks_per_host={RANKS_PER_HOST} \
                 bytes={BYTES} rounds={} rank_mib={:.1} host_nic_mib={:.1} local_mib={:.1}",
                h.hosts().len(),
                c.rounds,
                mib(c.rank_bytes_max),
                mib(c.host_nic_bytes_max),
                mib(c.local_bytes),
            );
        }
    }
}
