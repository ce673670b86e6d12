//! The managed proxy's cache of its last snapshot (`--cache-dir`): read
//! at start so a proxy whose control plane is away serves the last config
//! it had, and written, off the stream's thread, after each snapshot it
//! applies (through a temporary file, a rename and fsyncs, so a crash
//! leaves the old file or the new one).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use prost::Message;
use router_proto::v1 as pb;

/// The cache's file name in its directory.
pub(super) const CACHE_FILE: &str = "snapshot.pb";

/// Reads the cached snapshot, if any.
pub(crate) fn read_cache(dir: &Path) -> Option<pb::ControlMessage> {
    let bytes = std::fs::read(dir.join(CACHE_FILE)).ok()?;
    pb::ControlMessage::decode(bytes.as_slice()).ok()
}

/// Writes `msg` to the cache in `dir` off the stream's thread (two fsyncs:
/// done inline, they held the thread, and every proxy's next snapshot,
/// for milliseconds). Writes run one at a time, and one older than the
/// last written (a slow write overtaken) is skipped.
pub(super) fn cache_in_background(dir: &Path, msg: &pb::ControlMessage) {
    static WRITTEN: std::sync::Mutex<BTreeMap<PathBuf, (String, u64)>> =
        std::sync::Mutex::new(BTreeMap::new());
    let dir = dir.to_path_buf();
    let bytes = msg.encode_to_vec();
    let (store_id, revision) = (msg.store_id.clone(), msg.revision);
    let write = move || {
        let mut written = WRITTEN.lock().unwrap_or_else(|e| e.into_inner());
        if written
            .get(&dir)
            .is_some_and(|(id, r)| *id == store_id && *r > revision)
        {
            return;
        }
        match write_cache(&dir, &bytes) {
            Ok(()) => {
                written.insert(dir, (store_id, revision));
            }
            Err(e) => tracing::warn!(error = %e, "cannot write the snapshot cache"),
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn_blocking(write);
        }
        Err(_) => write(),
    }
}

fn write_cache(dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{CACHE_FILE}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(CACHE_FILE))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}
