//! The loader's binding (the `atomdata` crate): `ByteCorpus`, `BatchedByteStream`,
//! `StreamSnapshot`, the saved-state functions (`check_state_dict`, `join_state_dicts`),
//! `stream_offsets`, `encode_bytes` and the loader's constants. `atom_train.data.loader`
//! is their Python API.
//!
//! A saved state crosses into Python as a dict (`state_dict()`): its header's fields and
//! the positions as an int64 numpy array, which a checkpoint stores as a tensor of its
//! payload; `load_state_dict` reads that dict, or format 1's (the JSON state, with
//! contexts), through the crate's one reader (`BatchedByteStream::load_state`).

use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use atomdata::atomizer::{
    self, PackMode, FEATURE_DIM, FEATURE_IDS_PER_TICK, FEATURE_ID_PAD, FEATURE_VERSION, HORIZON,
};
use atomdata::corpus::ByteCorpus;
use atomdata::state::{SavedState, StateHeader, STATE_FORMAT, STATE_VERSION};
use atomdata::stream::{BatchedByteStream, Offsets, StreamSnapshot};
use atomdata::Error;
use numpy::{
    dtype, Element, IxDyn, PyArray1, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods,
    PyReadwriteArrayDyn, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyInt, PyList, PyString, PyTuple};

use crate::error::{data_arg as user_error, data_error as to_py};
use crate::pool;

/// A positive count (B, K, threads): an int >= 1, not a bool.
fn positive(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
    let bad = || {
        user_error(format!(
            "{what} must be an int >= 1, got {}",
            obj.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    };
    if obj.is_instance_of::<PyBool>() {
        return Err(bad());
    }
    match obj.extract::<i64>() {
        Ok(n) if n >= 1 => usize::try_from(n).map_err(|_| bad()),
        _ => Err(bad()),
    }
}

fn parse_mode(mode: &str) -> PyResult<PackMode> {
    mode.parse().map_err(|e: Error| user_error(e.to_string()))
}

/// File paths from a str, an os.PathLike, or a sequence of them.
fn path_list(py: Python<'_>, paths: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let os = py.import("os")?;
    let one = |p: &Bound<'_, PyAny>| -> PyResult<String> {
        if p.is_instance_of::<PyString>() || p.hasattr("__fspath__")? {
            let s = os.call_method1("fspath", (p,))?;
            if let Ok(s) = s.extract::<String>() {
                return Ok(s);
            }
        }
        Err(user_error(format!(
            "paths must be a str, an os.PathLike or a list of them, got {}",
            p.repr()?
        )))
    };
    if paths.is_instance_of::<PyString>() || paths.hasattr("__fspath__")? {
        return Ok(vec![one(paths)?]);
    }
    if paths.is_instance_of::<PyBytes>() || paths.is_instance_of::<PyByteArray>() {
        // (iterated, bytes would be read as a list of ints: say what is meant instead)
        return Err(user_error(format!(
            "paths must be a str, an os.PathLike or a list of them, got {} bytes: a \
             ByteCorpus reads files; to score a text held in memory, give the str or bytes \
             to atom_train.score_text",
            paths.len()?
        )));
    }
    let Ok(iter) = paths.try_iter() else {
        return Err(user_error(format!(
            "paths must be a str, an os.PathLike or a list of them, got {}",
            paths.repr()?
        )));
    };
    iter.map(|p| one(&p?)).collect()
}

/// Shard files (a path, a glob, or a list of them; globs expanded, sorted by path) seen as
/// ONE circular byte string with 64-bit offsets. Memory-mapped: nothing is read up front.
/// `resident=True` copies the corpus into RAM instead (faster on slow disks).
///
/// `.size` (bytes), `.signature` (`[{"name", "size"}]`, what a saved loader state is checked
/// against), `.shards` (paths), `.resident`.
#[pyclass(name = "ByteCorpus", module = "atom_train.data.loader", frozen)]
pub struct PyByteCorpus {
    inner: Arc<ByteCorpus>,
}

#[pymethods]
impl PyByteCorpus {
    #[new]
    #[pyo3(signature = (paths, resident = false))]
    fn new(py: Python<'_>, paths: &Bound<'_, PyAny>, resident: bool) -> PyResult<Self> {
        let paths = path_list(py, paths)?;
        let corpus = py
            .detach(|| ByteCorpus::open(&paths, resident))
            .map_err(|e| to_py(py, e))?;
        Ok(PyByteCorpus {
            inner: Arc::new(corpus),
        })
    }

    /// Total size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.inner.size()
    }

    /// Shard names and sizes, in order: `[{"name": str, "size": int}, ...]`.
    #[getter]
    fn signature<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.inner
            .signature()
            .into_iter()
            .map(|(name, size)| {
                let d = PyDict::new(py);
                d.set_item("name", name)?;
                d.set_item("size", size)?;
                Ok(d)
            })
            .collect()
    }

    /// The shard paths, sorted (globs expanded).
    #[getter]
    fn shards(&self) -> Vec<String> {
        self.inner
            .shards()
            .iter()
            .map(|s| s.path().display().to_string())
            .collect()
    }

    /// True when the corpus was copied into RAM.
    #[getter]
    fn resident(&self) -> bool {
        self.inner.is_resident()
    }

    fn __repr__(&self) -> String {
        format!(
            "ByteCorpus({} shards, {} bytes, {})",
            self.inner.shards().len(),
            self.inner.size(),
            if self.inner.is_resident() {
                "resident"
            } else {
                "memory-mapped"
            }
        )
    }
}

/// Three arrays `(cur, x, tgt)` of one window, owned by Python.
struct Window {
    cur: Py<PyAny>,
    x: Py<PyAny>,
    tgt: Py<PyAny>,
}

struct StreamInner {
    core: BatchedByteStream,
    /// The loader's own output buffers, reused while their shape fits (see `next_window`).
    dense: Option<Window>,
    ids: Option<Window>,
    tick: Option<Window>,
}

/// B byte streams over a ByteCorpus, each with its own Atomizer context, warmed up on the 64
/// bytes before its offset. Stream i's position p is the offset of its next `cur` byte; a
/// tick yields `cur = s[p]`, the 320 features of s[p] given the context before it, and
/// `tgt = s[p+1]`, then p += 1 (all mod the corpus size).
///
/// offsets: 'even' (stream i at floor(i * size / B)), an int seed (portable ChaCha8), or a
/// list of B offsets. threads: the size of the pool the windows run on (the extension's
/// pool of that size, shared; 1: the calling thread; None: one thread a core). Windows run
/// with the GIL released.
///
/// Returned arrays (without `out`) are the loader's own buffers, reused and overwritten by
/// the next next_tick / next_window / next_window_ids call on this stream: they stay valid
/// until then. Copy them, or pass `out=` buffers you own, to keep them longer. Use a stream
/// from one thread at a time (a concurrent call raises AtomDataError).
#[pyclass(name = "BatchedByteStream", module = "atom_train.data.loader", frozen)]
pub struct PyBatchedByteStream {
    corpus: Py<PyByteCorpus>,
    inner: Mutex<StreamInner>,
}

fn parse_offsets(offsets: Option<&Bound<'_, PyAny>>) -> PyResult<Offsets> {
    let Some(obj) = offsets else {
        return Ok(Offsets::Even);
    };
    let help = "offsets must be 'even', an int seed >= 0, or a list of B ints";
    let got = obj.repr()?.to_string();
    if let Ok(s) = obj.cast::<PyString>() {
        return match s.to_str()? {
            "even" => Ok(Offsets::Even),
            other => Err(user_error(format!("{help}; got {other:?}"))),
        };
    }
    if obj.is_instance_of::<PyBool>() {
        return Err(user_error(format!("{help}; got {got}")));
    }
    if obj.is_instance_of::<PyInt>() {
        return obj
            .extract::<u64>()
            .map(Offsets::Seed)
            .map_err(|_| user_error(format!("{help}; got {got}")));
    }
    let iter = obj
        .try_iter()
        .map_err(|_| user_error(format!("{help}; got {got}")))?;
    let mut list = Vec::new();
    for (i, item) in iter.enumerate() {
        let item = item?;
        let o = if item.is_instance_of::<PyBool>() {
            None
        } else {
            item.extract::<u64>().ok()
        };
        list.push(o.ok_or_else(|| {
            user_error(format!(
                "offsets[{i}] = {} is not an offset: {help}",
                item.repr().map(|r| r.to_string()).unwrap_or_default()
            ))
        })?);
    }
    Ok(Offsets::List(list))
}

fn numpy_name<T: Element>(py: Python<'_>) -> String {
    dtype::<T>(py).to_string()
}

/// Check a caller's `out` array: a C-contiguous, aligned, writeable numpy array of dtype T
/// and the given shape.
fn check_out<'py, T: Element>(
    obj: &Bound<'py, PyAny>,
    what: &str,
    shape: &[usize],
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    let py = obj.py();
    // Built only on error: numpy formats dtypes in Python, too slow for every call.
    let want = || {
        format!(
            "out {what} must be a C-contiguous, writeable numpy {} array of shape {shape:?}",
            numpy_name::<T>(py)
        )
    };
    let Ok(arr) = obj.cast::<PyUntypedArray>() else {
        let hint = if obj.hasattr("numpy")? {
            " (for a torch tensor pass tensor.numpy())"
        } else {
            ""
        };
        return Err(user_error(format!(
            "{}, got a {}{hint}",
            want(),
            obj.get_type().name()?
        )));
    };
    let problem = if !arr.dtype().is_equiv_to(&dtype::<T>(py)) {
        Some(format!("dtype {}", arr.dtype()))
    } else if arr.shape() != shape {
        Some(format!("shape {:?}", arr.shape()))
    } else if !arr.is_c_contiguous() {
        Some("a non-contiguous layout".to_string())
    } else if !arr.is_aligned() {
        Some("a misaligned buffer".to_string())
    } else {
        None
    };
    if let Some(problem) = problem {
        return Err(user_error(format!("{}, got {problem}", want())));
    }
    Ok(arr.cast::<PyArrayDyn<T>>()?.clone())
}

/// Exclusive access to an array's memory until the guard drops.
fn borrow_mut<'py, T: Element>(
    arr: &Bound<'py, PyArrayDyn<T>>,
    what: &str,
) -> PyResult<PyReadwriteArrayDyn<'py, T>> {
    arr.try_readwrite().map_err(|e| {
        user_error(format!(
            "out {what} cannot be written ({e}): pass writeable arrays that do not overlap"
        ))
    })
}

/// The loader's buffer in `slot` if it still has the right shape and layout, else a new one.
fn own_buffer<'py, T: Element>(
    py: Python<'py>,
    slot: Option<&Py<PyAny>>,
    shape: &[usize],
) -> Bound<'py, PyArrayDyn<T>> {
    if let Some(old) = slot {
        if let Ok(arr) = check_out::<T>(old.bind(py), "", shape) {
            if arr.try_readwrite().is_ok() {
                return arr;
            }
        }
    }
    PyArrayDyn::<T>::zeros(py, IxDyn(shape), false)
}

/// Which window a call fills: dense features, compact ids, or one tick.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Dense,
    Ids,
    Tick,
}

impl PyBatchedByteStream {
    fn lock(&self) -> PyResult<MutexGuard<'_, StreamInner>> {
        match self.inner.try_lock() {
            Ok(guard) => Ok(guard),
            Err(TryLockError::WouldBlock) => Err(user_error(
                "this BatchedByteStream is busy in another thread: call it from one thread at \
                 a time (use one stream per thread)",
            )),
            Err(TryLockError::Poisoned(_)) => Err(user_error(
                "this BatchedByteStream stopped in an internal error: create a new one (or \
                 load a saved state into a new one)",
            )),
        }
    }

    /// Fill one window of `kind` (into `out` or the loader's own buffers) and return the three
    /// arrays.
    fn fill<'py>(
        &self,
        py: Python<'py>,
        kind: Kind,
        k: usize,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let mut guard = self.lock()?;
        let inner = &mut *guard;
        let b = inner.core.b();
        let lead: Vec<usize> = if kind == Kind::Tick {
            vec![b]
        } else {
            vec![k, b]
        };
        let width = if kind == Kind::Ids {
            FEATURE_IDS_PER_TICK
        } else {
            FEATURE_DIM
        };
        let x_shape = [lead.as_slice(), &[width]].concat();
        let (cur, x, tgt): (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>) = match out {
            Some(out) => {
                let t = out
                    .cast::<PyTuple>()
                    .ok()
                    .filter(|t| t.len() == 3)
                    .ok_or_else(|| {
                        user_error("out must be a tuple (cur, feats, tgt) of three numpy arrays")
                    })?;
                (t.get_item(0)?, t.get_item(1)?, t.get_item(2)?)
            }
            None => {
                let slot = match kind {
                    Kind::Dense => &inner.dense,
                    Kind::Ids => &inner.ids,
                    Kind::Tick => &inner.tick,
                };
                let cur = own_buffer::<u8>(py, slot.as_ref().map(|w| &w.cur), &lead);
                let x = if kind == Kind::Ids {
                    own_buffer::<i16>(py, slot.as_ref().map(|w| &w.x), &x_shape).into_any()
                } else {
                    own_buffer::<f32>(py, slot.as_ref().map(|w| &w.x), &x_shape).into_any()
                };
                let tgt = own_buffer::<u8>(py, slot.as_ref().map(|w| &w.tgt), &lead);
                let window = Window {
                    cur: cur.clone().into_any().unbind(),
                    x: x.clone().unbind(),
                    tgt: tgt.clone().into_any().unbind(),
                };
                match kind {
                    Kind::Dense => inner.dense = Some(window),
                    Kind::Ids => inner.ids = Some(window),
                    Kind::Tick => inner.tick = Some(window),
                }
                (cur.into_any(), x, tgt.into_any())
            }
        };
        let x_name = if kind == Kind::Ids { "ids" } else { "feats" };
        let cur_arr = check_out::<u8>(&cur, "cur", &lead)?;
        let tgt_arr = check_out::<u8>(&tgt, "tgt", &lead)?;
        let mut cur_rw = borrow_mut(&cur_arr, "cur")?;
        let mut tgt_rw = borrow_mut(&tgt_arr, "tgt")?;
        let cur_s = cur_rw
            .as_slice_mut()
            .map_err(|e| user_error(e.to_string()))?;
        let tgt_s = tgt_rw
            .as_slice_mut()
            .map_err(|e| user_error(e.to_string()))?;
        let core = &mut inner.core;
        let result = if kind == Kind::Ids {
            let arr = check_out::<i16>(&x, x_name, &x_shape)?;
            let mut rw = borrow_mut(&arr, x_name)?;
            let s = rw.as_slice_mut().map_err(|e| user_error(e.to_string()))?;
            py.detach(|| core.next_window_ids(k, cur_s, s, tgt_s))
        } else {
            let arr = check_out::<f32>(&x, x_name, &x_shape)?;
            let mut rw = borrow_mut(&arr, x_name)?;
            let s = rw.as_slice_mut().map_err(|e| user_error(e.to_string()))?;
            py.detach(|| core.next_window(k, cur_s, s, tgt_s))
        };
        result.map_err(|e| to_py(py, e))?;
        PyTuple::new(py, [cur, x, tgt])
    }
}

#[pymethods]
impl PyBatchedByteStream {
    #[new]
    #[pyo3(
        signature = (corpus, B, pack_mode = "utf8", offsets = None, threads = None),
        text_signature = "(corpus, B, pack_mode='utf8', offsets='even', threads=None)"
    )]
    #[allow(non_snake_case)]
    fn new(
        py: Python<'_>,
        corpus: Bound<'_, PyAny>,
        B: &Bound<'_, PyAny>,
        pack_mode: &str,
        offsets: Option<&Bound<'_, PyAny>>,
        threads: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let corpus = corpus.cast_into::<PyByteCorpus>().map_err(|e| {
            user_error(format!(
                "corpus must be a ByteCorpus, got a {}",
                e.into_inner()
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        })?;
        let b = positive(B, "B")?;
        let mode = parse_mode(pack_mode)?;
        let offsets = parse_offsets(offsets)?;
        let threads = threads.map(|t| positive(t, "threads")).transpose()?;
        let pool = pool::pool(threads).map_err(user_error)?;
        let shared = corpus.get().inner.clone();
        let core = py
            .detach(|| BatchedByteStream::new(shared, b, mode, &offsets, pool))
            .map_err(|e| to_py(py, e))?;
        Ok(PyBatchedByteStream {
            corpus: corpus.unbind(),
            inner: Mutex::new(StreamInner {
                core,
                dense: None,
                ids: None,
                tick: None,
            }),
        })
    }

    /// The next tick: `(cur u8[B], feats f32[B, 320], tgt u8[B])`, views of the loader's
    /// buffers, valid until the next call on this stream.
    fn next_tick<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        self.fill(py, Kind::Tick, 1, None)
    }

    /// The next K ticks: `(cur u8[K, B], feats f32[K, B, 320], tgt u8[K, B])`.
    ///
    /// Without `out`: views of the loader's buffers, valid until the next call on this
    /// stream (then overwritten). With `out=(cur, feats, tgt)`: C-contiguous writeable
    /// arrays of exactly those shapes and dtypes (e.g. a pinned torch tensor's `.numpy()`),
    /// filled in place and returned.
    #[pyo3(signature = (K, out = None))]
    #[allow(non_snake_case)]
    fn next_window<'py>(
        &self,
        py: Python<'py>,
        K: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let k = positive(K, "K")?;
        self.fill(py, Kind::Dense, k, out)
    }

    /// The next K ticks, compact: `(cur u8[K, B], ids i16[K, B, 17], tgt u8[K, B])`.
    ///
    /// `ids` lists the dims that are 1.0, ascending, padded with 320;
    /// `atom_train.data.loader.expand_ids(ids)` gives back the dense features exactly. Buffers and
    /// `out` as in `next_window`.
    #[pyo3(signature = (K, out = None))]
    #[allow(non_snake_case)]
    fn next_window_ids<'py>(
        &self,
        py: Python<'py>,
        K: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let k = positive(K, "K")?;
        self.fill(py, Kind::Ids, k, out)
    }

    #[getter]
    #[allow(non_snake_case)]
    fn B(&self) -> PyResult<usize> {
        Ok(self.lock()?.core.b())
    }

    #[getter]
    fn pack_mode(&self) -> PyResult<&'static str> {
        Ok(self.lock()?.core.mode().name())
    }

    #[getter]
    fn threads(&self) -> PyResult<usize> {
        Ok(self.lock()?.core.threads())
    }

    #[getter]
    fn corpus(&self, py: Python<'_>) -> Py<PyByteCorpus> {
        self.corpus.clone_ref(py)
    }

    /// Each stream's position: the corpus offset of its next `cur` byte.
    #[getter]
    fn positions(&self) -> PyResult<Vec<u64>> {
        Ok(self.lock()?.core.positions().to_vec())
    }

    /// The state for an exact resume: `{"format", "version", "corpus_signature",
    /// "pack_mode", "feature_version", "B", "positions"}`, the positions an int64 numpy
    /// array `[B]` (a checkpoint stores them as a tensor, the rest in its metadata).
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let state = self.lock()?.core.state();
        state_to_py(py, &state)
    }

    /// The state now, compact: a `StreamSnapshot` whose `state_dict()` is what `state_dict()`
    /// returns now. Cheap (a copy of the B positions, without the GIL): take one per window,
    /// make the dict only when it is written.
    fn snapshot(&self, py: Python<'_>) -> PyResult<PyStreamSnapshot> {
        let inner = self.lock()?;
        let core = &inner.core;
        Ok(PyStreamSnapshot {
            inner: py.detach(|| core.snapshot()),
        })
    }

    /// Restore a `state_dict()` (or a format-1 state: the JSON state with contexts); checks
    /// that it fits this stream (corpus, B, pack mode, feature version, positions). Each
    /// stream is warmed up on the 64 bytes before its saved position. `streams=(lo, hi)`:
    /// load streams lo..hi of a state of more streams (a rank's share under torchrun).
    #[pyo3(signature = (state, streams = None))]
    fn load_state_dict(
        &self,
        py: Python<'_>,
        state: &Bound<'_, PyAny>,
        streams: Option<(usize, usize)>,
    ) -> PyResult<()> {
        let state = state_from_py(state, true).map_err(|e| to_py(py, e))?;
        let mut inner = self.lock()?;
        let core = &mut inner.core;
        py.detach(|| core.load_state(&state, streams.map(|(lo, hi)| lo..hi)))
            .map_err(|e| to_py(py, e))
    }

    fn __repr__(&self) -> PyResult<String> {
        let inner = self.lock()?;
        Ok(format!(
            "BatchedByteStream(B={}, pack_mode='{}', threads={}, corpus={} bytes)",
            inner.core.b(),
            inner.core.mode().name(),
            inner.core.threads(),
            inner.core.corpus().size()
        ))
    }
}

/// A loader state taken by `BatchedByteStream.snapshot()`: the streams' positions at that
/// moment, kept in Rust. `state_dict()` gives the dict a checkpoint records and
/// `load_state_dict` reads.
#[pyclass(name = "StreamSnapshot", module = "atom_train.data.loader", frozen)]
pub struct PyStreamSnapshot {
    inner: StreamSnapshot,
}

#[pymethods]
impl PyStreamSnapshot {
    /// The loader state as `BatchedByteStream.state_dict()` returned it when the snapshot
    /// was taken.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let state = py.detach(|| self.inner.state());
        state_to_py(py, &state)
    }

    #[getter]
    #[allow(non_snake_case)]
    fn B(&self) -> usize {
        self.inner.b()
    }

    /// Each stream's position when the snapshot was taken.
    #[getter]
    fn positions(&self) -> Vec<u64> {
        self.inner.positions().to_vec()
    }

    fn __repr__(&self) -> String {
        format!("StreamSnapshot(B={})", self.inner.b())
    }
}

/// A saved state as the dict `state_dict()` returns.
fn state_to_py<'py>(py: Python<'py>, state: &SavedState) -> PyResult<Bound<'py, PyDict>> {
    let h = &state.header;
    let d = PyDict::new(py);
    d.set_item("format", &h.format)?;
    d.set_item("version", h.version)?;
    let signature = PyList::empty(py);
    for (name, size) in &h.signature {
        let s = PyDict::new(py);
        s.set_item("name", name)?;
        s.set_item("size", size)?;
        signature.append(s)?;
    }
    d.set_item("corpus_signature", signature)?;
    d.set_item("pack_mode", &h.pack_mode)?;
    d.set_item("feature_version", h.feature_version)?;
    d.set_item("B", h.b)?;
    d.set_item("positions", PyArray1::from_slice(py, &state.positions))?;
    Ok(d)
}

/// A saved state from a dict (`state_dict()`'s, or format 1's JSON state); `positions`:
/// whether to read the positions (and format 1's contexts) too, or only the header.
fn state_from_py(obj: &Bound<'_, PyAny>, positions: bool) -> Result<SavedState, Error> {
    let bad = |msg: String| Error::BadState(msg);
    let repr = |v: &Bound<'_, PyAny>| v.repr().map(|r| r.to_string()).unwrap_or_default();
    let d = obj
        .cast::<PyDict>()
        .map_err(|_| bad(format!("the state is not a dict (got {})", repr(obj))))?;
    let field = |key: &str| -> Result<Bound<'_, PyAny>, Error> {
        d.get_item(key).ok().flatten().ok_or_else(|| {
            bad(format!(
                "the state has no {key:?}: it is not a loader state"
            ))
        })
    };
    let number = |v: &Bound<'_, PyAny>, what: &str| -> Result<u64, Error> {
        if v.is_instance_of::<PyBool>() {
            return Err(bad(format!("{what} {} is not a number", repr(v))));
        }
        v.extract::<u64>()
            .map_err(|_| bad(format!("{what} {} is not a number", repr(v))))
    };
    let text = |v: &Bound<'_, PyAny>| v.extract::<String>().unwrap_or_else(|_| repr(v));
    let version = match d.get_item("version").ok().flatten() {
        None => 1, // a state without a version is version 1
        Some(v) => number(&v, "version")?,
    };
    let sig = field("corpus_signature")?;
    let sig_err = || {
        bad(format!(
            "corpus_signature {} is not a list of {{\"name\", \"size\"}}",
            repr(&sig)
        ))
    };
    let signature = sig
        .cast::<PyList>()
        .map_err(|_| sig_err())?
        .iter()
        .map(|s| {
            let s = s.cast_into::<PyDict>().map_err(|_| sig_err())?;
            let name = s
                .get_item("name")
                .ok()
                .flatten()
                .and_then(|n| n.extract().ok());
            let size = s
                .get_item("size")
                .ok()
                .flatten()
                .and_then(|n| n.extract().ok());
            name.zip(size).ok_or_else(sig_err)
        })
        .collect::<Result<Vec<(String, u64)>, Error>>()?;
    let header = StateHeader {
        format: text(&field("format")?),
        version,
        signature,
        pack_mode: text(&field("pack_mode")?),
        feature_version: number(&field("feature_version")?, "feature_version")?,
        b: number(&field("B")?, "B")?,
    };
    if !positions {
        return Ok(SavedState {
            header,
            positions: Vec::new(),
            contexts: None,
        });
    }
    let p = field("positions")?;
    let not_ints = || bad(format!("positions is not a list of B = {} ints", header.b));
    let positions: Vec<i64> = if let Ok(a) = p.cast::<PyArray1<i64>>() {
        a.to_vec().map_err(|_| not_ints())?
    } else if let Ok(a) = p.cast::<PyArray1<u64>>() {
        let v = a.to_vec().map_err(|_| not_ints())?;
        v.into_iter()
            .map(|x| i64::try_from(x).map_err(|_| not_ints()))
            .collect::<Result<_, _>>()?
    } else if p.is_instance_of::<PyString>() {
        return Err(not_ints());
    } else {
        p.extract::<Vec<i64>>().map_err(|_| not_ints())?
    };
    let contexts = if version == 1 {
        let c = field("contexts")?;
        Some(
            c.extract::<Vec<Vec<i64>>>()
                .map_err(|_| bad(format!("contexts is not a list of B = {} rows", header.b)))?,
        )
    } else {
        None
    };
    Ok(SavedState {
        header,
        positions,
        contexts,
    })
}

/// Check a saved state's header against a run before any stream is made: the checks
/// `load_state_dict` makes of it (format, version, feature version, pack mode, B, corpus),
/// with its messages. The positions are not read (a checkpoint's metadata holds the rest).
#[pyfunction]
#[pyo3(signature = (state, corpus, B, pack_mode = "utf8"))]
#[allow(non_snake_case)]
fn check_state_dict(
    py: Python<'_>,
    state: &Bound<'_, PyAny>,
    corpus: &Bound<'_, PyByteCorpus>,
    B: &Bound<'_, PyAny>,
    pack_mode: &str,
) -> PyResult<()> {
    let b = positive(B, "B")?;
    let mode = parse_mode(pack_mode)?;
    let state = state_from_py(state, false).map_err(|e| to_py(py, e))?;
    state
        .header
        .check(&corpus.get().inner, b, mode)
        .map_err(|e| to_py(py, e))
}

/// The state of all streams from the states of consecutive shares of them, in order (the
/// ranks' under torchrun): their positions joined, B their sum. The states must come from
/// loaders alike (format, version, corpus, pack mode, feature version).
#[pyfunction]
fn join_state_dicts<'py>(
    py: Python<'py>,
    states: Vec<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let parts = states
        .iter()
        .map(|s| state_from_py(s, true))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| to_py(py, e))?;
    let joined = SavedState::join(&parts).map_err(|e| to_py(py, e))?;
    state_to_py(py, &joined)
}

/// The B starting positions `offsets` gives in `corpus` (what
/// `BatchedByteStream(corpus, B, offsets=offsets).positions` is), without making the streams:
/// a rank takes its share of them under torchrun.
#[pyfunction]
#[pyo3(signature = (corpus, B, offsets = None), text_signature = "(corpus, B, offsets='even')")]
#[allow(non_snake_case)]
fn stream_offsets(
    py: Python<'_>,
    corpus: &Bound<'_, PyByteCorpus>,
    B: &Bound<'_, PyAny>,
    offsets: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<u64>> {
    let b = positive(B, "B")?;
    parse_offsets(offsets)?
        .resolve(b, corpus.get().inner.size())
        .map_err(|e| to_py(py, e))
}

/// Features of every byte of `data` from the reset state, float32 `(N, 320)`: the Rust twin
/// of `atom_train.data.atomizer.Atomizer(pack_mode).encode_bytes(data)`.
#[pyfunction]
#[pyo3(signature = (data, pack_mode = "utf8"))]
fn encode_bytes<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    pack_mode: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let mode = parse_mode(pack_mode)?;
    let bytes: Vec<u8> = if let Ok(b) = data.cast::<PyBytes>() {
        b.as_bytes().to_vec()
    } else if let Ok(b) = data.cast::<PyByteArray>() {
        b.to_vec()
    } else {
        return Err(user_error(format!(
            "data must be bytes or bytearray, got a {}",
            data.get_type().name()?
        )));
    };
    let n = bytes.len();
    let feats = py.detach(|| atomizer::encode_bytes(&bytes, mode));
    Ok(PyArray1::from_vec(py, feats)
        .reshape([n, FEATURE_DIM])?
        .into_any())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyByteCorpus>()?;
    m.add_class::<PyBatchedByteStream>()?;
    m.add_class::<PyStreamSnapshot>()?;
    m.add_function(wrap_pyfunction!(encode_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(check_state_dict, m)?)?;
    m.add_function(wrap_pyfunction!(join_state_dicts, m)?)?;
    m.add_function(wrap_pyfunction!(stream_offsets, m)?)?;
    m.add("FEATURE_DIM", FEATURE_DIM)?;
    m.add("FEATURE_VERSION", FEATURE_VERSION)?;
    m.add("FEATURE_IDS_PER_TICK", FEATURE_IDS_PER_TICK)?;
    m.add("FEATURE_ID_PAD", FEATURE_ID_PAD)?;
    m.add("HORIZON", HORIZON)?;
    m.add("PACK_MODES", PackMode::ALL.map(PackMode::name).to_vec())?;
    m.add("STATE_FORMAT", STATE_FORMAT)?;
    m.add("STATE_VERSION", STATE_VERSION)?;
    Ok(())
}
