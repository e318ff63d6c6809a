//! `nvidia-smi` stand-in for the simulated node.
//!
//! Like the real tool it knows nothing by itself: it `dlopen`s `libnvidia-ml.so.1` by its plain
//! name (so `LD_LIBRARY_PATH` and `ld.so.cache` decide which library answers) and prints what NVML
//! reports, through the raw C ABI. It supports `-L`, `--query-gpu=... --format=csv[,noheader]
//! [,nounits]` with `-i`, `--version`, and a short summary table with no arguments; NVML failures
//! print the real tool's messages and exit with its documented codes (9: driver not loaded,
//! 12: NVML not found, 255: other).
//!
//! Called as `nvidia-debugdump`, `nvidia-persistenced`, `nvidia-cuda-mps-control`,
//! `nvidia-cuda-mps-server`, `nvidia-xconfig`, `nvidia-imex` or `nvidia-imex-ctl` (the builder
//! installs copies under those names), it says that it is a
//! stand-in and exits 0. It links only glibc's libc (and libgcc_s), so it runs inside containers.

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::process::ExitCode;

/// `nvmlReturn_t`.
type Ret = c_int;
/// `nvmlDevice_t`.
type Device = *mut c_void;

const NVML_SUCCESS: Ret = 0;
const NVML_ERROR_NOT_SUPPORTED: Ret = 3;
const NVML_ERROR_NOT_FOUND: Ret = 6;
const NVML_ERROR_DRIVER_NOT_LOADED: Ret = 9;
const NVML_ERROR_IRQ_ISSUE: Ret = 11;
const NVML_ERROR_FUNCTION_NOT_FOUND: Ret = 13;

/// Names under which this binary is installed as a stub (the driver's `BINARIES` but this one,
/// and the separate packages' programs, `IMEX_BINARIES`).
const STUBS: &[&str] = &[
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-xconfig",
    "nvidia-imex",
    "nvidia-imex-ctl",
];

const DRIVER_NOT_LOADED: &str = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. \
                                 Make sure that the latest NVIDIA driver is installed and running.";
const LIBRARY_NOT_FOUND: &str = "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure \
                                 that the NVIDIA Display Driver is properly installed and present in your system.\n\
                                 Please also try adding directory that contains libnvidia-ml.so to your system PATH.";

/// `nvmlPciInfo_t` (the v3 layout).
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

/// `nvmlMemory_t` (v1).
#[repr(C)]
#[derive(Default)]
struct Memory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Default)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

type StrFn = unsafe extern "C" fn(Device, *mut c_char, c_uint) -> Ret;
type U32Fn = unsafe extern "C" fn(Device, *mut c_uint) -> Ret;

/// The loaded NVML. Each function is looked up when first called, as the real tool tolerates an
/// older library that lacks some of them.
struct Nvml {
    lib: libloading::Library,
}

impl Nvml {
    fn load() -> Result<Nvml, libloading::Error> {
        // SAFETY: loading NVML runs its initialisers; the simulated and the real NVML are both
        // designed to be dlopened by any process.
        let lib = unsafe { libloading::Library::new("libnvidia-ml.so.1") }?;
        Ok(Nvml { lib })
    }

    fn sym<T>(&self, name: &str) -> Result<libloading::Symbol<'_, T>, Ret> {
        let cname = format!("{name}\0");
        // SAFETY: every call site names T as the C prototype from nvml.h for `name`.
        unsafe { self.lib.get::<T>(cname.as_bytes()) }.map_err(|_| NVML_ERROR_FUNCTION_NOT_FOUND)
    }

    fn check(ret: Ret) -> Result<(), Ret> {
        if ret == NVML_SUCCESS { Ok(()) } else { Err(ret) }
    }

    fn init(&self) -> Result<(), Ret> {
        let f = self.sym::<unsafe extern "C" fn() -> Ret>("nvmlInit_v2")?;
        // SAFETY: nvmlInit_v2 takes no arguments.
        Self::check(unsafe { f() })
    }

    fn shutdown(&self) {
        if let Ok(f) = self.sym::<unsafe extern "C" fn() -> Ret>("nvmlShutdown") {
            // SAFETY: nvmlShutdown takes no arguments; called once after a successful init.
            unsafe { f() };
        }
    }

    fn error_string(&self, ret: Ret) -> String {
        let Ok(f) = self.sym::<unsafe extern "C" fn(Ret) -> *const c_char>("nvmlErrorString") else {
            return fallback_error_string(ret);
        };
        // SAFETY: nvmlErrorString accepts any code and returns a static NUL-terminated string.
        let s = unsafe { f(ret) };
        if s.is_null() {
            return fallback_error_string(ret);
        }
        // SAFETY: non-null pointer to a NUL-terminated string owned by the library.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }

    fn buffer_to_string(buf: &[c_char]) -> String {
        let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn system_string(&self, name: &str) -> Result<String, Ret> {
        let f = self.sym::<unsafe extern "C" fn(*mut c_char, c_uint) -> Ret>(name)?;
        let mut buf = [0 as c_char; 96];
        // SAFETY: the buffer holds `len` bytes, as the function requires.
        Self::check(unsafe { f(buf.as_mut_ptr(), buf.len() as c_uint) })?;
        Ok(Self::buffer_to_string(&buf))
    }

    fn cuda_version(&self) -> Result<c_int, Ret> {
        let f = self.sym::<unsafe extern "C" fn(*mut c_int) -> Ret>("nvmlSystemGetCudaDriverVersion")?;
        let mut v = 0;
        // SAFETY: out-pointer to a live c_int.
        Self::check(unsafe { f(&mut v) })?;
        Ok(v)
    }

    fn count(&self) -> Result<c_uint, Ret> {
        let f = self.sym::<unsafe extern "C" fn(*mut c_uint) -> Ret>("nvmlDeviceGetCount_v2")?;
        let mut n = 0;
        // SAFETY: out-pointer to a live c_uint.
        Self::check(unsafe { f(&mut n) })?;
        Ok(n)
    }

    fn handle(&self, index: c_uint) -> Result<Device, Ret> {
        let f =
            self.sym::<unsafe extern "C" fn(c_uint, *mut Device) -> Ret>("nvmlDeviceGetHandleByIndex_v2")?;
        let mut d = std::ptr::null_mut();
        // SAFETY: out-pointer to a live handle.
        Self::check(unsafe { f(index, &mut d) })?;
        Ok(d)
    }

    fn device_string(&self, name: &str, d: Device) -> Result<String, Ret> {
        let f = self.sym::<StrFn>(name)?;
        let mut buf = [0 as c_char; 96];
        // SAFETY: `d` came from NVML; the buffer holds `len` bytes.
        Self::check(unsafe { f(d, buf.as_mut_ptr(), buf.len() as c_uint) })?;
        Ok(Self::buffer_to_string(&buf))
    }

    fn device_u32(&self, name: &str, d: Device) -> Result<c_uint, Ret> {
        let f = self.sym::<U32Fn>(name)?;
        let mut v = 0;
        // SAFETY: `d` came from NVML; out-pointer to a live c_uint.
        Self::check(unsafe { f(d, &mut v) })?;
        Ok(v)
    }

    fn pci(&self, d: Device) -> Result<PciInfo, Ret> {
        let f = self.sym::<unsafe extern "C" fn(Device, *mut PciInfo) -> Ret>("nvmlDeviceGetPciInfo_v3")?;
        let mut p = PciInfo {
            bus_id_legacy: [0; 16],
            domain: 0,
            bus: 0,
            device: 0,
            pci_device_id: 0,
            pci_sub_system_id: 0,
            bus_id: [0; 32],
        };
        // SAFETY: `d` came from NVML; PciInfo has nvmlPciInfo_t's layout.
        Self::check(unsafe { f(d, &mut p) })?;
        Ok(p)
    }

    fn memory(&self, d: Device) -> Result<Memory, Ret> {
        let f = self.sym::<unsafe extern "C" fn(Device, *mut Memory) -> Ret>("nvmlDeviceGetMemoryInfo")?;
        let mut m = Memory::default();
        // SAFETY: `d` came from NVML; Memory has nvmlMemory_t's layout.
        Self::check(unsafe { f(d, &mut m) })?;
        Ok(m)
    }

    fn utilization(&self, d: Device) -> Result<Utilization, Ret> {
        let f = self
            .sym::<unsafe extern "C" fn(Device, *mut Utilization) -> Ret>("nvmlDeviceGetUtilizationRates")?;
        let mut u = Utilization::default();
        // SAFETY: `d` came from NVML; Utilization has nvmlUtilization_t's layout.
        Self::check(unsafe { f(d, &mut u) })?;
        Ok(u)
    }

    fn temperature(&self, d: Device) -> Result<c_uint, Ret> {
        let f =
            self.sym::<unsafe extern "C" fn(Device, c_int, *mut c_uint) -> Ret>("nvmlDeviceGetTemperature")?;
        let mut t = 0;
        // SAFETY: `d` came from NVML; sensor 0 is NVML_TEMPERATURE_GPU.
        Self::check(unsafe { f(d, 0, &mut t) })?;
        Ok(t)
    }

    /// Current MIG mode; `Err(NOT_SUPPORTED)` for GPUs without MIG.
    fn mig_enabled(&self, d: Device) -> Result<bool, Ret> {
        let f = self
            .sym::<unsafe extern "C" fn(Device, *mut c_uint, *mut c_uint) -> Ret>("nvmlDeviceGetMigMode")?;
        let (mut current, mut pending) = (0, 0);
        // SAFETY: `d` came from NVML; two out-pointers to live c_uints.
        Self::check(unsafe { f(d, &mut current, &mut pending) })?;
        Ok(current == 1)
    }

    fn mig_handle(&self, d: Device, index: c_uint) -> Result<Device, Ret> {
        let f = self.sym::<unsafe extern "C" fn(Device, c_uint, *mut Device) -> Ret>(
            "nvmlDeviceGetMigDeviceHandleByIndex",
        )?;
        let mut m = std::ptr::null_mut();
        // SAFETY: `d` came from NVML; out-pointer to a live handle.
        Self::check(unsafe { f(d, index, &mut m) })?;
        Ok(m)
    }
}

/// NVML's text for the codes the stand-in itself produces, for a library without `nvmlErrorString`.
fn fallback_error_string(ret: Ret) -> String {
    match ret {
        NVML_ERROR_NOT_SUPPORTED => "Not Supported".into(),
        NVML_ERROR_NOT_FOUND => "Not Found".into(),
        NVML_ERROR_DRIVER_NOT_LOADED => "Driver Not Loaded".into(),
        NVML_ERROR_FUNCTION_NOT_FOUND => "Function Not Found".into(),
        _ => format!("Unknown Error ({ret})"),
    }
}

/// Exit status of the real `nvidia-smi` for an NVML error (its man page, "RETURN VALUE").
fn exit_code(ret: Ret) -> u8 {
    match ret {
        2 | 3 | 4 | 6 | 8 | 9 | 12 | 13 | 14 | 15 => ret as u8,
        NVML_ERROR_IRQ_ISSUE => 10,
        _ => 255,
    }
}

/// `GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)`.
fn gpu_line(index: u32, name: &str, uuid: &str) -> String {
    format!("GPU {index}: {name} (UUID: {uuid})")
}

/// `  MIG 3g.40gb     Device  0: (UUID: MIG-...)`: the profile is what follows `MIG ` in the MIG
/// device's name (`NVIDIA A100-SXM4-80GB MIG 3g.40gb`).
fn mig_line(index: u32, device_name: &str, uuid: &str) -> String {
    let profile = device_name.rsplit_once("MIG ").map_or(device_name, |(_, p)| p);
    format!("  MIG {profile:<11} Device {index:>2}: (UUID: {uuid})")
}

/// Output format of `--query-gpu`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CsvFormat {
    header: bool,
    units: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    Summary,
    List,
    Version,
    Help,
    Query { fields: Vec<Field>, format: CsvFormat, ids: Option<Vec<u32>> },
}

/// A `--query-gpu` field the stand-in can answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Index,
    Uuid,
    Name,
    BusId,
    MemoryTotal,
    MemoryUsed,
    MemoryFree,
    Minor,
    DriverVersion,
    Count,
    Serial,
    Temperature,
    UtilizationGpu,
    MigModeCurrent,
}

impl Field {
    fn parse(name: &str) -> Option<Field> {
        Some(match name.trim() {
            "index" => Field::Index,
            "uuid" | "gpu_uuid" => Field::Uuid,
            "name" | "gpu_name" => Field::Name,
            "pci.bus_id" | "gpu_bus_id" => Field::BusId,
            "memory.total" => Field::MemoryTotal,
            "memory.used" => Field::MemoryUsed,
            "memory.free" => Field::MemoryFree,
            "minor_number" => Field::Minor,
            "driver_version" => Field::DriverVersion,
            "count" => Field::Count,
            "serial" | "gpu_serial" => Field::Serial,
            "temperature.gpu" => Field::Temperature,
            "utilization.gpu" => Field::UtilizationGpu,
            "mig.mode.current" => Field::MigModeCurrent,
            _ => return None,
        })
    }

    /// Column title, as the real tool prints it (units in brackets).
    fn header(self) -> &'static str {
        match self {
            Field::Index => "index",
            Field::Uuid => "uuid",
            Field::Name => "name",
            Field::BusId => "pci.bus_id",
            Field::MemoryTotal => "memory.total [MiB]",
            Field::MemoryUsed => "memory.used [MiB]",
            Field::MemoryFree => "memory.free [MiB]",
            Field::Minor => "minor_number",
            Field::DriverVersion => "driver_version",
            Field::Count => "count",
            Field::Serial => "serial",
            Field::Temperature => "temperature.gpu",
            Field::UtilizationGpu => "utilization.gpu [%]",
            Field::MigModeCurrent => "mig.mode.current",
        }
    }
}

/// Parses the command line; `Err` holds the message for exit status 2.
fn parse_args(args: &[String]) -> Result<Mode, String> {
    let mut mode = None;
    let mut fields = None;
    let mut format = None;
    let mut ids = None;
    let mut it = args.iter();
    // `--opt=value` and `--opt value` both work, as in the real tool.
    let value = |arg: &str, it: &mut std::slice::Iter<'_, String>| -> Result<String, String> {
        match arg.split_once('=') {
            Some((_, v)) => Ok(v.to_owned()),
            None => it.next().cloned().ok_or_else(|| format!("Option \"{arg}\" requires a value.")),
        }
    };
    while let Some(arg) = it.next() {
        let name = arg.split_once('=').map_or(arg.as_str(), |(n, _)| n);
        match name {
            "-L" | "--list-gpus" => mode = Some(Mode::List),
            "-h" | "--help" => mode = Some(Mode::Help),
            "--version" => mode = Some(Mode::Version),
            "--query-gpu" => {
                let v = value(arg, &mut it)?;
                let parsed: Result<Vec<Field>, String> = v
                    .split(',')
                    .map(|f| {
                        Field::parse(f)
                            .ok_or_else(|| format!("Field \"{}\" is not a valid field to query.", f.trim()))
                    })
                    .collect();
                fields = Some(parsed?);
            }
            "--format" => {
                let v = value(arg, &mut it)?;
                let mut f = CsvFormat { header: true, units: true };
                for part in v.split(',') {
                    match part.trim() {
                        "csv" => {}
                        "noheader" => f.header = false,
                        "nounits" => f.units = false,
                        other => return Err(format!("\"{other}\" is not a valid format option.")),
                    }
                }
                if !v.split(',').any(|p| p.trim() == "csv") {
                    return Err("The --format option requires csv.".to_owned());
                }
                format = Some(f);
            }
            "-i" | "--id" => {
                let v = value(arg, &mut it)?;
                let parsed: Result<Vec<u32>, String> = v
                    .split(',')
                    .map(|s| {
                        s.trim()
                            .parse()
                            .map_err(|_| format!("Invalid GPU index \"{s}\" (the stand-in takes indices)."))
                    })
                    .collect();
                ids = Some(parsed?);
            }
            _ => return Err(format!("Option \"{arg}\" is not recognized. Please run 'nvidia-smi -h'.")),
        }
    }
    match (fields, format) {
        (Some(fields), Some(format)) => Ok(Mode::Query { fields, format, ids }),
        (Some(_), None) => Err("--format is required with --query-gpu (e.g. --format=csv).".to_owned()),
        (None, Some(_)) => Err("--format is only valid with --query-gpu.".to_owned()),
        (None, None) => Ok(mode.unwrap_or(Mode::Summary)),
    }
}

const HELP: &str = "nvidia-smi (nvinject simulated-node stand-in): reports what libnvidia-ml.so.1 says.\n\
\n\
    nvidia-smi                      summary table\n\
    nvidia-smi -L, --list-gpus      one line per GPU and MIG device\n\
    nvidia-smi --query-gpu=F[,F...] --format=csv[,noheader][,nounits] [-i IDX[,IDX...]]\n\
        F: index uuid name pci.bus_id memory.total memory.used memory.free minor_number\n\
           driver_version count serial temperature.gpu utilization.gpu mig.mode.current\n\
    nvidia-smi --version\n";

fn main() -> ExitCode {
    // SAFETY: called first, before any thread exists. Like the real tool (a C program), die quietly
    // on a closed pipe (`nvidia-smi | head`) instead of panicking in println!.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let called_as = std::path::Path::new(&argv0).file_name().map(|n| n.to_string_lossy().into_owned());
    if let Some(stub) = STUBS.iter().find(|s| called_as.as_deref() == Some(**s)) {
        println!("{stub}: stand-in from the nvinject simulated GPU node; it has nothing to do and exits.");
        return ExitCode::SUCCESS;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = match parse_args(&args) {
        Ok(mode) => mode,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    if mode == Mode::Help {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    }
    let nvml = match Nvml::load() {
        Ok(nvml) => nvml,
        Err(_) => {
            println!("{LIBRARY_NOT_FOUND}");
            return ExitCode::from(12);
        }
    };
    if let Err(ret) = nvml.init() {
        if ret == NVML_ERROR_DRIVER_NOT_LOADED {
            println!("{DRIVER_NOT_LOADED}");
        } else {
            println!("Failed to initialize NVML: {}", nvml.error_string(ret));
        }
        return ExitCode::from(exit_code(ret));
    }
    let result = run(&nvml, &mode);
    nvml.shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => ExitCode::from(code),
    }
}

/// Runs one mode against an initialised NVML; `Err` is the exit status.
fn run(nvml: &Nvml, mode: &Mode) -> Result<(), u8> {
    let fail = |what: &str, ret: Ret| {
        println!("{what}: {}", nvml.error_string(ret));
        exit_code(ret)
    };
    if *mode == Mode::Version {
        let driver =
            nvml.system_string("nvmlSystemGetDriverVersion").map_err(|r| fail("Driver version", r))?;
        let nvml_version = nvml.system_string("nvmlSystemGetNVMLVersion").unwrap_or_else(|_| "N/A".into());
        let cuda = nvml.cuda_version().map(cuda_string).unwrap_or_else(|_| "N/A".into());
        println!("NVIDIA-SMI version  : {driver}\nNVML version        : {nvml_version}");
        println!("DRIVER version      : {driver}\nCUDA Version        : {cuda}");
        return Ok(());
    }
    let count = nvml.count().map_err(|r| fail("Unable to determine the number of GPUs", r))?;
    if count == 0 {
        println!("No devices were found");
        return Err(NVML_ERROR_NOT_FOUND as u8);
    }
    match mode {
        Mode::List => list(nvml, count),
        Mode::Query { fields, format, ids } => query(nvml, count, fields, format, ids.as_deref()),
        _ => summary(nvml, count),
    }
}

fn cuda_string(v: c_int) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

fn list(nvml: &Nvml, count: u32) -> Result<(), u8> {
    let mut status = Ok(());
    for i in 0..count {
        let d = match nvml.handle(i) {
            Ok(d) => d,
            Err(ret) => {
                println!("Unable to determine the device handle for GPU {i}: {}", nvml.error_string(ret));
                status = Err(exit_code(ret));
                continue;
            }
        };
        let name = nvml.device_string("nvmlDeviceGetName", d).unwrap_or_else(|_| "Unknown".into());
        let uuid = nvml.device_string("nvmlDeviceGetUUID", d).unwrap_or_else(|_| "Unknown".into());
        println!("{}", gpu_line(i, &name, &uuid));
        if nvml.mig_enabled(d) != Ok(true) {
            continue;
        }
        let max = nvml.device_u32("nvmlDeviceGetMaxMigDeviceCount", d).unwrap_or(0);
        for m in 0..max {
            // Slots without an instance answer NOT_FOUND.
            let Ok(md) = nvml.mig_handle(d, m) else { continue };
            let name = nvml.device_string("nvmlDeviceGetName", md).unwrap_or_default();
            let uuid = nvml.device_string("nvmlDeviceGetUUID", md).unwrap_or_else(|_| "Unknown".into());
            println!("{}", mig_line(m, &name, &uuid));
        }
    }
    status
}

/// A value the real tool prints when a query fails.
fn unavailable(ret: Ret) -> String {
    if ret == NVML_ERROR_NOT_SUPPORTED { "[Not Supported]".into() } else { "[N/A]".into() }
}

fn query(
    nvml: &Nvml,
    count: u32,
    fields: &[Field],
    format: &CsvFormat,
    ids: Option<&[u32]>,
) -> Result<(), u8> {
    if let Some(bad) = ids.and_then(|ids| ids.iter().find(|&&i| i >= count)) {
        println!("No devices were found for index {bad}");
        return Err(NVML_ERROR_NOT_FOUND as u8);
    }
    if format.header {
        println!("{}", fields.iter().map(|f| f.header()).collect::<Vec<_>>().join(", "));
    }
    let unit = |v: String, u: &str| if format.units { format!("{v} {u}") } else { v };
    let mib = |bytes: u64| (bytes / (1024 * 1024)).to_string();
    for i in 0..count {
        if ids.is_some_and(|ids| !ids.contains(&i)) {
            continue;
        }
        let d = nvml.handle(i).map_err(exit_code)?;
        let row: Vec<String> = fields
            .iter()
            .map(|f| {
                let r: Result<String, Ret> = match f {
                    Field::Index => Ok(i.to_string()),
                    Field::Uuid => nvml.device_string("nvmlDeviceGetUUID", d),
                    Field::Name => nvml.device_string("nvmlDeviceGetName", d),
                    Field::BusId => nvml.pci(d).map(|p| Nvml::buffer_to_string(&p.bus_id)),
                    Field::MemoryTotal => nvml.memory(d).map(|m| unit(mib(m.total), "MiB")),
                    Field::MemoryUsed => nvml.memory(d).map(|m| unit(mib(m.used), "MiB")),
                    Field::MemoryFree => nvml.memory(d).map(|m| unit(mib(m.free), "MiB")),
                    Field::Minor => nvml.device_u32("nvmlDeviceGetMinorNumber", d).map(|m| m.to_string()),
                    Field::DriverVersion => nvml.system_string("nvmlSystemGetDriverVersion"),
                    Field::Count => Ok(count.to_string()),
                    Field::Serial => nvml.device_string("nvmlDeviceGetSerial", d),
                    Field::Temperature => nvml.temperature(d).map(|t| t.to_string()),
                    Field::UtilizationGpu => nvml.utilization(d).map(|u| unit(u.gpu.to_string(), "%")),
                    Field::MigModeCurrent => {
                        nvml.mig_enabled(d).map(|on| if on { "Enabled" } else { "Disabled" }.to_owned())
                    }
                };
                r.unwrap_or_else(unavailable)
            })
            .collect();
        println!("{}", row.join(", "));
    }
    Ok(())
}

/// One GPU's figures for the summary table.
struct Row {
    index: u32,
    name: String,
    bus_id: String,
    temperature: Option<u32>,
    power_w: Option<u32>,
    used_mib: u64,
    total_mib: u64,
    util: Option<u32>,
    mig: Option<bool>,
}

const RULE: &str =
    "+-----------------------------------------+------------------------+----------------------+";

/// The table's header: versions, then column titles.
fn table_header(driver: &str, cuda: &str) -> String {
    let versions = format!("NVIDIA-SMI {driver:<23}Driver Version: {driver:<15}CUDA Version: {cuda:<8}");
    format!(
        "+-----------------------------------------------------------------------------------------+\n\
         | {versions:<87} |\n\
         |-----------------------------------------+------------------------+----------------------+\n\
         | GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n\
         | Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n\
         |                                         |                        |               MIG M. |\n\
         |=========================================+========================+======================|"
    )
}

/// Three lines per GPU, in the real table's columns.
fn table_row(r: &Row) -> String {
    let name = if r.name.chars().count() > 27 {
        format!("{}...", r.name.chars().take(24).collect::<String>())
    } else {
        r.name.clone()
    };
    let temp = r.temperature.map_or("N/A".to_owned(), |t| format!("{t}C"));
    let power = r.power_w.map_or("N/A".to_owned(), |p| format!("{p}W"));
    let util = r.util.map_or("N/A".to_owned(), |u| format!("{u}%"));
    let mig = match r.mig {
        Some(true) => "Enabled",
        Some(false) => "Disabled",
        None => "N/A",
    };
    let memory = format!("{}MiB / {}MiB", r.used_mib, r.total_mib);
    format!(
        "| {idx:>3}  {name:<27}{persist:>6}  | {bus:>18} {disp:>3} | {ecc:>20} |\n\
         | N/A  {temp:>4}    P0{power:>16} / {cap:>5} | {memory:>22} |{util:>8}      Default |\n\
         | {blank:39} | {blank:22} | {mig:>20} |\n{RULE}",
        idx = r.index,
        persist = "On",
        bus = r.bus_id,
        disp = "Off",
        ecc = "0",
        cap = "N/A",
        blank = "",
    )
}

fn summary(nvml: &Nvml, count: u32) -> Result<(), u8> {
    let driver = nvml.system_string("nvmlSystemGetDriverVersion").unwrap_or_else(|_| "N/A".into());
    let cuda = nvml.cuda_version().map(cuda_string).unwrap_or_else(|_| "N/A".into());
    println!("{}", table_header(&driver, &cuda));
    for i in 0..count {
        let d = nvml.handle(i).map_err(exit_code)?;
        let memory = nvml.memory(d).unwrap_or_default();
        let power_mw = nvml.device_u32("nvmlDeviceGetPowerUsage", d).ok();
        let row = Row {
            index: i,
            name: nvml.device_string("nvmlDeviceGetName", d).unwrap_or_else(|_| "Unknown".into()),
            bus_id: nvml.pci(d).map(|p| Nvml::buffer_to_string(&p.bus_id)).unwrap_or_else(|_| "N/A".into()),
            temperature: nvml.temperature(d).ok(),
            power_w: power_mw.map(|mw| mw / 1000),
            used_mib: memory.used / (1024 * 1024),
            total_mib: memory.total / (1024 * 1024),
            util: nvml.utilization(d).ok().map(|u| u.gpu),
            mig: nvml.mig_enabled(d).ok(),
        };
        println!("{}", table_row(&row));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_program_the_builder_copies_this_as_is_a_stub() {
        use nvinject_simnode::build::driver::{BINARIES, IMEX_BINARIES};
        let copies: Vec<&str> =
            BINARIES.iter().chain(&IMEX_BINARIES).copied().filter(|b| *b != "nvidia-smi").collect();
        assert_eq!(copies, STUBS);
    }

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn list_lines_match_the_real_tool() {
        assert_eq!(
            gpu_line(0, "NVIDIA H100 80GB HBM3", "GPU-b5702e53-2cbe-e695-9fb0-1bb462346090"),
            "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-b5702e53-2cbe-e695-9fb0-1bb462346090)"
        );
        assert_eq!(
            mig_line(0, "NVIDIA A100-SXM4-80GB MIG 1g.10gb", "MIG-feb88891-0321-5fef-9c87-d4af3b54259e"),
            "  MIG 1g.10gb     Device  0: (UUID: MIG-feb88891-0321-5fef-9c87-d4af3b54259e)"
        );
        assert_eq!(
            mig_line(12, "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "MIG-x"),
            "  MIG 1g.5gb      Device 12: (UUID: MIG-x)"
        );
    }

    #[test]
    fn arguments() {
        assert_eq!(parse_args(&[]), Ok(Mode::Summary));
        assert_eq!(parse_args(&args("-L")), Ok(Mode::List));
        assert_eq!(
            parse_args(&args("--query-gpu=index,uuid,memory.total --format=csv,noheader -i 1,3")),
            Ok(Mode::Query {
                fields: vec![Field::Index, Field::Uuid, Field::MemoryTotal],
                format: CsvFormat { header: false, units: true },
                ids: Some(vec![1, 3]),
            })
        );
        assert_eq!(
            parse_args(&args("--query-gpu name --format csv,nounits")),
            Ok(Mode::Query {
                fields: vec![Field::Name],
                format: CsvFormat { header: true, units: false },
                ids: None
            })
        );
        assert_eq!(
            parse_args(&args("--query-gpu=index,bogus --format=csv")),
            Err("Field \"bogus\" is not a valid field to query.".into())
        );
        assert!(parse_args(&args("--query-gpu=index")).is_err());
        assert!(parse_args(&args("--frobnicate")).unwrap_err().contains("--frobnicate"));
    }

    #[test]
    fn exit_codes_follow_the_man_page() {
        assert_eq!(exit_code(NVML_ERROR_DRIVER_NOT_LOADED), 9);
        assert_eq!(exit_code(NVML_ERROR_IRQ_ISSUE), 10);
        assert_eq!(exit_code(7), 255); // NVML_ERROR_INSUFFICIENT_SIZE
        assert_eq!(exit_code(999), 255);
    }

    #[test]
    fn table_lines_keep_the_columns() {
        let head = table_header("550.54.15", "12.4");
        let row = table_row(&Row {
            index: 0,
            name: "NVIDIA A100-SXM4-80GB".into(),
            bus_id: "00000000:07:00.0".into(),
            temperature: Some(29),
            power_w: Some(61),
            used_mib: 0,
            total_mib: 81920,
            util: Some(0),
            mig: Some(true),
        });
        // Every cell border sits where the rule's `+` does, as in the real table.
        let borders =
            |l: &str| l.char_indices().filter(|(_, c)| *c == '|' || *c == '+').map(|(i, _)| i).collect();
        let rule: Vec<usize> = borders(RULE);
        for line in head.lines().skip(2).chain(row.lines()) {
            assert_eq!(borders(line), rule, "`{line}`");
        }
        for line in head.lines() {
            assert_eq!(line.chars().count(), RULE.len(), "`{line}`");
        }
        assert!(row.contains("| N/A   29C    P0             61W /   N/A |"), "{row}");
        assert!(head.contains("NVIDIA-SMI 550.54.15") && head.contains("CUDA Version: 12.4"));
        assert!(
            row.contains("00000000:07:00.0") && row.contains("0MiB / 81920MiB") && row.contains("Enabled")
        );
        assert_eq!(cuda_string(12040), "12.4");
    }
}
