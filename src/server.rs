//! Process runtime: binds the listeners and serves until a shutdown signal.

use std::path::PathBuf;

use crate::config::Config;

/// Run the proxy with a loaded configuration.
pub fn run(_config: Config, _path: Option<PathBuf>) -> anyhow::Result<()> {
    anyhow::bail!("the data plane is not built yet")
}
