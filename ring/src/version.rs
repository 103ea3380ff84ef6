//! This build's version: the release, the commit it was built from and the ring versions it
//! runs at (see [`crate::core::ring_version`]), for `--version` and for what a member reports.

use crate::core::ring_version::{MemberVersion, SUPPORTED_RING_VERSIONS, Supported};

/// The release (the workspace's package version).
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// The commit this build was made from (`ring/build.rs`), or `unknown`.
pub const COMMIT: &str = env!("GARDEN_RING_COMMIT");

/// What `ringd --version` and `ringctl --version` print after the program's name.
pub const LONG: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("GARDEN_RING_COMMIT"),
    ", ring versions 1-2)"
);

/// What this member reports about itself with its lease renewals.
pub fn this_member() -> MemberVersion {
    MemberVersion {
        binary: RELEASE.to_string(),
        commit: COMMIT.to_string(),
        ring: Supported::THIS_BUILD,
    }
}

/// The ring versions as `--version` prints them.
pub fn ring_versions() -> String {
    let (min, max) = SUPPORTED_RING_VERSIONS;
    format!("{min}-{max}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_long_version_names_the_supported_ring_versions() {
        assert!(
            LONG.ends_with(&format!(", ring versions {})", ring_versions())),
            "{LONG}: keep the literal in LONG equal to SUPPORTED_RING_VERSIONS"
        );
        assert!(LONG.starts_with(RELEASE));
    }
}
