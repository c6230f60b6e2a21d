//! The body of Pyroscope's push API (`POST /push.v1.PusherService/Push`, Connect unary,
//! protobuf): a `push.v1.PushRequest` holding one series per profile.
//!
//! The messages mirror Pyroscope's api/push/v1/push.proto and api/types/v1/types.proto
//! (field numbers checked against them); only the fields pyperch sends are declared.

use std::io::Read;

/// `push.v1.PushRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PushRequest {
    #[prost(message, repeated, tag = "1")]
    pub series: Vec<RawProfileSeries>,
}

/// `push.v1.RawProfileSeries`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawProfileSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<LabelPair>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<RawSample>,
}

/// `types.v1.LabelPair`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LabelPair {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `push.v1.RawSample`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawSample {
    /// A pprof profile (gzipped or not: Pyroscope accepts both).
    #[prost(bytes = "vec", tag = "1")]
    pub raw_profile: Vec<u8>,
    /// A unique ID of the profile (a UUID).
    #[prost(string, tag = "2")]
    pub id: String,
}

/// The Content-Type of a Connect unary call with a protobuf body.
pub const CONTENT_TYPE: &str = "application/proto";
/// The path of the push call, under the endpoint's base path.
pub const PUSH_PATH: &str = "/push.v1.PusherService/Push";

/// A label name as Pyroscope's validation accepts it (`[a-zA-Z_][a-zA-Z0-9_]*`): every other
/// character becomes `_` (`process.pid` is sent as `process_pid`).
pub fn label_name(name: &str) -> String {
    let mut out: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// The encoded `PushRequest` of one pprof with its labels: `__name__` = `profile_type`,
/// `service_name` = `app`, then `labels` (names made valid by [`label_name`]), sorted by name
/// as Prometheus-style label sets are, without duplicates (the first wins).
pub fn push_body(profile_type: &str, app: &str, labels: &[(String, String)], pprof: Vec<u8>) -> Vec<u8> {
    let mut pairs: Vec<LabelPair> = vec![
        LabelPair { name: "__name__".into(), value: profile_type.into() },
        LabelPair { name: "service_name".into(), value: app.into() },
    ];
    for (k, v) in labels {
        let name = label_name(k);
        if !pairs.iter().any(|p| p.name == name) {
            pairs.push(LabelPair { name, value: v.clone() });
        }
    }
    pairs.sort_by(|a, b| a.name.cmp(&b.name));
    let request = PushRequest {
        series: vec![RawProfileSeries { labels: pairs, samples: vec![RawSample { raw_profile: pprof, id: uuid_v4() }] }],
    };
    prost::Message::encode_to_vec(&request)
}

/// A random (version 4) UUID from /dev/urandom; if that cannot be read, one from the time
/// and a counter (unique within this process, which is all the ID needs).
fn uuid_v4() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut b = [0u8; 16];
    let random = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_ok();
    if !random {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        b[..8].copy_from_slice(&(nanos as u64).to_le_bytes());
        b[8..].copy_from_slice(&(COUNTER.fetch_add(1, Ordering::Relaxed) ^ u64::from(std::process::id()) << 32).to_le_bytes());
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn upload_push_body_round_trips() {
        let labels = vec![("process.pid".to_string(), "42".to_string()), ("container.id".to_string(), "c".to_string())];
        let body = push_body("process_cpu", "app", &labels, vec![1, 2, 3]);
        let req = PushRequest::decode(&body[..]).unwrap();
        assert_eq!(req.series.len(), 1);
        let names: Vec<(&str, &str)> = req.series[0].labels.iter().map(|l| (l.name.as_str(), l.value.as_str())).collect();
        assert_eq!(
            names,
            [("__name__", "process_cpu"), ("container_id", "c"), ("process_pid", "42"), ("service_name", "app")]
        );
        assert_eq!(req.series[0].samples[0].raw_profile, [1, 2, 3]);
        let id = &req.series[0].samples[0].id;
        assert_eq!((id.len(), &id[14..15]), (36, "4"), "{id}");
        // Field numbers: series = 1 (0x0a), labels = 1 (0x0a), samples = 2 (0x12).
        assert_eq!(body[0], 0x0a);
        assert_eq!(label_name("9a.b-c"), "_9a_b_c");
    }
}
