use super::*;
use crate::datasets::CHUNK_BYTES_MIN;

/// A small dataset directory: `a.bin` (2 chunks and 77 bytes of the smallest chunk
/// size), `empty`, `sub/b.txt` ("hello").
pub(in crate::datasets) fn tree(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    let big: Vec<u8> = (0..(CHUNK_BYTES_MIN as usize * 2 + 77))
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    fs::write(src.join("a.bin"), &big).unwrap();
    fs::write(src.join("empty"), b"").unwrap();
    fs::write(src.join("sub/b.txt"), b"hello").unwrap();
    src
}

fn all_chunks(store: &Store, held: &Held, m: &Manifest) -> Vec<Vec<u8>> {
    let index = ChunkIndex::new(m);
    (0..index.len())
        .map(|g| store.read_chunk(held, m, &index, g).unwrap())
        .collect()
}

#[test]
fn chunk_index_numbers_chunks_across_files_skipping_empty_ones() {
    let dir = tempfile::tempdir().unwrap();
    let m = Manifest::build(&tree(dir.path()), CHUNK_BYTES_MIN).unwrap();
    let index = ChunkIndex::new(&m);
    assert_eq!(index.len(), 4);
    let places: Vec<_> = (0..4).map(|g| index.place(&m, g).unwrap()).collect();
    assert_eq!((places[2].file, places[2].chunk, places[2].len), (0, 2, 77));
    // "empty" (file 1) has no chunk: chunk 3 is sub/b.txt's first.
    assert_eq!((places[3].file, places[3].chunk, places[3].len), (2, 0, 5));
    assert!(index.place(&m, 4).is_none());
}

#[test]
fn import_then_fetch_into_another_store_gives_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let src = tree(dir.path());
    let a = Store::open(&dir.path().join("a")).unwrap();
    let m = a.import(&src, CHUNK_BYTES_MIN).unwrap();
    let root = m.root();
    let whole = Held {
        root,
        complete: true,
    };
    assert_eq!(a.scan().unwrap(), vec![whole]);
    let chunks = all_chunks(&a, &whole, &a.manifest(&whole).unwrap());

    let b = Store::open(&dir.path().join("b")).unwrap();
    let mut part = b.begin(&m).unwrap();
    assert_eq!(
        b.scan().unwrap(),
        vec![Held {
            root,
            complete: false
        }]
    );
    assert!(b.files_dir(&root).is_none(), "not visible while partial");
    for (g, bytes) in chunks.iter().enumerate() {
        part.write_chunk(&m, g as u64, bytes).unwrap();
    }
    let files = b.finish(part).unwrap();
    assert_eq!(b.scan().unwrap(), vec![whole]);
    assert_eq!(
        fs::read(files.join("a.bin")).unwrap(),
        fs::read(src.join("a.bin")).unwrap()
    );
    assert_eq!(fs::read(files.join("sub/b.txt")).unwrap(), b"hello");
    assert_eq!(fs::read(files.join("empty")).unwrap(), b"");
}

/// [`tree`] imported into store `a` under `dir`: its source, manifest and chunks.
fn imported(dir: &tempfile::TempDir) -> (PathBuf, Manifest, Vec<Vec<u8>>) {
    let src = tree(dir.path());
    let a = Store::open(&dir.path().join("a")).unwrap();
    let m = a.import(&src, CHUNK_BYTES_MIN).unwrap();
    let whole = Held {
        root: m.root(),
        complete: true,
    };
    let chunks = all_chunks(&a, &whole, &m);
    (src, m, chunks)
}

#[test]
fn chunks_written_at_once_under_a_shared_borrow_and_recorded_once_make_the_whole_copy() {
    let dir = tempfile::tempdir().unwrap();
    let (src, m, chunks) = imported(&dir);
    let b = Store::open(&dir.path().join("b")).unwrap();
    let part = std::sync::RwLock::new(b.begin(&m).unwrap());
    // Every chunk's bytes from its own thread at once, as a fetch's holders write them;
    // chunk 0 twice (an endgame's second copy).
    std::thread::scope(|s| {
        for (g, bytes) in chunks.iter().enumerate().chain([(0, &chunks[0])]) {
            let (part, m) = (&part, &m);
            s.spawn(move || part.read().unwrap().write_data(m, g as u64, bytes).unwrap());
        }
    });
    let mut part = part.into_inner().unwrap();
    assert!(part.have().is_empty(), "written is not recorded");
    for g in (0..chunks.len() as u64).chain([0]) {
        part.record(g).unwrap();
    }
    let log = dir.path().join(format!("b/{}.part/{HAVE_FILE}", m.root()));
    assert_eq!(
        fs::read(log).unwrap().len(),
        4 * chunks.len(),
        "each chunk logged once"
    );
    let files = b.finish(part).unwrap();
    assert_eq!(
        fs::read(files.join("a.bin")).unwrap(),
        fs::read(src.join("a.bin")).unwrap()
    );
    assert_eq!(fs::read(files.join("sub/b.txt")).unwrap(), b"hello");
}

#[test]
fn a_resumed_fetch_keeps_only_chunks_that_still_verify() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, chunks) = imported(&dir);
    let b = Store::open(&dir.path().join("b")).unwrap();
    let mut part = b.begin(&m).unwrap();
    part.write_chunk(&m, 0, &chunks[0]).unwrap();
    part.write_chunk(&m, 1, &chunks[1]).unwrap();
    drop(part); // the node dies here
                // chunk 1's bytes rot on disk meanwhile
    let path = dir.path().join(format!("b/{}.part/files/a.bin", m.root()));
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(b"XX", CHUNK_BYTES_MIN as u64 + 5).unwrap();
    // The list holds chunk 0 again, a chunk the dataset lacks, and a torn append.
    let have = dir.path().join(format!("b/{}.part/{HAVE_FILE}", m.root()));
    let mut log = OpenOptions::new().append(true).open(have).unwrap();
    for g in [0u32, 0, 9_999] {
        log.write_all(&g.to_le_bytes()).unwrap();
    }
    log.write_all(&[1, 0]).unwrap();
    let part = b.begin(&m).unwrap();
    assert!(part.have().contains(0));
    assert!(
        !part.have().contains(1),
        "a chunk that no longer verifies is fetched again"
    );
    assert_eq!(part.have().count(), 1);
}

/// A stored manifest over the limit (sparse here) is refused before it is read.
#[test]
fn a_stored_manifest_over_the_limit_is_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let f = File::create(dir.path().join(MANIFEST_FILE)).unwrap();
    f.set_len(MANIFEST_BYTES_MAX as u64 + 1).unwrap();
    assert!(matches!(
        read_manifest(dir.path(), &Root([0; 32])),
        Err(DatasetError::ManifestTooLarge { bytes, max: MANIFEST_BYTES_MAX })
            if bytes == MANIFEST_BYTES_MAX as u64 + 1
    ));
}

#[test]
fn a_file_changed_while_added_is_refused_and_nothing_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let src = tree(dir.path());
    let m = Manifest::build(&src, CHUNK_BYTES_MIN).unwrap();
    fs::write(src.join("sub/b.txt"), b"HELLO").unwrap();
    let tmp = dir.path().join("copy");
    assert!(matches!(
        copy_checked(&src, &m, &tmp, &HostAccess::node()),
        Err(DatasetError::ChangedWhileAdding { .. })
    ));
}

/// `/etc/shadow` added through a link became a world-readable copy: now the link is
/// refused, and a copy never gets wider permission bits than its source.
#[test]
fn adds_refuse_a_linked_path_and_keep_at_most_the_sources_mode() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    fs::write(&secret, b"root:x:0:0").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    let link = dir.path().join("innocent");
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let err = store.import(&link, CHUNK_BYTES_MIN).unwrap_err();
    assert!(
        matches!(&err, DatasetError::UnsupportedFile { path, kind: "symlink" } if *path == link),
        "{err}"
    );
    assert!(err.to_string().contains("innocent"), "{err}");
    let linked_dir = dir.path().join("linked-dir");
    std::os::unix::fs::symlink(dir.path(), &linked_dir).unwrap();
    assert!(matches!(
        store.import(&linked_dir, CHUNK_BYTES_MIN),
        Err(DatasetError::UnsupportedFile {
            kind: "symlink",
            ..
        })
    ));

    // Named directly, its copy is no wider than the source (0600), nor is a 0640 one.
    let m = store.import(&secret, CHUNK_BYTES_MIN).unwrap();
    let copy = store.files_dir(&m.root()).unwrap().join("secret");
    let mode = fs::metadata(&copy).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & !0o600, 0, "{mode:o}");
    let src = tree(dir.path());
    fs::set_permissions(src.join("sub/b.txt"), fs::Permissions::from_mode(0o640)).unwrap();
    let m = store.import(&src, CHUNK_BYTES_MIN).unwrap();
    let copy = store.files_dir(&m.root()).unwrap().join("sub/b.txt");
    let mode = fs::metadata(&copy).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & !0o640, 0, "{mode:o}");
}

/// A FIFO below the directory is refused, not waited on.
#[test]
fn adds_refuse_special_files() {
    let dir = tempfile::tempdir().unwrap();
    let src = tree(dir.path());
    let fifo = src.join("sub/pipe");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a plain syscall with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let store = Store::open(&dir.path().join("store")).unwrap();
    let err = store.import(&src, CHUNK_BYTES_MIN).unwrap_err();
    assert!(
        matches!(&err, DatasetError::UnsupportedFile { path, kind: "fifo" } if *path == fifo),
        "{err}"
    );
}

/// A file swapped for a link to another file after it was listed is refused when opened.
#[test]
fn a_file_swapped_for_a_link_after_listing_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    fs::write(&file, b"mine").unwrap();
    fs::write(dir.path().join("other"), b"theirs").unwrap();
    let id = {
        use std::os::unix::fs::MetadataExt;
        let m = fs::symlink_metadata(&file).unwrap();
        (m.dev(), m.ino())
    };
    // Kept aside, so its inode is not reused by the file written below.
    fs::rename(&file, dir.path().join("kept")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("other"), &file).unwrap();
    assert!(matches!(
        open_source(&file, Some(id), &HostAccess::node()),
        Err(DatasetError::UnsupportedFile {
            kind: "symlink",
            ..
        })
    ));
    fs::remove_file(&file).unwrap();
    fs::write(&file, b"new file, same name").unwrap();
    assert!(matches!(
        open_source(&file, Some(id), &HostAccess::node()),
        Err(DatasetError::ChangedWhileAdding { .. })
    ));
}

#[test]
fn open_removes_a_half_copied_add() {
    let dir = tempfile::tempdir().unwrap();
    let left = dir.path().join(".import-0011");
    fs::create_dir_all(left.join("files")).unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert!(!left.exists());
    assert!(store.scan().unwrap().is_empty());
}

#[test]
fn chunk_sets_refuse_bitmaps_of_the_wrong_shape() {
    assert!(ChunkSet::from_bitmap(10, vec![0xff, 0x03]).is_some());
    assert!(
        ChunkSet::from_bitmap(10, vec![0xff, 0x04]).is_none(),
        "bit 10 set"
    );
    assert!(ChunkSet::from_bitmap(10, vec![0xff]).is_none(), "too short");
    let mut s = ChunkSet::empty(10);
    assert!(s.insert(9));
    assert!(!s.insert(9));
    assert!(!s.insert(10));
    assert_eq!(s.count(), 1);
    s.remove(9);
    assert!(s.is_empty());
    assert!(ChunkSet::full(10).is_full());
}
