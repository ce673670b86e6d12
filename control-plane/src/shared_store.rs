//! The proxies' shared store (`--shared-store`), as the control plane
//! reaches it: through `router_shared_state`'s [`SharedStoreClient`] (the
//! only crate of the workspace that links `redis`, and the one place its
//! key layout is carried out). Here: the handle built from the flag, and
//! the crate's errors turned into the Admin API's statuses and the
//! console's messages.

use router_shared_state::admin::ADMIN_TIMEOUT;
use router_shared_state::{SharedStoreClient, StoreError};
use tonic::Status;

/// The handle on the store at `url`, with the proxies' URL and TLS rules.
pub(crate) fn open(url: &str) -> Result<SharedStoreClient, crate::StartError> {
    SharedStoreClient::open(url).map_err(|e| crate::StartError::SharedStore(e.to_string()))
}

/// What an operator is told about `e`.
pub(crate) fn message(e: &StoreError) -> String {
    match e {
        StoreError::Timeout => format!(
            "the shared store did not answer within {} s",
            ADMIN_TIMEOUT.as_secs()
        ),
        StoreError::Unavailable(why) => format!("the shared store: {why}"),
        e => e.to_string(),
    }
}

/// `e` as the Admin API answers it.
pub(crate) fn status(e: StoreError) -> Status {
    let text = message(&e);
    match e {
        StoreError::Timeout | StoreError::Unavailable(_) => Status::unavailable(text),
        StoreError::NotFound(_) => Status::not_found(text),
        StoreError::Illegal(_) => Status::failed_precondition(text),
        StoreError::Conflict(_) => Status::aborted(text),
        StoreError::Corrupt(_) | StoreError::Malformed(_) => Status::internal(text),
    }
}
