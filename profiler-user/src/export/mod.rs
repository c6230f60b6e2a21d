//! Sending profiles over the network: the agent's uploads (Pyroscope-style HTTP ingest and
//! OTLP), with TLS, credentials, proxies and retries.

pub mod upload;
