//! What the agent sends to authenticate and route its uploads: basic auth or a bearer token,
//! the tenant header (`X-Scope-OrgID`) and extra headers given with `--upload-header` (or
//! `--upload-header-file NAME=FILE`). Each destination has its own: the flags of the
//! Pyroscope endpoint start with `--upload-` (and `--tenant-id`), those of the OTLP endpoint
//! with `--otlp-`; [`Flags`] names them in errors.
//!
//! Invariants:
//! - a secret (password, token) is never held in a type whose `Debug` or `Display` shows it,
//!   and no error of this module contains one;
//! - a secret file (password, token, header value) is read with a bound ([`MAX_SECRET_BYTES`])
//!   and re-read on every upload attempt, so a rotated Kubernetes Secret is picked up without
//!   a restart; one trailing newline (`\n` or `\r\n`) is trimmed;
//! - every header value sent is checked first: no control character (so no header injection
//!   from a file or a flag), not empty.

use std::{fmt, io::Read, path::PathBuf};

use base64::Engine as _;

use super::printable;

/// The largest password or token file read (bytes).
pub const MAX_SECRET_BYTES: u64 = 16 * 1024;
/// The environment variable holding the basic-auth password when no file is given.
pub const PASSWORD_ENV: &str = "PYPERCH_UPLOAD_PASSWORD";
/// The same for the OTLP endpoint's `--otlp-user`.
pub const OTLP_PASSWORD_ENV: &str = "PYPERCH_OTLP_PASSWORD";

/// The flag names of one destination's credentials, for errors and hints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flags {
    /// `upload` or `otlp`: the flags are `--{prefix}-user`, `--{prefix}-password-file`...
    pub prefix: &'static str,
    /// The tenant flag (`--tenant-id`, `--otlp-tenant-id`).
    pub tenant: &'static str,
    /// The environment variable of the basic-auth password.
    pub password_env: &'static str,
}

impl Flags {
    /// The Pyroscope endpoint's (`--upload-url`).
    pub const UPLOAD: Flags = Flags { prefix: "upload", tenant: "--tenant-id", password_env: PASSWORD_ENV };
    /// The OTLP endpoint's (`--otlp-endpoint`).
    pub const OTLP: Flags = Flags { prefix: "otlp", tenant: "--otlp-tenant-id", password_env: OTLP_PASSWORD_ENV };
}

impl Default for Flags {
    fn default() -> Self {
        Flags::UPLOAD
    }
}
/// The tenant header of Pyroscope, Mimir, Loki and Cortex multi-tenant set-ups.
pub const TENANT_HEADER: &str = "X-Scope-OrgID";

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("cannot read the {what} file {path}: {reason}")]
    Read { what: &'static str, path: String, reason: String },
    #[error("the {what} file {path} is larger than {MAX_SECRET_BYTES} bytes: it does not look like a {what}")]
    TooLarge { what: &'static str, path: String },
    #[error("the {what} ({source_name}) is empty")]
    Empty { what: &'static str, source_name: String },
    #[error("the {what} ({source_name}) holds a control character or is not UTF-8 (only a final newline is trimmed)")]
    BadChars { what: &'static str, source_name: String },
    #[error("--{}-user must not be empty or contain ':' or a control character", .0.prefix)]
    BadUser(Flags),
    #[error("--{p}-user needs a password: --{p}-password-file FILE or the {env} environment variable", p = .0.prefix, env = .0.password_env)]
    NoPassword(Flags),
    #[error("a password was given but no --{}-user", .0.prefix)]
    PasswordWithoutUser(Flags),
    #[error("--{p}-user and --{p}-token-file exclude each other (one Authorization header)", p = .0.prefix)]
    BothAuth(Flags),
    #[error("--{}-header {}", .0.prefix, .1)]
    Header(Flags, String),
    #[error("--{}-header-file {}", .0.prefix, .1)]
    HeaderFile(Flags, String),
    #[error("{} must not be empty or contain a control character", .0.tenant)]
    BadTenant(Flags),
}

/// Where a secret comes from. Its `Debug` never shows a secret value.
#[derive(Clone)]
pub enum SecretSource {
    /// A file, re-read on every upload attempt.
    File(PathBuf),
    /// A value read once from the environment variable named here.
    Env { var: &'static str, value: String },
    /// A value given on the command line (an `--upload-header` value).
    Value(String),
}

impl fmt::Debug for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretSource::File(p) => f.debug_tuple("File").field(p).finish(),
            SecretSource::Env { var, .. } => write!(f, "Env({var}, <redacted>)"),
            SecretSource::Value(_) => f.write_str("Value(<redacted>)"),
        }
    }
}

/// A secret value. Its `Debug` is `<redacted>`; it has no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Secret {
    /// The value, for building a header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl SecretSource {
    fn name(&self) -> String {
        match self {
            SecretSource::File(p) => printable(p.as_os_str().as_encoded_bytes()),
            SecretSource::Env { var, .. } => format!("${var}"),
            SecretSource::Value(_) => "the command line".to_string(),
        }
    }

    /// The secret now: the file's content (bounded, final newline trimmed) or the variable's.
    pub fn read(&self, what: &'static str) -> Result<Secret, CredentialError> {
        let text = match self {
            SecretSource::Env { value, .. } | SecretSource::Value(value) => value.clone(),
            SecretSource::File(path) => {
                let shown = printable(path.as_os_str().as_encoded_bytes());
                let file = std::fs::File::open(path)
                    .map_err(|e| CredentialError::Read { what, path: shown.clone(), reason: e.to_string() })?;
                let mut bytes = Vec::new();
                file.take(MAX_SECRET_BYTES + 1)
                    .read_to_end(&mut bytes)
                    .map_err(|e| CredentialError::Read { what, path: shown.clone(), reason: e.to_string() })?;
                if bytes.len() as u64 > MAX_SECRET_BYTES {
                    return Err(CredentialError::TooLarge { what, path: shown });
                }
                String::from_utf8(bytes).map_err(|_| CredentialError::BadChars { what, source_name: shown })?
            }
        };
        let trimmed = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text);
        if trimmed.is_empty() {
            return Err(CredentialError::Empty { what, source_name: self.name() });
        }
        if trimmed.chars().any(char::is_control) {
            return Err(CredentialError::BadChars { what, source_name: self.name() });
        }
        Ok(Secret(trimmed.to_string()))
    }
}

/// How uploads authenticate.
#[derive(Clone, Debug, Default)]
pub enum Auth {
    #[default]
    None,
    /// `Authorization: Basic base64(user:password)`.
    Basic { user: String, password: SecretSource },
    /// `Authorization: Bearer TOKEN`.
    Bearer(SecretSource),
}

impl Auth {
    /// The authentication of the agent's flags: `--upload-user` with a password from
    /// `password_file` or `env_password` (the value of [`PASSWORD_ENV`]), or a token file.
    pub fn from_flags(
        user: Option<String>,
        password_file: Option<PathBuf>,
        env_password: Option<String>,
        token_file: Option<PathBuf>,
    ) -> Result<Auth, CredentialError> {
        Self::from_flags_of(Flags::UPLOAD, user, password_file, env_password, token_file)
    }

    /// [`Auth::from_flags`] for the destination whose flags are `flags` (`env_password` is
    /// then the value of `flags.password_env`).
    pub fn from_flags_of(
        flags: Flags,
        user: Option<String>,
        password_file: Option<PathBuf>,
        env_password: Option<String>,
        token_file: Option<PathBuf>,
    ) -> Result<Auth, CredentialError> {
        let password = password_file
            .map(SecretSource::File)
            .or_else(|| env_password.map(|value| SecretSource::Env { var: flags.password_env, value }));
        let auth = match (user, password, token_file) {
            (Some(_), _, Some(_)) => return Err(CredentialError::BothAuth(flags)),
            (Some(user), Some(password), None) => {
                if user.is_empty() || user.contains(':') || user.chars().any(char::is_control) {
                    return Err(CredentialError::BadUser(flags));
                }
                Auth::Basic { user, password }
            }
            (Some(_), None, None) => return Err(CredentialError::NoPassword(flags)),
            (None, Some(SecretSource::File(_)), _) => return Err(CredentialError::PasswordWithoutUser(flags)),
            // A password in the environment without --upload-user is ignored (the variable
            // may be set for another tool).
            (None, _, Some(token)) => Auth::Bearer(SecretSource::File(token)),
            (None, _, None) => Auth::None,
        };
        // Read once now, so that a wrong path or an empty file is one clear error at start.
        auth.header_value()?;
        Ok(auth)
    }

    /// The `Authorization` header value now (files re-read), if any.
    pub fn header_value(&self) -> Result<Option<Secret>, CredentialError> {
        Ok(match self {
            Auth::None => None,
            Auth::Basic { user, password } => {
                let password = password.read("password")?;
                let pair = format!("{user}:{}", password.expose());
                Some(Secret(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))))
            }
            Auth::Bearer(token) => Some(Secret(format!("Bearer {}", token.read("token")?.expose()))),
        })
    }

    pub fn is_some(&self) -> bool {
        !matches!(self, Auth::None)
    }
}

/// One `--upload-header 'Name: value'` or `--upload-header-file NAME=FILE` (the value read
/// from FILE at each upload, so it is not in `/proc/PID/cmdline`). Its `Debug` shows the name
/// only (a value may be an API key).
#[derive(Clone)]
pub struct ExtraHeader {
    pub name: String,
    pub value: SecretSource,
}

impl fmt::Debug for ExtraHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: <redacted>", self.name)
    }
}

/// Headers pyperch sets itself, or that flags set: not accepted from `--upload-header`.
/// (`{p}` is the destination's flag prefix, `{tenant}` its tenant flag.)
const RESERVED_HEADERS: [(&str, &str); 8] = [
    ("authorization", "use --{p}-user with --{p}-password-file, or --{p}-token-file"),
    ("x-scope-orgid", "use {tenant}"),
    ("host", "it is taken from the endpoint's URL"),
    ("content-type", "pyperch sets it"),
    ("content-length", "pyperch sets it"),
    ("transfer-encoding", "pyperch sets it"),
    ("connection", "pyperch sets it"),
    ("proxy-authorization", "put proxy credentials in HTTPS_PROXY"),
];

/// Checks a header name: an RFC 9110 token, not one of [`RESERVED_HEADERS`]. The error text
/// (without the flag) on failure.
fn check_header_name(flags: Flags, name: &str) -> Result<(), String> {
    let tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(tchar) {
        return Err(format!("{:?}: a header name is letters, digits and !#$%&'*+-.^_`|~ only", printable(name.as_bytes())));
    }
    let lower = name.to_ascii_lowercase();
    if let Some((_, why)) = RESERVED_HEADERS.iter().find(|(n, _)| *n == lower) {
        let why = why.replace("{p}", flags.prefix).replace("{tenant}", flags.tenant);
        return Err(format!("{name}: not accepted here: {why}"));
    }
    Ok(())
}

impl ExtraHeader {
    /// Parses an `--upload-header` `Name: value` (RFC 9110 token name, value without control
    /// characters).
    pub fn parse(text: &str) -> Result<ExtraHeader, CredentialError> {
        Self::parse_of(Flags::UPLOAD, text)
    }

    /// [`ExtraHeader::parse`] for the destination whose flags are `flags`.
    pub fn parse_of(flags: Flags, text: &str) -> Result<ExtraHeader, CredentialError> {
        let Some((name, value)) = text.split_once(':') else {
            return Err(CredentialError::Header(flags, "must look like 'Name: value'".into()));
        };
        let name = name.trim();
        check_header_name(flags, name).map_err(|e| CredentialError::Header(flags, e))?;
        let value = value.trim_matches([' ', '\t']);
        if value.is_empty() || value.chars().any(char::is_control) {
            // The value is not shown: it may be a secret.
            return Err(CredentialError::Header(flags, format!("{name}: the value is empty or holds a control character")));
        }
        Ok(ExtraHeader { name: name.to_string(), value: SecretSource::Value(value.to_string()) })
    }

    /// Parses an `--upload-header-file` `NAME=FILE`: the header's value is FILE's content
    /// (read now once, to fail at start, and again at each upload; one final newline
    /// trimmed, no control character, at most [`MAX_SECRET_BYTES`]).
    pub fn from_file(flags: Flags, text: &str) -> Result<ExtraHeader, CredentialError> {
        let Some((name, path)) = text.split_once('=') else {
            return Err(CredentialError::HeaderFile(flags, "must look like NAME=FILE".into()));
        };
        let name = name.trim();
        check_header_name(flags, name).map_err(|e| CredentialError::HeaderFile(flags, e))?;
        if path.is_empty() {
            return Err(CredentialError::HeaderFile(flags, format!("{name}: no file after '='")));
        }
        let header = ExtraHeader { name: name.to_string(), value: SecretSource::File(PathBuf::from(path)) };
        header.value()?;
        Ok(header)
    }

    /// The value now (a file re-read).
    pub fn value(&self) -> Result<Secret, CredentialError> {
        self.value.read("header value")
    }

    /// Whether the value comes from a file.
    pub fn from_a_file(&self) -> bool {
        matches!(self.value, SecretSource::File(_))
    }
}

/// Checks a `--tenant-id`.
pub fn check_tenant(tenant: &str) -> Result<(), CredentialError> {
    check_tenant_of(Flags::UPLOAD, tenant)
}

/// Checks the tenant flag of the destination whose flags are `flags`.
pub fn check_tenant_of(flags: Flags, tenant: &str) -> Result<(), CredentialError> {
    if tenant.trim().is_empty() || tenant.chars().any(char::is_control) {
        return Err(CredentialError::BadTenant(flags));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(content: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pyperch-cred-{}-{}", std::process::id(), content.len()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(format!("secret-{:x}", content.iter().fold(0u64, |h, b| h.wrapping_mul(31) ^ *b as u64)));
        std::fs::write(&p, content).unwrap();
        p
    }

    #[test]
    fn upload_basic_auth_from_file_is_redacted() {
        let f = temp_file(b"s3cret-pw\n");
        let auth = Auth::from_flags(Some("inst".into()), Some(f.clone()), None, None).unwrap();
        let v = auth.header_value().unwrap().unwrap();
        // base64("inst:s3cret-pw")
        assert_eq!(v.expose(), "Basic aW5zdDpzM2NyZXQtcHc=");
        for shown in [format!("{auth:?}"), format!("{v:?}")] {
            assert!(!shown.contains("s3cret") && !shown.contains("aW5zdDpz"), "{shown}");
        }
        // Rotation: the file is read again on each call.
        std::fs::write(&f, b"other\r\n").unwrap();
        assert_eq!(auth.header_value().unwrap().unwrap().expose(), "Basic aW5zdDpvdGhlcg==");
    }

    #[test]
    fn upload_secret_mistakes_are_clear() {
        let env = Some("envpw".to_string());
        let auth = Auth::from_flags(Some("u".into()), None, env.clone(), None).unwrap();
        assert!(!format!("{auth:?}").contains("envpw"));
        assert!(matches!(Auth::from_flags(Some("u".into()), None, None, None), Err(CredentialError::NoPassword(_))));
        assert!(matches!(Auth::from_flags(Some("a:b".into()), None, env.clone(), None), Err(CredentialError::BadUser(_))));
        let tok = temp_file(b"tok\n");
        assert!(matches!(Auth::from_flags(Some("u".into()), None, env.clone(), Some(tok.clone())), Err(CredentialError::BothAuth(_))));
        // The OTLP endpoint's flags are named in its errors.
        let e = Auth::from_flags_of(Flags::OTLP, Some("u".into()), None, None, None).unwrap_err();
        assert_eq!(e.to_string(), "--otlp-user needs a password: --otlp-password-file FILE or the PYPERCH_OTLP_PASSWORD environment variable");
        let bearer = Auth::from_flags(None, None, env, Some(tok)).unwrap();
        assert_eq!(bearer.header_value().unwrap().unwrap().expose(), "Bearer tok");
        let e = Auth::from_flags(Some("u".into()), Some("/nonexistent/pw".into()), None, None).unwrap_err();
        assert!(e.to_string().starts_with("cannot read the password file /nonexistent/pw: "), "{e}");
        let e = Auth::from_flags(Some("u".into()), Some(temp_file(b"\n")), None, None).unwrap_err();
        assert!(matches!(e, CredentialError::Empty { .. }), "{e}");
        let e = Auth::from_flags(Some("u".into()), Some(temp_file(b"pw\nX-Evil: 1\n")), None, None).unwrap_err();
        assert!(matches!(e, CredentialError::BadChars { .. }) && !e.to_string().contains("Evil"), "{e}");
        let big = vec![b'a'; MAX_SECRET_BYTES as usize + 1];
        let e = Auth::from_flags(None, None, None, Some(temp_file(&big))).unwrap_err();
        assert!(matches!(e, CredentialError::TooLarge { .. }), "{e}");
    }

    #[test]
    fn upload_extra_headers() {
        let h = ExtraHeader::parse("X-Api-Key:  k3y ").unwrap();
        assert_eq!((h.name.as_str(), h.value().unwrap().expose()), ("X-Api-Key", "k3y"));
        assert!(!format!("{h:?}").contains("k3y"));
        for bad in ["NoColon", ": v", "Bad Name: v", "X-A: ", "X-A: a\rb", "authorization: Basic x", "X-Scope-OrgID: t"] {
            let e = ExtraHeader::parse(bad).unwrap_err();
            assert!(e.to_string().starts_with("--upload-header "), "{bad}: {e}");
        }
        let e = ExtraHeader::parse_of(Flags::OTLP, "Authorization: x").unwrap_err();
        assert_eq!(e.to_string(), "--otlp-header Authorization: not accepted here: use --otlp-user with --otlp-password-file, or --otlp-token-file");
        // Issue #28 item 8: a value from a file (not in /proc/PID/cmdline), re-read.
        let f = temp_file(b"file-k3y\n");
        let h = ExtraHeader::from_file(Flags::UPLOAD, &format!("X-Api-Key={}", f.display())).unwrap();
        assert_eq!(h.value().unwrap().expose(), "file-k3y");
        assert!(!format!("{h:?}").contains("file-k3y"));
        std::fs::write(&f, b"rotated").unwrap();
        assert_eq!(h.value().unwrap().expose(), "rotated");
        for bad in ["X-A", "X-A=", "Bad Name=/etc/hostname", "Authorization=/etc/hostname", "X-A=/nonexistent/file"] {
            let e = ExtraHeader::from_file(Flags::UPLOAD, bad).unwrap_err();
            assert!(e.to_string().starts_with("--upload-header-file ") || e.to_string().starts_with("cannot read the header value file"), "{bad}: {e}");
        }
        assert!(check_tenant("team-a").is_ok());
        assert!(check_tenant("").is_err() && check_tenant("a\nb").is_err());
    }
}
