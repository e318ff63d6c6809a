//! GetPreferredAllocation: which of the available devices a container should get.
//!
//! Pure and deterministic (same request, same answer):
//! - whole GPUs: the set with the most NVLink links inside it, then the shortest PCIe distances,
//!   then the lowest GPU indices. Exhaustive when the number of candidate sets is small (every real
//!   node), greedy beyond that;
//! - MIG devices: packed onto the GPUs with the fewest free MIG devices, keeping whole GPUs free;
//! - replicas: `distributed` spreads over the GPUs with the fewest replicas in use, `packed` fills
//!   the busiest GPUs first.
//!
//! The answer always contains the must-include ids and is sorted by GPU index, then replica.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::RequestError;
use crate::resources::{AdvertisedDevice, Resource, Sharing, Topology};
use crate::settings::ReplicaPolicy;

/// Above this many candidate sets the whole-GPU search goes greedy.
const EXHAUSTIVE_LIMIT: u64 = 50_000;

/// Picks `size` ids from `available`, including every id in `must_include`.
pub fn preferred(
    resource: &Resource,
    topology: &Topology,
    available: &[String],
    must_include: &[String],
    size: i64,
) -> Result<Vec<String>, RequestError> {
    let name = || resource.name.to_string();
    let unknown: Vec<String> = available
        .iter()
        .chain(must_include)
        .filter(|id| resource.device(id).is_none())
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if !unknown.is_empty() {
        return Err(RequestError::UnknownDevices { resource: name(), ids: unknown });
    }
    let avail: BTreeSet<&str> = available.iter().map(String::as_str).collect();
    let must: BTreeSet<&str> = must_include.iter().map(String::as_str).collect();
    if size < 1 || size as usize > avail.len() {
        return Err(RequestError::BadSize { resource: name(), size, available: avail.len() });
    }
    let size = size as usize;
    let missing: Vec<String> = must.iter().filter(|m| !avail.contains(*m)).map(|m| m.to_string()).collect();
    if !missing.is_empty() {
        return Err(RequestError::BadMustInclude {
            resource: name(),
            ids: missing,
            reason: "are not among the available ids".into(),
        });
    }
    if must.len() > size {
        return Err(RequestError::BadMustInclude {
            resource: name(),
            ids: must.iter().map(|s| s.to_string()).collect(),
            reason: format!("are more than the allocation size {size}"),
        });
    }
    let dev = |id: &str| resource.device(id).expect("checked above");
    let avail_devs: Vec<&AdvertisedDevice> = avail.iter().map(|id| dev(id)).collect();
    let must_devs: Vec<&AdvertisedDevice> = must.iter().map(|id| dev(id)).collect();

    let mut chosen: Vec<&AdvertisedDevice> = if let Some(s) = &resource.sharing {
        replicas(resource, &avail_devs, &must_devs, size, s)
    } else if resource.targets.iter().any(|t| t.mig.is_some()) {
        mig_packed(resource, &avail_devs, &must_devs, size)
    } else {
        whole_gpus(resource, topology, &avail_devs, &must_devs, size)
    };
    let gpu = |d: &AdvertisedDevice| resource.target_of(d).gpu_index;
    chosen.sort_by_key(|d| (gpu(d), d.target, d.replica));
    Ok(chosen.into_iter().map(|d| d.id.clone()).collect())
}

fn whole_gpus<'a>(
    resource: &Resource,
    topo: &Topology,
    avail: &[&'a AdvertisedDevice],
    must: &[&'a AdvertisedDevice],
    size: usize,
) -> Vec<&'a AdvertisedDevice> {
    let gpu = |d: &AdvertisedDevice| resource.target_of(d).gpu_index;
    let mut candidates: Vec<&AdvertisedDevice> =
        avail.iter().copied().filter(|d| !must.iter().any(|m| m.id == d.id)).collect();
    candidates.sort_by_key(|d| gpu(d));
    let base: Vec<u32> = must.iter().map(|d| gpu(d)).collect();
    let k = size - must.len();
    // Score of a set: more links is better, then less distance. Compared as (links, -distance).
    let score = |set: &[u32]| -> (u64, i64) {
        let mut links = 0u64;
        let mut dist = 0i64;
        for (i, a) in set.iter().enumerate() {
            for b in &set[i + 1..] {
                links += u64::from(topo.links(*a, *b));
                dist += i64::from(topo.distance(*a, *b));
            }
        }
        (links, -dist)
    };
    let mut picked: Vec<usize> = Vec::with_capacity(k);
    if binomial(candidates.len() as u64, k as u64) <= EXHAUSTIVE_LIMIT {
        let mut best: Option<((u64, i64), Vec<usize>)> = None;
        let mut combo: Vec<usize> = (0..k).collect();
        let mut set: Vec<u32> = Vec::with_capacity(size);
        loop {
            set.clear();
            set.extend(&base);
            set.extend(combo.iter().map(|&i| gpu(candidates[i])));
            let s = score(&set);
            // Strictly better only: among equals the first (lowest indices) wins.
            if best.as_ref().is_none_or(|(b, _)| s > *b) {
                best = Some((s, combo.clone()));
            }
            if !next_combination(&mut combo, candidates.len()) {
                break;
            }
        }
        picked = best.map(|(_, c)| c).unwrap_or_default();
    } else {
        let mut set = base.clone();
        for _ in 0..k {
            let next = (0..candidates.len())
                .filter(|i| !picked.contains(i))
                .max_by(|&i, &j| {
                    let mut with_i = set.clone();
                    with_i.push(gpu(candidates[i]));
                    let mut with_j = set.clone();
                    with_j.push(gpu(candidates[j]));
                    // On a tie prefer the lower index, which comes first.
                    score(&with_i).cmp(&score(&with_j)).then(j.cmp(&i))
                })
                .expect("enough candidates: size was checked");
            picked.push(next);
            set.push(gpu(candidates[next]));
        }
    }
    must.iter().copied().chain(picked.into_iter().map(|i| candidates[i])).collect()
}

fn mig_packed<'a>(
    resource: &Resource,
    avail: &[&'a AdvertisedDevice],
    must: &[&'a AdvertisedDevice],
    size: usize,
) -> Vec<&'a AdvertisedDevice> {
    let gpu = |d: &AdvertisedDevice| resource.target_of(d).gpu_index;
    let mut free_per_gpu: BTreeMap<u32, usize> = BTreeMap::new();
    for d in avail {
        *free_per_gpu.entry(gpu(d)).or_default() += 1;
    }
    let mut rest: Vec<&AdvertisedDevice> =
        avail.iter().copied().filter(|d| !must.iter().any(|m| m.id == d.id)).collect();
    rest.sort_by_key(|d| (free_per_gpu[&gpu(d)], gpu(d), d.target));
    must.iter().copied().chain(rest.into_iter().take(size - must.len())).collect()
}

fn replicas<'a>(
    resource: &Resource,
    avail: &[&'a AdvertisedDevice],
    must: &[&'a AdvertisedDevice],
    size: usize,
    sharing: &Sharing,
) -> Vec<&'a AdvertisedDevice> {
    let replicas_per_target = sharing.replicas as usize;
    // Replicas of each target that are free and not yet chosen, lowest replica number first.
    let mut free: BTreeMap<usize, Vec<&AdvertisedDevice>> = BTreeMap::new();
    for d in avail {
        if !must.iter().any(|m| m.id == d.id) {
            free.entry(d.target).or_default().push(d);
        }
    }
    for list in free.values_mut() {
        list.sort_by_key(|d| d.replica);
        list.reverse(); // pop() takes the lowest
    }
    // In use = not offered as available, plus what this answer already took.
    let mut in_use: BTreeMap<usize, usize> = BTreeMap::new();
    for (t, _) in resource.targets.iter().enumerate() {
        let offered = avail.iter().filter(|d| d.target == t).count();
        in_use.insert(t, replicas_per_target.saturating_sub(offered));
    }
    for m in must {
        *in_use.entry(m.target).or_default() += 1;
    }
    let gpu = |t: usize| resource.targets[t].gpu_index;
    let mut out: Vec<&AdvertisedDevice> = must.to_vec();
    while out.len() < size {
        let t = free
            .iter()
            .filter(|(_, l)| !l.is_empty())
            .map(|(t, _)| *t)
            .min_by_key(|t| {
                let used = in_use[t];
                match sharing.policy {
                    ReplicaPolicy::Distributed => (used as i64, gpu(*t)),
                    ReplicaPolicy::Packed => (-(used as i64), gpu(*t)),
                }
            })
            .expect("enough available: size was checked");
        let d = free.get_mut(&t).and_then(Vec::pop).expect("non-empty");
        *in_use.entry(t).or_default() += 1;
        out.push(d);
    }
    out
}

fn binomial(n: u64, k: u64) -> u64 {
    if k > n {
        return 0;
    }
    let k = k.min(n - k);
    let mut r: u64 = 1;
    for i in 0..k {
        r = r.saturating_mul(n - i) / (i + 1);
        if r > EXHAUSTIVE_LIMIT * 1000 {
            return u64::MAX;
        }
    }
    r
}

/// Advances `c` (strictly increasing indices below `n`) to the next combination in lexicographic order.
fn next_combination(c: &mut [usize], n: usize) -> bool {
    let k = c.len();
    for i in (0..k).rev() {
        if c[i] < n - k + i {
            c[i] += 1;
            for j in i + 1..k {
                c[j] = c[j - 1] + 1;
            }
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::tests::{gpu, gpu_time_slicing, inventory, mig_node, settings};
    use crate::resources::{HostFacts, Plan, plan};
    use crate::settings::MigStrategy;

    fn uuid(i: u32) -> String {
        format!("GPU-{i}0000000-0000-0000-0000-000000000000")
    }

    fn eight(islands: &[&[u32]]) -> Plan {
        let inv = inventory((0..8).map(|i| gpu(i, i / 4, &[])).collect(), islands);
        plan(&inv, &settings(), &HostFacts::default()).unwrap()
    }

    fn pick(p: &Plan, avail: &[u32], must: &[u32], size: i64) -> Vec<u32> {
        let r = &p.resources[0];
        let a: Vec<String> = avail.iter().map(|i| uuid(*i)).collect();
        let m: Vec<String> = must.iter().map(|i| uuid(*i)).collect();
        preferred(r, &p.topology, &a, &m, size)
            .unwrap()
            .iter()
            .map(|id| r.target_of(r.device(id).unwrap()).gpu_index)
            .collect()
    }

    #[test]
    fn nvlink_islands_are_kept_together() {
        let p = eight(&[&[0, 1, 2, 3], &[4, 5, 6, 7]]);
        let all: Vec<u32> = (0..8).collect();
        assert_eq!(pick(&p, &all, &[], 4), vec![0, 1, 2, 3]);
        assert_eq!(pick(&p, &all, &[5], 4), vec![4, 5, 6, 7]);
        assert_eq!(pick(&p, &[0, 1, 4, 5, 6], &[], 3), vec![4, 5, 6], "three linked beat two linked");
        assert_eq!(pick(&p, &[0, 4, 5, 6], &[0], 2), vec![0, 4], "must-include honoured, then proximity");
        assert_eq!(pick(&p, &all, &[], 8), all);
    }

    #[test]
    fn without_nvlink_differences_pcie_decides() {
        let p = eight(&[&[0, 1, 2, 3, 4, 5, 6, 7]]);
        let all: Vec<u32> = (0..8).collect();
        assert_eq!(pick(&p, &all, &[], 2), vec![0, 1], "same PCIe switch");
        assert_eq!(pick(&p, &[1, 2, 3, 5], &[], 2), vec![2, 3]);
        assert_eq!(pick(&p, &all, &[], 4), vec![0, 1, 2, 3], "one NUMA node");
        assert_eq!(pick(&p, &[0, 3, 4, 5], &[3], 2), vec![0, 3], "same NUMA node beats across");
    }

    #[test]
    fn deterministic_and_greedy_beyond_the_limit() {
        let p = eight(&[&[0, 1, 2, 3], &[4, 5, 6, 7]]);
        let all: Vec<u32> = (0..8).collect();
        let first = pick(&p, &all, &[], 3);
        for _ in 0..5 {
            assert_eq!(pick(&p, &all, &[], 3), first);
        }
        // 40 GPUs in islands of 8: C(40, 8) is far past the exhaustive limit.
        let islands: Vec<Vec<u32>> = (0..5).map(|i| (i * 8..i * 8 + 8).collect()).collect();
        let refs: Vec<&[u32]> = islands.iter().map(|v| v.as_slice()).collect();
        let inv = inventory((0..40).map(|i| gpu(i, i / 20, &[])).collect(), &refs);
        let big = plan(&inv, &settings(), &HostFacts::default()).unwrap();
        let all: Vec<u32> = (0..40).collect();
        assert_eq!(pick(&big, &all, &[17], 8), (16..24).collect::<Vec<_>>());
    }

    #[test]
    fn bad_requests() {
        let p = eight(&[]);
        let r = &p.resources[0];
        let a = vec![uuid(0), uuid(1)];
        let err = |avail: &[String], must: &[String], size| {
            preferred(r, &p.topology, avail, must, size).unwrap_err()
        };
        assert!(matches!(err(&a, &[], 3), RequestError::BadSize { size: 3, available: 2, .. }));
        assert!(matches!(err(&a, &[], 0), RequestError::BadSize { .. }));
        assert!(matches!(err(&a, &[uuid(2)], 1), RequestError::BadMustInclude { .. }));
        assert!(matches!(err(&a, &a, 1), RequestError::BadMustInclude { .. }));
        let e = err(&[uuid(0), "GPU-x".into()], &[], 1);
        assert_eq!(
            e,
            RequestError::UnknownDevices { resource: "nvidia.com/gpu".into(), ids: vec!["GPU-x".into()] }
        );
    }

    fn shared_plan(policy: ReplicaPolicy) -> Plan {
        let mut s = settings();
        s.time_slicing = gpu_time_slicing("gpu", 4, policy);
        let inv = inventory((0..3).map(|i| gpu(i, 0, &[])).collect(), &[]);
        plan(&inv, &s, &HostFacts::default()).unwrap()
    }

    fn replica_ids(p: &Plan, except: &[&str]) -> Vec<String> {
        p.resources[0]
            .devices
            .iter()
            .map(|d| d.id.clone())
            .filter(|id| !except.contains(&id.as_str()))
            .collect()
    }

    #[test]
    fn replicas_distributed_and_packed() {
        let g = |i: u32, r: u32| format!("{}::{r}", uuid(i));
        let (g00, g01, g10) = (g(0, 0), g(0, 1), g(1, 0));
        let in_use = [g00.as_str(), g01.as_str(), g10.as_str()];

        let p = shared_plan(ReplicaPolicy::Distributed);
        let avail = replica_ids(&p, &in_use);
        let got = preferred(&p.resources[0], &p.topology, &avail, &[], 3).unwrap();
        // GPU 2 is idle, GPU 1 has one in use, GPU 0 two: spread onto 2, then 1 and 2 again.
        assert_eq!(got, vec![g(1, 1), g(2, 0), g(2, 1)]);

        let p = shared_plan(ReplicaPolicy::Packed);
        let got = preferred(&p.resources[0], &p.topology, &avail, &[], 3).unwrap();
        assert_eq!(got, vec![g(0, 2), g(0, 3), g(1, 1)], "fill the busiest GPU first");

        let got = preferred(&p.resources[0], &p.topology, &avail, &[g(2, 3)], 2).unwrap();
        assert_eq!(got, vec![g(0, 2), g(2, 3)]);
    }

    #[test]
    fn mig_devices_are_packed() {
        let mut s = settings();
        s.mig_strategy = MigStrategy::Mixed;
        let p = plan(&mig_node(), &s, &HostFacts::default()).unwrap();
        let r = p.resources.iter().find(|r| r.name.as_str() == "nvidia.com/mig-1g.10gb").unwrap();
        let all: Vec<String> = r.devices.iter().map(|d| d.id.clone()).collect();
        // GPU 0 has two 1g devices free, GPU 1 two: equal, so GPU 0 first; then drop one of GPU 1.
        let got = preferred(r, &p.topology, &all, &[], 1).unwrap();
        assert_eq!(got, vec![all[0].clone()]);
        let avail = vec![all[0].clone(), all[1].clone(), all[3].clone()];
        let got = preferred(r, &p.topology, &avail, &[], 1).unwrap();
        assert_eq!(got, vec![all[3].clone()], "GPU 1 has only one free: use it up");
    }

    #[test]
    fn combinations_enumerate_in_order() {
        let mut c = vec![0, 1];
        let mut seen = vec![c.clone()];
        while next_combination(&mut c, 4) {
            seen.push(c.clone());
        }
        assert_eq!(seen, vec![vec![0, 1], vec![0, 2], vec![0, 3], vec![1, 2], vec![1, 3], vec![2, 3]]);
        assert_eq!(binomial(8, 4), 70);
        assert_eq!(binomial(40, 8), u64::MAX);
    }
}
