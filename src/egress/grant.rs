//! What an exchange was allowed to do, and whether a newer policy still allows it: the
//! decision's result that every live exchange keeps ([`crate::relay::watch`] re-checks it on
//! every publication).

use std::net::IpAddr;

use crate::egress::identity::Proof;
use crate::policy::sandbox_id::SandboxId;
use crate::policy::set::PolicySet;
use crate::policy::target::Target;

/// What an exchange was allowed to do: the sandbox (and how the client proved it was that
/// sandbox), the target it asked for and the address actually dialled, decided under policy
/// `generation`.
#[derive(Debug, Clone)]
pub struct Grant {
    pub sandbox: SandboxId,
    pub proof: Proof,
    pub target: Target,
    pub dialed: IpAddr,
    pub generation: u64,
}

impl Grant {
    /// Whether `set` still allows this exchange: it still identifies the client as the same
    /// sandbox (a rotated token ends the tunnels opened with the old one), and it makes
    /// exactly the decision a new connection with the same target and address would get.
    pub fn allowed_by(&self, set: &PolicySet) -> bool {
        if !self.proof.still_identifies(set, &self.sandbox) {
            return false;
        }
        match set.get(self.sandbox.as_str()) {
            None => false,
            Some(sb) => set
                .decide(sb, &self.target, Some(&[self.dialed]))
                .decision
                .verdict
                .proceeds(),
        }
    }
}
