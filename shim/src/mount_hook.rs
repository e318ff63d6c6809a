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
//! Specs NVIDIA's tools wrote are first translated to nvinject-hook runs ([`crate::nvidia_hooks`]),
//! then folded here like our own specs' runs.

use serde_json::{Value, json};

use nvinject_cdi::nvinject::{CudaCompat, FlagForm, HookCommand, HookInvocation, HookMount};
use nvinject_cdi::{HOOK_ENV, Mount};
use nvinject_hook::Bind;

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
///
/// The merged run keeps the OCI `timeout` its runs share (runs with another timeout are not
/// merged); a `bind-mounts` run of the shim's own gets `own_run_timeout_secs` (`[regenerate]
/// hook-timeout-secs`), so no run the shim writes lets runc wait for ever.
pub fn fold_into_one_run(
    oci: &mut Value,
    injected: &[Mount],
    hook_path: &str,
    own_run_timeout_secs: u32,
) -> Folded {
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
            .map(|c| leading_nvinject_runs(c, hook_path).0.len())
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
    let (leading, timeout) = leading_nvinject_runs(create, hook_path);
    if !leading.is_empty() && (leading.len() > 1 || !binds.is_empty()) {
        // The spec's own runs come first (the usual case: nothing else adds hooks): one `inject`
        // run does the mounts and then what each of them did, in their order.
        let merged = leading.len();
        let mut run = merge(leading);
        (run.argv0, run.mounts) = (argv0.to_owned(), mounts);
        create.drain(..merged);
        let mut hook = json!({ "path": hook_path, "args": run.to_args(), "env": HOOK_ENV });
        if let Some(timeout) = timeout {
            hook["timeout"] = timeout;
        }
        create.insert(0, hook);
        return Folded { mounts: binds.len(), hooks_merged: merged };
    }
    if !binds.is_empty() {
        let run = HookInvocation {
            argv0: argv0.to_owned(),
            mounts,
            ..HookInvocation::new(HookCommand::BindMounts)
        };
        create.insert(
            0,
            json!({ "path": hook_path, "args": run.to_args(), "env": HOOK_ENV, "timeout": own_run_timeout_secs }),
        );
    }
    Folded { mounts: binds.len(), hooks_merged: 0 }
}

/// The spec's leading createContainer runs of `nvinject-hook` at `hook_path` that `inject` can
/// stand in for, parsed: `create-symlinks` runs, at most one `enable-cuda-compat` run,
/// `update-ldcache` runs, at most one `disable-device-node-modification` run and at most one
/// `update-application-profile` run (the order `inject` does them in, and NVIDIA's), with no
/// `--mount` of their own and the first one's OCI `timeout` (returned with them; a run with
/// another ends them). A run the hook's grammar does not accept ends them (the hook reports it
/// when it runs).
fn leading_nvinject_runs(create: &[Value], hook_path: &str) -> (Vec<HookInvocation>, Option<Value>) {
    // 0: create-symlinks runs, 1: after the enable-cuda-compat run (at most one: its flags can be
    // given once), 2: update-ldcache runs, 3: after the params run, 4: after the profile run.
    let mut phase = 0;
    let mut runs = Vec::new();
    let timeout = create.first().and_then(|h| h.get("timeout")).cloned();
    for hook in create {
        let ours = hook.get("path").and_then(Value::as_str) == Some(hook_path)
            && hook.get("timeout") == timeout.as_ref();
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
    (runs, timeout)
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
        assert_eq!(fold_into_one_run(&mut oci, &[libcuda.clone(), smi.clone()], HOOK, 30), folded(2, 2));
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
        assert_eq!(fold_into_one_run(&mut oci, std::slice::from_ref(&libcuda), HOOK, 30), folded(1, 0));
        let hooks = oci["hooks"]["createContainer"].as_array().unwrap();
        assert_eq!(
            hooks[0],
            json!({ "path": HOOK, "args": ["nvinject-hook", "--mount", CUDA, "bind-mounts"], "env": HOOK_ENV, "timeout": 30 }),
            "the shim's own run is bounded too ([regenerate] hook-timeout-secs)"
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
        assert_eq!(fold_into_one_run(&mut oci, &[], HOOK, 30), folded(0, 0));
        // (A leading update-ldcache alone is one run already: nothing to merge.)
        assert_eq!(oci["hooks"]["createContainer"], reversed);
        let mut timed = spec_hooks();
        timed[1]["timeout"] = json!(5);
        let mut oci = json!({ "hooks": { "createContainer": timed.clone() } });
        assert_eq!(fold_into_one_run(&mut oci, &[], HOOK, 30), folded(0, 0));
        assert_eq!(oci["hooks"]["createContainer"], timed);
        // Without mounts to move, the two runs still become one.
        let mut oci = json!({ "hooks": { "createContainer": spec_hooks() } });
        assert_eq!(fold_into_one_run(&mut oci, &[], HOOK, 30), folded(0, 2));
        assert_eq!(oci["hooks"]["createContainer"][0]["args"][1], "inject");
        // A spec with no hooks and nothing to move is left exactly as it was (no empty sections).
        let mut bare = json!({ "mounts": [] });
        assert_eq!(fold_into_one_run(&mut bare, &[], HOOK, 30), folded(0, 0));
        assert_eq!(bare, json!({ "mounts": [] }));
    }

    #[test]
    fn the_merged_run_keeps_the_timeout_its_runs_share_and_different_ones_are_not_merged() {
        let mut timed = spec_hooks();
        timed[0]["timeout"] = json!(30);
        timed[1]["timeout"] = json!(30);
        let mut oci = json!({ "hooks": { "createContainer": timed } });
        assert_eq!(fold_into_one_run(&mut oci, &[], HOOK, 7), folded(0, 2));
        let merged = &oci["hooks"]["createContainer"][0];
        assert_eq!((merged["args"][1].as_str(), &merged["timeout"]), (Some("inject"), &json!(30)));
        // Another timeout on the second run: merging would change one of them, so both stay.
        let mut mixed = spec_hooks();
        mixed[0]["timeout"] = json!(30);
        mixed[1]["timeout"] = json!(45);
        let mut oci = json!({ "hooks": { "createContainer": mixed.clone() } });
        assert_eq!(fold_into_one_run(&mut oci, &[], HOOK, 7), folded(0, 0));
        assert_eq!(oci["hooks"]["createContainer"], mixed);
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
        assert_eq!(fold_into_one_run(&mut oci, &[fw.clone(), lib, idmapped, tmpfs], HOOK, 30), folded(0, 2));
        assert_eq!(oci["mounts"], json!(mounts));

        // Kept-ness climbs: a movable mount above a kept one above a user mount stays too.
        let parent = cdi_mount("/drv/opt", "/opt/nvidia");
        let child = Mount {
            options: vec!["rbind".into(), "idmap".into()],
            ..cdi_mount("/drv/opt/sub", "/opt/nvidia/sub")
        };
        let mut oci = spec_with(vec![oci_mount(&parent), oci_mount(&child)]);
        assert_eq!(fold_into_one_run(&mut oci, &[parent, child], HOOK, 30).mounts, 0);
        assert_eq!(oci["mounts"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn a_user_namespace_keeps_the_mounts_with_runc_and_missing_sections_are_made() {
        let lib = cdi_mount("/drv/lib/libx.so", "/usr/lib/libx.so");
        let mut oci = spec_with(vec![oci_mount(&lib)]);
        oci["linux"]["namespaces"].as_array_mut().unwrap().push(json!({ "type": "user" }));
        assert_eq!(fold_into_one_run(&mut oci, std::slice::from_ref(&lib), HOOK, 30), folded(0, 2));
        assert_eq!(oci["mounts"].as_array().unwrap().len(), 1);

        // A createRuntime hook (run before any createContainer hook) keeps them with runc too.
        let mut oci = spec_with(vec![oci_mount(&lib)]);
        oci["hooks"]["createRuntime"] = json!([{ "path": "/usr/bin/other-hook" }]);
        assert_eq!(fold_into_one_run(&mut oci, std::slice::from_ref(&lib), HOOK, 30), folded(0, 2));
        assert_eq!(oci["mounts"].as_array().unwrap().len(), 1);

        let mut bare = json!({ "mounts": [oci_mount(&lib)], "hooks": null });
        assert_eq!(fold_into_one_run(&mut bare, std::slice::from_ref(&lib), HOOK, 30), folded(1, 0));
        assert_eq!(bare["mounts"], json!([]));
        assert_eq!(bare["hooks"]["createContainer"][0]["args"][3], "bind-mounts");
    }

    #[test]
    fn below_means_under_by_path_components() {
        assert!(
            is_strictly_below("/a/b", "/a")
                && !is_strictly_below("/ab", "/a")
                && !is_strictly_below("/a", "/a")
        );
    }

    #[test]
    fn translated_nvidia_hooks_fold_like_ours() {
        let mut hooks = crate::nvidia_hooks::tests::nvidia_ctk_hooks();
        crate::nvidia_hooks::translate_nvidia_hooks(&mut hooks, HOOK, &|_| false);
        let mut oci = json!({ "hooks": { "createContainer": serde_json::to_value(&hooks).unwrap() } });
        for h in oci["hooks"]["createContainer"].as_array_mut().unwrap() {
            let h = h.as_object_mut().unwrap();
            h.remove("hookName");
        }
        // All six fold into one process, the last two as inject's switches.
        assert_eq!(fold_into_one_run(&mut oci, &[], HOOK, 30), folded(0, 6));
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
    }

    #[test]
    fn one_compat_run_folds_between_the_links_and_the_cache() {
        let compat = json!({ "path": HOOK, "args": ["nvinject-hook", "enable-cuda-compat", "--host-driver-version=550.54.15"], "env": HOOK_ENV });
        let mut create = spec_hooks();
        create.as_array_mut().unwrap().insert(1, compat.clone());
        let mut oci = json!({ "hooks": { "createContainer": create } });
        assert_eq!(fold_into_one_run(&mut oci, &[], HOOK, 30), folded(0, 3));
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
        assert_eq!(fold_into_one_run(&mut oci, &[], HOOK, 30), folded(0, 2));
        assert_eq!(oci["hooks"]["createContainer"][1], compat);
        let mut create = spec_hooks();
        create.as_array_mut().unwrap().push(compat.clone());
        let mut oci = json!({ "hooks": { "createContainer": create } });
        assert_eq!(fold_into_one_run(&mut oci, &[], HOOK, 30), folded(0, 2));
        assert_eq!(oci["hooks"]["createContainer"][1], compat);
    }
}
