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

/// A frozen Python class `$class` (Python name `$name` in `rpcnet._native`, further
/// `#[pyclass]` options `eq` and/or `from_py_object`) wrapping a core `$inner` value in
/// `inner`, and its [`pymethods_with_fields`].
macro_rules! pyclass_with_fields {
    ($(#[$doc:meta])* $class:ident($inner:ty) as $name:tt [$($opt:ident),*]
     derive($($derive:ident),*), [$($fields:tt)*] { $($own:tt)* }) => {
        pyclass_with_fields!(@class [$($opt),*] $name, {
            $(#[$doc])*
            #[derive($($derive),*)]
            pub struct $class {
                inner: $inner,
            }
        });

        pymethods_with_fields!($class, [$($fields)*] { $($own)* });
    };
    // the options are written here, not passed through: pyo3 names the code it generates
    // with their spans, which must be this macro's
    (@class [eq, from_py_object] $name:tt, { $($item:tt)* }) => {
        #[pyo3::pyclass(module = "rpcnet._native", name = $name, frozen, eq, from_py_object)]
        $($item)*
    };
    (@class [from_py_object] $name:tt, { $($item:tt)* }) => {
        #[pyo3::pyclass(module = "rpcnet._native", name = $name, frozen, from_py_object)]
        $($item)*
    };
    (@class [] $name:tt, { $($item:tt)* }) => {
        #[pyo3::pyclass(module = "rpcnet._native", name = $name, frozen)]
        $($item)*
    };
}
pub(super) use pyclass_with_fields;
