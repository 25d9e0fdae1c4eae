use pyo3::prelude::*;

#[pymodule]
fn _atomdata(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("FEATURE_DIM", 320)?;
    Ok(())
}
