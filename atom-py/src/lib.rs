//! atom's Python extension, `atom_train._atomdata` (private: `atom_train.data.loader` and
//! `atom_train.model.field_native` are its Python faces). One file per bound crate:
//!
//! - `data.rs`: the loader (`atomdata`): `ByteCorpus`, `BatchedByteStream`,
//!   `StreamSnapshot`, the saved-state functions, `encode_bytes`, the loader's constants;
//! - `field.rs`: the native field loop (`atomfield`): `field_forward`, `field_backward`,
//!   `field_kernel`;
//!
//! and what they share: `error.rs`, the one exception tree and the one conversion of each
//! crate's errors into it; `pool.rs`, the one thread-pool policy (the caller picks the
//! size).
//!
//! Thin by design: argument conversion, numpy buffers, the GIL. All real work runs in the
//! crates with the GIL released.

use pyo3::prelude::*;

mod data;
mod error;
mod field;
mod pool;

#[pymodule]
fn _atomdata(m: &Bound<'_, PyModule>) -> PyResult<()> {
    error::register(m)?;
    data::register(m)?;
    field::register(m)?;
    Ok(())
}
