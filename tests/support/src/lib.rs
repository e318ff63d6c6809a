//! The one convention for tests that need root (mknod, mounts, namespaces, chown, containerd and the
//! kubelet), so that such a test can never pass without having run:
//!
//! ```text
//! #[test]
//! #[ignore = "needs root"]
//! fn makes_device_nodes() {
//!     nvinject_test_support::require_root("mknod");
//!     ...
//! }
//! ```
//!
//! - Run by hand without root (`cargo test`), libtest skips it and counts it as ignored.
//! - `./x test` (what CI runs, as root) passes `--include-ignored`: it runs, and [`require_root`] fails
//!   it at once, naming what it needs, if it is not root. Nothing skips itself and passes.
//! - By hand as root: `cargo test -p <crate> -- --include-ignored`.
//!
//! The marker text is exactly [`MARKER`] (an attribute cannot name a constant); the workspace test
//! `tests/convention.rs` of this crate fails when a test calls [`require_root`] without it, carries it
//! without calling [`require_root`], or carries any other `#[ignore]`. This crate is a
//! dev-dependency only: nothing shipped links it.

/// The reason every root-only test's `#[ignore = "..."]` carries, and no other test's.
pub const MARKER: &str = "needs root";

/// Panics unless this process is root, saying what the test needs root for and how to run it. The first
/// statement of every test marked `#[ignore = "needs root"]`.
pub fn require_root(needs: &str) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root ({needs}): run it as root with `-- --include-ignored` (`./x test` does; CI runs \
         as root); without root, leave out --include-ignored and it is counted as ignored"
    );
}
