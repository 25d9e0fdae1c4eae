//! `BatchedByteStream`: B byte streams over one circular corpus, each with its own Atomizer
//! context, advanced in lockstep a window of K ticks at a time.
//!
//! Position `p` of a stream is the index (mod size) of its next `cur` byte. One tick yields
//! `cur = s[p]`, the features of `s[p]` given the context before `p`, and `tgt = s[p+1]`; then
//! `p += 1`. Outputs are row-major `[K, B, ...]`.
//!
//! A window runs as parallel tasks over contiguous ranges of streams (see
//! [`BatchedByteStream::next_window`]): the big `[K, B, 320]` output is written in runs of
//! whole rows, which is what memory bandwidth wants.

use std::ops::Range;
use std::sync::Arc;

use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::atomizer::{
    Context, DenseSink, FeatureSink, PackMode, FEATURE_DIM, FEATURE_IDS_PER_TICK, HORIZON,
};
use crate::corpus::ByteCorpus;
use crate::error::{Error, Result};
use crate::state::{SavedState, StateHeader};

/// Where the B streams start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Offsets {
    /// Stream i starts at floor(i * size / B).
    Even,
    /// Uniform offsets from a portable seeded generator (ChaCha8).
    Seed(u64),
    /// One offset per stream, each in `0..size`.
    List(Vec<u64>),
}

impl Offsets {
    /// The B starting offsets in a corpus of `size` bytes.
    pub fn resolve(&self, b: usize, size: u64) -> Result<Vec<u64>> {
        match self {
            Offsets::Even => Ok((0..b as u128)
                .map(|i| (i * size as u128 / b as u128) as u64)
                .collect()),
            Offsets::Seed(seed) => {
                let mut rng = ChaCha8Rng::seed_from_u64(*seed);
                // Multiply-shift maps a u64 to 0..size without a modulo (bias < size / 2^64).
                Ok((0..b)
                    .map(|_| ((rng.next_u64() as u128 * size as u128) >> 64) as u64)
                    .collect())
            }
            Offsets::List(list) => {
                if list.len() != b {
                    return Err(Error::InvalidArgument(format!(
                        "offsets has {} entries but B = {b}: give one offset per stream",
                        list.len()
                    )));
                }
                if let Some((i, &o)) = list.iter().enumerate().find(|(_, &o)| o >= size) {
                    return Err(Error::InvalidArgument(format!(
                        "offsets[{i}] = {o} is outside the corpus ({size} bytes): use \
                         0 <= offset < {size}"
                    )));
                }
                Ok(list.clone())
            }
        }
    }
}

/// A stream's state at one moment (the streams' positions, with the corpus and pack mode
/// they belong to), as [`BatchedByteStream::snapshot`] took it.
#[derive(Clone)]
pub struct StreamSnapshot {
    corpus: Arc<ByteCorpus>,
    mode: PackMode,
    positions: Vec<u64>,
}

impl StreamSnapshot {
    pub fn b(&self) -> usize {
        self.positions.len()
    }

    /// Each stream's position when the snapshot was taken.
    pub fn positions(&self) -> &[u64] {
        &self.positions
    }

    /// The saved state (format 2) of the stream as it was when the snapshot was taken.
    pub fn state(&self) -> SavedState {
        SavedState {
            header: StateHeader::new(self.corpus.signature(), self.mode, self.b()),
            // (corpus offsets are below 2^63: a corpus is at most a few TB)
            positions: self.positions.iter().map(|&p| p as i64).collect(),
            contexts: None,
        }
    }
}

pub struct BatchedByteStream {
    corpus: Arc<ByteCorpus>,
    mode: PackMode,
    positions: Vec<u64>,
    contexts: Vec<Context>,
    /// The caller's pool the windows run on; `None`: the calling thread.
    pool: Option<Arc<rayon::ThreadPool>>,
    /// Scratch: each stream's K+1 bytes of the current window.
    bytes: Vec<u8>,
    /// Shards the current window reads.
    touched: Vec<bool>,
    /// The next shard whose path to check (a few per window, cyclically).
    path_cursor: usize,
}

/// Shard paths checked for replacement per window (a path lookup each; all shards in turn).
const PATH_CHECKS_PER_WINDOW: usize = 4;
/// A parallel task gets at least this many ticks (a rayon hand-off costs microseconds).
const MIN_TICKS_PER_TASK: usize = 2048;
/// Dense windows at least this large are written with non-temporal stores; smaller ones stay
/// in the cache for the consumer. Measured on a 32 MiB-L3 EPYC: regular stores win at
/// 10 MiB, non-temporal ones at 21 MiB (+9%) and 42 MiB (+55%).
const STREAMING_BYTES: usize = 16 << 20;

impl BatchedByteStream {
    /// B streams at `offsets`, each warmed up on the 64 bytes before its offset (circularly).
    /// `pool`: the thread pool the windows run on (the caller's); `None` runs them in the
    /// calling thread. The streams' output is the same whatever the pool.
    pub fn new(
        corpus: Arc<ByteCorpus>,
        b: usize,
        mode: PackMode,
        offsets: &Offsets,
        pool: Option<Arc<rayon::ThreadPool>>,
    ) -> Result<Self> {
        if b == 0 {
            return Err(Error::InvalidArgument(
                "B must be at least 1 (the number of streams)".into(),
            ));
        }
        let positions = offsets.resolve(b, corpus.size())?;
        let mut touched = vec![false; corpus.shards().len()];
        let contexts = warm_contexts(&corpus, &positions, &mut touched)?;
        Ok(BatchedByteStream {
            corpus,
            mode,
            positions,
            contexts,
            pool,
            bytes: Vec::new(),
            touched,
            path_cursor: 0,
        })
    }

    pub fn b(&self) -> usize {
        self.positions.len()
    }

    pub fn mode(&self) -> PackMode {
        self.mode
    }

    pub fn corpus(&self) -> &Arc<ByteCorpus> {
        &self.corpus
    }

    /// Each stream's position: the offset of its next `cur` byte.
    pub fn positions(&self) -> &[u64] {
        &self.positions
    }

    /// Each stream's context before its position.
    pub fn contexts(&self) -> &[Context] {
        &self.contexts
    }

    /// Threads that run a window.
    pub fn threads(&self) -> usize {
        self.pool.as_ref().map_or(1, |p| p.current_num_threads())
    }

    /// The next K ticks as dense features: `cur[K*B]`, `feats[K*B*320]`, `tgt[K*B]`,
    /// row-major `[K, B, ...]`. On error nothing is written and the streams do not move.
    pub fn next_window(
        &mut self,
        k: usize,
        cur: &mut [u8],
        feats: &mut [f32],
        tgt: &mut [u8],
    ) -> Result<()> {
        let mode = self.mode;
        // Past the caches, write around them: non-temporal stores skip reading each line
        // before overwriting it, and do not evict what else is cached.
        let streaming = std::mem::size_of_val(feats) >= STREAMING_BYTES;
        self.run_window(k, cur, feats, FEATURE_DIM, tgt, || {
            DenseRows::new(mode, streaming)
        })
    }

    /// The next K ticks in compact form: `ids[K*B*17]` (the dims that are 1.0, ascending,
    /// padded with 320) instead of 320 floats per tick.
    pub fn next_window_ids(
        &mut self,
        k: usize,
        cur: &mut [u8],
        ids: &mut [i16],
        tgt: &mut [u8],
    ) -> Result<()> {
        let mode = self.mode;
        self.run_window(k, cur, ids, FEATURE_IDS_PER_TICK, tgt, || IdRows(mode))
    }

    /// One window: check the shards it reads, then run the streams in parallel tasks, each
    /// task a contiguous range of streams. A task reads its streams' K+1 bytes, then for each
    /// tick writes its streams' rows, which are contiguous in the `[K, B, width]` output, so
    /// every task writes long sequential runs and the contexts stay in L1.
    fn run_window<T, M, W>(
        &mut self,
        k: usize,
        cur: &mut [u8],
        out: &mut [T],
        width: usize,
        tgt: &mut [u8],
        row_writer: M,
    ) -> Result<()>
    where
        T: Send,
        M: Fn() -> W + Sync,
        W: RowWriter<T>,
    {
        let b = self.b();
        check_window(k, b, cur.len(), out.len(), width, tgt.len())?;
        let corpus = &*self.corpus;
        self.touched.fill(false);
        for &p in &self.positions {
            corpus.mark_shards(p, k as u64 + 1, &mut self.touched);
        }
        corpus.check_shards(&self.touched)?;
        self.path_cursor = corpus.check_paths(self.path_cursor, PATH_CHECKS_PER_WINDOW)?;

        let per_task = self.streams_per_task(k);
        let n_tasks = b.div_ceil(per_task);
        self.bytes.resize(b * (k + 1), 0);
        let mut tasks: Vec<Task<'_, T>> = self
            .positions
            .chunks_mut(per_task)
            .zip(self.contexts.chunks_mut(per_task))
            .zip(self.bytes.chunks_mut(per_task * (k + 1)))
            .map(|((positions, contexts), bytes)| Task {
                positions,
                contexts,
                bytes,
                rows: Vec::with_capacity(k),
            })
            .collect();
        // Hand each task its slice of every tick's rows.
        for ((out_t, cur_t), tgt_t) in out
            .chunks_exact_mut(b * width)
            .zip(cur.chunks_exact_mut(b))
            .zip(tgt.chunks_exact_mut(b))
        {
            let parts = out_t
                .chunks_mut(per_task * width)
                .zip(cur_t.chunks_mut(per_task))
                .zip(tgt_t.chunks_mut(per_task));
            for (task, ((o, c), g)) in tasks.iter_mut().zip(parts) {
                task.rows.push((o, c, g));
            }
        }
        let size = corpus.size();
        let run = |task: Task<'_, T>| {
            let mut writer = row_writer();
            for (p, bytes) in task.positions.iter().zip(task.bytes.chunks_mut(k + 1)) {
                corpus.read_circular(*p, bytes);
            }
            for (t, (out, cur, tgt)) in task.rows.into_iter().enumerate() {
                for (j, ((ctx, row), (c, g))) in task
                    .contexts
                    .iter_mut()
                    .zip(out.chunks_exact_mut(width))
                    .zip(cur.iter_mut().zip(tgt.iter_mut()))
                    .enumerate()
                {
                    let byte = task.bytes[j * (k + 1) + t];
                    writer.row(ctx, byte, row);
                    ctx.advance(byte);
                    *c = byte;
                    *g = task.bytes[j * (k + 1) + t + 1];
                }
            }
            for p in task.positions.iter_mut() {
                *p = ((*p as u128 + k as u128) % size as u128) as u64;
            }
        };
        match (&self.pool, n_tasks) {
            (_, 1) => tasks.into_iter().for_each(run), // no hand-off for one task
            (Some(pool), _) => pool.install(|| tasks.into_par_iter().for_each(run)),
            (None, _) => tasks.into_iter().for_each(run),
        }
        Ok(())
    }

    /// Streams per parallel task: enough ticks to be worth a hand-off, and a few tasks per
    /// thread so that threads finishing early can steal.
    fn streams_per_task(&self, k: usize) -> usize {
        let min = MIN_TICKS_PER_TASK.div_ceil(k);
        self.b().div_ceil(4 * self.threads()).max(min).max(1)
    }

    /// The positions now, copied (B x 8 bytes): cheap enough to take after every window;
    /// [`StreamSnapshot::state`] makes the saved state from it when it is asked for.
    pub fn snapshot(&self) -> StreamSnapshot {
        StreamSnapshot {
            corpus: self.corpus.clone(),
            mode: self.mode,
            positions: self.positions.clone(),
        }
    }

    /// The saved state now (format 2; see [`crate::state`]): enough to resume exactly.
    pub fn state(&self) -> SavedState {
        self.snapshot().state()
    }

    /// Resume from a saved state (format 2, or format 1): each stream goes to its saved
    /// position, warmed up on the 64 bytes before it, after checking that the state was
    /// saved by a loader like this one. `streams`: load streams `lo..hi` of a state of more
    /// streams (this loader's share of a run's B, under torchrun); `None`: all of them, and
    /// the state must have this loader's B. Nothing changes on error.
    pub fn load_state(&mut self, state: &SavedState, streams: Option<Range<usize>>) -> Result<()> {
        let b = self.b();
        let streams = match streams {
            None => {
                state.header.check(&self.corpus, b, self.mode)?;
                0..b
            }
            Some(r) if r.start <= r.end && r.end - r.start == b => r,
            Some(r) => {
                return Err(Error::InvalidArgument(format!(
                    "streams {}..{} are not B = {b} streams (this loader's)",
                    r.start, r.end
                )))
            }
        };
        let corpus = &*self.corpus;
        let touched = &mut self.touched;
        let (positions, contexts) = state.resolve(corpus, self.mode, streams, |p| {
            warm_contexts(corpus, p, touched)
        })?;
        self.positions = positions;
        self.contexts = contexts;
        Ok(())
    }
}

/// The contexts of streams at `positions`: each warmed up on the 64 bytes before its
/// position (circularly), after checking the shards those bytes are in (`touched`: scratch,
/// one flag a shard).
fn warm_contexts(
    corpus: &ByteCorpus,
    positions: &[u64],
    touched: &mut [bool],
) -> Result<Vec<Context>> {
    let size = corpus.size();
    let warm_len = HORIZON as u64;
    let warm_start = |p: u64| (p + size - warm_len % size) % size;
    touched.fill(false);
    for &p in positions {
        corpus.mark_shards(warm_start(p), warm_len, touched);
    }
    corpus.check_shards(touched)?;
    Ok(positions
        .iter()
        .map(|&p| {
            let mut warm = [0u8; HORIZON];
            corpus.read_circular(warm_start(p), &mut warm);
            crate::atomizer::warm_up(&warm)
        })
        .collect())
}

/// Writes dense feature rows. Small windows: straight into the output (zero the row, set
/// the ones). Windows larger than the caches: the ones go into a zeroed row in L1, which is
/// copied out with non-temporal stores (no read of each output line before it is
/// overwritten, no eviction of what the consumer needs), then zeroed again.
struct DenseRows {
    mode: PackMode,
    streaming: Option<Streaming>,
    scratch: AlignedRow,
}

#[repr(align(64))]
struct AlignedRow([f32; FEATURE_DIM]);

impl DenseRows {
    fn new(mode: PackMode, streaming: bool) -> Self {
        DenseRows {
            mode,
            streaming: if streaming { Streaming::detect() } else { None },
            scratch: AlignedRow([0.0; FEATURE_DIM]),
        }
    }
}

/// Writes the rows of one task of a window.
trait RowWriter<T> {
    fn row(&mut self, ctx: &Context, byte: u8, row: &mut [T]);
}

/// Compact rows: the feature ids.
struct IdRows(PackMode);

impl RowWriter<i16> for IdRows {
    #[inline]
    fn row(&mut self, ctx: &Context, byte: u8, row: &mut [i16]) {
        row.copy_from_slice(&ctx.feature_ids(byte, self.0));
    }
}

impl RowWriter<f32> for DenseRows {
    #[inline]
    fn row(&mut self, ctx: &Context, byte: u8, row: &mut [f32]) {
        let row: &mut [f32; FEATURE_DIM] = row.try_into().expect("row of FEATURE_DIM");
        let Some(streaming) = self.streaming else {
            ctx.write_features(byte, self.mode, row);
            return;
        };
        let mut sink = RecordingSink {
            row: &mut self.scratch.0,
            ids: [0; FEATURE_IDS_PER_TICK],
            n: 0,
            bits: false,
        };
        ctx.emit(byte, self.mode, &mut sink);
        let (ids, n, bits) = (sink.ids, sink.n, sink.bits);
        streaming.copy(&self.scratch, row);
        let scratch = &mut self.scratch.0;
        for &id in &ids[..n] {
            scratch[id as usize] = 0.0;
        }
        if bits {
            scratch[FEATURE_DIM - 8..].fill(0.0);
        }
    }
}

impl Drop for DenseRows {
    fn drop(&mut self) {
        if self.streaming.is_some() {
            store_fence(); // make the non-temporal stores visible before the task ends
        }
    }
}

/// A [`DenseSink`] that remembers what it set, so the scratch row can be zeroed cheaply.
struct RecordingSink<'a> {
    row: &'a mut [f32; FEATURE_DIM],
    ids: [i16; FEATURE_IDS_PER_TICK],
    n: usize,
    bits: bool,
}

impl FeatureSink for RecordingSink<'_> {
    #[inline(always)]
    fn one(&mut self, id: i16) {
        DenseSink(self.row).one(id);
        self.ids[self.n] = id;
        self.n += 1;
    }

    #[inline(always)]
    fn bits(&mut self, value: u8) {
        DenseSink(self.row).bits(value);
        self.bits = true;
    }
}

/// Non-temporal row copies at the widest vector width the CPU has (x86-64 only).
#[derive(Clone, Copy)]
enum Streaming {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx,
    #[cfg(target_arch = "x86_64")]
    Sse,
}

impl Streaming {
    fn detect() -> Option<Streaming> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Some(Streaming::Avx512);
            }
            if std::arch::is_x86_feature_detected!("avx") {
                return Some(Streaming::Avx);
            }
            Some(Streaming::Sse)
        }
        #[cfg(not(target_arch = "x86_64"))]
        None
    }

    /// Copy `src` to `dst` with non-temporal stores (a plain copy if `dst` is not 16-byte
    /// aligned).
    #[inline]
    fn copy(self, src: &AlignedRow, dst: &mut [f32; FEATURE_DIM]) {
        #[cfg(target_arch = "x86_64")]
        if (dst.as_ptr() as usize).is_multiple_of(16) {
            let (s, d) = (src.0.as_ptr(), dst.as_mut_ptr());
            // SAFETY: `detect` saw the CPU feature; `d` is 16-byte aligned (checked) and the
            // wider stores are used only from a 64/32-byte boundary on (see the functions);
            // both rows hold FEATURE_DIM floats, a multiple of 16.
            unsafe {
                match self {
                    Streaming::Avx512 => stream_avx512(s, d),
                    Streaming::Avx => stream_avx(s, d),
                    Streaming::Sse => stream_sse(s, d, FEATURE_DIM),
                }
            }
            return;
        }
        dst.copy_from_slice(&src.0);
    }
}

// Each copies a row of FEATURE_DIM floats to a 16-byte aligned `d` with non-temporal stores:
// 4-float stores up to the first 64 (32) byte boundary, full-width stores while a whole
// vector fits, 4-float stores for the rest.

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn stream_avx512(s: *const f32, d: *mut f32) {
    use std::arch::x86_64::{_mm512_loadu_ps, _mm512_stream_ps};
    let mut i = (64 - d as usize % 64) % 64 / 4;
    stream_sse(s, d, i);
    while i + 16 <= FEATURE_DIM {
        _mm512_stream_ps(d.add(i), _mm512_loadu_ps(s.add(i)));
        i += 16;
    }
    stream_sse(s.add(i), d.add(i), FEATURE_DIM - i);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn stream_avx(s: *const f32, d: *mut f32) {
    use std::arch::x86_64::{_mm256_loadu_ps, _mm256_stream_ps};
    let mut i = (32 - d as usize % 32) % 32 / 4;
    stream_sse(s, d, i);
    while i + 8 <= FEATURE_DIM {
        _mm256_stream_ps(d.add(i), _mm256_loadu_ps(s.add(i)));
        i += 8;
    }
    stream_sse(s.add(i), d.add(i), FEATURE_DIM - i);
}

/// `n` (a multiple of 4) floats with 16-byte non-temporal stores; `d` 16-byte aligned.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn stream_sse(s: *const f32, d: *mut f32, n: usize) {
    use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
    for i in (0..n).step_by(4) {
        _mm_stream_ps(d.add(i), _mm_loadu_ps(s.add(i)));
    }
}

fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// A parallel task of one window: a contiguous range of streams, and their slice of each
/// tick's rows `(out, cur, tgt)`.
struct Task<'a, T> {
    positions: &'a mut [u64],
    contexts: &'a mut [Context],
    bytes: &'a mut [u8],
    rows: Vec<(&'a mut [T], &'a mut [u8], &'a mut [u8])>,
}

/// Check that K is valid and the output buffers hold a `[K, B]` window.
fn check_window(
    k: usize,
    b: usize,
    cur: usize,
    out: usize,
    width: usize,
    tgt: usize,
) -> Result<()> {
    if k == 0 {
        return Err(Error::InvalidArgument(
            "K must be at least 1 (ticks per window)".into(),
        ));
    }
    let n = k
        .checked_mul(b)
        .filter(|n| n.checked_mul(width).is_some())
        .ok_or_else(|| Error::InvalidArgument(format!("K = {k} x B = {b} is too large")))?;
    if cur != n || tgt != n || out != n * width {
        return Err(Error::InvalidArgument(format!(
            "output buffers hold {cur} cur, {out} features, {tgt} tgt; a window of K = {k} \
             ticks x B = {b} streams needs {n}, {}, {n}",
            n * width
        )));
    }
    Ok(())
}
