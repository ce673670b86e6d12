//! The proxy's latest route records, sent when the control plane asks
//! over the config stream (the console's Decisions page): from the route
//! log's ring (`router_route_log::ring`), newest first, in parts under the
//! stream's message limit.

use router_proto::v1 as pb;
use router_route_log::ring::DecisionRing;

/// Bytes of lines in one `Decisions` part: well under the control
/// plane's per-message limit (`router_proto::MAX_PROXY_MESSAGE_BYTES`,
/// 64 KiB) with a line of up to `ring::LINE_MAX` (16 KiB) and the framing.
pub(super) const DECISIONS_PART_BYTES: usize = 40 * 1024;
/// Bytes of lines sent for one request at most, all parts together.
pub(crate) const DECISIONS_MAX_BYTES: usize = 1024 * 1024;

/// The answer to a request for this proxy's latest route records: the
/// newest first, within what was asked and [`DECISIONS_MAX_BYTES`], in
/// parts of at most [`DECISIONS_PART_BYTES`]; the last one says so.
pub(crate) fn decision_parts(
    ring: Option<&DecisionRing>,
    q: &pb::DecisionsRequest,
) -> Vec<pb::ProxyMessage> {
    let max_bytes = (q.max_bytes as usize).min(DECISIONS_MAX_BYTES);
    let (lines, capacity) = match ring {
        Some(r) => (
            r.latest(q.max_records as usize, max_bytes),
            u32::try_from(r.capacity()).unwrap_or(u32::MAX),
        ),
        None => (Vec::new(), 0),
    };
    let mut parts: Vec<Vec<String>> = vec![Vec::new()];
    let mut bytes = 0usize;
    for line in lines {
        let line = String::from_utf8_lossy(&line).into_owned();
        if bytes + line.len() > DECISIONS_PART_BYTES && bytes > 0 {
            parts.push(Vec::new());
            bytes = 0;
        }
        bytes += line.len();
        if let Some(part) = parts.last_mut() {
            part.push(line);
        }
    }
    let n = parts.len();
    parts
        .into_iter()
        .enumerate()
        .map(|(i, lines)| pb::ProxyMessage {
            msg: Some(pb::proxy_message::Msg::Decisions(pb::Decisions {
                id: q.id.clone(),
                lines,
                last: i + 1 == n,
                capacity,
            })),
        })
        .collect()
}
