use std::io::Write;

use proptest::prelude::*;

use super::*;

const MIB: u32 = 1 << 20;

fn write(dir: &Path, path: &str, bytes: &[u8]) {
    let path = dir.join(path);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    File::create(path).unwrap().write_all(bytes).unwrap();
}

/// Deterministic bytes without repeats (no two chunks alike), different per seed.
fn bytes(len: usize, seed: u8) -> Vec<u8> {
    let mut out = vec![0; len];
    blake3::Hasher::new()
        .update(&[seed])
        .finalize_xof()
        .fill(&mut out);
    out
}

/// A directory with nested files, an empty file, and files of exactly 2 chunks and
/// 2 chunks + 1 byte at 1 MiB chunks.
fn sample_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "empty", b"");
    write(dir.path(), "exact", &bytes(2 * MIB as usize, 1));
    write(
        dir.path(),
        "sub/deeper/plus_one",
        &bytes(2 * MIB as usize + 1, 2),
    );
    write(dir.path(), "sub/small.txt", b"hello");
    dir
}

fn chunk_hashes(n: usize) -> Vec<ChunkHash> {
    (0..n).map(|i| ChunkHash([i as u8; 32])).collect()
}

fn entry(path: &str, size: u64, chunks: usize) -> FileEntry {
    FileEntry {
        path: path.to_owned(),
        size,
        chunks: chunk_hashes(chunks),
    }
}

/// JSON of a manifest without going through `Manifest`'s checks.
fn raw(chunk_bytes: u32, files: &[FileEntry]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "chunk_bytes": chunk_bytes, "files": files })).unwrap()
}

fn decode_err(chunk_bytes: u32, files: &[FileEntry]) -> DatasetError {
    Manifest::decode(&raw(chunk_bytes, files)).unwrap_err()
}

#[test]
fn build_lists_nested_files_sorted_with_chunk_counts() {
    let dir = sample_dir();
    let manifest = Manifest::build(dir.path(), MIB).unwrap();
    let listed: Vec<_> = manifest
        .files()
        .iter()
        .map(|f| (f.path.as_str(), f.size, f.chunks.len()))
        .collect();
    let mib = u64::from(MIB);
    assert_eq!(
        listed,
        [
            ("empty", 0, 0),
            ("exact", 2 * mib, 2),
            ("sub/deeper/plus_one", 2 * mib + 1, 3),
            ("sub/small.txt", 5, 1),
        ]
    );
    assert_eq!(manifest.total_bytes(), 4 * mib + 6);
    assert_eq!(manifest.chunk_count(), 6);
    assert_eq!(manifest.chunk_bytes(), MIB);
    assert_eq!(manifest.file_index("sub/small.txt"), Some(3));
    assert_eq!(manifest.file_index("sub"), None);
    let small = &manifest.files()[3];
    assert_eq!(small.chunks, [ChunkHash::from(blake3::hash(b"hello"))]);
}

#[test]
fn build_of_a_file_names_it_by_its_file_name() {
    let dir = sample_dir();
    let manifest = Manifest::build(&dir.path().join("sub/small.txt"), MIB).unwrap();
    assert_eq!(manifest.files().len(), 1);
    assert_eq!(manifest.files()[0].path, "small.txt");
    assert_eq!(manifest.total_bytes(), 5);
}

#[test]
fn root_is_stable_and_changes_with_one_byte() {
    let dir = sample_dir();
    let first = Manifest::build(dir.path(), MIB).unwrap();
    let root = first.root();
    assert_eq!(Manifest::build(dir.path(), MIB).unwrap().root(), root);

    let mut changed = bytes(2 * MIB as usize + 1, 2);
    changed[MIB as usize + 7] ^= 1;
    write(dir.path(), "sub/deeper/plus_one", &changed);
    let other = Manifest::build(dir.path(), MIB).unwrap();
    assert_ne!(other.root(), root);
    // Only the chunk holding the changed byte changed.
    let (old, new) = (&first.files()[2].chunks, &other.files()[2].chunks);
    assert_eq!((old[0], old[2]), (new[0], new[2]));
    assert_ne!(old[1], new[1]);
    assert_eq!(first.files()[1], other.files()[1]);

    // The chunk size is part of the name.
    let at_2_mib = Manifest::build(dir.path(), 2 * MIB).unwrap();
    assert_ne!(at_2_mib.root(), other.root());
}

#[test]
fn build_refuses_symlinks_empty_directories_and_bad_chunk_sizes() {
    let dir = sample_dir();
    std::os::unix::fs::symlink(dir.path().join("exact"), dir.path().join("sub/link")).unwrap();
    let err = Manifest::build(dir.path(), MIB).unwrap_err();
    assert!(
        matches!(&err, DatasetError::UnsupportedFile { path, kind: "symlink" } if path.ends_with("sub/link")),
        "{err}"
    );

    let empty = tempfile::tempdir().unwrap();
    fs::create_dir_all(empty.path().join("a/b")).unwrap();
    let err = Manifest::build(empty.path(), MIB).unwrap_err();
    assert!(matches!(err, DatasetError::EmptyDirectory { .. }), "{err}");

    for chunk_bytes in [0, MIB - 1, 4 * MIB + 1] {
        let err = Manifest::build(empty.path(), chunk_bytes).unwrap_err();
        assert!(
            matches!(err, DatasetError::ChunkBytesOutOfRange { chunk_bytes: c } if c == chunk_bytes),
            "{err}"
        );
    }

    let err = Manifest::build(&empty.path().join("missing"), MIB).unwrap_err();
    assert!(matches!(err, DatasetError::Io { .. }), "{err}");
}

#[test]
fn encode_decode_roundtrip_keeps_the_root() {
    let manifest = Manifest::build(sample_dir().path(), MIB).unwrap();
    let decoded = Manifest::decode(&manifest.encode()).unwrap();
    assert_eq!(decoded, manifest);
    assert_eq!(decoded.root(), manifest.root());

    // Another layout of the same content: same manifest, same root.
    let mut files = manifest.files().to_vec();
    files.reverse();
    let pretty = serde_json::to_vec_pretty(
        &serde_json::json!({ "files": files, "chunk_bytes": manifest.chunk_bytes() }),
    )
    .unwrap();
    assert_eq!(Manifest::decode(&pretty).unwrap().root(), manifest.root());
}

/// Pins the canonical encoding: if this fails, every dataset's root has changed.
#[test]
fn canonical_encoding_and_root_are_pinned() {
    let manifest = Manifest::new(MIB, vec![entry("b", 0, 0), entry("a/x", 3, 1)]).unwrap();
    let zeros = "00".repeat(32);
    let expected = format!(
        r#"{{"chunk_bytes":1048576,"files":[{{"path":"a/x","size":3,"chunks":["{zeros}"]}},{{"path":"b","size":0,"chunks":[]}}]}}"#
    );
    assert_eq!(String::from_utf8(manifest.encode()).unwrap(), expected);
    let root = manifest.root();
    assert_eq!(root, Root::from(blake3::hash(expected.as_bytes())));
    assert_eq!(root.to_string(), ROOT_PINNED);
    assert_eq!(root.to_string().len(), 64);
    assert_eq!(ROOT_PINNED.parse::<Root>().unwrap(), root);
    assert_eq!(
        serde_json::to_string(&root).unwrap(),
        format!("\"{ROOT_PINNED}\"")
    );
}

const ROOT_PINNED: &str = "ddfa7ece24fb15030a01be5fda525e32f55dde911fa3ba17bbc86689e5f28b23";

#[test]
fn small_datasets_get_small_chunks() {
    assert_eq!(chunk_bytes_for(0), 1 << 20);
    assert_eq!(chunk_bytes_for(64 << 30), 1 << 20);
    assert_eq!(chunk_bytes_for((64 << 30) + 1), 2 << 20);
    assert_eq!(chunk_bytes_for(200 << 30), 4 << 20);
    assert_eq!(chunk_bytes_for(u64::MAX), 4 << 20);
}

#[test]
fn decode_refuses_oversized_and_malformed_manifests() {
    let err = Manifest::decode(&vec![b' '; MANIFEST_BYTES_MAX + 1]).unwrap_err();
    assert!(
        matches!(err, DatasetError::ManifestTooLarge { bytes, .. } if bytes == MANIFEST_BYTES_MAX as u64 + 1),
        "{err}"
    );

    let good = String::from_utf8(raw(MIB, &[entry("a", 1, 1)])).unwrap();
    let bad_hex = good.replacen("0000", "zz00", 1);
    let short_hex = good.replacen("0000", "", 1);
    let unknown_field = good.replacen("\"size\"", "\"mode\":1,\"size\"", 1);
    let missing_field = r#"{"files":[]}"#.to_owned();
    for bytes in [
        "".to_owned(),
        "{".to_owned(),
        "[]".to_owned(),
        bad_hex,
        short_hex,
        unknown_field,
        missing_field,
    ] {
        let err = Manifest::decode(bytes.as_bytes()).unwrap_err();
        assert!(matches!(err, DatasetError::Malformed(_)), "{bytes}: {err}");
    }
    Manifest::decode(good.as_bytes()).unwrap();
}

#[test]
fn decode_refuses_unsafe_paths() {
    let long = "a/".repeat(PATH_BYTES_MAX / 2) + "b";
    for path in [
        "",
        "/etc/passwd",
        "../up",
        "a/../../up",
        "a/..",
        "./a",
        "a//b",
        "a/",
        "a\\b",
        "a\0b",
        "a\nb",
        long.as_str(),
    ] {
        let err = decode_err(MIB, &[entry(path, 1, 1)]);
        assert!(
            matches!(&err, DatasetError::UnsafePath { path: p, .. } if p.len() <= PATH_IN_ERROR_BYTES_MAX + 3),
            "{path:?}: {err}"
        );
    }
    // Dots inside names are fine.
    Manifest::decode(&raw(MIB, &[entry("a..b/.hidden/c.", 1, 1)])).unwrap();
}

#[test]
fn decode_refuses_duplicate_and_conflicting_paths() {
    let err = decode_err(MIB, &[entry("a", 1, 1), entry("b", 1, 1), entry("a", 0, 0)]);
    assert!(
        matches!(&err, DatasetError::DuplicatePath { path } if path == "a"),
        "{err}"
    );
    // `a.txt` sorts between `a` and `a/b`.
    let err = decode_err(
        MIB,
        &[entry("a/b", 1, 1), entry("a.txt", 1, 1), entry("a", 1, 1)],
    );
    assert!(
        matches!(&err, DatasetError::PathConflict { path, file } if path == "a/b" && file == "a"),
        "{err}"
    );
    Manifest::decode(&raw(MIB, &[entry("a/b", 1, 1), entry("ab", 1, 1)])).unwrap();
}

#[test]
fn decode_refuses_wrong_chunk_counts() {
    let mib = u64::from(MIB);
    for (size, chunks, expected) in [
        (0, 1, 0),
        (1, 0, 1),
        (mib, 2, 1),
        (mib + 1, 1, 2),
        (u64::MAX, 1, u64::MAX.div_ceil(mib)),
    ] {
        let err = decode_err(MIB, &[entry("f", size, chunks)]);
        assert!(
            matches!(&err, DatasetError::ChunkCountMismatch { path, size: s, chunks: c, expected: e }
                    if path == "f" && *s == size && *c == chunks && *e == expected),
            "{size} {chunks}: {err}"
        );
    }
}

#[test]
fn decode_refuses_bad_chunk_sizes_and_file_counts() {
    for chunk_bytes in [0, MIB - 1, 4 * MIB + 1, u32::MAX] {
        let err = decode_err(chunk_bytes, &[entry("a", 0, 0)]);
        assert!(
            matches!(err, DatasetError::ChunkBytesOutOfRange { chunk_bytes: c } if c == chunk_bytes),
            "{err}"
        );
    }
    assert!(matches!(decode_err(MIB, &[]), DatasetError::NoFiles));

    let many: Vec<_> = (0..=FILES_MAX)
        .map(|i| entry(&i.to_string(), 0, 0))
        .collect();
    let err = decode_err(MIB, &many);
    assert!(
        matches!(err, DatasetError::TooManyFiles { max: FILES_MAX }),
        "{err}"
    );
}

#[test]
fn new_refuses_a_manifest_too_large_to_decode() {
    // One file of 300,000 chunks: under the limit as a count, over it encoded.
    let chunks = 300_000;
    let err = Manifest::new(
        MIB,
        vec![entry("big", chunks as u64 * u64::from(MIB), chunks)],
    )
    .unwrap_err();
    assert!(
        matches!(err, DatasetError::ManifestTooLarge { .. }),
        "{err}"
    );
}

#[test]
fn verify_chunk_accepts_the_right_bytes_only() {
    let dir = sample_dir();
    let manifest = Manifest::build(dir.path(), MIB).unwrap();
    let file = manifest.file_index("sub/deeper/plus_one").unwrap();
    let data = bytes(2 * MIB as usize + 1, 2);
    for chunk in 0..3 {
        let (offset, len) = manifest.chunk_range(file, chunk).unwrap();
        let piece = &data[offset as usize..][..len as usize];
        manifest.verify_chunk(file, chunk, piece).unwrap();
    }

    let mut flipped = data[..MIB as usize].to_vec();
    flipped[12345] ^= 0x10;
    let err = manifest.verify_chunk(file, 0, &flipped).unwrap_err();
    assert!(
        matches!(&err, DatasetError::CorruptChunk { path, index: 0 } if path == "sub/deeper/plus_one"),
        "{err}"
    );

    // A right chunk is accepted only where it belongs.
    let err = manifest
        .verify_chunk(file, 1, &data[..MIB as usize])
        .unwrap_err();
    assert!(
        matches!(err, DatasetError::CorruptChunk { index: 1, .. }),
        "{err}"
    );

    let err = manifest
        .verify_chunk(file, 0, &data[..MIB as usize - 1])
        .unwrap_err();
    assert!(
        matches!(err, DatasetError::ChunkLength { index: 0, expected, actual, .. }
                if expected == MIB && actual == MIB as usize - 1),
        "{err}"
    );
    let err = manifest.verify_chunk(file, 2, &data[..2]).unwrap_err();
    assert!(
        matches!(
            err,
            DatasetError::ChunkLength {
                index: 2,
                expected: 1,
                actual: 2,
                ..
            }
        ),
        "{err}"
    );

    let empty = manifest.file_index("empty").unwrap();
    for (f, c) in [(empty, 0), (file, 3), (manifest.files().len(), 0)] {
        let err = manifest.verify_chunk(f, c, b"").unwrap_err();
        assert!(matches!(err, DatasetError::NoSuchChunk { .. }), "{err}");
    }
}

#[test]
fn error_messages_name_the_path() {
    let err = decode_err(MIB, &[entry("../x", 1, 1)]);
    assert_eq!(err.to_string(), r#"path "../x": `..` component"#);
    let err = decode_err(MIB, &[entry("f", 1, 2)]);
    assert_eq!(
        err.to_string(),
        r#"path "f": 2 chunks for 1 bytes, expected 1"#
    );
    let err = decode_err(7, &[entry("f", 1, 1)]);
    assert_eq!(
        err.to_string(),
        "chunk_bytes: 7 is outside 1048576..=4194304"
    );
}

fn file_entry() -> impl Strategy<Value = FileEntry> {
    // Sizes up to 20 chunks of the largest size, with the edges (0, k·chunk, k·chunk±1)
    // likely through the chunk-multiple strategy.
    let max = 20 * u64::from(CHUNK_BYTES_MAX);
    let size = prop_oneof![
        0..=max,
        (0u64..20, -1i64..=1).prop_map(|(k, d)| (k * u64::from(MIB)).saturating_add_signed(d)),
    ];
    ("[a-z]{1,8}(/[a-z.]{1,8}){0,2}", size).prop_map(|(path, size)| FileEntry {
        path,
        size,
        chunks: Vec::new(),
    })
}

fn manifest() -> impl Strategy<Value = Manifest> {
    (
        CHUNK_BYTES_MIN..=CHUNK_BYTES_MAX,
        prop::collection::vec(file_entry(), 1..8),
    )
        .prop_filter_map(
            "paths must be distinct and not nest",
            |(chunk_bytes, files)| {
                let files = files
                    .into_iter()
                    .map(|mut file| {
                        let n = file.size.div_ceil(u64::from(chunk_bytes)) as usize;
                        file.chunks = (0..n)
                            .map(|i| ChunkHash::from(blake3::hash(&i.to_le_bytes())))
                            .collect();
                        file
                    })
                    .collect();
                Manifest::new(chunk_bytes, files).ok()
            },
        )
}

proptest! {
    /// Every file's chunk ranges tile it exactly: from 0, each where the last ended, all
    /// but the last `chunk_bytes` long, none empty, the last ending at the file's size.
    #[test]
    fn chunk_ranges_tile_each_file(manifest in manifest()) {
        let chunk_bytes = manifest.chunk_bytes();
        for (f, file) in manifest.files().iter().enumerate() {
            let mut end = 0u64;
            for c in 0..file.chunks.len() {
                let (offset, len) = manifest.chunk_range(f, c).unwrap();
                prop_assert_eq!(offset, end);
                prop_assert!(len > 0 && len <= chunk_bytes);
                if c + 1 < file.chunks.len() {
                    prop_assert_eq!(len, chunk_bytes);
                }
                end = offset + u64::from(len);
            }
            prop_assert_eq!(end, file.size);
            prop_assert!(manifest.chunk_range(f, file.chunks.len()).is_err());
        }
    }

    /// Decoding the canonical encoding gives the same manifest and root.
    #[test]
    fn encode_decode_roundtrip(manifest in manifest()) {
        let decoded = Manifest::decode(&manifest.encode()).unwrap();
        prop_assert_eq!(decoded.root(), manifest.root());
        prop_assert_eq!(decoded, manifest);
    }
}
