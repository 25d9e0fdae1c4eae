//! The one thread-pool policy of the extension. The caller says how many threads (a
//! stream's `threads`, a field-loop call's `threads`; `None`: one a CPU core); the pool of
//! that size is made on first use, named `atom-<size>-<i>`, and kept for the life of the
//! process, shared by every stream and call that asks for that size. One thread needs no
//! pool: the work runs in the calling thread. The crates run on the pool they are given
//! and give the same results whatever its size.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rayon::ThreadPool;

/// The pool of `threads` threads (`None`: the CPU's core count); `Ok(None)` for one thread.
/// The error is the message; the caller makes it its own exception.
pub(crate) fn pool(threads: Option<usize>) -> Result<Option<Arc<ThreadPool>>, String> {
    static POOLS: Mutex<Option<HashMap<usize, Arc<ThreadPool>>>> = Mutex::new(None);
    let n = match threads {
        Some(0) => return Err("threads must be at least 1 (or None for one a core)".into()),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    if n == 1 {
        return Ok(None);
    }
    let mut pools = POOLS.lock().unwrap_or_else(|p| p.into_inner());
    let pools = pools.get_or_insert_with(HashMap::new);
    if let Some(p) = pools.get(&n) {
        return Ok(Some(p.clone()));
    }
    let p = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(move |i| format!("atom-{n}-{i}"))
        .build()
        .map_err(|e| format!("cannot start {n} threads: {e}"))?;
    let p = Arc::new(p);
    pools.insert(n, p.clone());
    Ok(Some(p))
}
