//! `--compare-standalone`: the standalone and cluster reports of the same settings side by
//! side, with a table of the numbers that matter for the comparison.

use std::fmt::Write;

use serde::Serialize;

use super::{Phase, Report};

/// Standalone and cluster runs of the same settings, side by side (`--compare-standalone`).
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub standalone: Report,
    pub cluster: Report,
}

impl Comparison {
    /// Both reports, then the table of the numbers that matter for the comparison.
    pub fn human(&self) -> String {
        let mut o = String::new();
        o.push_str(&self.standalone.human());
        o.push_str(&self.cluster.human());
        let masters = self.cluster.settings.cluster_masters.unwrap_or(0);
        let rate = |p: Option<&Phase>| p.map_or("-".to_owned(), |p| format!("{:.0}", p.per_sec));
        let per_master = |p: Option<&Phase>| {
            p.and_then(|p| p.per_master.as_ref()).map_or_else(
                || "-".to_owned(),
                |v| {
                    v.iter()
                        .map(|m| format!("{:.0}", m.per_sec))
                        .collect::<Vec<_>>()
                        .join(" / ")
                },
            )
        };
        let e2e = |r: &Report| {
            r.e2e
                .as_ref()
                .map_or("-".to_owned(), |e| format!("{:.0}", e.per_sec))
        };
        let (s, c) = (&self.standalone, &self.cluster);
        let _ = writeln!(
            o,
            "standalone vs cluster ({masters} masters), one session on this machine:\n"
        );
        let _ = writeln!(o, "  {:<34} {:>12} {:>24}", "", "standalone", "cluster");
        let rows = [
            (
                "ceiling admissions/s",
                rate(s.ceiling.as_ref()),
                rate(c.ceiling.as_ref()),
            ),
            (
                "  per master",
                rate(s.ceiling.as_ref()),
                per_master(c.ceiling.as_ref()),
            ),
            (
                "HTTP admissions/s",
                rate(s.admission.as_ref()),
                rate(c.admission.as_ref()),
            ),
            (
                "  per master",
                rate(s.admission.as_ref()),
                per_master(c.admission.as_ref()),
            ),
            ("e2e completed/s", e2e(s), e2e(c)),
        ];
        for (name, a, b) in rows {
            let _ = writeln!(o, "  {name:<34} {a:>12} {b:>24}");
        }
        let _ = writeln!(
            o,
            "\nRESULT: standalone {}, cluster {}\n",
            if s.correct {
                "correct"
            } else {
                "CORRECTNESS CHECK FAILED"
            },
            if c.correct {
                "correct"
            } else {
                "CORRECTNESS CHECK FAILED"
            }
        );
        o
    }
}
