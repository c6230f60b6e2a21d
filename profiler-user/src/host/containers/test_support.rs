//! Cgroup paths and the check every shape's test uses (unit tests only).

use super::{QosClass, Runtime, attribute};

pub(super) const ID: &str = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899";
pub(super) const ID2: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
pub(super) const UID: &str = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d";
pub(super) const UID_US: &str = "1a2b3c4d_5e6f_4a7b_8c9d_0e1f2a3b4c5d";
pub(super) const STATIC_UID: &str = "8b2f6c1de0a94c3b9f7e6d5c4b3a2910";

/// Checks the full attribution of `path`.
pub(super) fn check(
    path: &str,
    id: Option<&str>,
    runtime: Option<Runtime>,
    pod: Option<&str>,
    qos: Option<QosClass>,
) {
    let info = attribute(path);
    assert_eq!(info.container_id.as_deref(), id, "id of {path}");
    assert_eq!(info.runtime, runtime, "runtime of {path}");
    assert_eq!(info.pod_uid.as_deref(), pod, "pod of {path}");
    assert_eq!(info.qos_class, qos, "qos of {path}");
    assert_eq!(info.cgroup_path, path);
    assert!(info.nspid.is_empty());
}

pub(super) fn nothing(path: &str) {
    check(path, None, None, None, None);
}
