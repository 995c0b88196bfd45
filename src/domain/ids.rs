//! Validated identifiers. Each type can only be built through `parse`, so inside sluice a
//! `TenantId` or `FlowId` is always safe to place in a Redis key: none of them can contain a
//! brace (which would change the hash tag), a colon (the key separator), spaces or control
//! characters.

use std::fmt;

use serde::{Serialize, Serializer};
use uuid::Uuid;

/// Why a piece of input was refused; the HTTP layer turns it into a 400 with this `code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidInput {
    /// Stable machine code, e.g. `invalid_tenant_id`.
    pub code: &'static str,
    /// Human explanation naming the rule that was broken.
    pub detail: String,
}

impl InvalidInput {
    fn new(code: &'static str, detail: impl Into<String>) -> Self {
        Self {
            code,
            detail: detail.into(),
        }
    }
}

/// `bytes` in lowercase hex, as `hex::encode` writes them, from a table into a string sized
/// once (`hex::encode` collects an iterator of chars, some 25 instructions a character; an
/// admission hexes its dedup digest and its fingerprint).
pub(crate) fn lower_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

fn is_key_safe_word(s: &str, extra: &[char]) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
}

macro_rules! string_newtype {
    ($name:ident) => {
        impl $name {
            /// The validated text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }
    };
}

/// A tenant: `^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`. The isolation unit; always derived from the
/// caller's credentials.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TenantId(String);
string_newtype!(TenantId);

impl TenantId {
    /// Parses a tenant id, refusing anything that could break out of a Redis key segment.
    pub fn parse(s: &str) -> Result<Self, InvalidInput> {
        if s.len() <= 64 && is_key_safe_word(s, &['_', '.', '-']) {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidInput::new(
                "invalid_tenant_id",
                "tenant id must match ^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
            ))
        }
    }
}

/// A flow name: `^[A-Za-z0-9][A-Za-z0-9_./-]{0,127}$` (e.g. `demo.sleep`, `billing/invoice`).
/// It is part of index key names, hence the narrow alphabet.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FlowId(String);
string_newtype!(FlowId);

impl FlowId {
    /// Parses a flow id.
    pub fn parse(s: &str) -> Result<Self, InvalidInput> {
        if s.len() <= 128 && is_key_safe_word(s, &['_', '.', '-', '/']) {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidInput::new(
                "invalid_flow_id",
                "flow_id must be 1-128 characters matching ^[A-Za-z0-9][A-Za-z0-9_./-]*$",
            ))
        }
    }
}

/// A flow version: 1–64 characters of UTF-8 without control characters. Never part of a key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Version(String);
string_newtype!(Version);

impl Version {
    /// Parses a version label.
    pub fn parse(s: &str) -> Result<Self, InvalidInput> {
        if !s.is_empty() && s.chars().count() <= 64 && !s.chars().any(char::is_control) {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidInput::new(
                "invalid_version",
                "version must be 1-64 characters without control characters",
            ))
        }
    }
}

/// Whether `c` is a character a person reading a label cannot see or that changes how the
/// text around it is shown: control characters, and the invisible formatting ones — zero-width
/// spaces and joiners (U+200B–U+200D, U+2060–U+2064, U+FEFF), directional marks, embeddings,
/// overrides and isolates (U+061C, U+200E–U+200F, U+202A–U+202E, U+2066–U+2069), line and
/// paragraph separators (U+2028–U+2029), the soft hyphen (U+00AD), U+180E and the interlinear
/// annotation marks (U+FFF9–U+FFFB). Two keys that look the same to an operator must be the
/// same key, and a name in a listing must read as what it is ("Trojan Source").
pub fn is_hidden_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{061C}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
        )
}

/// A client's idempotency key: 1–256 bytes of UTF-8 without control characters or invisible
/// formatting characters (see [`is_hidden_char`]). Scoped by
/// tenant; its mapping's key name carries only a digest of it (the key itself is kept in the
/// execution's row, to be shown back).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DedupKey(String);
string_newtype!(DedupKey);

impl DedupKey {
    /// Parses a dedup key.
    pub fn parse(s: &str) -> Result<Self, InvalidInput> {
        if !s.is_empty() && s.len() <= 256 && !s.chars().any(is_hidden_char) {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidInput::new(
                "invalid_dedup_key",
                "dedup key must be 1-256 bytes of UTF-8 without control, zero-width or \
                 bidirectional formatting characters",
            ))
        }
    }

    /// What the dedup mapping's key name carries: the first 128 bits of the key's SHA-256, in
    /// hex. 128 bits keep accidental collisions out of reach (2^64 keys per tenant for even
    /// odds) and save 32 bytes per mapping against the full digest: memory per queued
    /// execution is a product target.
    pub fn digest(&self) -> String {
        use sha2::{Digest, Sha256};
        lower_hex(&Sha256::digest(self.0.as_bytes())[..16])
    }
}

/// A concurrency key: the name of what an execution competes for inside its tenant (an end
/// customer, a downstream account...), 1–128 bytes of UTF-8 with the dedup key's character
/// rules. Executions of one key run at most the key's limit at once. Key names in Redis carry
/// only its digest; the key itself is kept in the row and in its override, to be shown back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConcurrencyKey(String);
string_newtype!(ConcurrencyKey);

impl ConcurrencyKey {
    /// Parses a concurrency key.
    pub fn parse(s: &str) -> Result<Self, InvalidInput> {
        // `.` and `..` could not be named in a URL path (clients resolve them away), so their
        // limits could never be set or read: refused from the start.
        if !s.is_empty()
            && s.len() <= 128
            && !s.chars().any(is_hidden_char)
            && s != "."
            && s != ".."
        {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidInput::new(
                "invalid_concurrency_key",
                "concurrency key must be 1-128 bytes of UTF-8 without control, zero-width or \
                 bidirectional formatting characters, and not . or ..",
            ))
        }
    }

    /// What the key's Redis names carry: 128 bits of its SHA-256 in hex, as a dedup key's.
    pub fn digest(&self) -> String {
        use sha2::{Digest, Sha256};
        lower_hex(&Sha256::digest(self.0.as_bytes())[..16])
    }
}

/// An execution id: a UUIDv7 rendered as 32 lowercase hex characters, so ids sort by creation
/// time both as numbers and as text (listing relies on the latter).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ExecutionId(String);
string_newtype!(ExecutionId);

impl ExecutionId {
    /// Mints a new, time-ordered id.
    pub fn new() -> Self {
        // The bytes in order: what `Uuid::simple()` displays, without the formatter.
        Self(lower_hex(Uuid::now_v7().as_bytes()))
    }

    /// Parses an id given by a client (path segment or cursor).
    pub fn parse(s: &str) -> Result<Self, InvalidInput> {
        if s.len() == 32
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidInput::new(
                "invalid_execution_id",
                "execution id must be 32 lowercase hex characters",
            ))
        }
    }
}

impl ExecutionId {
    /// The id's 16 bytes: the form key layout 5 is to store in Redis (row key, listing, queue
    /// and dedup members), half the hex's bytes. The bytes sort as the hex does (big-endian
    /// nibbles), so lexical orders and cursors carry over; any byte may appear (`{`, `}`,
    /// `:`, NUL, CR, LF, 0xff), so a reader finds an id by position, never by a separator.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        // `parse` and `new` admit only 32 lowercase hex digits: decoding cannot fail.
        hex::decode_to_slice(&self.0, &mut out).expect("an ExecutionId is 32 hex digits");
        out
    }

    /// The id whose binary form is `bytes` (the inverse of `to_bytes`); `None` unless exactly
    /// 16 bytes, so a truncated or foreign value read from Redis is refused, not guessed at.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        (bytes.len() == 16).then(|| Self(lower_hex(bytes)))
    }

    /// The id a script's reply or a member read back from Redis holds, in either stored form:
    /// 16 bytes (key layout 5) or 32 hex digits (layout 4, and a shard of a layout move not
    /// converted yet). Every reply that carries ids is read through this, so the form Redis
    /// holds can change without its readers. Anything else is refused with what it was.
    pub fn from_reply(bytes: &[u8]) -> Result<Self, String> {
        let parsed = match bytes.len() {
            16 => Self::from_bytes(bytes),
            32 => std::str::from_utf8(bytes)
                .ok()
                .and_then(|hex| Self::parse(hex).ok()),
            _ => None,
        };
        parsed.ok_or_else(|| {
            format!(
                "an execution id of {} bytes (16 binary or 32 hex expected): {:?}",
                bytes.len(),
                String::from_utf8_lossy(bytes)
            )
        })
    }
}

impl Default for ExecutionId {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_hex_writes_what_hex_encode_writes() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(lower_hex(&all), hex::encode(&all));
        assert_eq!(lower_hex(&[]), "");
        assert_eq!(lower_hex(&[0x0f, 0xa0]), "0fa0");
        let id = Uuid::now_v7();
        assert_eq!(lower_hex(id.as_bytes()), id.simple().to_string());
    }

    #[test]
    fn tenant_ids_that_could_escape_a_key_are_refused() {
        for bad in [
            "",
            "a b",
            "a{b",
            "a}b",
            "a:b",
            "a*b",
            "-abc",
            "é",
            &"a".repeat(65),
        ] {
            assert!(TenantId::parse(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["a", "acme", "Acme_1.prod-eu", &"a".repeat(64)] {
            assert!(TenantId::parse(good).is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn flow_ids_allow_dots_and_slashes_only() {
        assert!(FlowId::parse("demo.sleep").is_ok());
        assert!(FlowId::parse("billing/invoice-v2").is_ok());
        for bad in ["", " x", "a:b", "a{b}", &"f".repeat(129)] {
            assert!(FlowId::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn dedup_keys_are_bounded_in_bytes_and_free_of_control_characters() {
        assert!(DedupKey::parse(&"k".repeat(256)).is_ok());
        assert!(DedupKey::parse(&"k".repeat(257)).is_err());
        // 86 three-byte characters = 258 bytes: the limit is bytes, not characters.
        assert!(DedupKey::parse(&"€".repeat(86)).is_err());
        assert!(DedupKey::parse("a\nb").is_err());
        assert!(DedupKey::parse("order 42 / retry").is_ok());
    }

    #[test]
    fn dedup_keys_refuse_invisible_and_bidirectional_formatting() {
        for c in [
            '\u{200B}', '\u{200C}', '\u{200D}', '\u{200E}', '\u{200F}', '\u{202A}', '\u{202E}',
            '\u{2066}', '\u{2069}', '\u{FEFF}', '\u{2060}', '\u{00AD}', '\u{061C}', '\u{2028}',
        ] {
            let key = format!("order{c}42");
            assert!(DedupKey::parse(&key).is_err(), "U+{:04X}", c as u32);
            assert!(is_hidden_char(c));
        }
        // Letters of any script stay welcome.
        for key in ["заказ-42", "注文42", "طلب-42", "ordre n° 42 – é"] {
            assert!(DedupKey::parse(key).is_ok(), "{key}");
        }
    }

    #[test]
    fn minted_ids_parse_and_sort_by_time() {
        let a = ExecutionId::new();
        let b = ExecutionId::new();
        assert!(ExecutionId::parse(a.as_str()).is_ok());
        assert!(a.as_str() < b.as_str());
        assert!(ExecutionId::parse("ABCDEF0123456789ABCDEF0123456789").is_err());
    }

    #[test]
    fn ids_in_replies_are_read_in_both_stored_forms() {
        let id = ExecutionId::new();
        assert_eq!(
            ExecutionId::from_reply(id.as_str().as_bytes()),
            Ok(id.clone())
        );
        assert_eq!(ExecutionId::from_reply(&id.to_bytes()), Ok(id.clone()));
        // A binary id whose bytes happen to be text, and one that is not UTF-8.
        let text = ExecutionId::from_reply(b"0123456789abcdef").unwrap();
        assert_eq!(text.as_str(), "30313233343536373839616263646566");
        let raw = [
            0xffu8, 0, b'\n', b'{', 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
        ];
        assert_eq!(ExecutionId::from_reply(&raw).unwrap().to_bytes(), raw);
    }

    #[test]
    fn an_id_of_another_length_or_not_hex_is_refused_with_what_it_was() {
        let id = ExecutionId::new();
        for (bad, len) in [
            (&b""[..], 0),
            (&id.as_str().as_bytes()[..31], 31),
            (b"0123456789abcdef0", 17),
            (b"0123456789ABCDEF0123456789ABCDEF", 32),
            (b"0123456789abcdef0123456789abcdeg", 32),
            (&[0xffu8; 32][..], 32),
        ] {
            let e = ExecutionId::from_reply(bad).unwrap_err();
            assert!(e.contains(&format!("of {len} bytes")), "{e}");
        }
        let e = ExecutionId::from_reply(b"nope").unwrap_err();
        assert!(e.contains("\"nope\""), "{e}");
    }

    /// A binary id's first byte is the top byte of its 48-bit millisecond time: 0x01 from 2004
    /// to 2039, below `0` (0x30, the lowest hex digit) until about the year 3600 and so below
    /// `r`. The scripts tell a timer set's ids from its `rt:`/`rk:` wake-ups by that prefix
    /// (`promote_due()` in migrations-lua/common.lua), and (during a move to layout 5) a
    /// binary member from a hex one by its first byte.
    #[test]
    fn a_binary_id_starts_below_every_hex_digit_and_timer_prefix() {
        for _ in 0..1000 {
            let first = ExecutionId::new().to_bytes()[0];
            assert_eq!(first, 0x01, "until 2039");
            // Below '0' (0x30) and so below 'r' (0x72) of `rt:`/`rk:`.
            assert!(first < b'0');
        }
        // The last millisecond whose top byte is still below '0' (0x30): about the year 3600.
        let last_ms: u64 = (0x30 << 40) - 1;
        let year = 1970 + last_ms / (365_2425 * 86_400_000 / 10_000);
        assert!((3500..3700).contains(&year), "{year}");
    }

    #[test]
    fn binary_ids_round_trip_and_sort_as_their_hex() {
        // Ids whose bytes are the ones a separator-based reader would trip on.
        let awkward: [[u8; 16]; 4] = [
            [0; 16],
            [0xff; 16],
            *b"{a}:\0\r\n\xff{}::\0\0\r\n",
            [
                0x01, 0x8f, 0x7b, b'{', b'}', 0x00, b'\r', b'\n', b':', 0xff, 0, 0, 0, 0, 0, 0x7f,
            ],
        ];
        let mut ids: Vec<ExecutionId> = (0..64).map(|_| ExecutionId::new()).collect();
        for b in awkward {
            let id = ExecutionId::from_bytes(&b).expect("16 bytes");
            assert!(ExecutionId::parse(id.as_str()).is_ok(), "{id}");
            assert_eq!(id.to_bytes(), b);
            ids.push(id);
        }
        for id in &ids {
            assert_eq!(ExecutionId::from_bytes(&id.to_bytes()).as_ref(), Some(id));
        }
        // Every pair orders the same as hex text and as bytes.
        for a in &ids {
            for b in &ids {
                assert_eq!(
                    a.as_str().cmp(b.as_str()),
                    a.to_bytes().cmp(&b.to_bytes()),
                    "{a} vs {b}"
                );
            }
        }
        assert_eq!(ExecutionId::from_bytes(&[0; 15]), None);
        assert_eq!(ExecutionId::from_bytes(&[0; 17]), None);
        assert_eq!(ExecutionId::from_bytes(b""), None);
    }
}
