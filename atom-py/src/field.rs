//! The native field loop's binding (the `atomfield` crate): `field_forward` and
//! `field_backward` over numpy arrays (float32 or float64, C-contiguous), run with the GIL
//! released on the extension's pool of the caller's size (`pool.rs`), and `field_kernel`.
//! `atom_train.model.field_native` is the autograd Function around them.
//!
//! The loop's constants come as the model's one `FieldConsts` object
//! (`atom_train.model.config`), read by attribute into the crate's `Consts`: the names are
//! [`CONSTS`], exported as `FIELD_CONSTS` so a test holds the two equal.

use atomfield::{Consts, Exec, ForwardOut, Grads, Kernel, Real, Shape, Window};
use numpy::{
    Element, IxDyn, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods,
};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::error::{field_arg as bad, field_error};
use crate::pool;

/// The fields of `Consts`, in its order: the attributes read of the `FieldConsts` object.
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

/// The crate's `Consts` from a `FieldConsts` (any object with the [`CONSTS`] attributes as
/// floats).
fn consts(c: &Bound<'_, PyAny>) -> PyResult<Consts> {
    let py = c.py();
    let get = |name: &Bound<'_, pyo3::types::PyString>| -> PyResult<f64> {
        c.getattr(name)
            .and_then(|v| v.extract::<f64>())
            .map_err(|_| {
                bad(format!(
                    "consts must be the model's FieldConsts (atom_train.model.config), with a \
                     float {name}; got {}",
                    c.repr().map(|r| r.to_string()).unwrap_or_default()
                ))
            })
    };
    Ok(Consts {
        dt: get(intern!(py, "dt"))?,
        max_rms: get(intern!(py, "max_rms"))?,
        log_target: get(intern!(py, "log_target"))?,
        amp_rate: get(intern!(py, "amp_rate"))?,
        phase_sync_min: get(intern!(py, "phase_sync_min"))?,
        amp_log_floor: get(intern!(py, "amp_log_floor"))?,
        energy_decay: get(intern!(py, "energy_decay"))?,
        gain_min: get(intern!(py, "gain_min"))?,
        gain_max: get(intern!(py, "gain_max"))?,
    })
}

/// The pool a call of `threads` threads runs on (None: the calling thread).
fn pool_of(threads: usize) -> PyResult<Option<std::sync::Arc<rayon::ThreadPool>>> {
    pool::pool(Some(threads)).map_err(bad)
}

/// A C-contiguous array of T's elements.
fn array<'py, T: Element>(
    obj: &Bound<'py, PyAny>,
    what: &str,
) -> PyResult<PyReadonlyArrayDyn<'py, T>> {
    let arr = obj.cast::<PyArrayDyn<T>>().map_err(|_| {
        bad(format!(
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
        Err(bad("u must be a float32 or float64 numpy array"))
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
        let pool = pool_of(threads)?;
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
        let pool = pool_of(threads)?;
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
/// `resets`: K bools; `consts`: the model's `FieldConsts` (the loop's constants, read by
/// attribute: dt, max_rms, log_target, amp_rate, phase_sync_min, amp_log_floor,
/// energy_decay, gain_min, gain_max); `threads`: the size of the pool it runs on (1: the
/// calling thread).
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
    consts: Bound<'py, PyAny>,
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
    consts: Bound<'py, PyAny>,
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
    m.add("FIELD_CONSTS", CONSTS.to_vec())?;
    Ok(())
}
