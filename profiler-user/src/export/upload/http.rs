//! One upload request: the endpoint URL (parsed by the `url` crate) and the HTTP client
//! (`ureq`, over plain TCP or rustls, with the roots of [`super::tls`]).
//!
//! Invariants of [`Client::post`], whatever the server does:
//! - it returns within [`UPLOAD_DEADLINE`] (connect, send and receive together);
//! - it keeps at most [`MAX_HEADER_BYTES`] of response headers and [`MAX_KEPT_BODY`] of a
//!   response body, and reads nothing more (an endless body is cut, not drained);
//! - it follows no redirect: it talks to the URL it was given (through the proxy of
//!   [`ClientSettings::proxy`], chosen by the URL's scheme in the agent: [`proxy_for`]), only;
//! - no secret (the `Authorization` value, extra header values) is ever in an error;
//! - every text it returns (in [`UploadError`]) that came from the server is escaped and
//!   bounded by [`printable`]: no control or escape character, at most [`MAX_TEXT_CHARS`].
//!
//! URLs with credentials (`user:password@`) are refused at parse time, so a URL that is
//! printed never holds a password.

use std::{io::Read, time::Duration};

use url::Url;

use super::credentials::{Auth, CredentialError, ExtraHeader, TENANT_HEADER};
use super::push;

/// The overall deadline of one upload attempt (connect + send + receive).
pub const UPLOAD_DEADLINE: Duration = Duration::from_secs(10);
/// The most response-header bytes read.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// The most response-body bytes kept (for the error message of a refused upload).
pub const MAX_KEPT_BODY: u64 = 64 * 1024;
/// The most characters of server-provided text put into an error message.
pub const MAX_TEXT_CHARS: usize = 200;

#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("the upload URL is not valid: {0}")]
    Url(#[from] url::ParseError),
    #[error("the upload URL must start with http:// or https:// (not {0}://)")]
    Scheme(String),
    #[error("the upload URL must not contain a user name or password: credentials in URLs are not supported")]
    Credentials,
    #[error("the upload URL must not have a query (?...) or fragment (#...): pyperch adds the ingest query itself")]
    QueryOrFragment,
    #[error("no complete answer within {secs} s ({which} timeout)")]
    Timeout { secs: u64, which: String },
    #[error("network error: {0}")]
    Network(String),
    #[error("the ingest endpoint answered {status} (a redirect to {location}), which is not followed: check --upload-url")]
    Redirect { status: u16, location: String },
    #[error("the ingest endpoint answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("the ingest endpoint rejected the profile with {status}, not retried: {body}")]
    Rejected { status: u16, body: String },
    /// 401 or 403: retried with backoff (credentials may be fixed on either side).
    #[error("authentication failed (the endpoint answered {status}: {body}): check --upload-user/--upload-password-file/--upload-token-file and --tenant-id")]
    Auth { status: u16, body: String },
    #[error("TLS error: {0}: check the URL's host name and --upload-ca-file")]
    Tls(String),
    /// A certificate the check refused (or no TLS at all), said with what to do.
    #[error("TLS: {0}")]
    Certificate(String),
    #[error("cannot send credentials: {0}")]
    Credential(#[from] CredentialError),
}

impl UploadError {
    /// A refusal that sending the same profile again cannot change (a 4xx other than 408
    /// Request Timeout and 429 Too Many Requests): the profile is dropped, not retried.
    pub fn is_permanent(&self) -> bool {
        matches!(self, UploadError::Rejected { .. })
    }

    /// The endpoint refused the credentials (401 or 403).
    pub fn is_auth(&self) -> bool {
        matches!(self, UploadError::Auth { .. })
    }
}

/// Which API of the backend receives the profiles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Api {
    /// `POST {URL}/ingest?name=...&from=...` with the pprof as body (Pyroscope's HTTP ingest).
    #[default]
    Ingest,
    /// `POST {URL}/push.v1.PusherService/Push`, Connect protocol with a protobuf
    /// `PushRequest` body (Pyroscope's push API, used by Grafana Alloy).
    Push,
}

/// A parsed `http(s)://host[:port][/base]` ingest endpoint, without credentials, query or
/// fragment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// `{base}/ingest`, `{base}/push.v1.PusherService/Push`, or `{base}{path}` for
    /// [`Endpoint::parse_with_path`]; with no query.
    ingest: Url,
    api: Api,
    /// The `Content-Type` of the bodies posted there.
    content_type: &'static str,
}

/// The `Content-Type` of a Pyroscope ingest body.
pub const INGEST_CONTENT_TYPE: &str = "application/octet-stream";

impl Endpoint {
    /// The `/ingest` endpoint under `text`.
    pub fn parse(text: &str) -> Result<Self, UploadError> {
        Self::parse_for(text, Api::Ingest)
    }

    /// The endpoint of `api` under `text`.
    pub fn parse_for(text: &str, api: Api) -> Result<Self, UploadError> {
        let (path, content_type) = match api {
            Api::Ingest => ("/ingest", INGEST_CONTENT_TYPE),
            Api::Push => (push::PUSH_PATH, push::CONTENT_TYPE),
        };
        let mut endpoint = Self::parse_with_path(text, path, content_type)?;
        endpoint.api = api;
        Ok(endpoint)
    }

    /// An endpoint whose bodies (of `content_type`) are posted to `{base}{path}`, e.g. the
    /// OTLP/HTTP profiles path. `path` starts with `/`.
    pub fn parse_with_path(text: &str, path: &str, content_type: &'static str) -> Result<Self, UploadError> {
        let url = Url::parse(text)?;
        match url.scheme() {
            "http" | "https" => {}
            other => return Err(UploadError::Scheme(printable(other.as_bytes()))),
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(UploadError::Credentials);
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(UploadError::QueryOrFragment);
        }
        if url.host().is_none() {
            return Err(UploadError::Url(url::ParseError::EmptyHost));
        }
        let mut ingest = url;
        let base = ingest.path().trim_end_matches('/').to_string();
        ingest.set_path(&format!("{base}{path}"));
        Ok(Self { ingest, api: Api::Ingest, content_type })
    }

    pub fn api(&self) -> Api {
        self.api
    }

    /// The `Content-Type` of the bodies posted to this endpoint.
    pub fn content_type(&self) -> &'static str {
        self.content_type
    }

    /// The URL with `params` as its (percent-encoded) query (none when `params` is empty).
    pub fn ingest_url(&self, params: &[(&str, String)]) -> Url {
        let mut url = self.ingest.clone();
        if !params.is_empty() {
            let mut query = url.query_pairs_mut();
            for (k, v) in params {
                query.append_pair(k, v);
            }
        }
        url
    }

    /// The ingest URL for messages (normalized by the `url` crate: no control character).
    pub fn as_str(&self) -> &str {
        self.ingest.as_str()
    }

    /// Whether requests go over TLS (`https://`).
    pub fn is_https(&self) -> bool {
        self.ingest.scheme() == "https"
    }

    /// The host, as the `url` crate normalized it (IPv6 literals without brackets).
    pub fn host(&self) -> String {
        match self.ingest.host() {
            Some(url::Host::Ipv6(a)) => a.to_string(),
            Some(h) => h.to_string(),
            None => String::new(),
        }
    }
}

/// The proxy for requests to `endpoint`, from the environment as curl reads it: for an
/// `https://` URL `https_proxy`/`HTTPS_PROXY`, for an `http://` URL `http_proxy`/`HTTP_PROXY`,
/// then `all_proxy`/`ALL_PROXY` for either (lower case first; the first one set and valid
/// wins); none when `no_proxy`/`NO_PROXY` names the host. A proxy meant for one scheme is
/// never used for the other.
pub fn proxy_for(endpoint: &Endpoint) -> Option<ureq::Proxy> {
    proxy_from(endpoint, |name| std::env::var(name).ok())
}

/// [`proxy_for`] with the environment given by `var`.
pub fn proxy_from(endpoint: &Endpoint, var: impl Fn(&str) -> Option<String>) -> Option<ureq::Proxy> {
    let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    let no_proxy = var("no_proxy").or_else(|| var("NO_PROXY")).unwrap_or_default();
    if no_proxy_matches(&no_proxy, &endpoint.host()) {
        return None;
    }
    let names: [&str; 4] = if endpoint.is_https() {
        ["https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"]
    } else {
        ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"]
    };
    names.iter().find_map(|name| ureq::Proxy::new(var(name)?.trim()).ok())
}

/// Whether a `NO_PROXY` list (comma or space separated) names `host`: `*` names every host;
/// `example.com`, `.example.com` and `*.example.com` name example.com's subdomains, and the
/// first form example.com itself too; an IP address names itself. Ports in entries are
/// ignored; case does not matter.
pub fn no_proxy_matches(list: &str, host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    list.split([',', ' ']).map(str::trim).filter(|e| !e.is_empty()).any(|entry| {
        if entry == "*" {
            return true;
        }
        let entry = entry.trim_start_matches('[');
        // A port (host:port, [v6]:port) is ignored; a bare IPv6 literal is kept whole.
        let entry = match entry.split_once(']') {
            Some((v6, _)) => v6,
            None if entry.matches(':').count() == 1 => entry.split(':').next().unwrap_or(entry),
            None => entry,
        };
        let entry = entry.trim_end_matches('.').to_ascii_lowercase();
        if let Some(suffix) = entry.strip_prefix("*.").or_else(|| entry.strip_prefix('.')) {
            return host.ends_with(&format!(".{suffix}"));
        }
        host == entry || host.ends_with(&format!(".{entry}"))
    })
}

/// What every upload request carries besides the profile, and how it connects.
#[derive(Clone, Debug)]
pub struct ClientSettings {
    pub auth: Auth,
    /// Sent as `X-Scope-OrgID`.
    pub tenant: Option<String>,
    pub headers: Vec<ExtraHeader>,
    /// The roots, the user's own certificates and pins (see `tls_connector`).
    pub trust: super::tls_connector::Trust,
    /// The proxy to go through (the agent takes it from the environment), if any.
    pub proxy: Option<ureq::Proxy>,
    pub deadline: Duration,
}

impl Default for ClientSettings {
    fn default() -> Self {
        Self {
            auth: Auth::None,
            tenant: None,
            headers: Vec::new(),
            trust: super::tls_connector::Trust::default(),
            proxy: None,
            deadline: UPLOAD_DEADLINE,
        }
    }
}

/// An HTTP client configured for uploads (see the module's invariants).
pub struct Client {
    agent: ureq::Agent,
    deadline: Duration,
    settings: ClientSettings,
}

impl Client {
    pub fn new() -> Self {
        Self::with_deadline(UPLOAD_DEADLINE)
    }

    pub fn with_deadline(deadline: Duration) -> Self {
        Self::with_settings(ClientSettings { deadline, ..ClientSettings::default() })
    }

    pub fn with_settings(settings: ClientSettings) -> Self {
        let deadline = settings.deadline;
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .proxy(settings.proxy.clone())
            .tls_config(ureq::tls::TlsConfig::builder().root_certs(ureq::tls::RootCerts::new_with_certs(&[])).build())
            .timeout_global(Some(deadline))
            .max_response_header_size(MAX_HEADER_BYTES)
            .user_agent(format!("pyperch/{}", env!("CARGO_PKG_VERSION")))
            .max_idle_connections(1)
            .max_idle_connections_per_host(1)
            .build();
        // `client_config` fails only on a provider without TLS versions, which ring is not;
        // were it to fail, ureq's own TLS with the empty root set of `config` would trust
        // nothing, never more than asked.
        let agent = match super::tls_connector::client_config(&settings.trust) {
            Ok(tls) => ureq::Agent::with_parts(config, super::tls_connector::connector(tls), ureq::unversioned::resolver::DefaultResolver::default()),
            Err(_) => config.new_agent(),
        };
        Self { agent, deadline, settings }
    }

    /// One `POST` of `body` to `url` as [`INGEST_CONTENT_TYPE`]; Ok on any 2xx.
    pub fn post(&self, url: &Url, body: &[u8]) -> Result<(), UploadError> {
        self.post_as(url, INGEST_CONTENT_TYPE, body)
    }

    /// One `POST` of `body` to `url` with this Content-Type and the settings' headers (the
    /// credentials read now); Ok on any 2xx.
    pub fn post_as(&self, url: &Url, content_type: &str, body: &[u8]) -> Result<(), UploadError> {
        let mut request = self.agent.post(url.as_str()).header("Content-Type", content_type);
        if content_type == push::CONTENT_TYPE {
            request = request.header("Connect-Protocol-Version", "1");
        }
        for h in &self.settings.headers {
            request = request.header(h.name.as_str(), h.value()?.expose());
        }
        if let Some(tenant) = &self.settings.tenant {
            request = request.header(TENANT_HEADER, tenant.as_str());
        }
        if let Some(authorization) = self.settings.auth.header_value()? {
            request = request.header("Authorization", authorization.expose());
        }
        let mut response = request.send(body).map_err(|e| transport_error(e, self.deadline))?;
        let status = response.status().as_u16();
        // At most MAX_KEPT_BODY bytes are read; a read error (the deadline, a cut
        // connection) keeps what came before it.
        let mut kept = Vec::new();
        let _ = response.body_mut().as_reader().take(MAX_KEPT_BODY).read_to_end(&mut kept);
        match status {
            200..=299 => Ok(()),
            300..=399 => {
                let location = response
                    .headers()
                    .get("location")
                    .map(|v| printable(v.as_bytes()))
                    .unwrap_or_else(|| "nowhere".to_string());
                Err(UploadError::Redirect { status, location })
            }
            401 | 403 => Err(UploadError::Auth { status, body: printable(&kept) }),
            408 | 429 => Err(UploadError::Status { status, body: printable(&kept) }),
            400..=499 => Err(UploadError::Rejected { status, body: printable(&kept) }),
            _ => Err(UploadError::Status { status, body: printable(&kept) }),
        }
    }
}

impl Default for Client {
    fn default() -> Self {
        Self::new()
    }
}

fn transport_error(e: ureq::Error, deadline: Duration) -> UploadError {
    match e {
        ureq::Error::Timeout(which) => {
            UploadError::Timeout { secs: deadline.as_secs(), which: printable(which.to_string().as_bytes()) }
        }
        ureq::Error::Rustls(e) => match certificate_sentence(&e) {
            Some(sentence) => UploadError::Certificate(sentence),
            None => UploadError::Tls(printable(ureq::Error::Rustls(e).to_string().as_bytes())),
        },
        e @ (ureq::Error::Tls(_) | ureq::Error::Pem(_)) => UploadError::Tls(printable(e.to_string().as_bytes())),
        other => {
            let text = other.to_string();
            // rustls errors may come wrapped in an I/O error.
            if text.contains("certificate") || text.contains("TLS") || text.contains("tls") {
                UploadError::Tls(printable(text.as_bytes()))
            } else {
                UploadError::Network(printable(text.as_bytes()))
            }
        }
    }
}

/// One sentence, saying what to do, for a refused server certificate (or a server that does
/// not speak TLS); `None` for other TLS errors. Names the server presents are made printable.
fn certificate_sentence(e: &rustls::Error) -> Option<String> {
    use rustls::CertificateError as C;
    let date = |t: &rustls::pki_types::UnixTime| {
        let at = time::OffsetDateTime::from_unix_timestamp(i64::try_from(t.as_secs()).unwrap_or(i64::MAX));
        at.map_or_else(|_| format!("{} s after 1970", t.as_secs()), |d| format!("{:04}-{:02}-{:02}", d.year(), u8::from(d.month()), d.day()))
    };
    Some(match e {
        rustls::Error::InvalidCertificate(C::UnknownIssuer) => "the server's certificate is not signed by a CA pyperch trusts: give that CA with --upload-ca-file (for a self-signed certificate, the certificate itself)".to_string(),
        rustls::Error::InvalidCertificate(C::NotValidForNameContext { expected, presented }) => {
            let expected = match expected {
                rustls::pki_types::ServerName::DnsName(d) => d.as_ref().to_string(),
                rustls::pki_types::ServerName::IpAddress(ip) => std::net::IpAddr::from(*ip).to_string(),
                other => format!("{other:?}"),
            };
            // webpki gives each presented name as `DnsName("...")` / `IpAddress(...)`.
            let name = |p: &String| match (p.find('"'), p.rfind('"')) {
                (Some(a), Some(b)) if b > a => p[a + 1..b].to_string(),
                _ => p.clone(),
            };
            let presented: Vec<String> = presented.iter().map(name).collect();
            let presented = if presented.is_empty() { "no host".to_string() } else { presented.join(", ") };
            format!(
                "the server's certificate is not valid for {} (it names {}): use a URL with one of those names, or give the server a certificate for this one",
                printable(expected.as_bytes()),
                printable(presented.as_bytes())
            )
        }
        rustls::Error::InvalidCertificate(C::NotValidForName) => "the server's certificate is not valid for the URL's host name: use a URL with a name the certificate has, or give the server a certificate for this one".to_string(),
        rustls::Error::InvalidCertificate(C::ExpiredContext { not_after, .. }) => format!(
            "the server's certificate expired on {}: renew it on the server (or correct this machine's clock)",
            date(not_after)
        ),
        rustls::Error::InvalidCertificate(C::Expired) => "the server's certificate has expired: renew it on the server (or correct this machine's clock)".to_string(),
        rustls::Error::InvalidCertificate(C::NotValidYetContext { not_before, .. }) => format!(
            "the server's certificate is not valid before {}: correct this machine's clock, or the certificate's dates",
            date(not_before)
        ),
        rustls::Error::InvalidCertificate(C::NotValidYet) => "the server's certificate is not valid yet: correct this machine's clock, or the certificate's dates".to_string(),
        rustls::Error::General(text) if text.starts_with(super::tls_connector::PIN_MISMATCH) => format!(
            "{}: if its key was changed on purpose, give the new pin with --upload-pin",
            printable(text.as_bytes())
        ),
        rustls::Error::InvalidMessage(_) => "the server does not answer in TLS on this port: check whether the URL should be http://, or the port is the server's TLS one".to_string(),
        _ => return None,
    })
}

/// Server-provided (or otherwise untrusted) bytes made safe for one log line: invalid UTF-8
/// replaced, every run of whitespace or control/format character (escape, newline, bidi
/// override...) turned into one space, trimmed, and cut to [`MAX_TEXT_CHARS`] characters
/// (`...` marks a cut). Empty text becomes `(empty)`.
pub fn printable(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(4 * MAX_TEXT_CHARS + 4)]);
    let unsafe_char = |c: char| {
        c.is_whitespace()
            || c.is_control()
            || matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{206F}' | '\u{FEFF}')
    };
    let mut out = String::new();
    let mut chars = 0;
    let mut pending_space = false;
    let mut cut = bytes.len() > 4 * MAX_TEXT_CHARS + 4;
    for c in text.chars() {
        if unsafe_char(c) {
            pending_space = !out.is_empty();
            continue;
        }
        if chars + usize::from(pending_space) >= MAX_TEXT_CHARS {
            cut = true;
            break;
        }
        if pending_space {
            out.push(' ');
            chars += 1;
            pending_space = false;
        }
        out.push(c);
        chars += 1;
    }
    if cut {
        out.push_str("...");
    }
    if out.is_empty() {
        out.push_str("(empty)");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{
        io::Write,
        net::{TcpListener, TcpStream},
        thread,
        time::Instant,
    };

    /// What the one-connection test server does after reading the request.
    enum Answer {
        /// These bytes, then close.
        Bytes(&'static [u8]),
        /// Nothing, holding the connection open this long.
        Silence(Duration),
        /// A 200 header with no length, then this many bytes of body (or until the client
        /// goes away).
        Endless(usize),
    }

    /// Serves one connection on 127.0.0.1; returns the URL to post to.
    fn serve_once(answer: Answer) -> Url {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        thread::spawn(move || {
            let Ok((mut conn, _)) = listener.accept() else { return };
            read_request(&mut conn);
            match answer {
                Answer::Bytes(b) => {
                    let _ = conn.write_all(b);
                }
                Answer::Silence(d) => thread::sleep(d),
                Answer::Endless(total) => {
                    let _ = conn.write_all(b"HTTP/1.1 500 Oops\r\nConnection: close\r\n\r\n");
                    let chunk = [b'\x1b'; 16 * 1024];
                    let mut sent = 0;
                    while sent < total && conn.write_all(&chunk).is_ok() {
                        sent += chunk.len();
                    }
                }
            }
        });
        Endpoint::parse(&format!("http://127.0.0.1:{port}")).unwrap().ingest_url(&[("name", "t".into())])
    }

    /// Reads until the client pauses (the whole request, in these tests).
    fn read_request(conn: &mut TcpStream) {
        conn.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let mut buf = [0u8; 4096];
        while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
    }

    #[test]
    fn upload_answers_are_classified() {
        let client = Client::with_deadline(Duration::from_secs(5));
        let post = |answer| client.post(&serve_once(answer), b"profile");
        assert!(post(Answer::Bytes(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")).is_ok());
        assert!(post(Answer::Bytes(b"HTTP/1.1 204 No Content\r\n\r\n")).is_ok());
        let e = post(Answer::Bytes(b"HTTP/1.1 400 Bad\r\nContent-Length: 13\r\n\r\nbad \x1b[2Jthing")).unwrap_err();
        assert!(e.is_permanent(), "{e}");
        assert_eq!(e.to_string(), "the ingest endpoint rejected the profile with 400, not retried: bad [2Jthing");
        for retried in [&b"HTTP/1.1 429 Slow\r\n\r\n"[..], b"HTTP/1.1 408 T\r\n\r\n", b"HTTP/1.1 503 Down\r\n\r\n"] {
            let e = post(Answer::Bytes(retried)).unwrap_err();
            assert!(matches!(e, UploadError::Status { .. }), "{e}");
        }
        let e = post(Answer::Bytes(b"HTTP/1.1 302 Found\r\nLocation: http://elsewhere/x\r\nContent-Length: 0\r\n\r\n"))
            .unwrap_err();
        assert!(matches!(&e, UploadError::Redirect { status: 302, .. }), "{e}");
        assert!(e.to_string().contains("a redirect to http://elsewhere/x), which is not followed"), "{e}");
        // A control character in a header: a protocol error (the header is never printed).
        let e = post(Answer::Bytes(b"HTTP/1.1 302 Found\r\nLocation: http://x/\x1b]0;x\x07\r\n\r\n")).unwrap_err();
        assert!(matches!(e, UploadError::Network(_)) && !e.to_string().contains('\x1b'), "{e}");
        let e = post(Answer::Bytes(b"garbage\r\n\r\n")).unwrap_err();
        assert!(matches!(e, UploadError::Network(_)), "{e}");
    }

    /// Issue #28 item 8: the proxy is chosen by the URL's scheme; NO_PROXY is honoured.
    #[test]
    fn upload_proxy_by_scheme() {
        let env = |pairs: &'static [(&'static str, &'static str)]| move |name: &str| {
            pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        let https = Endpoint::parse("https://pyroscope.example.com").unwrap();
        let http = Endpoint::parse("http://collector.internal:4318").unwrap();
        let only_https = env(&[("HTTPS_PROXY", "http://tls-proxy:3128")]);
        assert_eq!(proxy_from(&https, &only_https).map(|p| p.host().to_string()).as_deref(), Some("tls-proxy"));
        assert!(proxy_from(&http, &only_https).is_none(), "an https proxy is not used for http://");
        let only_http = env(&[("http_proxy", "http://plain-proxy:8080")]);
        assert!(proxy_from(&https, &only_http).is_none(), "an http proxy is not used for https://");
        assert_eq!(proxy_from(&http, &only_http).map(|p| p.port()), Some(8080));
        let all = env(&[("ALL_PROXY", "http://all:1"), ("https_proxy", "http://tls:2"), ("NO_PROXY", ".internal, localhost")]);
        assert_eq!(proxy_from(&https, &all).map(|p| p.port()), Some(2), "the scheme's own variable first");
        assert!(proxy_from(&http, &all).is_none(), "no_proxy names collector.internal");
        for (list, host, matches) in [
            ("*", "a.b", true),
            ("example.com", "example.com", true),
            ("example.com", "api.example.com", true),
            ("example.com", "badexample.com", false),
            (".example.com", "example.com", false),
            ("*.example.com:443", "x.example.com", true),
            ("127.0.0.1", "127.0.0.1", true),
            ("[::1]:8080", "::1", true),
            ("::1", "::1", true),
            ("10.0.0.1", "10.0.0.12", false),
        ] {
            assert_eq!(no_proxy_matches(list, host), matches, "{list:?} {host:?}");
        }
    }

    #[test]
    fn upload_sends_credentials_tenant_and_headers_and_classifies_401() {
        let dir = std::env::temp_dir().join(format!("pyperch-http-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pw = dir.join("pw");
        std::fs::write(&pw, "pa55\n").unwrap();
        let settings = ClientSettings {
            auth: Auth::from_flags(Some("me".into()), Some(pw), None, None).unwrap(),
            tenant: Some("team-a".into()),
            headers: vec![ExtraHeader::parse("X-Extra: yes").unwrap()],
            deadline: Duration::from_secs(5),
            ..ClientSettings::default()
        };
        let client = Client::with_settings(settings);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let request = thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            conn.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = conn.read(&mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            let _ = conn.write_all(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 6\r\n\r\nno\x1bway");
            String::from_utf8_lossy(&got).to_ascii_lowercase()
        });
        let url = Endpoint::parse_for(&format!("http://127.0.0.1:{port}/base"), Api::Push).unwrap().ingest_url(&[]);
        assert_eq!(url.as_str(), format!("http://127.0.0.1:{port}/base/push.v1.PusherService/Push"));
        let e = client.post_as(&url, push::CONTENT_TYPE, b"body").unwrap_err();
        assert!(e.is_auth() && !e.is_permanent(), "{e}");
        assert!(e.to_string().starts_with("authentication failed (the endpoint answered 401: no way)"), "{e}");
        let request = request.join().unwrap();
        // base64("me:pa55")
        for header in [
            "authorization: basic bwu6cge1nq==",
            "x-scope-orgid: team-a",
            "x-extra: yes",
            "content-type: application/proto",
            "connect-protocol-version: 1",
        ] {
            assert!(request.contains(header), "{header} not in {request}");
        }
        assert!(request.starts_with("post /base/push.v1.pusherservice/push "), "{request}");
    }

    #[test]
    fn upload_deadline_covers_a_silent_server() {
        let client = Client::with_deadline(Duration::from_secs(1));
        let start = Instant::now();
        let e = client.post(&serve_once(Answer::Silence(Duration::from_secs(5))), b"profile").unwrap_err();
        assert!(matches!(e, UploadError::Timeout { .. }), "{e}");
        assert!(start.elapsed() < Duration::from_secs(4), "{:?}", start.elapsed());
    }

    #[test]
    fn upload_endless_body_is_cut() {
        let client = Client::with_deadline(Duration::from_secs(5));
        let start = Instant::now();
        let e = client.post(&serve_once(Answer::Endless(1 << 30)), b"profile").unwrap_err();
        assert!(matches!(&e, UploadError::Status { status: 500, body } if body == "..."), "{e}");
        assert!(start.elapsed() < Duration::from_secs(4), "{:?}", start.elapsed());
    }

    #[test]
    fn upload_https_speaks_tls_only() {
        // A plain-HTTP server behind an https:// URL: the handshake fails, nothing is sent
        // in clear text, and the server's bytes are not taken as an answer.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let first_byte = thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut b = [0u8; 1];
            conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let got = conn.read_exact(&mut b).ok().map(|_| b[0]);
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
            got
        });
        let url = Endpoint::parse(&format!("https://127.0.0.1:{port}")).unwrap().ingest_url(&[]);
        let e = Client::with_deadline(Duration::from_secs(5)).post(&url, b"profile").unwrap_err();
        assert!(matches!(&e, UploadError::Certificate(s) if s.contains("does not answer in TLS")), "{e}");
        // 0x16: a TLS handshake record (the ClientHello), not an HTTP request line.
        assert_eq!(first_byte.join().unwrap(), Some(0x16));
    }

    #[test]
    fn upload_huge_headers_are_refused() {
        let client = Client::with_deadline(Duration::from_secs(5));
        let mut answer = b"HTTP/1.1 200 OK\r\nX-Big: ".to_vec();
        answer.extend(std::iter::repeat_n(b'a', 4 * MAX_HEADER_BYTES));
        answer.extend(b"\r\nContent-Length: 0\r\n\r\n");
        let e = client.post(&serve_once(Answer::Bytes(answer.leak())), b"profile").unwrap_err();
        assert!(matches!(e, UploadError::Network(_)), "{e}");
    }

    #[test]
    fn upload_endpoints() {
        let e = Endpoint::parse("http://pyroscope:4040").unwrap();
        assert_eq!(e.as_str(), "http://pyroscope:4040/ingest");
        let e = Endpoint::parse("http://127.0.0.1:9/base/").unwrap();
        assert_eq!(e.as_str(), "http://127.0.0.1:9/base/ingest");
        assert_eq!(Endpoint::parse("http://host").unwrap().as_str(), "http://host/ingest");
        let otlp = Endpoint::parse_with_path("http://[::1]:4318/", "/v1development/profiles", "application/x-protobuf").unwrap();
        assert_eq!(otlp.ingest_url(&[]).as_str(), "http://[::1]:4318/v1development/profiles");
        assert_eq!(otlp.content_type(), "application/x-protobuf");
        assert_eq!(Endpoint::parse("http://host").unwrap().content_type(), INGEST_CONTENT_TYPE);
        assert_eq!(Endpoint::parse("http://[::1]:4040").unwrap().as_str(), "http://[::1]:4040/ingest");
        assert_eq!(Endpoint::parse("https://host/p").unwrap().as_str(), "https://host/p/ingest");
        assert!(matches!(Endpoint::parse("ftp://host"), Err(UploadError::Scheme(s)) if s == "ftp"));
        assert!(matches!(Endpoint::parse("http://"), Err(UploadError::Url(_))));
        assert!(matches!(Endpoint::parse("http://host:99999"), Err(UploadError::Url(_))));
        assert!(matches!(Endpoint::parse("pyroscope:4040"), Err(UploadError::Scheme(_))));
        assert!(matches!(Endpoint::parse("http://host/?a=b"), Err(UploadError::QueryOrFragment)));
        for with_credentials in ["http://user:secret@host", "http://user@host", "http://:secret@host:1/x"] {
            let e = Endpoint::parse(with_credentials).unwrap_err();
            assert!(matches!(e, UploadError::Credentials), "{with_credentials}: {e}");
            assert!(!e.to_string().contains("secret"));
        }
    }

    #[test]
    fn upload_query_is_encoded() {
        let e = Endpoint::parse("http://h:1/b").unwrap();
        let url = e.ingest_url(&[("name", "a{b=\"c d\"}".to_string()), ("from", "1".to_string())]);
        assert_eq!(url.as_str(), "http://h:1/b/ingest?name=a%7Bb%3D%22c+d%22%7D&from=1");
        let pairs: Vec<(String, String)> = url.query_pairs().into_owned().collect();
        assert_eq!(pairs[0], ("name".to_string(), "a{b=\"c d\"}".to_string()));
    }

    #[test]
    fn upload_printable_text() {
        assert_eq!(printable(b"bad \x1b[31mred\x1b[0m\r\nline\ttwo"), "bad [31mred [0m line two");
        assert_eq!(printable(b""), "(empty)");
        assert_eq!(printable(b" \n "), "(empty)");
        assert_eq!(printable("a\u{202E}b".as_bytes()), "a b");
        let long = printable(&[b'x'; 100_000]);
        assert_eq!(long.len(), MAX_TEXT_CHARS + 3);
        assert!(long.ends_with("..."));
        assert_eq!(printable(b"\xff\xfeok"), "\u{FFFD}\u{FFFD}ok");
    }
}
