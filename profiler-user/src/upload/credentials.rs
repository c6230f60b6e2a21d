//! What the agent sends to authenticate and route its uploads: basic auth or a bearer token,
//! the tenant header (`X-Scope-OrgID`) and extra headers given with `--upload-header`.
//!
//! Invariants:
//! - a secret (password, token) is never held in a type whose `Debug` or `Display` shows it,
//!   and no error of this module contains one;
//! - a secret file is read with a bound ([`MAX_SECRET_BYTES`]) and re-read on every upload
//!   attempt, so a rotated Kubernetes Secret is picked up without a restart; one trailing
//!   newline (`\n` or `\r\n`) is trimmed;
//! - every header value sent is checked first: no control character (so no header injection
//!   from a file or a flag), not empty.

use std::{fmt, io::Read, path::PathBuf};

use base64::Engine as _;

use super::printable;

/// The largest password or token file read (bytes).
pub const MAX_SECRET_BYTES: u64 = 16 * 1024;
/// The environment variable holding the basic-auth password when no file is given.
pub const PASSWORD_ENV: &str = "PYPERCH_UPLOAD_PASSWORD";
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
    #[error("--upload-user must not be empty or contain ':' or a control character")]
    BadUser,
    #[error("--upload-user needs a password: --upload-password-file FILE or the {PASSWORD_ENV} environment variable")]
    NoPassword,
    #[error("a password was given but no --upload-user")]
    PasswordWithoutUser,
    #[error("--upload-user and --upload-token-file exclude each other (one Authorization header)")]
    BothAuth,
    #[error("--upload-header {0}")]
    Header(String),
    #[error("--tenant-id must not be empty or contain a control character")]
    BadTenant,
}

/// Where a secret comes from. Its `Debug` never shows a secret value.
#[derive(Clone)]
pub enum SecretSource {
    /// A file, re-read on every upload attempt.
    File(PathBuf),
    /// A value read once from the environment variable named here.
    Env { var: &'static str, value: String },
}

impl fmt::Debug for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretSource::File(p) => f.debug_tuple("File").field(p).finish(),
            SecretSource::Env { var, .. } => write!(f, "Env({var}, <redacted>)"),
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
        }
    }

    /// The secret now: the file's content (bounded, final newline trimmed) or the variable's.
    pub fn read(&self, what: &'static str) -> Result<Secret, CredentialError> {
        let text = match self {
            SecretSource::Env { value, .. } => value.clone(),
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
        let password = password_file
            .map(SecretSource::File)
            .or_else(|| env_password.map(|value| SecretSource::Env { var: PASSWORD_ENV, value }));
        let auth = match (user, password, token_file) {
            (Some(_), _, Some(_)) => return Err(CredentialError::BothAuth),
            (Some(user), Some(password), None) => {
                if user.is_empty() || user.contains(':') || user.chars().any(char::is_control) {
                    return Err(CredentialError::BadUser);
                }
                Auth::Basic { user, password }
            }
            (Some(_), None, None) => return Err(CredentialError::NoPassword),
            (None, Some(SecretSource::File(_)), _) => return Err(CredentialError::PasswordWithoutUser),
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

/// One `--upload-header 'Name: value'`. Its `Debug` shows the name only (a value may be an
/// API key).
#[derive(Clone, PartialEq, Eq)]
pub struct ExtraHeader {
    pub name: String,
    pub value: Secret,
}

impl fmt::Debug for ExtraHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: <redacted>", self.name)
    }
}

/// Headers pyperch sets itself, or that flags set: not accepted from `--upload-header`.
const RESERVED_HEADERS: [(&str, &str); 8] = [
    ("authorization", "use --upload-user with --upload-password-file, or --upload-token-file"),
    ("x-scope-orgid", "use --tenant-id"),
    ("host", "it is taken from --upload-url"),
    ("content-type", "pyperch sets it"),
    ("content-length", "pyperch sets it"),
    ("transfer-encoding", "pyperch sets it"),
    ("connection", "pyperch sets it"),
    ("proxy-authorization", "put proxy credentials in HTTPS_PROXY"),
];

impl ExtraHeader {
    /// Parses `Name: value` (RFC 9110 token name, value without control characters).
    pub fn parse(text: &str) -> Result<ExtraHeader, CredentialError> {
        let Some((name, value)) = text.split_once(':') else {
            return Err(CredentialError::Header("must look like 'Name: value'".into()));
        };
        let name = name.trim();
        let tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if name.is_empty() || !name.chars().all(tchar) {
            return Err(CredentialError::Header(format!(
                "{:?}: a header name is letters, digits and !#$%&'*+-.^_`|~ only",
                printable(name.as_bytes())
            )));
        }
        let lower = name.to_ascii_lowercase();
        if let Some((_, why)) = RESERVED_HEADERS.iter().find(|(n, _)| *n == lower) {
            return Err(CredentialError::Header(format!("{name}: not accepted here: {why}")));
        }
        let value = value.trim_matches([' ', '\t']);
        if value.is_empty() || value.chars().any(char::is_control) {
            // The value is not shown: it may be a secret.
            return Err(CredentialError::Header(format!("{name}: the value is empty or holds a control character")));
        }
        Ok(ExtraHeader { name: name.to_string(), value: Secret(value.to_string()) })
    }
}

/// Checks a `--tenant-id`.
pub fn check_tenant(tenant: &str) -> Result<(), CredentialError> {
    if tenant.trim().is_empty() || tenant.chars().any(char::is_control) {
        return Err(CredentialError::BadTenant);
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
        assert!(matches!(Auth::from_flags(Some("u".into()), None, None, None), Err(CredentialError::NoPassword)));
        assert!(matches!(Auth::from_flags(Some("a:b".into()), None, env.clone(), None), Err(CredentialError::BadUser)));
        let tok = temp_file(b"tok\n");
        assert!(matches!(Auth::from_flags(Some("u".into()), None, env.clone(), Some(tok.clone())), Err(CredentialError::BothAuth)));
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
        assert_eq!((h.name.as_str(), h.value.expose()), ("X-Api-Key", "k3y"));
        assert!(!format!("{h:?}").contains("k3y"));
        for bad in ["NoColon", ": v", "Bad Name: v", "X-A: ", "X-A: a\rb", "authorization: Basic x", "X-Scope-OrgID: t"] {
            let e = ExtraHeader::parse(bad).unwrap_err();
            assert!(e.to_string().starts_with("--upload-header "), "{bad}: {e}");
        }
        assert!(check_tenant("team-a").is_ok());
        assert!(check_tenant("").is_err() && check_tenant("a\nb").is_err());
    }
}
