//! atomdata: the core of atom's data loader (docs/design.md#the-loader).
//!
//! - [`atomizer`]: byte classes, the context state and the 320-dim features of a byte.
//! - [`corpus`]: [`ByteCorpus`], sorted shards seen as one circular byte string.
//! - [`stream`]: [`BatchedByteStream`], B streams with their own contexts, windows in parallel
//!   on the caller's thread pool; [`StreamSnapshot`], their positions at one moment.
//! - [`state`]: [`SavedState`], what a checkpoint records to resume the streams exactly (the
//!   positions; format 1, with the contexts, is read too).
//! - [`error`]: the one error type.
//!
//! A plain Rust library: `cargo test` needs no Python. The Python module
//! (`atom_train._atomdata`) is the binding crate's (`atom-py/`), which binds this crate and
//! the field loop's (`atomfield`).

pub mod atomizer;
pub mod corpus;
pub mod error;
pub mod state;
pub mod stream;

pub use atomizer::{Context, PackMode};
pub use corpus::ByteCorpus;
pub use error::{Error, Result};
pub use state::{SavedState, StateHeader};
pub use stream::{BatchedByteStream, Offsets, StreamSnapshot};
