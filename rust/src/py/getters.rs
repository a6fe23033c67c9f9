//! The `#[pymethods]` block of a class that wraps a core value in `inner`, with a getter per
//! plain field of that value.

/// `#[pymethods] impl $class`: the class's own methods, then for each listed field (`doc
/// field: Type`) a getter returning a copy of `self.inner.field`.
macro_rules! pymethods_with_fields {
    ($class:ty, [$($(#[$doc:meta])* $field:ident: $ty:ty),* $(,)?] { $($own:tt)* }) => {
        #[pyo3::pymethods]
        impl $class {
            $($own)*

            $(
                $(#[$doc])*
                #[getter]
                fn $field(&self) -> $ty {
                    Clone::clone(&self.inner.$field)
                }
            )*
        }
    };
}
pub(super) use pymethods_with_fields;
