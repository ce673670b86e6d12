//! Child processes stopped when their guard is dropped, and every live one
//! stopped when a harness is interrupted (where destructors do not run).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::BoxError;

/// A child process that is stopped (SIGTERM, then SIGKILL) when dropped,
/// including on every error path.
pub struct ChildGuard {
    name: &'static str,
    child: Child,
}

impl ChildGuard {
    /// Starts `cmd` as `name` (the name errors and warnings use).
    pub fn spawn(name: &'static str, cmd: &mut Command) -> Result<Self, BoxError> {
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {name} ({:?}): {e}", cmd.get_program()))?;
        if let Ok(mut live) = LIVE_CHILDREN.lock() {
            live.push(child.id());
        }
        Ok(Self { name, child })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(description)` if the process has already exited.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!("{} exited early: {status}", self.name)),
            Ok(None) => None,
            Err(e) => Some(format!("cannot wait for {}: {e}", self.name)),
        }
    }
}

impl Drop for ChildGuard {
    // A destructor cannot await: it waits on the real clock.
    #[allow(clippy::disallowed_types, clippy::disallowed_methods)]
    fn drop(&mut self) {
        let pid = self.child.id();
        if let Ok(mut live) = LIVE_CHILDREN.lock() {
            live.retain(|&p| p != pid);
        }
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // A polite stop first: nginx's master only takes its workers down on
        // a signal it can catch. `kill` the utility keeps this crate free of
        // unsafe code.
        let pid = self.child.id().to_string();
        let termed = Command::new("kill")
            .args(["-TERM", &pid])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if termed {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while std::time::Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            eprintln!("{} ignored SIGTERM for 5 s; killing it", self.name);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Children started and not yet stopped, for [`terminate_children`].
static LIVE_CHILDREN: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// Sends SIGTERM to every child still running (used when a harness is
/// interrupted, where the guards' destructors do not run).
pub fn terminate_children() {
    let pids = LIVE_CHILDREN
        .lock()
        .map(|live| live.clone())
        .unwrap_or_default();
    for pid in pids {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_guard_stops_its_child() {
        let mut guard = ChildGuard::spawn("sleep", Command::new("sleep").arg("30")).unwrap();
        assert_eq!(guard.exited(), None);
        let pid = guard.pid();
        assert!(LIVE_CHILDREN.lock().unwrap().contains(&pid));
        drop(guard);
        assert!(!LIVE_CHILDREN.lock().unwrap().contains(&pid));
        // Reaped: no such process any more.
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }
}
