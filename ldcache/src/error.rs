//! The crate's one error type, in a module of its own so that `conf` and `format` can use it
//! without depending on the crate root, which uses them.

use nvinject_fsio::root::RootError;

use crate::work::ScanWork;

/// Why a plan or a cache read failed.
#[derive(Debug, thiserror::Error)]
pub enum LdCacheError {
    /// Neither known magic at the start of the file.
    #[error("not an ld.so.cache (unknown magic); regenerate it with `ldconfig -r <root>`")]
    BadMagic,
    /// The file ends before the structure it announces.
    #[error(
        "ld.so.cache truncated at byte {offset} (file is {len} bytes); regenerate it with `ldconfig -r <root>`"
    )]
    Truncated {
        /// Where the missing data should have been.
        offset: usize,
        /// File size.
        len: usize,
    },
    /// A file or listing in the root could not be used.
    #[error(transparent)]
    Root(#[from] RootError),
    /// An `ld.so.conf` file is unusable.
    #[error("{file} line {line}: {message}")]
    Conf {
        /// The file, inside the root.
        file: String,
        /// 1-based line (0: the file as a whole).
        line: usize,
        /// What is wrong and what to do.
        message: String,
    },
    /// A limit against hostile images was reached.
    #[error("more than {limit} {what}; the image's library configuration is not one ldconfig is meant for")]
    TooMany {
        /// What was counted.
        what: &'static str,
        /// The limit.
        limit: usize,
    },
    /// The scan went past its work budget ([`crate::Options::work_budget`]): the image's library
    /// folders hold far more names, or larger or odder ELF files, than any distribution's.
    #[error(
        "scanning {dir}: the library scan went past its work budget of {budget} units ({work}); the \
         image's library folders are built oddly (far more names, or larger or odder ELF files, than \
         any distribution ships). Ship a current /etc/ld.so.cache in the image (run its own ldconfig \
         when building it), so that only the injected folders are scanned, or move the image's \
         libraries into fewer, smaller folders"
    )]
    WorkBudget {
        /// The folder being scanned, inside the root.
        dir: String,
        /// The budget, in [`ScanWork::units`].
        budget: u64,
        /// What the scan had done when it stopped.
        work: ScanWork,
    },
}
