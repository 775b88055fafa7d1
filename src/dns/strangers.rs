//! The records of DNS clients no sandbox has: every `admission.dns_summary_s`, one record per
//! source that asked, from the table the listener fills ([`crate::egress::strangers`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::audit::outcome::Mode;
use crate::audit::record::DnsFacts;
use crate::audit::{AuditGuard, Record};
use crate::egress::strangers::Strangers;
use crate::policy::reason::Reason;
use crate::policy::Decision;
use crate::runtime::Shared;

/// Write the sums of every period until the process ends: one `mode: "dns"` record per
/// source, denied `auth_required` (no sandbox has the address), with `count`, `dropped`, `first_ts` and `last_ts`.
pub async fn summarise(strangers: Arc<Strangers>, shared: Arc<Shared>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        write(&strangers, &shared);
    }
}

/// Write the sums of the period so far (also at shutdown).
pub fn write(strangers: &Strangers, shared: &Shared) {
    let version = shared.policy.load().version_arc();
    for (ip, summed) in strangers.drain() {
        let record = Record::new(
            shared.next_conn_id(),
            SocketAddr::new(ip, 0),
            Mode::Dns,
            version.clone(),
        );
        let detail = format!(
            "{} DNS queries from this address refused (no sandbox has it), {} of them dropped unanswered over admission.dns_queries_per_second_per_source",
            summed.count, summed.dropped
        );
        let facts = DnsFacts {
            name: "-".into(),
            qtype: "-".into(),
            rcode: "REFUSED",
            summed: Some(summed),
            ..DnsFacts::default()
        };
        let mut g = AuditGuard::query(shared.sink.clone(), record, facts, true);
        g.decision(&Decision::deny(Reason::AuthRequired, None));
        g.detail(detail);
        // Written, not counted again as a query (each was counted when refused).
        g.summary();
    }
}
