//! Pushing profiles to a Pyroscope-compatible ingest endpoint, for `pyperch agent`.
//!
//! Uploads run on their own thread behind a bounded queue: when the backend is down or slow,
//! the queue keeps at most `max_items` profiles and `max_bytes` bytes, dropping the oldest
//! first and counting them, so memory stays bounded however long the outage lasts. Each
//! upload is retried with exponential backoff until it succeeds or is pushed out.
//!
//! Only plain `http://` endpoints are supported (a node-local or in-cluster ingest; put a
//! TLS-terminating proxy in front for anything else).

use std::{
    collections::VecDeque,
    io::{BufRead, BufReader, Read, Write},
    net::{TcpStream, ToSocketAddrs},
    sync::{Arc, Condvar, Mutex},
    thread,
    time::{Duration, Instant},
};

#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("the upload URL must start with http:// (got {0}); https is not supported, use a local proxy")]
    Scheme(String),
    #[error("the upload URL {0} has no host")]
    NoHost(String),
    #[error("cannot reach {address}: {source}")]
    Connect { address: String, source: std::io::Error },
    #[error("the ingest endpoint answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("the ingest endpoint sent a malformed response")]
    Malformed,
    #[error("network error: {0}")]
    Io(#[from] std::io::Error),
}

/// A parsed `http://host:port/base` endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash ("" for the root).
    pub base_path: String,
}

impl Endpoint {
    pub fn parse(url: &str) -> Result<Self, UploadError> {
        let rest = url.strip_prefix("http://").ok_or_else(|| UploadError::Scheme(url.to_string()))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(UploadError::NoHost(url.to_string()));
        }
        let bad = || UploadError::NoHost(url.to_string());
        let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
            let (host, after) = rest.split_once(']').ok_or_else(bad)?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| bad())?,
                None => 80,
            };
            (host.to_string(), port)
        } else if let Some((host, port)) = authority.rsplit_once(':') {
            (host.to_string(), port.parse().map_err(|_| bad())?)
        } else {
            (authority.to_string(), 80)
        };
        if host.is_empty() {
            return Err(bad());
        }
        Ok(Self { host, port, base_path: path.trim_end_matches('/').to_string() })
    }
}

/// One profile to push: the ingest query (already encoded) and the pprof bytes.
#[derive(Clone, Debug)]
pub struct Upload {
    /// `name=...&from=...&until=...&format=pprof`, percent-encoded.
    pub query: String,
    pub body: Vec<u8>,
}

/// Counts of the uploader, for status lines and `--stats`.
#[derive(Clone, Copy, Debug, Default)]
pub struct UploadCounters {
    pub sent: u64,
    pub failed_attempts: u64,
    /// Profiles dropped because the queue was full (oldest first).
    pub dropped: u64,
    pub queued: u64,
    pub queued_bytes: u64,
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

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const IO_TIMEOUT: Duration = Duration::from_secs(20);
const MIN_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

impl Uploader {
    pub fn start(endpoint: Endpoint, max_items: usize, max_bytes: usize) -> Self {
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
            .spawn(move || worker_loop(endpoint, worker_shared, max_items.max(1)))
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
    /// profiles still unsent.
    pub fn finish(mut self, timeout: Duration) -> u64 {
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
        let left = self.counters().queued;
        {
            let (lock, cv) = &*self.shared;
            if let Ok(mut s) = lock.lock() {
                s.give_up = true;
                s.counters.dropped += s.queue.len() as u64;
                s.queue.clear();
                s.queued_bytes = 0;
                cv.notify_all();
            }
        }
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        left
    }
}

fn worker_loop(endpoint: Endpoint, shared: Arc<(Mutex<Shared>, Condvar)>, max_items: usize) {
    let (lock, cv) = &*shared;
    let mut backoff = MIN_BACKOFF;
    loop {
        // Take the oldest profile out of the queue while it is being sent, so that the
        // queue's bounds never drop (and count) a profile that is in flight.
        let next = {
            let Ok(mut s) = lock.lock() else { return };
            loop {
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
        let result = post(&endpoint, &next);
        let Ok(mut s) = lock.lock() else { return };
        s.in_flight = false;
        match result {
            Ok(()) => {
                backoff = MIN_BACKOFF;
                s.counters.sent += 1;
            }
            Err(e) => {
                s.counters.failed_attempts += 1;
                s.last_error = Some(e.to_string());
                if s.closing && s.queue.is_empty() && s.give_up {
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

/// One `POST {base}/ingest?{query}` with the pprof body; Ok on any 2xx.
pub fn post(endpoint: &Endpoint, upload: &Upload) -> Result<(), UploadError> {
    let address = format!("{}:{}", endpoint.host, endpoint.port);
    let addrs: Vec<_> = address
        .to_socket_addrs()
        .map_err(|source| UploadError::Connect { address: address.clone(), source })?
        .collect();
    let mut last = None;
    let mut stream = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let mut stream = stream.ok_or_else(|| UploadError::Connect {
        address: address.clone(),
        source: last.unwrap_or_else(|| std::io::Error::other("no address")),
    })?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let head = format!(
        "POST {}/ingest?{} HTTP/1.1\r\nHost: {}\r\nUser-Agent: pyperch/{}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        endpoint.base_path,
        upload.query,
        address,
        env!("CARGO_PKG_VERSION"),
        upload.body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(&upload.body)?;
    stream.flush()?;
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line)?;
    let status: u16 = status_line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or(UploadError::Malformed)?;
    if (200..300).contains(&status) {
        return Ok(());
    }
    let mut body = String::new();
    let _ = reader.take(4096).read_to_string(&mut body);
    let body = body.split("\r\n\r\n").nth(1).unwrap_or("").trim().chars().take(200).collect();
    Err(UploadError::Status { status, body })
}

/// Percent-encodes a query component.
pub fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The Pyroscope application name with labels: `app{key="value",...}`.
pub fn pyroscope_name(app: &str, labels: &[(String, String)]) -> String {
    let mut name = app.to_string();
    name.push('{');
    for (i, (k, v)) in labels.iter().enumerate() {
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
    fn endpoints() {
        assert_eq!(
            Endpoint::parse("http://pyroscope:4040").unwrap(),
            Endpoint { host: "pyroscope".into(), port: 4040, base_path: "".into() }
        );
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:9/base/").unwrap(),
            Endpoint { host: "127.0.0.1".into(), port: 9, base_path: "/base".into() }
        );
        assert_eq!(Endpoint::parse("http://host").unwrap().port, 80);
        assert!(matches!(Endpoint::parse("https://host"), Err(UploadError::Scheme(_))));
        assert!(matches!(Endpoint::parse("http:///x"), Err(UploadError::NoHost(_))));
    }

    #[test]
    fn names_and_encoding() {
        let n = pyroscope_name("app", &[("container.id".into(), "ab\"c".into()), ("k8s.pod.uid".into(), "u".into())]);
        assert_eq!(n, "app{container.id=\"ab_c\",k8s.pod.uid=\"u\"}");
        assert_eq!(encode_component("a{b=\"c\"}"), "a%7Bb%3D%22c%22%7D");
    }

    #[test]
    fn queue_is_bounded_and_counts_drops() {
        // Nothing listens on port 9 of 127.0.0.1 (discard is not running): uploads fail.
        let up = Uploader::start(Endpoint::parse("http://127.0.0.1:9").unwrap(), 3, 1 << 20);
        for i in 0..10 {
            up.push(Upload { query: format!("n={i}"), body: vec![0; 10] });
        }
        let c = up.counters();
        assert!(c.queued <= 3, "{c:?}");
        assert!(c.dropped >= 7, "{c:?}");
        let left = up.finish(Duration::from_millis(200));
        assert!(left <= 3);
    }
}
