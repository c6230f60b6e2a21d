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

use rustls::pki_types::CertificateDer;
use ureq::tls::{Certificate, PemItem};

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
    #[error("--upload-pin {given}: not a pin; give the SHA-256 of the server's public key as curl's --pinnedpubkey takes it, sha256//BASE64 (e.g. from `openssl x509 -in cert.pem -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64`)")]
    BadPin { given: String },
    #[error("cannot set up TLS: {0}")]
    Setup(String),
}

/// A `--upload-pin`: the SHA-256 of a server's public key (its DER `SubjectPublicKeyInfo`),
/// written as curl's `--pinnedpubkey` takes it: `sha256//BASE64` (`sha256/BASE64` too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pin(pub [u8; 32]);

impl Pin {
    pub fn parse(given: &str) -> Result<Pin, TlsError> {
        use base64::Engine as _;
        let bad = || TlsError::BadPin { given: printable(given.as_bytes()) };
        let text = given.trim();
        let b64 = text.strip_prefix("sha256//").or_else(|| text.strip_prefix("sha256/")).ok_or_else(bad)?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| bad())?;
        Ok(Pin(bytes.try_into().map_err(|_| bad())?))
    }

    /// `sha256//BASE64`.
    pub fn shown(&self) -> String {
        use base64::Engine as _;
        format!("sha256//{}", base64::engine::general_purpose::STANDARD.encode(self.0))
    }
}

/// The pin of a DER certificate's public key; `None` when it does not parse.
pub fn pin_of(cert: &[u8]) -> Option<Pin> {
    let (_, x509) = x509_parser::parse_x509_certificate(cert).ok()?;
    let digest = ring::digest::digest(&ring::digest::SHA256, x509.public_key().raw);
    Some(Pin(digest.as_ref().try_into().ok()?))
}

/// The roots to trust, the certificates of `--upload-ca-file` (also trusted as themselves,
/// see `tls_connector`), and a phrase saying which (for the agent's start-up line).
pub struct Roots {
    /// `None`: Mozilla's roots built in.
    pub roots: Option<Vec<CertificateDer<'static>>>,
    pub own: Vec<CertificateDer<'static>>,
    pub description: String,
}

/// The roots for `--upload-ca-file` (if any): see the module's documentation.
pub fn roots(ca_file: Option<&Path>) -> Result<Roots, TlsError> {
    let system = system_bundle().and_then(|p| read_bundle(&p).ok().map(|certs| (p, certs)));
    let extra = ca_file.map(read_bundle).transpose()?;
    let shown = |p: &Path| printable(p.as_os_str().as_encoded_bytes());
    let der = |certs: &[Certificate<'static>]| -> Vec<CertificateDer<'static>> {
        certs.iter().map(|c| CertificateDer::from(c.der().to_vec())).collect()
    };
    let own = extra.as_deref().map(der).unwrap_or_default();
    Ok(match (system, extra) {
        (None, None) => Roots { roots: None, own, description: "Mozilla's roots built in".into() },
        (Some((path, certs)), None) => {
            Roots { description: format!("the system's CAs ({})", shown(&path)), roots: Some(der(&certs)), own }
        }
        (None, Some(certs)) => Roots {
            description: format!("the CAs of {}", shown(ca_file.unwrap_or(Path::new("")))),
            roots: Some(der(&certs)),
            own,
        },
        (Some((path, mut certs)), Some(extra)) => {
            certs.extend(extra);
            Roots {
                description: format!(
                    "the system's CAs ({}) and those of {}",
                    shown(&path),
                    shown(ca_file.unwrap_or(Path::new("")))
                ),
                roots: Some(der(&certs)),
                own,
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
    fn pins_as_curl_writes_them() {
        let pin = Pin::parse("sha256//P6pDBlRNhbIH6klyxzo4EP9ud5eXDhmVDsWAKNacMGw=").expect("a pin");
        assert_eq!(pin.shown(), "sha256//P6pDBlRNhbIH6klyxzo4EP9ud5eXDhmVDsWAKNacMGw=");
        assert_eq!(Pin::parse("sha256/P6pDBlRNhbIH6klyxzo4EP9ud5eXDhmVDsWAKNacMGw=").ok(), Some(pin));
        for bad in ["", "sha256//", "sha1//P6pDBlRNhbIH6klyxzo4EP9ud5eXDhmVDsWAKNacMGw=", "sha256//AAAA", "sha256//not base64!", "P6pDBlRNhbIH6klyxzo4EP9ud5eXDhmVDsWAKNacMGw="] {
            let e = Pin::parse(bad).err().unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert!(e.to_string().contains("sha256//BASE64"), "{e}");
        }
        assert_eq!(pin_of(b"not a certificate"), None);
    }

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
