//! The loader core end to end: shards on disk -> B streams -> windows, against a plain
//! reference (the concatenated bytes, encoded from the reset state after a 64-byte warm-up).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use atomdata::atomizer::{
    encode_bytes, FEATURE_DIM, FEATURE_IDS_PER_TICK, FEATURE_ID_PAD, HORIZON,
};
use atomdata::state::{STATE_FORMAT, STATE_VERSION};
use atomdata::{BatchedByteStream, ByteCorpus, Error, Offsets, PackMode, SavedState};
use proptest::prelude::*;

/// A thread pool of `n` threads (the caller's, as the binding gives a stream).
fn pool(n: usize) -> Option<Arc<rayon::ThreadPool>> {
    Some(Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap(),
    ))
}

/// Write shards `000`, `001`, ... with the given contents; return the glob matching them.
fn write_shards(dir: &Path, shards: &[Vec<u8>]) -> String {
    for (i, data) in shards.iter().enumerate() {
        File::create(dir.join(format!("{i:03}")))
            .unwrap()
            .write_all(data)
            .unwrap();
    }
    dir.join("[0-9][0-9][0-9]").display().to_string()
}

/// llm.c's trick: byte g of the concatenation is g % 251, so every byte says where it is.
fn positional_shards(sizes: &[usize]) -> Vec<Vec<u8>> {
    let mut g = 0;
    sizes
        .iter()
        .map(|&n| {
            let shard = (g..g + n).map(|x| (x % 251) as u8).collect();
            g += n;
            shard
        })
        .collect()
}

struct Window {
    cur: Vec<u8>,
    feats: Vec<f32>,
    tgt: Vec<u8>,
}

fn window(s: &mut BatchedByteStream, k: usize) -> Window {
    let n = k * s.b();
    let mut w = Window {
        cur: vec![0; n],
        feats: vec![0.0; n * FEATURE_DIM],
        tgt: vec![0; n],
    };
    s.next_window(k, &mut w.cur, &mut w.feats, &mut w.tgt)
        .unwrap();
    w
}

/// Reference for stream `i` of a window: the circular string's ticks from `offset`.
fn reference(data: &[u8], offset: usize, k: usize, mode: PackMode) -> Window {
    let n = data.len();
    let bytes: Vec<u8> = (0..HORIZON + k + 1)
        .map(|j| data[(offset + n * (HORIZON / n + 1) + j - HORIZON) % n])
        .collect();
    let feats = encode_bytes(&bytes[..HORIZON + k], mode);
    Window {
        cur: bytes[HORIZON..HORIZON + k].to_vec(),
        feats: feats[HORIZON * FEATURE_DIM..].to_vec(),
        tgt: bytes[HORIZON + 1..].to_vec(),
    }
}

/// Assert stream `i` of window `w` (B streams) equals `r`.
fn assert_stream_eq(w: &Window, b: usize, i: usize, r: &Window) {
    let k = r.cur.len();
    for t in 0..k {
        let row = t * b + i;
        assert_eq!(w.cur[row], r.cur[t], "cur, stream {i} tick {t}");
        assert_eq!(w.tgt[row], r.tgt[t], "tgt, stream {i} tick {t}");
        assert!(
            w.feats[row * FEATURE_DIM..(row + 1) * FEATURE_DIM]
                == r.feats[t * FEATURE_DIM..(t + 1) * FEATURE_DIM],
            "features, stream {i} tick {t}"
        );
    }
}

fn open(pattern: &str, resident: bool) -> Arc<ByteCorpus> {
    Arc::new(ByteCorpus::open(&[pattern], resident).unwrap())
}

#[test]
fn shards_that_encode_their_position_read_as_one_circular_string() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = [0, 1, 7, 300, 0, 2, 1000, 1];
    let pattern = write_shards(dir.path(), &positional_shards(&sizes));
    let size: usize = sizes.iter().sum();
    let data: Vec<u8> = positional_shards(&sizes).concat();
    // Streams starting at and around every seam, and just before the wrap.
    let mut offsets = vec![size - 3, size - 1, 0];
    let mut seam = 0;
    for s in sizes {
        seam += s;
        offsets.extend([seam.saturating_sub(2), seam % size]);
    }
    let offsets: Vec<u64> = offsets.iter().map(|&o| o as u64).collect();
    for resident in [false, true] {
        for mode in PackMode::ALL {
            let corpus = open(&pattern, resident);
            assert_eq!(corpus.size(), size as u64);
            let b = offsets.len();
            let mut s =
                BatchedByteStream::new(corpus, b, mode, &Offsets::List(offsets.clone()), pool(2))
                    .unwrap();
            let k = 40;
            let w = window(&mut s, k);
            for (i, &o) in offsets.iter().enumerate() {
                for t in 0..k {
                    let g = (o as usize + t) % size;
                    assert_eq!(w.cur[t * b + i] as usize, g % 251);
                    assert_eq!(w.tgt[t * b + i] as usize, (g + 1) % size % 251);
                }
                assert_stream_eq(&w, b, i, &reference(&data, o as usize, k, mode));
            }
        }
    }
}

#[test]
fn b_streams_equal_b_single_streams_and_a_window_equals_k_ticks() {
    let dir = tempfile::tempdir().unwrap();
    let text = "Le chat dort. Élève à côté!  \n\n\u{1F600}\u{00e9}".repeat(40);
    let pattern = write_shards(
        dir.path(),
        &[
            text.as_bytes()[..333].to_vec(),
            text.as_bytes()[333..].to_vec(),
        ],
    );
    let corpus = open(&pattern, false);
    let b = 9;
    let mut batched =
        BatchedByteStream::new(corpus.clone(), b, PackMode::Utf8, &Offsets::Seed(7), None).unwrap();
    let offsets = batched.positions().to_vec();
    let w = window(&mut batched, 50);
    for (i, &o) in offsets.iter().enumerate() {
        let mut single = BatchedByteStream::new(
            corpus.clone(),
            1,
            PackMode::Utf8,
            &Offsets::List(vec![o]),
            pool(1),
        )
        .unwrap();
        let mut ticks = Window {
            cur: vec![],
            feats: vec![],
            tgt: vec![],
        };
        for _ in 0..50 {
            let t = window(&mut single, 1);
            ticks.cur.extend(t.cur);
            ticks.feats.extend(t.feats);
            ticks.tgt.extend(t.tgt);
        }
        assert_stream_eq(&w, b, i, &ticks);
    }
}

#[test]
fn even_and_seeded_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let pattern = write_shards(dir.path(), &[vec![b'a'; 1000], vec![b'b'; 3]]);
    let corpus = open(&pattern, false);
    let s =
        BatchedByteStream::new(corpus.clone(), 4, PackMode::Utf8, &Offsets::Even, None).unwrap();
    assert_eq!(s.positions(), [0, 250, 501, 752]); // floor(i * 1003 / 4)
    let seeded = |seed| {
        BatchedByteStream::new(
            corpus.clone(),
            6,
            PackMode::Plain,
            &Offsets::Seed(seed),
            None,
        )
        .unwrap()
        .positions()
        .to_vec()
    };
    assert_eq!(seeded(1), seeded(1));
    assert_ne!(seeded(1), seeded(2));
    assert!(seeded(3).iter().all(|&p| p < 1003));
}

#[test]
fn state_round_trip_mid_stream_equals_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7919 % 256) as u8).collect();
    let pattern = write_shards(dir.path(), &[data[..1234].to_vec(), data[1234..].to_vec()]);
    let corpus = open(&pattern, false);
    let new = |offsets: &Offsets| {
        BatchedByteStream::new(corpus.clone(), 5, PackMode::Utf8, offsets, None).unwrap()
    };
    let mut straight = new(&Offsets::Seed(11));
    let first = window(&mut straight, 33);
    let state = straight.state();
    assert_eq!(state.header.format, STATE_FORMAT);
    assert_eq!((state.header.version, state.header.b), (STATE_VERSION, 5));
    assert_eq!(state.header.signature, corpus.signature());
    assert!(state.contexts.is_none()); // the positions are the whole state
    let expected = window(&mut straight, 70);

    let mut resumed = new(&Offsets::Even);
    resumed.load_state(&state, None).unwrap();
    let got = window(&mut resumed, 70);
    assert_eq!(got.cur, expected.cur);
    assert_eq!(got.tgt, expected.tgt);
    assert!(got.feats == expected.feats);
    assert_ne!(first.cur, got.cur);
}

#[test]
fn a_snapshot_is_the_state_when_it_was_taken() {
    let dir = tempfile::tempdir().unwrap();
    let pattern = write_shards(dir.path(), &positional_shards(&[3000, 777]));
    let corpus = open(&pattern, false);
    let mut s =
        BatchedByteStream::new(corpus.clone(), 6, PackMode::Utf8, &Offsets::Seed(5), None).unwrap();
    window(&mut s, 41);
    let snap = s.snapshot();
    let state = s.state();
    assert_eq!(snap.state(), state);
    assert_eq!((snap.b(), snap.positions()), (6, s.positions()));
    let expected = window(&mut s, 50);
    // The stream moved on; the snapshot did not, and a stream loaded from it goes on exactly.
    assert_ne!(s.state(), state);
    assert_eq!(snap.state(), state);
    let mut resumed =
        BatchedByteStream::new(corpus, 6, PackMode::Utf8, &Offsets::Even, None).unwrap();
    resumed.load_state(&snap.state(), None).unwrap();
    let got = window(&mut resumed, 50);
    assert_eq!((got.cur, got.tgt), (expected.cur, expected.tgt));
    assert!(got.feats == expected.feats);
}

/// A format-1 state of `s`: its positions and its contexts, as the JSON state recorded them.
fn format_1(s: &BatchedByteStream) -> SavedState {
    let mut state = s.state();
    state.header.version = 1;
    state.contexts = Some(
        s.contexts()
            .iter()
            .map(|c| c.to_array().iter().map(|&v| v as i64).collect())
            .collect(),
    );
    state
}

#[test]
fn a_format_1_state_resumes_exactly_and_its_contexts_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let text = "Le chat dort.  Élève à côté!\n\n\u{1F600}".repeat(60);
    let pattern = write_shards(dir.path(), &[text.into_bytes()]);
    let corpus = open(&pattern, false);
    let new = |offsets| BatchedByteStream::new(corpus.clone(), 7, PackMode::Utf8, offsets, None);
    let mut straight = new(&Offsets::Seed(3)).unwrap();
    window(&mut straight, 45);
    let v1 = format_1(&straight);
    let expected = window(&mut straight, 60);
    let mut resumed = new(&Offsets::Even).unwrap();
    resumed.load_state(&v1, None).unwrap();
    let got = window(&mut resumed, 60);
    assert_eq!((got.cur, got.tgt), (expected.cur, expected.tgt));
    assert!(got.feats == expected.feats);

    // A context that its position does not give, or no contexts: refused, nothing changed.
    let mut other = new(&Offsets::Seed(9)).unwrap();
    let before = other.positions().to_vec();
    let mut wrong = v1.clone();
    let row = &mut wrong.contexts.as_mut().unwrap()[2];
    row[3] = (row[3] + 1) % 8; // word_len
    let err = other.load_state(&wrong, None).unwrap_err().to_string();
    assert!(err.contains("contexts[2] = ["), "{err}");
    assert!(err.contains("is not the context the 64 bytes before positions[2] give"));
    let mut none = v1.clone();
    none.contexts = None;
    let err = other.load_state(&none, None).unwrap_err().to_string();
    assert!(err.contains("no \"contexts\""), "{err}");
    let mut short = v1.clone();
    short.contexts.as_mut().unwrap().pop();
    let err = other.load_state(&short, None).unwrap_err().to_string();
    assert!(err.contains("contexts has 6 rows, not B = 7"), "{err}");
    assert_eq!(other.positions(), before);
}

#[test]
fn a_share_of_the_streams_loads_from_the_state_of_all_and_shares_join_back() {
    let dir = tempfile::tempdir().unwrap();
    let pattern = write_shards(dir.path(), &positional_shards(&[1500, 2100]));
    let corpus = open(&pattern, false);
    let new = |b, offsets: &Offsets| {
        BatchedByteStream::new(corpus.clone(), b, PackMode::Utf8, offsets, None).unwrap()
    };
    let mut all = new(8, &Offsets::Seed(4));
    window(&mut all, 30);
    let state = all.state();
    let expected = window(&mut all, 20);
    let mut shares = Vec::new();
    for (lo, hi) in [(0, 3), (3, 8)] {
        let mut part = new(hi - lo, &Offsets::Even);
        part.load_state(&state, Some(lo..hi)).unwrap();
        let saved: Vec<u64> = state.positions[lo..hi].iter().map(|&p| p as u64).collect();
        assert_eq!(part.positions(), saved);
        shares.push(part.state());
        let got = window(&mut part, 20);
        for i in lo..hi {
            for t in 0..20 {
                assert_eq!(got.cur[t * (hi - lo) + i - lo], expected.cur[t * 8 + i]);
            }
        }
    }
    assert_eq!(SavedState::join(&shares).unwrap(), state);
    // A share that is not this loader's size, or not inside the state: refused.
    let mut part = new(3, &Offsets::Even);
    let err = part.load_state(&state, Some(0..4)).unwrap_err().to_string();
    assert!(err.contains("streams 0..4 are not B = 3 streams"), "{err}");
    let err = part.load_state(&state, Some(6..9)).unwrap_err().to_string();
    assert!(err.contains("streams 6..9 are not all in it"), "{err}");
    // Parts of loaders that differ do not join.
    let mut plain = shares[1].clone();
    plain.header.pack_mode = "plain".into();
    let err = SavedState::join(&[shares[0].clone(), plain])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("loader state 1 was not saved by a loader like state 0's"),
        "{err}"
    );
    assert!(SavedState::join(&[]).is_err());
}

#[test]
fn compact_ids_expand_to_the_dense_features() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..=255u8)
        .chain(b"caf\xc3\xa9 \xe2\x82".iter().copied())
        .collect();
    let pattern = write_shards(dir.path(), &[data]);
    for mode in PackMode::ALL {
        let corpus = open(&pattern, false);
        let (b, k) = (3, 300);
        let mut dense =
            BatchedByteStream::new(corpus.clone(), b, mode, &Offsets::Even, None).unwrap();
        let mut compact = BatchedByteStream::new(corpus, b, mode, &Offsets::Even, None).unwrap();
        let w = window(&mut dense, k);
        let (mut cur, mut tgt) = (vec![0; k * b], vec![0; k * b]);
        let mut ids = vec![0i16; k * b * FEATURE_IDS_PER_TICK];
        compact
            .next_window_ids(k, &mut cur, &mut ids, &mut tgt)
            .unwrap();
        assert_eq!(cur, w.cur);
        assert_eq!(tgt, w.tgt);
        for (row, ids) in ids.chunks(FEATURE_IDS_PER_TICK).enumerate() {
            let mut expanded = [0.0f32; FEATURE_DIM];
            for &id in ids.iter().filter(|&&id| id != FEATURE_ID_PAD) {
                expanded[id as usize] = 1.0;
            }
            assert!(expanded[..] == w.feats[row * FEATURE_DIM..(row + 1) * FEATURE_DIM]);
        }
    }
}

#[test]
fn a_shard_that_changes_size_is_an_error_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let pattern = write_shards(dir.path(), &[vec![b'x'; 100_000], vec![b'y'; 10]]);
    let corpus = open(&pattern, false);
    let mut s = BatchedByteStream::new(corpus, 2, PackMode::Utf8, &Offsets::Even, None).unwrap();
    window(&mut s, 10);
    let before = s.positions().to_vec();
    let shard = dir.path().join("000");
    OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(10)
        .unwrap();
    let n = 10 * 2;
    let err = s
        .next_window(
            10,
            &mut vec![0; n],
            &mut vec![0.0; n * FEATURE_DIM],
            &mut vec![0; n],
        )
        .unwrap_err();
    assert!(matches!(
        err,
        Error::ShardResized {
            expected: 100_000,
            actual: 10,
            ..
        }
    ));
    assert!(err.is_io());
    assert!(err
        .to_string()
        .contains("000 changed size from 100000 to 10 bytes"));
    assert_eq!(
        s.positions(),
        before,
        "a failed window does not move the streams"
    );

    // A resident corpus was copied and does not care.
    let pattern2 = write_shards(dir.path(), &[vec![b'x'; 1000]]);
    let corpus = open(&pattern2, true);
    let mut s = BatchedByteStream::new(corpus, 2, PackMode::Utf8, &Offsets::Even, None).unwrap();
    fs::write(dir.path().join("000"), b"").unwrap();
    assert_eq!(window(&mut s, 10).cur, vec![b'x'; 20]);
}

#[test]
fn offsets_past_4_gib_in_a_sparse_shard() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big");
    let size: u64 = (1 << 32) + 4096;
    let file = File::create(&path).unwrap();
    file.set_len(size).unwrap(); // sparse: no disk blocks
    let marker_at = (1u64 << 32) + 100;
    {
        use std::os::unix::fs::FileExt;
        file.write_all_at(b"Bonjour!", marker_at).unwrap();
    }
    let corpus = open(&path.display().to_string(), false);
    assert_eq!(corpus.size(), size);
    let offsets = vec![marker_at, size - 2];
    let mut s =
        BatchedByteStream::new(corpus, 2, PackMode::Utf8, &Offsets::List(offsets), None).unwrap();
    let w = window(&mut s, 8);
    let stream0: Vec<u8> = (0..8).map(|t| w.cur[t * 2]).collect();
    assert_eq!(&stream0, b"Bonjour!");
    assert_eq!(s.positions(), [marker_at + 8, 6]); // stream 1 wrapped past the end
    let mut r = vec![0u8; HORIZON + 8];
    r[HORIZON..].copy_from_slice(b"Bonjour!");
    let expected = encode_bytes(&r, PackMode::Utf8);
    for t in 0..8 {
        assert!(
            w.feats[t * 2 * FEATURE_DIM..(t * 2 + 1) * FEATURE_DIM]
                == expected[(HORIZON + t) * FEATURE_DIM..(HORIZON + t + 1) * FEATURE_DIM]
        );
    }
}

#[test]
fn bad_arguments_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let pattern = write_shards(dir.path(), &[b"hello".to_vec()]);
    let corpus = open(&pattern, false);
    let new = |b, offsets: Offsets, threads: Option<Arc<rayon::ThreadPool>>| {
        BatchedByteStream::new(corpus.clone(), b, PackMode::Utf8, &offsets, threads)
    };
    let msg = |r: Result<BatchedByteStream, Error>| r.err().unwrap().to_string();
    assert!(msg(new(0, Offsets::Even, None)).contains("B must be at least 1"));
    assert!(msg(new(2, Offsets::List(vec![1]), None)).contains("offsets has 1 entries but B = 2"));
    assert!(msg(new(1, Offsets::List(vec![5]), None)).contains("offsets[0] = 5 is outside"));
    let mut s = new(2, Offsets::Even, None).unwrap();
    let e = s.next_window(0, &mut [], &mut [], &mut []).unwrap_err();
    assert!(e.to_string().contains("K must be at least 1"));
    let e = s
        .next_window(1, &mut [0; 2], &mut [0.0; 10], &mut [0; 2])
        .unwrap_err();
    assert!(e.to_string().contains("needs 2, 640, 2"));
    // Each buffer is checked on its own: one wrong size is enough to refuse.
    for (cur, tgt) in [(3, 2), (2, 1)] {
        let e = s
            .next_window(1, &mut vec![0; cur], &mut [0.0; 640], &mut vec![0; tgt])
            .unwrap_err();
        assert!(e.to_string().contains("needs 2, 640, 2"), "{e}");
    }
    assert_eq!(
        s.positions(),
        new(2, Offsets::Even, None).unwrap().positions()
    );
}

#[test]
fn states_that_do_not_fit_are_refused_with_the_difference() {
    let dir = tempfile::tempdir().unwrap();
    let pattern = write_shards(dir.path(), &[b"hello world".to_vec(), b"!".to_vec()]);
    let corpus = open(&pattern, false);
    let s =
        BatchedByteStream::new(corpus.clone(), 2, PackMode::Utf8, &Offsets::Even, None).unwrap();
    let good = s.state();
    let refused = |edit: &dyn Fn(&mut SavedState)| {
        let mut state = good.clone();
        edit(&mut state);
        let mut t =
            BatchedByteStream::new(corpus.clone(), 2, PackMode::Utf8, &Offsets::Seed(1), None)
                .unwrap();
        let before = t.positions().to_vec();
        let err = t.load_state(&state, None).unwrap_err();
        assert!(matches!(err, Error::BadState(_)), "{err}");
        assert_eq!(t.positions(), before); // nothing changed
                                           // The plan's check, before any stream is made, says the same of the header.
        if let Err(e) = state.header.check(&corpus, 2, PackMode::Utf8) {
            assert_eq!(e.to_string(), err.to_string());
        }
        err.to_string()
    };
    assert!(refused(&|v| v.header.b = 3).contains("B = 3 streams, this loader has B = 2"));
    assert!(refused(&|v| v.header.pack_mode = "plain".into()).contains("pack mode \"plain\""));
    assert!(refused(&|v| v.header.feature_version = 2).contains("feature version 2"));
    assert!(refused(&|v| v.header.version = 3).contains("version 3"));
    assert!(refused(&|v| v.header.version = 0).contains("version 0"));
    assert!(refused(&|v| v.header.format = "other".into()).contains("not a loader state"));
    assert!(refused(&|v| v.header.signature[1].1 = 2)
        .contains("shard 1 is \"001\" (2 bytes) in the state, \"001\" (1 bytes) here"));
    assert!(refused(&|v| v.positions[1] = 12).contains("positions[1] = 12"));
    assert!(refused(&|v| v.positions[0] = -1).contains("positions[0] = -1"));
    assert!(refused(&|v| {
        v.positions.pop();
    })
    .contains("positions has 1 entries, not B = 2"));
    // Format 1 with a context the Atomizer cannot reach.
    let refused_v1 = refused(&|v| {
        v.header.version = 1;
        let mut rows: Vec<Vec<i64>> = vec![vec![0, 0, 0, 0, 64, 1, 64]; 2];
        rows[0][4] = 65;
        v.contexts = Some(rows);
    });
    assert!(refused_v1.contains("line_len = 65"), "{refused_v1}");
    let mut t = BatchedByteStream::new(corpus, 2, PackMode::Utf8, &Offsets::Seed(1), None).unwrap();
    t.load_state(&good, None).unwrap();
    assert_eq!(t.positions(), s.positions());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Any shard layout (including empty and tiny shards), any offsets, any K: each stream
    /// equals the reference over the concatenation.
    #[test]
    fn windows_equal_the_reference_over_the_concatenation(
        shards in proptest::collection::vec(
            proptest::collection::vec(prop_oneof![any::<u8>(), Just(b' '), Just(0x80u8)], 0..40),
            1..6),
        offsets in proptest::collection::vec(any::<u64>(), 1..6),
        k in 1usize..90,
        plain in any::<bool>(),
        resident in any::<bool>(),
    ) {
        let data = shards.concat();
        prop_assume!(!data.is_empty());
        let mode = if plain { PackMode::Plain } else { PackMode::Utf8 };
        let dir = tempfile::tempdir().unwrap();
        let corpus = open(&write_shards(dir.path(), &shards), resident);
        let offsets: Vec<u64> = offsets.iter().map(|o| o % data.len() as u64).collect();
        let b = offsets.len();
        let mut s = BatchedByteStream::new(
            corpus, b, mode, &Offsets::List(offsets.clone()), None).unwrap();
        let w = window(&mut s, k);
        for (i, &o) in offsets.iter().enumerate() {
            assert_stream_eq(&w, b, i, &reference(&data, o as usize, k, mode));
        }
    }
}

#[test]
fn windows_past_the_cache_size_match_tick_by_tick_at_any_alignment() {
    // K x B x 320 floats >= 16 MiB takes the non-temporal store path; K = 1 does not.
    let dir = tempfile::tempdir().unwrap();
    let text = "Un été, à l'école: «Où?» — Ça va. ".repeat(300);
    let pattern = write_shards(dir.path(), &[text.into_bytes()]);
    let corpus = open(&pattern, false);
    let (b, k) = (512, 32);
    let n = b * k;
    let new = || BatchedByteStream::new(corpus.clone(), b, PackMode::Utf8, &Offsets::Seed(5), None);
    let mut ticks = new().unwrap();
    let mut expected = Vec::with_capacity(n * FEATURE_DIM);
    for _ in 0..k {
        expected.extend(window(&mut ticks, 1).feats);
    }
    // Output rows 64-byte aligned, 16-byte aligned, and only 4-byte aligned.
    let mut big = vec![0.0f32; n * FEATURE_DIM + 32];
    let base = (64 - big.as_ptr() as usize % 64) % 64 / 4;
    for shift in [0, 4, 1] {
        let feats = &mut big[base + shift..base + shift + n * FEATURE_DIM];
        feats.fill(f32::NAN);
        let mut s = new().unwrap();
        s.next_window(k, &mut vec![0; n], feats, &mut vec![0; n])
            .unwrap();
        assert!(feats[..] == expected[..], "rows shifted by {shift} floats");
    }
}

#[test]
fn the_shard_of_a_windows_last_target_is_checked_too() {
    // A window of K ticks reads K + 1 bytes: the last one (the last tick's target) comes
    // from the second shard here, so that shard is checked before the window is read.
    let dir = tempfile::tempdir().unwrap();
    let k = 16;
    let pattern = write_shards(dir.path(), &[vec![b'a'; k], vec![b'b'; 8192]]);
    let corpus = open(&pattern, false);
    let mut s =
        BatchedByteStream::new(corpus, 1, PackMode::Utf8, &Offsets::List(vec![0]), None).unwrap();
    OpenOptions::new()
        .write(true)
        .open(dir.path().join("001"))
        .unwrap()
        .set_len(4096)
        .unwrap();
    let err = s
        .next_window(
            k,
            &mut vec![0; k],
            &mut vec![0.0; k * FEATURE_DIM],
            &mut vec![0; k],
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::ShardResized {
                expected: 8192,
                actual: 4096,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_stream_tells_its_threads_and_contexts() {
    let dir = tempfile::tempdir().unwrap();
    let data = b"Un texte. Avec des phrases!\n".repeat(10);
    let pattern = write_shards(dir.path(), std::slice::from_ref(&data));
    let corpus = open(&pattern, false);
    let offsets = vec![0, 70, 200];
    let s = BatchedByteStream::new(
        corpus,
        3,
        PackMode::Utf8,
        &Offsets::List(offsets.clone()),
        pool(3),
    )
    .unwrap();
    assert_eq!(s.threads(), 3);
    for (ctx, &o) in s.contexts().iter().zip(&offsets) {
        let o = o as usize;
        let before: Vec<u8> = (0..HORIZON)
            .map(|j| data[(o + data.len() - HORIZON + j) % data.len()])
            .collect();
        assert_eq!(*ctx, atomdata::atomizer::warm_up(&before));
    }
    assert_eq!(s.contexts().len(), 3);
}

#[test]
fn check_all_shards_sees_a_modified_or_replaced_shard() {
    let dir = tempfile::tempdir().unwrap();
    let pattern = write_shards(dir.path(), &[b"abc".to_vec(), b"def".to_vec()]);
    let corpus = ByteCorpus::open(&[&pattern], false).unwrap();
    corpus.check_all_shards().unwrap();
    assert!(!corpus.is_resident());
    assert!(ByteCorpus::open(&[&pattern], true).unwrap().is_resident());
    fs::write(dir.path().join("new"), b"xyz").unwrap();
    fs::rename(dir.path().join("new"), dir.path().join("001")).unwrap();
    let err = corpus.check_all_shards().unwrap_err();
    assert!(
        matches!(err, Error::ShardReplaced { .. }) && err.is_io(),
        "{err}"
    );
}

#[test]
fn only_file_system_failures_are_io_errors() {
    let not_io = [
        Error::NoPaths,
        Error::EmptyCorpus { shards: "a".into() },
        Error::UnknownPackMode("x".into()),
        Error::InvalidArgument("x".into()),
        Error::BadState("x".into()),
        Error::OutOfMemory { bytes: 1 },
        Error::IsDirectory { path: "d".into() },
    ];
    assert!(not_io.iter().all(|e| !e.is_io()));
    let io = Error::ShardModified { path: "p".into() };
    assert!(io.is_io());
}
