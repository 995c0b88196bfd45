//! Tenant API keys as values: the token format, roles and secret hashing. No HTTP and no Redis
//! here (the role derives its JSON spelling and OpenAPI schema, which are the API's names for
//! it); the store keeps key records (`store::access`) and the HTTP layer authenticates with
//! them (`http::auth`).
//!
//! A token reads `sk_<key id>_<secret>`: 16 lowercase hex characters of key id (64 random
//! bits, the lookup handle, safe to show and log) and 64 of secret (256 random bits). Only the
//! SHA-256 of the secret is stored; with 256 random bits a plain hash is as strong as a slow
//! password hash, and it keeps authentication one cheap lookup.
//!
//! A key minted by a server in dev-auth mode (where anybody may mint one) is stored with a
//! hash of its own domain ([`KeyOrigin::DevAuth`]): a server with real authentication on the
//! same Redis never accepts it.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::domain::TenantId;

/// Prefix of every tenant API key; tells it apart from the platform admin token.
pub const TOKEN_PREFIX: &str = "sk_";
const KEY_ID_BYTES: usize = 8;
const SECRET_BYTES: usize = 32;

// The one role type: the API spells it `worker`, `viewer`, `editor`, `admin` (its serde and
// OpenAPI schema derive from here), the store keeps the same spelling, and the HTTP layer
// checks callers against it (the order is used for `>=` checks: `worker` is below every
// other, and reaches only the pull API, `http::worker`). The platform admin is not a role of
// a key but the admin token (`http::auth::Grant`). The doc line below is the API's.
/// The role an API key grants, weakest first.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum KeyRole {
    /// Lease and run the tenant's executions through the pull API (`/api/worker/*`), and
    /// nothing else.
    Worker,
    /// Read executions.
    Viewer,
    /// Also submit, cancel and retry executions.
    Editor,
    /// Also force-delete executions, read the tenant and manage its API keys.
    Admin,
}

impl KeyRole {
    /// The API's and the store's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyRole::Worker => "worker",
            KeyRole::Viewer => "viewer",
            KeyRole::Editor => "editor",
            KeyRole::Admin => "admin",
        }
    }

    /// Reads the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "worker" => Some(KeyRole::Worker),
            "viewer" => Some(KeyRole::Viewer),
            "editor" => Some(KeyRole::Editor),
            "admin" => Some(KeyRole::Admin),
            _ => None,
        }
    }
}

impl std::fmt::Display for KeyRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A key id: 16 lowercase hex characters. Safe in a Redis key and in logs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyId(String);

impl KeyId {
    /// Parses a key id as shown by the API.
    pub fn parse(s: &str) -> Option<Self> {
        is_lower_hex(s, KEY_ID_BYTES * 2).then(|| Self(s.to_owned()))
    }

    /// The id's text (what the API shows and the store's key names use).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who minted a key, which decides how its secret is hashed for storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOrigin {
    /// A server that authenticates its callers: valid everywhere.
    Authenticated,
    /// A server in dev-auth mode, where nobody is authenticated: valid only on such servers.
    DevAuth,
}

/// Prefix hashed before the secret of a dev-auth key, so its stored hash can never match
/// what a normal server computes.
const DEV_AUTH_DOMAIN: &str = "sluice dev-auth key\0";

/// A token as presented by a caller, split into its lookup id and its secret.
pub struct PresentedKey {
    pub id: KeyId,
    secret: String,
}

impl std::fmt::Debug for PresentedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PresentedKey")
            .field("id", &self.id)
            .finish()
    }
}

impl PresentedKey {
    /// Splits `sk_<id>_<secret>`; `None` for anything else (answered 401 without a lookup).
    pub fn parse(token: &str) -> Option<Self> {
        let rest = token.strip_prefix(TOKEN_PREFIX)?;
        let (id, secret) = rest.split_once('_')?;
        if !is_lower_hex(secret, SECRET_BYTES * 2) {
            return None;
        }
        Some(Self {
            id: KeyId::parse(id)?,
            secret: secret.to_owned(),
        })
    }

    /// Whether the presented secret is the one stored (constant time), for a key minted with
    /// real authentication or, when `accept_dev_auth`, in dev-auth mode.
    pub fn matches(&self, stored_hash: &str, accept_dev_auth: bool) -> bool {
        let is = |origin| {
            bool::from(
                hash_secret(&self.secret, origin)
                    .as_bytes()
                    .ct_eq(stored_hash.as_bytes()),
            )
        };
        is(KeyOrigin::Authenticated) || (accept_dev_auth && is(KeyOrigin::DevAuth))
    }
}

/// A freshly generated key: the token is shown to its creator once and never stored.
#[derive(Debug)]
pub struct GeneratedKey {
    pub id: KeyId,
    /// The full `sk_<id>_<secret>` token.
    pub token: String,
    /// SHA-256 hex of the secret, the only form that is stored.
    pub secret_hash: String,
}

impl GeneratedKey {
    /// Draws a new key from the operating system's random source.
    pub fn generate(origin: KeyOrigin) -> Result<Self, getrandom::Error> {
        let mut id = [0u8; KEY_ID_BYTES];
        let mut secret = [0u8; SECRET_BYTES];
        getrandom::fill(&mut id)?;
        getrandom::fill(&mut secret)?;
        let (id, secret) = (hex::encode(id), hex::encode(secret));
        Ok(Self {
            token: format!("{TOKEN_PREFIX}{id}_{secret}"),
            secret_hash: hash_secret(&secret, origin),
            id: KeyId(id),
        })
    }
}

fn hash_secret(secret: &str, origin: KeyOrigin) -> String {
    let mut h = Sha256::new();
    if origin == KeyOrigin::DevAuth {
        h.update(DEV_AUTH_DOMAIN);
    }
    h.update(secret.as_bytes());
    hex::encode(h.finalize())
}

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A change of who may call, as announced to every server on the access channel (see
/// `crate::revocation`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessChange {
    /// The key was revoked: its requests, waits and streams end.
    KeyRevoked(KeyId),
    /// The tenant was deleted, and with it all its keys.
    TenantDeleted(TenantId),
    /// The key was just created: a miss remembered for its id is forgotten.
    KeyCreated(KeyId),
}

impl AccessChange {
    /// The message's text on the channel.
    pub fn to_message(&self) -> String {
        match self {
            AccessChange::KeyRevoked(id) => format!("key_revoked:{id}"),
            AccessChange::TenantDeleted(t) => format!("tenant_deleted:{t}"),
            AccessChange::KeyCreated(id) => format!("key_created:{id}"),
        }
    }

    /// A message's text read back; `None` for anything else.
    pub fn parse(message: &str) -> Option<Self> {
        let (kind, what) = message.split_once(':')?;
        match kind {
            "key_revoked" => KeyId::parse(what).map(AccessChange::KeyRevoked),
            "tenant_deleted" => TenantId::parse(what).ok().map(AccessChange::TenantDeleted),
            "key_created" => KeyId::parse(what).map(AccessChange::KeyCreated),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_token_parses_back_to_its_id_and_hash() {
        let k = GeneratedKey::generate(KeyOrigin::Authenticated).unwrap();
        assert!(k.token.starts_with("sk_"));
        let p = PresentedKey::parse(&k.token).unwrap();
        assert_eq!(p.id, k.id);
        assert!(p.matches(&k.secret_hash, false));
        assert!(p.matches(&k.secret_hash, true));
        assert!(!k.token.contains(&k.secret_hash));
        assert!(!format!("{p:?}").contains(&k.token[20..]));
    }

    #[test]
    fn a_dev_auth_key_matches_only_where_dev_auth_keys_are_accepted() {
        let k = GeneratedKey::generate(KeyOrigin::DevAuth).unwrap();
        let p = PresentedKey::parse(&k.token).unwrap();
        assert!(!p.matches(&k.secret_hash, false));
        assert!(p.matches(&k.secret_hash, true));
    }

    #[test]
    fn malformed_tokens_do_not_parse() {
        let k = GeneratedKey::generate(KeyOrigin::Authenticated).unwrap();
        for bad in [
            "",
            "sk_",
            "sk_abc_def",
            &k.token[..k.token.len() - 1],
            &k.token.to_uppercase(),
            &format!("{}0", k.token),
            &k.token.replacen("sk_", "pk_", 1),
        ] {
            assert!(PresentedKey::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn a_different_secret_does_not_match() {
        let a = GeneratedKey::generate(KeyOrigin::Authenticated).unwrap();
        let b = GeneratedKey::generate(KeyOrigin::Authenticated).unwrap();
        assert!(
            !PresentedKey::parse(&a.token)
                .unwrap()
                .matches(&b.secret_hash, true)
        );
    }
}
