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

#[cfg(test)]
mod tests {
    use super::*;
    use router_policy::park::Illegal;
    use tonic::Code;

    #[test]
    fn each_store_error_has_its_status() {
        let cases = [
            (
                StoreError::Timeout,
                Code::Unavailable,
                "did not answer within 2 s",
            ),
            (
                StoreError::Unavailable("connection refused".into()),
                Code::Unavailable,
                "the shared store: connection refused",
            ),
            (
                StoreError::NotFound("task \"x\"".into()),
                Code::NotFound,
                "no task \"x\"",
            ),
            (
                StoreError::Illegal(Illegal::Terminal("dropped")),
                Code::FailedPrecondition,
                "dropped already",
            ),
            (
                StoreError::Conflict("task x".into()),
                Code::Aborted,
                "task x changed",
            ),
            (
                StoreError::Malformed("task x is not".into()),
                Code::Internal,
                "task x is not",
            ),
        ];
        for (e, code, text) in cases {
            let s = status(e.clone());
            assert_eq!(s.code(), code, "{e:?}");
            assert!(s.message().contains(text), "{e:?}: {}", s.message());
        }
        // A task's change says which task, and to try again after a conflict.
        let s = crate::tasks::status("t1", StoreError::Conflict("task t1".into()));
        assert_eq!(s.code(), Code::Aborted);
        assert_eq!(s.message(), "task t1 kept changing; try again");
        let s = crate::tasks::status("t1", StoreError::Illegal(Illegal::NotApproved));
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert!(s.message().starts_with("task t1: "), "{}", s.message());
        let s = crate::tasks::status("t1", StoreError::Timeout);
        assert_eq!(s.code(), Code::Unavailable);
    }
}
