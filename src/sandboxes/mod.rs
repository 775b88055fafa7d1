//! Which sandboxes are in force? Every sandbox of the configuration and of the registrations,
//! its binding compiled into the [`crate::policy`] matchers ([`set`]: the policy set and
//! what decides against it), and the set published to every live exchange ([`live`]). Its
//! own stage, above `config` and `policy`: the compiled sandbox keeps its configuration's
//! binding, and the rule grammar below it imports no configuration.

pub mod live;
pub mod set;
