//! Where the connection flags may stand on `routerctl`'s command line.
//!
//! The control-plane commands come in groups (`policy`, `backends`,
//! `circuits`, `cache`, `proxies`, `route`, `tenants`, `tasks`), and the flags that
//! say how to reach the control plane and how to print (`--server`,
//! `--token`, `--ca-file`, `-o`/`--output`) belong to those groups only:
//! `up`, `drill`, `mock` and `approve` neither take nor show them. Inside
//! a group clap accepts them anywhere after the group's name
//! (`routerctl policy --server URL apply f`, `routerctl policy apply f
//! --server URL`).
//!
//! Scripts written against the earlier interface put them first
//! (`routerctl --server URL policy apply f`, `routerctl -o json policy
//! history`), as kubectl does. [`hoist`] keeps that working: connection
//! flags that stand before a group's name are moved to just after it,
//! before clap parses the line. Nothing else is moved: before any other
//! command (or none) the line is left as it is, so clap refuses the flag
//! there as it always did (`unexpected argument '--server'`), and a value
//! is never taken for a flag (`--token policy` is the token `policy`).

use std::ffi::OsString;

/// The command groups that take the connection flags.
pub const GROUPS: [&str; 9] = [
    "policy", "backends", "circuits", "cache", "proxies", "route", "tenants", "tasks", "rollout",
];

/// The connection and output flags, long spellings; each takes a value.
const LONG: [&str; 4] = ["--server", "--token", "--ca-file", "--output"];

/// How many arguments the connection flag at the head of `args` spans (1
/// with its value attached, 2 with the value next), or `None` when `args`
/// does not start with one (or its value is missing).
fn flag_len(args: &[OsString]) -> Option<usize> {
    let first = args.first()?.to_str()?;
    let with_next = if args.len() >= 2 { Some(2) } else { None };
    if first == "-o" || LONG.contains(&first) {
        return with_next;
    }
    if LONG.iter().any(|l| {
        first
            .strip_prefix(l)
            .is_some_and(|rest| rest.starts_with('='))
    }) {
        return Some(1);
    }
    // `-ojson`, `-o=json`.
    if first.len() > 2 && first.starts_with("-o") {
        return Some(1);
    }
    None
}

/// `args` (the whole command line, program name first) with the connection
/// flags that precede a command group's name moved to just after it; any
/// other line unchanged (see the module docs).
pub fn hoist(args: Vec<OsString>) -> Vec<OsString> {
    let mut i = 1;
    while i < args.len() {
        match flag_len(&args[i..]) {
            Some(n) => i += n,
            None => break,
        }
    }
    let is_group = args
        .get(i)
        .and_then(|a| a.to_str())
        .is_some_and(|a| GROUPS.contains(&a));
    if i == 1 || !is_group {
        return args;
    }
    let mut out = Vec::with_capacity(args.len());
    let mut it = args.into_iter();
    out.extend(it.next());
    let flags: Vec<OsString> = it.by_ref().take(i - 1).collect();
    out.extend(it.next());
    out.extend(flags);
    out.extend(it);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    fn hoisted(s: &str) -> String {
        hoist(line(s))
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn flags_before_a_group_go_just_after_its_name() {
        assert_eq!(
            hoisted("routerctl --server http://cp:50051 policy apply -f p.yaml"),
            "routerctl policy --server http://cp:50051 apply -f p.yaml"
        );
        assert_eq!(
            hoisted(
                "routerctl -o json --token t --ca-file ca.pem --server=http://x policy history"
            ),
            "routerctl policy -o json --token t --ca-file ca.pem --server=http://x history"
        );
        assert_eq!(
            hoisted("routerctl -ojson --output=yaml circuits list"),
            "routerctl circuits -ojson --output=yaml list"
        );
        for group in GROUPS {
            assert_eq!(
                hoisted(&format!("routerctl --server u {group} x")),
                format!("routerctl {group} --server u x")
            );
        }
    }

    #[test]
    fn other_lines_are_left_alone() {
        for s in [
            "routerctl policy --server u apply -f p",
            "routerctl policy apply -f p --server u",
            // Not a group: clap refuses the flag as before.
            "routerctl --server u up",
            "routerctl --server u drill",
            "routerctl --token t approve --route r",
            "routerctl --server u",
            "routerctl --server",
            "routerctl --help",
            "routerctl",
            // A value is never a flag or a group: `--token policy` is the
            // token `policy`, and no group follows it.
            "routerctl --token policy",
            "routerctl --verbose policy history",
        ] {
            assert_eq!(hoisted(s), s, "{s}");
        }
        // The token is the value `--server`, then the group.
        assert_eq!(
            hoisted("routerctl --token --server policy history"),
            "routerctl policy --token --server history"
        );
    }

    #[test]
    fn every_spelling_is_known() {
        for a in [
            "--server",
            "--server=u",
            "--token",
            "--token=t",
            "--ca-file",
            "--ca-file=x",
            "-o",
            "-ojson",
            "-o=json",
            "--output",
            "--output=json",
        ] {
            assert!(flag_len(&line(&format!("{a} v"))).is_some(), "{a}");
        }
        for a in ["--servers", "-x", "--dry-run", "policy", "--", "-"] {
            assert_eq!(flag_len(&line(&format!("{a} v"))), None, "{a}");
        }
    }
}
