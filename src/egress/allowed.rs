//! What the decision stages hand to a relay: an allowed request or connection, dialled, with
//! its audit guard, its grant (what the relay watches) and its place under the sandbox's
//! limits.

use std::sync::Arc;

use crate::audit::AuditGuard;
use crate::egress::grant::Grant;
use crate::egress::limits::ConnectionSlot;
use crate::egress::Dialed;
use crate::policy::set::Sandbox;

/// An allowed request, with how its destination is reached (`C`: a socket dialled to a
/// checked address; for a forwarded request, possibly a kept connection to one —
/// [`crate::relay::forward::Conn`]): everything the tunnel or the forwarder needs.
pub struct Allowed<C = Dialed> {
    pub audit: AuditGuard,
    pub sandbox: Arc<Sandbox>,
    pub grant: Grant,
    pub dialed: C,
    /// The sandbox's concurrent-connection slot, held until the exchange ends.
    pub slot: ConnectionSlot,
}
