//! Folding what a GPU adds to a container's start into one `nvinject-hook` process: the injected
//! bind mounts, and the spec's own runs (`create-symlinks`, `enable-cuda-compat`,
//! `update-ldcache`, `disable-device-node-modification`, `update-application-profile`).
//!
//! Measured with `runc run` on the config.json of a 1-GPU container (bench notes in the issue 11
//! closing note): runc makes each mount in `config.json` one at a time (38 driver files: +12 ms
//! over none), and each hook process costs it about 3 ms before the hook does anything; the
//! library cache, rebuilt by scanning every library of the image, was another 5 ms. Here the
//! mounts go to the hook, which makes each in three syscalls with the mountpoint resolved inside
//! the rootfs (`nvinject_fsio::mount`), the spec's runs become one `inject` run, and that run, knowing
//! what it mounted, builds the cache from the image's own (`nvinject_ldcache::plan_incremental`).
//!
//! The CDI spec is not changed (other runtimes applying it get every mount and hook from it) and
//! the container is the same: the `inject` run stands where the spec's runs stood, first among
//! the createContainer hooks after runc's own mounts, so any later hook still sees the files. When
//! another hook comes first, the mounts get a `bind-mounts` run of their own before it and the
//! spec's runs stay as they were. A mount is moved only where that keeps the order mounts are made
//! in: not when any mount left to runc lies below it (runc would make that one first, and ours
//! would then cover it), never when a prestart or createRuntime hook is set (those run between
//! runc's mounts and the first createContainer hook), and never in a user namespace (left to runc's
//! id-mapping logic). Mounts the hook cannot express (other types, options such as `idmap`) stay
//! with runc too.
//! `[runtime] one-hook-run = false` turns all of it off.
//!
//! Specs NVIDIA's tools wrote run their hooks with `nvidia-cdi-hook` (or `nvidia-ctk hook`), which
//! a node that moved to nvinject no longer has. [`translate_nvidia_hooks`] hands the subcommands
//! nvinject-hook implements to nvinject-hook instead, with only the flags it knows for each (so a
//! spec gets from it exactly what our own specs get), before the folding above; see its
//! documentation for the rest.

use serde_json::{Value, json};

use nvinject_cdi::nvinject::{
    CudaCompat, DEFAULT_HOOK_PATH, FlagForm, HOOK_PROGRAM, HookCommand, HookInvocation, HookKind, HookMount,
    NVIDIA_CDI_HOOK, NVIDIA_CTK, NVIDIA_CTK_HOOK,
};
use nvinject_cdi::{HOOK_ENV, Mount};
use nvinject_hook::Bind;

/// What [`translate_nvidia_hooks`] did with one NVIDIA hook run, by subcommand
/// (`create-symlinks=translated`, `chmod=dropped`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvidiaHookAction {
    /// The NVIDIA subcommand (or the whole argv when it has none).
    pub subcommand: String,
    /// `translated`, `kept` (NVIDIA's binary is there and runs it) or `dropped`.
    pub action: &'static str,
}

impl std::fmt::Display for NvidiaHookAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.subcommand, self.action)
    }
}

/// The NVIDIA subcommand and its arguments, when `hook` runs NVIDIA's hook: `nvidia-cdi-hook SUB
/// ...` or `nvidia-ctk hook SUB ...` (by the executable's file name, as nvidia-ctk writes them
/// under any install prefix).
fn nvidia_subcommand(hook: &nvinject_cdi::Hook) -> Option<&[String]> {
    let name = hook.path.rsplit('/').next()?;
    match name {
        NVIDIA_CDI_HOOK => hook.args.get(1..),
        NVIDIA_CTK if hook.args.get(1).map(String::as_str) == Some(NVIDIA_CTK_HOOK) => hook.args.get(2..),
        _ => None,
    }
}

/// nvinject-hook's argv for NVIDIA's `sub_and_args` (`[SUB, flags...]`), or why not. It is read
/// by nvinject-hook's own grammar ([`HookInvocation::parse`]), so it passes only when it is one of
/// the runs our specs carry (create-symlinks, update-ldcache, enable-cuda-compat; no `--mount`,
/// no flag that run does not take), given as `--name=value` or `--name value`; every value is
/// passed on as `--name=value` (one argument, so no value can read as another flag).
fn translated_args(argv0: &str, sub_and_args: &[String]) -> Result<Vec<String>, String> {
    let argv: Vec<&str> = std::iter::once(argv0).chain(sub_and_args.iter().map(String::as_str)).collect();
    let mut run = HookInvocation::parse(&argv).map_err(|e| e.to_string())?;
    let sub = run.command.subcommand();
    if sub.kind().is_none() {
        return Err(format!("nvinject-hook does not implement {sub}"));
    }
    if !run.mounts.is_empty() {
        return Err("--mount is not a flag of NVIDIA's hooks".into());
    }
    run.form = FlagForm::Joined;
    Ok(run.to_args())
}

/// Runs the hooks NVIDIA's tools wrote with nvinject-hook (`hook_path`) where it implements
/// them: `create-symlinks`, `enable-cuda-compat`, `update-ldcache`,
/// `disable-device-node-modification` and `update-application-profile` createContainer runs
/// become the same nvinject-hook runs (same order and timeout; nvinject-hook's minimal
/// environment), and are then folded like our own specs' runs.
///
/// Any other NVIDIA run (the older `chmod`, a flag nvinject-hook does not take) is left as
/// written when NVIDIA's binary is still at that path (`exists`), so a node that keeps the toolkit installed keeps what it did, and is
/// otherwise dropped, as NVIDIA's own hook treats a hook it does not know (a warning, and the
/// container starts). Each is logged with an `nvidia_hook` field, and all are returned.
pub fn translate_nvidia_hooks(
    hooks: &mut Vec<nvinject_cdi::Hook>,
    hook_path: &str,
    exists: &dyn Fn(&str) -> bool,
) -> Vec<NvidiaHookAction> {
    let argv0 = hook_path.rsplit('/').next().unwrap_or(hook_path);
    let mut actions = Vec::new();
    hooks.retain_mut(|hook| {
        let Some(sub_and_args) = nvidia_subcommand(hook) else { return true };
        let subcommand = sub_and_args.first().cloned().unwrap_or_else(|| hook.args.join(" "));
        // nvinject-hook works on the container root before pivot_root, where NVIDIA's hooks run:
        // createContainer. At another point it is not what our own specs do, so not translated.
        let translated = if hook.hook_name == "createContainer" {
            translated_args(argv0, sub_and_args)
        } else {
            Err(format!("a {} hook, not createContainer", hook.hook_name))
        };
        match translated {
            Ok(args) => {
                tracing::debug!(nvidia_hook = %subcommand, path = %hook.path, "run by nvinject-hook");
                hook.path = hook_path.to_owned();
                hook.args = args;
                hook.env = nvinject_cdi::minimal_hook_env();
                actions.push(NvidiaHookAction { subcommand, action: "translated" });
                true
            }
            Err(why) if exists(&hook.path) => {
                tracing::info!(nvidia_hook = %subcommand, path = %hook.path, why, "NVIDIA's hook kept: its binary is installed");
                actions.push(NvidiaHookAction { subcommand, action: "kept" });
                true
            }
            Err(why) => {
                tracing::warn!(nvidia_hook = %subcommand, path = %hook.path, why, "NVIDIA's hook dropped: its binary is not installed and nvinject-hook does not do it");
                actions.push(NvidiaHookAction { subcommand, action: "dropped" });
                false
            }
        }
    });
    actions
}

/// The path of the `nvinject-hook` the edits' own hooks run, if any: the moved mounts are given
/// to the same binary (a spec without nvinject hooks keeps its mounts with runc). The hook is
/// recognised by its file name and a subcommand our specs carry.
pub fn nvinject_hook_path(hooks: &[nvinject_cdi::Hook]) -> Option<&str> {
    hooks
        .iter()
        .find(|h| {
            h.hook_name == "createContainer"
                && h.path.rsplit_once('/').is_some_and(|(_, file)| file == HOOK_PROGRAM)
                && h.args.get(1).is_some_and(|a| a.parse::<HookKind>().is_ok())
        })
        .map(|h| h.path.as_str())
}

/// The nvinject-hook that runs NVIDIA's hooks: the one the edits' own hooks run, else
/// `[regenerate] hook-path`, else the installer's default.
pub fn hook_path_for_nvidia(hooks: &[nvinject_cdi::Hook], configured: Option<&std::path::Path>) -> String {
    nvinject_hook_path(hooks)
        .map(str::to_owned)
        .or_else(|| configured.map(|p| p.to_string_lossy().into_owned()))
        .unwrap_or_else(|| DEFAULT_HOOK_PATH.to_owned())
}

/// What [`fold_into_one_run`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Folded {
    /// Injected bind mounts moved from `mounts` to the hook run.
    pub mounts: usize,
    /// The spec's `nvinject-hook` runs replaced by the one `inject` run (0: none merged).
    pub hooks_merged: usize,
}

/// Moves the mounts of `oci` that came from `injected` (same destination and source) out of
/// `mounts`, and merges them with the spec's leading `nvinject-hook` runs at `hook_path` into one
/// `inject` run; when no such run comes first, the mounts get a `bind-mounts` run of their own,
/// put first.
/// Applied after the edits, so `oci` already has CDI's replacement and depth order.
pub fn fold_into_one_run(oci: &mut Value, injected: &[Mount], hook_path: &str) -> Folded {
    // prestart and createRuntime hooks run after runc's mounts and before any createContainer
    // hook: one of those could look for the files, so with any of them the mounts stay with runc.
    let earlier_hooks = ["prestart", "createRuntime"].iter().any(|point| {
        oci.pointer(&format!("/hooks/{point}")).and_then(Value::as_array).is_some_and(|l| !l.is_empty())
    });
    let binds = if in_user_namespace(oci) || earlier_hooks { Vec::new() } else { take_binds(oci, injected) };
    if binds.is_empty() {
        let leading = oci
            .pointer("/hooks/createContainer")
            .and_then(Value::as_array)
            .map(|c| leading_nvinject_runs(c, hook_path).len())
            .unwrap_or(0);
        if leading < 2 {
            // Nothing to move and nothing to merge: config.json stays as CDI applied it.
            return Folded::default();
        }
    }
    let mounts: Vec<HookMount> = binds
        .iter()
        .map(|b| HookMount {
            source: b.source.to_string_lossy().into_owned(),
            destination: b.destination.to_string_lossy().into_owned(),
            options: b.options.clone(),
        })
        .collect();
    let Some(create) = create_container_hooks(oci) else { return Folded::default() };
    let argv0 = hook_path.rsplit('/').next().unwrap_or(hook_path);
    let leading = leading_nvinject_runs(create, hook_path);
    if !leading.is_empty() && (leading.len() > 1 || !binds.is_empty()) {
        // The spec's own runs come first (the usual case: nothing else adds hooks): one `inject`
        // run does the mounts and then what each of them did, in their order.
        let merged = leading.len();
        let mut run = merge(leading);
        (run.argv0, run.mounts) = (argv0.to_owned(), mounts);
        create.drain(..merged);
        create.insert(0, json!({ "path": hook_path, "args": run.to_args(), "env": HOOK_ENV }));
        return Folded { mounts: binds.len(), hooks_merged: merged };
    }
    if !binds.is_empty() {
        let run = HookInvocation {
            argv0: argv0.to_owned(),
            mounts,
            ..HookInvocation::new(HookCommand::BindMounts)
        };
        create.insert(0, json!({ "path": hook_path, "args": run.to_args(), "env": HOOK_ENV }));
    }
    Folded { mounts: binds.len(), hooks_merged: 0 }
}

/// The spec's leading createContainer runs of `nvinject-hook` at `hook_path` that `inject` can
/// stand in for, parsed: `create-symlinks` runs, at most one `enable-cuda-compat` run,
/// `update-ldcache` runs, at most one `disable-device-node-modification` run and at most one
/// `update-application-profile` run (the order `inject` does them in, and NVIDIA's), with no
/// timeout or `--mount` of their own. A run the hook's grammar does not accept ends them (the hook
/// reports it when it runs).
fn leading_nvinject_runs(create: &[Value], hook_path: &str) -> Vec<HookInvocation> {
    // 0: create-symlinks runs, 1: after the enable-cuda-compat run (at most one: its flags can be
    // given once), 2: update-ldcache runs, 3: after the params run, 4: after the profile run.
    let mut phase = 0;
    let mut runs = Vec::new();
    for hook in create {
        let ours =
            hook.get("path").and_then(Value::as_str) == Some(hook_path) && hook.get("timeout").is_none();
        let args: Option<Vec<&str>> =
            hook.get("args").and_then(Value::as_array).and_then(|a| a.iter().map(Value::as_str).collect());
        let Some(run) = args.filter(|_| ours).and_then(|a| HookInvocation::parse(&a).ok()) else { break };
        let in_order = run.mounts.is_empty()
            && match run.command {
                HookCommand::CreateSymlinks { .. } => advance(&mut phase, 0, false),
                HookCommand::EnableCudaCompat { .. } => advance(&mut phase, 1, true),
                HookCommand::UpdateLdcache { .. } => advance(&mut phase, 2, false),
                HookCommand::DisableDeviceNodeModification => advance(&mut phase, 3, true),
                HookCommand::UpdateApplicationProfile => advance(&mut phase, 4, true),
                HookCommand::BindMounts | HookCommand::Inject { .. } => false,
            };
        if !in_order {
            break;
        }
        runs.push(run);
    }
    runs
}

/// Moves `phase` on to `next` when a run of that phase may come now: at or after the current
/// phase, or strictly after it for a run that may be given only `once`.
fn advance(phase: &mut u8, next: u8, once: bool) -> bool {
    let in_order = if once { *phase < next } else { *phase <= next };
    if in_order {
        *phase = next;
    }
    in_order
}

/// One `inject` run doing what `runs` (from [`leading_nvinject_runs`]) did, in their order; its
/// values are written joined when any run wrote them so.
fn merge(runs: Vec<HookInvocation>) -> HookInvocation {
    let mut links = Vec::new();
    let mut compat = CudaCompat::default();
    let mut folders = Vec::new();
    let mut ldconfig_path = None;
    let mut disable_device_node_modification = false;
    let mut update_application_profile = false;
    let mut form = FlagForm::Separate;
    for run in runs {
        if run.form == FlagForm::Joined {
            form = FlagForm::Joined;
        }
        match run.command {
            HookCommand::CreateSymlinks { links: l } => links.extend(l),
            HookCommand::EnableCudaCompat { compat: c } => compat = c,
            HookCommand::UpdateLdcache { folders: f, ldconfig_path: p } => {
                folders.extend(f);
                // Ignored by the hook, and `inject` takes it once: the first is kept.
                ldconfig_path = ldconfig_path.or(p);
            }
            HookCommand::DisableDeviceNodeModification => disable_device_node_modification = true,
            HookCommand::UpdateApplicationProfile => update_application_profile = true,
            HookCommand::BindMounts | HookCommand::Inject { .. } => {
                unreachable!("leading_nvinject_runs keeps only the runs inject does")
            }
        }
    }
    HookInvocation {
        form,
        ..HookInvocation::new(HookCommand::Inject {
            links,
            compat,
            folders,
            ldconfig_path,
            disable_device_node_modification,
            update_application_profile,
        })
    }
}

/// Takes the mounts of `oci` that came from `injected` and can move out of `mounts`, in order.
fn take_binds(oci: &mut Value, injected: &[Mount]) -> Vec<Bind> {
    let Some(mounts) = oci.get("mounts").and_then(Value::as_array) else {
        return Vec::new();
    };
    let mut movable: Vec<Option<Bind>> = mounts.iter().map(|m| as_injected_bind(m, injected)).collect();
    let destinations: Vec<&str> =
        mounts.iter().map(|m| m.get("destination").and_then(Value::as_str).unwrap_or("")).collect();
    // Until nothing changes: keeping one mount with runc can make a mount above it unmovable.
    loop {
        let mut changed = false;
        for i in 0..mounts.len() {
            if movable[i].is_none() {
                continue;
            }
            let below_one_kept = (0..mounts.len())
                .any(|j| movable[j].is_none() && is_strictly_below(destinations[j], destinations[i]));
            if below_one_kept {
                movable[i] = None;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let binds: Vec<Bind> = movable.iter().flatten().cloned().collect();
    if let Some(list) = oci.get_mut("mounts").and_then(Value::as_array_mut) {
        let mut index = 0;
        list.retain(|_| {
            let keep = movable[index].is_none();
            index += 1;
            keep
        });
    }
    binds
}

/// `hooks.createContainer` of `oci`, made when absent or null; `None` if either is another type
/// (the edits were applied to this same spec, so that shape was already refused there).
fn create_container_hooks(oci: &mut Value) -> Option<&mut Vec<Value>> {
    let hooks = oci.as_object_mut()?.entry("hooks").or_insert_with(|| json!({}));
    if hooks.is_null() {
        *hooks = json!({});
    }
    let create = hooks.as_object_mut()?.entry("createContainer").or_insert_with(|| json!([]));
    if create.is_null() {
        *create = json!([]);
    }
    create.as_array_mut()
}

fn in_user_namespace(oci: &Value) -> bool {
    oci.pointer("/linux/namespaces")
        .and_then(Value::as_array)
        .is_some_and(|ns| ns.iter().any(|n| n.get("type").and_then(Value::as_str) == Some("user")))
}

/// `mount` as a [`Bind`] when it is one of `injected` and the hook can make it.
fn as_injected_bind(mount: &Value, injected: &[Mount]) -> Option<Bind> {
    let destination = mount.get("destination")?.as_str()?;
    let source = mount.get("source")?.as_str()?;
    if !matches!(mount.get("type").and_then(Value::as_str), None | Some("bind") | Some("none")) {
        return None;
    }
    let options: Vec<String> = match mount.get("options") {
        None => Vec::new(),
        Some(v) => v.as_array()?.iter().map(|o| o.as_str().map(str::to_owned)).collect::<Option<_>>()?,
    };
    injected.iter().find(|m| m.container_path == destination && m.host_path == source)?;
    Bind::new(source, destination, &options)
}

/// Whether `path` is below `dir` (not equal to it), by path components.
fn is_strictly_below(path: &str, dir: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    path.strip_prefix(dir).is_some_and(|rest| rest.starts_with('/') && rest.len() > 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPTS: [&str; 5] = ["ro", "nosuid", "nodev", "rbind", "rprivate"];
    const HOOK: &str = "/usr/local/nvinject/bin/nvinject-hook";

    fn cdi_mount(host: &str, container: &str) -> Mount {
        Mount {
            host_path: host.into(),
            container_path: container.into(),
            mount_type: None,
            options: OPTS.map(String::from).to_vec(),
        }
    }

    fn oci_mount(m: &Mount) -> Value {
        json!({ "destination": m.container_path, "source": m.host_path, "options": m.options })
    }

    /// The spec's two runs, as nvinject-cdi writes them and apply_edits puts them.
    fn spec_hooks() -> Value {
        json!([
            { "path": HOOK, "args": ["nvinject-hook", "create-symlinks", "--link", "libcuda.so.1::/usr/lib/libcuda.so"], "env": HOOK_ENV },
            { "path": HOOK, "args": ["nvinject-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"], "env": HOOK_ENV }
        ])
    }

    fn spec_with(mounts: Vec<Value>) -> Value {
        json!({
            "root": { "path": "rootfs" },
            "mounts": mounts,
            "hooks": { "createContainer": spec_hooks() },
            "linux": { "namespaces": [ { "type": "mount" }, { "type": "pid" } ] }
        })
    }

    fn folded(mounts: usize, hooks_merged: usize) -> Folded {
        Folded { mounts, hooks_merged }
    }

    fn args(v: &[&str]) -> Value {
        json!(v)
    }

    const SMI: &str = "/drv/usr/bin/nvidia-smi::/usr/bin/nvidia-smi::ro,nosuid,nodev,rbind,rprivate";
    const CUDA: &str = "/drv/usr/lib/libcuda.so.550::/usr/lib/x86_64-linux-gnu/libcuda.so.550::ro,nosuid,nodev,rbind,rprivate";

    #[test]
    fn injected_binds_and_the_specs_runs_become_one_inject_run_and_the_rest_stay() {
        let libcuda = cdi_mount("/drv/usr/lib/libcuda.so.550", "/usr/lib/x86_64-linux-gnu/libcuda.so.550");
        let smi = cdi_mount("/drv/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi");
        let proc_mount = json!({ "destination": "/proc", "type": "proc", "source": "proc" });
        let user_volume =
            json!({ "destination": "/data", "type": "bind", "source": "/srv/data", "options": ["rbind"] });
        let mut oci =
            spec_with(vec![proc_mount.clone(), user_volume.clone(), oci_mount(&smi), oci_mount(&libcuda)]);
        let after_ours = json!({ "path": "/usr/bin/later-hook", "args": ["later-hook"], "env": [] });
        oci["hooks"]["createContainer"].as_array_mut().unwrap().push(after_ours.clone());
        assert_eq!(fold_into_one_run(&mut oci, &[libcuda.clone(), smi.clone()], HOOK), folded(2, 2));
        assert_eq!(
            oci["mounts"],
            json!([proc_mount, user_volume]),
            "the user's own bind is not ours to move"
        );
        let hooks = oci["hooks"]["createContainer"].as_array().unwrap();
        assert_eq!(hooks.len(), 2, "two runs and the mounts became one process");
        assert_eq!(hooks[0]["path"], HOOK);
        assert_eq!(hooks[0]["env"], json!(HOOK_ENV));
        assert_eq!(
            hooks[0]["args"],
            args(&[
                "nvinject-hook",
                "--mount",
                SMI,
                "--mount",
                CUDA,
                "inject",
                "--link",
                "libcuda.so.1::/usr/lib/libcuda.so",
                "--folder",
                "/usr/lib/x86_64-linux-gnu"
            ])
        );
        assert_eq!(hooks[1], after_ours, "a later hook stays after, as it ran after ours");
    }

    #[test]
    fn another_tools_hook_first_gets_the_mounts_before_it_and_ours_untouched() {
        let libcuda = cdi_mount("/drv/usr/lib/libcuda.so.550", "/usr/lib/x86_64-linux-gnu/libcuda.so.550");
        let mut oci = spec_with(vec![oci_mount(&libcuda)]);
        let theirs = json!({ "path": "/usr/bin/other-hook", "args": ["other-hook"], "env": [] });
        oci["hooks"]["createContainer"].as_array_mut().unwrap().insert(0, theirs.clone());
        assert_eq!(fold_into_one_run(&mut oci, std::slice::from_ref(&libcuda), HOOK), folded(1, 0));
        let hooks = oci["hooks"]["createContainer"].as_array().unwrap();
        assert_eq!(
            hooks[0],
            json!({ "path": HOOK, "args": ["nvinject-hook", "--mount", CUDA, "bind-mounts"], "env": HOOK_ENV })
        );
        assert_eq!(hooks[1], theirs, "it still finds the files, as when runc made them");
        assert_eq!(hooks[2..], spec_hooks().as_array().unwrap()[..]);
    }

    #[test]
    fn runs_are_merged_only_in_the_order_inject_keeps() {
        // update-ldcache before create-symlinks, or a timeout: left as they are.
        let mut reversed = spec_hooks();
        reversed.as_array_mut().unwrap().reverse();
        let mut oci = json!({ "hooks": { "createContainer": reversed.clone() } });
        assert_eq!(fold_into_one_run(&mut oci, &[], HOOK), folded(0, 0));
        // (A leading update-ldcache alone is one run already: nothing to merge.)
        assert_eq!(oci["hooks"]["createContainer"], reversed);
        let mut timed = spec_hooks();
        timed[1]["timeout"] = json!(5);
        let mut oci = json!({ "hooks": { "createContainer": timed.clone() } });
        assert_eq!(fold_into_one_run(&mut oci, &[], HOOK), folded(0, 0));
        assert_eq!(oci["hooks"]["createContainer"], timed);
        // Without mounts to move, the two runs still become one.
        let mut oci = json!({ "hooks": { "createContainer": spec_hooks() } });
        assert_eq!(fold_into_one_run(&mut oci, &[], HOOK), folded(0, 2));
        assert_eq!(oci["hooks"]["createContainer"][0]["args"][1], "inject");
        // A spec with no hooks and nothing to move is left exactly as it was (no empty sections).
        let mut bare = json!({ "mounts": [] });
        assert_eq!(fold_into_one_run(&mut bare, &[], HOOK), folded(0, 0));
        assert_eq!(bare, json!({ "mounts": [] }));
    }

    #[test]
    fn what_runc_must_keep_stays_in_mounts() {
        let fw = cdi_mount("/drv/lib/firmware/nvidia", "/lib/firmware/nvidia");
        let lib = cdi_mount("/drv/lib/libx.so", "/usr/lib/libx.so");
        // Same destination as an injected mount, but another source: replaced by CDI, not ours.
        let other_source =
            json!({ "destination": "/usr/lib/libx.so", "source": "/elsewhere", "options": OPTS });
        // A user mount below an injected directory mount: runc makes it after ours, so ours must stay.
        let below = json!({ "destination": "/lib/firmware/nvidia/extra", "type": "bind", "source": "/x", "options": ["rbind"] });
        let idmapped = Mount { options: vec!["rbind".into(), "idmap".into()], ..cdi_mount("/drv/a", "/a") };
        let tmpfs = Mount { mount_type: Some("tmpfs".into()), ..cdi_mount("tmpfs", "/b") };
        let mounts = vec![oci_mount(&fw), below, other_source, oci_mount(&idmapped), oci_mount(&tmpfs)];
        let mut oci = spec_with(mounts.clone());
        assert_eq!(fold_into_one_run(&mut oci, &[fw.clone(), lib, idmapped, tmpfs], HOOK), folded(0, 2));
        assert_eq!(oci["mounts"], json!(mounts));

        // Kept-ness climbs: a movable mount above a kept one above a user mount stays too.
        let parent = cdi_mount("/drv/opt", "/opt/nvidia");
        let child = Mount {
            options: vec!["rbind".into(), "idmap".into()],
            ..cdi_mount("/drv/opt/sub", "/opt/nvidia/sub")
        };
        let mut oci = spec_with(vec![oci_mount(&parent), oci_mount(&child)]);
        assert_eq!(fold_into_one_run(&mut oci, &[parent, child], HOOK).mounts, 0);
        assert_eq!(oci["mounts"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn a_user_namespace_keeps_the_mounts_with_runc_and_missing_sections_are_made() {
        let lib = cdi_mount("/drv/lib/libx.so", "/usr/lib/libx.so");
        let mut oci = spec_with(vec![oci_mount(&lib)]);
        oci["linux"]["namespaces"].as_array_mut().unwrap().push(json!({ "type": "user" }));
        assert_eq!(fold_into_one_run(&mut oci, std::slice::from_ref(&lib), HOOK), folded(0, 2));
        assert_eq!(oci["mounts"].as_array().unwrap().len(), 1);

        // A createRuntime hook (run before any createContainer hook) keeps them with runc too.
        let mut oci = spec_with(vec![oci_mount(&lib)]);
        oci["hooks"]["createRuntime"] = json!([{ "path": "/usr/bin/other-hook" }]);
        assert_eq!(fold_into_one_run(&mut oci, std::slice::from_ref(&lib), HOOK), folded(0, 2));
        assert_eq!(oci["mounts"].as_array().unwrap().len(), 1);

        let mut bare = json!({ "mounts": [oci_mount(&lib)], "hooks": null });
        assert_eq!(fold_into_one_run(&mut bare, std::slice::from_ref(&lib), HOOK), folded(1, 0));
        assert_eq!(bare["mounts"], json!([]));
        assert_eq!(bare["hooks"]["createContainer"][0]["args"][3], "bind-mounts");
    }

    #[test]
    fn the_hook_path_is_the_one_the_spec_runs() {
        let hook = |path: &str, sub: &str| nvinject_cdi::Hook {
            hook_name: "createContainer".into(),
            path: path.into(),
            args: vec!["x".into(), sub.into()],
            ..Default::default()
        };
        assert_eq!(nvinject_hook_path(&[hook("/usr/bin/nvidia-cdi-hook", "create-symlinks")]), None);
        assert_eq!(
            nvinject_hook_path(&[hook("/opt/x/nvinject-hook", "other"), hook(HOOK, "update-ldcache")]),
            Some(HOOK)
        );
        assert!(
            is_strictly_below("/a/b", "/a")
                && !is_strictly_below("/ab", "/a")
                && !is_strictly_below("/a", "/a")
        );
    }

    fn nv_hook(path: &str, args: &[&str]) -> nvinject_cdi::Hook {
        nvinject_cdi::Hook {
            hook_name: "createContainer".into(),
            path: path.into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: vec!["NVIDIA_CTK_DEBUG=false".into()],
            ..Default::default()
        }
    }

    /// The hooks of NVIDIA's recorded h100x8 spec (nvidia-ctk 1.20), in its order.
    fn nvidia_ctk_hooks() -> Vec<nvinject_cdi::Hook> {
        let cdi = "/usr/bin/nvidia-cdi-hook";
        vec![
            nv_hook(
                cdi,
                &[
                    "nvidia-cdi-hook",
                    "create-symlinks",
                    "--link",
                    "../libnvidia-allocator.so.1::/usr/lib/x86_64-linux-gnu/gbm/nvidia-drm_gbm.so",
                ],
            ),
            nv_hook(
                cdi,
                &[
                    "nvidia-cdi-hook",
                    "create-symlinks",
                    "--link",
                    "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
                ],
            ),
            nv_hook(cdi, &["nvidia-cdi-hook", "enable-cuda-compat", "--host-driver-version=550.54.15"]),
            nv_hook(cdi, &["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"]),
            nv_hook(cdi, &["nvidia-cdi-hook", "disable-device-node-modification"]),
            nv_hook(cdi, &["nvidia-cdi-hook", "update-application-profile"]),
        ]
    }

    #[test]
    fn nvidias_hooks_run_with_ours_where_we_implement_them() {
        let mut hooks = nvidia_ctk_hooks();
        let actions = translate_nvidia_hooks(&mut hooks, HOOK, &|_| false);
        let shown: Vec<String> = actions.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "create-symlinks=translated",
                "create-symlinks=translated",
                "enable-cuda-compat=translated",
                "update-ldcache=translated",
                "disable-device-node-modification=translated",
                "update-application-profile=translated"
            ]
        );
        assert_eq!(hooks.len(), 6);
        assert_eq!(hooks[4].args, ["nvinject-hook", "disable-device-node-modification"]);
        assert_eq!(hooks[5].args, ["nvinject-hook", "update-application-profile"]);
        assert!(hooks.iter().all(|h| h.path == HOOK && h.env == nvinject_cdi::minimal_hook_env()));
        assert_eq!(hooks[2].args, ["nvinject-hook", "enable-cuda-compat", "--host-driver-version=550.54.15"]);
        assert_eq!(hooks[3].args, ["nvinject-hook", "update-ldcache", "--folder=/usr/lib/x86_64-linux-gnu"]);
        // Then they fold into one inject run like our own spec's.
        let mut oci = json!({ "hooks": { "createContainer": serde_json::to_value(&hooks).unwrap() } });
        for h in oci["hooks"]["createContainer"].as_array_mut().unwrap() {
            let h = h.as_object_mut().unwrap();
            h.remove("hookName");
        }
        // All six fold into one process, the last two as inject's switches.
        assert_eq!(fold_into_one_run(&mut oci, &[], HOOK), folded(0, 6));
        assert_eq!(oci["hooks"]["createContainer"].as_array().unwrap().len(), 1);
        assert_eq!(
            oci["hooks"]["createContainer"][0]["args"],
            args(&[
                "nvinject-hook",
                "inject",
                "--link=../libnvidia-allocator.so.1::/usr/lib/x86_64-linux-gnu/gbm/nvidia-drm_gbm.so",
                "--link=libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
                "--host-driver-version=550.54.15",
                "--folder=/usr/lib/x86_64-linux-gnu",
                "--disable-device-node-modification",
                "--update-application-profile"
            ])
        );
        // With NVIDIA's binary still installed, what we do not implement (the older `chmod`) is
        // left to it.
        let mut hooks = nvidia_ctk_hooks();
        hooks.push(nv_hook(
            "/usr/bin/nvidia-cdi-hook",
            &["nvidia-cdi-hook", "chmod", "--mode", "755", "--path", "/dev/dri"],
        ));
        let actions = translate_nvidia_hooks(&mut hooks, HOOK, &|p| p == "/usr/bin/nvidia-cdi-hook");
        assert_eq!(actions.iter().filter(|a| a.action == "kept").count(), 1);
        assert_eq!(hooks.len(), 7);
        assert_eq!(hooks[6].path, "/usr/bin/nvidia-cdi-hook");
        assert_eq!(hooks[6].env, ["NVIDIA_CTK_DEBUG=false"]);
    }

    #[test]
    fn a_translated_spec_gets_nothing_our_own_specs_do_not() {
        let ctk = "/usr/local/bin/nvidia-ctk";
        let cases: [(&[&str], Option<&[&str]>); 10] = [
            // nvidia-ctk's older spelling, both flag forms.
            (
                &["nvidia-ctk", "hook", "create-symlinks", "--link=a::/b", "--link", "c::/d"],
                Some(&["nvinject-hook", "create-symlinks", "--link=a::/b", "--link=c::/d"]),
            ),
            (
                &["nvidia-ctk", "hook", "update-ldcache", "--ldconfig-path", "/sbin/ldconfig"],
                Some(&["nvinject-hook", "update-ldcache", "--ldconfig-path=/sbin/ldconfig"]),
            ),
            // A value that looks like a flag stays a value.
            (
                &["nvidia-ctk", "hook", "create-symlinks", "--link", "--mount=/etc::/x::rbind"],
                Some(&["nvinject-hook", "create-symlinks", "--link=--mount=/etc::/x::rbind"]),
            ),
            // Our hook's own flags and subcommands are not NVIDIA's: never passed on.
            (&["nvidia-ctk", "hook", "create-symlinks", "--mount", "/etc::/x::rbind"], None),
            (&["nvidia-ctk", "hook", "bind-mounts"], None),
            (&["nvidia-ctk", "hook", "inject", "--link", "a::/b"], None),
            (&["nvidia-ctk", "hook", "--mount", "/etc::/x::rbind", "bind-mounts"], None),
            (&["nvidia-ctk", "hook", "update-ldcache", "--container-spec", "/tmp/x.json"], None),
            (&["nvidia-ctk", "hook", "update-ldcache", "stray"], None),
            (&["nvidia-ctk", "hook", "create-symlinks", "--link"], None),
        ];
        for (argv, want) in cases {
            let mut hooks = vec![nv_hook(ctk, argv)];
            let actions = translate_nvidia_hooks(&mut hooks, HOOK, &|_| false);
            match want {
                Some(want) => {
                    assert_eq!(hooks[0].args, want, "{argv:?}");
                    assert_eq!(actions[0].action, "translated");
                }
                None => {
                    assert!(hooks.is_empty(), "{argv:?} must not reach nvinject-hook: {hooks:?}");
                    assert_eq!(actions[0].action, "dropped");
                }
            }
        }
        // Not NVIDIA's hook: untouched, not reported.
        let other = nv_hook("/usr/bin/other-hook", &["other-hook", "create-symlinks"]);
        let ctk_other = nv_hook(ctk, &["nvidia-ctk", "cdi", "list"]);
        let mut hooks = vec![other.clone(), ctk_other.clone()];
        assert!(translate_nvidia_hooks(&mut hooks, HOOK, &|_| false).is_empty());
        assert_eq!(hooks, [other, ctk_other]);
        // A timeout is kept; a hook point other than createContainer is not translated.
        let mut timed = nv_hook("/usr/bin/nvidia-cdi-hook", &["nvidia-cdi-hook", "update-ldcache"]);
        timed.timeout = Some(7);
        let mut hooks = vec![timed.clone()];
        translate_nvidia_hooks(&mut hooks, HOOK, &|_| false);
        assert_eq!((hooks[0].timeout, hooks[0].path.as_str()), (Some(7), HOOK));
        timed.hook_name = "createRuntime".into();
        let mut hooks = vec![timed];
        let actions = translate_nvidia_hooks(&mut hooks, HOOK, &|_| false);
        assert!(hooks.is_empty() && actions[0].action == "dropped", "{hooks:?}");
    }

    #[test]
    fn one_compat_run_folds_between_the_links_and_the_cache() {
        let compat = json!({ "path": HOOK, "args": ["nvinject-hook", "enable-cuda-compat", "--host-driver-version=550.54.15"], "env": HOOK_ENV });
        let mut create = spec_hooks();
        create.as_array_mut().unwrap().insert(1, compat.clone());
        let mut oci = json!({ "hooks": { "createContainer": create } });
        assert_eq!(fold_into_one_run(&mut oci, &[], HOOK), folded(0, 3));
        assert_eq!(
            oci["hooks"]["createContainer"][0]["args"],
            args(&[
                "nvinject-hook",
                "inject",
                "--link",
                "libcuda.so.1::/usr/lib/libcuda.so",
                "--host-driver-version=550.54.15",
                "--folder",
                "/usr/lib/x86_64-linux-gnu"
            ])
        );
        // Two compat runs, or one after the cache run: only what comes before is merged.
        let mut create = spec_hooks();
        create.as_array_mut().unwrap().insert(1, compat.clone());
        create.as_array_mut().unwrap().insert(1, compat.clone());
        let mut oci = json!({ "hooks": { "createContainer": create } });
        assert_eq!(fold_into_one_run(&mut oci, &[], HOOK), folded(0, 2));
        assert_eq!(oci["hooks"]["createContainer"][1], compat);
        let mut create = spec_hooks();
        create.as_array_mut().unwrap().push(compat.clone());
        let mut oci = json!({ "hooks": { "createContainer": create } });
        assert_eq!(fold_into_one_run(&mut oci, &[], HOOK), folded(0, 2));
        assert_eq!(oci["hooks"]["createContainer"][1], compat);
    }
}
