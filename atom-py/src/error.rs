//! The extension's exception tree, and the one conversion of each crate's errors into it:
//!
//! ```text
//! AtomError (ValueError)          every error this extension raises
//! ├── AtomDataError               the loader's (atomdata::Error): bad argument, bad corpus,
//! │   │                           a saved state that does not fit
//! │   └── AtomDataIOError         ... caused by the file system (also an OSError)
//! └── AtomFieldError              the native field loop's (atomfield::Error) and its
//!                                 arguments'
//! ```
//!
//! Every message says what went wrong and how to fix it.

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

pyo3::create_exception!(
    atom_train._atomdata,
    AtomError,
    PyValueError,
    "An error of atom's native extension (the loader's or the field loop's). The message says how to fix it."
);

pyo3::create_exception!(
    atom_train._atomdata,
    AtomDataError,
    AtomError,
    "A loader error: bad argument, bad corpus, or a saved state that does not fit. The message says how to fix it."
);

pyo3::create_exception!(
    atom_train._atomdata,
    AtomFieldError,
    AtomError,
    "A native field loop error: arrays of the wrong shape, dtype or layout, bad constants, or an instruction set this CPU lacks."
);

/// `AtomDataIOError(AtomDataError, OSError)`: a file-system failure (a shard unreadable,
/// changed or replaced). Built with `type()` because it has two bases.
fn io_error_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let ty = TYPE.get_or_try_init(py, || -> PyResult<Py<PyType>> {
        let bases = PyTuple::new(
            py,
            [py.get_type::<AtomDataError>(), py.get_type::<PyOSError>()],
        )?;
        let body = PyDict::new(py);
        body.set_item("__module__", "atom_train._atomdata")?;
        body.set_item(
            "__doc__",
            "A loader error caused by the file system (both an AtomDataError and an OSError).",
        )?;
        let ty = py
            .get_type::<PyType>()
            .call1(("AtomDataIOError", bases, body))?;
        Ok(ty.cast_into::<PyType>()?.unbind())
    })?;
    Ok(ty.bind(py))
}

/// The loader's errors: `AtomDataIOError` for the file system's, else `AtomDataError`.
pub(crate) fn data_error(py: Python<'_>, err: atomdata::Error) -> PyErr {
    let msg = err.to_string();
    if err.is_io() {
        match io_error_type(py) {
            Ok(ty) => PyErr::from_type(ty.clone(), msg),
            Err(e) => e,
        }
    } else {
        AtomDataError::new_err(msg)
    }
}

/// A bad argument to the loader's binding.
pub(crate) fn data_arg(msg: impl Into<String>) -> PyErr {
    AtomDataError::new_err(msg.into())
}

/// The field loop's errors, and bad arguments to its binding.
pub(crate) fn field_error(err: atomfield::Error) -> PyErr {
    AtomFieldError::new_err(err.to_string())
}

pub(crate) fn field_arg(msg: impl Into<String>) -> PyErr {
    AtomFieldError::new_err(msg.into())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("AtomError", py.get_type::<AtomError>())?;
    m.add("AtomDataError", py.get_type::<AtomDataError>())?;
    m.add("AtomDataIOError", io_error_type(py)?)?;
    m.add("AtomFieldError", py.get_type::<AtomFieldError>())?;
    Ok(())
}
