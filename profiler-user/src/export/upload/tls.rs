//! The certificate authorities uploads over `https://` trust.
//!
//! By default, the system's CA bundle (`$SSL_CERT_FILE`, or the first of [`SYSTEM_BUNDLES`]
//! that exists and holds a certificate); on a system without one, the Mozilla roots built
//! into pyperch. `--upload-ca-file FILE` (a PEM bundle) is added to the system's bundle, so a
//! private CA works alongside public ones; on a system without a bundle it is the only CA.
//! Bundles are read once, at start, each at most [`MAX_BUNDLE_BYTES`].

use std::{
    io::Read,
    path::{Path, PathBuf},
};

use ureq::tls::{Certificate, PemItem, RootCerts};

use super::printable;

/// Where distributions keep their CA bundle (Debian/Ubuntu/Alpine, Fedora/RHEL, openSUSE,
/// others).
pub const SYSTEM_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];
/// The largest CA bundle read (bytes).
pub const MAX_BUNDLE_BYTES: u64 = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the CA file {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("the CA file {path} is larger than {MAX_BUNDLE_BYTES} bytes")]
    TooLarge { path: String },
    #[error("the CA file {path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")]
    NoCertificate { path: String },
}

/// The roots to trust, and a phrase saying which (for the agent's start-up line).
pub struct Roots {
    pub roots: RootCerts,
    pub description: String,
}

/// The roots for `--upload-ca-file` (if any): see the module's documentation.
pub fn roots(ca_file: Option<&Path>) -> Result<Roots, TlsError> {
    let system = system_bundle().and_then(|p| read_bundle(&p).ok().map(|certs| (p, certs)));
    let extra = ca_file.map(read_bundle).transpose()?;
    let shown = |p: &Path| printable(p.as_os_str().as_encoded_bytes());
    Ok(match (system, extra) {
        (None, None) => Roots { roots: RootCerts::WebPki, description: "Mozilla's roots built in".into() },
        (Some((path, certs)), None) => {
            Roots { description: format!("the system's CAs ({})", shown(&path)), roots: RootCerts::new_with_certs(&certs) }
        }
        (None, Some(certs)) => Roots {
            description: format!("the CAs of {}", shown(ca_file.unwrap_or(Path::new("")))),
            roots: RootCerts::new_with_certs(&certs),
        },
        (Some((path, mut certs)), Some(extra)) => {
            certs.extend(extra);
            Roots {
                description: format!(
                    "the system's CAs ({}) and those of {}",
                    shown(&path),
                    shown(ca_file.unwrap_or(Path::new("")))
                ),
                roots: RootCerts::new_with_certs(&certs),
            }
        }
    })
}

/// `$SSL_CERT_FILE`, or the first of [`SYSTEM_BUNDLES`] that exists.
fn system_bundle() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SSL_CERT_FILE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    SYSTEM_BUNDLES.iter().map(PathBuf::from).find(|p| p.is_file())
}

/// The certificates of a PEM bundle (other PEM items, such as keys, are skipped).
fn read_bundle(path: &Path) -> Result<Vec<Certificate<'static>>, TlsError> {
    let shown = printable(path.as_os_str().as_encoded_bytes());
    let read_error = |e: std::io::Error| TlsError::Read { path: shown.clone(), reason: e.to_string() };
    let mut bytes = Vec::new();
    std::fs::File::open(path).map_err(read_error)?.take(MAX_BUNDLE_BYTES + 1).read_to_end(&mut bytes).map_err(read_error)?;
    if bytes.len() as u64 > MAX_BUNDLE_BYTES {
        return Err(TlsError::TooLarge { path: shown });
    }
    let certs: Vec<Certificate<'static>> = ureq::tls::parse_pem(&bytes)
        .filter_map(|item| match item {
            Ok(PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { path: shown });
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_ca_file_mistakes_are_clear() {
        let dir = std::env::temp_dir().join(format!("pyperch-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_pem = dir.join("not.pem");
        std::fs::write(&not_pem, b"hello\n").unwrap();
        let e = roots(Some(&not_pem)).err().unwrap();
        assert!(matches!(e, TlsError::NoCertificate { .. }), "{e}");
        let e = roots(Some(Path::new("/nonexistent/ca.pem"))).err().unwrap();
        assert!(e.to_string().starts_with("cannot read the CA file /nonexistent/ca.pem: "), "{e}");
        // Whatever the machine has, the default roots are usable.
        assert!(!roots(None).unwrap().description.is_empty());
    }
}
