//! Device health: a state machine fed by XID events and the clock.
//!
//! A critical XID marks the devices it concerns Unhealthy: the MIG device named by the event's
//! GPU/compute instance ids, else every device of the GPU (the whole GPU and its MIG devices).
//! A device becomes Healthy again once no critical XID has hit it for the recovery period and
//! its GPU still answers NVML (the caller probes; [`HealthTracker::due`] says whom to probe).
//! Everything here is a function of the events and the instants passed in.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::duration::GoDuration;

/// XIDs that report an application's fault, not the GPU's, after NVIDIA's XID catalog. A GPU
/// stays Healthy when only these occur.
pub const DEFAULT_IGNORED_XIDS: &[u64] = &[
    13,  // Graphics engine exception: a bad kernel (out-of-range access, illegal instruction).
    31,  // GPU memory page fault: an application touched memory it does not own.
    43,  // GPU stopped processing: the faulting context was killed; others continue.
    45,  // Preemptive cleanup after one of the above or a killed process.
    68,  // Video processor (NVDEC/NVENC) exception caused by the stream fed to it.
    94,  // Contained ECC error: the row was isolated, only the application touching it failed.
    109, // Context switch timeout: an application hogged the engine.
];

/// The default quiet period before a GPU that reported a critical XID is Healthy again.
pub const DEFAULT_RECOVERY_PERIOD: Duration = Duration::from_secs(300);

/// Which XIDs count, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthPolicy {
    /// No health checking at all.
    pub disabled: bool,
    /// Never critical.
    pub ignored_xids: BTreeSet<u64>,
    /// `None` = every XID not ignored is critical; else only these.
    pub critical_xids: Option<BTreeSet<u64>>,
    /// Quiet time before recovery; `None` = a GPU stays Unhealthy until the plugin restarts.
    pub recovery_period: Option<GoDuration>,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        HealthPolicy {
            disabled: false,
            ignored_xids: DEFAULT_IGNORED_XIDS.iter().copied().collect(),
            critical_xids: None,
            recovery_period: Some(GoDuration(DEFAULT_RECOVERY_PERIOD)),
        }
    }
}

impl HealthPolicy {
    /// True when `xid` marks a GPU unhealthy. An unknown XID (NVML's 999) is critical.
    pub fn is_critical(&self, xid: u64) -> bool {
        if self.disabled || self.ignored_xids.contains(&xid) {
            return false;
        }
        match &self.critical_xids {
            None => true,
            Some(set) => set.contains(&xid),
        }
    }
}

/// NVML's "no instance" value for the GPU/compute instance ids of an event.
pub const NO_INSTANCE: u32 = u32::MAX;

/// One XID event as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidEvent {
    /// UUID of the GPU it happened on; `None` when NVML could not say (then it concerns all GPUs).
    pub gpu_uuid: Option<String>,
    /// The XID; `None` when NVML reports it as unknown (999).
    pub xid: Option<u64>,
    /// GPU instance id for an XID inside a MIG device.
    pub gpu_instance_id: Option<u32>,
    /// Compute instance id for an XID inside a MIG device.
    pub compute_instance_id: Option<u32>,
}

/// A device the tracker knows: a whole GPU or a MIG device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackedDevice {
    /// `GPU-...` or `MIG-...`.
    pub uuid: String,
    /// UUID of the physical GPU.
    pub gpu_uuid: String,
    /// `(gpu instance, compute instance)` of a MIG device.
    pub mig: Option<(u32, u32)>,
}

#[derive(Debug, Clone)]
struct State {
    device: TrackedDevice,
    /// When the last critical XID (or failed probe) hit it; `Some` = Unhealthy.
    unhealthy_since: Option<Instant>,
}

/// What an event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventOutcome {
    /// The XID is not critical under the policy (or health checks are off).
    Ignored,
    /// The XID names a GPU this plugin does not serve.
    NotOurs,
    /// These device UUIDs are (still) Unhealthy; `changed` is true when one of them was Healthy.
    Marked {
        /// The devices hit.
        devices: Vec<String>,
        /// Whether the unhealthy set grew.
        changed: bool,
    },
}

/// A device whose quiet period is over: probe `gpu_uuid`, then [`HealthTracker::recover`] or
/// [`HealthTracker::postpone`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// The device.
    pub uuid: String,
    /// Its GPU, to probe.
    pub gpu_uuid: String,
}

/// The unhealthy device UUIDs at one moment; cheap to clone and share with gRPC streams.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthSnapshot {
    /// Unhealthy device UUIDs (`GPU-...`/`MIG-...`); everything else is Healthy.
    pub unhealthy: Arc<BTreeSet<String>>,
}

impl HealthSnapshot {
    /// True when `uuid` is Healthy.
    pub fn is_healthy(&self, uuid: &str) -> bool {
        !self.unhealthy.contains(uuid)
    }
}

/// The state machine.
#[derive(Debug, Clone)]
pub struct HealthTracker {
    policy: HealthPolicy,
    states: Vec<State>,
}

impl HealthTracker {
    /// Tracks `devices`, all Healthy.
    pub fn new(policy: HealthPolicy, devices: impl IntoIterator<Item = TrackedDevice>) -> Self {
        let mut states: Vec<State> = Vec::new();
        for d in devices {
            if !states.iter().any(|s| s.device.uuid == d.uuid) {
                states.push(State { device: d, unhealthy_since: None });
            }
        }
        HealthTracker { policy, states }
    }

    /// Distinct GPU UUIDs of the tracked devices, in first-seen order.
    pub fn gpus(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for s in &self.states {
            if !out.contains(&s.device.gpu_uuid) {
                out.push(s.device.gpu_uuid.clone());
            }
        }
        out
    }

    /// Applies an XID event seen at `now`.
    pub fn on_xid(&mut self, ev: &XidEvent, now: Instant) -> EventOutcome {
        let critical = match ev.xid {
            Some(x) => self.policy.is_critical(x),
            None => !self.policy.disabled,
        };
        if !critical {
            return EventOutcome::Ignored;
        }
        let hit = self.devices_hit(ev);
        if hit.is_empty() {
            return EventOutcome::NotOurs;
        }
        Self::mark(&mut self.states, &hit, now)
    }

    /// Marks every device of `gpu_uuid` Unhealthy at `now` (a failed probe).
    pub fn mark_gpu(&mut self, gpu_uuid: &str, now: Instant) -> EventOutcome {
        let hit: Vec<usize> =
            (0..self.states.len()).filter(|&i| self.states[i].device.gpu_uuid == gpu_uuid).collect();
        if hit.is_empty() {
            return EventOutcome::NotOurs;
        }
        Self::mark(&mut self.states, &hit, now)
    }

    fn mark(states: &mut [State], hit: &[usize], now: Instant) -> EventOutcome {
        let mut changed = false;
        for &i in hit {
            changed |= states[i].unhealthy_since.is_none();
            states[i].unhealthy_since = Some(now);
        }
        EventOutcome::Marked {
            devices: hit.iter().map(|&i| states[i].device.uuid.clone()).collect(),
            changed,
        }
    }

    fn devices_hit(&self, ev: &XidEvent) -> Vec<usize> {
        let all = 0..self.states.len();
        let Some(gpu) = &ev.gpu_uuid else { return all.collect() };
        let on_gpu: Vec<usize> = all.filter(|&i| &self.states[i].device.gpu_uuid == gpu).collect();
        let instance = match (ev.gpu_instance_id, ev.compute_instance_id) {
            (Some(gi), Some(ci)) if gi != NO_INSTANCE && ci != NO_INSTANCE => Some((gi, ci)),
            _ => None,
        };
        if let Some(inst) = instance {
            let exact: Vec<usize> =
                on_gpu.iter().copied().filter(|&i| self.states[i].device.mig == Some(inst)).collect();
            if !exact.is_empty() {
                return exact;
            }
        }
        on_gpu
    }

    /// Unhealthy devices whose quiet period has passed at `now`. Empty when recovery is off.
    pub fn due(&self, now: Instant) -> Vec<Due> {
        let Some(period) = self.policy.recovery_period else { return Vec::new() };
        self.states
            .iter()
            .filter(|s| s.unhealthy_since.is_some_and(|t| now.saturating_duration_since(t) >= period.0))
            .map(|s| Due { uuid: s.device.uuid.clone(), gpu_uuid: s.device.gpu_uuid.clone() })
            .collect()
    }

    /// Marks `uuid` Healthy; true when it was Unhealthy.
    pub fn recover(&mut self, uuid: &str) -> bool {
        match self.states.iter_mut().find(|s| s.device.uuid == uuid) {
            Some(s) if s.unhealthy_since.is_some() => {
                s.unhealthy_since = None;
                true
            }
            _ => false,
        }
    }

    /// Keeps `uuid` Unhealthy for another quiet period from `now` (its GPU did not answer).
    pub fn postpone(&mut self, uuid: &str, now: Instant) {
        if let Some(s) = self.states.iter_mut().find(|s| s.device.uuid == uuid && s.unhealthy_since.is_some())
        {
            s.unhealthy_since = Some(now);
        }
    }

    /// When the next device becomes due, if any.
    pub fn next_deadline(&self) -> Option<Instant> {
        let period = self.policy.recovery_period?;
        self.states.iter().filter_map(|s| s.unhealthy_since).min().map(|t| t + period.0)
    }

    /// The current unhealthy set.
    pub fn snapshot(&self) -> HealthSnapshot {
        HealthSnapshot {
            unhealthy: Arc::new(
                self.states
                    .iter()
                    .filter(|s| s.unhealthy_since.is_some())
                    .map(|s| s.device.uuid.clone())
                    .collect(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn tracker(recovery: Option<u64>) -> HealthTracker {
        let policy = HealthPolicy {
            recovery_period: recovery.map(|s| GoDuration(Duration::from_secs(s))),
            ..HealthPolicy::default()
        };
        let d = |uuid: &str, gpu: &str, mig| TrackedDevice { uuid: uuid.into(), gpu_uuid: gpu.into(), mig };
        HealthTracker::new(
            policy,
            [
                d("GPU-a", "GPU-a", None),
                d("MIG-b1", "GPU-b", Some((1, 0))),
                d("MIG-b2", "GPU-b", Some((2, 0))),
            ],
        )
    }

    fn xid(gpu: Option<&str>, xid: u64, inst: Option<(u32, u32)>) -> XidEvent {
        XidEvent {
            gpu_uuid: gpu.map(str::to_owned),
            xid: Some(xid),
            gpu_instance_id: inst.map(|i| i.0),
            compute_instance_id: inst.map(|i| i.1),
        }
    }

    fn unhealthy(t: &HealthTracker) -> Vec<String> {
        t.snapshot().unhealthy.iter().cloned().collect()
    }

    #[test]
    fn application_xids_are_ignored_and_critical_ones_mark() {
        let mut t = tracker(Some(60));
        let now = Instant::now();
        for app in [13, 31, 43, 45, 68, 94] {
            assert_eq!(t.on_xid(&xid(Some("GPU-a"), app, None), now), EventOutcome::Ignored);
        }
        assert!(unhealthy(&t).is_empty());
        let out = t.on_xid(&xid(Some("GPU-a"), 79, None), now);
        assert_eq!(out, EventOutcome::Marked { devices: vec!["GPU-a".into()], changed: true });
        assert_eq!(unhealthy(&t), vec!["GPU-a"]);
        let again = t.on_xid(&xid(Some("GPU-a"), 48, None), now);
        assert_eq!(again, EventOutcome::Marked { devices: vec!["GPU-a".into()], changed: false });
        assert_eq!(t.on_xid(&xid(Some("GPU-zzz"), 79, None), now), EventOutcome::NotOurs);
    }

    #[test]
    fn mig_instance_ids_narrow_the_event() {
        let mut t = tracker(None);
        let now = Instant::now();
        t.on_xid(&xid(Some("GPU-b"), 79, Some((2, 0))), now);
        assert_eq!(unhealthy(&t), vec!["MIG-b2"]);
        t.on_xid(&xid(Some("GPU-b"), 79, Some((NO_INSTANCE, NO_INSTANCE))), now);
        assert_eq!(unhealthy(&t), vec!["MIG-b1", "MIG-b2"], "no instance: the whole GPU");
        let mut t = tracker(None);
        t.on_xid(&xid(Some("GPU-b"), 79, Some((5, 0))), now);
        assert_eq!(unhealthy(&t), vec!["MIG-b1", "MIG-b2"], "unknown instance: the whole GPU");
        let mut t = tracker(None);
        t.on_xid(&xid(None, 79, None), now);
        assert_eq!(unhealthy(&t).len(), 3, "no GPU named: all");
    }

    #[test]
    fn recovery_after_a_quiet_period() {
        let mut t = tracker(Some(60));
        let t0 = Instant::now();
        t.on_xid(&xid(Some("GPU-a"), 79, None), t0);
        assert_eq!(t.next_deadline(), Some(t0 + Duration::from_secs(60)));
        assert!(t.due(t0 + Duration::from_secs(59)).is_empty());
        // Another XID restarts the quiet period.
        t.on_xid(&xid(Some("GPU-a"), 79, None), t0 + Duration::from_secs(30));
        assert!(t.due(t0 + Duration::from_secs(61)).is_empty());
        let due = t.due(t0 + Duration::from_secs(90));
        assert_eq!(due, vec![Due { uuid: "GPU-a".into(), gpu_uuid: "GPU-a".into() }]);
        // The GPU did not answer the probe: wait another period.
        t.postpone("GPU-a", t0 + Duration::from_secs(90));
        assert!(t.due(t0 + Duration::from_secs(100)).is_empty());
        assert!(t.recover("GPU-a"));
        assert!(!t.recover("GPU-a"));
        assert!(unhealthy(&t).is_empty());
        assert_eq!(t.next_deadline(), None);
    }

    #[test]
    fn no_recovery_when_disabled_and_nothing_when_health_is_off() {
        let mut t = tracker(None);
        let t0 = Instant::now();
        t.on_xid(&xid(Some("GPU-a"), 79, None), t0);
        assert!(t.due(t0 + Duration::from_secs(1_000_000)).is_empty());
        assert_eq!(t.next_deadline(), None);

        let policy = HealthPolicy { disabled: true, ..HealthPolicy::default() };
        let mut off = HealthTracker::new(policy, tracker(None).states.into_iter().map(|s| s.device));
        assert_eq!(off.on_xid(&xid(Some("GPU-a"), 79, None), t0), EventOutcome::Ignored);
        let unknown = XidEvent { xid: None, ..xid(Some("GPU-a"), 0, None) };
        assert_eq!(off.on_xid(&unknown, t0), EventOutcome::Ignored);
        assert!(matches!(t.on_xid(&unknown, t0), EventOutcome::Marked { .. }), "unknown XIDs are critical");
    }

    #[test]
    fn failed_probe_marks_a_gpu() {
        let mut t = tracker(Some(60));
        let out = t.mark_gpu("GPU-b", Instant::now());
        assert_eq!(
            out,
            EventOutcome::Marked { devices: vec!["MIG-b1".into(), "MIG-b2".into()], changed: true }
        );
        assert_eq!(t.gpus(), vec!["GPU-a", "GPU-b"]);
    }
}
