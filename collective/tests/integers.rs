//! Exact integer reductions and byte-level transfers over the in-memory transport: every
//! rank holds `reference_reduce` of any inputs (overflow wraps), the mean of integers is
//! refused without desynchronising the group, and any element type moves as bytes through
//! `broadcast::<u8>` and `allgather::<u8>`.

use collective::{
    reference_reduce, CollectiveError, Communicator, DType, Element, Limits, ReduceOp,
};
use proptest::prelude::*;
use tokio::task::JoinSet;

/// Runs `allreduce` on a fresh in-memory group of `ins.len()` ranks; each rank's buffer.
fn allreduce_all<T: Element>(ins: &[Vec<T>], op: ReduceOp) -> Vec<Vec<T>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let comms = Communicator::in_memory(ins.len(), Limits::for_test()).unwrap();
        let mut set = JoinSet::new();
        for (mut c, mut buf) in comms.into_iter().zip(ins.iter().cloned()) {
            set.spawn(async move {
                c.allreduce(&mut buf, op).await.expect("allreduce");
                // Kept until every rank is done: a dropped peer counts as lost.
                (c, buf)
            });
        }
        let mut out = set.join_all().await;
        out.sort_by_key(|(c, _)| c.rank());
        out.into_iter().map(|(_, b)| b).collect()
    })
}

/// Inputs of `world` ranks × `len` arbitrary values.
fn inputs<T: Arbitrary + Clone + std::fmt::Debug>() -> impl Strategy<Value = Vec<Vec<T>>> {
    (1usize..=6, 0usize..200).prop_flat_map(|(world, len)| {
        proptest::collection::vec(proptest::collection::vec(any::<T>(), len), world)
    })
}

fn op() -> impl Strategy<Value = ReduceOp> {
    prop_oneof![
        Just(ReduceOp::Sum),
        Just(ReduceOp::Min),
        Just(ReduceOp::Max)
    ]
}

proptest! {
    // Each case runs a whole group: few cases, but any values, worlds 1-6, lengths on both
    // sides of the small-message switch (96 bytes in the test limits) and multi-frame rings.
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn i32_allreduce_equals_reference(ins in inputs::<i32>(), op in op()) {
        let want = reference_reduce(&ins, op);
        for (r, got) in allreduce_all(&ins, op).iter().enumerate() {
            prop_assert_eq!(got, &want, "rank {} {:?}", r, op);
        }
    }

    #[test]
    fn i64_allreduce_equals_reference(ins in inputs::<i64>(), op in op()) {
        let want = reference_reduce(&ins, op);
        for (r, got) in allreduce_all(&ins, op).iter().enumerate() {
            prop_assert_eq!(got, &want, "rank {} {:?}", r, op);
        }
    }

    #[test]
    fn u8_allreduce_equals_reference(ins in inputs::<u8>(), op in op()) {
        let want = reference_reduce(&ins, op);
        for (r, got) in allreduce_all(&ins, op).iter().enumerate() {
            prop_assert_eq!(got, &want, "rank {} {:?}", r, op);
        }
    }
}

#[test]
fn integer_sums_wrap_like_twos_complement() {
    let ins = vec![vec![i64::MAX, i64::MIN, 5], vec![1, -1, -7], vec![1, 0, 2]];
    let got = allreduce_all(&ins, ReduceOp::Sum);
    let want = vec![i64::MIN + 1, i64::MAX, 0];
    assert!(got.iter().all(|g| *g == want), "{got:?}");
}

#[tokio::test]
async fn mean_of_integers_is_refused_and_the_group_goes_on() {
    let comms = Communicator::in_memory(3, Limits::for_test()).unwrap();
    let mut set = JoinSet::new();
    for mut c in comms {
        set.spawn(async move {
            let r = c.rank() as i32;
            let mut buf = vec![r; 40];
            let e = c.allreduce(&mut buf, ReduceOp::Avg).await.unwrap_err();
            assert_eq!(
                e,
                CollectiveError::Unsupported {
                    op: ReduceOp::Avg,
                    dtype: DType::I32
                }
            );
            let mut b64 = vec![r as i64; 40];
            let e = c.reduce_scatter(&mut b64, ReduceOp::Avg).await.unwrap_err();
            assert!(matches!(e, CollectiveError::Unsupported { .. }), "{e}");
            assert!(c.error().is_none(), "a refusal does not poison");
            // The group is still in step: the next operation works everywhere.
            c.allreduce(&mut buf, ReduceOp::Sum).await.unwrap();
            assert_eq!(buf, vec![3; 40]);
            c
        });
    }
    set.join_all().await;
}

#[tokio::test]
async fn integer_reduce_scatter_owns_the_exact_sum() {
    for world in 1..=5 {
        let len = 37;
        let ins: Vec<Vec<i64>> = (0..world)
            .map(|r| (0..len).map(|i| (i as i64 - 10) << (20 + r)).collect())
            .collect();
        let want = reference_reduce(&ins, ReduceOp::Sum);
        let mut set = JoinSet::new();
        let comms = Communicator::in_memory(world, Limits::for_test()).unwrap();
        for (mut c, mut buf) in comms.into_iter().zip(ins) {
            let want = want.clone();
            set.spawn(async move {
                c.reduce_scatter(&mut buf, ReduceOp::Sum).await.unwrap();
                let own = c.segment(len, c.rank());
                assert_eq!(&buf[own.clone()], &want[own], "world {world}");
                c
            });
        }
        set.join_all().await;
    }
}

#[tokio::test]
async fn any_element_type_moves_as_bytes() {
    for world in 1..=5 {
        // Each rank's part: 7 f64 values (56 bytes, several 64-byte frames in all).
        let part = 7;
        let value = |r: usize, i: usize| (r * 100 + i) as f64 + 0.25;
        let comms = Communicator::in_memory(world, Limits::for_test()).unwrap();
        let mut set = JoinSet::new();
        for mut c in comms {
            set.spawn(async move {
                let r = c.rank();
                let mut all = vec![0f64; world * part];
                for i in 0..part {
                    all[r * part + i] = value(r, i);
                }
                let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut all);
                assert_eq!(c.segment(bytes.len(), r), r * part * 8..(r + 1) * part * 8);
                c.allgather(bytes).await.unwrap();
                for q in 0..world {
                    for i in 0..part {
                        assert_eq!(all[q * part + i], value(q, i), "world {world}");
                    }
                }
                // Broadcast of an odd number of bytes from the last rank.
                let root = world - 1;
                let mut b: Vec<u8> = (0..301)
                    .map(|i| if r == root { (i * 7) as u8 } else { 0 })
                    .collect();
                c.broadcast(&mut b, root).await.unwrap();
                assert!(b.iter().enumerate().all(|(i, x)| *x == (i * 7) as u8));
                // Kept until every rank is done: a dropped peer counts as lost.
                c
            });
        }
        set.join_all().await;
    }
}
