//! `kernels.cu` run on the CPU: compiled as C++ with `g++` behind a small prelude (CUDA's
//! thread indices as globals, `__global__` as nothing) and launched by a driver that runs
//! every (block, thread) of a grid in turn, then checked against the CPU kernels of
//! `crate::kernels`. Every kernel is a set of independent threads (no shared memory, no
//! barriers), so running the threads one after another computes what the GPU does, up to the
//! order of float additions. Small grids (3 blocks of 5 threads) make every grid-stride loop
//! go round. Without `g++` the tests say SKIPPED.
//!
//! [`Emulator`] is a [`Driver`] made of the same: the device backend on it runs the whole
//! layer-wise engine (every buffer size and launch argument of `DeviceBackend`) against the
//! CPU engine.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::device::{Arg, DevBuf, DeviceBackend, DeviceElem, Driver};
use super::{GemmPlan, COLUMN_CHUNK_ROWS, KERNELS_CU};
use crate::error::TrainError;
use crate::kernels::{self, Nhwc};

/// What CUDA gives a kernel, for g++.
const PRELUDE: &str = r#"
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <vector>
struct Dim { unsigned int x, y, z; };
static Dim blockIdx, threadIdx, blockDim, gridDim;
#define __global__
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, sizeof f); return f; }
"#;

/// Reads `KERNEL BLOCKS THREADS NARGS` and the arguments (`f N v…`, `u N v…`, `z V`, `s V`),
/// runs the grid, prints every buffer argument back (`f N v…` / `u N v…`).
const DRIVER: &str = r#"
struct Arg { char kind; std::vector<float> f; std::vector<unsigned int> u; size_t z = 0; float s = 0; };
int main() {
    std::string name; unsigned blocks, threads; size_t nargs;
    std::cin >> name >> blocks >> threads >> nargs;
    std::vector<Arg> a(nargs);
    for (auto& x : a) {
        std::cin >> x.kind;
        size_t n;
        switch (x.kind) {
            case 'f': {
                std::cin >> n; x.f.resize(n);
                std::string t;
                for (auto& v : x.f) { std::cin >> t; v = std::strtof(t.c_str(), nullptr); }
                break;
            }
            case 'u': std::cin >> n; x.u.resize(n); for (auto& v : x.u) std::cin >> v; break;
            case 'z': std::cin >> x.z; break;
            case 's': { std::string t; std::cin >> t; x.s = std::strtof(t.c_str(), nullptr); break; }
            default: return 2;
        }
    }
    if (!std::cin) return 3;
    auto F = [&](int k) { return a[k].f.data(); };
    auto U = [&](int k) { return a[k].u.data(); };
    auto Z = [&](int k) { return a[k].z; };
    auto S = [&](int k) { return a[k].s; };
    std::function<void()> call;
    if (name == "add_bias") call = [&] { add_bias(F(0), F(1), Z(2), Z(3)); };
    else if (name == "relu") call = [&] { relu(F(0), Z(1)); };
    else if (name == "relu_backward") call = [&] { relu_backward(F(0), F(1), Z(2)); };
    else if (name == "fill_zero") call = [&] { fill_zero(F(0), Z(1)); };
    else if (name == "column_partials") call = [&] { column_partials(F(0), F(1), Z(2), Z(3), Z(4)); };
    else if (name == "column_finish") call = [&] { column_finish(F(0), F(1), Z(2), Z(3)); };
    else if (name == "im2col") call = [&] { im2col(F(0), F(1), Z(2), Z(3), Z(4), Z(5), Z(6)); };
    else if (name == "col2im") call = [&] { col2im(F(0), F(1), Z(2), Z(3), Z(4), Z(5), Z(6)); };
    else if (name == "max_pool2") call = [&] { max_pool2(F(0), F(1), U(2), Z(3), Z(4), Z(5), Z(6)); };
    else if (name == "max_pool2_backward") call = [&] { max_pool2_backward(F(0), U(1), F(2), Z(3)); };
    else if (name == "batched_transpose") call = [&] { batched_transpose(F(0), F(1), Z(2), Z(3), Z(4)); };
    else if (name == "softmax_xent") call = [&] { softmax_xent(F(0), U(1), F(2), F(3), Z(4), Z(5)); };
    else if (name == "sgd_update") call = [&] { sgd_update(F(0), F(1), F(2), Z(3), S(4), S(5), S(6)); };
    else if (name == "adamw_update") call = [&] { adamw_update(F(0), F(1), F(2), F(3), Z(4), S(5), S(6), S(7), S(8), S(9), S(10), S(11)); };
    else return 4;
    gridDim.x = blocks; blockDim.x = threads;
    for (unsigned b = 0; b < blocks; b++)
        for (unsigned t = 0; t < threads; t++) { blockIdx.x = b; threadIdx.x = t; call(); }
    for (auto& x : a) {
        if (x.kind == 'f') { std::printf("f %zu", x.f.size()); for (float v : x.f) std::printf(" %.9g", v); std::printf("\n"); }
        if (x.kind == 'u') { std::printf("u %zu", x.u.size()); for (unsigned v : x.u) std::printf(" %u", v); std::printf("\n"); }
    }
    return 0;
}
"#;

/// Blocks and threads per block of every emulated launch.
const GRID: (u32, u32) = (3, 5);

/// A kernel argument.
enum A<'a> {
    F(&'a [f32]),
    U(&'a [u32]),
    Z(usize),
    S(f32),
}

/// A buffer after the launch.
#[derive(Debug, PartialEq)]
enum Out {
    F(Vec<f32>),
    U(Vec<u32>),
}

impl Out {
    fn f(self) -> Vec<f32> {
        match self {
            Out::F(v) => v,
            Out::U(_) => panic!("not an f32 buffer"),
        }
    }
    fn u(self) -> Vec<u32> {
        match self {
            Out::U(v) => v,
            Out::F(_) => panic!("not a u32 buffer"),
        }
    }
}

/// The compiled driver, built once (beside the test binary, named by the source's hash, so
/// that nothing is left elsewhere and a rebuild happens only when `kernels.cu` changes);
/// `None` without g++.
fn driver() -> Option<&'static Path> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    EXE.get_or_init(|| {
        let source = format!("{PRELUDE}\n{KERNELS_CU}\n{DRIVER}");
        let hash = blake3::hash(source.as_bytes()).to_hex();
        let dir = std::env::current_exe().ok()?.parent()?.to_path_buf();
        let exe = dir.join(format!("kernels-cu-on-cpu-{}", &hash[..16]));
        if exe.exists() {
            return Some(exe);
        }
        let tmp = dir.join(format!("kernels-cu-on-cpu.{}", std::process::id()));
        let src = tmp.with_extension("cpp");
        std::fs::write(&src, source).ok()?;
        let out = Command::new("g++")
            .args(["-std=c++17", "-O1", "-x", "c++", "-o"])
            .arg(&tmp)
            .arg(&src)
            .output();
        let _ = std::fs::remove_file(&src);
        let out = out.ok()?;
        assert!(
            out.status.success(),
            "kernels.cu does not compile as C++: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&tmp, &exe).ok()?;
        Some(exe)
    })
    .as_deref()
}

/// Runs `kernel` over [`GRID`] with `args`; returns the buffer arguments after it. `None`
/// (and a SKIPPED line) without g++.
fn launch(kernel: &str, args: &[A<'_>]) -> Option<Vec<Out>> {
    let Some(exe) = driver() else {
        eprintln!("SKIPPED: g++ not found (kernels.cu is checked on the CPU with it)");
        return None;
    };
    let mut input = format!("{kernel} {} {} {}\n", GRID.0, GRID.1, args.len());
    for a in args {
        match a {
            A::F(v) => {
                input += &format!("f {}", v.len());
                v.iter().for_each(|x| input += &format!(" {x:e}"));
            }
            A::U(v) => {
                input += &format!("u {}", v.len());
                v.iter().for_each(|x| input += &format!(" {x}"));
            }
            A::Z(z) => input += &format!("z {z}"),
            A::S(x) => input += &format!("s {x:e}"),
        }
        input.push('\n');
    }
    let mut child = Command::new(exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the driver starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{kernel}: driver {:?}", out.status);
    let text = String::from_utf8(out.stdout).unwrap();
    Some(
        text.lines()
            .map(|l| {
                let mut w = l.split_whitespace();
                let kind = w.next().unwrap();
                let n: usize = w.next().unwrap().parse().unwrap();
                let out = match kind {
                    "f" => Out::F(w.map(|v| v.parse().unwrap()).collect()),
                    _ => Out::U(w.map(|v| v.parse().unwrap()).collect()),
                };
                assert_eq!(
                    match &out {
                        Out::F(v) => v.len(),
                        Out::U(v) => v.len(),
                    },
                    n
                );
                out
            })
            .collect(),
    )
}

fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect()
}

/// `a` and `b` agree to 1e-5 of their largest magnitude (float sums in another order).
fn close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let scale = a.iter().chain(b).fold(1.0f32, |m, v| m.max(v.abs()));
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-5 * scale, "{what}[{i}]: {x} vs {y}");
    }
}

#[test]
fn elementwise_kernels_match_the_cpu() {
    let mut rng = StdRng::seed_from_u64(1);
    let (rows, cols) = (7, 6);
    let x = random(&mut rng, rows * cols);
    let bias = random(&mut rng, cols);
    let Some(out) = launch(
        "add_bias",
        &[A::F(&x), A::F(&bias), A::Z(rows * cols), A::Z(cols)],
    ) else {
        return;
    };
    let mut want = x.clone();
    kernels::add_bias(&mut want, &bias);
    assert_eq!(out.into_iter().next().unwrap().f(), want, "add_bias");

    let out = launch("relu", &[A::F(&x), A::Z(x.len())]).unwrap();
    let mut relu = x.clone();
    kernels::relu(&mut relu);
    assert_eq!(out.into_iter().next().unwrap().f(), relu, "relu");

    let g = random(&mut rng, x.len());
    let out = launch("relu_backward", &[A::F(&g), A::F(&relu), A::Z(g.len())]).unwrap();
    let mut want = g.clone();
    kernels::relu_backward(&mut want, &relu);
    assert_eq!(out.into_iter().next().unwrap().f(), want, "relu_backward");

    let out = launch("fill_zero", &[A::F(&g), A::Z(10)]).unwrap();
    let z = out.into_iter().next().unwrap().f();
    assert!(
        z[..10].iter().all(|v| *v == 0.0) && z[10..] == g[10..],
        "fill_zero"
    );
}

#[test]
fn column_sums_match_the_cpu_over_several_chunks() {
    let mut rng = StdRng::seed_from_u64(2);
    for (rows, cols) in [
        (1, 3),
        (COLUMN_CHUNK_ROWS, 2),
        (2 * COLUMN_CHUNK_ROWS + 7, 5),
    ] {
        let x = random(&mut rng, rows * cols);
        let chunks = rows.div_ceil(COLUMN_CHUNK_ROWS);
        let part = vec![f32::NAN; chunks * cols];
        let Some(out) = launch(
            "column_partials",
            &[
                A::F(&x),
                A::F(&part),
                A::Z(rows),
                A::Z(cols),
                A::Z(COLUMN_CHUNK_ROWS),
            ],
        ) else {
            return;
        };
        let part = out.into_iter().nth(1).unwrap().f();
        let dst = vec![f32::NAN; cols];
        let out = launch(
            "column_finish",
            &[A::F(&part), A::F(&dst), A::Z(chunks), A::Z(cols)],
        )
        .unwrap();
        let mut want = vec![0.0; cols];
        kernels::column_sums(&x, &mut want, false);
        close(
            &out.into_iter().nth(1).unwrap().f(),
            &want,
            &format!("column sums {rows}×{cols}"),
        );
    }
}

#[test]
fn convolution_pooling_and_layout_kernels_match_the_cpu() {
    let mut rng = StdRng::seed_from_u64(3);
    for (s, k) in [
        (
            Nhwc {
                b: 2,
                h: 5,
                w: 4,
                c: 3,
            },
            3,
        ),
        (
            Nhwc {
                b: 1,
                h: 7,
                w: 6,
                c: 2,
            },
            5,
        ),
        (
            Nhwc {
                b: 3,
                h: 4,
                w: 4,
                c: 1,
            },
            1,
        ),
    ] {
        let x = random(&mut rng, s.len());
        let n_cols = s.len() * k * k;
        let cols = vec![f32::NAN; n_cols];
        let Some(out) = launch(
            "im2col",
            &[
                A::F(&x),
                A::F(&cols),
                A::Z(s.b),
                A::Z(s.h),
                A::Z(s.w),
                A::Z(s.c),
                A::Z(k),
            ],
        ) else {
            return;
        };
        let mut want = vec![0.0; n_cols];
        kernels::im2col(&x, s, k, &mut want);
        assert_eq!(
            out.into_iter().nth(1).unwrap().f(),
            want,
            "im2col {s:?} k={k}"
        );

        let dcols = random(&mut rng, n_cols);
        let dx = vec![f32::NAN; s.len()];
        let out = launch(
            "col2im",
            &[
                A::F(&dcols),
                A::F(&dx),
                A::Z(s.b),
                A::Z(s.h),
                A::Z(s.w),
                A::Z(s.c),
                A::Z(k),
            ],
        )
        .unwrap();
        let mut want = vec![0.0; s.len()];
        kernels::col2im(&dcols, s, k, &mut want);
        close(&out.into_iter().nth(1).unwrap().f(), &want, "col2im");

        // Pooling, with ties (values rounded to halves) to check the first-maximum rule.
        let xp: Vec<f32> = x.iter().map(|v| (v * 2.0).round() / 2.0).collect();
        let n_out = s.b * (s.h / 2) * (s.w / 2) * s.c;
        let (out0, arg0) = (vec![f32::NAN; n_out], vec![u32::MAX; n_out]);
        let out = launch(
            "max_pool2",
            &[
                A::F(&xp),
                A::F(&out0),
                A::U(&arg0),
                A::Z(s.b),
                A::Z(s.h),
                A::Z(s.w),
                A::Z(s.c),
            ],
        )
        .unwrap();
        let mut it = out.into_iter().skip(1);
        let (pooled, arg) = (it.next().unwrap().f(), it.next().unwrap().u());
        let (mut want, mut want_arg) = (vec![0.0; n_out], vec![0; n_out]);
        kernels::max_pool2(&xp, s, &mut want, &mut want_arg);
        assert_eq!((pooled, arg.clone()), (want, want_arg), "max_pool2 {s:?}");

        let dout = random(&mut rng, n_out);
        let zero = launch(
            "fill_zero",
            &[A::F(&vec![f32::NAN; s.len()]), A::Z(s.len())],
        )
        .unwrap()
        .into_iter()
        .next()
        .unwrap()
        .f();
        let out = launch(
            "max_pool2_backward",
            &[A::F(&dout), A::U(&arg), A::F(&zero), A::Z(n_out)],
        )
        .unwrap();
        let mut want = vec![1.0; s.len()];
        kernels::max_pool2_backward(&dout, &arg, &mut want, s.len());
        assert_eq!(
            out.into_iter().nth(2).unwrap().f(),
            want,
            "max_pool2_backward"
        );

        // The layout transposes: images both ways, convolution weights both ways.
        let hw = s.h * s.w;
        for (to_nchw, rows, cols) in [(true, hw, s.c), (false, s.c, hw)] {
            let out = launch(
                "batched_transpose",
                &[
                    A::F(&x),
                    A::F(&vec![f32::NAN; s.len()]),
                    A::Z(s.b),
                    A::Z(rows),
                    A::Z(cols),
                ],
            )
            .unwrap();
            let mut want = vec![0.0; s.len()];
            kernels::transpose_images(&x, s, to_nchw, &mut want);
            assert_eq!(
                out.into_iter().nth(1).unwrap().f(),
                want,
                "transpose {to_nchw}"
            );
        }
        let (oc, taps) = (4, k * k);
        let w = random(&mut rng, oc * s.c * taps);
        for (major, rows, cols) in [(true, s.c, taps), (false, taps, s.c)] {
            let out = launch(
                "batched_transpose",
                &[
                    A::F(&w),
                    A::F(&vec![f32::NAN; w.len()]),
                    A::Z(oc),
                    A::Z(rows),
                    A::Z(cols),
                ],
            )
            .unwrap();
            let mut want = vec![0.0; w.len()];
            kernels::permute_taps(&w, oc, s.c, taps, major, &mut want);
            assert_eq!(
                out.into_iter().nth(1).unwrap().f(),
                want,
                "permute_taps {major}"
            );
        }
    }
}

#[test]
fn softmax_cross_entropy_matches_the_cpu() {
    let mut rng = StdRng::seed_from_u64(4);
    let (rows, classes) = (9, 7);
    let logits: Vec<f32> = random(&mut rng, rows * classes)
        .into_iter()
        .map(|v| 4.0 * v)
        .collect();
    let labels: Vec<u32> = (0..rows)
        .map(|_| rng.gen_range(0..classes as u32))
        .collect();
    let Some(out) = launch(
        "softmax_xent",
        &[
            A::F(&logits),
            A::U(&labels),
            A::F(&vec![f32::NAN; rows * classes]),
            A::F(&vec![f32::NAN; rows]),
            A::Z(rows),
            A::Z(classes),
        ],
    ) else {
        return;
    };
    let mut it = out.into_iter().skip(2);
    let (d, row_loss) = (it.next().unwrap().f(), it.next().unwrap().f());
    let mut want = vec![0.0; rows * classes];
    let loss = kernels::softmax_cross_entropy(&logits, &labels, classes, &mut want);
    close(&d, &want, "dlogits");
    let mean = row_loss.iter().map(|v| *v as f64).sum::<f64>() / rows as f64;
    assert!(
        (mean as f32 - loss).abs() < 1e-5 * loss.abs().max(1.0),
        "{mean} vs {loss}"
    );
    // A label out of range: a NaN loss for its row, not a wild write.
    let bad = [classes as u32];
    let out = launch(
        "softmax_xent",
        &[
            A::F(&logits[..classes]),
            A::U(&bad),
            A::F(&vec![0.0; classes]),
            A::F(&[0.0]),
            A::Z(1),
            A::Z(classes),
        ],
    )
    .unwrap();
    assert!(out.into_iter().nth(3).unwrap().f()[0].is_nan());
}

/// cuBLAS's `sgemm` by its definition, column-major: `c = op(first)·op(second)`, plus `c`
/// with `accumulate` (β = 1).
pub(super) fn sgemm_reference(
    plan: GemmPlan,
    accumulate: bool,
    first: &[f32],
    second: &[f32],
    c: &mut [f32],
) {
    let (m, n, k) = plan.dims;
    let (lda, ldb, ldc) = plan.lds;
    let a = |i: usize, l: usize| {
        if plan.first_t {
            first[l + i * lda]
        } else {
            first[i + l * lda]
        }
    };
    let b = |l: usize, j: usize| {
        if plan.second_t {
            second[j + l * ldb]
        } else {
            second[l + j * ldb]
        }
    };
    for j in 0..n {
        for i in 0..m {
            let v: f32 = (0..k).map(|l| a(i, l) * b(l, j)).sum();
            let at = i + j * ldc;
            c[at] = if accumulate { c[at] + v } else { v };
        }
    }
}

/// A device on the CPU: memory is `Vec`s, kernels run through the g++ driver, `sgemm` is
/// [`sgemm_reference`].
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Emulator;

impl Driver for Emulator {
    type Mem<T: DeviceElem> = Vec<T>;

    fn describe(&self) -> String {
        "emulated device (kernels.cu on the cpu)".into()
    }

    fn alloc<T: DeviceElem>(&self, len: usize) -> Result<Vec<T>, TrainError> {
        Ok(vec![T::default(); len])
    }

    fn capacity<T: DeviceElem>(mem: &Vec<T>) -> usize {
        mem.len()
    }

    fn upload<T: DeviceElem>(&self, src: &[T], dst: &mut Vec<T>) -> Result<(), TrainError> {
        dst[..src.len()].copy_from_slice(src);
        Ok(())
    }

    fn download(&self, src: &Vec<f32>, dst: &mut [f32]) -> Result<(), TrainError> {
        let n = dst.len();
        dst.copy_from_slice(&src[..n]);
        Ok(())
    }

    fn launch(
        &self,
        name: &'static str,
        _threads: usize,
        args: &mut [Arg<'_, Self>],
    ) -> Result<(), TrainError> {
        let outs = {
            let sent: Vec<A<'_>> = args
                .iter()
                .map(|a| match a {
                    Arg::F(m) => A::F(m),
                    Arg::FMut(m) => A::F(m),
                    Arg::U(m) => A::U(m),
                    Arg::UMut(m) => A::U(m),
                    Arg::Z(z) => A::Z(*z),
                    Arg::S(x) => A::S(*x),
                })
                .collect();
            launch(name, &sent).expect("the emulator is only built where g++ is")
        };
        let mut outs = outs.into_iter();
        for a in args.iter_mut() {
            match a {
                Arg::F(_) | Arg::U(_) => {
                    outs.next();
                }
                Arg::FMut(m) => **m = outs.next().unwrap().f(),
                Arg::UMut(m) => **m = outs.next().unwrap().u(),
                Arg::Z(_) | Arg::S(_) => {}
            }
        }
        Ok(())
    }

    fn gemm(
        &self,
        plan: GemmPlan,
        accumulate: bool,
        first: &Vec<f32>,
        second: &Vec<f32>,
        c: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        sgemm_reference(plan, accumulate, first, second, c);
        Ok(())
    }

    fn synchronize(&self) -> Result<(), TrainError> {
        Ok(())
    }
}

/// The engine on the emulated device computes what the CPU engine computes (itself checked
/// against candle's autograd in `tests/layers.rs`): logits, loss and every gradient, for an
/// MLP and a CNN with odd sizes, twice in a row (buffers reused, a smaller second batch).
#[test]
fn the_engine_on_the_emulated_device_matches_the_cpu() {
    use crate::layers::LayerEngine;
    use crate::spec::{Arch, ModelSpec};
    if driver().is_none() {
        eprintln!("SKIPPED: g++ not found (the emulated device runs kernels.cu with it)");
        return;
    }
    let cnn = ModelSpec {
        arch: Arch::Cnn,
        channels: vec![3, 4],
        kernel: 3,
        fc: 8,
        ..ModelSpec::default()
    };
    let mlp = ModelSpec {
        arch: Arch::Mlp,
        hidden: vec![9, 7],
        ..ModelSpec::default()
    };
    let mut rng = StdRng::seed_from_u64(5);
    for (spec, shape) in [(mlp, [1, 4, 3]), (cnn, [2, 10, 6])] {
        let classes = 5;
        let model = crate::Model::new(&spec, shape, classes, 3).unwrap();
        let params = model.values().unwrap();
        let names: Vec<&str> = model.params().iter().map(|(n, _)| n.as_str()).collect();
        let mut host = LayerEngine::on(crate::Host::default(), &spec, shape, classes, &names)
            .unwrap()
            .unwrap();
        let mut dev = LayerEngine::on(DeviceBackend::new(Emulator), &spec, shape, classes, &names)
            .unwrap()
            .unwrap();
        for batch in [3, 2] {
            let dim: usize = shape.iter().product();
            let xs = random(&mut rng, batch * dim);
            let ys: Vec<u32> = (0..batch)
                .map(|_| rng.gen_range(0..classes as u32))
                .collect();
            host.forward(&params, &xs, batch).unwrap();
            dev.forward(&params, &xs, batch).unwrap();
            let what = format!("{:?} batch {batch}", spec.arch);
            close(
                dev.logits().unwrap(),
                host.logits().unwrap(),
                &format!("{what} logits"),
            );
            let (lh, ld) = (host.loss(&ys).unwrap(), dev.loss(&ys).unwrap());
            assert!(
                (lh - ld).abs() < 1e-5 * lh.abs().max(1.0),
                "{what}: loss {ld} vs {lh}"
            );
            let mut gh: Vec<Vec<f32>> = params.iter().map(|p| vec![f32::NAN; p.len()]).collect();
            let mut gd = gh.clone();
            for i in (0..host.len()).rev() {
                let a = host.backward(i, &params, &mut gh).unwrap();
                let b = dev.backward(i, &params, &mut gd).unwrap();
                assert_eq!(a, b, "{what}: layer {i} wrote other parameters");
            }
            for (p, (h, d)) in gh.iter().zip(&gd).enumerate() {
                close(d, h, &format!("{what} gradient of {}", names[p]));
            }
        }
    }
}

/// The optimizer on the emulated device updates as the host optimizer does (SGD with
/// momentum and weight decay, AdamW), over three steps, and its state comes back to the host
/// as the host optimizer's own.
#[test]
fn the_device_optimizer_matches_the_host_optimizer() {
    use super::device_optimizer::DeviceOptimizer;
    use crate::spec::{OptimizerKind, TrainParams};
    use crate::Optimizer;
    if driver().is_none() {
        eprintln!("SKIPPED: g++ not found (the emulated device runs kernels.cu with it)");
        return;
    }
    let mut rng = StdRng::seed_from_u64(6);
    for kind in [OptimizerKind::Sgd, OptimizerKind::Adamw] {
        let tp = TrainParams {
            optimizer: kind,
            weight_decay: 0.01,
            ..TrainParams::default()
        };
        let sizes = [7, 3];
        let mut host = Optimizer::new(&tp, &sizes);
        let mut mirror = Optimizer::new(&tp, &sizes);
        let mut params: Vec<Vec<f32>> = sizes.iter().map(|&n| random(&mut rng, n)).collect();
        let be = DeviceBackend::new(Emulator);
        let mut dev = DeviceOptimizer::default();
        let mut dp: Vec<DevBuf<Emulator, f32>> = Vec::new();
        crate::Backend::load_params(&be, &params, &mut dp).unwrap();
        dev.load(&be, &mut mirror).unwrap();
        for step in 0..3 {
            let grads: Vec<Vec<f32>> = sizes.iter().map(|&n| random(&mut rng, n)).collect();
            let lr = 0.1 / (step + 1) as f32;
            host.begin_step();
            mirror.begin_step();
            let c = mirror.coefficients();
            for (i, g) in grads.iter().enumerate() {
                host.update(i, &mut params[i], g, lr);
                let mut dg = DevBuf::default();
                crate::Backend::upload(&be, g, &mut dg).unwrap();
                dev.update(&be, i, &mut dp[i], &dg, lr, &c).unwrap();
            }
            for (i, p) in params.iter().enumerate() {
                let mut got = vec![0.0; p.len()];
                Emulator.download(dp[i].mem(), &mut got).unwrap();
                close(&got, p, &format!("{kind:?} step {step} parameter {i}"));
            }
        }
        dev.store(&be, &mut mirror).unwrap();
        for ((name, a), (_, b)) in mirror.state().into_iter().zip(host.state()) {
            for (x, y) in a.iter().zip(b) {
                close(x, y, &format!("{kind:?} state {name}"));
            }
        }
        assert_eq!(mirror.steps_taken(), host.steps_taken());
    }
}
