//! TLS for uploads: rustls with pyperch's own check of the server's certificate, in ureq's
//! connector chain where ureq's own rustls connector would be.
//!
//! The check ([`Verifier`]) is rustls's WebPKI verification against the roots of
//! [`super::tls`], and two things curl also does:
//! - a certificate given in `--upload-ca-file` is trusted as itself when the server presents
//!   it, CA or not (a self-signed certificate made with `openssl req -x509` is marked as a CA,
//!   which WebPKI refuses as a server's certificate: `CaUsedAsEndEntity`); its host name and
//!   validity period are still checked, and the server must still prove it holds its key;
//! - `--upload-pin sha256//BASE64` (curl's `--pinnedpubkey`): the server's public key must be
//!   one of the pinned ones, after every other check passed.
//!
//! Invariant: no certificate is accepted that neither chains to a trusted root nor is byte
//! for byte one the user gave; pins only ever narrow what is accepted.

use std::{
    io::{Read, Write},
    sync::Arc,
};

use rustls::{
    ClientConfig, ClientConnection, DigitallySignedStruct, RootCertStore, SignatureScheme, StreamOwned,
    client::{
        WebPkiServerVerifier,
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    },
    pki_types::{CertificateDer, ServerName, UnixTime},
};
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, Either, LazyBuffers, NextTimeout, Transport, TransportAdapter,
};

use super::tls::{Pin, TlsError};

/// What uploads trust: the roots, the certificates given with `--upload-ca-file` (trusted as
/// themselves too), and the pins.
#[derive(Clone, Debug)]
pub struct Trust {
    /// `None`: Mozilla's roots built in.
    pub roots: Option<Vec<CertificateDer<'static>>>,
    pub own: Vec<CertificateDer<'static>>,
    pub pins: Vec<Pin>,
}

impl Default for Trust {
    fn default() -> Self {
        Self { roots: None, own: Vec::new(), pins: Vec::new() }
    }
}

/// The rustls client configuration for `trust`.
pub fn client_config(trust: &Trust) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut store = RootCertStore::empty();
    match &trust.roots {
        Some(certs) => {
            store.add_parsable_certificates(certs.iter().cloned());
        }
        None => store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    // A self-signed certificate that is not a CA is no root to WebPKI: it is checked as itself.
    let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider.clone())
        .build()
        .map_err(|e| TlsError::Setup(e.to_string()))?;
    let verifier = Arc::new(Verifier { inner, own: trust.own.clone(), pins: trust.pins.clone() });
    let config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(rustls::ALL_VERSIONS)
        .map_err(|e| TlsError::Setup(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// See the module's documentation.
#[derive(Debug)]
struct Verifier {
    inner: Arc<WebPkiServerVerifier>,
    own: Vec<CertificateDer<'static>>,
    pins: Vec<Pin>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = match self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Ok(verified) => verified,
            Err(e) if self.own.iter().any(|c| c.as_ref() == end_entity.as_ref()) => {
                // The user's own certificate, presented as it was given: its name and dates
                // still decide (the WebPKI error stands if they hold no answer either).
                let _ = e;
                check_as_itself(end_entity, server_name, now)?;
                ServerCertVerified::assertion()
            }
            Err(e) => return Err(e),
        };
        if !self.pins.is_empty() {
            let key = super::tls::pin_of(end_entity.as_ref())
                .ok_or(rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding))?;
            if !self.pins.contains(&key) {
                return Err(rustls::Error::General(format!("{PIN_MISMATCH}{}", key.shown())));
            }
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The start of the error a pin mismatch gives (the key's own pin follows).
pub const PIN_MISMATCH: &str = "the server's public key matches no --upload-pin: it is ";

/// A certificate the user gave, checked as itself: valid for `server_name`, and `now`
/// within its validity period.
fn check_as_itself(cert: &CertificateDer<'_>, server_name: &ServerName<'_>, now: UnixTime) -> Result<(), rustls::Error> {
    let parsed = rustls::server::ParsedCertificate::try_from(cert)?;
    rustls::client::verify_server_name(&parsed, server_name)?;
    let (_, x509) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|_| rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding))?;
    let validity = x509.validity();
    let secs = now.as_secs() as i64;
    let (not_before, not_after) = (validity.not_before.timestamp(), validity.not_after.timestamp());
    if secs < not_before {
        return Err(rustls::CertificateError::NotValidYetContext { time: now, not_before: UnixTime::since_unix_epoch(std::time::Duration::from_secs(not_before.max(0) as u64)) }.into());
    }
    if secs > not_after {
        return Err(rustls::CertificateError::ExpiredContext { time: now, not_after: UnixTime::since_unix_epoch(std::time::Duration::from_secs(not_after.max(0) as u64)) }.into());
    }
    Ok(())
}

/// ureq's connector chain for uploads: CONNECT proxies, TCP, then [`TlsConnector`].
pub fn connector(config: Arc<ClientConfig>) -> impl Connector<(), Out = impl Transport> {
    ()
        .chain(ureq::unversioned::transport::ConnectProxyConnector::default())
        .chain(ureq::unversioned::transport::TcpConnector::default())
        .chain(TlsConnector { config })
}

/// Wraps an `https://` connection in TLS with the configuration of [`client_config`].
#[derive(Debug)]
pub struct TlsConnector {
    config: Arc<ClientConfig>,
}

impl<In: Transport> Connector<In> for TlsConnector {
    type Out = Either<In, TlsTransport>;

    fn connect(&self, details: &ConnectionDetails, chained: Option<In>) -> Result<Option<Self::Out>, ureq::Error> {
        let Some(transport) = chained else { return Ok(None) };
        if !details.needs_tls() || transport.is_tls() {
            return Ok(Some(Either::A(transport)));
        }
        let host = details.uri.host().ok_or(ureq::Error::Tls("no host name in the URL"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_owned()).map_err(|_| ureq::Error::Tls("the URL's host is not a valid TLS server name"))?;
        let mut conn = ClientConnection::new(self.config.clone(), name)?;
        let mut sock = TransportAdapter::new(transport.boxed(), details.current_time.clone());
        sock.set_timeout(details.timeout);
        conn.complete_io(&mut sock).map_err(unwrap_rustls)?;
        let buffers = LazyBuffers::new(details.config.input_buffer_size(), details.config.output_buffer_size());
        Ok(Some(Either::B(TlsTransport { buffers, stream: StreamOwned { conn, sock } })))
    }
}

/// A rustls error carried in an I/O error (as `complete_io` reports it) as itself.
fn unwrap_rustls(e: std::io::Error) -> ureq::Error {
    match e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        Some(r) => ureq::Error::Rustls(r.clone()),
        None => ureq::Error::Io(e),
    }
}

/// An upload's connection in TLS.
pub struct TlsTransport {
    buffers: LazyBuffers,
    stream: StreamOwned<ClientConnection, TransportAdapter>,
}

impl std::fmt::Debug for TlsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsTransport").finish()
    }
}

impl Transport for TlsTransport {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        self.stream.get_mut().set_timeout(timeout);
        let output = &self.buffers.output()[..amount];
        self.stream.write_all(output).map_err(unwrap_rustls)
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.stream.get_mut().set_timeout(timeout);
        let input = self.buffers.input_append_buf();
        let amount = self.stream.read(input).map_err(unwrap_rustls)?;
        self.buffers.input_appended(amount);
        Ok(amount > 0)
    }

    fn is_open(&mut self) -> bool {
        self.stream.get_mut().get_mut().is_open()
    }

    fn is_tls(&self) -> bool {
        true
    }
}
