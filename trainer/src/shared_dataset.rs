//! The on-disk format of a shared dataset: what a job whose `data.dataset` is not a built-in
//! trains on ([`crate::Dataset::shared`] reads it; the node brings the directory).
//!
//! A shared dataset is a directory holding [`TRAIN_FILE`] and optionally [`VAL_FILE`],
//! safetensors files (as written by Python's `safetensors.numpy.save_file` or
//! `safetensors.torch.save_file`, see `examples/make_dataset.py`) with two tensors each:
//! - `x`: the samples, `f32`, or `u8` scaled by 1/255; shape `[N, D]` (image shape
//!   `[1, 1, D]`), `[N, H, W]` (`[1, H, W]`) or `[N, C, H, W]`; every value finite;
//! - `y`: one label per sample, any integer dtype (u8, i8, u16, i16, u32, i32, u64, i64),
//!   shape `[N]`, each in `0..`[`LABELS_MAX`].
//!
//! `N ≥ 1`, and both files have the same sample shape. The classes are the largest label of
//! both splits plus one (at least 2). Without [`VAL_FILE`] the last [`VAL_PERCENT`]% of the
//! training samples (at least one) validate. A file is refused before it is read when it is
//! over [`FILE_BYTES_MAX`].
//!
//! [`write_shared_dataset`] and `export_digits` write such a directory (tests and tools).

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::error::TrainError;

/// The training split's file in a shared dataset's directory.
pub const TRAIN_FILE: &str = "train.safetensors";
/// The validation split's file (optional).
pub const VAL_FILE: &str = "val.safetensors";
/// Largest file read, bytes (checked before reading; the samples then take up to 4× that
/// in memory when `x` is `u8`).
pub const FILE_BYTES_MAX: u64 = 8 << 30;
pub use crate::spec::LABELS_MAX;
/// Without [`VAL_FILE`], the share of the training file's samples (its tail) that validate,
/// percent.
pub const VAL_PERCENT: usize = 10;

/// One split as read from its file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Split {
    /// Samples `[n, c, h, w]`, row-major.
    pub x: Vec<f32>,
    /// Labels, each below [`LABELS_MAX`].
    pub y: Vec<u32>,
    /// `[c, h, w]`.
    pub shape: [usize; 3],
}

impl Split {
    /// Cuts off the last [`VAL_PERCENT`]% (at least one sample) as the validation split;
    /// needs at least two samples. `path` names the file in errors.
    pub(crate) fn split_tail(mut self, path: &Path) -> Result<(Split, Split), TrainError> {
        let n = self.y.len();
        if n < 2 {
            return Err(dataset_error(
                path,
                format!("{n} sample(s): without {VAL_FILE} at least 2 are needed"),
            ));
        }
        let val_n = (n * VAL_PERCENT / 100).max(1);
        let cut = n - val_n;
        let dim = self.shape.iter().product::<usize>();
        let val = Split {
            x: self.x.split_off(cut * dim),
            y: self.y.split_off(cut),
            shape: self.shape,
        };
        Ok((self, val))
    }
}

fn dataset_error(path: &Path, detail: impl Into<String>) -> TrainError {
    TrainError::Dataset {
        path: path.display().to_string(),
        detail: detail.into(),
    }
}

/// Reads and checks one split file (see the module doc for what is accepted).
pub(crate) fn read_split(path: &Path) -> Result<Split, TrainError> {
    let bad = |d: String| dataset_error(path, d);
    let file = std::fs::File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => bad("missing file".into()),
        _ => bad(format!("cannot open: {e}")),
    })?;
    let len = file
        .metadata()
        .map_err(|e| bad(format!("cannot stat: {e}")))?
        .len();
    if len > FILE_BYTES_MAX {
        return Err(bad(format!(
            "{len} bytes, over the limit of {FILE_BYTES_MAX}"
        )));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // `take`: a file growing after the size check still stops at the limit.
    file.take(FILE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| bad(format!("cannot read: {e}")))?;
    if bytes.len() as u64 > FILE_BYTES_MAX {
        return Err(bad(format!("over the limit of {FILE_BYTES_MAX} bytes")));
    }
    // The header check includes every tensor's byte count against its shape and dtype.
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| bad(format!("not a valid safetensors file: {e}")))?;
    let tensor = |name: &str| {
        st.tensor(name)
            .map_err(|_| bad(format!("missing tensor {name:?}")))
    };
    let (x_view, y_view) = (tensor("x")?, tensor("y")?);

    let xs = x_view.shape();
    let n = *xs.first().unwrap_or(&0);
    let shape = match *xs {
        [_, d] => [1, 1, d],
        [_, h, w] => [1, h, w],
        [_, c, h, w] => [c, h, w],
        _ => {
            return Err(bad(format!(
                "x: shape {xs:?}, want [N, D], [N, H, W] or [N, C, H, W]"
            )))
        }
    };
    if y_view.shape().len() != 1 {
        return Err(bad(format!("y: shape {:?}, want [N]", y_view.shape())));
    }
    if y_view.shape()[0] != n {
        return Err(bad(format!(
            "x has {n} samples but y has {} labels",
            y_view.shape()[0]
        )));
    }
    if n == 0 {
        return Err(bad("no samples (N = 0)".into()));
    }
    if shape.contains(&0) {
        return Err(bad(format!("x: shape {xs:?}: empty samples")));
    }
    let x = decode_samples(&x_view).map_err(bad)?;
    let y = decode_labels(&y_view).map_err(bad)?;
    Ok(Split { x, y, shape })
}

/// Bytes a tensor of `view`'s shape and `elem_bytes`-byte elements takes, if they are what
/// the view holds (the safetensors header check guarantees it; checked again here).
fn check_bytes(view: &TensorView<'_>, name: &str, elem_bytes: usize) -> Result<(), String> {
    let want = view
        .shape()
        .iter()
        .try_fold(elem_bytes, |a, &d| a.checked_mul(d));
    if want != Some(view.data().len()) {
        return Err(format!(
            "{name}: {} bytes do not match shape {:?} of {elem_bytes}-byte elements",
            view.data().len(),
            view.shape()
        ));
    }
    Ok(())
}

/// `x` as f32 (u8 scaled by 1/255); every value finite.
fn decode_samples(view: &TensorView<'_>) -> Result<Vec<f32>, String> {
    match view.dtype() {
        Dtype::F32 => {
            check_bytes(view, "x", 4)?;
            let x: Vec<f32> = view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect();
            if let Some(i) = x.iter().position(|v| !v.is_finite()) {
                return Err(format!("x: value {} at element {i} is not finite", x[i]));
            }
            Ok(x)
        }
        Dtype::U8 => {
            check_bytes(view, "x", 1)?;
            Ok(view.data().iter().map(|&b| b as f32 / 255.0).collect())
        }
        other => Err(format!("x: dtype {other:?}, want F32 or U8")),
    }
}

/// `y` as u32 labels, each in `0..LABELS_MAX`.
fn decode_labels(view: &TensorView<'_>) -> Result<Vec<u32>, String> {
    let (size, signed) = match view.dtype() {
        Dtype::U8 => (1, false),
        Dtype::I8 => (1, true),
        Dtype::U16 => (2, false),
        Dtype::I16 => (2, true),
        Dtype::U32 => (4, false),
        Dtype::I32 => (4, true),
        Dtype::U64 => (8, false),
        Dtype::I64 => (8, true),
        other => {
            return Err(format!(
                "y: dtype {other:?}, want an integer dtype (U8, I8, U16, I16, U32, I32, U64, I64)"
            ))
        }
    };
    check_bytes(view, "y", size)?;
    view.data()
        .chunks_exact(size)
        .enumerate()
        .map(|(i, c)| {
            // Widen to 8 bytes, sign-extending signed labels.
            let negative = signed && c[size - 1] & 0x80 != 0;
            let mut b = [if negative { 0xff } else { 0 }; 8];
            b[..size].copy_from_slice(c);
            if negative {
                return Err(format!(
                    "y: label {} at index {i} is negative",
                    i64::from_le_bytes(b)
                ));
            }
            let v = u64::from_le_bytes(b);
            if v >= LABELS_MAX {
                return Err(format!(
                    "y: label {v} at index {i} is not below {LABELS_MAX}"
                ));
            }
            Ok(v as u32)
        })
        .collect()
}

/// Writes one split file: `x` as f32 of shape `[N, ..sample_shape]`, `y` as i64 (the dtype
/// PyTorch and numpy give labels). Replaces the file atomically.
fn write_split(
    path: &Path,
    x: &[f32],
    sample_shape: &[usize],
    y: &[u32],
) -> Result<(), TrainError> {
    let x_bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let y_bytes: Vec<u8> = y.iter().flat_map(|&v| i64::from(v).to_le_bytes()).collect();
    let mut x_shape = vec![y.len()];
    x_shape.extend_from_slice(sample_shape);
    write_tensors(
        path,
        &[
            ("x", Dtype::F32, x_shape, &x_bytes),
            ("y", Dtype::I64, vec![y.len()], &y_bytes),
        ],
    )
}

/// Writes raw tensors `(name, dtype, shape, little-endian bytes)` as a safetensors file.
fn write_tensors(
    path: &Path,
    tensors: &[(&str, Dtype, Vec<usize>, &[u8])],
) -> Result<(), TrainError> {
    let bad = |e: safetensors::SafeTensorError| dataset_error(path, format!("writing: {e}"));
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            TensorView::new(*dtype, shape.clone(), bytes).map(|v| (name.to_string(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(bad)?;
    safetensors::tensor::serialize_to_file(views, None::<HashMap<String, String>>, path)
        .map_err(bad)
}

/// Writes a shared dataset into `dir` (created if missing): `x` holds `y.len()` samples of
/// `sample_shape` (`[D]`, `[H, W]` or `[C, H, W]`), row-major; the last `val_samples` go
/// to [`VAL_FILE`], the others to [`TRAIN_FILE`] (`val_samples = 0`: no validation file,
/// the reader then holds out the training file's tail). Labels must be below
/// [`LABELS_MAX`].
pub fn write_shared_dataset(
    dir: &Path,
    x: &[f32],
    sample_shape: &[usize],
    y: &[u32],
    val_samples: usize,
) -> Result<(), TrainError> {
    let bad = |d: String| dataset_error(dir, d);
    let dim = sample_shape.iter().product::<usize>();
    if !(1..=3).contains(&sample_shape.len()) || dim == 0 {
        return Err(bad(format!(
            "sample shape {sample_shape:?}: want [D], [H, W] or [C, H, W], none 0"
        )));
    }
    if Some(x.len()) != y.len().checked_mul(dim) {
        return Err(bad(format!(
            "{} values are not {} samples of {sample_shape:?}",
            x.len(),
            y.len()
        )));
    }
    if val_samples >= y.len() {
        return Err(bad(format!(
            "{val_samples} validation samples leave none of {} to train",
            y.len()
        )));
    }
    if let Some(&k) = y.iter().find(|&&k| u64::from(k) >= LABELS_MAX) {
        return Err(bad(format!("label {k} is not below {LABELS_MAX}")));
    }
    std::fs::create_dir_all(dir).map_err(|e| bad(format!("creating: {e}")))?;
    let cut = y.len() - val_samples;
    write_split(
        &dir.join(TRAIN_FILE),
        &x[..cut * dim],
        sample_shape,
        &y[..cut],
    )?;
    let val_path = dir.join(VAL_FILE);
    if val_samples > 0 {
        write_split(&val_path, &x[cut * dim..], sample_shape, &y[cut..])
    } else {
        match std::fs::remove_file(&val_path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(bad(format!("removing {VAL_FILE}: {e}")))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensors(path: &Path, x: (Dtype, Vec<usize>, Vec<u8>), y: (Dtype, Vec<usize>, Vec<u8>)) {
        write_tensors(path, &[("x", x.0, x.1, &x.2), ("y", y.0, y.1, &y.2)]).unwrap();
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// The error's text, which must name the file.
    fn refusal(path: &Path) -> String {
        let e = read_split(path).unwrap_err();
        assert!(matches!(e, TrainError::Dataset { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        text
    }

    #[test]
    fn u8_samples_scale_and_every_integer_label_dtype_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TRAIN_FILE);
        let y_cases: [(Dtype, Vec<u8>); 8] = [
            (Dtype::U8, vec![0, 3]),
            (Dtype::I8, vec![0, 3]),
            (Dtype::U16, vec![0, 0, 3, 0]),
            (Dtype::I16, vec![0, 0, 3, 0]),
            (
                Dtype::U32,
                [0u32, 3].iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            (
                Dtype::I32,
                [0i32, 3].iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            (
                Dtype::U64,
                [0u64, 3].iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            (
                Dtype::I64,
                [0i64, 3].iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
        ];
        for (dtype, bytes) in y_cases {
            tensors(
                &path,
                (
                    Dtype::U8,
                    vec![2, 2, 3],
                    vec![0, 255, 51, 1, 2, 3, 4, 5, 6, 7, 8, 9],
                ),
                (dtype, vec![2], bytes),
            );
            let s = read_split(&path).unwrap();
            assert_eq!(s.y, vec![0, 3], "{dtype:?}");
            assert_eq!(s.shape, [1, 2, 3]);
            assert_eq!(&s.x[..3], &[0.0, 1.0, 0.2]);
        }
    }

    #[test]
    fn sample_shapes_follow_the_rank_of_x() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TRAIN_FILE);
        let y = (Dtype::U8, vec![1], vec![1]);
        for (shape, want) in [
            (vec![1, 6], [1, 1, 6]),
            (vec![1, 2, 3], [1, 2, 3]),
            (vec![1, 3, 2, 1], [3, 2, 1]),
        ] {
            tensors(&path, (Dtype::F32, shape, f32_bytes(&[0.5; 6])), y.clone());
            assert_eq!(read_split(&path).unwrap().shape, want);
        }
        for shape in [vec![6], vec![1, 1, 1, 2, 3]] {
            tensors(&path, (Dtype::F32, shape, f32_bytes(&[0.5; 6])), y.clone());
            assert!(refusal(&path).contains("x: shape"));
        }
    }

    #[test]
    fn malformed_files_are_refused_naming_file_and_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TRAIN_FILE);
        assert!(refusal(&path).contains("missing file"));

        let x2 = || (Dtype::F32, vec![2, 2], f32_bytes(&[0.0, 1.0, 2.0, 3.0]));
        let y2 = || (Dtype::U8, vec![2], vec![0, 1]);
        write_tensors(&path, &[("x", x2().0, x2().1, &x2().2)]).unwrap();
        assert!(refusal(&path).contains("missing tensor \"y\""));
        write_tensors(&path, &[("y", y2().0, y2().1, &y2().2)]).unwrap();
        assert!(refusal(&path).contains("missing tensor \"x\""));

        tensors(&path, (Dtype::F64, vec![2, 1], vec![0; 16]), y2());
        assert!(refusal(&path).contains("x: dtype F64"));
        tensors(&path, x2(), (Dtype::F32, vec![2], vec![0; 8]));
        assert!(refusal(&path).contains("y: dtype F32"));
        tensors(&path, x2(), (Dtype::U8, vec![3], vec![0, 1, 1]));
        assert!(refusal(&path).contains("x has 2 samples but y has 3 labels"));
        tensors(&path, x2(), (Dtype::U8, vec![2, 1], vec![0, 1]));
        assert!(refusal(&path).contains("y: shape [2, 1]"));
        tensors(
            &path,
            (Dtype::F32, vec![0, 2], vec![]),
            (Dtype::U8, vec![0], vec![]),
        );
        assert!(refusal(&path).contains("N = 0"));
        tensors(&path, (Dtype::F32, vec![2, 0], vec![]), y2());
        assert!(refusal(&path).contains("empty samples"));
        tensors(&path, x2(), (Dtype::I16, vec![2], vec![0, 0, 0xff, 0xff]));
        assert!(refusal(&path).contains("y: label -1 at index 1 is negative"));
        tensors(
            &path,
            x2(),
            (Dtype::U32, vec![2], vec![0, 0, 0, 0, 0, 0, 1, 0]),
        );
        assert!(refusal(&path).contains("y: label 65536 at index 1"));
        tensors(
            &path,
            (
                Dtype::F32,
                vec![2, 2],
                f32_bytes(&[0.0, f32::NAN, 2.0, 3.0]),
            ),
            y2(),
        );
        assert!(refusal(&path).contains("x: value NaN at element 1 is not finite"));
        tensors(
            &path,
            (
                Dtype::F32,
                vec![2, 2],
                f32_bytes(&[0.0, 1.0, f32::INFINITY, 3.0]),
            ),
            y2(),
        );
        assert!(refusal(&path).contains("not finite"));

        // A header whose byte counts do not match the shapes, and a cut file.
        let header = br#"{"x":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]},"y":{"dtype":"U8","shape":[2],"data_offsets":[12,14]}}"#;
        let mut raw = (header.len() as u64).to_le_bytes().to_vec();
        raw.extend_from_slice(header);
        raw.extend_from_slice(&[0; 14]);
        std::fs::write(&path, &raw).unwrap();
        assert!(refusal(&path).contains("not a valid safetensors file"));
        tensors(&path, x2(), y2());
        let whole = std::fs::read(&path).unwrap();
        std::fs::write(&path, &whole[..whole.len() - 1]).unwrap();
        assert!(refusal(&path).contains("not a valid safetensors file"));
    }

    #[test]
    fn a_file_over_the_limit_is_refused_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TRAIN_FILE);
        // Sparse: no disk space is used, and the size check comes before any read.
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(FILE_BYTES_MAX + 1).unwrap();
        assert!(refusal(&path).contains("over the limit"));
    }

    #[test]
    fn the_tail_validates_without_a_val_file() {
        let dim = 3;
        let split = |n: usize| Split {
            x: (0..n * dim).map(|v| v as f32).collect(),
            y: (0..n as u32).collect(),
            shape: [1, 1, dim],
        };
        let p = Path::new("train.safetensors");
        for (n, val_n) in [(2, 1), (10, 1), (19, 1), (20, 2), (105, 10)] {
            let (t, v) = split(n).split_tail(p).unwrap();
            assert_eq!((t.y.len(), v.y.len()), (n - val_n, val_n), "n = {n}");
            assert_eq!(v.y[0] as usize, n - val_n);
            assert_eq!(v.x[0], ((n - val_n) * dim) as f32);
            assert_eq!((t.x.len(), v.x.len()), ((n - val_n) * dim, val_n * dim));
        }
        assert!(split(1).split_tail(p).is_err());
    }

    #[test]
    fn the_writer_checks_its_arguments() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("ds");
        assert!(write_shared_dataset(&d, &[0.0; 6], &[3], &[0, 1], 0).is_ok());
        assert!(write_shared_dataset(&d, &[0.0; 5], &[3], &[0, 1], 0).is_err());
        assert!(write_shared_dataset(&d, &[0.0; 6], &[3], &[0, 1], 2).is_err());
        assert!(write_shared_dataset(&d, &[0.0; 6], &[1, 1, 1, 3], &[0, 1], 0).is_err());
        assert!(write_shared_dataset(&d, &[], &[0], &[0, 1], 0).is_err());
        assert!(write_shared_dataset(&d, &[0.0; 6], &[3], &[0, 1 << 16], 0).is_err());
    }
}
