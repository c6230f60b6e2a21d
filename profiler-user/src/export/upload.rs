//! Pushing profiles to a Pyroscope-compatible ingest endpoint, for `pyperch agent`.
//!
//! Uploads run on their own thread behind a bounded queue: when the backend is down or slow,
//! the queue keeps at most `max_items` profiles and `max_bytes` bytes, dropping the oldest
//! first and counting them, so memory stays bounded however long the outage lasts. An upload
//! that fails for a reason that may pass (network error, no answer within the deadline, 5xx,
//! 408, 429, a redirect, which is never followed) is retried with exponential backoff until it
//! succeeds or is pushed out; one the endpoint refuses for good (any other 4xx) is dropped at
//! once and counted as rejected, so it never blocks the queue.
//!
//! A 401 or 403 (the credentials or the tenant are refused) is retried with backoff like an
//! outage, since a fix on either side (a rotated secret file, a new token on the backend)
//! makes the same profile welcome; it is counted as a failed attempt and as an
//! authentication failure, and logged on one line when uploads start failing so, and again
//! when they succeed after that, not at every attempt.
//!
//! The HTTP side (URL, deadline, bounded reads, escaping) is in [`http`].

mod credentials;
mod http;
mod push;
mod tls;
mod tls_connector;

use std::{
    collections::VecDeque,
    sync::{Arc, Condvar, Mutex},
    thread,
    time::{Duration, Instant},
};

pub use credentials::{Auth, CredentialError, ExtraHeader, Flags, OTLP_PASSWORD_ENV, PASSWORD_ENV, TENANT_HEADER, check_tenant, check_tenant_of};
pub use http::{Api, Client, ClientSettings, Endpoint, INGEST_CONTENT_TYPE, MAX_KEPT_BODY, UPLOAD_DEADLINE, UploadError, printable, proxy_for};
pub use push::{label_name, push_body};
pub use tls::{Pin, Roots, TlsError, pin_of, roots};
pub use tls_connector::{PIN_MISMATCH, Trust};

/// One profile to push: the ingest query (already encoded) and the pprof bytes (or, for an
/// endpoint made by [`Endpoint::parse_with_path`], no query and that endpoint's body).
#[derive(Clone, Debug)]
pub struct Upload {
    /// The ingest query parameters (`name`, `from`, `until`, `format`...), not encoded;
    /// empty for no query.
    pub params: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

/// Counts of the uploader, for status lines and `--stats`.
#[derive(Clone, Copy, Debug, Default)]
pub struct UploadCounters {
    pub sent: u64,
    /// Attempts that failed for a reason that may pass (the profile is retried).
    pub failed_attempts: u64,
    /// Profiles the endpoint refused for good (a 4xx other than 408/429): dropped, not
    /// retried.
    pub rejected: u64,
    /// Profiles dropped because the queue was full (oldest first).
    pub dropped: u64,
    pub queued: u64,
    pub queued_bytes: u64,
    /// Failed attempts (counted in `failed_attempts` too) that the endpoint refused with 401
    /// or 403.
    pub auth_failures: u64,
}

struct Shared {
    queue: VecDeque<Upload>,
    queued_bytes: usize,
    counters: UploadCounters,
    closing: bool,
    /// `finish` has given up waiting: profiles still unsent are abandoned.
    give_up: bool,
    /// A profile is being sent (taken out of `queue`).
    in_flight: bool,
    last_error: Option<String>,
}

/// A background uploader with a bounded queue.
pub struct Uploader {
    shared: Arc<(Mutex<Shared>, Condvar)>,
    worker: Option<thread::JoinHandle<()>>,
    max_items: usize,
    max_bytes: usize,
}

const MIN_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

impl Uploader {
    pub fn start(endpoint: Endpoint, max_items: usize, max_bytes: usize) -> Self {
        Self::start_with(endpoint, ClientSettings::default(), max_items, max_bytes)
    }

    /// [`Uploader::start`] with the client's TLS roots, proxy, credentials and headers.
    pub fn start_with(endpoint: Endpoint, settings: ClientSettings, max_items: usize, max_bytes: usize) -> Self {
        let shared = Arc::new((
            Mutex::new(Shared {
                queue: VecDeque::new(),
                queued_bytes: 0,
                counters: UploadCounters::default(),
                closing: false,
                give_up: false,
                in_flight: false,
                last_error: None,
            }),
            Condvar::new(),
        ));
        let worker_shared = shared.clone();
        let worker = thread::Builder::new()
            .name("pyperch-upload".into())
            .spawn(move || worker_loop(endpoint, settings, worker_shared, max_items.max(1)))
            .ok();
        Self { shared, worker, max_items: max_items.max(1), max_bytes }
    }

    /// Queues a profile; drops the oldest queued ones while over the bounds.
    pub fn push(&self, upload: Upload) {
        let (lock, cv) = &*self.shared;
        let Ok(mut s) = lock.lock() else { return };
        s.queued_bytes += upload.body.len();
        s.queue.push_back(upload);
        // The bound counts the profile being sent, too.
        while !s.queue.is_empty()
            && (s.queue.len() + usize::from(s.in_flight) > self.max_items
                || (s.queued_bytes > self.max_bytes && s.queue.len() > 1))
        {
            if let Some(old) = s.queue.pop_front() {
                s.queued_bytes -= old.body.len();
                s.counters.dropped += 1;
            }
        }
        cv.notify_all();
    }

    pub fn counters(&self) -> UploadCounters {
        let (lock, _) = &*self.shared;
        match lock.lock() {
            Ok(s) => UploadCounters {
                queued: s.queue.len() as u64 + u64::from(s.in_flight),
                queued_bytes: s.queued_bytes as u64,
                ..s.counters
            },
            Err(_) => UploadCounters::default(),
        }
    }

    pub fn last_error(&self) -> Option<String> {
        let (lock, _) = &*self.shared;
        lock.lock().ok().and_then(|mut s| s.last_error.take())
    }

    /// Tries to send what is queued within `timeout`, then stops the worker. Returns the
    /// final counters, where `queued` is the profiles left unsent (counted as dropped too). Returns by `timeout` plus a few
    /// milliseconds, whatever the endpoint does: a request still in flight then is abandoned
    /// with its thread (which ends by itself within [`UPLOAD_DEADLINE`], or with the process).
    pub fn finish(mut self, timeout: Duration) -> UploadCounters {
        let deadline = Instant::now() + timeout;
        {
            let (lock, cv) = &*self.shared;
            if let Ok(mut s) = lock.lock() {
                s.closing = true;
                cv.notify_all();
            }
        }
        loop {
            let left = self.counters().queued;
            if left == 0 || Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
        let mut last = UploadCounters::default();
        {
            let (lock, cv) = &*self.shared;
            if let Ok(mut s) = lock.lock() {
                s.give_up = true;
                let left = s.queue.len() as u64 + u64::from(s.in_flight);
                // The profile in flight, if any, is counted as dropped by the worker when its
                // attempt fails, or as sent if it succeeds after all.
                s.counters.dropped += s.queue.len() as u64;
                s.queue.clear();
                s.queued_bytes = 0;
                // The profile in flight is counted as dropped here (it cannot be waited for).
                last = UploadCounters { queued: left, queued_bytes: 0, ..s.counters };
                last.dropped += u64::from(s.in_flight);
                cv.notify_all();
            }
        }
        if let Some(w) = self.worker.take() {
            // A worker that is waiting ends at once; one in a request is not waited for.
            let until = Instant::now() + Duration::from_millis(200);
            while !w.is_finished() && Instant::now() < until {
                thread::sleep(Duration::from_millis(10));
            }
            if w.is_finished() {
                let _ = w.join();
            }
        }
        last
    }
}

fn worker_loop(
    endpoint: Endpoint,
    settings: ClientSettings,
    shared: Arc<(Mutex<Shared>, Condvar)>,
    max_items: usize,
) {
    let (lock, cv) = &*shared;
    let client = Client::with_settings(settings);
    let mut backoff = MIN_BACKOFF;
    // The last attempt was refused with 401/403 (logged once until an upload succeeds).
    let mut auth_failing = false;
    loop {
        // Take the oldest profile out of the queue while it is being sent, so that the
        // queue's bounds never drop (and count) a profile that is in flight.
        let next = {
            let Ok(mut s) = lock.lock() else { return };
            loop {
                if s.give_up {
                    return;
                }
                if let Some(front) = s.queue.pop_front() {
                    s.queued_bytes -= front.body.len();
                    s.in_flight = true;
                    break front;
                }
                if s.closing {
                    return;
                }
                s = match cv.wait(s) {
                    Ok(s) => s,
                    Err(_) => return,
                };
            }
        };
        let result = client.post_as(&endpoint.ingest_url(&next.params), endpoint.content_type(), &next.body);
        let Ok(mut s) = lock.lock() else { return };
        s.in_flight = false;
        match result {
            Ok(()) => {
                backoff = MIN_BACKOFF;
                s.counters.sent += 1;
                if auth_failing {
                    auth_failing = false;
                    eprintln!("pyperch agent: authentication accepted again: uploads resume");
                }
            }
            Err(e) if e.is_permanent() => {
                // Sending it again would be refused again: drop it and go on with the next.
                s.counters.rejected += 1;
                s.last_error = Some(e.to_string());
            }
            Err(e) => {
                s.counters.failed_attempts += 1;
                if e.is_auth() {
                    s.counters.auth_failures += 1;
                    if !auth_failing {
                        auth_failing = true;
                        eprintln!("pyperch agent: {e}; retrying with backoff");
                    }
                } else {
                    s.last_error = Some(e.to_string());
                }
                if s.give_up {
                    s.counters.dropped += 1;
                    return;
                }
                // Back to the front, unless newer profiles have filled the queue meanwhile.
                if s.queue.len() < max_items {
                    s.queued_bytes += next.body.len();
                    s.queue.push_front(next);
                } else {
                    s.counters.dropped += 1;
                }
                // Wait before retrying; a new profile or the close wakes us early.
                let (guard, _) = match cv.wait_timeout(s, backoff) {
                    Ok(r) => r,
                    Err(_) => return,
                };
                drop(guard);
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Pyroscope's profile type (`__name__`) of pyperch's CPU profiles. Pyroscope files a pprof
/// whose sample types name `cpu` (pyperch writes `samples/count` and `cpu/nanoseconds`) under
/// `process_cpu`, whose query-side id is `process_cpu:cpu:nanoseconds:cpu:nanoseconds`.
pub const PROFILE_TYPE_CPU: &str = "process_cpu";

/// Pyroscope's label naming the service (the `--app-name`).
pub const SERVICE_NAME: &str = "service_name";

/// Pyroscope's label naming the profile type.
pub const PROFILE_NAME: &str = "__name__";

/// The full series labels of one profile, as Pyroscope stores them: `__name__` (the profile
/// type, e.g. [`PROFILE_TYPE_CPU`]), `service_name` (`app`), then `labels` (process and
/// container labels) in order, any of them named `__name__` or `service_name` left out.
pub fn pyroscope_labels(app: &str, profile_type: &str, labels: &[(String, String)]) -> Vec<(String, String)> {
    let mut all = vec![
        (PROFILE_NAME.to_string(), profile_type.to_string()),
        (SERVICE_NAME.to_string(), app.to_string()),
    ];
    all.extend(labels.iter().filter(|(k, _)| k != PROFILE_NAME && k != SERVICE_NAME).cloned());
    all
}

/// The `name` query parameter of Pyroscope's `/ingest` for the series `labels` (from
/// [`pyroscope_labels`]): `<service_name>{key="value",...}`.
///
/// `service_name` is carried by the part before `{` and left out of the braces, and so is
/// `__name__`: Pyroscope's ingest handler sets `service_name` from that part and `__name__`
/// from the pprof's sample types (`cpu` → `process_cpu`), drops labels starting with `__`,
/// and rejects a series with a label name twice. No `.cpu` suffix is added (that convention
/// of the folded format would end up in `service_name`). Characters of the key syntax in a
/// value (`"`, `\`, `,`, `{`, `}`) become `_`.
pub fn pyroscope_name(labels: &[(String, String)]) -> String {
    let app = labels.iter().find(|(k, _)| k == SERVICE_NAME).map(|(_, v)| v.as_str()).unwrap_or("");
    let mut name = app.to_string();
    name.push('{');
    let rest = labels.iter().filter(|(k, _)| k != SERVICE_NAME && k != PROFILE_NAME);
    for (i, (k, v)) in rest.enumerate() {
        if i > 0 {
            name.push(',');
        }
        let v = v.replace(['"', '\\', ',', '{', '}'], "_");
        name.push_str(&format!("{k}=\"{v}\""));
    }
    name.push('}');
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_names() {
        let labels = pyroscope_labels(
            "app",
            PROFILE_TYPE_CPU,
            &[("container.id".into(), "ab\"c".into()), ("k8s.pod.uid".into(), "u".into())],
        );
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        assert_eq!(
            labels,
            vec![
                pair("__name__", "process_cpu"),
                pair("service_name", "app"),
                pair("container.id", "ab\"c"),
                pair("k8s.pod.uid", "u")
            ]
        );
        assert_eq!(pyroscope_name(&labels), "app{container.id=\"ab_c\",k8s.pod.uid=\"u\"}");
        // A caller's own service_name or __name__ never doubles Pyroscope's.
        let labels = pyroscope_labels("app", PROFILE_TYPE_CPU, &[pair("service_name", "x"), pair("__name__", "y")]);
        assert_eq!(labels.len(), 2);
        assert_eq!(pyroscope_name(&labels), "app{}");
    }

    #[test]
    fn upload_queue_is_bounded_and_counts_drops() {
        // Nothing listens on port 9 of 127.0.0.1 (discard is not running): uploads fail.
        let up = Uploader::start(Endpoint::parse("http://127.0.0.1:9").unwrap(), 3, 1 << 20);
        for i in 0..10 {
            up.push(Upload { params: vec![("n", i.to_string())], body: vec![0; 10] });
        }
        let c = up.counters();
        assert!(c.queued <= 3, "{c:?}");
        assert!(c.dropped >= 7, "{c:?}");
        let last = up.finish(Duration::from_millis(200));
        assert!(last.queued <= 3, "{last:?}");
        assert_eq!(last.sent, 0, "{last:?}");
        assert_eq!(last.dropped, 10, "{last:?}");
    }
}
