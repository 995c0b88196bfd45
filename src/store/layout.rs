//! Which hash tag — and so which Redis Cluster slot — each shard's keys carry.
//!
//! A cluster's masters usually split the 16384 slots into equal contiguous ranges (that is
//! what `redis-cli --cluster create` and `sluice dev --cluster` do). Layout 1 named shards
//! `{s00}` .. `{s15}`, whose slots fall into four tight clusters: on 3 masters the 16 shards
//! spread 8/4/4, on 6 masters 4/4/0/4/4/0. Layout 2 picks each shard's tag so that its slot
//! lies near the middle of the shard's own 1/N of the slot space: N shards over M masters then
//! spread as evenly as they can (16 over 3: 5/6/5; over 6: 3/2/3/3/2/3), and a shard sits far
//! from a range boundary, so common splits never cut between a shard and its neighbours.
//!
//! The tags are found by a short deterministic search (the first `s<NN>.<k>` whose slot is
//! within the window), so every process and build computes the same ones; a test pins them.

/// A key layout: how shard tags are named, (from 3 on) how rows name their fields, and (from
/// 4 on) how executions are listed.
/// Recorded in the meta record at first start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `{s07}`: the first layout, kept readable for deployments that started with it (see
    /// `sluice migrate-layout`).
    Legacy = 1,
    /// `{s07.<k>}`: slot-aligned tags (this module's comment).
    SlotAligned = 2,
    /// The tags of layout 2, and compact rows: short field names, defaults not stored (see
    /// `domain::row`). Reached from 1 or 2 by `sluice migrate-layout`, which converts each
    /// shard's rows.
    Compact = 3,
    /// The tags and rows of layout 3, and one listing per tenant (`Shard::listing`: one
    /// member per execution) instead of a status index and a flow index each. Reached from
    /// 1, 2 or 3 by `sluice migrate-layout`, which builds each tenant's listing from its old
    /// indexes.
    Listing = 4,
    /// The tags, rows and listing of layout 4 with execution ids stored as their 16 bytes in
    /// every key and member that holds one (`Shard::stored_id`; the plan is
    /// `docs/layout-5-plan.md` on branch `layout5-plan`, of which this is step 2). Reached only
    /// by a fresh Redis whose first start is told to record it (`--initial-layout 5`, a test
    /// and benchmark switch): no migration to it exists yet, so it is not `CURRENT`.
    Binary = 5,
}

impl Layout {
    /// The layout new deployments get.
    pub const CURRENT: Layout = Layout::Listing;

    /// The layout recorded as `number`, if this build knows it.
    pub fn from_number(number: u32) -> Option<Self> {
        match number {
            1 => Some(Layout::Legacy),
            2 => Some(Layout::SlotAligned),
            3 => Some(Layout::Compact),
            4 => Some(Layout::Listing),
            5 => Some(Layout::Binary),
            _ => None,
        }
    }

    /// Whether this build can serve a Redis recorded at this layout (or convert it): every
    /// layout up to `CURRENT`, and `Binary`, which a fresh Redis records when its first start
    /// is told to (`StoreConfig::initial_layout`) and which is served as it is, never
    /// converted (`sluice migrate-layout` targets `CURRENT` and refuses it: `convertible`).
    pub fn servable(self) -> bool {
        self.number() <= Layout::CURRENT.number() || self == Layout::Binary
    }

    /// Whether `sluice migrate-layout` can bring a Redis at this layout to `CURRENT`: the
    /// layouts up to it (never down from `Binary`).
    pub fn convertible(self) -> bool {
        self.number() <= Layout::CURRENT.number()
    }

    /// Whether this layout's shard tags are those of layout 2 (so a move to 3 renames no key).
    pub fn slot_aligned(self) -> bool {
        self != Layout::Legacy
    }

    /// The number recorded in the meta record.
    pub fn number(self) -> u32 {
        self as u32
    }

    /// The hash tag (without braces) of shard `n` when `count` shards are hashed to. Shards
    /// from `count` on are dedicated (a pinned tenant has one to itself).
    pub fn tag(self, n: u16, count: u16) -> String {
        match self {
            Layout::Legacy => format!("s{n:02}"),
            Layout::SlotAligned | Layout::Compact | Layout::Listing | Layout::Binary
                if n < count =>
            {
                aligned_tag(n, count)
            }
            Layout::SlotAligned | Layout::Compact | Layout::Listing | Layout::Binary => {
                dedicated_tag(n, count)
            }
        }
    }
}

/// Slots in a Redis Cluster.
pub const SLOTS: u32 = 16_384;

/// The cluster slot of a key whose hash tag is `tag` (CRC16/XMODEM mod 16384, as Redis).
pub fn slot_of_tag(tag: &str) -> u16 {
    crc16(tag.as_bytes()) % SLOTS as u16
}

/// The first `s<NN>.<k>` whose slot lies within 1/8 of a shard's width of the middle of shard
/// `n`'s own range of slots.
fn aligned_tag(n: u16, count: u16) -> String {
    let count = u32::from(count.max(1));
    let middle = (2 * u32::from(n) + 1) * SLOTS / (2 * count);
    search(n, middle, (SLOTS / (8 * count)).max(1))
}

/// Dedicated shard `n` (`n >= count`) shares the range of hashed shard `(n - count) % count`,
/// a quarter of a range away from its middle: on the same master by default (an operator moves
/// it where the hot tenant should run, with `sluice cluster move-shard`), never in the slot of
/// a hashed shard (their windows do not meet).
fn dedicated_tag(n: u16, count: u16) -> String {
    let host = u32::from((n - count) % count.max(1));
    let count = u32::from(count.max(1));
    let middle = (2 * host + 1) * SLOTS / (2 * count) + SLOTS / (4 * count);
    search(n, middle, (SLOTS / (16 * count)).max(1))
}

/// The first `s<NN>.<k>` whose slot is within `window` of `middle`.
fn search(n: u16, middle: u32, window: u32) -> String {
    // Bounded: a window of w slots is hit after about 16384 / (2w + 1) tries.
    for k in 0..10_000_000u32 {
        let tag = format!("s{n:02}.{k}");
        if u32::from(slot_of_tag(&tag)).abs_diff(middle) <= window {
            return tag;
        }
    }
    unreachable!("CRC16 reaches every slot")
}

/// CRC16/XMODEM (polynomial 0x1021, initial 0), the hash Redis Cluster uses for key slots.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shards per master when `masters` masters split the slots evenly (as `redis-cli
    /// --cluster create` does).
    fn spread(layout: Layout, shards: u16, masters: u32) -> Vec<u32> {
        let mut per = vec![0; masters as usize];
        for n in 0..shards {
            let slot = u32::from(slot_of_tag(&layout.tag(n, shards)));
            let m = (0..masters)
                .rev()
                .find(|m| slot >= m * SLOTS / masters)
                .unwrap();
            per[m as usize] += 1;
        }
        per
    }

    #[test]
    fn crc16_matches_redis() {
        // Redis's own reference values (CLUSTER KEYSLOT): "123456789" is the CRC16/XMODEM
        // check value 0x31C3, and `foo` is in slot 12182.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot_of_tag("foo"), 12_182);
        assert_eq!(slot_of_tag("s00"), 12_958);
        assert_eq!(slot_of_tag("s07"), 633);
    }

    #[test]
    fn legacy_tags_crowd_some_masters() {
        assert_eq!(spread(Layout::Legacy, 16, 3), vec![8, 4, 4]);
        assert_eq!(spread(Layout::Legacy, 16, 6), vec![4, 4, 0, 4, 4, 0]);
    }

    #[test]
    fn slot_aligned_tags_spread_shards_evenly_over_common_cluster_sizes() {
        for masters in 1..=16u32 {
            let per = spread(Layout::SlotAligned, 16, masters);
            let (min, max) = (per.iter().min().unwrap(), per.iter().max().unwrap());
            assert!(max - min <= 1, "16 shards on {masters} masters: {per:?}");
        }
        assert_eq!(spread(Layout::SlotAligned, 16, 3), vec![5, 6, 5]);
        for masters in [3, 4, 6, 8] {
            let per = spread(Layout::SlotAligned, 64, masters);
            let (min, max) = (per.iter().min().unwrap(), per.iter().max().unwrap());
            assert!(max - min <= 1, "64 shards on {masters} masters: {per:?}");
        }
    }

    #[test]
    fn slot_aligned_tags_are_pinned() {
        // A change would move every deployment's keys away from where they are.
        let tags: Vec<String> = (0..4).map(|n| Layout::SlotAligned.tag(n, 16)).collect();
        assert_eq!(tags, PINNED_FIRST_FOUR);
        for n in 0..16 {
            let tag = Layout::SlotAligned.tag(n, 16);
            assert!(tag.starts_with(&format!("s{n:02}.")), "{tag}");
            assert!(!tag.contains(['{', '}', ':']), "{tag}");
        }
    }

    #[test]
    fn layout_5_is_served_but_not_current_or_converted() {
        assert_eq!(Layout::from_number(5), Some(Layout::Binary));
        assert_eq!(Layout::Binary.number(), 5);
        assert!(Layout::Binary.servable());
        assert!(!Layout::Binary.convertible());
        assert_ne!(Layout::CURRENT, Layout::Binary);
        for n in 1..=4 {
            let l = Layout::from_number(n).unwrap();
            assert!(l.servable() && l.convertible(), "{n}");
        }
        assert_eq!(Layout::from_number(6), None);
        // Its tags are layout 2's: the ids change, not the shards.
        assert_eq!(Layout::Binary.tag(3, 16), Layout::Listing.tag(3, 16));
        assert_eq!(Layout::Binary.tag(17, 16), Layout::Listing.tag(17, 16));
    }

    const PINNED_FIRST_FOUR: [&str; 4] = ["s00.164", "s01.21", "s02.19", "s03.12"];

    #[test]
    fn dedicated_shards_never_share_a_slot_with_another_shard() {
        for (count, dedicated) in [(16u16, 4u16), (16, 16), (8, 4), (64, 8)] {
            let slots: std::collections::HashSet<u16> = (0..count + dedicated)
                .map(|n| slot_of_tag(&Layout::SlotAligned.tag(n, count)))
                .collect();
            assert_eq!(
                slots.len(),
                usize::from(count + dedicated),
                "{count}+{dedicated}"
            );
        }
    }
}
