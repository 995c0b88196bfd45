//! Each credential's share of the connections (the "Per credential" rule of the server's
//! module docs): a connection is counted against the API key of the first request that
//! authenticated on it, and against that key's tenant, until it closes. A key past its share,
//! or a tenant whose keys together are past theirs, is refused the connection.
//!
//! The check and the count are one step under one lock, so any number of connections
//! authenticating at the same moment take exactly the share and no more. Counts live only
//! here, in this process: each server bounds its own connections, as it bounds their number.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex};

use crate::access::KeyId;
use crate::domain::TenantId;
use crate::http::metrics::Metrics;
use crate::http::{ConnectionHolder, ConnectionRefusal};

/// The connections each API key and each tenant hold on one listener.
pub(super) struct Shares {
    /// Connections one API key may hold (0 = no share).
    per_key: usize,
    /// Connections one tenant's credentials may hold together (0 = no share).
    per_tenant: usize,
    held: Mutex<Held>,
    /// Where refusals are counted (`sluice_http_connections_over_*_share_total`).
    metrics: Arc<Metrics>,
}

/// The counts: only holders with a connection open are present, so the maps stay as small as
/// the number of connections.
#[derive(Default)]
struct Held {
    keys: HashMap<KeyId, usize>,
    tenants: HashMap<TenantId, usize>,
}

impl Shares {
    pub(super) fn new(per_key: usize, per_tenant: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            per_key,
            per_tenant,
            held: Mutex::new(Held::default()),
            metrics,
        }
    }

    /// Counts a connection against `holder`, or refuses it when a share it falls under is
    /// full (then nothing is counted but the refusal). The place is given back when the
    /// [`Place`] is dropped. Called once per connection, at its first authenticated request.
    pub(super) fn take(
        self: &Arc<Self>,
        holder: &ConnectionHolder,
    ) -> Result<Place, ConnectionRefusal> {
        let taken = self.count(holder);
        if let Err(refusal) = taken {
            self.metrics.connection_over_share(refusal);
        }
        taken
    }

    fn count(self: &Arc<Self>, holder: &ConnectionHolder) -> Result<Place, ConnectionRefusal> {
        let (key, tenant) = match holder {
            ConnectionHolder::Key { tenant, key } => (Some(key), tenant),
            ConnectionHolder::DevTenant(tenant) => (None, tenant),
            ConnectionHolder::Operator => return Ok(Place::uncounted(self)),
        };
        let key = key.filter(|_| self.per_key > 0);
        let tenant = Some(tenant).filter(|_| self.per_tenant > 0);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(key) = key
            && held.keys.get(key).copied().unwrap_or(0) >= self.per_key
        {
            return Err(ConnectionRefusal::Key {
                share: self.per_key,
            });
        }
        if let Some(tenant) = tenant
            && held.tenants.get(tenant).copied().unwrap_or(0) >= self.per_tenant
        {
            return Err(ConnectionRefusal::Tenant {
                share: self.per_tenant,
            });
        }
        if let Some(key) = key {
            *held.keys.entry(key.clone()).or_insert(0) += 1;
        }
        if let Some(tenant) = tenant {
            *held.tenants.entry(tenant.clone()).or_insert(0) += 1;
        }
        Ok(Place {
            shares: self.clone(),
            key: key.cloned(),
            tenant: tenant.cloned(),
        })
    }

    /// Connections `key` holds now (for tests).
    #[cfg(test)]
    fn of_key(&self, key: &KeyId) -> usize {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.keys.get(key).copied().unwrap_or(0)
    }
}

/// One connection counted against a key and its tenant (or against nothing: the operator, or
/// a share that is off); dropping it gives the place back.
pub(super) struct Place {
    shares: Arc<Shares>,
    key: Option<KeyId>,
    tenant: Option<TenantId>,
}

impl Place {
    fn uncounted(shares: &Arc<Shares>) -> Self {
        Self {
            shares: shares.clone(),
            key: None,
            tenant: None,
        }
    }
}

/// Takes one from `map[k]`, removing the entry at zero.
fn give_back<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, k: K) {
    if let Entry::Occupied(mut e) = map.entry(k) {
        *e.get_mut() -= 1;
        if *e.get() == 0 {
            e.remove();
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.key.is_none() && self.tenant.is_none() {
            return;
        }
        let mut held = self.shares.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(key) = self.key.take() {
            give_back(&mut held.keys, key);
        }
        if let Some(tenant) = self.tenant.take() {
            give_back(&mut held.tenants, tenant);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(tenant: &str, id: &str) -> ConnectionHolder {
        ConnectionHolder::Key {
            tenant: TenantId::parse(tenant).unwrap(),
            key: KeyId::parse(id).unwrap(),
        }
    }

    const A: &str = "00000000000000aa";
    const B: &str = "00000000000000bb";

    #[test]
    fn a_key_and_a_tenant_hold_at_most_their_shares_and_get_them_back() {
        let shares = Arc::new(Shares::new(2, 3, Arc::new(Metrics::new(10))));
        let (a, b) = (key_of("acme", A), key_of("acme", B));
        let a1 = shares.take(&a).unwrap();
        let _a2 = shares.take(&a).unwrap();
        assert_eq!(
            shares.take(&a).err(),
            Some(ConnectionRefusal::Key { share: 2 })
        );
        // Another key of the tenant: its own share, but the tenant's is 3.
        let _b1 = shares.take(&b).unwrap();
        assert_eq!(
            shares.take(&b).err(),
            Some(ConnectionRefusal::Tenant { share: 3 })
        );
        // Dev auth's tenant shares the tenant's count.
        let dev = ConnectionHolder::DevTenant(TenantId::parse("acme").unwrap());
        assert!(shares.take(&dev).is_err());
        // Another tenant is untouched; the operator counts against nothing.
        let _other = shares.take(&key_of("globex", B)).unwrap();
        let operators: Vec<_> = (0..10)
            .map(|_| shares.take(&ConnectionHolder::Operator).unwrap())
            .collect();
        drop(operators);
        // A place given back is a place for the next connection, of the key and the tenant.
        drop(a1);
        assert_eq!(shares.of_key(&KeyId::parse(A).unwrap()), 1);
        let _a3 = shares.take(&a).unwrap();
        assert!(shares.take(&b).is_err());
    }

    #[test]
    fn a_share_of_zero_counts_nothing() {
        let shares = Arc::new(Shares::new(0, 0, Arc::new(Metrics::new(10))));
        let a = key_of("acme", A);
        let places: Vec<_> = (0..100).map(|_| shares.take(&a).unwrap()).collect();
        assert_eq!(shares.of_key(&KeyId::parse(A).unwrap()), 0);
        drop(places);
        let held = shares.held.lock().unwrap();
        assert!(held.keys.is_empty() && held.tenants.is_empty());
    }
}
