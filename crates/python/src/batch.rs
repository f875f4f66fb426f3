//! A batch as a dict of NumPy arrays, each owning the Rust buffer it was
//! built in (no copy), shared by `Sampler` and `EvalPass`.
//!
//! Invariants: one array per row of `headwater::batch::TENSORS`, named and
//! shaped as that row says; the pointer of every buffer handed over is
//! recorded (`ptrs`) so a test can prove nothing was copied. Never: copy a
//! tensor, or hold domain logic.

use half::f16;
use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use headwater::batch::{Batch, TensorData};

fn arr<'py, T: numpy::Element>(
    py: Python<'py>,
    v: Vec<T>,
    shape: &[usize],
    ptrs: &mut Vec<(&'static str, usize)>,
    key: &'static str,
) -> PyResult<Bound<'py, PyAny>> {
    ptrs.push((key, v.as_ptr() as usize));
    let a = PyArray1::from_vec(py, v);
    Ok(a.reshape(shape)?.into_any())
}

/// The batch dict: one NumPy array per `TENSORS` row, owning the Rust buffer.
pub(super) fn batch_dict<'py>(
    py: Python<'py>,
    b: Batch,
    ptrs: &mut Vec<(&'static str, usize)>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (spec, shape, data) in b.into_tensors() {
        let (k, s) = (spec.name, &shape[..]);
        let a = match data {
            TensorData::I8(v) => arr(py, v, s, ptrs, k)?,
            TensorData::U8(v) => arr(py, v, s, ptrs, k)?,
            TensorData::U16(v) => arr(py, v, s, ptrs, k)?,
            TensorData::I32(v) => arr(py, v, s, ptrs, k)?,
            TensorData::U32(v) => arr(py, v, s, ptrs, k)?,
            TensorData::U64(v) => arr(py, v, s, ptrs, k)?,
            TensorData::F16(v) => arr::<f16>(py, v, s, ptrs, k)?,
            TensorData::F32(v) => arr(py, v, s, ptrs, k)?,
        };
        d.set_item(k, a)?;
    }
    Ok(d)
}
