//! nvinject's release image builder: the image `deploy/` runs, made offline from this workspace's
//! built binaries ([`release_image`]), and the OCI image archives it is written as, assembled from
//! host binaries and the libraries they load ([`image`]). The `nvinject-image` binary (`./x image`)
//! wraps it; the node harness (`nvinject-node-harness`) builds its test images with the same
//! [`image`] code, and the cluster tests deploy the same [`release_image`].
//!
//! Boundary: it reads the binaries and host files it is given and writes one archive (and a temp dir
//! beside it, removed); it runs only `ldd`, `ldconfig -r`, `tar`, `strip` and an installer's
//! `manifests`. It never builds anything, never talks to containerd or a registry, and knows nothing
//! of tests: finding this build's binaries is the harness's job. Errors are its own
//! ([`ImageError`]).

pub mod command;
pub mod error;
pub mod image;
pub mod release_image;

pub use error::{ImageError, Result};
