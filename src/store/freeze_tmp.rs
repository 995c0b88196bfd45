//! TEMPORARY until the `lua` branch lands (it brings the real freeze helpers).
use super::{Shard, Store, StoreError};

/// The freeze marker of a shard.
pub fn frozen_key(shard: Shard) -> String {
    format!("{}frozen", shard.prefix())
}

impl Store {
    pub async fn freeze_shard(&self, shard: Shard) -> Result<(), StoreError> {
        let mut c = self.conn();
        let () = self
            .bounded(
                redis::cmd("SET")
                    .arg(frozen_key(shard))
                    .arg("1")
                    .query_async(&mut c),
            )
            .await?;
        Ok(())
    }
    pub async fn unfreeze_shard(&self, shard: Shard) -> Result<(), StoreError> {
        let mut c = self.conn();
        let () = self
            .bounded(redis::cmd("DEL").arg(frozen_key(shard)).query_async(&mut c))
            .await?;
        Ok(())
    }
    pub async fn is_frozen(&self, shard: Shard) -> Result<bool, StoreError> {
        let mut c = self.conn();
        Ok(self
            .bounded(
                redis::cmd("EXISTS")
                    .arg(frozen_key(shard))
                    .query_async(&mut c),
            )
            .await?)
    }
}
