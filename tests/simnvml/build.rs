//! Gives the library NVML's SONAME, so that `ldconfig`, the dynamic loader and tools that read
//! `DT_SONAME` (the NVIDIA container toolkit, our own CDI generator) treat it as `libnvidia-ml.so.1`.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}
