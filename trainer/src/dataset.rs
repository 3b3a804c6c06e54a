//! Datasets held in memory: the shipped 8×8 digits, generated images, the project's own
//! text for the character-level language model, and shared datasets read from a directory
//! (see [`crate::shared_dataset`]).

use std::io::Read;
use std::path::Path;

use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::TrainError;
use crate::shared_dataset::{self, Split, TRAIN_FILE, VAL_FILE};
use crate::spec::{is_builtin_dataset, DataSpec};

/// The shipped digits (see `examples/data/README.md`): gzip of a small binary format.
static DIGITS_GZ: &[u8] = include_bytes!("../../examples/data/digits.bin.gz");
/// The directory holding the job's shared dataset (an absolute path; set by the node).
pub use ringleader_protocol::env::DATASET_DIR as DATASET_DIR_ENV;
/// Digits records in the training split (the first ones); the rest (297) validate.
pub const DIGITS_TRAIN: usize = 1500;
/// Digits records in the file.
pub const DIGITS_TOTAL: usize = 1797;
/// Decompressed size bound of the digits file, bytes (refuses a corrupted length).
const DIGITS_RAW_BYTES_MAX: usize = 1 << 20;

/// The project's own text (this crate's sources and the data README): the language model's
/// corpus, embedded at build time so no file is read at run time.
static PROJECT_TEXT: &[&str] = &[
    include_str!("../../examples/data/README.md"),
    include_str!("lib.rs"),
    include_str!("../spec/src/train.rs"),
    include_str!("dataset.rs"),
    include_str!("sampler.rs"),
    include_str!("model.rs"),
    include_str!("mlp.rs"),
    include_str!("cnn.rs"),
    include_str!("transformer.rs"),
    include_str!("grad_sync.rs"),
    include_str!("checkpointer.rs"),
    include_str!("optimizer.rs"),
    include_str!("schedule.rs"),
    include_str!("state.rs"),
    include_str!("checkpoint.rs"),
    include_str!("trainer.rs"),
];
/// Character vocabulary of the language model: 7-bit ASCII (other bytes map to `?`).
pub const TEXT_VOCAB: usize = 128;
/// Fraction of the corpus (its tail) held out for validation, percent.
const TEXT_VAL_PERCENT: usize = 10;

/// What a batch holds.
#[derive(Debug, Clone)]
enum Samples {
    /// Images `[n, c, h, w]` (row-major, f32) with one label each.
    Images {
        x: Vec<f32>,
        y: Vec<u32>,
        shape: [usize; 3],
        classes: usize,
    },
    /// Token windows: sample `i` is `tokens[starts[i]..starts[i] + seq_len + 1]`, inputs the
    /// first `seq_len`, targets the last `seq_len`.
    Text {
        tokens: Vec<u32>,
        starts: Vec<usize>,
        seq_len: usize,
    },
}

/// One split (training or validation) of a dataset, in memory.
#[derive(Debug, Clone)]
pub struct Dataset {
    samples: Samples,
}

/// A batch as tensors: inputs and integer targets (one per prediction, flattened).
#[derive(Debug)]
pub struct Batch {
    /// Inputs: `[b, c, h, w]` f32 for images, `[b, seq_len]` u32 for text.
    pub x: Tensor,
    /// Targets: `[b]` for images, `[b · seq_len]` for text (u32).
    pub y: Tensor,
}

impl Dataset {
    /// Loads the training and validation splits a spec asks for. `seq_len` is the language
    /// model's context (text only). A shared dataset (any name but a built-in's) is read
    /// from [`DataSpec::shared_dir`], which must be set.
    pub fn load(
        spec: &DataSpec,
        seq_len: usize,
        seed: u64,
    ) -> Result<(Dataset, Dataset), TrainError> {
        match spec.dataset.as_str() {
            "digits" => Self::digits(),
            "synthetic" => Ok(Self::synthetic(spec, seed)),
            "text" => Ok(Self::project_text(seq_len)),
            other => {
                debug_assert!(!is_builtin_dataset(other));
                let dir = spec.shared_dir.as_deref().ok_or_else(|| {
                    TrainError::Spec(format!(
                        "data.dataset {other:?} is a shared dataset, but no directory holds it \
                         (the worker takes it from {})",
                        DATASET_DIR_ENV
                    ))
                })?;
                Self::shared(dir)
            }
        }
    }

    /// A shared dataset from `dir` (format: [`crate::shared_dataset`]): the training split
    /// from `train.safetensors`, the validation split from `val.safetensors` or, without
    /// it, the last 10% of the training file. Both splits have the same sample shape and
    /// classes (the largest label of both plus one, at least 2).
    pub fn shared(dir: &Path) -> Result<(Dataset, Dataset), TrainError> {
        let train_path = dir.join(TRAIN_FILE);
        let val_path = dir.join(VAL_FILE);
        let train = shared_dataset::read_split(&train_path)?;
        let has_val = val_path.try_exists().map_err(|e| TrainError::Dataset {
            path: val_path.display().to_string(),
            detail: format!("cannot stat: {e}"),
        })?;
        let (train, val) = if has_val {
            let val = shared_dataset::read_split(&val_path)?;
            if val.shape != train.shape {
                return Err(TrainError::Dataset {
                    path: val_path.display().to_string(),
                    detail: format!(
                        "x: sample shape {:?} differs from {TRAIN_FILE}'s {:?}",
                        val.shape, train.shape
                    ),
                });
            }
            (train, val)
        } else {
            train.split_tail(&train_path)?
        };
        let classes = train
            .y
            .iter()
            .chain(&val.y)
            .max()
            .map_or(0, |&k| k as usize + 1)
            .max(2);
        let images = |s: Split| Dataset {
            samples: Samples::Images {
                x: s.x,
                y: s.y,
                shape: s.shape,
                classes,
            },
        };
        Ok((images(train), images(val)))
    }

    /// The shipped 8×8 digits, pixels scaled to [0, 1]: (train 1,500, validation 297).
    pub fn digits() -> Result<(Dataset, Dataset), TrainError> {
        let corrupt = |d: &str| TrainError::Corrupt {
            what: "digits.bin.gz".into(),
            detail: d.into(),
        };
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(DIGITS_GZ)
            .take(DIGITS_RAW_BYTES_MAX as u64)
            .read_to_end(&mut raw)
            .map_err(|e| corrupt(&e.to_string()))?;
        if raw.len() < 16 || &raw[..8] != b"RLDIGIT1" {
            return Err(corrupt("bad magic"));
        }
        let n = u32::from_le_bytes(raw[8..12].try_into().expect("4 bytes")) as usize;
        let pixels = u32::from_le_bytes(raw[12..16].try_into().expect("4 bytes")) as usize;
        if n != DIGITS_TOTAL || pixels != 64 || raw.len() != 16 + n * (pixels + 1) {
            return Err(corrupt("unexpected size"));
        }
        let mut x = Vec::with_capacity(n * pixels);
        let mut y = Vec::with_capacity(n);
        for rec in raw[16..].chunks_exact(pixels + 1) {
            x.extend(rec[..pixels].iter().map(|&p| p as f32 / 16.0));
            let label = rec[pixels];
            if label > 9 || rec[..pixels].iter().any(|&p| p > 16) {
                return Err(corrupt("value out of range"));
            }
            y.push(label as u32);
        }
        let split = |lo: usize, hi: usize| Dataset {
            samples: Samples::Images {
                x: x[lo * pixels..hi * pixels].to_vec(),
                y: y[lo..hi].to_vec(),
                shape: [1, 8, 8],
                classes: 10,
            },
        };
        Ok((split(0, DIGITS_TRAIN), split(DIGITS_TRAIN, n)))
    }

    /// Generated image classification: class `k` has a random prototype image; a sample is
    /// its prototype plus Gaussian-like noise of std `noise`. Deterministic in `seed`.
    pub fn synthetic(spec: &DataSpec, seed: u64) -> (Dataset, Dataset) {
        let shape = [spec.shape[0], spec.shape[1], spec.shape[2]];
        let dim = shape.iter().product::<usize>();
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_da7a);
        let protos: Vec<f32> = (0..spec.classes * dim)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let mut make = |n: usize| {
            let mut x = Vec::with_capacity(n * dim);
            let mut y = Vec::with_capacity(n);
            for _ in 0..n {
                let k = rng.gen_range(0..spec.classes);
                // Sum of three uniforms: cheap, bell-shaped, variance 1 after scaling.
                x.extend(protos[k * dim..(k + 1) * dim].iter().map(|&p| {
                    let u: f32 = rng.gen_range(-1.0..1.0f32)
                        + rng.gen_range(-1.0..1.0f32)
                        + rng.gen_range(-1.0..1.0f32);
                    p + spec.noise * u
                }));
                y.push(k as u32);
            }
            Dataset {
                samples: Samples::Images {
                    x,
                    y,
                    shape,
                    classes: spec.classes,
                },
            }
        };
        let train = make(spec.samples);
        let val = make(spec.val_samples);
        (train, val)
    }

    /// The project's own text as overlapping windows of `seq_len + 1` characters (stride
    /// `seq_len / 2`); the last tenth of the corpus validates.
    pub fn project_text(seq_len: usize) -> (Dataset, Dataset) {
        let tokens: Vec<u32> = PROJECT_TEXT
            .iter()
            .flat_map(|s| s.bytes())
            .map(|b| {
                if (b as usize) < TEXT_VOCAB {
                    b as u32
                } else {
                    b'?' as u32
                }
            })
            .collect();
        let cut = tokens.len() * (100 - TEXT_VAL_PERCENT) / 100;
        let windows = |toks: Vec<u32>| {
            let stride = (seq_len / 2).max(1);
            let starts: Vec<usize> = (0..toks.len().saturating_sub(seq_len))
                .step_by(stride)
                .collect();
            Dataset {
                samples: Samples::Text {
                    tokens: toks,
                    starts,
                    seq_len,
                },
            }
        };
        (
            windows(tokens[..cut].to_vec()),
            windows(tokens[cut..].to_vec()),
        )
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        match &self.samples {
            Samples::Images { y, .. } => y.len(),
            Samples::Text { starts, .. } => starts.len(),
        }
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Image shape `[c, h, w]` (text: `[1, 1, seq_len]`).
    pub fn input_shape(&self) -> [usize; 3] {
        match &self.samples {
            Samples::Images { shape, .. } => *shape,
            Samples::Text { seq_len, .. } => [1, 1, *seq_len],
        }
    }

    /// Number of classes (text: the vocabulary).
    pub fn classes(&self) -> usize {
        match &self.samples {
            Samples::Images { classes, .. } => *classes,
            Samples::Text { .. } => TEXT_VOCAB,
        }
    }

    /// The images and labels of `indices` as flat buffers (`xs`: `[b, c, h, w]`), reusing
    /// their allocations; an error for a text dataset.
    pub fn image_batch_into(
        &self,
        indices: &[usize],
        xs: &mut Vec<f32>,
        ys: &mut Vec<u32>,
    ) -> Result<(), TrainError> {
        let Samples::Images { x, y, shape, .. } = &self.samples else {
            return Err(TrainError::Spec(
                "an image model needs an image dataset".into(),
            ));
        };
        let dim = shape.iter().product::<usize>();
        xs.clear();
        ys.clear();
        for &i in indices {
            xs.extend_from_slice(&x[i * dim..(i + 1) * dim]);
            ys.push(y[i]);
        }
        Ok(())
    }

    /// The samples at `indices`, in that order, as tensors on `device`.
    pub fn batch(&self, indices: &[usize], device: &Device) -> Result<Batch, TrainError> {
        let b = indices.len();
        match &self.samples {
            Samples::Images { x, y, shape, .. } => {
                let dim = shape.iter().product::<usize>();
                let mut xs = Vec::with_capacity(b * dim);
                let mut ys = Vec::with_capacity(b);
                for &i in indices {
                    xs.extend_from_slice(&x[i * dim..(i + 1) * dim]);
                    ys.push(y[i]);
                }
                Ok(Batch {
                    x: Tensor::from_vec(xs, (b, shape[0], shape[1], shape[2]), device)?,
                    y: Tensor::from_vec(ys, b, device)?,
                })
            }
            Samples::Text {
                tokens,
                starts,
                seq_len,
            } => {
                let mut xs = Vec::with_capacity(b * seq_len);
                let mut ys = Vec::with_capacity(b * seq_len);
                for &i in indices {
                    let s = starts[i];
                    xs.extend_from_slice(&tokens[s..s + seq_len]);
                    ys.extend_from_slice(&tokens[s + 1..s + seq_len + 1]);
                }
                Ok(Batch {
                    x: Tensor::from_vec(xs, (b, *seq_len), device)?,
                    y: Tensor::from_vec(ys, b * seq_len, device)?,
                })
            }
        }
    }
}

/// Writes the shipped digits into `dir` as a shared dataset: [`TRAIN_FILE`] with the 1,500
/// training samples, [`VAL_FILE`] with the 297 validation ones, `x` f32 `[N, 8, 8]` holding
/// exactly the built-in's values, so training on it matches training on `digits`.
pub fn export_digits(dir: &Path) -> Result<(), TrainError> {
    let (train, val) = Dataset::digits()?;
    let mut x = Vec::new();
    let mut y = Vec::new();
    for split in [&train, &val] {
        let all: Vec<usize> = (0..split.len()).collect();
        let (mut xs, mut ys) = (Vec::new(), Vec::new());
        split.image_batch_into(&all, &mut xs, &mut ys)?;
        x.extend(xs);
        y.extend(ys);
    }
    shared_dataset::write_shared_dataset(dir, &x, &[8, 8], &y, val.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared_dataset::write_shared_dataset;
    use crate::spec::{Arch, ModelSpec, TrainSpec};
    use crate::{Model, Trainer};

    /// Samples, labels, shape and classes of an image dataset.
    fn parts(d: &Dataset) -> (&[f32], &[u32], [usize; 3], usize) {
        let Samples::Images {
            x,
            y,
            shape,
            classes,
        } = &d.samples
        else {
            panic!("not images")
        };
        (x, y, *shape, *classes)
    }

    #[test]
    fn exported_digits_load_as_the_built_in_digits() {
        let dir = tempfile::tempdir().unwrap();
        export_digits(dir.path()).unwrap();
        let (train, val) = Dataset::shared(dir.path()).unwrap();
        let (bt, bv) = Dataset::digits().unwrap();
        assert_eq!(parts(&train), parts(&bt));
        assert_eq!(parts(&val), parts(&bv));
        assert_eq!((train.input_shape(), train.classes()), ([1, 8, 8], 10));
        let spec = DataSpec {
            dataset: "digits-shared".into(),
            shared_dir: Some(dir.path().into()),
            ..DataSpec::default()
        };
        let (t, v) = Dataset::load(&spec, 0, 1).unwrap();
        assert_eq!(
            (t.len(), v.len()),
            (DIGITS_TRAIN, DIGITS_TOTAL - DIGITS_TRAIN)
        );
    }

    #[test]
    fn a_shared_name_without_a_directory_is_refused() {
        let spec = DataSpec {
            dataset: "mnist".into(),
            ..DataSpec::default()
        };
        let e = Dataset::load(&spec, 0, 1).unwrap_err().to_string();
        assert!(e.contains("\"mnist\" is a shared dataset"), "{e}");
        assert!(e.contains(crate::worker::DATASET_DIR_ENV), "{e}");
    }

    #[test]
    fn shared_splits_share_classes_and_the_tail_validates_without_val_file() {
        let dir = tempfile::tempdir().unwrap();
        // 20 samples of 3 values, labels 0..=4 in train; the validation file holds label 6.
        let x: Vec<f32> = (0..60).map(|v| v as f32 / 60.0).collect();
        let mut y: Vec<u32> = (0..20).map(|i| i % 5).collect();
        y[19] = 6;
        write_shared_dataset(dir.path(), &x, &[3], &y, 1).unwrap();
        let (t, v) = Dataset::shared(dir.path()).unwrap();
        assert_eq!((t.len(), v.len()), (19, 1));
        assert_eq!((t.classes(), v.classes()), (7, 7));
        assert_eq!(t.input_shape(), [1, 1, 3]);

        write_shared_dataset(dir.path(), &x, &[3], &y, 0).unwrap();
        let (t, v) = Dataset::shared(dir.path()).unwrap();
        assert_eq!((t.len(), v.len()), (18, 2));
        assert_eq!(parts(&v).1, &[3, 6]);
        assert_eq!(parts(&v).0, &x[54..]);
        assert_eq!((t.classes(), v.classes()), (7, 7));

        // One class only: still a two-class head.
        write_shared_dataset(dir.path(), &x, &[3], &[0; 20], 0).unwrap();
        assert_eq!(Dataset::shared(dir.path()).unwrap().0.classes(), 2);
    }

    #[test]
    fn a_val_file_of_another_sample_shape_is_refused() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        write_shared_dataset(a.path(), &[0.0; 8], &[2, 2], &[0, 1], 1).unwrap();
        write_shared_dataset(b.path(), &[0.0; 8], &[4], &[0, 1], 1).unwrap();
        std::fs::copy(b.path().join(VAL_FILE), a.path().join(VAL_FILE)).unwrap();
        let e = Dataset::shared(a.path()).unwrap_err().to_string();
        assert!(e.contains(VAL_FILE) && e.contains("differs from"), "{e}");
        let e = Dataset::shared(&a.path().join("nowhere"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(TRAIN_FILE) && e.contains("missing file"), "{e}");
    }

    #[test]
    fn models_on_shared_digits_take_the_data_shape() {
        let dir = tempfile::tempdir().unwrap();
        export_digits(dir.path()).unwrap();
        let (train, _) = Dataset::shared(dir.path()).unwrap();
        let batch = train.batch(&[0, 1, 2], &Device::Cpu).unwrap();
        assert_eq!(batch.x.dims(), &[3, 1, 8, 8]);
        for arch in [Arch::Mlp, Arch::Cnn] {
            let spec = ModelSpec {
                arch,
                hidden: vec![16],
                channels: vec![4, 8],
                fc: 16,
                ..ModelSpec::default()
            };
            let model = Model::new(&spec, train.input_shape(), train.classes(), 1).unwrap();
            let first = &model.params()[0];
            if arch == Arch::Mlp {
                assert_eq!(first.0, "fc0.bias");
                let w = &model.params()[1];
                assert_eq!((w.0.as_str(), w.1.dims()), ("fc0.weight", &[16, 64][..]));
            }
            assert_eq!(model.forward(&batch.x).unwrap().dims(), &[3, 10]);
        }
        // A [N, D] dataset is 1×1×D: the MLP takes it, the CNN refuses it clearly.
        let flat = tempfile::tempdir().unwrap();
        write_shared_dataset(flat.path(), &[0.5; 20], &[5], &[0, 1, 2, 0], 1).unwrap();
        let (t, _) = Dataset::shared(flat.path()).unwrap();
        let mlp = ModelSpec {
            hidden: vec![4],
            ..ModelSpec::default()
        };
        assert!(Model::new(&mlp, t.input_shape(), t.classes(), 1).is_ok());
        let cnn = ModelSpec {
            arch: Arch::Cnn,
            ..ModelSpec::default()
        };
        let e = Model::new(&cnn, t.input_shape(), t.classes(), 1).unwrap_err();
        assert!(e.to_string().contains("at least 4×4"), "{e}");
    }

    #[tokio::test]
    async fn a_trainer_steps_on_a_shared_dataset() {
        let dir = tempfile::tempdir().unwrap();
        export_digits(dir.path()).unwrap();
        let mut spec = TrainSpec::from_toml(
            "[model]\narch = \"cnn\"\nchannels = [4, 8]\nfc = 16\n[data]\ndataset = \"digits-copy\"",
        )
        .unwrap();
        let comm = collective::Communicator::in_memory(1, Default::default())
            .unwrap()
            .pop()
            .unwrap();
        spec.data.shared_dir = Some(dir.path().into());
        let mut t = Trainer::new(&spec, comm).unwrap();
        t.step().await.unwrap();
        assert_eq!(t.step_count(), 1);
    }

    #[test]
    fn digits_load_with_fixed_split_and_all_classes() {
        let (train, val) = Dataset::digits().unwrap();
        assert_eq!((train.len(), val.len()), (1500, 297));
        let Samples::Images { y, x, .. } = &val.samples else {
            panic!()
        };
        let mut counts = [0usize; 10];
        y.iter().for_each(|&k| counts[k as usize] += 1);
        assert_eq!(counts, [24, 30, 35, 25, 34, 27, 27, 27, 34, 34]);
        assert!(x.iter().all(|&p| (0.0..=1.0).contains(&p)));
    }

    #[test]
    fn synthetic_is_deterministic_and_text_windows_fit() {
        let spec = DataSpec {
            dataset: "synthetic".into(),
            samples: 10,
            val_samples: 3,
            shape: vec![1, 4, 4],
            ..DataSpec::default()
        };
        let (a, _) = Dataset::synthetic(&spec, 1);
        let (b, _) = Dataset::synthetic(&spec, 1);
        let (ba, bb) = (
            a.batch(&[3, 1], &Device::Cpu).unwrap(),
            b.batch(&[3, 1], &Device::Cpu).unwrap(),
        );
        assert_eq!(
            ba.x.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            bb.x.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
        let (t, v) = Dataset::project_text(32);
        assert!(t.len() > 100 && v.len() > 10);
        let batch = t.batch(&[0, t.len() - 1], &Device::Cpu).unwrap();
        assert_eq!(batch.x.dims(), &[2, 32]);
        assert_eq!(batch.y.dims(), &[64]);
    }
}
