//! `routerctl approve`: mint a signed approval token for one request.
//!
//! ```text
//! routerctl approve --route governed --request-id req-42 --ttl 10m
//! ```
//!
//! prints the token alone on stdout (so `$(routerctl approve ...)` is the
//! `X-Router-Approval` header's value) and, on stderr, what it approves and
//! until when. The key is read from `--key-file` or from
//! `CUSTOM_ROUTER_APPROVAL_KEY`, the variable the proxies check tokens
//! with; it is never printed. Nothing is sent anywhere: whoever holds the
//! key can approve, offline. The token's format and checks are
//! `router_policy::approval`'s.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::Args;
use router_policy::approval::{ApprovalKey, MAX_TTL};

use crate::error::CliError;

/// The variable the key is read from when no `--key-file` is given (the
/// proxies' own).
pub const KEY_ENV: &str = "CUSTOM_ROUTER_APPROVAL_KEY";

/// `routerctl approve`'s arguments.
#[derive(Args, Debug)]
pub struct ApproveArgs {
    /// The route the request will take (its name in the policy).
    #[arg(long)]
    pub route: String,
    /// The request's id: the `Idempotency-Key` (or `X-Request-Id`) it will
    /// be sent with.
    #[arg(long = "request-id")]
    pub request_id: String,
    /// How long the token is good for (at most 24h).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// A file holding the approval key (default: the
    /// CUSTOM_ROUTER_APPROVAL_KEY variable).
    #[arg(long = "key-file")]
    pub key_file: Option<PathBuf>,
}

/// Runs `routerctl approve`; the exit code.
pub fn run(args: &ApproveArgs) -> ExitCode {
    match mint(args, std::env::var(KEY_ENV).ok(), now_unix()) {
        Ok((token, expires_at)) => {
            println!("{token}");
            let until = SystemTime::UNIX_EPOCH + Duration::from_secs(expires_at);
            eprintln!(
                "approves request {} on route {} until {}",
                args.request_id,
                args.route,
                humantime::format_rfc3339_seconds(until)
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("routerctl approve: {e}");
            ExitCode::from(2)
        }
    }
}

/// The token and its expiry, with the key from `--key-file` or `env_key`
/// (the variable's value), at `now` (Unix seconds).
pub fn mint(
    args: &ApproveArgs,
    env_key: Option<String>,
    now: u64,
) -> Result<(String, u64), CliError> {
    let (secret, origin) = match &args.key_file {
        Some(path) => (
            std::fs::read_to_string(path).map_err(|source| CliError::Read {
                what: "--key-file ",
                path: path.clone(),
                source,
            })?,
            format!("--key-file {}", path.display()),
        ),
        None => (
            env_key.ok_or(CliError::NoApprovalKey(KEY_ENV))?,
            KEY_ENV.to_string(),
        ),
    };
    let key =
        ApprovalKey::new(&secret).map_err(|source| CliError::ApprovalKey { origin, source })?;
    if args.ttl > MAX_TTL {
        return Err(CliError::Flag {
            flag: format!("--ttl {}", humantime::format_duration(args.ttl)),
            reason: format!(
                "longer than the {} a token may last",
                humantime::format_duration(MAX_TTL)
            ),
        });
    }
    Ok(key.mint(args.route.trim(), args.request_id.trim(), args.ttl, now)?)
}

/// The wall clock in Unix seconds (the token's expiry).
fn now_unix() -> u64 {
    router_policy::wall_clock::since_epoch().as_secs()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "routerctl-approve-test-key-0123456789";

    fn args(ttl: Duration) -> ApproveArgs {
        ApproveArgs {
            route: "governed".into(),
            request_id: "req-42".into(),
            ttl,
            key_file: None,
        }
    }

    #[test]
    fn a_minted_token_verifies_with_the_same_key() {
        let (token, expires_at) =
            mint(&args(Duration::from_secs(600)), Some(KEY.into()), 1000).expect("mint");
        assert_eq!(expires_at, 1600);
        let key = ApprovalKey::new(KEY).expect("key");
        assert_eq!(
            key.verify(token.as_bytes(), "governed", "req-42", 1000),
            Ok(())
        );
    }

    #[test]
    fn errors_name_what_to_fix_and_never_show_the_key() {
        let e = mint(&args(Duration::from_secs(600)), None, 1000).unwrap_err();
        assert!(matches!(e, CliError::NoApprovalKey(KEY_ENV)), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("--key-file") && e.contains(KEY_ENV), "{e}");
        let e = mint(
            &args(Duration::from_secs(600)),
            Some("short-secret".into()),
            1000,
        )
        .unwrap_err();
        assert!(matches!(e, CliError::ApprovalKey { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains(KEY_ENV) && e.contains("32"), "{e}");
        assert!(!e.contains("short-secret"), "{e}");
        let e = mint(
            &args(Duration::from_secs(25 * 3600)),
            Some(KEY.into()),
            1000,
        )
        .unwrap_err();
        assert!(
            matches!(&e, CliError::Flag { flag, .. } if flag.starts_with("--ttl")),
            "{e:?}"
        );
        let mut a = args(Duration::from_secs(60));
        a.key_file = Some(PathBuf::from("/nonexistent/approval.key"));
        let e = mint(&a, Some(KEY.into()), 1000).unwrap_err();
        assert!(matches!(e, CliError::Read { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("--key-file /nonexistent/approval.key"), "{e}");
    }
}
