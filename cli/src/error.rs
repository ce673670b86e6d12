//! Why a `routerctl` command could not do its work: the crate's one error
//! type. Its `Display` is what the person at the terminal reads (the file
//! and every field of a bad policy, the control plane's own words for a
//! refused call, the flag at fault), so commands print it as it is; the
//! variant says what failed, for programs and tests.

use std::path::PathBuf;
use std::time::Duration;

use router_policy::document::PolicyError;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A file could not be read.
    #[error("cannot read {what}{}: {source}", path.display())]
    Read {
        /// What the file is, with a trailing space (`--key-file `), or empty.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A policy file that does not load: every error with its field.
    #[error("{}: invalid policy\n{}", path.display(), by_field(source))]
    InvalidPolicyFile {
        /// The file.
        path: PathBuf,
        /// Every error, with its field.
        source: PolicyError,
    },
    /// A policy text the command wrote itself that does not load.
    #[error(transparent)]
    InvalidPolicy(#[from] PolicyError),
    /// This environment's guard variables cannot be used.
    #[error(transparent)]
    Guards(#[from] router_policy::GuardError),
    /// A flag's value cannot be used.
    #[error("{flag}: {reason}")]
    Flag {
        /// The flag, with its value when it helps (`--expires 300y`).
        flag: String,
        /// Why.
        reason: String,
    },
    /// A flag's value is not of the form it needs (clap names the flag).
    #[error("expected {expected}{}", reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    Value {
        /// What the flag takes.
        expected: &'static str,
        /// What was wrong with the value, when more can be said.
        reason: Option<String>,
    },
    /// The token cannot be sent.
    #[error(transparent)]
    Token(#[from] router_proto::token::TokenError),
    /// The control plane's address cannot be used.
    #[error(transparent)]
    Address(#[from] router_proxy::managed::AddressError),
    /// The control plane cannot be reached (what to check, in words).
    #[error("{0}")]
    Unreachable(String),
    /// The control plane refused or failed the call.
    #[error("{}", crate::admin_cmd::explain_status(.0))]
    Refused(#[from] tonic::Status),
    /// The approval key cannot be used (`origin` says where it came from).
    #[error("{origin}: {source}")]
    ApprovalKey {
        /// `--key-file PATH` or the variable's name.
        origin: String,
        /// Why.
        source: router_policy::approval::KeyError,
    },
    /// No approval key was given.
    #[error("no approval key: give --key-file, or set {0} (the proxies' key)")]
    NoApprovalKey(&'static str),
    /// A token could not be minted.
    #[error(transparent)]
    Mint(#[from] router_policy::approval::MintError),
    /// The system's random source failed.
    #[error("the system random source failed")]
    Random,
    /// A part the drill runs could not start.
    #[error("cannot start the {what}: {reason}")]
    Start {
        /// `primary mock`, `fallback mock`, `router`.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// The drill's request could not be sent or read.
    #[error("request: {0}")]
    Request(String),
    /// No answer within the time allowed.
    #[error("no answer in {} s", .0.as_secs())]
    NoAnswer(Duration),
    /// The proxies did not reach the shared store in time.
    #[error("the proxies did not reach the shared store within {} s", .0.as_secs())]
    StoreNotReached(Duration),
    /// The shared store's URL cannot be used.
    #[error("--shared-store: {0}")]
    SharedStore(#[from] router_shared_state::InvalidStoreUrl),
    /// Several proxies without a shared store to share their keys in.
    #[error("--proxies above 1 needs --shared-store redis://HOST:PORT (the proxies share their Idempotency-Keys there)")]
    ProxiesNeedStore,
    /// A task of the command's own failed.
    #[error("a task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Each error on its own line, with its field.
fn by_field(e: &PolicyError) -> String {
    let mut out = String::new();
    for f in &e.errors {
        out.push_str(&format!("  {}: {}\n", f.field, f.reason));
    }
    out
}
