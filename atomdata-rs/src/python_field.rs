//! The field loop (`atomfield`) for Python: `field_forward` and `field_backward` over numpy
//! arrays (float32 or float64, C-contiguous), run with the GIL released. Thin: argument
//! conversion and the thread pools; `atom_train.model.field_native` is the autograd Function
//! around them. Errors become `ValueError`s in one place ([`field_error`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use atomfield::{Consts, Exec, ForwardOut, Grads, Kernel, Real, Shape, Window};
use numpy::{
    Element, IxDyn, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// The one conversion of the loop's errors.
fn field_error(err: atomfield::Error) -> PyErr {
    PyValueError::new_err(err.to_string())
}

fn bad(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}

/// A rayon pool of `threads` threads, made once per count and kept (None for one thread:
/// the loop then runs in the calling thread).
fn pool(threads: usize) -> PyResult<Option<Arc<rayon::ThreadPool>>> {
    static POOLS: Mutex<Option<HashMap<usize, Arc<rayon::ThreadPool>>>> = Mutex::new(None);
    if threads == 0 {
        return Err(bad("threads must be at least 1"));
    }
    if threads == 1 {
        return Ok(None);
    }
    let mut pools = POOLS
        .lock()
        .map_err(|_| bad("field loop thread pools poisoned"))?;
    let pools = pools.get_or_insert_with(HashMap::new);
    if let Some(p) = pools.get(&threads) {
        return Ok(Some(p.clone()));
    }
    let p = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("atomfield-{i}"))
        .build()
        .map_err(|e| bad(format!("cannot start {threads} field-loop threads: {e}")))?;
    let p = Arc::new(p);
    pools.insert(threads, p.clone());
    Ok(Some(p))
}

const CONSTS: [&str; 9] = [
    "dt",
    "max_rms",
    "log_target",
    "amp_rate",
    "phase_sync_min",
    "amp_log_floor",
    "energy_decay",
    "gain_min",
    "gain_max",
];

fn consts(d: &Bound<'_, PyDict>) -> PyResult<Consts> {
    let mut v = [0.0f64; 9];
    for (x, key) in v.iter_mut().zip(CONSTS) {
        let item = d
            .get_item(key)?
            .ok_or_else(|| bad(format!("consts has no {key:?} (keys: {CONSTS:?})")))?;
        *x = item.extract()?;
    }
    let [dt, max_rms, log_target, amp_rate, phase_sync_min, amp_log_floor, energy_decay, gain_min, gain_max] =
        v;
    Ok(Consts {
        dt,
        max_rms,
        log_target,
        amp_rate,
        phase_sync_min,
        amp_log_floor,
        energy_decay,
        gain_min,
        gain_max,
    })
}

/// A C-contiguous array of T's elements.
fn array<'py, T: Element>(
    obj: &Bound<'py, PyAny>,
    what: &str,
) -> PyResult<PyReadonlyArrayDyn<'py, T>> {
    let arr = obj.cast::<PyArrayDyn<T>>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what} must be a numpy array of the same dtype as u (float32 or float64)"
        ))
    })?;
    let ro = arr
        .try_readonly()
        .map_err(|e| bad(format!("{what}: {e}")))?;
    if !ro.is_c_contiguous() {
        return Err(bad(format!("{what} must be C-contiguous")));
    }
    Ok(ro)
}

fn new_array<'py, T: Element>(py: Python<'py>, shape: &[usize]) -> Bound<'py, PyArrayDyn<T>> {
    PyArrayDyn::<T>::zeros(py, IxDyn(shape), false)
}

/// (K, B, n) from u's shape [K, B, 2n].
fn shape_of<T: Element>(u: &PyReadonlyArrayDyn<'_, T>) -> PyResult<Shape> {
    match *u.shape() {
        [k, b, d] if d % 2 == 0 && d > 0 => Ok(Shape { k, b, n: d / 2 }),
        ref s => Err(bad(format!("u must have shape [K, B, 2n], got {s:?}"))),
    }
}

/// The arrays of a window, borrowed read-only.
struct Inputs<'py, T: Element> {
    u: PyReadonlyArrayDyn<'py, T>,
    z: PyReadonlyArrayDyn<'py, T>,
    keep: PyReadonlyArrayDyn<'py, T>,
    ar: PyReadonlyArrayDyn<'py, T>,
    ai: PyReadonlyArrayDyn<'py, T>,
    cr: PyReadonlyArrayDyn<'py, T>,
    ci: PyReadonlyArrayDyn<'py, T>,
}

impl<'py, T: Element> Inputs<'py, T> {
    fn new(arrays: &[Bound<'py, PyAny>; 7]) -> PyResult<Self> {
        let [u, z, keep, ar, ai, cr, ci] = arrays;
        Ok(Inputs {
            u: array(u, "u")?,
            z: array(z, "z")?,
            keep: array(keep, "keep")?,
            ar: array(ar, "ar")?,
            ai: array(ai, "ai")?,
            cr: array(cr, "cr")?,
            ci: array(ci, "ci")?,
        })
    }

    fn window<'a>(
        &'a self,
        shape: Shape,
        consts: Consts,
        resets: &'a [bool],
    ) -> PyResult<Window<'a, T>> {
        let s = |a: &'a PyReadonlyArrayDyn<'py, T>| a.as_slice().map_err(|e| bad(e.to_string()));
        Ok(Window {
            shape,
            consts,
            u: s(&self.u)?,
            z: s(&self.z)?,
            keep: s(&self.keep)?,
            ar: s(&self.ar)?,
            ai: s(&self.ai)?,
            cr: s(&self.cr)?,
            ci: s(&self.ci)?,
            resets,
        })
    }
}

fn is_f64(u: &Bound<'_, PyAny>) -> PyResult<bool> {
    if u.cast::<PyArrayDyn<f64>>().is_ok() {
        Ok(true)
    } else if u.cast::<PyArrayDyn<f32>>().is_ok() {
        Ok(false)
    } else {
        Err(PyTypeError::new_err(
            "u must be a float32 or float64 numpy array",
        ))
    }
}

#[allow(clippy::too_many_arguments)]
fn forward_t<'py, T: Element + Real>(
    py: Python<'py>,
    arrays: [Bound<'py, PyAny>; 7],
    g: &Bound<'py, PyAny>,
    e: &Bound<'py, PyAny>,
    resets: Vec<bool>,
    consts: Consts,
    threads: usize,
) -> PyResult<Bound<'py, PyTuple>> {
    let inp = Inputs::<T>::new(&arrays)?;
    let shape = shape_of(&inp.u)?;
    let w = inp.window(shape, consts, &resets)?;
    let (g, e) = (array::<T>(g, "g")?, array::<T>(e, "e")?);
    let (gs_, es_) = (
        g.as_slice().map_err(|x| bad(x.to_string()))?,
        e.as_slice().map_err(|x| bad(x.to_string()))?,
    );
    let Shape { k, b, n } = shape;
    let outs = (
        new_array::<T>(py, &[k, b, 2 * n]),
        new_array::<T>(py, &[k, b]),
        new_array::<T>(py, &[k, b]),
        new_array::<T>(py, &[b]),
        new_array::<T>(py, &[b]),
    );
    {
        let (mut zs, mut es, mut gs, mut go, mut eo) = (
            outs.0.readwrite(),
            outs.1.readwrite(),
            outs.2.readwrite(),
            outs.3.readwrite(),
            outs.4.readwrite(),
        );
        let out = ForwardOut {
            zs: zs.as_slice_mut().map_err(|x| bad(x.to_string()))?,
            es: es.as_slice_mut().map_err(|x| bad(x.to_string()))?,
            gs: gs.as_slice_mut().map_err(|x| bad(x.to_string()))?,
            g: go.as_slice_mut().map_err(|x| bad(x.to_string()))?,
            e: eo.as_slice_mut().map_err(|x| bad(x.to_string()))?,
        };
        let pool = pool(threads)?;
        py.detach(|| {
            let exec = Exec {
                pool: pool.as_deref(),
                ..Exec::default()
            };
            atomfield::forward(&w, gs_, es_, out, &exec)
        })
        .map_err(field_error)?;
    }
    PyTuple::new(
        py,
        [
            outs.0.into_any(),
            outs.1.into_any(),
            outs.2.into_any(),
            outs.3.into_any(),
            outs.4.into_any(),
        ],
    )
}

#[allow(clippy::too_many_arguments)]
fn backward_t<'py, T: Element + Real>(
    py: Python<'py>,
    arrays: [Bound<'py, PyAny>; 7],
    saved: [&Bound<'py, PyAny>; 3],
    resets: Vec<bool>,
    consts: Consts,
    need_keep: bool,
    threads: usize,
) -> PyResult<Bound<'py, PyTuple>> {
    let inp = Inputs::<T>::new(&arrays)?;
    let shape = shape_of(&inp.u)?;
    let w = inp.window(shape, consts, &resets)?;
    let [zs, gs, gzs] = saved;
    let (zs, gs, gzs) = (
        array::<T>(zs, "zs")?,
        array::<T>(gs, "gs")?,
        array::<T>(gzs, "gzs")?,
    );
    let (zs_s, gs_s, gzs_s) = (
        zs.as_slice().map_err(|x| bad(x.to_string()))?,
        gs.as_slice().map_err(|x| bad(x.to_string()))?,
        gzs.as_slice().map_err(|x| bad(x.to_string()))?,
    );
    let Shape { k, b, n } = shape;
    let keep_shape: Vec<usize> = inp.keep.shape().to_vec();
    let outs = [
        new_array::<T>(py, &[k, b, 2 * n]),
        new_array::<T>(py, &[b, 2 * n]),
        new_array::<T>(py, &[n, n]),
        new_array::<T>(py, &[n, n]),
        new_array::<T>(py, &[n]),
        new_array::<T>(py, &[n]),
        new_array::<T>(py, &keep_shape),
    ];
    {
        let mut rw: Vec<_> = outs.iter().map(|a| a.readwrite()).collect();
        let mut it = rw.iter_mut();
        let mut next = || -> PyResult<&mut [T]> {
            it.next()
                .expect("seven outputs")
                .as_slice_mut()
                .map_err(|x| bad(x.to_string()))
        };
        let grads = Grads {
            u: next()?,
            z: next()?,
            cr: next()?,
            ci: next()?,
            ar: next()?,
            ai: next()?,
            keep: if need_keep { Some(next()?) } else { None },
        };
        let pool = pool(threads)?;
        py.detach(|| {
            let exec = Exec {
                pool: pool.as_deref(),
                ..Exec::default()
            };
            atomfield::backward(&w, zs_s, gs_s, gzs_s, grads, &exec)
        })
        .map_err(field_error)?;
    }
    let [gu, gz, gcr, gci, gar, gai, gkeep] = outs;
    let gkeep = if need_keep {
        gkeep.into_any()
    } else {
        py.None().into_bound(py)
    };
    PyTuple::new(
        py,
        [
            gu.into_any(),
            gz.into_any(),
            gkeep,
            gar.into_any(),
            gai.into_any(),
            gcr.into_any(),
            gci.into_any(),
        ],
    )
}

/// The field loop's forward over a window: `(zs [K,B,2n], es [K,B], gs [K,B], g [B],
/// e [B])` (the field and energy after each tick, the gain each tick used, the final gain
/// and energy). `u` [K,B,2n], `z` [B,2n], `keep` 0-dim or [2n], `ar`/`ai` [n],
/// `cr`/`ci` [n,n], `g`/`e` [B]: C-contiguous arrays of one dtype (float32 or float64);
/// `resets`: K bools; `consts`: a dict of the loop's constants (dt, max_rms, log_target,
/// amp_rate, phase_sync_min, amp_log_floor, energy_decay, gain_min, gain_max).
#[pyfunction]
#[pyo3(signature = (u, z, keep, ar, ai, cr, ci, g, e, resets, consts, threads = 1))]
#[allow(clippy::too_many_arguments)]
fn field_forward<'py>(
    py: Python<'py>,
    u: Bound<'py, PyAny>,
    z: Bound<'py, PyAny>,
    keep: Bound<'py, PyAny>,
    ar: Bound<'py, PyAny>,
    ai: Bound<'py, PyAny>,
    cr: Bound<'py, PyAny>,
    ci: Bound<'py, PyAny>,
    g: Bound<'py, PyAny>,
    e: Bound<'py, PyAny>,
    resets: Vec<bool>,
    consts: Bound<'py, PyDict>,
    threads: usize,
) -> PyResult<Bound<'py, PyTuple>> {
    let c = self::consts(&consts)?;
    let f64_ = is_f64(&u)?;
    let arrays = [u, z, keep, ar, ai, cr, ci];
    if f64_ {
        forward_t::<f64>(py, arrays, &g, &e, resets, c, threads)
    } else {
        forward_t::<f32>(py, arrays, &g, &e, resets, c, threads)
    }
}

/// The field loop's backward: `(gu, gz, gkeep, gar, gai, gcr, gci)`, the gradients of the
/// forward's array inputs in their order (gkeep None unless `need_keep`), from the forward's `zs` and `gs` and
/// the gradient `gzs` [K,B,2n] of the loss with respect to `zs`. Recomputes each tick from
/// `zs`. The arguments otherwise as `field_forward`'s.
#[pyfunction]
#[pyo3(signature = (u, z, keep, ar, ai, cr, ci, zs, gs, gzs, resets, consts, need_keep, threads = 1))]
#[allow(clippy::too_many_arguments)]
fn field_backward<'py>(
    py: Python<'py>,
    u: Bound<'py, PyAny>,
    z: Bound<'py, PyAny>,
    keep: Bound<'py, PyAny>,
    ar: Bound<'py, PyAny>,
    ai: Bound<'py, PyAny>,
    cr: Bound<'py, PyAny>,
    ci: Bound<'py, PyAny>,
    zs: Bound<'py, PyAny>,
    gs: Bound<'py, PyAny>,
    gzs: Bound<'py, PyAny>,
    resets: Vec<bool>,
    consts: Bound<'py, PyDict>,
    need_keep: bool,
    threads: usize,
) -> PyResult<Bound<'py, PyTuple>> {
    let c = self::consts(&consts)?;
    let f64_ = is_f64(&u)?;
    let arrays = [u, z, keep, ar, ai, cr, ci];
    let saved = [&zs, &gs, &gzs];
    if f64_ {
        backward_t::<f64>(py, arrays, saved, resets, c, need_keep, threads)
    } else {
        backward_t::<f32>(py, arrays, saved, resets, c, need_keep, threads)
    }
}

/// The instruction set the field loop runs with on this CPU ("avx512", "avx2" or "portable").
#[pyfunction]
fn field_kernel() -> &'static str {
    Kernel::Auto.resolve().unwrap_or(Kernel::Portable).name()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(field_forward, m)?)?;
    m.add_function(wrap_pyfunction!(field_backward, m)?)?;
    m.add_function(wrap_pyfunction!(field_kernel, m)?)?;
    m.add("FIELD_BLOCK", atomfield::BLOCK)?;
    Ok(())
}
