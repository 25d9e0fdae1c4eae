//! atomdata: the core of atom's data loader (placeholder, being written).

#[cfg(feature = "python")]
mod python;
