//! How a worker shares its slots between shards: a smooth weighted round robin over each
//! shard's eligible weight (the sum of the weights of its tenants that can start something, as
//! the shard's scripts answer it). `sluice worker` gives each freed slot to the shard it picks
//! (`launch.rs`); `serve` picks the shards of each pull lease with it too (`crate::pull`), so
//! both kinds of worker give tenants of different shards the same fair share.
//!
//! The tenants of one shard share by weight inside the shard's scripts (virtual time); this
//! only decides which shard a start goes to.

use std::collections::HashMap;

use crate::store::Shard;

/// The round robin's state: each shard's credit. Each pick adds every candidate's weight to
/// its credit and takes the candidate with the largest (the lowest shard number on a tie),
/// which then pays the candidates' total weight. With constant weights and candidates, a
/// shard's credit stays between minus and plus the total weight, so its picks are within one
/// of its share from the first pick on, and within two over any stretch of picks. A shard that
/// is no candidate (nothing runnable) keeps no credit: none is banked while it is idle.
#[derive(Debug, Default)]
pub struct ShardShare {
    credits: HashMap<Shard, i64>,
}

impl ShardShare {
    /// Picks one of `candidates` (shard, weight; weights of 0 or less are left out) in
    /// proportion to the weights; `None` when none has a weight.
    pub fn pick(&mut self, candidates: &[(Shard, i64)]) -> Option<Shard> {
        let candidates: Vec<(Shard, i64)> =
            candidates.iter().copied().filter(|(_, w)| *w > 0).collect();
        if candidates.is_empty() {
            return None;
        }
        let total: i64 = candidates.iter().map(|(_, w)| *w).sum();
        let mut best: Option<(Shard, i64)> = None;
        for (s, w) in &candidates {
            let c = self.credits.entry(*s).or_insert(0);
            *c += w;
            if best.is_none_or(|(b, bc)| *c > bc || (*c == bc && s.number() < b.number())) {
                best = Some((*s, *c));
            }
        }
        let (picked, _) = best?;
        *self.credits.entry(picked).or_insert(0) -= total;
        // Credits of shards that are not candidates now are forgotten: no credit is banked
        // while a shard has nothing to run.
        self.credits
            .retain(|s, _| candidates.iter().any(|(c, _)| c == s));
        Some(picked)
    }

    /// Takes back one pick of `shard` made among `candidates` that was not served (the shard
    /// started less than it was picked for): the credits are as if that pick never happened,
    /// so a shard that turned out to have nothing is not charged for it, and the others'
    /// shares are not moved by it.
    pub fn unpick(&mut self, candidates: &[(Shard, i64)], shard: Shard) {
        let total: i64 = candidates.iter().map(|(_, w)| *w).filter(|w| *w > 0).sum();
        for (s, w) in candidates.iter().filter(|(_, w)| *w > 0) {
            if let Some(c) = self.credits.get_mut(s) {
                *c -= w;
            }
        }
        if let Some(c) = self.credits.get_mut(&shard) {
            *c += total;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Layout, ShardMap};

    fn shards() -> Vec<Shard> {
        ShardMap::new(16, Layout::SlotAligned).all().collect()
    }

    /// Among constant candidates each shard's count is within one of its share from the first
    /// pick on (the bound the pull API's fairness test relies on), and within two over any
    /// stretch of picks.
    #[test]
    fn every_stretch_of_picks_is_within_one_of_each_share() {
        let s = shards();
        for weights in [
            vec![3, 1],
            vec![1, 1],
            vec![5, 3, 1],
            vec![1000, 1],
            vec![2, 7, 7],
        ] {
            let candidates: Vec<(Shard, i64)> = s.iter().copied().zip(weights.clone()).collect();
            let total: i64 = weights.iter().sum();
            let mut share = ShardShare::default();
            let picks: Vec<Shard> = (0..600).map(|_| share.pick(&candidates).unwrap()).collect();
            for start in 0..picks.len() {
                for end in start + 1..=picks.len().min(start + 200) {
                    for (shard, w) in &candidates {
                        let got = picks[start..end].iter().filter(|p| *p == shard).count() as f64;
                        let due = (end - start) as f64 * *w as f64 / total as f64;
                        assert!(
                            (got - due).abs() < 2.0,
                            "{weights:?}: picks {start}..{end} gave {shard:?} {got}, due {due}"
                        );
                    }
                }
                // From the start, within one.
                for (shard, w) in &candidates {
                    let got = picks[..start + 1].iter().filter(|p| *p == shard).count() as f64;
                    let due = (start + 1) as f64 * *w as f64 / total as f64;
                    assert!(
                        (got - due).abs() < 1.0,
                        "{weights:?} after {start}: {got} {due}"
                    );
                }
            }
        }
    }

    /// A pick taken back leaves the credits as they were, so unserved picks (a shard that had
    /// less than it was picked for) move nobody's share.
    #[test]
    fn an_unpicked_pick_leaves_no_trace() {
        let s = shards();
        let candidates = [(s[0], 3), (s[1], 1), (s[2], 1)];
        let mut with = ShardShare::default();
        let mut without = ShardShare::default();
        for i in 0..50 {
            let a = with.pick(&candidates).unwrap();
            let b = without.pick(&candidates).unwrap();
            assert_eq!(a, b, "pick {i}");
            if i % 7 == 3 {
                let extra = with.pick(&candidates).unwrap();
                with.unpick(&candidates, extra);
            }
        }
        assert_eq!(with.credits, without.credits);
    }
}
