//! openraft's storage test suite against the redb stores.

use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};

use super::{LogStore, StateMachineStore, TypeConfig, storage};

struct RedbBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for RedbBuilder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = storage::open(dir.path(), 1).expect("open storage");
        let sm = StateMachineStore::open(db.clone())
            .await
            .expect("open state machine");
        let log = LogStore::new(db, dir.path()).expect("start the log store");
        Ok((dir, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite() {
    Suite::test_all(RedbBuilder)
        .await
        .expect("openraft storage suite");
}
