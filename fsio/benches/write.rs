//! What one atomic replacement costs at each durability level, on the disk that holds the temp dir
//! (`TMPDIR`, else /tmp) and on tmpfs (/dev/shm, where containerd's bundle dirs usually live):
//! a 16 KiB file (the size of a container's config.json with devices injected) replaced in place.
//! Prints median and p90; asserts nothing about time. `NVINJECT_BENCH_RUNS` sets the runs (200).

use std::path::Path;
use std::time::{Duration, Instant};

use nvinject_fsio::{Durability, WriteOptions, write_atomic};

fn report(label: &str, mut times: Vec<Duration>) {
    times.sort();
    let at = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e6;
    println!("{label:<36} median {:>8.1} us  p90 {:>8.1} us", at(0.5), at(0.9));
}

fn bench(where_: &str, dir: &Path, runs: usize) {
    let bytes = vec![b'x'; 16 * 1024];
    let path = dir.join("config.json");
    for (name, durability) in
        [("none", Durability::None), ("file", Durability::File), ("file+dir", Durability::FileAndDir)]
    {
        let options = WriteOptions::new(0o644).durability(durability);
        write_atomic(&path, &bytes, &options).expect("warm-up write");
        let times = (0..runs)
            .map(|_| {
                let t = Instant::now();
                write_atomic(&path, &bytes, &options).expect("write");
                t.elapsed()
            })
            .collect();
        report(&format!("{where_} durability={name}"), times);
    }
}

fn main() {
    let runs: usize = std::env::var("NVINJECT_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let disk = tempfile::tempdir().expect("temp dir");
    bench("disk (temp dir)", disk.path(), runs);
    match tempfile::tempdir_in("/dev/shm") {
        Ok(shm) => bench("tmpfs (/dev/shm)", shm.path(), runs),
        Err(e) => println!("tmpfs (/dev/shm) skipped: {e}"),
    }
}
