//! atomdata: the core of atom's data loader (docs/design.md#the-loader).
//!
//! - [`atomizer`]: byte classes, the context state and the 320-dim features of a byte.
//! - [`corpus`]: [`ByteCorpus`], sorted shards seen as one circular byte string.
//! - [`stream`]: [`BatchedByteStream`], B streams with their own contexts, windows in parallel;
//!   [`StreamSnapshot`], their state at one moment.
//! - [`error`]: the one error type.
//!
//! Plain Rust: `cargo test` needs no Python. The Python classes live in `python.rs`, compiled
//! only with the `python` feature, with the field loop's functions (the `atomfield` crate)
//! in `python_field.rs`.

pub mod atomizer;
pub mod corpus;
pub mod error;
pub mod stream;

#[cfg(feature = "python")]
mod python;
#[cfg(feature = "python")]
mod python_field;

pub use atomizer::{Context, PackMode};
pub use corpus::ByteCorpus;
pub use error::{Error, Result};
pub use stream::{BatchedByteStream, Offsets, StreamSnapshot};
