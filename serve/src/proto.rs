//! The code generated from `proto/` (Envoy's rate limit service v3 and what it imports).

#![allow(clippy::all, missing_docs, rustdoc::all)]

include!(concat!(env!("OUT_DIR"), "/protos.rs"));

pub use envoy::service::ratelimit::v3 as rls;
