//! `nvinject-probe`: runs inside test containers and reports, from there, what the container got.
//!
//! `nvinject-probe report` prints one line `NVINJECT-PROBE {json}` with:
//! - `devices`: every `/dev/nvidia*` node (and `/dev/nvidia-caps/*`) with type, major, minor and what
//!   `open(O_RDWR)` says: `ok`, `ENXIO` (the device cgroup allows it but no driver answers: what
//!   an allowed node of the simulated node gives), `EPERM` (the device cgroup denies it), ...;
//! - `environ`: PID 1's environment (`/proc/1/environ`; config.json env reaches only the init
//!   process);
//! - `mounts`: mount points with their source;
//! - `ldconfig`: `ldconfig -p` lines;
//! - `nvml`: `dlopen("libnvidia-ml.so.1")` and, if it loads, `nvmlInit_v2` and the UUIDs it lists;
//! - `nvidia_smi`: the output of `nvidia-smi -L`, when the container has one.
//!
//! `nvinject-probe pause` sleeps until SIGTERM or SIGINT (a pod sandbox's pause process).
//!
//! `nvinject-probe as-user UID PROGRAM [ARG]...` runs PROGRAM as UID (group UID, no supplementary
//! groups) and exits with its status: an unprivileged client in an image without `setpriv`.
//!
//! `nvinject-probe mps-client SOCKET MESSAGE` does what a CUDA client does with the MPS control
//! daemon's `control` socket: connects (`SOCK_SEQPACKET`), sends MESSAGE, waits for one answer,
//! and prints `NVINJECT-MPS <SOCKET> reply=<answer>`, or `NVINJECT-MPS <SOCKET> <step>=<errno>`
//! and exits 1.
//!
//! `nvinject-probe mps-tamper DIR` is what a hostile container does to an MPS pipe folder it can
//! reach (issue 32): removes `control`, links `/etc/shadow` in its place, makes a FIFO and writes a
//! file there, each step printed as `NVINJECT-MPS tamper-<step> ok` or `... <errno>`.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("report") => println!("NVINJECT-PROBE {}", report()),
        Some("pause") => pause(),
        Some("exit") => std::process::exit(std::env::args().nth(2).and_then(|c| c.parse().ok()).unwrap_or(0)),
        Some("as-user") => as_user(&std::env::args().skip(2).collect::<Vec<_>>()),
        Some("mps-client") => match (std::env::args().nth(2), std::env::args().nth(3)) {
            (Some(socket), Some(message)) => mps_client(&socket, &message),
            _ => usage(),
        },
        Some("mps-tamper") => match std::env::args().nth(2) {
            Some(dir) => mps_tamper(Path::new(&dir)),
            None => usage(),
        },
        _ => usage(),
    }
}

fn mps_tamper(dir: &Path) {
    let say = |step: &str, r: std::io::Result<()>| match r {
        Ok(()) => println!("NVINJECT-MPS tamper-{step} ok"),
        Err(e) => println!(
            "NVINJECT-MPS tamper-{step} {}",
            e.raw_os_error()
                .map_or_else(|| e.to_string(), |n| format!("{:?}", nix::errno::Errno::from_raw(n)))
        ),
    };
    let control = dir.join("control");
    say("unlink", std::fs::remove_file(&control));
    say("symlink", std::os::unix::fs::symlink("/etc/shadow", &control));
    say(
        "mkfifo",
        nix::unistd::mkfifo(&dir.join("planted-fifo"), nix::sys::stat::Mode::from_bits_truncate(0o666))
            .map_err(std::io::Error::from),
    );
    say("write", std::fs::write(dir.join("planted-file"), b"written by a container\n"));
}

fn usage() -> ! {
    eprintln!(
        "usage: nvinject-probe report|pause|exit CODE|as-user UID PROGRAM [ARG]...|mps-client SOCKET MESSAGE|\
         mps-tamper DIR"
    );
    std::process::exit(2);
}

fn as_user(args: &[String]) -> ! {
    use std::os::unix::process::CommandExt;
    let (Some(uid), Some(program)) = (args.first().and_then(|u| u.parse::<u32>().ok()), args.get(1)) else {
        usage()
    };
    // std drops the supplementary groups when root sets a uid.
    let status = Command::new(program).args(&args[2..]).uid(uid).gid(uid).status();
    match status {
        Ok(s) => std::process::exit(s.code().unwrap_or(128)),
        Err(e) => {
            eprintln!("nvinject-probe as-user {uid} {program}: {e}");
            std::process::exit(127);
        }
    }
}

fn mps_client(socket: &str, message: &str) -> ! {
    use nix::sys::socket::{self as so, AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr, sockopt};
    use std::os::fd::AsRawFd;
    let fail = |step: &str, e: nix::errno::Errno| -> ! {
        println!("NVINJECT-MPS {socket} {step}={e:?}");
        std::process::exit(1);
    };
    let fd = so::socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None)
        .unwrap_or_else(|e| fail("socket", e));
    let addr = UnixAddr::new(socket).unwrap_or_else(|e| fail("address", e));
    so::connect(fd.as_raw_fd(), &addr).unwrap_or_else(|e| fail("connect", e));
    // A daemon that never answers must not hang the container.
    let limit = nix::sys::time::TimeVal::new(10, 0);
    so::setsockopt(&fd, sockopt::ReceiveTimeout, &limit).unwrap_or_else(|e| fail("timeout", e));
    so::send(fd.as_raw_fd(), message.as_bytes(), MsgFlags::empty()).unwrap_or_else(|e| fail("send", e));
    let mut buf = [0u8; 4096];
    let n = so::recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).unwrap_or_else(|e| fail("recv", e));
    println!("NVINJECT-MPS {socket} reply={}", String::from_utf8_lossy(&buf[..n]));
    std::process::exit(0);
}

extern "C" fn leave(_: c_int) {
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(0) };
}

fn pause() {
    // As PID 1, signals without a handler are ignored: install one so the sandbox can be stopped.
    // SAFETY: `leave` is an extern "C" fn that only calls _exit; installing it has no other effect.
    unsafe {
        libc::signal(libc::SIGTERM, leave as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, leave as *const () as libc::sighandler_t);
    }
    loop {
        // SAFETY: pause() takes no arguments and only returns when a signal was caught.
        unsafe { libc::pause() };
    }
}

fn report() -> Value {
    json!({
        "devices": devices(),
        "environ": environ(),
        "mounts": mounts(),
        "ldconfig": command_lines("/sbin/ldconfig", &["-p"]),
        "ld_so_conf_d": dir_names("/etc/ld.so.conf.d"),
        "application_profile": application_profile(),
        "nvml": nvml(),
        "nvidia_smi": if Path::new("/usr/bin/nvidia-smi").exists() { command_lines("/usr/bin/nvidia-smi", &["-L"]) } else { json!(null) },
    })
}

fn devices() -> Value {
    let mut out = Vec::new();
    let mut paths = Vec::new();
    for dir in ["/dev", "/dev/nvidia-caps"] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if dir != "/dev" || name.starts_with("nvidia") {
                    paths.push(e.path());
                }
            }
        }
    }
    paths.sort();
    for path in paths {
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        let ft = meta.file_type();
        if !(ft.is_char_device() || ft.is_block_device()) {
            continue;
        }
        let rdev = meta.rdev();
        out.push(json!({
            "path": path.to_string_lossy(),
            "type": if ft.is_char_device() { "c" } else { "b" },
            "major": libc::major(rdev),
            "minor": libc::minor(rdev),
            "open": open_result(&path),
        }));
    }
    Value::Array(out)
}

fn open_result(path: &Path) -> String {
    match std::fs::OpenOptions::new().read(true).write(true).open(path) {
        Ok(_) => "ok".into(),
        Err(e) => match e.raw_os_error() {
            Some(libc::ENXIO) => "ENXIO".into(),
            Some(libc::EPERM) => "EPERM".into(),
            Some(libc::EACCES) => "EACCES".into(),
            Some(libc::ENODEV) => "ENODEV".into(),
            _ => e.to_string(),
        },
    }
}

fn environ() -> Value {
    let raw = std::fs::read("/proc/1/environ").unwrap_or_default();
    let mut map = BTreeMap::new();
    for entry in raw.split(|b| *b == 0).filter(|e| !e.is_empty()) {
        let text = String::from_utf8_lossy(entry);
        if let Some((k, v)) = text.split_once('=') {
            map.insert(k.to_owned(), v.to_owned());
        }
    }
    json!(map)
}

fn mounts() -> Value {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let list: Vec<Value> = text
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            let sep = fields.iter().position(|f| *f == "-")?;
            // Options (ro, nosuid, ...) and the optional fields (shared:N, master:N: propagation).
            let optional = fields.get(6..sep).unwrap_or_default().join(" ");
            Some(json!({"target": fields.get(4)?, "options": fields.get(5)?, "propagation": optional,
                "fstype": fields.get(sep + 1)?, "source": fields.get(sep + 2)?}))
        })
        .collect();
    Value::Array(list)
}

fn command_lines(program: &str, args: &[&str]) -> Value {
    match Command::new(program).args(args).output() {
        Ok(out) => {
            let text =
                String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            json!({"status": out.status.code(), "lines": text.lines().collect::<Vec<_>>()})
        }
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// The driver's application profile the hook writes (its text and mode), or null.
fn application_profile() -> Value {
    use std::os::unix::fs::PermissionsExt;
    let path = "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf";
    match (std::fs::read_to_string(path), std::fs::metadata(path)) {
        (Ok(text), Ok(meta)) => {
            json!({"text": text, "mode": format!("{:o}", meta.permissions().mode() & 0o7777)})
        }
        _ => json!(null),
    }
}

fn dir_names(dir: &str) -> Value {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    json!(names)
}

type InitFn = unsafe extern "C" fn() -> c_int;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> c_int;
type HandleFn = unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_int;
type UuidFn = unsafe extern "C" fn(*mut c_void, *mut c_char, c_uint) -> c_int;

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a valid C string owned by libc, read before the next dl call.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() { "unknown dl error".into() } else { CStr::from_ptr(e).to_string_lossy().into_owned() }
    }
}

fn nvml() -> Value {
    let name = CString::new("libnvidia-ml.so.1").expect("no NUL");
    // SAFETY: dlopen with a valid C string; the handle is only used with dlsym below.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW) };
    if handle.is_null() {
        return json!({"dlopen": dlerror()});
    }
    let sym = |s: &str| {
        let c = CString::new(s).expect("no NUL");
        // SAFETY: handle is a live dlopen handle and c a valid C string.
        unsafe { libc::dlsym(handle, c.as_ptr()) }
    };
    let (init, count, by_index, uuid) = (
        sym("nvmlInit_v2"),
        sym("nvmlDeviceGetCount_v2"),
        sym("nvmlDeviceGetHandleByIndex_v2"),
        sym("nvmlDeviceGetUUID"),
    );
    if init.is_null() || count.is_null() || by_index.is_null() || uuid.is_null() {
        return json!({"dlopen": "ok", "error": "missing NVML symbols"});
    }
    // SAFETY: the symbols come from libnvidia-ml.so.1 and have NVML's documented C signatures.
    let (init, count, by_index, uuid) = unsafe {
        (
            std::mem::transmute::<*mut c_void, InitFn>(init),
            std::mem::transmute::<*mut c_void, CountFn>(count),
            std::mem::transmute::<*mut c_void, HandleFn>(by_index),
            std::mem::transmute::<*mut c_void, UuidFn>(uuid),
        )
    };
    // SAFETY: NVML calls with valid out-pointers to locals and a buffer of the stated length.
    unsafe {
        let rc = init();
        if rc != 0 {
            return json!({"dlopen": "ok", "init": rc});
        }
        let mut n: c_uint = 0;
        let rc = count(&mut n);
        if rc != 0 {
            return json!({"dlopen": "ok", "init": 0, "count_error": rc});
        }
        let mut uuids = Vec::new();
        for i in 0..n {
            let mut h: *mut c_void = std::ptr::null_mut();
            let mut buf = [0 as c_char; 96];
            if by_index(i, &mut h) == 0 && uuid(h, buf.as_mut_ptr(), buf.len() as c_uint) == 0 {
                uuids.push(CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned());
            }
        }
        json!({"dlopen": "ok", "init": 0, "count": n, "uuids": uuids})
    }
}
