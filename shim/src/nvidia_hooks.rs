//! Specs NVIDIA's tools wrote run their hooks with `nvidia-cdi-hook` (or `nvidia-ctk hook`), which
//! a node that moved to nvinject no longer has. [`translate_nvidia_hooks`] hands the subcommands
//! nvinject-hook implements to nvinject-hook instead, with only the flags it knows for each (so a
//! spec gets from it exactly what our own specs get); see its documentation for the rest. Which
//! nvinject-hook runs them is [`hook_path_for_nvidia`]: the one the edits' own runs name
//! ([`nvinject_hook_path`], which also tells the folding in [`crate::mount_hook`] where the mounts
//! go). The translated runs are then folded like our own specs' runs; this module knows nothing of
//! that.

use nvinject_cdi::nvinject::{
    DEFAULT_HOOK_PATH, FlagForm, HOOK_PROGRAM, HookInvocation, HookKind, NVIDIA_CDI_HOOK, NVIDIA_CTK,
    NVIDIA_CTK_HOOK,
};

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

/// The path of the `nvinject-hook` the edits' own hooks run, if any, recognised by its file name
/// and a subcommand our specs carry: NVIDIA's runs are handed to the same binary
/// ([`hook_path_for_nvidia`]), and so are the moved mounts (`crate::mount_hook`; a spec without
/// nvinject hooks keeps its mounts with runc).
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const HOOK: &str = "/usr/local/nvinject/bin/nvinject-hook";

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
    pub(crate) fn nvidia_ctk_hooks() -> Vec<nvinject_cdi::Hook> {
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
}
