//! A [`PolicySet`] edited in place ([`PolicySet::edit`]): a registration, a removal or a
//! grant compiles and replaces only its own sandbox, and the version is computed again from
//! the digests kept, not from every sandbox.

use std::sync::Arc;

use super::{compile_sandbox, version_of, xor, CompileError, PolicySet, Sandbox};
use crate::config::Binding;
use crate::policy::granted::Granted;
use crate::policy::sandbox_id::SandboxId;

/// Changes to a [`PolicySet`] in progress ([`PolicySet::edit`]).
pub struct SetEdit(pub(super) PolicySet);

impl SetEdit {
    /// Add or replace `b`, compiling only it.
    pub fn put(&mut self, b: &Arc<Binding>) -> Result<(), CompileError> {
        let sb = compile_sandbox(b, &self.0.default_ports)?;
        self.insert(sb);
        Ok(())
    }

    /// Add or replace a sandbox compiled already ([`Sandbox::compile`], with this set's
    /// default ports): no compile work.
    pub fn insert(&mut self, sb: Sandbox) {
        let b = sb.binding.clone();
        let next = &mut self.0;
        next.remove_entry(&b.id);
        let id: Arc<str> = b.id.as_str().into();
        for s in &b.sources {
            next.sources.insert(*s, id.clone());
        }
        xor(&mut next.sandboxes_digest, &sb.digest);
        next.scoped += usize::from(sb.scoped());
        next.sandboxes.insert(b.id.clone(), Arc::new(sb));
    }

    /// Remove sandbox `id` (nothing when absent).
    pub fn remove(&mut self, id: &str) {
        self.0.remove_entry(id);
        self.0.grants.remove(id);
        self.0.grants_digest = super::digest::grants(&self.0.grants);
    }

    /// Replace sandbox `id`'s grants (none: `granted` empty).
    pub fn grants(&mut self, id: &SandboxId, granted: Granted) {
        if granted.entries.is_empty() {
            self.0.grants.remove(id);
        } else {
            self.0.grants.insert(id.clone(), Arc::new(granted));
        }
        self.0.grants_digest = super::digest::grants(&self.0.grants);
    }

    /// The set as edited.
    pub fn get(&self, id: &str) -> Option<&Arc<Sandbox>> {
        self.0.get(id)
    }

    /// The edited set, with its new version.
    pub fn finish(mut self) -> PolicySet {
        self.0.version = version_of(
            &self.0.sandboxes_digest,
            &self.0.defaults_digest,
            &self.0.grants_digest,
        );
        self.0
    }
}
