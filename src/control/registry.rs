//! Is this registration acceptable? One validator for every source of registrations —
//! `PUT /v1/sandboxes/{id}`, the `state_dir` log read at start, and values read from etcd:
//! the id is valid, it is not a file-defined sandbox, there is room for it (API writes only:
//! replicas must agree on what etcd holds, and a restart must restore what was accepted),
//! the body parses under this configuration, and its `sources` take no other sandbox's
//! addresses.
//!
//! The work is split where the controller's lock falls: [`parse`] needs only the
//! configuration and runs before the lock is taken (a hostile body costs its parse, never
//! another writer's wait); [`admit`] checks the registrations in force (room, `sources`) and
//! is cheap enough to run under it. [`validate`] is both, for callers that hold a snapshot.

use std::sync::Arc;

use crate::config::{Binding, Config, ConfigErrors};
use crate::control::Registrations;
use crate::policy::sandbox_id::SandboxId;
use crate::sandboxes::set::{CompileError, Sandbox};

/// Where a registration comes from: how its errors are located, and whether room is checked.
#[derive(Debug, Clone, Copy)]
pub enum Origin<'a> {
    /// `PUT /v1/sandboxes/{id}`.
    Api,
    /// The `state_dir` log; the text locates the line's file.
    StateLog(&'a str),
    /// A value under the etcd prefix.
    Etcd,
}

/// Why a registration is refused.
#[derive(Debug, thiserror::Error)]
pub enum Rejected {
    #[error("the id names no valid sandbox: {0}")]
    InvalidId(#[source] crate::policy::sandbox_id::InvalidSandboxId),
    #[error("sandbox {id} is defined in {origin}; change it there (runtime registrations cannot override file-defined sandboxes)")]
    FileDefined { id: String, origin: String },
    #[error("{max} sandboxes are registered (runtime.max_sandboxes); delete some first")]
    Full { max: usize },
    #[error("{0}")]
    Invalid(ConfigErrors),
    #[error("sources {mine} overlaps {theirs} of sandbox {other}: a registration may not claim another sandbox's addresses")]
    Overlap {
        /// The registration's range.
        mine: ipnet::IpNet,
        /// The other sandbox's range it overlaps.
        theirs: ipnet::IpNet,
        /// The other sandbox.
        other: String,
    },
    /// The entries that lie outside a layer's ceiling, one sentence each.
    #[error("{}", .0.join("; "))]
    OutsideCeiling(Vec<String>),
    #[error("cannot compile: {0}")]
    Compile(globset::Error),
    #[error("{0}")]
    NotCompiled(CompileError),
}

/// A registration parsed and compiled before the controller's lock: what is left to do under
/// it is [`admit`] and an insert into the policy set.
pub(crate) struct Ready {
    pub id: SandboxId,
    pub binding: Arc<Binding>,
    /// The body as stored (canonical JSON).
    pub json: Arc<str>,
    /// Compiled with `defaults.ports` of the configuration it was parsed under.
    pub sandbox: Sandbox,
}

/// [`parse`], then compile the sandbox: all the work a registration costs, with no lock held.
pub(crate) fn prepare(
    config: &Config,
    id: &str,
    body: &str,
    origin: Origin<'_>,
) -> Result<Ready, Rejected> {
    let Valid { id, binding, json } = parse(config, id, body, origin)?;
    let binding = Arc::new(binding);
    let sandbox =
        Sandbox::compile(&binding, &config.defaults.ports).map_err(Rejected::NotCompiled)?;
    Ok(Ready {
        id,
        binding,
        json: json.into(),
        sandbox,
    })
}

/// A registration that passed every check.
#[derive(Debug)]
pub struct Valid {
    pub id: SandboxId,
    pub binding: Binding,
    /// The body as stored (canonical JSON).
    pub json: String,
}

impl Valid {
    /// Whether its policy compiles on its own (checked before it is kept or written, so that
    /// one bad registration can never fail the compile of a whole set).
    pub fn compiles(&self, default_ports: &crate::policy::ports::PortSet) -> Result<(), Rejected> {
        let b = &self.binding;
        crate::policy::CompiledPolicy::compile(
            &b.id,
            &b.policy_file,
            &b.network,
            b.enforcement,
            default_ports,
        )
        .map(drop)
        .map_err(Rejected::Compile)
    }
}

/// Check registration `id` with `body` against `config` and the registrations in force.
pub(crate) fn validate(
    config: &Config,
    runtime: &Registrations,
    id: &str,
    body: &str,
    origin: Origin<'_>,
) -> Result<Valid, Rejected> {
    let valid = parse(config, id, body, origin)?;
    room_for(config, runtime, valid.id.as_str(), &valid.binding, origin)?;
    Ok(valid)
}

/// What needs only the configuration: the id is valid and not file-defined, and the body
/// parses under `config`.
pub(crate) fn parse(
    config: &Config,
    id: &str,
    body: &str,
    origin: Origin<'_>,
) -> Result<Valid, Rejected> {
    let sid = SandboxId::new(id).map_err(Rejected::InvalidId)?;
    let id = sid.as_str();
    if config.bindings.iter().any(|b| b.id == id) {
        return Err(Rejected::FileDefined {
            id: id.to_string(),
            origin: config.origin.to_string(),
        });
    }
    let what = match origin {
        Origin::Api => format!("PUT /v1/sandboxes/{id}"),
        Origin::StateLog(file) => format!("{file} (sandbox {id})"),
        Origin::Etcd => format!("etcd (sandbox {id})"),
    };
    let (binding, json) = config
        .parse_runtime_binding(body, &what, id)
        .map_err(Rejected::Invalid)?;
    // Where an entry is written it must lie within its layers' ceilings. A registration read
    // back (state log, etcd) is kept: a ceiling tightened since bounds it at run time instead.
    if matches!(origin, Origin::Api) {
        let outside =
            crate::policy::layer::outside_entries(&binding.network.layers, &binding.network);
        if !outside.is_empty() {
            return Err(Rejected::OutsideCeiling(outside));
        }
    }
    Ok(Valid {
        id: sid,
        binding,
        json,
    })
}

/// What needs the registrations in force: room for a new one (API writes only) and no other
/// sandbox's `sources`.
pub(crate) fn room_for(
    config: &Config,
    runtime: &Registrations,
    id: &str,
    binding: &Binding,
    origin: Origin<'_>,
) -> Result<(), Rejected> {
    let max = config.runtime.max_sandboxes;
    if matches!(origin, Origin::Api) && !runtime.contains_key(id) && runtime.len() >= max {
        return Err(Rejected::Full { max });
    }
    if let Some(clash) = overlapping_source(config, runtime, id, binding) {
        return Err(clash);
    }
    Ok(())
}

/// A `sources` range of `binding` that overlaps a range of another sandbox: a registration
/// may not take over (or carve out) another sandbox's addresses.
fn overlapping_source(
    config: &Config,
    runtime: &Registrations,
    id: &str,
    binding: &Binding,
) -> Option<Rejected> {
    if binding.sources.is_empty() {
        return None;
    }
    // Linear in the sandboxes that have sources (the common runtime registration has none
    // and costs nothing here).
    let others = config
        .bindings
        .iter()
        .chain(runtime.values().map(|r| &*r.binding))
        .filter(|b| !b.sources.is_empty() && b.id != id);
    for other in others {
        for mine in &binding.sources {
            for theirs in &other.sources {
                if mine.contains(&theirs.network()) || theirs.contains(&mine.network()) {
                    return Some(Rejected::Overlap {
                        mine: *mine,
                        theirs: *theirs,
                        other: other.id.to_string(),
                    });
                }
            }
        }
    }
    None
}
