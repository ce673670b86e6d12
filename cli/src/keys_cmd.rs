//! `routerctl tenants keys create | list | revoke`: tenants' keys, kept in
//! the control plane's store beside the policy.
//!
//! The key is minted here (`rt_` and 32 random bytes) and printed once;
//! the control plane gets its SHA-256 and its first characters only, so
//! neither it, its store nor the proxies can show it again.

use std::process::ExitCode;
use std::time::Duration;

use router_proto::v1 as pb;
use serde_json::{json, Value};

use crate::admin_cmd::{explain_status, fail, print_value, when, Admin};
use crate::error::CliError;
use crate::policy_cmd::Output;
use router_policy::wall_clock::unix_ms_i64;

/// How many characters of a key `keys list` shows (`rt_` and 4 more).
const PREFIX_CHARS: usize = 7;

/// Mints a key for `tenant` and stores its hash; returns the key (to be
/// shown once) and the stored record.
pub async fn create_key(
    admin: &mut Admin,
    tenant: &str,
    name: &str,
    expires_in: Option<Duration>,
) -> Result<(String, pb::TenantKey), CliError> {
    let key = crate::tenants_cmd::mint_tenant_key()?;
    let expires_at_unix_ms = match expires_in {
        None => 0,
        Some(d) => i64::try_from(d.as_millis())
            .ok()
            .and_then(|ms| unix_ms_i64().checked_add(ms))
            .ok_or_else(|| CliError::Flag {
                flag: format!("--expires {}", humantime::format_duration(d)),
                reason: "too far".into(),
            })?,
    };
    let stored = admin
        .create_key(pb::CreateKeyRequest {
            tenant: tenant.to_string(),
            name: name.to_string(),
            hash: router_policy::tenant::key_hash_text(&key),
            prefix: key.chars().take(PREFIX_CHARS).collect(),
            expires_at_unix_ms,
        })
        .await?
        .into_inner();
    Ok((key, stored))
}

/// `routerctl tenants keys create TENANT [--name N] [--expires 30d]`:
/// the key on stdout (once), what was stored on stderr.
pub async fn create(
    admin: &mut Admin,
    tenant: &str,
    name: &str,
    expires_in: Option<Duration>,
    output: Output,
) -> ExitCode {
    match create_key(admin, tenant, name, expires_in).await {
        Ok((key, stored)) => {
            match output {
                Output::Table => {
                    let expiry = if stored.expires_at_unix_ms == 0 {
                        "does not expire".to_string()
                    } else {
                        format!("expires {}", when(stored.expires_at_unix_ms))
                    };
                    eprintln!(
                        "tenant {tenant:?}: key {} created ({expiry}); it is shown once, only its hash is kept:",
                        stored.id
                    );
                    println!("{key}");
                }
                _ => {
                    let mut v = view(&stored);
                    v["key"] = Value::String(key);
                    print_value(&v, output);
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn view(k: &pb::TenantKey) -> Value {
    json!({
        "id": k.id,
        "tenant": k.tenant,
        "name": k.name,
        "prefix": k.prefix,
        "created_at": when(k.created_at_unix_ms),
        "created_by": k.created_by,
        "expires_at": (k.expires_at_unix_ms != 0).then(|| when(k.expires_at_unix_ms)),
        "last_used_at": (k.last_used_unix_ms != 0).then(|| when(k.last_used_unix_ms)),
    })
}

/// `routerctl tenants keys list [TENANT]`.
pub async fn list(admin: &mut Admin, tenant: &str, output: Output) -> ExitCode {
    let keys = match admin
        .list_keys(pb::ListKeysRequest {
            tenant: tenant.to_string(),
        })
        .await
    {
        Ok(r) => r.into_inner().keys,
        Err(s) => return fail(explain_status(&s)),
    };
    match output {
        Output::Table => {
            if keys.is_empty() {
                println!(
                    "no stored keys{}",
                    if tenant.is_empty() {
                        String::new()
                    } else {
                        format!(" for tenant {tenant:?}")
                    }
                );
                return ExitCode::SUCCESS;
            }
            let now = unix_ms_i64();
            println!(
                "{:<17} {:<16} {:<16} {:<8} {:<21} {:<29} LAST USED",
                "ID", "TENANT", "NAME", "PREFIX", "CREATED", "EXPIRES"
            );
            for k in &keys {
                let expires = match k.expires_at_unix_ms {
                    0 => "never".to_string(),
                    at if at <= now => format!("{} (expired)", when(at)),
                    at => when(at),
                };
                println!(
                    "{:<17} {:<16} {:<16} {:<8} {:<21} {:<29} {}",
                    k.id,
                    k.tenant,
                    if k.name.is_empty() { "-" } else { &k.name },
                    k.prefix,
                    when(k.created_at_unix_ms),
                    expires,
                    when(k.last_used_unix_ms)
                );
            }
        }
        _ => print_value(&Value::Array(keys.iter().map(view).collect()), output),
    }
    ExitCode::SUCCESS
}

/// `routerctl tenants keys revoke KEY_ID`.
pub async fn revoke(admin: &mut Admin, id: &str, output: Output) -> ExitCode {
    match admin
        .revoke_key(pb::RevokeKeyRequest { id: id.to_string() })
        .await
    {
        Ok(r) => {
            let k = r.into_inner();
            match output {
                Output::Table => println!(
                    "revoked key {} of tenant {:?}: proxies refuse it from their next snapshot",
                    k.id, k.tenant
                ),
                _ => print_value(&view(&k), output),
            }
            ExitCode::SUCCESS
        }
        Err(s) => fail(explain_status(&s)),
    }
}
