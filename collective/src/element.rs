//! Element types and their vectorised reductions.
//!
//! The loops are plain `zip` loops over slices that LLVM auto-vectorises; f16 and bf16 are
//! converted in blocks through f32 (with `half`'s SIMD slice conversions) and rounded back.
//!
//! Integers (`i32`, `i64`, `u8`) reduce exactly: sums wrap on overflow (two's complement, as
//! PyTorch's integer tensors do), min and max are the integers'. Their mean has no exact
//! value, so the communicator refuses [`ReduceOp::Avg`] on them
//! ([`crate::CollectiveError::Unsupported`], before the operation is numbered), as Gloo
//! does. `u8` is also how any element type moves as bytes: `broadcast::<u8>` and
//! `allgather::<u8>` copy whatever the bytes hold.

use half::{bf16, f16, slice::HalfFloatSliceExt};

use crate::error::{DType, ReduceOp};

#[cfg(target_endian = "big")]
compile_error!("the collective wire format is little-endian (native element bytes)");

/// Elements per block when reducing half-precision values through f32.
const HALF_BLOCK_ELEMS: usize = 256;
/// Bytes per block of [`sealed::Sealed::reduce_into`]: well inside any L1 data cache.
const REDUCE_INTO_BLOCK_BYTES: usize = 4096;

pub(crate) mod sealed {
    use crate::error::ReduceOp;

    /// Operations the data plane needs; not nameable outside the crate.
    pub trait Sealed: bytemuck::Pod + Default + Send + Sync + 'static {
        /// `dst[i] = dst[i] ⊕ src[i]`, or `src[i] ⊕ dst[i]` when `src_first` (min/max are not
        /// bitwise commutative for ±0; recursive doubling fixes the order by rank).
        /// `op` is never `Avg` here (avg reduces as a sum, then [`Sealed::divide`]).
        fn reduce(dst: &mut [Self], src: &[Self], op: ReduceOp, src_first: bool);
        /// `buf[i] /= n` (integers: truncated; the communicator never averages them).
        fn divide(buf: &mut [Self], n: usize);
        /// `out[i] = ours[i] ⊕ theirs[i]`: bit for bit what `reduce(ours, theirs, op,
        /// false)` leaves in `ours`, written elsewhere (the ring reduces a received frame
        /// straight into the next rank's shared-memory slot). Block by block, so the copy
        /// of `ours` is still in the L1 cache when it is reduced.
        fn reduce_into(out: &mut [Self], ours: &[Self], theirs: &[Self], op: ReduceOp) {
            assert!(out.len() == ours.len() && ours.len() == theirs.len());
            let block = super::REDUCE_INTO_BLOCK_BYTES / std::mem::size_of::<Self>();
            for ((o, a), b) in out
                .chunks_mut(block)
                .zip(ours.chunks(block))
                .zip(theirs.chunks(block))
            {
                o.copy_from_slice(a);
                Self::reduce(o, b, op, false);
            }
        }
    }
}

/// An element type the collectives operate on: `f32`, `f64`, `half::f16`, `half::bf16`,
/// `i32`, `i64`, `u8`. Sealed: the wire format and the reductions are defined for exactly
/// these.
pub trait Element: sealed::Sealed + Copy + PartialEq + std::fmt::Debug {
    /// The wire tag.
    const DTYPE: DType;
}

macro_rules! full_float {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
        }
        impl sealed::Sealed for $t {
            #[inline]
            fn reduce(dst: &mut [Self], src: &[Self], op: ReduceOp, src_first: bool) {
                assert_eq!(dst.len(), src.len());
                match (op, src_first) {
                    (ReduceOp::Sum | ReduceOp::Avg, _) => {
                        // IEEE addition is commutative, the order does not matter.
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d += *s;
                        }
                    }
                    (ReduceOp::Min, false) => {
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d = d.min(*s);
                        }
                    }
                    (ReduceOp::Min, true) => {
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d = s.min(*d);
                        }
                    }
                    (ReduceOp::Max, false) => {
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d = d.max(*s);
                        }
                    }
                    (ReduceOp::Max, true) => {
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d = s.max(*d);
                        }
                    }
                }
            }
            fn divide(buf: &mut [Self], n: usize) {
                let n = n as $t;
                for x in buf {
                    *x /= n;
                }
            }
        }
    };
}

full_float!(f32, DType::F32);
full_float!(f64, DType::F64);

macro_rules! half_float {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
        }
        impl sealed::Sealed for $t {
            fn reduce(dst: &mut [Self], src: &[Self], op: ReduceOp, src_first: bool) {
                assert_eq!(dst.len(), src.len());
                let mut a = [0f32; HALF_BLOCK_ELEMS];
                let mut b = [0f32; HALF_BLOCK_ELEMS];
                for (d, s) in dst
                    .chunks_mut(HALF_BLOCK_ELEMS)
                    .zip(src.chunks(HALF_BLOCK_ELEMS))
                {
                    let n = d.len();
                    d.convert_to_f32_slice(&mut a[..n]);
                    s.convert_to_f32_slice(&mut b[..n]);
                    <f32 as sealed::Sealed>::reduce(&mut a[..n], &b[..n], op, src_first);
                    d.convert_from_f32_slice(&a[..n]);
                }
            }
            fn divide(buf: &mut [Self], n: usize) {
                let mut a = [0f32; HALF_BLOCK_ELEMS];
                for d in buf.chunks_mut(HALF_BLOCK_ELEMS) {
                    let k = d.len();
                    d.convert_to_f32_slice(&mut a[..k]);
                    <f32 as sealed::Sealed>::divide(&mut a[..k], n);
                    d.convert_from_f32_slice(&a[..k]);
                }
            }
        }
    };
}

half_float!(f16, DType::F16);
half_float!(bf16, DType::Bf16);

macro_rules! integer {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
        }
        impl sealed::Sealed for $t {
            #[inline]
            fn reduce(dst: &mut [Self], src: &[Self], op: ReduceOp, _src_first: bool) {
                assert_eq!(dst.len(), src.len());
                // Integer sums, minima and maxima are exactly commutative: the order does
                // not matter.
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => {
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d = d.wrapping_add(*s);
                        }
                    }
                    ReduceOp::Min => {
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d = (*d).min(*s);
                        }
                    }
                    ReduceOp::Max => {
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d = (*d).max(*s);
                        }
                    }
                }
            }
            fn divide(buf: &mut [Self], n: usize) {
                let n = <$t>::try_from(n).unwrap_or(<$t>::MAX);
                for x in buf {
                    *x /= n;
                }
            }
        }
    };
}

integer!(i32, DType::I32);
integer!(i64, DType::I64);
integer!(u8, DType::U8);

/// The bytes of a slice of elements (native = little-endian order).
pub(crate) fn as_bytes<T: Element>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

/// The bytes of a mutable slice of elements.
pub(crate) fn as_bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

/// Reference reduction of one element value across ranks, in rank order: what every rank must
/// hold after an allreduce when the inputs are exactly representable (integers: always).
/// Used by tests.
#[doc(hidden)]
pub fn reference_reduce<T: Element>(inputs: &[Vec<T>], op: ReduceOp) -> Vec<T> {
    let mut acc = inputs[0].clone();
    for x in &inputs[1..] {
        T::reduce(&mut acc, x, op, false);
    }
    if op == ReduceOp::Avg {
        T::divide(&mut acc, inputs.len());
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::sealed::Sealed;
    use super::*;

    #[test]
    fn half_reductions_round_through_f32() {
        let mut d: Vec<f16> = [1.0f32, 2.0, -3.0, 4.5]
            .iter()
            .map(|x| f16::from_f32(*x))
            .collect();
        let s: Vec<f16> = [0.5f32, 2.0, 5.0, -4.5]
            .iter()
            .map(|x| f16::from_f32(*x))
            .collect();
        f16::reduce(&mut d, &s, ReduceOp::Sum, false);
        let got: Vec<f32> = d.iter().map(|x| x.to_f32()).collect();
        assert_eq!(got, vec![1.5, 4.0, 2.0, 0.0]);
        let mut d: Vec<bf16> = (0..1000).map(|i| bf16::from_f32(i as f32)).collect();
        let s: Vec<bf16> = (0..1000).map(|i| bf16::from_f32(-(i as f32))).collect();
        bf16::reduce(&mut d, &s, ReduceOp::Max, false);
        assert!(d
            .iter()
            .enumerate()
            .all(|(i, x)| x.to_f32() == bf16::from_f32(i as f32).to_f32()));
    }

    #[test]
    fn integer_sums_wrap_and_min_max_are_exact() {
        let mut d = vec![i64::MAX, -5, 7, i64::MIN];
        i64::reduce(&mut d, &[1, 3, -9, -1], ReduceOp::Sum, false);
        assert_eq!(d, vec![i64::MIN, -2, -2, i64::MAX]);
        let mut d = vec![i32::MIN, 0, 5];
        i32::reduce(&mut d, &[i32::MAX, -1, 5], ReduceOp::Max, true);
        assert_eq!(d, vec![i32::MAX, 0, 5]);
        let mut d = vec![200u8, 3];
        u8::reduce(&mut d, &[100, 9], ReduceOp::Sum, false);
        assert_eq!(d, vec![44, 12]);
        u8::reduce(&mut d, &[10, 1], ReduceOp::Min, false);
        assert_eq!(d, vec![10, 1]);
    }

    /// `reduce_into` leaves the bits `reduce` leaves in its destination, for every type
    /// and op, across block boundaries, with signed zeros, NaNs and wrapping sums.
    #[test]
    fn reduce_into_equals_reduce_bit_for_bit() {
        fn check<T: Element + Sealed>(ours: Vec<T>, theirs: Vec<T>, ops: &[ReduceOp]) {
            for &op in ops {
                let mut want = ours.clone();
                T::reduce(&mut want, &theirs, op, false);
                let mut got = vec![T::default(); ours.len()];
                T::reduce_into(&mut got, &ours, &theirs, op);
                assert_eq!(as_bytes(&got), as_bytes(&want), "{:?} {op:?}", T::DTYPE);
            }
        }
        // Past two blocks (4 KiB each) and not a multiple of one.
        let n = 2 * REDUCE_INTO_BLOCK_BYTES + 13;
        let floats = |k: usize| -> Vec<f32> {
            (0..n)
                .map(|i| match (i + k) % 7 {
                    0 => 0.0,
                    1 => -0.0,
                    2 => f32::NAN,
                    3 => f32::INFINITY,
                    _ => (i * (k + 3)) as f32 * 0.37 - 500.0,
                })
                .collect()
        };
        let all = [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max];
        check(floats(0), floats(1), &all);
        check(
            floats(0).iter().map(|x| *x as f64).collect(),
            floats(2).iter().map(|x| *x as f64).collect(),
            &all,
        );
        check(
            floats(0).iter().map(|x| f16::from_f32(*x)).collect(),
            floats(3).iter().map(|x| f16::from_f32(*x)).collect(),
            &all,
        );
        check(
            floats(0).iter().map(|x| bf16::from_f32(*x)).collect(),
            floats(4).iter().map(|x| bf16::from_f32(*x)).collect(),
            &all,
        );
        let ints = |k: i64| -> Vec<i64> { (0..n as i64).map(|i| (i * k) << 50).collect() };
        check(ints(3), ints(-5), &all);
        check(
            ints(3).iter().map(|x| (*x >> 32) as i32).collect(),
            ints(7).iter().map(|x| (*x >> 32) as i32).collect(),
            &all,
        );
        check(
            (0..n).map(|i| (i * 7) as u8).collect(),
            (0..n).map(|i| (i * 13) as u8).collect(),
            &all,
        );
    }

    #[test]
    fn min_max_order_is_fixed_for_signed_zero() {
        let mut d = vec![0.0f32];
        f32::reduce(&mut d, &[-0.0], ReduceOp::Min, false);
        let mut e = vec![-0.0f32];
        f32::reduce(&mut e, &[0.0], ReduceOp::Min, true);
        assert_eq!(d[0].to_bits(), e[0].to_bits());
    }
}
