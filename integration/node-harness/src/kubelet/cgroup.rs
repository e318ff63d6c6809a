//! The cgroup a test node's kubelet works under (`cgroupRoot`): made in every mounted hierarchy before
//! the kubelet starts (it refuses a root that does not exist), and removed with everything below it
//! afterwards. Cgroups are global to the host, so this is the one thing a node test must undo by hand.

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::error::KubeletError;
use crate::namespace::{cgroup_mounts, dirs_deepest_first};

/// A cgroup of the same name in each hierarchy.
#[derive(Debug)]
pub struct CgroupRoot {
    name: String,
    dirs: Vec<PathBuf>,
}

impl CgroupRoot {
    /// Creates `/<name>` in every cgroup hierarchy mounted here. cpuset children start with no CPUs
    /// or memory nodes in cgroup v1, so those are copied from the parent.
    pub fn create(name: &str) -> Result<Self, KubeletError> {
        let mut root = CgroupRoot { name: name.to_owned(), dirs: Vec::new() };
        for (mount_point, fstype, opts) in cgroup_mounts() {
            let dir = mount_point.join(name);
            fs::create_dir(&dir).map_err(|source| KubeletError::Io {
                op: "create cgroup",
                path: dir.clone(),
                source,
            })?;
            root.dirs.push(dir.clone());
            if fstype == "cgroup" && opts.split(',').any(|o| o == "cpuset") {
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let parent = mount_point.join(file);
                    let value = fs::read_to_string(&parent).map_err(|source| KubeletError::Io {
                        op: "read",
                        path: parent.clone(),
                        source,
                    })?;
                    let child = dir.join(file);
                    fs::write(&child, value.trim()).map_err(|source| KubeletError::Io {
                        op: "write",
                        path: child.clone(),
                        source,
                    })?;
                }
            }
        }
        Ok(root)
    }

    /// The path the kubelet is given (`/<name>`).
    pub fn kubelet_path(&self) -> String {
        format!("/{}", self.name)
    }

    /// Every directory (in every hierarchy) at or below the root, children before their parent.
    pub fn tree(&self) -> Vec<PathBuf> {
        self.dirs.iter().flat_map(|dir| dirs_deepest_first(dir)).collect()
    }

    /// SIGKILLs every process still in the root or below it (containers that outlived their shims);
    /// returns their PIDs. Only processes in this test's own cgroups are touched.
    pub fn kill_remaining(&self) -> Vec<i32> {
        let mut killed = Vec::new();
        for dir in self.tree() {
            let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
                if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
                    .is_ok()
                {
                    killed.push(pid);
                }
            }
        }
        killed.sort_unstable();
        killed.dedup();
        killed
    }

    /// Removes the root and everything below it, deepest first. A cgroup still holding a process cannot
    /// be removed: retried for up to `wait`, then reported with the processes it holds.
    pub fn remove(&mut self, wait: Duration) -> Result<(), KubeletError> {
        let deadline = Instant::now() + wait;
        loop {
            let mut busy = Vec::new();
            for dir in self.tree() {
                match fs::remove_dir(&dir) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => busy.push((dir, e)),
                    _ => {}
                }
            }
            if busy.is_empty() {
                self.dirs.clear();
                return Ok(());
            }
            if Instant::now() >= deadline {
                let (dir, e) = busy.remove(0);
                let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                let procs: Vec<&str> = procs.split_whitespace().collect();
                return Err(KubeletError::Io {
                    op: "remove cgroup",
                    path: dir,
                    source: std::io::Error::new(e.kind(), format!("{e}; processes still in it: {procs:?}")),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for CgroupRoot {
    fn drop(&mut self) {
        if !self.dirs.is_empty() {
            let _ = self.remove(Duration::from_secs(2));
        }
    }
}
