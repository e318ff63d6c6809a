//! The shim's runtime configuration, `/etc/nvinject/config.toml`: its types, defaults, parsing and
//! checks, in one small crate so that the shim (which reads the file) and the installer (which
//! writes it) share one owner type without the installer linking the shim.
//!
//! Every key is optional and has the default documented in `shim/README.md`; unknown keys are
//! rejected with their name so a typo never silently changes behaviour. Values that name a CDI kind
//! are held as [`nvinject_cdi::Kind`], checked once when the file is read; annotation prefixes
//! follow the one rule the device plugin's prefix follows too
//! ([`nvinject_cdi::nvinject::check_annotation_prefix`]).
//!
//! Boundary: pure data and text. It reads one file ([`Config::load`]) and nothing else; it must
//! never depend on the shim's runtime crates (ttrpc, containerd-shim, protobuf) or on NVML.

use std::path::{Path, PathBuf};

use nvinject_cdi::Kind;
use nvinject_cdi::nvinject::{CDI_ANNOTATION_PREFIX, check_annotation_prefix};
use serde::{Deserialize, Serialize};

/// Where the configuration lives unless `NVINJECT_CONFIG` or `--config` says otherwise.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/nvinject/config.toml";

/// Environment variable naming another configuration file.
pub const CONFIG_ENV: &str = "NVINJECT_CONFIG";

/// The whole file, checked: built only by [`Config::parse`], [`Config::load`] or from
/// [`Config::default`], so a value held here is one the shim accepts. It serializes to the file's
/// TOML (what the installer writes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub struct Config {
    /// Where CDI specs are found and how requests name devices.
    pub cdi: CdiConfig,
    /// Which kinds of device requests are honoured.
    pub requests: RequestsConfig,
    /// The inner shim and logging.
    pub runtime: RuntimeConfig,
    /// Regenerating a spec whose driver version no longer matches the loaded driver.
    pub regenerate: RegenerateConfig,
}

/// `[cdi]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct CdiConfig {
    /// Spec directories, lowest priority first (a later directory wins for the same device).
    pub spec_dirs: Vec<PathBuf>,
    /// Kind given to bare device ids (`1`, `GPU-...`) in requests.
    pub default_kind: Kind,
    /// Annotation key prefixes whose values are CDI device requests, each `<DNS subdomain>/`.
    pub annotation_prefixes: Vec<String>,
    /// Use spec files that fail the trust check ([`nvinject_cdi::trust`]: not root's, writable by
    /// others, or in a folder others may change), logging each use at warn. Off: such a file is
    /// set aside and a Create that needs it is refused naming it and the fix.
    pub accept_untrusted_specs: bool,
}

impl Default for CdiConfig {
    fn default() -> Self {
        CdiConfig {
            spec_dirs: nvinject_cdi::DEFAULT_SPEC_DIRS.iter().map(PathBuf::from).collect(),
            default_kind: nvinject_cdi::nvinject::default_kind(),
            annotation_prefixes: vec![CDI_ANNOTATION_PREFIX.to_owned()],
            accept_untrusted_specs: false,
        }
    }
}

/// `[requests]`. Both keys default to false (the derived `Default`): neither request form is
/// accepted from an unprivileged container unless the operator says so.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct RequestsConfig {
    /// Honour `NVIDIA_VISIBLE_DEVICES` from containers that are not privileged. Off by default:
    /// any pod can set an environment variable, so this would let it bypass the scheduler.
    pub accept_env_unprivileged: bool,
    /// Honour `/dev/null` mounts at `/var/run/nvidia-container-devices/<id>` (the device plugin's
    /// volume-mounts strategy). Off by default, as NVIDIA's toolkit: any pod can ask for a
    /// hostPath `/dev/null` mount at that path, so on its own it would bypass the scheduler. The
    /// key is NVIDIA's (`accept-nvidia-visible-devices-as-volume-mounts`).
    #[serde(rename = "accept-nvidia-visible-devices-as-volume-mounts")]
    pub accept_volume_mounts: bool,
    /// Whether `NVIDIA_DRIVER_CAPABILITIES` narrows what env and volume-mount requests get.
    pub driver_capabilities: DriverCapabilities,
}

/// `[requests] driver-capabilities`: how `NVIDIA_DRIVER_CAPABILITIES` is taken for requests by
/// `NVIDIA_VISIBLE_DEVICES` or volume mounts (CDI requests always get the whole spec).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DriverCapabilities {
    /// Only the files of the capabilities asked for (`utility,compute` when unset), as NVIDIA's
    /// runtime in its legacy mode.
    #[default]
    Honour,
    /// The whole spec whatever the variable says, as NVIDIA's runtime in its `jit-cdi` mode
    /// (toolkit 1.18 and later by default): for fleets whose CUDA images relied on getting the
    /// graphics libraries anyway.
    Ignore,
}

/// `[runtime]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// The inner shim: a path, or a name looked up in `PATH` like containerd does.
    pub delegate: PathBuf,
    /// A file the proxy appends its JSON log lines to, in addition to containerd's shim log.
    pub log_file: Option<PathBuf>,
    /// `error`, `warn`, `info`, `debug` or `trace`.
    pub log_level: String,
    /// Do the injected bind mounts and the spec's `nvinject-hook` runs in one `nvinject-hook`
    /// process instead of runc making each mount and running each hook: the same container,
    /// started faster (`shim::mount_hook`). Off: `config.json` is exactly as CDI applied it.
    pub one_hook_run: bool,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            delegate: PathBuf::from("containerd-shim-runc-v2"),
            log_file: None,
            log_level: "info".to_owned(),
            one_hook_run: true,
        }
    }
}

/// `[regenerate]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct RegenerateConfig {
    /// Regenerate a stale spec written by nvinject-cdi before using it. When off, a stale spec is
    /// used as it is, with a warning.
    pub enabled: bool,
    /// Where the loaded driver's version is read: `<sys-root>/module/nvidia/version` (else
    /// `<proc-root>/driver/nvidia/version`).
    pub sys_root: PathBuf,
    /// Where regeneration reads `devices` and `driver/nvidia-caps/mig-minors`.
    pub proc_root: PathBuf,
    /// Driver root for regeneration when the spec does not record one (`nvinject.io/driver-root`).
    pub driver_root: Option<PathBuf>,
    /// Dev root for regeneration when the spec does not record one (`nvinject.io/dev-root`).
    pub dev_root: Option<PathBuf>,
    /// The NVML library to load for regeneration; default: found under the driver root.
    pub nvml_lib: Option<PathBuf>,
    /// Hook path written into regenerated specs.
    pub hook_path: Option<PathBuf>,
    /// The MPS control daemon's pipe directory (`CUDA_MPS_PIPE_DIRECTORY`), when this node runs
    /// MPS: regenerated specs carry the `mps` device, which mounts it writable and sets the
    /// variable in the containers given that device (never the common edits).
    /// Unset: no MPS pieces (`nvinject-cdi generate --mps-pipe-dir`).
    pub mps_pipe_dir: Option<PathBuf>,
    /// The OCI `timeout` (seconds, 1 to 3600) of the hook runs in regenerated specs, and of the
    /// run the shim adds for the mounts it moves into the hook (`nvinject-cdi generate
    /// --hook-timeout-secs`): runc kills a hook still running after it and fails the start.
    pub hook_timeout_secs: u32,
    /// The spec file the shim keeps present: generated (with the roots above) when a device is
    /// requested and the file is missing, e.g. after a reboot emptied `/var/run/cdi`.
    pub spec_path: Option<PathBuf>,
    /// Root-only directory (made 0700) holding the spec locks (0600), never next to the spec: a
    /// lock any user can open is a lock any user can hold, and hold every GPU Create with it.
    pub lock_dir: PathBuf,
    /// Seconds a Create waits for the spec lock before it fails naming the lock file.
    pub lock_timeout_secs: u64,
    /// The `nvinject-cdi` binary that regenerates specs (run as a child process, so the proxy
    /// never loads NVML); default: `nvinject-cdi` beside the shim's own executable.
    pub generator: Option<PathBuf>,
}

impl Default for RegenerateConfig {
    fn default() -> Self {
        RegenerateConfig {
            enabled: true,
            sys_root: PathBuf::from("/sys"),
            proc_root: PathBuf::from("/proc"),
            driver_root: None,
            dev_root: None,
            nvml_lib: None,
            hook_path: None,
            mps_pipe_dir: None,
            hook_timeout_secs: nvinject_cdi::nvinject::DEFAULT_HOOK_TIMEOUT_SECS,
            spec_path: None,
            lock_dir: PathBuf::from("/run/nvinject/locks"),
            lock_timeout_secs: 10,
            generator: None,
        }
    }
}

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file exists but cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema; the message names the key.
    #[error("{path}: {message} (see the key table in the nvinject shim README)")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, naming the key and line.
        message: String,
    },
    /// A value is well-formed TOML but unusable.
    #[error("{path}: {key} = {value:?}: {fix}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The dotted key.
        key: &'static str,
        /// The offending value.
        value: String,
        /// What to write instead.
        fix: String,
    },
}

/// The file as written, before its checks: what serde reads. Each section that needs no conversion
/// is its checked type already; `[cdi]` holds the kind as text until [`ConfigFile::check`] parses
/// it, so a bad kind is reported like every other unusable value (file, key, value, fix).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
struct ConfigFile {
    cdi: CdiFile,
    requests: RequestsConfig,
    runtime: RuntimeConfig,
    regenerate: RegenerateConfig,
}

/// `[cdi]` as written.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
struct CdiFile {
    spec_dirs: Vec<PathBuf>,
    default_kind: String,
    annotation_prefixes: Vec<String>,
    accept_untrusted_specs: bool,
}

impl Default for CdiFile {
    fn default() -> Self {
        let CdiConfig { spec_dirs, default_kind, annotation_prefixes, accept_untrusted_specs } =
            CdiConfig::default();
        CdiFile {
            spec_dirs,
            default_kind: default_kind.to_string(),
            annotation_prefixes,
            accept_untrusted_specs,
        }
    }
}

impl Config {
    /// Reads `path`; a missing file means all defaults.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Config::parse(&text, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
            Err(source) => Err(ConfigError::Read { path: path.to_owned(), source }),
        }
    }

    /// Parses and checks the text of a configuration file (`path` is for messages).
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim().to_owned(),
        })?;
        file.check(path)
    }

    /// The configuration path this process should use: `NVINJECT_CONFIG` or the default.
    pub fn default_path() -> PathBuf {
        std::env::var_os(CONFIG_ENV).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH))
    }
}

impl ConfigFile {
    /// The checked configuration, or the first unusable value in the order the keys are checked.
    fn check(self, path: &Path) -> Result<Config, ConfigError> {
        let invalid = |key, value: &dyn std::fmt::Debug, fix: &str| ConfigError::Invalid {
            path: path.to_owned(),
            key,
            value: format!("{value:?}"),
            fix: fix.to_owned(),
        };
        if !["error", "warn", "info", "debug", "trace"].contains(&self.runtime.log_level.as_str()) {
            return Err(invalid(
                "runtime.log-level",
                &self.runtime.log_level,
                "use error, warn, info, debug or trace",
            ));
        }
        if let Some(dir) = self.cdi.spec_dirs.iter().find(|d| !d.is_absolute()) {
            return Err(invalid("cdi.spec-dirs", dir, "spec directories must be absolute paths"));
        }
        // The CDI name rules themselves: a kind that passed here is the kind requests get.
        let default_kind: Kind = self.cdi.default_kind.parse().map_err(|_| {
            invalid(
                "cdi.default-kind",
                &self.cdi.default_kind,
                "write vendor/class as CDI names it (letters, digits, '-', '_', '.'), e.g. nvidia.com/gpu",
            )
        })?;
        // The device plugin's prefix follows the same rule, so what one writes the other can read.
        for prefix in &self.cdi.annotation_prefixes {
            check_annotation_prefix(prefix)
                .map_err(|e| invalid("cdi.annotation-prefixes", prefix, &e.to_string()))?;
        }
        if let Some(dir) = &self.regenerate.mps_pipe_dir
            && (!dir.is_absolute() || dir.parent().is_none())
        {
            return Err(invalid(
                "regenerate.mps-pipe-dir",
                dir,
                "give the MPS control daemon's CUDA_MPS_PIPE_DIRECTORY as an absolute path other than /, \
                 e.g. /run/nvidia/mps, or remove the key when the node runs no MPS",
            ));
        }
        if !nvinject_cdi::nvinject::HOOK_TIMEOUT_SECS_RANGE.contains(&self.regenerate.hook_timeout_secs) {
            return Err(invalid(
                "regenerate.hook-timeout-secs",
                &self.regenerate.hook_timeout_secs,
                "give the seconds runc lets a hook run, from 1 to 3600 (default 30)",
            ));
        }
        if self.runtime.delegate.as_os_str().is_empty() {
            return Err(invalid(
                "runtime.delegate",
                &self.runtime.delegate,
                "name the runc shim, e.g. containerd-shim-runc-v2",
            ));
        }
        Ok(Config {
            cdi: CdiConfig {
                spec_dirs: self.cdi.spec_dirs,
                default_kind,
                annotation_prefixes: self.cdi.annotation_prefixes,
                accept_untrusted_specs: self.cdi.accept_untrusted_specs,
            },
            requests: self.requests,
            runtime: self.runtime,
            regenerate: self.regenerate,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/nvinject/config.toml"))
    }

    #[test]
    fn an_empty_file_is_all_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.cdi.spec_dirs, [PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")]);
        assert!(!c.requests.accept_env_unprivileged);
        assert!(!c.requests.accept_volume_mounts);
        assert!(!c.cdi.accept_untrusted_specs, "untrusted specs are refused unless configured");
        assert!(c.regenerate.enabled);
    }

    #[test]
    fn every_key_is_read() {
        let c = parse(
            r#"
            [cdi]
            spec-dirs = ["/a", "/b"]
            default-kind = "example.com/dev"
            annotation-prefixes = ["cdi.k8s.io/", "x.io/"]
            accept-untrusted-specs = true
            [requests]
            accept-env-unprivileged = true
            accept-nvidia-visible-devices-as-volume-mounts = true
            [runtime]
            delegate = "/opt/bin/containerd-shim-runc-v2"
            log-file = "/var/log/nvinject/shim.log"
            log-level = "debug"
            one-hook-run = false
            [regenerate]
            enabled = false
            sys-root = "/host/sys"
            proc-root = "/host/proc"
            driver-root = "/run/nvidia/driver"
            dev-root = "/"
            nvml-lib = "/usr/lib/libnvidia-ml.so.1"
            hook-path = "/usr/local/nvinject/bin/nvinject-hook"
            mps-pipe-dir = "/run/nvidia/mps"
            spec-path = "/var/run/cdi/nvidia.com-gpu.json"
            lock-dir = "/run/x/locks"
            lock-timeout-secs = 3
            hook-timeout-secs = 9
            generator = "/opt/nvinject/bin/nvinject-cdi"
            "#,
        )
        .unwrap();
        assert_eq!(c.cdi.default_kind.as_str(), "example.com/dev");
        assert!(c.cdi.accept_untrusted_specs);
        assert!(c.requests.accept_env_unprivileged);
        assert!(c.requests.accept_volume_mounts);
        assert_eq!(c.runtime.log_file.as_deref(), Some(Path::new("/var/log/nvinject/shim.log")));
        assert!(!c.runtime.one_hook_run);
        assert!(Config::default().runtime.one_hook_run);
        assert_eq!(c.regenerate.sys_root, PathBuf::from("/host/sys"));
        assert_eq!(c.regenerate.spec_path.as_deref(), Some(Path::new("/var/run/cdi/nvidia.com-gpu.json")));
        assert_eq!(c.regenerate.lock_dir, PathBuf::from("/run/x/locks"));
        assert_eq!(c.regenerate.lock_timeout_secs, 3);
        assert_eq!(c.regenerate.hook_timeout_secs, 9);
        assert_eq!(Config::default().regenerate.hook_timeout_secs, 30);
        assert_eq!(c.regenerate.generator.as_deref(), Some(Path::new("/opt/nvinject/bin/nvinject-cdi")));
        assert_eq!(Config::default().regenerate.generator, None, "beside the shim unless configured");
        assert_eq!(c.regenerate.mps_pipe_dir.as_deref(), Some(Path::new("/run/nvidia/mps")));
        assert_eq!(Config::default().regenerate.mps_pipe_dir, None, "no MPS unless configured");
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = parse("[requests]\naccept-env = true\n").unwrap_err().to_string();
        assert!(err.contains("accept-env") && err.contains("/etc/nvinject/config.toml"), "{err}");
        let err = parse("[runtimes]\n").unwrap_err().to_string();
        assert!(err.contains("runtimes"), "{err}");
        // A misspelt trust switch must not silently leave the host strict or open.
        let err = parse("[cdi]\naccept-untrusted-spec = true\n").unwrap_err().to_string();
        assert!(err.contains("accept-untrusted-spec") && err.contains("accept-untrusted-specs"), "{err}");
        let err = parse("[runtime]\naccept-untrusted-specs = true\n").unwrap_err().to_string();
        assert!(err.contains("accept-untrusted-specs"), "{err}");
    }

    #[test]
    fn unusable_values_are_named_with_a_fix() {
        let cases = [
            ("[runtime]\nlog-level = \"loud\"", "runtime.log-level"),
            ("[cdi]\nspec-dirs = [\"cdi\"]", "cdi.spec-dirs"),
            ("[cdi]\ndefault-kind = \"gpu\"", "cdi.default-kind"),
            // Shaped like vendor/class but not a CDI kind: it would never match a spec.
            ("[cdi]\ndefault-kind = \"nvidia.com/g pu\"", "cdi.default-kind"),
            ("[cdi]\ndefault-kind = \"-nvidia.com/gpu\"", "cdi.default-kind"),
            ("[cdi]\nannotation-prefixes = [\"\"]", "cdi.annotation-prefixes"),
            ("[cdi]\nannotation-prefixes = [\"cdi.k8s.io/\", \"cdi.k8s.io\"]", "cdi.annotation-prefixes"),
            ("[cdi]\nannotation-prefixes = [\"cdi_k8s.io/\"]", "cdi.annotation-prefixes"),
            ("[runtime]\ndelegate = \"\"", "runtime.delegate"),
            ("[regenerate]\nmps-pipe-dir = \"nvidia-mps\"", "regenerate.mps-pipe-dir"),
            ("[regenerate]\nmps-pipe-dir = \"/\"", "regenerate.mps-pipe-dir"),
            ("[regenerate]\nhook-timeout-secs = 0", "regenerate.hook-timeout-secs"),
            ("[regenerate]\nhook-timeout-secs = 3601", "regenerate.hook-timeout-secs"),
            (
                "[requests]\naccept-nvidia-visible-devices-as-volume-mounts = \"yes\"",
                "accept-nvidia-visible-devices-as-volume-mounts",
            ),
            ("[requests]\naccept-volume-mounts = true", "accept-volume-mounts"),
            ("[cdi]\naccept-untrusted-specs = \"yes\"", "accept-untrusted-specs"),
        ];
        for (text, key) in cases {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
    }

    #[test]
    fn annotation_prefixes_are_checked_by_the_cdi_contract_rule() {
        assert_eq!(Config::default().cdi.annotation_prefixes, [CDI_ANNOTATION_PREFIX]);
        // The message names the file, the key, the prefix refused (quoted as every value is), why
        // and what to write.
        let err = parse("[cdi]\nannotation-prefixes = [\"cdi.k8s.io/\", \"x.io\"]").unwrap_err();
        assert!(matches!(err, ConfigError::Invalid { key: "cdi.annotation-prefixes", .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "/etc/nvinject/config.toml: cdi.annotation-prefixes = \"\\\"x.io\\\"\": `x.io` is not of the form \
             <domain>/ (one '/', at the end): write e.g. cdi.k8s.io/"
        );
        let err = parse("[cdi]\nannotation-prefixes = [\"\"]").unwrap_err().to_string();
        assert!(err.contains("every annotation a device request"), "{err}");
    }

    #[test]
    fn the_default_kind_is_nvidias_and_a_kind_is_checked_once_when_read() {
        assert_eq!(Config::default().cdi.default_kind.as_str(), "nvidia.com/gpu");
        let c = parse("[cdi]\ndefault-kind = \"example.com/dev\"").unwrap();
        assert_eq!((c.cdi.default_kind.vendor(), c.cdi.default_kind.class()), ("example.com", "dev"));
        // The whole message, as before the kind became typed: file, key, value and fix.
        let err = parse("[cdi]\ndefault-kind = \"gpu\"").unwrap_err();
        assert!(matches!(err, ConfigError::Invalid { key: "cdi.default-kind", .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "/etc/nvinject/config.toml: cdi.default-kind = \"\\\"gpu\\\"\": write vendor/class as CDI names it \
             (letters, digits, '-', '_', '.'), e.g. nvidia.com/gpu"
        );
        // Not a string at all: the parser's message, naming the key.
        let err = parse("[cdi]\ndefault-kind = 5").unwrap_err();
        assert!(
            matches!(err, ConfigError::Parse { .. }) && err.to_string().contains("default-kind"),
            "{err}"
        );
    }

    #[test]
    fn what_is_written_reads_back_the_same() {
        let mut c = Config::default();
        c.cdi.default_kind = "example.com/dev".parse().unwrap();
        c.cdi.spec_dirs.push(PathBuf::from("/opt/cdi"));
        c.cdi.accept_untrusted_specs = true;
        c.requests.accept_volume_mounts = true;
        c.requests.driver_capabilities = DriverCapabilities::Ignore;
        c.runtime.log_file = Some(PathBuf::from("/var/log/nvinject.log"));
        c.regenerate.mps_pipe_dir = Some(PathBuf::from("/run/nvidia/mps"));
        for config in [Config::default(), c] {
            let text = toml::to_string(&config).unwrap();
            assert!(text.contains(&format!("default-kind = \"{}\"", config.cdi.default_kind)), "{text}");
            assert_eq!(parse(&text).unwrap(), config, "{text}");
        }
    }

    #[test]
    fn a_missing_file_is_defaults_and_an_unreadable_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Config::load(&dir.path().join("absent.toml")).unwrap(), Config::default());
        // A directory in place of the file cannot be read as text.
        assert!(matches!(Config::load(dir.path()), Err(ConfigError::Read { .. })));
    }
}
