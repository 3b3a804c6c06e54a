use std::fs;
use std::os::unix::fs::PermissionsExt;

use super::*;
use crate::datasets::store::tests::tree;
use crate::datasets::store::{ChunkIndex, Held, Store};
use crate::datasets::CHUNK_BYTES_MIN;

/// A store holding `tree`, its manifest and every chunk in dataset order.
fn stored(dir: &Path) -> (PathBuf, Manifest, Vec<(ChunkPlace, Vec<u8>)>) {
    let src = tree(dir);
    let store = Store::open(&dir.join("store")).unwrap();
    let m = store.import(&src, CHUNK_BYTES_MIN).unwrap();
    let held = Held {
        root: m.root(),
        complete: true,
    };
    let index = ChunkIndex::new(&m);
    let chunks = (0..index.len())
        .map(|g| {
            let place = index.place(&m, g).unwrap();
            (place, store.read_chunk(&held, &m, &index, g).unwrap())
        })
        .collect();
    (src, m, chunks)
}

fn same_tree(a: &Path, b: &Path) {
    for rel in ["a.bin", "empty", "sub/b.txt"] {
        assert_eq!(
            fs::read(a.join(rel)).unwrap(),
            fs::read(b.join(rel)).unwrap()
        );
    }
}

/// Every name under `dir`, relative, sorted (directories included).
fn names(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn chunks_written_in_any_order_appear_only_at_finish_and_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let (src, m, chunks) = stored(dir.path());
    let to = dir.path().join("to");
    let export = Export::begin(&m, &to).unwrap();
    for (place, bytes) in chunks.iter().rev() {
        export.write_chunk(*place, bytes).unwrap();
        for rel in ["a.bin", "empty", "sub/b.txt"] {
            assert!(!to.join(rel).exists(), "{rel} visible before finish");
        }
    }
    assert!(names(&to).iter().any(|n| n.contains(".a.bin.ringleader-")));
    export.finish().unwrap();
    same_tree(&src, &to);
    assert_eq!(
        names(&to),
        ["a.bin", "empty", "sub", "sub/b.txt"],
        "no temporary left"
    );
    let mode = fs::metadata(to.join("a.bin")).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "{mode:o}: private");
}

#[test]
fn an_export_dropped_unfinished_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, chunks) = stored(dir.path());
    let to = dir.path().join("to");
    let export = Export::begin(&m, &to).unwrap();
    export.write_chunk(chunks[0].0, &chunks[0].1).unwrap();
    drop(export); // a fetch that failed
    assert_eq!(names(&to), ["sub"], "only directories");
}

#[test]
fn same_bytes_are_left_alone_and_other_bytes_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (src, m, chunks) = stored(dir.path());
    let to = dir.path().join("to");
    fs::create_dir_all(to.join("sub")).unwrap();
    fs::copy(src.join("a.bin"), to.join("a.bin")).unwrap();
    let export = Export::begin(&m, &to).unwrap();
    let a = m.file_index("a.bin").unwrap();
    assert!(!export.writes(a), "a.bin is there with the same bytes");
    assert!(export.writes(m.file_index("sub/b.txt").unwrap()));
    for (place, bytes) in &chunks {
        export.write_chunk(*place, bytes).unwrap();
    }
    export.finish().unwrap();
    same_tree(&src, &to);

    let clash = dir.path().join("clash");
    fs::create_dir_all(clash.join("sub")).unwrap();
    fs::write(clash.join("sub/b.txt"), b"mine").unwrap();
    let err = Export::begin(&m, &clash).unwrap_err();
    assert!(
        matches!(&err, DatasetError::ExportExists { path } if *path == clash.join("sub/b.txt")),
        "{err}"
    );
    assert_eq!(fs::read(clash.join("sub/b.txt")).unwrap(), b"mine");
    // The temporaries made for the files before it are gone again.
    assert_eq!(names(&clash), ["sub", "sub/b.txt"]);
}

#[test]
fn a_file_that_appears_at_its_place_meanwhile_is_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, chunks) = stored(dir.path());
    let to = dir.path().join("to");
    let export = Export::begin(&m, &to).unwrap();
    for (place, bytes) in &chunks {
        export.write_chunk(*place, bytes).unwrap();
    }
    fs::write(to.join("sub/b.txt"), b"theirs").unwrap();
    let err = export.finish().unwrap_err();
    assert!(
        matches!(err, DatasetError::ExportBlocked { kind: "file", .. }),
        "{err}"
    );
    assert_eq!(fs::read(to.join("sub/b.txt")).unwrap(), b"theirs");
    assert!(
        !names(&to).iter().any(|n| n.contains(".ringleader-")),
        "temporaries removed: {:?}",
        names(&to)
    );
}

/// `get --to` never writes through a link: not at the directory, not at a directory
/// below it, not at a file's place; what the links point to is left untouched.
#[test]
fn an_export_never_writes_through_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let src = tree(dir.path());
    let store = Store::open(&dir.path().join("store")).unwrap();
    let m = store.import(&src, CHUNK_BYTES_MIN).unwrap();
    let files = store.files_dir(&m.root()).unwrap();
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("b.txt"), b"victim").unwrap();

    let to = dir.path().join("to-link");
    std::os::unix::fs::symlink(&outside, &to).unwrap();
    let err = export_whole(&files, &m, &to).unwrap_err();
    assert!(
        matches!(&err, DatasetError::ExportBlocked { path, kind: "symlink" } if *path == to),
        "{err}"
    );

    let to = dir.path().join("out-1");
    fs::create_dir(&to).unwrap();
    std::os::unix::fs::symlink(&outside, to.join("sub")).unwrap();
    let err = export_whole(&files, &m, &to).unwrap_err();
    assert!(
        matches!(&err, DatasetError::ExportBlocked { path, kind: "symlink" } if *path == to.join("sub")),
        "{err}"
    );

    let to = dir.path().join("out-2");
    fs::create_dir_all(to.join("sub")).unwrap();
    std::os::unix::fs::symlink(outside.join("b.txt"), to.join("sub/b.txt")).unwrap();
    let err = export_whole(&files, &m, &to).unwrap_err();
    assert!(
        matches!(&err, DatasetError::ExportBlocked { path, kind: "symlink" } if *path == to.join("sub/b.txt")),
        "{err}"
    );
    assert!(err.to_string().contains("sub/b.txt"), "{err}");
    assert_eq!(fs::read(outside.join("b.txt")).unwrap(), b"victim");
    assert_eq!(
        fs::read_dir(&outside).unwrap().count(),
        1,
        "nothing written there"
    );
    assert!(
        !names(&to).iter().any(|n| n.contains(".ringleader-")),
        "{:?}",
        names(&to)
    );

    // A plain directory works, twice (the same bytes again are fine), and its files
    // are private.
    let to = dir.path().join("out-3");
    export_whole(&files, &m, &to).unwrap();
    export_whole(&files, &m, &to).unwrap();
    same_tree(&src, &to);
    let mode = fs::metadata(to.join("a.bin")).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "{mode:o}");
}
