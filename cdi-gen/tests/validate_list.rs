//! `nvinject-cdi validate` and `nvinject-cdi list` on spec files written by hand.

use std::path::Path;
use std::process::{Command, Output};

const CDI: &str = env!("CARGO_BIN_EXE_nvinject-cdi");

fn cdi<S: AsRef<std::ffi::OsStr>>(args: impl IntoIterator<Item = S>) -> Output {
    Command::new(CDI).args(args).output().unwrap()
}

/// A valid spec; each malformed case below changes one thing in it.
const GOOD: &str = r#"cdiVersion: "0.6.0"
kind: nvidia.com/gpu
annotations:
  nvinject.io/driver-version: "550.54.15"
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
      type: c
      major: 195
      minor: 0
      fileMode: 438
      permissions: rw
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  hooks:
  - hookName: createContainer
    path: /usr/local/nvinject/bin/nvinject-hook
    args:
    - nvinject-hook
    - update-ldcache
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    options:
    - ro
    - rbind
"#;

fn with(from: &str, to: &str) -> String {
    assert!(GOOD.contains(from), "case does not apply: {from}");
    GOOD.replacen(from, to, 1)
}

#[test]
fn validate_accepts_a_good_spec() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nvidia.yaml");
    std::fs::write(&path, GOOD).unwrap();
    let out = cdi([std::ffi::OsStr::new("validate"), path.as_os_str()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("{}: ok (cdiVersion 0.6.0, kind nvidia.com/gpu, 1 devices)\n", path.display())
    );
}

/// Each malformed spec has one problem; `validate` reports exactly one line naming the file and
/// the field, and exits 1.
#[test]
fn validate_rejects_each_malformed_spec_naming_file_and_field() {
    let cases: Vec<(&str, String, &str, &str)> = vec![
        (
            "typo-key",
            with("containerEdits:\n    deviceNodes", "containerEdit:\n    deviceNodes"),
            "devices[0].containerEdit",
            "unknown field `containerEdit`",
        ),
        (
            "wrong-type",
            with("major: 195", "major: big"),
            "devices[0].containerEdits.deviceNodes[0].major",
            "invalid type",
        ),
        ("no-kind", with("kind: nvidia.com/gpu\n", ""), "", "missing field `kind`"),
        ("yaml-syntax", with("devices:\n", "devices: [\n"), "", "line"),
        (
            "bad-kind",
            with("kind: nvidia.com/gpu", "kind: nvidia.com"),
            "kind",
            "not of the form vendor/class",
        ),
        (
            "bad-version",
            with("cdiVersion: \"0.6.0\"", "cdiVersion: \"0.9.0\""),
            "cdiVersion",
            "not a released CDI version",
        ),
        (
            "version-too-low",
            with("cdiVersion: \"0.6.0\"", "cdiVersion: \"0.5.0\""),
            "annotations",
            "needs cdiVersion 0.6.0",
        ),
        ("bad-device-name", with("name: \"0\"", "name: \"gpu 0\""), "devices[0].name", "contains ` `"),
        (
            "duplicate-name",
            with("devices:\n", "devices:\n- name: \"0\"\n  containerEdits:\n    env: [A=b]\n"),
            "devices[1].name",
            "duplicate device name `0`",
        ),
        (
            "relative-node",
            with("path: /dev/nvidia0", "path: dev/nvidia0"),
            "devices[0].containerEdits.deviceNodes[0].path",
            "not absolute",
        ),
        (
            "bad-node-type",
            with("type: c", "type: x"),
            "devices[0].containerEdits.deviceNodes[0].type",
            "not one of b, c, u, p",
        ),
        (
            "bad-permissions",
            with("permissions: rw", "permissions: rwx"),
            "devices[0].containerEdits.deviceNodes[0].permissions",
            "contain `x`",
        ),
        (
            "relative-hook",
            with("path: /usr/local/nvinject/bin/nvinject-hook", "path: nvinject-hook"),
            "containerEdits.hooks[0].path",
            "not absolute",
        ),
        (
            "unknown-hook",
            with("hookName: createContainer", "hookName: onCreate"),
            "containerEdits.hooks[0].hookName",
            "unknown hook name",
        ),
        (
            "relative-mount",
            with("containerPath: /usr", "containerPath: usr"),
            "containerEdits.mounts[0].containerPath",
            "not absolute",
        ),
        (
            "bad-env",
            with("- NVIDIA_VISIBLE_DEVICES=void", "- NVIDIA_VISIBLE_DEVICES"),
            "containerEdits.env[0]",
            "NAME=value",
        ),
        (
            "no-devices",
            with(
                "devices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n      type: c\n      major: 195\n      minor: 0\n      fileMode: 438\n      permissions: rw\n",
                "devices: []\n",
            ),
            "devices",
            "at least one device",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, text, field, message) in &cases {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, text).unwrap();
        let out = cdi([std::ffi::OsStr::new("validate"), path.as_os_str()]);
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert_eq!(out.status.code(), Some(1), "{name}: {stdout}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 1, "{name}: one problem expected, got:\n{stdout}");
        let line = lines[0];
        assert!(line.starts_with(&format!("{}: ", path.display())), "{name}: no file name in `{line}`");
        if !field.is_empty() {
            assert!(line.contains(&format!("field `{field}`")), "{name}: no field `{field}` in `{line}`");
        }
        assert!(line.contains(message), "{name}: `{message}` not in `{line}`");
    }
}

#[test]
fn validate_checks_every_file_and_fails_if_any_fails() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.json");
    std::fs::write(&good, r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[{"name":"x","containerEdits":{"env":["A=1"]}}]}"#).unwrap();
    let missing = dir.path().join("missing.yaml");
    let out = cdi([std::ffi::OsStr::new("validate"), good.as_os_str(), missing.as_os_str()]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout.contains(&format!("{}: ok", good.display())), "{stdout}");
    assert!(stdout.contains(&format!("cannot read CDI spec {}", missing.display())), "{stdout}");
}

/// The shim's spec-trust check: a spec others may write (or in a folder they may) fails, naming
/// the file, its mode and the fix; `--accept-untrusted` passes it with a warning.
#[test]
fn validate_refuses_an_untrusted_spec_unless_told_to_accept_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("nvidia.yaml");
    std::fs::write(&path, GOOD).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let validate = |extra: &[&str]| {
        let mut args: Vec<std::ffi::OsString> = vec!["validate".into()];
        args.extend(extra.iter().map(Into::into));
        args.push(path.clone().into());
        cdi(args)
    };
    assert!(validate(&[]).status.success(), "control");

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = validate(&[]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(&format!("untrusted CDI spec {}: the file is owned by", path.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains("mode 0666") && stdout.contains(&format!("chmod go-w {}", path.display())),
        "{stdout}"
    );
    let out = validate(&["--accept-untrusted"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("accepted (--accept-untrusted): untrusted CDI spec")
    );

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = validate(&[]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains(&format!("its folder {} is owned by", dir.path().display())), "{stdout}");
    assert!(stdout.contains(&format!("fix: `chmod go-w {}`", dir.path().display())), "{stdout}");
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn list_shows_resolvable_devices_and_warns_about_broken_files() {
    let etc = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    write(etc.path(), "nvidia.yaml", GOOD);
    write(etc.path(), "zz-broken.yaml", "cdiVersion: [");
    write(
        run.path(),
        "other.json",
        r#"{"cdiVersion":"0.5.0","kind":"vendor.com/nic","devices":[{"name":"eth0","containerEdits":{"env":["A=1"]}},{"name":"1","containerEdits":{"env":["A=1"]}}]}"#,
    );
    let out = cdi([
        std::ffi::OsStr::new("list"),
        "--spec-dir".as_ref(),
        etc.path().as_os_str(),
        "--spec-dir".as_ref(),
        run.path().as_os_str(),
    ]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "nvidia.com/gpu=0\nvendor.com/nic=1\nvendor.com/nic=eth0\n"
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("zz-broken.yaml"), "{stderr}");
}

#[test]
fn list_fails_naming_both_files_when_nvidia_s_spec_and_ours_share_a_directory() {
    // NVIDIA's GPU Operator writes /var/run/cdi/nvidia.yaml; nvinject writes nvidia.com-gpu.json
    // beside it: every device both define resolves to nothing, for every CDI runtime.
    let run = tempfile::tempdir().unwrap();
    write(
        run.path(),
        "nvidia.com-gpu.yaml",
        &with("\ncontainerEdits:\n", "\n- name: \"1\"\n  containerEdits:\n    env: [A=1]\ncontainerEdits:\n"),
    );
    write(run.path(), "nvidia.yaml", GOOD);
    let out = cdi([std::ffi::OsStr::new("list"), "--spec-dir".as_ref(), run.path().as_os_str()]);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // Only the device one file alone defines is listed.
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "nvidia.com/gpu=1\n");
    assert!(stderr.contains("ambiguous CDI device nvidia.com/gpu=0"), "{stderr}");
    assert!(stderr.contains("nvidia.com-gpu.yaml") && stderr.contains("nvidia.yaml"), "{stderr}");
    assert!(stderr.contains("remove or rename one"), "{stderr}");
}
