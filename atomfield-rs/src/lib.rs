//! atomfield: the field loop of atom's batched tick on the CPU (docs/model.md): steps 2-6 of
//! the tick (leak, RK4 with the drive scaled by the gain, phase sync, RMS cap, amplitude
//! controller) for B independent streams over a window of K ticks, forward and backward.
//!
//! - [`forward`] stores only what the backward needs: the field after each tick and the
//!   gain each tick used (O(B n) a tick); [`backward`] walks the window in reverse,
//!   recomputing each tick from the stored field, with the hand-derived gradient of the
//!   torch `fused` loop (`atom_train/model/field_loops.py`).
//! - Streams run in blocks of [`BLOCK`] on the caller's rayon pool; the parameters'
//!   gradients are per-block partial sums added in block order, so a result is the same bit
//!   for bit from run to run *and* whatever the number of threads.
//! - The per-stage products are hand-tiled for AVX-512, AVX2 + FMA and plain Rust
//!   (`simd`), picked at run time; all three give the same bits.
//!
//! A plain Rust library: `cargo test` needs no Python. The Python binding is the binding
//! crate's (`atom-py/src/field.rs`: `atom_train._atomdata.field_forward` / `field_backward`),
//! which passes the model's constants as [`Consts`] and runs the loop on a pool of the
//! caller's size.

mod block;
pub mod real;
mod simd;
mod window;

#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

pub use real::Real;
pub use simd::Kernel;
pub use window::{
    backward, forward, Consts, Error, Exec, ForwardOut, Grads, Result, Shape, Window, BLOCK,
};
