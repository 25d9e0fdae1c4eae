//! The loader's one error type. Every message says what went wrong and what to do about it;
//! the binding crate (`atom-py/src/error.rs`) turns these into `AtomDataError`, and
//! [`Error::is_io`] ones into its subclass that is also an `OSError`.

use std::io;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no corpus path given: pass a file or a glob such as 'data/*.txt' (check --data)")]
    NoPaths,

    #[error("no file matches '{pattern}' (cwd {cwd}): check --data")]
    NoMatch { pattern: String, cwd: String },

    #[error("'{pattern}' is not a valid glob ({reason}): check --data")]
    BadPattern { pattern: String, reason: String },

    #[error("{path} is a directory: pass the files in it, e.g. '{path}/*.txt'")]
    IsDirectory { path: String },

    #[error("{path} is not a regular file: pass regular files only")]
    NotAFile { path: String },

    #[error("the corpus is empty: every shard has 0 bytes ({shards}): check --data")]
    EmptyCorpus { shards: String },

    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: String,
        source: io::Error,
    },

    #[error(
        "shard {path} changed size from {expected} to {actual} bytes while the loader was \
         running: restore it or restart with the new corpus"
    )]
    ShardResized {
        path: String,
        expected: u64,
        actual: u64,
    },

    #[error(
        "shard {path} was modified (its mtime changed) while the loader was running: \
         restore it or restart with the new corpus"
    )]
    ShardModified { path: String },

    #[error(
        "shard {path} was replaced or removed on disk while the loader was running (the \
         loader still holds the old file): restore it or restart with the new corpus"
    )]
    ShardReplaced { path: String },

    #[error(
        "cannot hold the corpus in RAM ({bytes} bytes): not enough memory; use \
         resident=False to memory-map it instead"
    )]
    OutOfMemory { bytes: u64 },

    #[error("unknown pack mode '{0}': use 'utf8' or 'plain'")]
    UnknownPackMode(String),

    /// A bad argument; the message names the argument and the fix.
    #[error("{0}")]
    InvalidArgument(String),

    /// A saved loader state that does not fit this loader; the message says what differs.
    #[error("cannot load the loader state: {0}")]
    BadState(String),
}

impl Error {
    /// Failures of the file system (as opposed to a bad argument): Python sees them as
    /// `OSError`s too.
    pub fn is_io(&self) -> bool {
        matches!(
            self,
            Error::Io { .. }
                | Error::ShardResized { .. }
                | Error::ShardModified { .. }
                | Error::ShardReplaced { .. }
        )
    }

    pub(crate) fn io(action: &'static str, path: &std::path::Path, source: io::Error) -> Self {
        Error::Io {
            action,
            path: path.display().to_string(),
            source,
        }
    }
}
