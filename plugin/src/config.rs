//! Configuration: NVIDIA's device plugin config file (version `v1`), then environment, then flags.
//!
//! An operator's existing `config.yaml` for NVIDIA's plugin keeps working: the same keys
//! (`flags.migStrategy`, `flags.plugin.deviceListStrategy`, `sharing.timeSlicing.resources[]`, ...)
//! mean the same things. Keys NVIDIA's plugin has but nvinject does not act on are accepted and
//! reported once ([`ResolvedConfig::ignored`]); keys nobody knows are refused with their path, as
//! are values that would change behaviour we cannot deliver (GDS, MOFED). `sharing.mps` needs the
//! node's MPS pipe directory (`flags.plugin.mpsPipeDir`), the one the CDI spec's `mps` device mounts.
//!
//! Precedence is flag > environment > file > default. The binary turns flags and environment
//! into one [`Overrides`] value (clap gives a flag priority over its environment variable), and
//! [`resolve()`] lays it over the file. Everything here is a pure function of its inputs.
//!
//! Layout: [`file`](mod@file) is NVIDIA's file schema and its bounded reader, [`resolve`](mod@resolve) the
//! precedence merge into [`Settings`](crate::settings::Settings); both report [`ConfigError`].
//! What the settings mean lives beside their users ([`crate::settings`], [`crate::health`],
//! [`crate::resource_name`], [`crate::duration`]).

mod error;
pub mod file;
pub mod resolve;

pub use error::ConfigError;
pub use file::{CONFIG_VERSION, ConfigFile, MAX_CONFIG_BYTES, load_file, parse_file};
pub use resolve::{Defaults, Overrides, ResolvedConfig, parse_metrics_address, parse_strategy_list, resolve};
