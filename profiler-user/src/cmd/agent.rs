//! `pyperch agent`: continuous whole-host profiling, pushing one pprof per interval (per
//! process or per container) to a Pyroscope-compatible ingest endpoint, and/or one OTLP
//! profiles request per interval (one resource per process) to an OpenTelemetry endpoint.
//! Each destination has its own uploader (queue, backoff and counts).
//!
//! Sampling never waits for the network: profiles go through `upload::Uploader`'s bounded
//! queue. On SIGTERM (or Ctrl-C, or the end of `--duration`) the current partial interval is
//! flushed and the queue is given [`FINAL_DRAIN`] to drain before exiting; a request still
//! waiting for an answer then is abandoned (its profile counted as not delivered).

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::{
    sample::aggregate::{AGENT_INTERVAL_BUDGET, Profile, Timing},
    filter::ProcessFilter,
    output::{self, Format, otlp},
    session::{
        Session, SessionError,
        builder::{SessionBuilder, check_rate},
        report::stats_report,
    },
    export::upload::{
        Api, Auth, ClientSettings, Endpoint, ExtraHeader, Flags, PROFILE_TYPE_CPU, Upload, UploadCounters, Uploader,
        check_tenant_of, proxy_for, push_body, pyroscope_labels, pyroscope_name,
    },
};

/// Why the agent cannot run. Each is one sentence for the user.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The session could not start or run.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The upload settings are wrong (URLs, credentials, `--interval`).
    #[error("{0}")]
    Upload(String),
}

/// How profiles are split before upload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Grouping {
    /// One profile per process (labels: pid, executable, container, pod).
    Process,
    /// One profile per container (processes outside containers share "host").
    Container,
}

#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// Pyroscope ingest base URL (`--upload-url`).
    pub upload_url: Option<String>,
    /// OTLP/HTTP base URL (`--otlp-endpoint`); requests go to `{base}`[`otlp::PROFILES_PATH`].
    pub otlp_endpoint: Option<String>,
    pub interval: Duration,
    pub app_name: String,
    pub rate: u64,
    /// `--max-cpu`: pyperch's CPU budget, percent of one CPU (`None`: off).
    pub max_cpu: Option<f64>,

    pub threads: bool,
    pub stats: bool,
    pub pids: Vec<u32>,
    pub filter: ProcessFilter,
    pub group_by: Grouping,
    /// Profiles kept while the backend is unreachable (oldest dropped first).
    pub queue_profiles: usize,
    /// Bytes kept while the backend is unreachable.
    pub queue_bytes: usize,
    /// Stop after this long (default: run until SIGTERM / Ctrl-C).
    pub duration: Option<Duration>,
    /// Which line frames show (`--function`, `--nolineno`).
    pub line_numbers: crate::sample::aggregate::LineNumbers,
    /// Native and kernel frames (`--native`, `--kernel`).
    pub native: crate::target::native::NativeOptions,
    /// TLS, credentials, headers and API of the uploads.
    pub upload: UploadOptions,
    /// Whether `--app-name` was given: if not, a process in a pod named by its runtime's
    /// annotations is filed under `service_name` `<namespace>/<container>`.
    pub app_name_given: bool,
    /// Which time to profile (`--mode`, `--min-off-cpu`); sets the pprof sample type.
    pub time: crate::time_mode::TimeOptions,
    /// asyncio task stacks (`--async`, CPython 3.14+), as for `record`.
    pub async_stacks: bool,
}

/// How the agent reaches its backends besides the URLs. Holds paths, never secret values.
#[derive(Debug, Clone, Default)]
pub struct UploadOptions {
    pub api: Api,
    /// A PEM bundle added to the system's CAs (for both destinations: not a secret).
    pub ca_file: Option<std::path::PathBuf>,
    /// `--upload-pin`: the server keys accepted (for both destinations), as given.
    pub pins: Vec<String>,
    /// `--upload-url`'s credentials (`--upload-user`... `--tenant-id`, `--upload-header*`).
    pub credentials: EndpointCredentials,
    /// `--otlp-endpoint`'s own credentials (`--otlp-user`...): never `--upload-url`'s.
    pub otlp: EndpointCredentials,
    /// `--allow-insecure-http`: credentials may go to an `http://` URL.
    pub allow_insecure_http: bool,
}

/// One destination's credentials, as given on the command line (paths, never secrets).
#[derive(Debug, Clone, Default)]
pub struct EndpointCredentials {
    pub user: Option<String>,
    pub password_file: Option<std::path::PathBuf>,
    pub token_file: Option<std::path::PathBuf>,
    pub tenant_id: Option<String>,
    /// `Name: value` texts.
    pub headers: Vec<String>,
    /// `NAME=FILE` texts.
    pub header_files: Vec<String>,
}

/// The client settings of one destination (`endpoint`, named by `flag` in errors, with the
/// credentials `creds` whose flags are `flags`), checked (credentials read once, CA files
/// parsed), and a phrase for the start-up line (no secret in it). The password may come
/// from `flags.password_env`; the proxy comes from the environment, by the URL's scheme.
/// Credentials (an `Authorization` or any extra header) for an `http://` URL are refused
/// unless `options.allow_insecure_http`.
fn client_settings(
    options: &UploadOptions,
    creds: &EndpointCredentials,
    flags: Flags,
    flag: &str,
    endpoint: &Endpoint,
) -> Result<(ClientSettings, String), AgentError> {
    let upload_error = |e: &dyn std::fmt::Display| AgentError::Upload(e.to_string());
    let env_password = std::env::var(flags.password_env).ok().filter(|v| !v.is_empty());
    let auth = Auth::from_flags_of(flags, creds.user.clone(), creds.password_file.clone(), env_password, creds.token_file.clone())
        .map_err(|e| upload_error(&e))?;
    if let Some(t) = &creds.tenant_id {
        check_tenant_of(flags, t).map_err(|e| upload_error(&e))?;
    }
    let mut headers = creds
        .headers
        .iter()
        .map(|h| ExtraHeader::parse_of(flags, h))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| upload_error(&e))?;
    for h in &creds.header_files {
        headers.push(ExtraHeader::from_file(flags, h).map_err(|e| upload_error(&e))?);
    }
    if !endpoint.is_https() && (auth.is_some() || !headers.is_empty()) && !options.allow_insecure_http {
        let p = flags.prefix;
        return Err(AgentError::Upload(format!(
            "{flag} is http://, so its credentials (--{p}-user, --{p}-token-file or --{p}-header) would cross the network unencrypted: use https://, or give --allow-insecure-http if that path is trusted (e.g. a sidecar on localhost)"
        )));
    }
    let roots = crate::export::upload::roots(options.ca_file.as_deref()).map_err(|e| upload_error(&e))?;
    let pins = options.pins.iter().map(|p| crate::export::upload::Pin::parse(p)).collect::<Result<Vec<_>, _>>().map_err(|e| upload_error(&e))?;
    let proxy = proxy_for(endpoint);
    let mut about = Vec::new();
    if endpoint.is_https() {
        about.push(format!("certificates checked against {}", roots.description));
        if !pins.is_empty() {
            about.push(format!("the server's key pinned ({})", pins.iter().map(|p| p.shown()).collect::<Vec<_>>().join(", ")));
        }
    }
    match &auth {
        Auth::None => {}
        Auth::Basic { user, .. } => about.push(format!("basic auth as {}", crate::text::field(user))),
        Auth::Bearer(_) => about.push("a bearer token".to_string()),
    }
    if let Some(t) = &creds.tenant_id {
        about.push(format!("tenant {}", crate::text::field(t)));
    }
    if !headers.is_empty() {
        let names: Vec<&str> = headers.iter().map(|h| h.name.as_str()).collect();
        about.push(format!("headers {}", names.join(", ")));
    }
    if !endpoint.is_https() && (auth.is_some() || !headers.is_empty()) {
        about.push("credentials over unencrypted http (--allow-insecure-http)".to_string());
    }
    if let Some(p) = &proxy {
        about.push(format!("through the proxy {}:{}", crate::text::field(p.host()), p.port()));
    }
    let settings = ClientSettings {
        auth,
        tenant: creds.tenant_id.clone(),
        headers,
        trust: crate::export::upload::Trust { roots: roots.roots, own: roots.own, pins: pins.clone() },
        proxy,
        ..ClientSettings::default()
    };
    Ok((settings, about.join(", ")))
}

/// How long the queue gets to drain at exit (after SIGTERM, Ctrl-C or `--duration`). The
/// agent exits by then (plus the time to flush the last interval), even when a request is
/// still waiting for a silent server: that request is abandoned.
pub const FINAL_DRAIN: Duration = Duration::from_secs(10);

pub fn agent(options: AgentOptions) -> Result<(), AgentError> {
    check_rate(options.rate)?;
    let upload_error = |e: crate::export::upload::UploadError| AgentError::Upload(e.to_string());
    let endpoint =
        options.upload_url.as_deref().map(|url| Endpoint::parse_for(url, options.upload.api)).transpose().map_err(upload_error)?;
    let otlp_endpoint = options
        .otlp_endpoint
        .as_deref()
        .map(|url| Endpoint::parse_with_path(url, otlp::PROFILES_PATH, otlp::CONTENT_TYPE))
        .transpose()
        .map_err(|e| AgentError::Upload(format!("--otlp-endpoint: {e}")))?;
    if endpoint.is_none() && otlp_endpoint.is_none() {
        return Err(AgentError::Upload("give --upload-url URL, --otlp-endpoint URL, or both".into()));
    }
    // Each destination has its own credentials, headers and proxy.
    let upload_settings = endpoint
        .as_ref()
        .map(|e| client_settings(&options.upload, &options.upload.credentials, Flags::UPLOAD, "--upload-url", e))
        .transpose()?;
    let otlp_settings = otlp_endpoint
        .as_ref()
        .map(|e| client_settings(&options.upload, &options.upload.otlp, Flags::OTLP, "--otlp-endpoint", e))
        .transpose()?;
    let otlp_info = otlp::ResourceInfo { host_name: otlp::host_name(), service_name: Some(options.app_name.clone()),
        service_name_from_pod: !options.app_name_given,
    };
    if options.interval < Duration::from_secs(1) {
        return Err(AgentError::Upload("--interval must be at least 1s".into()));
    }
    let mut builder = SessionBuilder::new("pyperch agent", options.rate, options.time);
    builder.pids = options.pids.clone();
    builder.filter = options.filter.clone();
    builder.threads = options.threads;
    builder.native = options.native;
    builder.async_stacks = options.async_stacks;
    builder.line_numbers = options.line_numbers;
    builder.profile_budget = Some(AGENT_INTERVAL_BUDGET);
    builder.max_cpu = options.max_cpu;
    builder.preflight()?;
    let mut started = builder.start()?;
    let endpoint_text = [(endpoint.as_ref(), upload_settings.as_ref()), (otlp_endpoint.as_ref(), otlp_settings.as_ref())]
        .into_iter()
        .filter_map(|(e, s)| {
            let (e, (_, about)) = (e?, s?);
            let url = crate::text::field(e.as_str()).to_string();
            Some(if about.is_empty() { url } else { format!("{url} with {about}") })
        })
        .collect::<Vec<_>>()
        .join(" and ");
    let uploader = endpoint.zip(upload_settings).map(|(e, (settings, _))| Uploader::start_with(e, settings, options.queue_profiles, options.queue_bytes));
    let otlp_uploader =
        otlp_endpoint.zip(otlp_settings).map(|(e, (settings, _))| Uploader::start_with(e, settings, options.queue_profiles, options.queue_bytes));
    let uploaders = || {
        [("", uploader.as_ref()), ("otlp ", otlp_uploader.as_ref())]
            .into_iter()
            .filter_map(|(name, u)| Some((name, u?)))
    };
    eprintln!(
        "pyperch agent: sampling at {} Hz, one profile per {} every {:?} to {}",
        options.rate,
        match options.group_by {
            Grouping::Process => "process",
            Grouping::Container => "container",
        },
        options.interval,
        endpoint_text,
    );

    let mut interval_start = SystemTime::now();
    let mut interval_number = 0u64;
    let (mut dropped_before, mut lost_before) = (0u64, 0u64);
    let mut flush = |session: &mut Session| {
        let now = SystemTime::now();
        interval_number += 1;
        // The whole interval (frames, stacks) leaves the session here and is freed once
        // encoded; the next interval interns afresh.
        // Waits still going on are charged up to now: each profile holds the time of its period.
        session.charge_pending_off_cpu(crate::kernel::loader::monotonic_ns());
        let mut part = session.take_interval();
        // The interval's own drops and losses: the counters run for the agent's whole life.
        let dropped = crate::cmd::explain::dropped_samples(&session.totals());
        let lost = session.kernel.counters().ringbuf_full;
        part.set_timing(Timing {
            start: interval_start,
            duration: now.duration_since(interval_start).unwrap_or_default(),
            rate_hz: options.rate,
            dropped: dropped.saturating_sub(dropped_before),
            lost: lost.saturating_sub(lost_before),
            budget: session.cpu_budget.take_interval(),
        });
        (dropped_before, lost_before) = (dropped, lost);
        let mut queued = 0;
        if let Some(uploader) = &uploader {
            let uploads = interval_uploads(&part, &options, interval_start, now);
            queued = uploads.len();
            for u in uploads {
                uploader.push(u);
            }
        }
        let mut otlp_queued = 0;
        if let Some(otlp_uploader) = &otlp_uploader {
            if part.total_samples() > 0 {
                otlp_uploader.push(Upload { params: Vec::new(), body: otlp::encode(&part, &otlp_info) });
                otlp_queued = 1;
            }
        }
        interval_start = now;
        session.prune_exited();
        // In the wall and off-CPU modes the values are nanoseconds, not samples.
        let measured = if options.time.mode.in_nanoseconds() {
            format!("{:.3} s of {} time", part.total_samples() as f64 / 1e9, options.time.mode.label())
        } else {
            format!("{} samples", part.total_samples())
        };
        let mut line = format!(
            "pyperch agent: interval {interval_number}: {measured} from {} processes",
            part.pids().iter().filter(|p| part.samples_of(**p) > 0).count(),
        );
        if uploader.is_some() {
            line.push_str(&format!(", {queued} profiles queued"));
        }
        if otlp_uploader.is_some() {
            line.push_str(&format!(", {otlp_queued} OTLP requests queued"));
        }
        for (name, u) in uploaders() {
            line.push_str(&format!("; {name}{}", upload_counts(&u.counters())));
            if let Some(e) = u.last_error() {
                line.push_str(&format!(" ({name}last error: {})", crate::text::field(&e.to_string())));
            }
        }
        if !options.filter.is_empty() && session.live_processes() == 0 {
            line.push_str(&format!("; no Python process matches {}", crate::text::field(&options.filter.describe())));
        }
        eprintln!("{line}");
    };
    started.run(options.duration, false, Some((options.interval, &mut flush)))?;
    let session = &mut started.session;
    // Flush the partial interval before leaving (sampling stopped as the loop ended).
    flush(session);
    let kernel_counters = session.kernel.counters();
    // Both queues drain at once, so the exit waits FINAL_DRAIN at most.
    let drains: Vec<_> = [("", uploader), ("OTLP ", otlp_uploader)]
        .into_iter()
        .filter_map(|(name, u)| Some((name, u?)))
        .map(|(name, u)| (name, std::thread::spawn(move || u.finish(FINAL_DRAIN))))
        .collect();
    let mut finals = Vec::new();
    for (name, drain) in drains {
        let last = drain.join().unwrap_or_default();
        let (unsent, what) = (last.queued, if name.is_empty() { "profiles" } else { "OTLP requests" });
        if unsent > 0 {
            eprintln!("pyperch agent: {unsent} {what} could not be delivered before exit");
        } else if last.rejected > 0 {
            let by = if name.is_empty() { "the ingest endpoint" } else { "the OTLP endpoint" };
            eprintln!("pyperch agent: queue drained; {} {what} were rejected by {by}", last.rejected);
        } else {
            eprintln!("pyperch agent: all {what} delivered");
        }
        finals.push((name, last));
    }
    if options.stats {
        let totals = session.totals();
        eprint!("{}", stats_report(session, &totals, kernel_counters));
        for (name, last) in finals {
            eprintln!(
                "  {}uploads: sent {}, failed attempts {}, rejected {}, dropped {} ({} of them not delivered at exit), authentication failures {}",
                name.to_ascii_lowercase(),
                last.sent,
                last.failed_attempts,
                last.rejected,
                last.dropped,
                last.queued,
                last.auth_failures
            );
        }
    }
    Ok(())
}

/// The upload counts of the status line and `--stats`.
fn upload_counts(c: &UploadCounters) -> String {
    format!(
        "sent {}, failed attempts {}, rejected {}, dropped {}, waiting {}, authentication failures {}",
        c.sent, c.failed_attempts, c.rejected, c.dropped, c.queued, c.auth_failures
    )
}

/// The service name and labels of one uploaded profile, and the processes it holds.
type Group = (String, Vec<(String, String)>, Vec<u32>);

/// One upload per group (process or container) of this interval's profile.
fn interval_uploads(part: &Profile, options: &AgentOptions, from: SystemTime, until: SystemTime) -> Vec<Upload> {
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    for pid in part.pids() {
        if part.samples_of(pid) == 0 {
            continue;
        }
        let label = part.process(pid);
        let container = label.and_then(|l| l.container_id.clone());
        let pod = label.and_then(|l| l.pod_uid.clone());
        let names = label.and_then(|l| l.pod_names.clone());
        let app = match &names {
            Some(n) if !options.app_name_given => n.service_name(),
            _ => options.app_name.clone(),
        };
        let (key, mut labels) = match options.group_by {
            Grouping::Process => {
                let exe = label
                    .map(|l| {
                        std::path::Path::new(&l.exe)
                            .file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_else(|| l.comm.clone())
                    })
                    .unwrap_or_default();
                (
                    format!("pid {pid}"),
                    vec![("process.pid".to_string(), pid.to_string()), ("process.executable.name".to_string(), exe)],
                )
            }
            Grouping::Container => {
                let id = container.clone().unwrap_or_else(|| "host".to_string());
                (format!("container {id}"), vec![])
            }
        };
        if let Some(c) = &container {
            labels.push(("container.id".to_string(), c.clone()));
        }
        if let Some(p) = &pod {
            labels.push(("k8s.pod.uid".to_string(), p.clone()));
        }
        if let Some(l) = label {
            labels.extend(output::k8s_name_labels(l));
        }
        let entry = groups.entry(key).or_insert_with(|| (app, labels, Vec::new()));
        entry.2.push(pid);
    }
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut uploads = Vec::new();
    for (_, (app, labels, pids)) in groups {
        let sub = part.filtered(|k| pids.contains(&k.pid));
        let mut body = Vec::new();
        if output::write_profile(&sub, Format::Pprof, &app, &mut body).is_err() {
            continue;
        }
        if options.upload.api == Api::Push {
            // The labels travel in the PushRequest; the profile type is CPU time.
            uploads.push(Upload { params: Vec::new(), body: push_body(PROFILE_TYPE_CPU, &app, &labels, body) });
            continue;
        }
        let name = pyroscope_name(&pyroscope_labels(&app, PROFILE_TYPE_CPU, &labels));
        let params = vec![
            ("name", name),
            ("from", secs(from).to_string()),
            ("until", secs(until).max(secs(from) + 1).to_string()),
            ("format", "pprof".to_string()),
            ("sampleRate", options.rate.to_string()),
            ("spyName", "pyperch".to_string()),
        ];
        uploads.push(Upload { params, body });
    }
    uploads
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::sample::aggregate::{FrameName, ProcessLabel};
    use crate::host::pod_names::PodNames;

    fn options(app_name: Option<&str>, group_by: Grouping) -> AgentOptions {
        AgentOptions {
            upload_url: Some("http://127.0.0.1:1".into()),
            otlp_endpoint: None,
            interval: Duration::from_secs(15),
            app_name: app_name.unwrap_or("pyperch").into(),
            rate: 99,
            max_cpu: None,
            threads: false,
            stats: false,
            pids: Vec::new(),
            filter: ProcessFilter::default(),
            group_by,
            queue_profiles: 4,
            queue_bytes: 1 << 20,
            duration: None,
            line_numbers: Default::default(),
            upload: UploadOptions::default(),
            app_name_given: app_name.is_some(),
            time: Default::default(),
            native: Default::default(),
            async_stacks: false,
        }
    }

    /// The `name` parameter of each upload.
    fn upload_names(part: &Profile, options: &AgentOptions) -> Vec<String> {
        let mut names: Vec<String> = interval_uploads(part, options, UNIX_EPOCH, UNIX_EPOCH)
            .into_iter()
            .filter_map(|u| u.params.into_iter().find(|(k, _)| *k == "name").map(|(_, v)| v))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn service_name_defaults_to_namespace_and_container_for_pods() {
        let mut p = Profile::new();
        let f = p.intern(FrameName { function: Arc::from("work"), file: Arc::from("/app/w.py"), line: 3, native: None });
        let id = "ab".repeat(32);
        let names = PodNames { namespace: "shop".into(), pod: "checkout-7d9f6b5c4-x2x7q".into(), container: "checkout-api".into() };
        let label = ProcessLabel {
            comm: "python3".into(),
            exe: "/usr/bin/python3".into(),
            container_id: Some(id.clone()),
            pod_uid: Some("u1".into()),
            pod_names: Some(Arc::new(names)),
            ..Default::default()
        };
        p.set_process(10, label);
        p.set_process(20, ProcessLabel { comm: "python3".into(), exe: "/usr/bin/python3".into(), ..Default::default() });
        p.add(10, None, &[f], 3);
        p.add(20, None, &[f], 1);

        let got = upload_names(&p, &options(None, Grouping::Process));
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].starts_with("pyperch{process.pid=\"20\""), "{got:?}");
        assert_eq!(
            got[1],
            format!(
                "shop/checkout-api{{process.pid=\"10\",process.executable.name=\"python3\",container.id=\"{id}\",k8s.pod.uid=\"u1\",k8s.namespace.name=\"shop\",k8s.pod.name=\"checkout-7d9f6b5c4-x2x7q\",k8s.container.name=\"checkout-api\"}}"
            )
        );
        // --app-name wins for every process.
        let got = upload_names(&p, &options(Some("shop-app"), Grouping::Container));
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got.iter().all(|n| n.starts_with("shop-app{")), "{got:?}");
        assert!(got.iter().any(|n| n.contains("k8s.pod.name=\"checkout-7d9f6b5c4-x2x7q\"")), "{got:?}");
    }
}
