//! `pyperch agent` against an HTTPS ingest server with authentication: the test makes a
//! throw-away CA and a server certificate for 127.0.0.1 (with the `openssl` command, which
//! `cargo xtask test` installs when missing), and runs tests/fixtures/ingest_receiver.py with
//! TLS, required basic auth and a required tenant (`X-Scope-OrgID`).
//!
//! - right credentials, tenant and CA file: every profile arrives (decoded as pprof by the
//!   fixture) with the extra header, and a server stopped and restarted in the middle is
//!   survived (failed attempts counted, nothing lost);
//! - a wrong password (from `PYPERCH_UPLOAD_PASSWORD`): 401s counted as authentication
//!   failures, exactly one clear log line, no password in any output;
//! - a CA file that did not sign the server's certificate: failed attempts and a TLS error
//!   line, nothing sent;
//! - `--upload-api push`: Pyroscope's push API (Connect, protobuf `PushRequest`, read by
//!   the fixture's own protobuf reader) delivers every profile with Pyroscope's labels.
//! - issue #28 item 8: `--upload-url` and `--otlp-endpoint` (two servers) each get their own
//!   credentials, tenant and headers, a header value from a file stays out of
//!   `/proc/PID/cmdline`; credentials for `http://` are refused without
//!   `--allow-insecure-http`; an `HTTPS_PROXY` is not used for an `http://` URL.
//!
//! Needs the test virtualenv (protobuf, grpcio-tools) and openssl; without them the tests SKIP.
//! Proxy variables are removed from the agent's environment (the server is local).

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use pyperch_tests::*;

const USER: &str = "instance-4242";
const HEADER: &str = "X-Pyperch-Test: hello from the test";

/// A CA, a server certificate it signed (for 127.0.0.1 and localhost), and an unrelated CA.
struct Certs {
    dir: PathBuf,
    ca: PathBuf,
    other_ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Drop for Certs {
    fn drop(&mut self) {
        if !thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run openssl: {e}"));
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn make_ca(dir: &Path, name: &str) -> PathBuf {
    std::fs::write(
        dir.join(format!("{name}.cnf")),
        format!(
            "[req]\ndistinguished_name = dn\nx509_extensions = v3_ca\nprompt = no\n\
             [dn]\nCN = pyperch test {name}\n\
             [v3_ca]\nbasicConstraints = critical,CA:TRUE\nkeyUsage = critical,keyCertSign,cRLSign\n\
             subjectKeyIdentifier = hash\n"
        ),
    )
    .unwrap();
    openssl(
        dir,
        &[
            "req", "-x509", "-config", &format!("{name}.cnf"), "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", &format!("{name}.key"), "-out",
            &format!("{name}.pem"), "-days", "2",
        ],
    );
    dir.join(format!("{name}.pem"))
}

fn make_certs() -> Option<Certs> {
    if Command::new("openssl")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        skip("no openssl command (cargo xtask test installs it from Debian)");
        return None;
    }
    let dir = std::env::temp_dir()
        .join("pyperch-tests")
        .join(format!("tls-{}", random_hex(8)));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = make_ca(&dir, "ca");
    let other_ca = make_ca(&dir, "otherca");
    std::fs::write(
        dir.join("server.cnf"),
        "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = localhost\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName = IP:127.0.0.1, DNS:localhost\nbasicConstraints = CA:FALSE\n\
         keyUsage = critical,digitalSignature\nextendedKeyUsage = serverAuth\n\
         authorityKeyIdentifier = keyid\n",
    )
    .unwrap();
    openssl(
        &dir,
        &[
            "req", "-new", "-config", "server.cnf", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        ],
    );
    openssl(
        &dir,
        &[
            "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext",
        ],
    );
    Some(Certs {
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
        dir,
        ca,
        other_ca,
    })
}

/// ingest_receiver.py over TLS; restartable on the same port with the same log.
struct Server {
    python: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    port: u16,
    log: PathBuf,
}

impl Server {
    fn start(python: &Path, certs: &Certs, password: &str, tenant: Option<&str>) -> Server {
        let log = certs.dir.join(format!("requests-{}.jsonl", random_hex(6)));
        let mut args: Vec<String> = vec![
            fixture_path("ingest_receiver.py").display().to_string(),
            "serve".into(),
            "--log".into(),
            log.display().to_string(),
            "--tls-cert".into(),
            certs.cert.display().to_string(),
            "--tls-key".into(),
            certs.key.display().to_string(),
            "--require-basic".into(),
            format!("{USER}:{password}"),
        ];
        if let Some(t) = tenant {
            args.extend(["--require-tenant".to_string(), t.to_string()]);
        }
        let mut s = Server {
            python: python.to_path_buf(),
            args,
            child: None,
            port: 0,
            log,
        };
        s.spawn();
        s
    }

    /// The same server with another certificate and key (files in `certs.dir`).
    fn start_with_cert(python: &Path, certs: &Certs, cert: &Path, key: &Path, password: &str) -> Server {
        let mut s = Server::start_unspawned(python, certs, password);
        for (flag, path) in [("--tls-cert", cert), ("--tls-key", key)] {
            let at = s.args.iter().position(|a| a == flag).expect("flag") + 1;
            s.args[at] = path.display().to_string();
        }
        s.spawn();
        s
    }

    fn start_unspawned(python: &Path, certs: &Certs, password: &str) -> Server {
        let mut s = Server::start(python, certs, password, None);
        s.stop();
        s.port = 0;
        s
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(&self.python);
        cmd.args(&self.args);
        if self.port != 0 {
            cmd.args(["--port", &self.port.to_string()]);
        }
        let (child, port) = spawn_fixture_server(&mut cmd, "ingest_receiver.py");
        self.port = port;
        self.child = Some(child);
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            stop_child(&mut c, libc::SIGTERM, Duration::from_secs(5));
        }
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    fn entries(&self) -> Vec<Value> {
        json_lines(&self.log)
    }

    fn with_status(&self, status: u64) -> Vec<Value> {
        self.entries()
            .into_iter()
            .filter(|e| e["status"].as_u64() == Some(status))
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A spinning Python process with a unique command-line tag, for `--cmdline TAG`.
fn tagged_spinner() -> Option<(Workload, String)> {
    let py = first_python(&["sid-3.14", "3.12", "3.11", "3.13", "3.10", "3.9", "3.8"])?;
    let tag = format!("e2e{}", random_hex(10));
    let w = Workload::spawn(&py, "spin.py", &["leaf_red", "60", &tag])
        .unwrap_or_else(|e| panic!("{e:#}"));
    Some((w, tag))
}

/// Everything the tests need, or a SKIP.
fn setup() -> Option<(PathBuf, Certs, Workload, String)> {
    let python = match pprof_python() {
        Ok(p) => p,
        Err(why) => {
            skip(format!("no ingest receiver: {why}"));
            return None;
        }
    };
    let certs = make_certs()?;
    let (spinner, tag) = tagged_spinner()?;
    Some((python, certs, spinner, tag))
}

/// `pyperch agent ARGS` with `env` and no proxy variables, started.
fn start_agent(args: &[String], env: &[(&str, &str)]) -> Running {
    let mut cmd = Command::new(pyperch_bin());
    cmd.arg("agent").args(args);
    for v in [
        "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy",
        "NO_PROXY", "no_proxy", "PYPERCH_UPLOAD_PASSWORD", "SSL_CERT_FILE",
    ] {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    Running::start(cmd).expect("cannot start pyperch agent")
}

fn diag(run: &Run, server: &Server) -> String {
    let mut s = format!(
        "\n--- command: {}\n--- status {:?} after {:.1} s; stderr:\n",
        run.argv.join(" "),
        run.status,
        run.elapsed.as_secs_f64()
    );
    for l in run.stderr_lines() {
        s.push_str("    ");
        s.push_str(l);
        s.push('\n');
    }
    s.push_str("--- server log (status, path):\n");
    for e in server.entries() {
        s.push_str(&format!("    {} {} {}\n", e["status"], e["path"], e["connection_error"]));
    }
    s
}

/// The profiles the agent queued, summed over its status lines.
fn queued(run: &Run) -> u64 {
    run.stderr_lines()
        .iter()
        .filter(|l| l.starts_with("pyperch agent: interval "))
        .filter_map(|l| {
            let before = l.split(" profiles queued;").next()?;
            before.rsplit(' ').next()?.parse::<u64>().ok()
        })
        .sum()
}

/// The `--stats` upload line: (sent, failed attempts, rejected, authentication failures).
fn stats(run: &Run) -> Option<(u64, u64, u64, u64)> {
    let line = run
        .stderr_lines()
        .into_iter()
        .find_map(|l| l.trim_start().strip_prefix("uploads: sent "))?;
    let num = |after: &str| -> Option<u64> {
        let rest = line.split(after).nth(1)?;
        rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    Some((
        line.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?,
        num("failed attempts ")?,
        num("rejected ")?,
        num("authentication failures ")?,
    ))
}

fn assert_clean(run: &Run, secrets: &[&str], d: &str) {
    for l in run.stderr.lines().chain(run.stdout.lines()) {
        assert!(
            !l.contains(|c: char| c.is_control()),
            "a control character in the agent's output: {l:?}{d}"
        );
        for s in secrets {
            assert!(!l.contains(s), "a secret in the agent's output: {l:?}{d}");
        }
    }
}

fn agent_args(server: &Server, tag: &str, app: &str, duration: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--upload-url", &server.url(), "--app-name", app, "--interval", "1s", "--duration",
        duration, "--cmdline", tag, "--stats",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[test]
fn agent_auth_https_delivers_every_profile_and_survives_a_restart() {
    let Some((python, certs, mut spinner, tag)) = setup() else {
        return;
    };
    let password = format!("pw-{}", random_hex(16));
    let tenant = format!("team-{}", random_hex(6));
    let pw_file = certs.dir.join("password");
    std::fs::write(&pw_file, format!("{password}\n")).unwrap();
    let mut server = Server::start(&python, &certs, &password, Some(&tenant));
    let app = format!("e2e-{}", random_hex(6));
    let ca = certs.ca.display().to_string();
    let pw = pw_file.display().to_string();
    let args = agent_args(
        &server,
        &tag,
        &app,
        "14s",
        &[
            "--upload-ca-file", &ca, "--upload-user", USER, "--upload-password-file", &pw,
            "--tenant-id", &tenant, "--upload-header", HEADER,
        ],
    );
    let agent = start_agent(&args, &[]);
    // Two profiles in, then an outage of 3 s: the server stops and comes back on its port.
    let deadline = Instant::now() + Duration::from_secs(40);
    while server.with_status(200).len() < 2 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    let before_outage = server.with_status(200).len();
    server.stop();
    thread::sleep(Duration::from_secs(3));
    server.spawn();
    let run = agent.finish(Duration::from_secs(90));
    spinner.terminate();
    let d = diag(&run, &server);
    assert!(before_outage >= 2, "no profile arrived before the outage{d}");
    assert!(run.success(), "the agent failed{d}");
    assert!(
        run.stderr_lines().contains(&"pyperch agent: all profiles delivered"),
        "not every profile was delivered{d}"
    );
    let accepted = server.with_status(200);
    assert_eq!(accepted.len() as u64, queued(&run), "profiles lost or duplicated{d}");
    let (sent, failed, rejected, auth) = stats(&run).unwrap_or_else(|| panic!("no --stats upload line{d}"));
    assert_eq!((sent, rejected, auth), (accepted.len() as u64, 0, 0), "{d}");
    assert!(failed >= 1, "the outage caused no failed attempt{d}");
    for e in &accepted {
        assert_eq!(e["path"], "/ingest", "{e}{d}");
        assert_eq!(e["auth_ok"], true, "{e}{d}");
        assert_eq!(e["headers"]["x-scope-orgid"], tenant.as_str(), "{d}");
        assert_eq!(e["headers"]["x-pyperch-test"], "hello from the test", "{d}");
        assert_eq!(e["profile"]["errors"], serde_json::json!([]), "{d}");
        assert!(
            !e["profile"]["samples"].as_array().unwrap().is_empty(),
            "an empty profile{d}"
        );
    }
    assert!(
        !run.stderr.contains("authentication failed"),
        "authentication failed with the right password{d}"
    );
    assert_clean(&run, &[&password], &d);
}

#[test]
fn agent_auth_wrong_password_is_counted_and_logged_once() {
    let Some((python, certs, mut spinner, tag)) = setup() else {
        return;
    };
    let right = format!("right-{}", random_hex(16));
    let wrong = format!("wrong-{}", random_hex(16));
    let server = Server::start(&python, &certs, &right, None);
    let app = format!("e2e-{}", random_hex(6));
    let ca = certs.ca.display().to_string();
    let args = agent_args(&server, &tag, &app, "5s", &["--upload-ca-file", &ca, "--upload-user", USER]);
    let run = start_agent(&args, &[("PYPERCH_UPLOAD_PASSWORD", &wrong)]).finish(Duration::from_secs(90));
    spinner.terminate();
    let d = diag(&run, &server);
    assert!(run.success(), "the agent failed{d}");
    assert!(server.with_status(200).is_empty(), "a profile was accepted with a wrong password{d}");
    let refused = server.with_status(401).len() as u64;
    assert!(refused >= 2, "too few attempts reached the server ({refused}){d}");
    let auth_lines: Vec<&str> = run
        .stderr_lines()
        .into_iter()
        .filter(|l| l.contains("authentication failed"))
        .collect();
    assert_eq!(auth_lines.len(), 1, "not exactly one authentication line{d}");
    assert!(
        auth_lines[0].contains("401") && auth_lines[0].contains("--upload-user"),
        "unclear authentication line {:?}{d}",
        auth_lines[0]
    );
    let (sent, failed, rejected, auth) = stats(&run).unwrap_or_else(|| panic!("no --stats upload line{d}"));
    assert_eq!((sent, rejected), (0, 0), "{d}");
    // The request in flight at exit may have been answered after the agent gave up on it.
    assert!(
        auth <= refused && auth + 1 >= refused && failed >= auth,
        "{auth} authentication failures and {failed} failed attempts counted for {refused} refusals{d}"
    );
    assert!(
        run.stderr.contains("could not be delivered before exit"),
        "the undelivered profiles are not reported{d}"
    );
    assert_clean(&run, &[&right, &wrong], &d);
}

#[test]
fn agent_auth_wrong_ca_fails_clearly() {
    let Some((python, certs, mut spinner, tag)) = setup() else {
        return;
    };
    let password = format!("pw-{}", random_hex(16));
    let pw_file = certs.dir.join("password");
    std::fs::write(&pw_file, &password).unwrap();
    let server = Server::start(&python, &certs, &password, None);
    let app = format!("e2e-{}", random_hex(6));
    let other = certs.other_ca.display().to_string();
    let pw = pw_file.display().to_string();
    let args = agent_args(
        &server,
        &tag,
        &app,
        "3s",
        &["--upload-ca-file", &other, "--upload-user", USER, "--upload-password-file", &pw],
    );
    let run = start_agent(&args, &[]).finish(Duration::from_secs(90));
    spinner.terminate();
    let d = diag(&run, &server);
    assert!(run.success(), "the agent failed{d}");
    assert!(
        server.entries().iter().all(|e| e["method"].is_null()),
        "a request got through an untrusted TLS connection{d}"
    );
    assert!(
        run.stderr_lines()
            .iter()
            .any(|l| l.contains("not signed by a CA pyperch trusts") && l.contains("--upload-ca-file")),
        "no clear TLS error line{d}"
    );
    let (sent, failed, _, auth) = stats(&run).unwrap_or_else(|| panic!("no --stats upload line{d}"));
    assert_eq!((sent, auth), (0, 0), "{d}");
    assert!(failed >= 1, "no failed attempt counted{d}");
    assert_clean(&run, &[&password], &d);
}

#[test]
fn agent_auth_push_api_delivers_with_pyroscope_labels() {
    let Some((python, certs, mut spinner, tag)) = setup() else {
        return;
    };
    let password = format!("pw-{}", random_hex(16));
    let tenant = format!("team-{}", random_hex(6));
    let pw_file = certs.dir.join("password");
    std::fs::write(&pw_file, format!("{password}\n")).unwrap();
    let server = Server::start(&python, &certs, &password, Some(&tenant));
    let app = format!("e2e-{}", random_hex(6));
    let ca = certs.ca.display().to_string();
    let pw = pw_file.display().to_string();
    let args = agent_args(
        &server,
        &tag,
        &app,
        "4s",
        &[
            "--upload-api", "push", "--upload-ca-file", &ca, "--upload-user", USER,
            "--upload-password-file", &pw, "--tenant-id", &tenant,
        ],
    );
    let run = start_agent(&args, &[]).finish(Duration::from_secs(90));
    let pid = spinner.pid.to_string();
    spinner.terminate();
    let d = diag(&run, &server);
    assert!(run.success(), "the agent failed{d}");
    let accepted = server.with_status(200);
    assert!(!accepted.is_empty(), "nothing was pushed{d}");
    assert_eq!(accepted.len() as u64, queued(&run), "profiles lost{d}");
    for e in &accepted {
        assert_eq!(e["path"], "/push.v1.PusherService/Push", "{d}");
        assert_eq!(e["content_type"], "application/proto", "{d}");
        assert_eq!(e["headers"]["x-scope-orgid"], tenant.as_str(), "{d}");
        let series = e["push"].as_array().unwrap_or_else(|| panic!("no series in {e}{d}"));
        assert_eq!(series.len(), 1, "{e}{d}");
        let labels = &series[0]["labels"];
        assert_eq!(labels["__name__"], "process_cpu", "{labels}{d}");
        assert_eq!(labels["service_name"], app.as_str(), "{labels}{d}");
        assert_eq!(labels["process_pid"], pid.as_str(), "{labels}{d}");
        let samples = series[0]["samples"].as_array().unwrap();
        assert_eq!(samples.len(), 1, "{d}");
        assert_eq!(samples[0]["id"].as_str().map(str::len), Some(36), "{d}");
        let profile = &samples[0]["profile"];
        assert_eq!(profile["errors"], serde_json::json!([]), "{d}");
        assert!(!profile["samples"].as_array().unwrap().is_empty(), "{d}");
    }
    assert_clean(&run, &[&password], &d);
}

/// A plain-HTTP ingest receiver (no TLS, no credentials required), logging into `dir`.
fn plain_server(python: &Path, dir: &Path) -> Server {
    let log = dir.join(format!("plain-{}.jsonl", random_hex(6)));
    let mut s = Server {
        python: python.to_path_buf(),
        args: vec![
            fixture_path("ingest_receiver.py").display().to_string(),
            "serve".into(),
            "--log".into(),
            log.display().to_string(),
        ],
        child: None,
        port: 0,
        log,
    };
    s.spawn();
    s
}

/// Issue #28 item 8: `--upload-url` and `--otlp-endpoint` each get their own credentials,
/// tenant and headers, never the other's; a header value from a file is sent without being
/// in the agent's command line.
#[test]
fn agent_auth_credentials_are_per_endpoint() {
    let Some((python, certs, mut spinner, tag)) = setup() else {
        return;
    };
    let (pw_a, pw_b) = (format!("pa-{}", random_hex(16)), format!("pb-{}", random_hex(16)));
    let (tenant_a, tenant_b) = (format!("ta-{}", random_hex(6)), format!("tb-{}", random_hex(6)));
    let key = format!("key-{}", random_hex(16));
    let (pw_a_file, pw_b_file, key_file) = (certs.dir.join("pw-a"), certs.dir.join("pw-b"), certs.dir.join("api-key"));
    std::fs::write(&pw_a_file, &pw_a).unwrap();
    std::fs::write(&pw_b_file, format!("{pw_b}\n")).unwrap();
    std::fs::write(&key_file, format!("{key}\n")).unwrap();
    let pyroscope = Server::start(&python, &certs, &pw_a, Some(&tenant_a));
    let otlp = Server::start(&python, &certs, &pw_b, Some(&tenant_b));
    let app = format!("e2e-{}", random_hex(6));
    let (ca, pa, pb) = (certs.ca.display().to_string(), pw_a_file.display().to_string(), pw_b_file.display().to_string());
    let key_arg = format!("X-Api-Key={}", key_file.display());
    let args = agent_args(
        &pyroscope,
        &tag,
        &app,
        "5s",
        &[
            "--upload-ca-file", &ca, "--upload-user", USER, "--upload-password-file", &pa, "--tenant-id", &tenant_a,
            "--upload-header-file", &key_arg, "--otlp-endpoint", &otlp.url(), "--otlp-user", USER,
            "--otlp-password-file", &pb, "--otlp-tenant-id", &tenant_b, "--otlp-header", "X-Otlp-Only: yes",
        ],
    );
    let agent = start_agent(&args, &[]);
    thread::sleep(Duration::from_secs(2));
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", agent.pid())).unwrap_or_default();
    let run = agent.finish(Duration::from_secs(90));
    spinner.terminate();
    let d = format!("{}{}", diag(&run, &pyroscope), diag(&run, &otlp));
    assert!(run.success(), "the agent failed{d}");
    assert!(!cmdline.is_empty(), "could not read the agent's command line{d}");
    assert!(!String::from_utf8_lossy(&cmdline).contains(&key), "the header file's value is in /proc/PID/cmdline{d}");
    let a = pyroscope.entries();
    let b = otlp.entries();
    assert!(!a.is_empty() && !b.is_empty(), "nothing reached one of the endpoints{d}");
    for e in &a {
        assert_eq!(e["auth_ok"], true, "--upload-url did not get its own password and tenant: {e}{d}");
        assert_eq!(e["headers"]["x-api-key"], key.as_str(), "{e}{d}");
        assert!(e["headers"].get("x-otlp-only").is_none(), "an --otlp-header went to --upload-url: {e}{d}");
    }
    for e in &b {
        // The receiver has no OTLP path (404 once authenticated): what matters is what came.
        assert_eq!(e["path"], "/v1development/profiles", "{e}{d}");
        assert_eq!(e["auth_ok"], true, "--otlp-endpoint did not get its own password and tenant: {e}{d}");
        assert_eq!(e["headers"]["x-otlp-only"], "yes", "{e}{d}");
        assert!(e["headers"].get("x-api-key").is_none(), "an --upload-header-file went to the OTLP endpoint: {e}{d}");
    }
    note(format!("{} uploads to --upload-url and {} to --otlp-endpoint, each with its own credentials", a.len(), b.len()));
    assert_clean(&run, &[&pw_a, &pw_b, &key], &d);
}

/// Issue #28 item 8: credentials for an `http://` URL are refused with one sentence unless
/// `--allow-insecure-http`; the proxy is chosen by the URL's scheme (an `HTTPS_PROXY` that
/// goes nowhere does not stop uploads to an `http://` URL).
#[test]
fn agent_auth_plain_http_credentials_and_proxy_by_scheme() {
    let Some((python, certs, mut spinner, tag)) = setup() else {
        return;
    };
    let server = plain_server(&python, &certs.dir);
    let url = format!("http://127.0.0.1:{}", server.port);
    let token = certs.dir.join("token");
    std::fs::write(&token, format!("tok-{}\n", random_hex(12))).unwrap();
    let token = token.display().to_string();
    let app = format!("e2e-{}", random_hex(6));
    let base = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = ["--upload-url", &url, "--app-name", &app, "--interval", "1s", "--duration", "3s", "--cmdline", &tag, "--stats"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let refused = start_agent(&base(&["--upload-token-file", &token]), &[]).finish(Duration::from_secs(30));
    let d = diag(&refused, &server);
    assert!(!refused.success(), "credentials were accepted for http:// without --allow-insecure-http{d}");
    refused.assert_clear_error();
    assert!(refused.stderr.contains("--allow-insecure-http") && refused.stderr.contains("https://"), "{d}");
    assert!(server.entries().is_empty(), "something was sent{d}");
    let run = start_agent(
        &base(&["--upload-token-file", &token, "--allow-insecure-http"]),
        // A proxy for https:// only, that goes nowhere.
        &[("HTTPS_PROXY", "http://127.0.0.1:9"), ("https_proxy", "http://127.0.0.1:9")],
    )
    .finish(Duration::from_secs(60));
    spinner.terminate();
    let d = diag(&run, &server);
    assert!(run.success(), "the agent failed{d}");
    let accepted = server.with_status(200);
    assert!(!accepted.is_empty(), "nothing arrived: the https proxy was used for an http:// URL?{d}");
    assert!(accepted.iter().all(|e| e["has_authorization"] == true), "{d}");
    assert!(run.stderr.contains("credentials over unencrypted http"), "the start-up line does not say it{d}");
    note(format!("{} profiles delivered over http:// with --allow-insecure-http, past an HTTPS_PROXY", accepted.len()));
}

/// `sh -c SCRIPT` in `dir`: its stdout, trimmed.
fn sh(dir: &Path, script: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(script).current_dir(dir).output().expect("sh");
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Certificates as deployed (issue #32 item 2), each against the same HTTPS receiver:
/// - a self-signed certificate made the usual way (`openssl req -x509 ... -addext
///   subjectAltName=...`, which marks it a CA) given with `--upload-ca-file`: trusted as curl
///   trusts it, every profile delivered (it was refused with `CaUsedAsEndEntity`);
/// - the same kind of certificate for another host name: refused, one sentence naming the
///   host and what to do;
/// - an expired one: refused, one sentence with the date;
/// - `--upload-pin` with the server's key (as curl's `--pinnedpubkey` takes it): delivered;
///   with another key's pin: refused, one sentence giving the server's pin.
/// curl, where installed, is the reference for the first case.
#[test]
fn agent_auth_certificates_as_deployed() {
    let Some((python, certs, mut spinner, tag)) = setup() else { return };
    let dir = certs.dir.clone();
    let password = format!("pw-{}", random_hex(16));
    let pw_file = dir.join("password");
    std::fs::write(&pw_file, &password).unwrap();
    let pw = pw_file.display().to_string();
    // As users make them.
    openssl(&dir, &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "self.key", "-out", "self.pem", "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"]);
    openssl(&dir, &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key", "-out", "other.pem", "-days", "2", "-subj", "/CN=ingest.example", "-addext", "subjectAltName=DNS:ingest.example"]);
    std::fs::write(dir.join("expired.ext"), "subjectAltName = IP:127.0.0.1, DNS:localhost\n").unwrap();
    openssl(&dir, &["req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", "expired.key", "-out", "expired.csr", "-subj", "/CN=localhost"]);
    openssl(&dir, &["x509", "-req", "-in", "expired.csr", "-signkey", "expired.key", "-out", "expired.pem", "-days", "-1", "-extfile", "expired.ext"]);
    let pin_of = |pem: &str| sh(&dir, &format!("openssl x509 -in {pem} -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64"));
    let self_pin = format!("sha256//{}", pin_of("self.pem"));
    let other_pin = format!("sha256//{}", pin_of("other.pem"));

    let case = |cert: &str, key: &str, ca_file: &str, extra: &[&str]| -> (Run, Server) {
        let server = Server::start_with_cert(&python, &certs, &dir.join(cert), &dir.join(key), &password);
        let app = format!("e2e-{}", random_hex(6));
        let ca = dir.join(ca_file).display().to_string();
        let mut more = vec!["--upload-ca-file", ca.as_str(), "--upload-user", USER, "--upload-password-file", pw.as_str()];
        more.extend_from_slice(extra);
        let args = agent_args(&server, &tag, &app, "3s", &more);
        (start_agent(&args, &[]).finish(Duration::from_secs(90)), server)
    };
    let delivered = |run: &Run, server: &Server, what: &str| {
        let d = diag(run, server);
        assert!(run.success(), "{what}: the agent failed{d}");
        let (sent, failed, _, _) = stats(run).unwrap_or_else(|| panic!("{what}: no --stats upload line{d}"));
        note(format!("{what}: {sent} profiles sent, {failed} failed attempts"));
        assert!(sent >= 1 && failed == 0, "{what}: sent {sent}, failed attempts {failed}{d}");
        assert_eq!(server.with_status(200).len() as u64, sent, "{what}: the receiver's 200s{d}");
    };
    let refused = |run: &Run, server: &Server, what: &str, words: &[&str]| {
        let d = diag(run, server);
        assert!(run.success(), "{what}: the agent failed{d}");
        assert!(server.entries().iter().all(|e| e["method"].is_null()), "{what}: a request got through{d}");
        let line = run.stderr_lines().into_iter().find(|l| l.contains("TLS: the server's")).map(str::to_string);
        note(format!("{what}: {}", line.as_deref().unwrap_or("(no line)")));
        let line = line.unwrap_or_else(|| panic!("{what}: no certificate sentence{d}"));
        for w in words {
            assert!(line.contains(w), "{what}: the sentence does not say {w:?}: {line}{d}");
        }
        let (sent, failed, _, _) = stats(run).unwrap_or_else(|| panic!("{what}: no --stats upload line{d}"));
        assert!(sent == 0 && failed >= 1, "{what}: sent {sent}, failed attempts {failed}{d}");
    };

    let (run, server) = case("self.pem", "self.key", "self.pem", &[]);
    if find_program("curl").is_some() {
        let out = Command::new("curl").args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"]).arg(dir.join("self.pem")).arg(format!("{}/", server.url())).output().expect("curl");
        note(format!("curl --cacert self.pem: HTTP {} (exit {:?})", String::from_utf8_lossy(&out.stdout), out.status.code()));
        // curl got past TLS (an HTTP status, whatever it is): the certificate is trusted.
        assert!(out.stdout.len() == 3 && out.stdout != b"000", "curl does not trust the self-signed certificate: the case proves nothing");
    }
    delivered(&run, &server, "self-signed certificate in --upload-ca-file");
    drop(server);
    let (run, server) = case("other.pem", "other.key", "other.pem", &[]);
    refused(&run, &server, "self-signed certificate for another host", &["not valid for 127.0.0.1", "ingest.example", "use a URL"]);
    drop(server);
    let (run, server) = case("expired.pem", "expired.key", "expired.pem", &[]);
    refused(&run, &server, "expired certificate", &["expired on", "renew it"]);
    drop(server);
    let (run, server) = case("self.pem", "self.key", "self.pem", &["--upload-pin", &self_pin]);
    delivered(&run, &server, "--upload-pin with the server's key");
    drop(server);
    let (run, server) = case("self.pem", "self.key", "self.pem", &["--upload-pin", &other_pin]);
    refused(&run, &server, "--upload-pin of another key", &["matches no --upload-pin", &self_pin]);
    drop(server);
    spinner.terminate();
}
