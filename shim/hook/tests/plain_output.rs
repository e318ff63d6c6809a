//! What the installed hook prints is plain text whatever the image named its files: runc hands the
//! hook's stderr to containerd, which puts it in `ctr`'s and the kubelet's errors and its own log.

mod common;

use std::fs;
use std::io::Write;
use std::process::{Command, Stdio};

use nvinject_simnode::artifacts::static_hook;

#[test]
fn log_lines_and_errors_carry_no_terminal_escapes_even_from_image_file_names() {
    let tmp = tempfile::tempdir().unwrap();
    let (rootfs, state) = common::bundle(tmp.path());
    // A file where the hook links (a warning naming it) and an ld.so.conf include loop in a file
    // whose name holds an escape sequence and a line break (the error names it).
    let occupied = "/usr/lib/\x1b[31mred\nlib.so";
    fs::create_dir_all(rootfs.join("usr/lib")).unwrap();
    fs::write(rootfs.join(occupied.trim_start_matches('/')), b"image's own").unwrap();
    fs::create_dir_all(rootfs.join("etc/ld.so.conf.d")).unwrap();
    fs::write(rootfs.join("etc/ld.so.conf"), b"include /etc/ld.so.conf.d/*.conf\n").unwrap();
    fs::write(rootfs.join("etc/ld.so.conf.d/\x1b]0;pwned\x07\n.conf"), b"include /etc/ld.so.conf\n").unwrap();

    let mut child = Command::new(static_hook())
        .args(["inject", "--link", &format!("libx.so.1::{occupied}"), "--folder", "/usr/lib"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&fs::read(&state).unwrap()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);

    assert!(!out.status.success(), "the include loop must fail the run: {stderr}");
    // Both kinds of output are there: the warning (a log line) and the error.
    assert!(stderr.contains("left an existing file in place"), "{stderr}");
    assert!(stderr.contains("include loop"), "{stderr}");
    // ... as plain text: no colour, no escape or bell or line break from a file name.
    assert!(!stderr.contains('\x1b') && !stderr.contains('\x07'), "{stderr:?}");
    assert!(stderr.contains("/usr/lib/\\u{1b}[31mred\\nlib.so"), "{stderr}");
    assert!(stderr.contains("/etc/ld.so.conf.d/\\u{1b}]0;pwned\\u{7}\\n.conf line 1"), "{stderr}");
    assert_eq!(stderr.lines().count(), 2, "one line each: {stderr}");
}
