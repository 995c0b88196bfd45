//! The label sets of sluice's metric families. Every value comes from a closed set (see the
//! module docs of `http::metrics`): route templates, known methods, shard labels, at most
//! `--metrics-tenant-limit` tenant ids, fixed event and state names.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct AdmissionLabels {
    pub(super) tenant: String,
    pub(super) outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RejectionLabels {
    pub(super) tenant: String,
    pub(super) reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RequestLabels {
    pub(super) method: &'static str,
    pub(super) route: String,
    pub(super) status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ShardLabels {
    pub(super) shard: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ShardEventLabels {
    pub(super) shard: String,
    pub(super) event: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TenantLabels {
    pub(super) tenant: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TenantStateLabels {
    pub(super) tenant: String,
    pub(super) state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TenantEventLabels {
    pub(super) tenant: String,
    pub(super) event: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TenantQuantileLabels {
    pub(super) tenant: String,
    pub(super) quantile: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ShardQuantileLabels {
    pub(super) shard: String,
    pub(super) quantile: &'static str,
}

pub(super) fn latency_histogram() -> Histogram {
    // 1 ms to ~16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}
