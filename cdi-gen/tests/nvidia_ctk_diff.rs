//! The semantic difference between our specs for the simulated node (`tests/golden/*.yaml`, made
//! by the `generate` tests) and what NVIDIA's `nvidia-ctk cdi generate` 1.20 wrote on the same node
//! (`cdi/tests/golden/nvidia-ctk-1.20.0`, recorded; see its README). Pure: reads files only.
//!
//! Paths are compared after removing the roots (`@DRIVER_ROOT@`, `@DEV_ROOT@` in NVIDIA's files;
//! ours are rebased to `/`), links after following each spec's own links to the file. Every
//! difference that remains is listed below with why it is intended; a difference not listed, or a
//! listed one that no longer occurs, fails the test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use nvinject_cdi::{ContainerEdits, Format, Spec, codec};

/// Mount container paths we have and NVIDIA does not, each with the reason.
const OURS_ONLY_MOUNTS: &[(&str, &str)] = &[];

/// Mount container paths NVIDIA has and we do not. Must stay empty: the point of the comparison.
const NVIDIA_ONLY_MOUNTS: &[(&str, &str)] = &[];

/// Links (by link path) we make and NVIDIA does not, each with the reason.
const OURS_ONLY_LINKS: &[(&str, &str)] = &[
    (
        "/usr/lib/x86_64-linux-gnu/libnvidia-egl-gbm.so.1",
        "SONAME link of a library with its own version: 15_nvidia_gbm.json names libnvidia-egl-gbm.so.1, \
         so EGL finds GBM without depending on ldconfig having run in the container; nvidia-ctk links \
         only `.so.<driver version>` files",
    ),
    (
        "/usr/lib/x86_64-linux-gnu/libnvidia-egl-wayland.so.1",
        "the same for 10_nvidia_wayland.json's libnvidia-egl-wayland.so.1",
    ),
];

/// Device nodes whose major the kernel assigns when the module loads (`nvidia-uvm`,
/// `nvidia-caps`): the simulated node takes a free one from the building host's `/proc/devices`,
/// and NVIDIA's recording was built on another host than our goldens' fixture. Compared as "one
/// major for the whole group, the same in every device", not by number.
const DYNAMIC_MAJOR_NODES: &[(&str, &str)] =
    &[("/dev/nvidia-uvm", "nvidia-uvm"), ("/dev/nvidia-caps/", "nvidia-caps")];

/// Mount options that differ, by kind of mount: (container path prefix, ours only, NVIDIA's only,
/// reason).
const OPTION_DIFFERENCES: &[(&str, &[&str], &[&str], &str)] = &[(
    "/run/",
    &["ro"],
    &[],
    "daemon sockets read-only: connect(2) on a socket needs no writable mount, and nothing \
         else there is the container's to change",
)];

/// Hooks (by subcommand) NVIDIA's spec has and ours need not: NVIDIA's `nvidia-cdi-hook`
/// features, each either done another way here or a separate part of the work.
/// None today: our specs carry every run NVIDIA's do, and nvinject-hook implements each.
const NVIDIA_ONLY_HOOKS: &[(&str, &str)] = &[];

/// Environment NVIDIA's spec sets and ours need not.
const NVIDIA_ONLY_ENV: &[(&str, &str)] = &[(
    "NVIDIA_CTK_LIBCUDA_DIR",
    "read only by NVIDIA's nvidia-cdi-hook to find libcuda; our hook is given its folders in its arguments",
)];

/// Device-node fields that differ everywhere: (field, ours, NVIDIA's, reason).
const NODE_DIFFERENCES: &[(&str, &str, &str, &str)] = &[
    (
        "type",
        "c",
        "(absent)",
        "we write every node's type so applying a spec never needs to stat the host; \
         NVIDIA leaves it for the runtime",
    ),
    (
        "permissions",
        "rw",
        "rwm",
        "cgroup `m` (mknod) is not needed: the runtime creates the node, the container never does",
    ),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_owned()
}

fn ours(preset: &str) -> Spec {
    let path = root().join(format!("tests/golden/{preset}.yaml"));
    let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    codec::parse(&text, Format::Yaml, &path).unwrap()
}

fn nvidia(name: &str) -> Spec {
    let path = root().join(format!("../cdi/tests/golden/nvidia-ctk-1.20.0/{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // Their roots were temporary directories; ours are rebased to `/`.
    let text = text.replace("@DRIVER_ROOT@", "").replace("@DEV_ROOT@", "");
    codec::parse(text.as_bytes(), Format::Json, &path).unwrap()
}

/// A device node as both specs must agree on it (type and permissions compared separately): path,
/// host path, major (or the name of its dynamic group), minor, file mode.
type Node = (String, String, String, i64, Option<u32>);

fn nodes(edits: &ContainerEdits) -> BTreeSet<Node> {
    edits
        .device_nodes
        .iter()
        .map(|n| {
            let major = match DYNAMIC_MAJOR_NODES.iter().find(|(prefix, _)| n.path.starts_with(prefix)) {
                Some((_, group)) => (*group).to_owned(),
                None => format!("{:?}", n.major),
            };
            // A missing host path is the path itself; NVIDIA leaves out `minor` when it is 0, which
            // CDI reads as 0.
            let host = n.host_path.clone().unwrap_or_else(|| n.path.clone());
            (n.path.clone(), host, major, n.minor.unwrap_or(0), n.file_mode)
        })
        .collect()
}

/// Each dynamic group's majors across the whole spec: must be one number per group.
fn dynamic_majors(spec: &Spec) -> BTreeMap<&'static str, BTreeSet<Option<i64>>> {
    let mut out: BTreeMap<&'static str, BTreeSet<Option<i64>>> = BTreeMap::new();
    let all = spec
        .devices
        .iter()
        .flat_map(|d| &d.container_edits.device_nodes)
        .chain(&spec.container_edits.device_nodes);
    for n in all {
        if let Some((_, group)) = DYNAMIC_MAJOR_NODES.iter().find(|(prefix, _)| n.path.starts_with(prefix)) {
            out.entry(group).or_default().insert(n.major);
        }
    }
    out
}

fn hook_args<'a>(edits: &'a ContainerEdits, subcommand: &str) -> Vec<&'a [String]> {
    edits
        .hooks
        .iter()
        .filter(|h| h.args.get(1).is_some_and(|a| a == subcommand))
        .map(|h| &h.args[2..])
        .collect()
}

/// `--flag value` pairs of every hook with this subcommand.
fn flag_values(edits: &ContainerEdits, subcommand: &str, flag: &str) -> Vec<String> {
    let mut out = Vec::new();
    for args in hook_args(edits, subcommand) {
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == flag {
                out.push(it.next().expect("a value follows the flag").clone());
            }
        }
    }
    out
}

/// link -> the file it ends at, following the spec's own links (relative to the link's folder).
fn links(edits: &ContainerEdits) -> BTreeMap<String, String> {
    let raw: BTreeMap<String, String> = flag_values(edits, "create-symlinks", "--link")
        .into_iter()
        .map(|pair| {
            let (target, link) = pair.split_once("::").expect("target::link");
            (link.to_owned(), target.to_owned())
        })
        .collect();
    let absolute = |link: &str, target: &str| {
        if target.starts_with('/') {
            return target.to_owned();
        }
        let mut parts: Vec<&str> = link.split('/').filter(|p| !p.is_empty()).collect();
        parts.pop();
        for t in target.split('/') {
            match t {
                ".." => {
                    parts.pop();
                }
                "." | "" => {}
                t => parts.push(t),
            }
        }
        format!("/{}", parts.join("/"))
    };
    raw.keys()
        .map(|link| {
            let mut at = absolute(link, &raw[link]);
            for _ in 0..8 {
                match raw.get(&at) {
                    Some(next) => at = absolute(&at, next),
                    None => break,
                }
            }
            (link.clone(), at)
        })
        .collect()
}

fn mounts(edits: &ContainerEdits) -> BTreeMap<String, (String, BTreeSet<String>)> {
    edits
        .mounts
        .iter()
        .map(|m| (m.container_path.clone(), (m.host_path.clone(), m.options.iter().cloned().collect())))
        .collect()
}

fn env_names(edits: &ContainerEdits) -> BTreeSet<String> {
    edits.env.iter().map(|e| e.split_once('=').map_or(e.as_str(), |(k, _)| k).to_owned()).collect()
}

/// Every difference between the two specs, as lines; `extra_nvidia_lacks` are container paths
/// (mounts or links) NVIDIA's recording could not have (files the node gained after it).
fn differences(ours: &Spec, theirs: &Spec, extra_nvidia_lacks: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for (who, spec) in [("ours", ours), ("NVIDIA's", theirs)] {
        for (group, majors) in dynamic_majors(spec) {
            if majors.len() != 1 || majors.contains(&None) {
                out.push(format!("{who}: {group} nodes do not share one major: {majors:?}"));
            }
        }
    }
    let names = |s: &Spec| s.devices.iter().map(|d| d.name.clone()).collect::<BTreeSet<_>>();
    if names(ours) != names(theirs) {
        out.push(format!("device names: ours {:?}, NVIDIA's {:?}", names(ours), names(theirs)));
    }
    for (name, o, t) in ours
        .devices
        .iter()
        .filter_map(|d| theirs.device(&d.name).map(|t| (&d.name, &d.container_edits, &t.container_edits)))
        .chain(std::iter::once((
            &"(common edits)".to_owned(),
            &ours.container_edits,
            &theirs.container_edits,
        )))
    {
        if nodes(o) != nodes(t) {
            out.push(format!("{name}: device nodes: ours {:?}, NVIDIA's {:?}", nodes(o), nodes(t)));
        }
        for n in o.device_nodes.iter().chain(&t.device_nodes) {
            let mine = o.device_nodes.iter().any(|x| std::ptr::eq(x, n));
            let (ty, perms) =
                (n.device_type.map_or("(absent)", |t| t.as_str()), n.permissions.as_deref().unwrap_or(""));
            for (field, value) in [("type", ty), ("permissions", perms)] {
                let known = NODE_DIFFERENCES
                    .iter()
                    .any(|(f, our, their, _)| *f == field && value == if mine { *our } else { *their });
                if !known {
                    out.push(format!(
                        "{name}: {}: {field} {value:?} ({})",
                        n.path,
                        if mine { "ours" } else { "NVIDIA's" }
                    ));
                }
            }
        }
    }

    let (o, t) = (&ours.container_edits, &theirs.container_edits);
    let (om, tm) = (mounts(o), mounts(t));
    for path in tm.keys().filter(|p| !om.contains_key(*p)) {
        if !NVIDIA_ONLY_MOUNTS.iter().any(|(p, _)| p == path) {
            out.push(format!("mount only NVIDIA's: {path}"));
        }
    }
    for path in om.keys().filter(|p| !tm.contains_key(*p)) {
        if !OURS_ONLY_MOUNTS.iter().any(|(p, _)| p == path) && !extra_nvidia_lacks.contains(path) {
            out.push(format!("mount only ours: {path}"));
        }
    }
    for (path, (host, opts)) in &om {
        let Some((their_host, their_opts)) = tm.get(path) else { continue };
        if host != their_host {
            out.push(format!("mount {path}: host path ours {host}, NVIDIA's {their_host}"));
        }
        let only_ours: Vec<&str> = opts.difference(their_opts).map(String::as_str).collect();
        let only_theirs: Vec<&str> = their_opts.difference(opts).map(String::as_str).collect();
        if only_ours.is_empty() && only_theirs.is_empty() {
            continue;
        }
        let known = OPTION_DIFFERENCES.iter().any(|(prefix, o, t, _)| {
            path.starts_with(prefix) && *o == only_ours.as_slice() && *t == only_theirs.as_slice()
        });
        if !known {
            out.push(format!("mount {path}: options only ours {only_ours:?}, only NVIDIA's {only_theirs:?}"));
        }
    }

    let (ol, tl) = (links(o), links(t));
    for (link, target) in &tl {
        match ol.get(link) {
            None => out.push(format!("link only NVIDIA's: {link} -> {target}")),
            Some(mine) if mine != target => {
                out.push(format!("link {link}: ours ends at {mine}, NVIDIA's at {target}"))
            }
            Some(_) => {}
        }
    }
    for link in ol.keys().filter(|l| !tl.contains_key(*l) && !extra_nvidia_lacks.contains(*l)) {
        if !OURS_ONLY_LINKS.iter().any(|(l, _)| l == link) {
            out.push(format!("link only ours: {link}"));
        }
    }

    let folders = |e: &ContainerEdits| {
        flag_values(e, "update-ldcache", "--folder").into_iter().collect::<BTreeSet<_>>()
    };
    let (of, tf) = (folders(o), folders(t));
    let missing: Vec<&String> = tf.difference(&of).filter(|f| !extra_nvidia_lacks.contains(*f)).collect();
    let extra: Vec<&String> = of.difference(&tf).filter(|f| !extra_nvidia_lacks.contains(*f)).collect();
    if !missing.is_empty() || !extra.is_empty() {
        out.push(format!("ld-cache folders: only NVIDIA's {missing:?}, only ours {extra:?}"));
    }

    let subcommands =
        |e: &ContainerEdits| e.hooks.iter().filter_map(|h| h.args.get(1).cloned()).collect::<BTreeSet<_>>();
    for hook in subcommands(t).difference(&subcommands(o)) {
        if !NVIDIA_ONLY_HOOKS.iter().any(|(h, _)| h == hook) {
            out.push(format!("hook only NVIDIA's: {hook}"));
        }
    }
    for hook in subcommands(o).difference(&subcommands(t)) {
        out.push(format!("hook only ours: {hook}"));
    }
    for var in env_names(t).difference(&env_names(o)) {
        if !NVIDIA_ONLY_ENV.iter().any(|(v, _)| v == var) {
            out.push(format!("env only NVIDIA's: {var}"));
        }
    }
    for var in env_names(o).difference(&env_names(t)) {
        out.push(format!("env only ours: {var}"));
    }
    let shared: BTreeSet<&String> = o.env.iter().filter(|e| t.env.contains(e)).collect();
    for e in o.env.iter().filter(|e| !shared.contains(e)) {
        if let Some((k, _)) = e.split_once('=')
            && env_names(t).contains(k)
        {
            out.push(format!("env {k}: ours {e}, NVIDIA's differs"));
        }
    }
    out
}

#[test]
fn h100x8_matches_nvidia_ctk_on_the_same_node() {
    let diff = differences(&ours("h100x8"), &nvidia("h100x8-graphics"), &BTreeSet::new());
    assert!(diff.is_empty(), "differences from nvidia-ctk 1.20 not listed as intended:\n{}", diff.join("\n"));
}

/// NVIDIA's a100-mig recording was made before the simulated node had its graphics files; what it
/// lacks because of that is what h100x8-graphics.json has over h100x8.json (same tool, same node,
/// with and without those files).
#[test]
fn a100_mig_matches_nvidia_ctk_but_for_files_added_since_its_recording() {
    let (with, without) = (nvidia("h100x8-graphics"), nvidia("h100x8"));
    let mut gained: BTreeSet<String> = mounts(&with.container_edits).into_keys().collect();
    for path in mounts(&without.container_edits).into_keys() {
        gained.remove(&path);
    }
    let (lw, lo) = (links(&with.container_edits), links(&without.container_edits));
    gained.extend(lw.keys().filter(|l| !lo.contains_key(*l)).cloned());
    let folders = |s: &Spec| flag_values(&s.container_edits, "update-ldcache", "--folder");
    gained.extend(folders(&with).into_iter().filter(|f| !folders(&without).contains(f)));
    assert!(
        gained.iter().any(|p| p.contains("vdpau")),
        "the two recordings differ by the graphics files: {gained:?}"
    );

    let diff = differences(&ours("a100-mig"), &nvidia("a100-mig"), &gained);
    assert!(diff.is_empty(), "differences from nvidia-ctk 1.20 not listed as intended:\n{}", diff.join("\n"));
}

/// Every listed difference still occurs: a list that outlived its reason would hide the next one.
#[test]
fn every_listed_difference_still_occurs() {
    let (o, t) = (ours("h100x8"), nvidia("h100x8-graphics"));
    let (om, tm) = (mounts(&o.container_edits), mounts(&t.container_edits));
    for (path, reason) in OURS_ONLY_MOUNTS {
        assert!(
            om.contains_key(*path) && !tm.contains_key(*path),
            "{path} ({reason}) is no longer ours only"
        );
    }
    for (path, reason) in NVIDIA_ONLY_MOUNTS {
        assert!(
            tm.contains_key(*path) && !om.contains_key(*path),
            "{path} ({reason}) is no longer NVIDIA's only"
        );
    }
    let (ol, tl) = (links(&o.container_edits), links(&t.container_edits));
    for (link, reason) in OURS_ONLY_LINKS {
        assert!(
            ol.contains_key(*link) && !tl.contains_key(*link),
            "{link} ({reason}) is no longer ours only"
        );
    }
    // a100-mig has both groups (MIG capability nodes); h100x8 has no caps nodes.
    let (mo, mt) = (ours("a100-mig"), nvidia("a100-mig"));
    let (od, td) = (dynamic_majors(&mo), dynamic_majors(&mt));
    for (prefix, group) in DYNAMIC_MAJOR_NODES {
        assert!(od.contains_key(group) && td.contains_key(group), "no {prefix} nodes to compare");
        assert_ne!(od[group], td[group], "{group}: the recorded majors now match; compare them by number");
    }
    for (prefix, only_ours, only_theirs, reason) in OPTION_DIFFERENCES {
        let seen = om.iter().any(|(p, (_, opts))| {
            p.starts_with(prefix)
                && tm.get(p).is_some_and(|(_, theirs)| {
                    let a: Vec<&str> = opts.difference(theirs).map(String::as_str).collect();
                    let b: Vec<&str> = theirs.difference(opts).map(String::as_str).collect();
                    a == *only_ours && b == *only_theirs
                })
        });
        assert!(seen, "option difference under {prefix} ({reason}) no longer occurs");
    }
    let all_nodes = |s: &Spec| {
        s.devices
            .iter()
            .flat_map(|d| d.container_edits.device_nodes.clone())
            .chain(s.container_edits.device_nodes.clone())
            .collect::<Vec<_>>()
    };
    for (field, our, their, reason) in NODE_DIFFERENCES {
        let value = |n: &nvinject_cdi::DeviceNode| match *field {
            "type" => n.device_type.map_or_else(|| "(absent)".into(), |t| t.to_string()),
            _ => n.permissions.clone().unwrap_or_default(),
        };
        assert!(all_nodes(&o).iter().all(|n| value(n) == *our), "{field} ({reason}): ours changed");
        assert!(all_nodes(&t).iter().all(|n| value(n) == *their), "{field} ({reason}): NVIDIA's changed");
    }
}

/// The comparison itself can fail: a file NVIDIA mounts that we drop is reported, and so is a
/// link that ends elsewhere.
#[test]
fn the_diff_reports_what_it_should() {
    let theirs = nvidia("h100x8-graphics");
    let mut o = ours("h100x8");
    o.container_edits.mounts.retain(|m| !m.container_path.contains("vdpau"));
    for h in &mut o.container_edits.hooks {
        for a in &mut h.args {
            if a.ends_with("/gbm/nvidia-drm_gbm.so") {
                *a = a.replace("libnvidia-allocator", "libnvidia-cfg");
            }
        }
    }
    o.container_edits.env.push("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps".into());
    let diff = differences(&o, &theirs, &BTreeSet::new());
    assert!(
        diff.iter().any(|d| d.starts_with("mount only NVIDIA's: /usr/lib/x86_64-linux-gnu/vdpau/")),
        "{diff:?}"
    );
    assert!(
        diff.iter()
            .any(|d| d.starts_with("link /usr/lib/x86_64-linux-gnu/gbm/nvidia-drm_gbm.so: ours ends at")),
        "{diff:?}"
    );
    assert!(diff.iter().any(|d| d == "env only ours: CUDA_MPS_PIPE_DIRECTORY"), "{diff:?}");
}
