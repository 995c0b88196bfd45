//! The workers' journal: the `start` and `end` lines the `demo.journal` flow appends for each
//! run, read back as runs (`Run`), each with the interval in which it could prove it held
//! its lease (`Run::effective`). The fault lanes and the clients read it during the chaos to
//! aim their faults, cancels and retries; the checker reads it at the end. Also `rel`, how
//! the checker and the report show a journal time (from the start of the test).

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use super::LEASE_TTL_MS;

/// One run of a handler, from its `start` line and (if written) its `end` line.
#[derive(Debug, Clone)]
pub(super) struct Run {
    pub(super) id: String,
    pub(super) tenant: String,
    pub(super) fence: u64,
    pub(super) attempt: u64,
    pub(super) pid: u32,
    pub(super) start: u64,
    pub(super) end: Option<RunEnd>,
}

#[derive(Debug, Clone)]
pub(super) struct RunEnd {
    pub(super) t: u64,
    pub(super) lease_deadline: u64,
    pub(super) how: String,
}

impl Run {
    /// `[start, end)` in which this run could prove it held the lease (empty: `end <= start`).
    pub(super) fn effective(&self, gone: &HashMap<u32, u64>) -> (u64, u64) {
        let end = match &self.end {
            Some(e) => e.t.min(e.lease_deadline),
            None => gone
                .get(&self.pid)
                .copied()
                .unwrap_or(u64::MAX)
                .min(self.start + LEASE_TTL_MS),
        };
        (self.start, end.max(self.start))
    }

    pub(super) fn describe(&self, gone: &HashMap<u32, u64>, t0: u64) -> String {
        let (s, e) = self.effective(gone);
        let how = self.end.as_ref().map_or("no end", |e| e.how.as_str());
        format!(
            "fence {} attempt {} pid {} [{}, {}) {how}",
            self.fence,
            self.attempt,
            self.pid,
            rel(s, t0),
            rel(e, t0)
        )
    }
}

/// The journal: runs in start order, and lines that did not parse or match.
pub(super) struct Journal {
    pub(super) runs: Vec<Run>,
    pub(super) bad_lines: Vec<String>,
}

pub(super) fn read_journal(path: &Path) -> Journal {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut runs: Vec<Run> = Vec::new();
    let mut open: HashMap<(String, u64, u32), Vec<usize>> = HashMap::new();
    let mut bad_lines = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            bad_lines.push(line.to_owned());
            continue;
        };
        let (Some(ev), Some(id), Some(fence), Some(pid), Some(t)) = (
            v["ev"].as_str(),
            v["id"].as_str(),
            v["fence"].as_u64(),
            v["pid"].as_u64(),
            v["t"].as_u64(),
        ) else {
            bad_lines.push(line.to_owned());
            continue;
        };
        let key = (id.to_owned(), fence, pid as u32);
        match ev {
            "start" => {
                open.entry(key).or_default().push(runs.len());
                runs.push(Run {
                    id: id.to_owned(),
                    tenant: v["tenant"].as_str().unwrap_or_default().to_owned(),
                    fence,
                    attempt: v["attempt"].as_u64().unwrap_or(0),
                    pid: pid as u32,
                    start: t,
                    end: None,
                });
            }
            "end" => {
                let slot = open.get_mut(&key).filter(|v| !v.is_empty());
                let Some(waiting) = slot else {
                    bad_lines.push(format!("end without start: {line}"));
                    continue;
                };
                let i = waiting.remove(0);
                runs[i].end = Some(RunEnd {
                    t,
                    lease_deadline: v["lease_deadline"].as_u64().unwrap_or(0),
                    how: v["how"].as_str().unwrap_or("?").to_owned(),
                });
            }
            _ => bad_lines.push(line.to_owned()),
        }
    }
    Journal { runs, bad_lines }
}

/// Runs without an `end` line whose worker is still alive.
pub(super) fn open_runs(j: &Journal, gone: &HashMap<u32, u64>) -> usize {
    j.runs
        .iter()
        .filter(|r| r.end.is_none() && !gone.contains_key(&r.pid))
        .count()
}

/// `+12.345s` relative to the start of the test.
pub(super) fn rel(ms: u64, t0: u64) -> String {
    if ms == u64::MAX {
        return "∞".into();
    }
    format!("+{:.3}s", (ms as f64 - t0 as f64) / 1000.0)
}
