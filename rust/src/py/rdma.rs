//! RDMA GID tables, selection and the HELLO caps codec for Python (`crate::rdma`).
//!
//! Values cross as small frozen classes; "no RDMA, and why" is `RdmaError` with a `reason`.
//! Environment mappings default to `os.environ`, so what Python sets is what is resolved.

use std::collections::HashMap;
use std::path::PathBuf;

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use super::exceptions::NativeError;
use super::getters::{pyclass_with_fields, pymethods_with_fields};
use crate::rdma::{self, Caps, GidEntry, GidKind, PortInfo, RdmaEnv, Selection};

create_exception!(
    rpcnet._native,
    RdmaError,
    NativeError,
    "No usable RDMA, unreadable GID tables or bad caps / environment (attribute: reason)."
);

impl From<rdma::RdmaError> for PyErr {
    fn from(e: rdma::RdmaError) -> Self {
        Python::attach(|py| {
            let err = RdmaError::new_err(e.reason.clone());
            if let Err(set) = err.value(py).setattr("reason", &e.reason) {
                return set;
            }
            err
        })
    }
}

/// A GID given as 16 raw bytes or as text (sysfs spelling or any IPv6 form).
fn gid_arg(obj: &Bound<'_, PyAny>) -> PyResult<rdma::Gid> {
    if let Ok(text) = obj.cast::<PyString>() {
        let text = text.to_str()?;
        return rdma::parse_gid(text)
            .ok_or_else(|| PyValueError::new_err(format!("not a GID: {text:?}")));
    }
    let raw: Vec<u8> = obj.extract()?;
    raw.as_slice().try_into().map_err(|_| {
        PyValueError::new_err(format!(
            "a GID is {} bytes, got {}",
            rdma::GID_SIZE,
            raw.len()
        ))
    })
}

/// Python spelling of an optional string in reprs.
fn opt_repr(value: &Option<String>) -> String {
    value
        .as_ref()
        .map_or_else(|| "None".to_string(), |v| format!("{v:?}"))
}

fn addr_arg(text: &str) -> PyResult<std::net::IpAddr> {
    rdma::parse_addr(text).map_err(|e| PyValueError::new_err(e.reason))
}

/// [`pyclass_with_fields`] of a class whose `inner` also holds a GID with its kind and net
/// device: the getters of those three too.
macro_rules! gid_pyclass {
    ({ $($head:tt)* }, [$($fields:tt)*] { $($own:tt)* }) => {
        pyclass_with_fields!($($head)*, [$($fields)*, ndev: Option<String>] {
            $($own)*

            #[getter]
            fn gid<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
                PyBytes::new(py, &self.inner.gid)
            }

            /// sysfs spelling, e.g. "0000:0000:0000:0000:0000:ffff:0a00:0001".
            #[getter]
            fn gid_text(&self) -> String {
                rdma::format_gid(&self.inner.gid)
            }

            /// "RoCE v2", "RoCE v1", "IB" or "unknown".
            #[getter]
            fn kind(&self) -> &'static str {
                self.inner.kind.label()
            }
        });
    };
}

// ------------------------------------------------------------------------------------------------

gid_pyclass!({
    /// One non-empty GID table entry.
    PyRdmaGid(GidEntry) as "RdmaGid" [eq, from_py_object] derive(Clone, PartialEq, Eq)
}, [index: u32] {
    #[new]
    #[pyo3(signature = (index, gid, kind="unknown", ndev=None))]
    fn new(index: u32, gid: &Bound<'_, PyAny>, kind: &str, ndev: Option<String>) -> PyResult<Self> {
        let kind = GidKind::from_label(kind)
            .ok_or_else(|| PyValueError::new_err(format!("unknown GID kind {kind:?}")))?;
        Ok(Self {
            inner: GidEntry {
                index,
                gid: gid_arg(gid)?,
                kind,
                ndev: ndev.filter(|s| !s.is_empty()),
            },
        })
    }

    /// The address the GID carries ("10.0.0.1", "fe80::1").
    #[getter]
    fn address(&self) -> String {
        rdma::gid_addr(&self.inner.gid).to_string()
    }

    fn __repr__(&self) -> String {
        format!(
            "RdmaGid({}, {}, {:?}, ndev={})",
            self.inner.index,
            rdma::gid_addr(&self.inner.gid),
            self.inner.kind.label(),
            opt_repr(&self.inner.ndev)
        )
    }
});

pyclass_with_fields!(
    /// One port of one RDMA device with its non-empty GIDs.
    PyRdmaPort(PortInfo) as "RdmaPort" [from_py_object] derive(Clone),
    [
        device: String,
        port: u32,
        /// sysfs text such as "4: ACTIVE", None when unknown.
        state: Option<String>,
        link_layer: Option<String>,
    ] {
    #[new]
    #[pyo3(signature = (device, port, gids=Vec::new(), state=None, link_layer=None))]
    fn new(
        device: String,
        port: u32,
        gids: Vec<PyRdmaGid>,
        state: Option<String>,
        link_layer: Option<String>,
    ) -> Self {
        Self {
            inner: PortInfo {
                device,
                port,
                state,
                link_layer,
                gids: gids.into_iter().map(|g| g.inner).collect(),
            },
        }
    }

    /// False only when the state is known and is not ACTIVE.
    #[getter]
    fn active(&self) -> Option<bool> {
        self.inner.is_active()
    }

    #[getter]
    fn gids(&self) -> Vec<PyRdmaGid> {
        self.inner
            .gids
            .iter()
            .map(|g| PyRdmaGid { inner: g.clone() })
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "RdmaPort({:?}, {}, {} GIDs, state={})",
            self.inner.device,
            self.inner.port,
            self.inner.gids.len(),
            opt_repr(&self.inner.state)
        )
    }
});

pyclass_with_fields!(
    /// The RDMA environment variables that were found, parsed.
    PyRdmaEnv(RdmaEnv) as "RdmaEnv" [from_py_object] derive(Clone),
    [
        /// Name of the variable that disables RDMA, if one is set.
        disabled_by: Option<String>,
    ] {
    #[getter]
    fn device(&self) -> Option<String> {
        self.inner.device.as_ref().map(|(_, v)| v.clone())
    }

    #[getter]
    fn device_var(&self) -> Option<String> {
        self.inner.device.as_ref().map(|(n, _)| n.clone())
    }

    #[getter]
    fn gid_index(&self) -> Option<u32> {
        self.inner.gid_index.as_ref().map(|(_, v)| *v)
    }

    #[getter]
    fn gid_var(&self) -> Option<String> {
        self.inner.gid_index.as_ref().map(|(n, _)| n.clone())
    }

    fn __repr__(&self) -> String {
        let e = &self.inner;
        let pair = |p: &Option<(String, String)>| {
            p.as_ref()
                .map_or_else(|| "None".to_string(), |(n, v)| format!("{n}={v}"))
        };
        let gid = e
            .gid_index
            .as_ref()
            .map(|(n, v)| (n.clone(), v.to_string()));
        format!(
            "RdmaEnv(disabled_by={}, device={}, gid_index={})",
            opt_repr(&e.disabled_by),
            pair(&e.device),
            pair(&gid)
        )
    }
});

gid_pyclass!({
    /// The device, port and GID index a connection would use.
    PyRdmaSelection(Selection) as "RdmaSelection" [] derive(Clone)
}, [
    device: String,
    port: u32,
    gid_index: u32,
    /// How it was chosen, for logs.
    how: String
] {
    /// The local address the selection was made for, in GID form.
    #[getter]
    fn target<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.target)
    }

    fn __repr__(&self) -> String {
        format!(
            "RdmaSelection({:?}, port={}, gid_index={}, {:?}: {})",
            self.inner.device,
            self.inner.port,
            self.inner.gid_index,
            self.inner.kind.label(),
            self.inner.how
        )
    }
});

// ------------------------------------------------------------------------------------------------

/// Every port and non-empty GID under `root` (default /sys/class/infiniband).
#[pyfunction]
#[pyo3(signature = (root=None))]
pub fn rdma_scan(py: Python<'_>, root: Option<PathBuf>) -> PyResult<Vec<PyRdmaPort>> {
    let root = root.unwrap_or_else(|| PathBuf::from(rdma::SYSFS_ROOT));
    let ports = py.detach(|| rdma::scan_sysfs(&root))?;
    Ok(ports
        .into_iter()
        .map(|inner| PyRdmaPort { inner })
        .collect())
}

fn env_from(py: Python<'_>, environ: Option<&Bound<'_, PyAny>>) -> PyResult<RdmaEnv> {
    let os_environ;
    let environ = match environ {
        Some(e) => e,
        None => {
            os_environ = py.import("os")?.getattr("environ")?;
            &os_environ
        }
    };
    let mut found: HashMap<&str, String> = HashMap::new();
    for name in rdma::NO_RDMA_VARS
        .iter()
        .chain(&rdma::DEV_VARS)
        .chain(&rdma::GID_VARS)
    {
        let value = environ.call_method1("get", (*name,))?;
        if !value.is_none() {
            found.insert(name, value.extract()?);
        }
    }
    Ok(RdmaEnv::from_lookup(|name| found.get(name).cloned())?)
}

/// Parse the RDMA environment variables of `environ` (default `os.environ`).
#[pyfunction]
#[pyo3(signature = (environ=None))]
pub fn rdma_env(py: Python<'_>, environ: Option<&Bound<'_, PyAny>>) -> PyResult<PyRdmaEnv> {
    Ok(PyRdmaEnv {
        inner: env_from(py, environ)?,
    })
}

/// Choose device, port and GID index for a connection whose local address is `local_addr`;
/// RdmaError saying why when there is none. `env` defaults to `rdma_env()`.
#[pyfunction]
#[pyo3(signature = (ports, local_addr, env=None))]
pub fn rdma_resolve(
    py: Python<'_>,
    ports: Vec<PyRdmaPort>,
    local_addr: &str,
    env: Option<PyRdmaEnv>,
) -> PyResult<PyRdmaSelection> {
    let env = match env {
        Some(e) => e.inner,
        None => env_from(py, None)?,
    };
    let ports: Vec<PortInfo> = ports.into_iter().map(|p| p.inner).collect();
    let inner = rdma::resolve(&ports, addr_arg(local_addr)?, &env)?;
    Ok(PyRdmaSelection { inner })
}

/// A local address in GID form: IPv4 as ::ffff:a.b.c.d, IPv6 as is.
#[pyfunction]
pub fn rdma_target_gid<'py>(py: Python<'py>, addr: &str) -> PyResult<Bound<'py, PyBytes>> {
    Ok(PyBytes::new(py, &rdma::target_gid(addr_arg(addr)?)))
}

/// 16 bytes (or GID text) in sysfs spelling.
#[pyfunction]
pub fn rdma_format_gid(gid: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(rdma::format_gid(&gid_arg(gid)?))
}

/// sysfs or IPv6 text to 16 bytes (ValueError when it is neither).
#[pyfunction]
pub fn rdma_parse_gid<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyBytes>> {
    let gid = rdma::parse_gid(text)
        .ok_or_else(|| PyValueError::new_err(format!("not a GID: {text:?}")))?;
    Ok(PyBytes::new(py, &gid))
}

/// The 24-byte conn_caps for a queue pair; psn defaults to qpn & 0xFFFFFF.
#[pyfunction]
#[pyo3(signature = (qpn, gid, psn=None))]
pub fn rdma_encode_caps<'py>(
    py: Python<'py>,
    qpn: u32,
    gid: &Bound<'_, PyAny>,
    psn: Option<u32>,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut caps = Caps::for_qp(qpn, gid_arg(gid)?);
    if let Some(psn) = psn {
        caps.psn = psn;
    }
    Ok(PyBytes::new(py, &caps.encode()))
}

/// (qpn, psn, gid) of non-zero caps, None for all-zero caps; RdmaError unless 24 bytes.
#[pyfunction]
pub fn rdma_decode_caps<'py>(
    py: Python<'py>,
    caps: Vec<u8>,
) -> PyResult<Option<(u32, u32, Bound<'py, PyBytes>)>> {
    Ok(Caps::decode(&caps)?.map(|c| (c.qpn, c.psn, PyBytes::new(py, &c.gid))))
}
