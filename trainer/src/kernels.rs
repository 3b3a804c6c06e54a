//! CPU kernels of the layer-wise forward and backward ([`crate::layers`]): matrix products
//! through the `gemm` crate (the one candle's CPU backend calls), im2col and col2im for
//! "same" convolutions in NHWC layout, 2×2 max-pooling, bias and ReLU passes, softmax
//! cross-entropy. All take flat row-major `f32` slices and write into caller-owned
//! buffers, so a training step allocates nothing.

/// Which operand of a matrix product is stored transposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trans {
    /// Stored as used: `[rows, cols]` row-major.
    No,
    /// Stored as the transpose of what is used.
    Yes,
}

/// `dst[m, n] (+)= op(a)[m, k] · op(b)[k, n]`, row-major; `op(a)` is `a` stored `[m, k]`
/// or, with [`Trans::Yes`], `a` stored `[k, m]` (likewise `b`: `[k, n]` or `[n, k]`).
/// With `accumulate` the product is added to `dst`, otherwise it overwrites it.
///
/// Runs on candle's compute threads (`RAYON_NUM_THREADS`; one thread runs inline).
///
/// # Panics
/// If a slice is shorter than its shape says.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    dst: &mut [f32],
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    ta: Trans,
    b: &[f32],
    tb: Trans,
    accumulate: bool,
) {
    assert!(
        dst.len() >= m * n && a.len() >= m * k && b.len() >= k * n,
        "matmul shapes"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst[..m * n].fill(0.0);
        }
        return;
    }
    // gemm takes (column stride, row stride) per operand.
    let (a_cs, a_rs) = match ta {
        Trans::No => (1, k as isize),
        Trans::Yes => (m as isize, 1),
    };
    let (b_cs, b_rs) = match tb {
        Trans::No => (1, n as isize),
        Trans::Yes => (k as isize, 1),
    };
    let threads = candle_core::utils::get_num_threads();
    let par = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the assertion above makes every index gemm reads or writes, given these
    // shapes and strides, fall inside the slices; `dst` is borrowed mutably, so it does
    // not alias `a` or `b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        );
    }
}

/// Adds `bias` to every row of `x` (`[rows, bias.len()]`).
pub(crate) fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// `x = max(x, 0)` in place.
pub(crate) fn relu(x: &mut [f32]) {
    for v in x {
        *v = v.max(0.0);
    }
}

/// The gradient through a ReLU whose output was `out`: `g = 0` where `out ≤ 0`.
pub(crate) fn relu_backward(g: &mut [f32], out: &[f32]) {
    for (g, &o) in g.iter_mut().zip(out) {
        if o <= 0.0 {
            *g = 0.0;
        }
    }
}

/// `dst[j] (+)= Σ_i x[i, j]` over the rows of `x` (`[rows, dst.len()]`): a bias gradient.
/// With `accumulate` the sums are added to `dst`, otherwise they overwrite it.
pub(crate) fn column_sums(x: &[f32], dst: &mut [f32], accumulate: bool) {
    if !accumulate {
        dst.fill(0.0);
    }
    for row in x.chunks_exact(dst.len()) {
        for (d, v) in dst.iter_mut().zip(row) {
            *d += v;
        }
    }
}

/// A 2-D image batch in NHWC layout: `b` images of `h × w` pixels with `c` channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nhwc {
    /// Images.
    pub b: usize,
    /// Rows per image.
    pub h: usize,
    /// Columns per image.
    pub w: usize,
    /// Channels per pixel.
    pub c: usize,
}

impl Nhwc {
    /// Values in the batch.
    pub fn len(&self) -> usize {
        self.b * self.h * self.w * self.c
    }

    /// Whether the batch holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shape after 2×2 max-pooling, with `c` channels.
    pub fn pooled(&self, c: usize) -> Nhwc {
        Nhwc {
            h: self.h / 2,
            w: self.w / 2,
            c,
            ..*self
        }
    }
}

/// im2col for a stride-1 `k × k` convolution with "same" zero padding (`k / 2`):
/// `cols[(b, y, x), (ky, kx, c)]`, one row of `k·k·c` values per output pixel.
pub(crate) fn im2col(x: &[f32], s: Nhwc, k: usize, cols: &mut [f32]) {
    let (p, c, row_len) = (k / 2, s.c, k * k * s.c);
    let mut rows = cols.chunks_exact_mut(row_len);
    for b in 0..s.b {
        let img = &x[b * s.h * s.w * c..(b + 1) * s.h * s.w * c];
        for y in 0..s.h {
            for xx in 0..s.w {
                let row = rows.next().expect("cols sized for the batch");
                for ky in 0..k {
                    let iy = (y + ky) as isize - p as isize;
                    let dst = &mut row[ky * k * c..(ky + 1) * k * c];
                    if iy < 0 || iy >= s.h as isize {
                        dst.fill(0.0);
                        continue;
                    }
                    for kx in 0..k {
                        let ix = (xx + kx) as isize - p as isize;
                        let d = &mut dst[kx * c..(kx + 1) * c];
                        if ix < 0 || ix >= s.w as isize {
                            d.fill(0.0);
                        } else {
                            let at = (iy as usize * s.w + ix as usize) * c;
                            d.copy_from_slice(&img[at..at + c]);
                        }
                    }
                }
            }
        }
    }
}

/// The adjoint of [`im2col`]: sums every column gradient back into the input pixel it came
/// from. Overwrites `dx`.
pub(crate) fn col2im(dcols: &[f32], s: Nhwc, k: usize, dx: &mut [f32]) {
    let (p, c, row_len) = (k / 2, s.c, k * k * s.c);
    dx[..s.len()].fill(0.0);
    let mut rows = dcols.chunks_exact(row_len);
    for b in 0..s.b {
        let img = &mut dx[b * s.h * s.w * c..(b + 1) * s.h * s.w * c];
        for y in 0..s.h {
            for xx in 0..s.w {
                let row = rows.next().expect("dcols sized for the batch");
                for ky in 0..k {
                    let iy = (y + ky) as isize - p as isize;
                    if iy < 0 || iy >= s.h as isize {
                        continue;
                    }
                    for kx in 0..k {
                        let ix = (xx + kx) as isize - p as isize;
                        if ix < 0 || ix >= s.w as isize {
                            continue;
                        }
                        let at = (iy as usize * s.w + ix as usize) * c;
                        let src = &row[(ky * k + kx) * c..(ky * k + kx + 1) * c];
                        for (d, v) in img[at..at + c].iter_mut().zip(src) {
                            *d += v;
                        }
                    }
                }
            }
        }
    }
}

/// 2×2 max-pooling with stride 2 (a trailing odd row or column is dropped, as candle's
/// `max_pool2d(2)`): `out` is `[b, h/2, w/2, c]`, `arg` the index into `x` of each maximum
/// (the first one on ties).
pub(crate) fn max_pool2(x: &[f32], s: Nhwc, out: &mut [f32], arg: &mut [u32]) {
    let (oh, ow, c) = (s.h / 2, s.w / 2, s.c);
    let mut o = 0;
    for b in 0..s.b {
        for y in 0..oh {
            for xx in 0..ow {
                let base = ((b * s.h + 2 * y) * s.w + 2 * xx) * c;
                let offsets = [0, c, s.w * c, s.w * c + c];
                for ch in 0..c {
                    let mut best = base + ch;
                    for off in &offsets[1..] {
                        if x[base + off + ch] > x[best] {
                            best = base + off + ch;
                        }
                    }
                    out[o] = x[best];
                    arg[o] = best as u32;
                    o += 1;
                }
            }
        }
    }
}

/// The adjoint of [`max_pool2`]: each output gradient goes to its maximum. Overwrites `dx`
/// (`len` values).
pub(crate) fn max_pool2_backward(dout: &[f32], arg: &[u32], dx: &mut [f32], len: usize) {
    dx[..len].fill(0.0);
    for (g, &i) in dout.iter().zip(arg) {
        dx[i as usize] += g;
    }
}

/// Reorders every image of `x` from `[h·w, c]` (NHWC) to `[c, h·w]` (NCHW) into `out`, or
/// back with `to_nchw = false` (then `x` is NCHW and `out` NHWC).
pub(crate) fn transpose_images(x: &[f32], s: Nhwc, to_nchw: bool, out: &mut [f32]) {
    let (hw, c) = (s.h * s.w, s.c);
    for (src, dst) in x[..s.len()]
        .chunks_exact(hw * c)
        .zip(out.chunks_exact_mut(hw * c))
    {
        for p in 0..hw {
            for ch in 0..c {
                if to_nchw {
                    dst[ch * hw + p] = src[p * c + ch];
                } else {
                    dst[p * c + ch] = src[ch * hw + p];
                }
            }
        }
    }
}

/// Mean softmax cross-entropy of `logits` (`[labels.len(), classes]`) against `labels`,
/// and its gradient `(softmax − onehot) / batch` into `dlogits`.
///
/// # Panics
/// If a label is not below `classes` (the dataset guarantees it).
pub(crate) fn softmax_cross_entropy(
    logits: &[f32],
    labels: &[u32],
    classes: usize,
    dlogits: &mut [f32],
) -> f32 {
    let n = labels.len();
    let mut loss = 0.0f64;
    for ((row, d), &y) in logits
        .chunks_exact(classes)
        .zip(dlogits.chunks_exact_mut(classes))
        .zip(labels)
    {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for (d, &z) in d.iter_mut().zip(row) {
            *d = (z - max).exp();
            sum += *d;
        }
        let y = y as usize;
        assert!(y < classes, "label {y} for {classes} classes");
        loss += (sum.ln() - (row[y] - max)) as f64;
        for v in d.iter_mut() {
            *v /= sum * n as f32;
        }
        d[y] -= 1.0 / n as f32;
    }
    (loss / n.max(1) as f64) as f32
}

/// Convolution weights `[oc, c, taps]` ⇄ `[oc, taps, c]` (`to_taps_major`: the first to the
/// second).
pub(crate) fn permute_taps(
    src: &[f32],
    oc: usize,
    c: usize,
    taps: usize,
    to_taps_major: bool,
    dst: &mut [f32],
) {
    for o in 0..oc {
        let (s, d) = (
            &src[o * c * taps..(o + 1) * c * taps],
            &mut dst[o * c * taps..(o + 1) * c * taps],
        );
        for ch in 0..c {
            for t in 0..taps {
                if to_taps_major {
                    d[t * c + ch] = s[ch * taps + t];
                } else {
                    d[ch * taps + t] = s[t * c + ch];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// im2col and col2im are adjoint for any shape and odd kernel: ⟨im2col(x), g⟩ =
        /// ⟨x, col2im(g)⟩ (integers, so the sums are exact).
        #[test]
        fn im2col_col2im_adjoint(b in 1usize..3, h in 1usize..7, w in 1usize..7, c in 1usize..4,
                                 half in 0usize..3, seed in 0u64..1000) {
            let s = Nhwc { b, h, w, c };
            let k = 2 * half + 1;
            let x: Vec<f32> = (0..s.len()).map(|i| ((i as u64 * 31 + seed) % 9) as f32 - 4.0).collect();
            let mut cols = vec![0.0; b * h * w * k * k * c];
            im2col(&x, s, k, &mut cols);
            let g: Vec<f32> = (0..cols.len()).map(|i| ((i as u64 * 17 + seed) % 7) as f32 - 3.0).collect();
            let mut dx = vec![0.0; s.len()];
            col2im(&g, s, k, &mut dx);
            let lhs: f64 = cols.iter().zip(&g).map(|(a, b)| (a * b) as f64).sum();
            let rhs: f64 = x.iter().zip(&dx).map(|(a, b)| (a * b) as f64).sum();
            prop_assert_eq!(lhs, rhs);
        }
    }

    fn naive(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
        let mut d = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                d[i * n + j] = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
            }
        }
        d
    }

    fn transpose(x: &[f32], r: usize, c: usize) -> Vec<f32> {
        let mut t = vec![0.0; r * c];
        for i in 0..r {
            for j in 0..c {
                t[j * r + i] = x[i * c + j];
            }
        }
        t
    }

    #[test]
    fn matmul_handles_every_transpose_and_accumulates() {
        let (m, n, k) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.5 - 3.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| 1.0 - i as f32 * 0.25).collect();
        let want = naive(&a, &b, m, n, k);
        let (at, bt) = (transpose(&a, m, k), transpose(&b, k, n));
        for (aa, ta) in [(&a, Trans::No), (&at, Trans::Yes)] {
            for (bb, tb) in [(&b, Trans::No), (&bt, Trans::Yes)] {
                let mut d = vec![9.0; m * n];
                matmul(&mut d, (m, n, k), aa, ta, bb, tb, false);
                assert_eq!(d, want, "{ta:?} {tb:?}");
                matmul(&mut d, (m, n, k), aa, ta, bb, tb, true);
                let twice: Vec<f32> = want.iter().map(|v| 2.0 * v).collect();
                assert_eq!(d, twice, "{ta:?} {tb:?} accumulate");
            }
        }
    }

    #[test]
    fn col2im_is_the_adjoint_of_im2col() {
        // <im2col(x), g> == <x, col2im(g)> for any x and g.
        let s = Nhwc {
            b: 2,
            h: 5,
            w: 4,
            c: 3,
        };
        let k = 3;
        let x: Vec<f32> = (0..s.len()).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
        let rows = s.b * s.h * s.w;
        let mut cols = vec![0.0; rows * k * k * s.c];
        im2col(&x, s, k, &mut cols);
        let g: Vec<f32> = (0..cols.len())
            .map(|i| ((i * 5) % 13) as f32 - 6.0)
            .collect();
        let mut dx = vec![1.0; s.len()];
        col2im(&g, s, k, &mut dx);
        let lhs: f64 = cols.iter().zip(&g).map(|(a, b)| (a * b) as f64).sum();
        let rhs: f64 = x.iter().zip(&dx).map(|(a, b)| (a * b) as f64).sum();
        assert_eq!(lhs, rhs);
        // The centre tap of every row is the pixel itself.
        let centre = (k / 2 * k + k / 2) * s.c;
        for (r, row) in cols.chunks_exact(k * k * s.c).enumerate() {
            assert_eq!(&row[centre..centre + s.c], &x[r * s.c..(r + 1) * s.c]);
        }
    }

    #[test]
    fn max_pool_picks_maxima_and_routes_gradients_to_them() {
        let s = Nhwc {
            b: 1,
            h: 3,
            w: 4,
            c: 1,
        };
        let x = [1.0, 5.0, 2.0, 0.0, 3.0, 4.0, 9.0, 8.0, 7.0, 7.0, 7.0, 7.0];
        let mut out = [0.0; 2];
        let mut arg = [0u32; 2];
        max_pool2(&x, s, &mut out, &mut arg);
        assert_eq!(out, [5.0, 9.0]);
        assert_eq!(arg, [1, 6]);
        let mut dx = [1.0; 12];
        max_pool2_backward(&[0.5, -1.0], &arg, &mut dx, 12);
        assert_eq!(dx.iter().sum::<f32>(), -0.5);
        assert_eq!((dx[1], dx[6]), (0.5, -1.0));
    }

    #[test]
    fn transposes_round_trip() {
        let s = Nhwc {
            b: 2,
            h: 2,
            w: 3,
            c: 4,
        };
        let x: Vec<f32> = (0..s.len()).map(|i| i as f32).collect();
        let mut nchw = vec![0.0; s.len()];
        transpose_images(&x, s, true, &mut nchw);
        assert_eq!(nchw[1], x[4]); // channel 0 of pixel 1
        let mut back = vec![0.0; s.len()];
        transpose_images(&nchw, s, false, &mut back);
        assert_eq!(back, x);
    }

    #[test]
    fn cross_entropy_matches_its_definition_and_gradient_sums_to_zero() {
        let logits = [1.0, 2.0, 3.0, 0.0, 0.0, 0.0];
        let mut d = [0.0; 6];
        let loss = softmax_cross_entropy(&logits, &[2, 0], 3, &mut d);
        let e: f32 = [1.0f32, 2.0, 3.0].iter().map(|z| z.exp()).sum();
        let want = ((e.ln() - 3.0) + 3f32.ln()) / 2.0;
        assert!((loss - want).abs() < 1e-6, "{loss} vs {want}");
        for row in d.chunks(3) {
            assert!(row.iter().sum::<f32>().abs() < 1e-6);
        }
        assert!((d[3] - (1.0 / 3.0 - 1.0) / 2.0).abs() < 1e-6);
    }
}
