//! The health loop: XID events from NVML into the [`HealthTracker`], changes out to the streams.
//!
//! NVML sits behind [`XidSource`] (three calls: wait, reopen, probe), implemented for real by
//! [`NvmlXidSource`] and by hand-written fakes in the tests. The loop runs on its own thread
//! because NVML's wait blocks. Failed waits are counted, backed off and retried (the event set
//! is re-created after a few in a row); they never mark GPUs unhealthy by themselves, only a
//! GPU that stops answering NVML is.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nvml_wrapper::EventSet;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::event::EventData;
use nvml_wrapper_sys::bindings::nvmlEventData_t;

use crate::health::{EventOutcome, HealthSnapshot, HealthTracker, XidEvent};
use crate::metrics::Metrics;

/// An NVML call that failed, with the call named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {message}")]
pub struct SourceError {
    /// The NVML call, e.g. `nvmlEventSetWait_v2`.
    pub call: &'static str,
    /// NVML's error text.
    pub message: String,
}

impl SourceError {
    fn nvml(call: &'static str, e: NvmlError) -> Self {
        SourceError { call, message: e.to_string() }
    }
}

/// Where XID events come from.
pub trait XidSource {
    /// Waits up to `timeout` for the next event; `Ok(None)` when none came (or one that is not an XID).
    fn wait(&mut self, timeout: Duration) -> Result<Option<XidEvent>, SourceError>;
    /// Drops and re-creates the event registration, after waits kept failing.
    fn reopen(&mut self) -> Result<(), SourceError>;
    /// True when the GPU answers a query: a GPU that does not is not given back to workloads.
    fn probe(&mut self, gpu_uuid: &str) -> bool;
}

/// Time, so the loop can be tested without waiting.
pub trait Clock {
    /// The current instant.
    fn now(&self) -> Instant;
    /// Pauses the calling thread.
    fn sleep(&self, d: Duration);
}

/// The real clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn sleep(&self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// Tuning of the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopConfig {
    /// Longest single wait, so a stop request is seen within it.
    pub max_wait: Duration,
    /// Consecutive failed waits before the event set is re-created.
    pub reopen_after: u32,
    /// First pause after a failed wait; doubles up to `max_backoff`.
    pub first_backoff: Duration,
    /// Longest pause between failed waits.
    pub max_backoff: Duration,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            max_wait: Duration::from_secs(1),
            reopen_after: 3,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// Runs until `stop` is set. Every change of the unhealthy set is passed to `publish`.
pub fn run_health_loop(
    source: &mut dyn XidSource,
    tracker: &mut HealthTracker,
    clock: &dyn Clock,
    metrics: &Metrics,
    stop: &AtomicBool,
    publish: &mut dyn FnMut(HealthSnapshot),
    cfg: LoopConfig,
) {
    let mut failures: u32 = 0;
    let mut backoff = cfg.first_backoff;
    while !stop.load(Ordering::Relaxed) {
        let now = clock.now();
        if recover_due(source, tracker, now) {
            publish(tracker.snapshot());
        }
        let timeout = match tracker.next_deadline() {
            Some(deadline) => deadline.saturating_duration_since(now).min(cfg.max_wait),
            None => cfg.max_wait,
        };
        match source.wait(timeout) {
            Ok(None) => {
                failures = 0;
                backoff = cfg.first_backoff;
            }
            Ok(Some(ev)) => {
                failures = 0;
                backoff = cfg.first_backoff;
                let gpu = ev.gpu_uuid.as_deref().unwrap_or("unknown");
                metrics.xid(gpu, ev.xid);
                match tracker.on_xid(&ev, clock.now()) {
                    EventOutcome::Marked { devices, changed } => {
                        tracing::warn!(gpu, xid = ?ev.xid, ?devices, "critical XID: devices marked Unhealthy");
                        if changed {
                            publish(tracker.snapshot());
                        }
                    }
                    EventOutcome::Ignored => {
                        tracing::info!(gpu, xid = ?ev.xid, "XID ignored (application error or not critical)")
                    }
                    EventOutcome::NotOurs => tracing::debug!(gpu, xid = ?ev.xid, "XID on a GPU not served"),
                }
            }
            Err(e) => {
                metrics.event_wait_error();
                failures += 1;
                tracing::warn!(error = %e, failures, "waiting for NVML events failed; retrying");
                let now = clock.now();
                let mut changed = false;
                for gpu in tracker.gpus() {
                    if !source.probe(&gpu)
                        && let EventOutcome::Marked { changed: c, .. } = tracker.mark_gpu(&gpu, now)
                    {
                        tracing::warn!(gpu, "GPU does not answer NVML: marked Unhealthy");
                        changed |= c;
                    }
                }
                if changed {
                    publish(tracker.snapshot());
                }
                clock.sleep(backoff);
                backoff = (backoff * 2).min(cfg.max_backoff);
                if failures >= cfg.reopen_after {
                    match source.reopen() {
                        Ok(()) => {
                            tracing::info!("NVML event set re-created");
                            failures = 0;
                        }
                        Err(e) => tracing::warn!(error = %e, "re-creating the NVML event set failed"),
                    }
                }
            }
        }
    }
}

/// Recovers devices whose quiet period is over and whose GPU answers; true when any did.
fn recover_due(source: &mut dyn XidSource, tracker: &mut HealthTracker, now: Instant) -> bool {
    let due = tracker.due(now);
    if due.is_empty() {
        return false;
    }
    let mut answers: HashMap<String, bool> = HashMap::new();
    let mut changed = false;
    for d in due {
        let ok = *answers.entry(d.gpu_uuid.clone()).or_insert_with(|| source.probe(&d.gpu_uuid));
        if ok {
            if tracker.recover(&d.uuid) {
                tracing::info!(device = d.uuid, "quiet period over and GPU answers: Healthy again");
                changed = true;
            }
        } else {
            tracing::warn!(device = d.uuid, gpu = d.gpu_uuid, "quiet period over but GPU does not answer");
            tracker.postpone(&d.uuid, now);
        }
    }
    changed
}

/// XID events from a loaded NVML.
pub struct NvmlXidSource<'n> {
    nvml: &'n Nvml,
    gpus: Vec<String>,
    set: Option<EventSet<'n>>,
}

impl<'n> NvmlXidSource<'n> {
    /// Registers for XID events on each GPU in `gpu_uuids`. GPUs that cannot report XIDs are
    /// logged and left unmonitored.
    pub fn open(nvml: &'n Nvml, gpu_uuids: &[String]) -> Result<Self, SourceError> {
        let mut s = NvmlXidSource { nvml, gpus: gpu_uuids.to_vec(), set: None };
        s.reopen()?;
        Ok(s)
    }
}

impl XidSource for NvmlXidSource<'_> {
    fn wait(&mut self, timeout: Duration) -> Result<Option<XidEvent>, SourceError> {
        let Some(set) = &self.set else {
            return Err(SourceError { call: "nvmlEventSetWait_v2", message: "no event set".into() });
        };
        let lib = self.nvml.lib();
        let wait = lib
            .nvmlEventSetWait_v2
            .as_ref()
            .map_err(|e| SourceError { call: "nvmlEventSetWait_v2", message: e.to_string() })?;
        let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        // SAFETY: nvmlEventData_t is plain C data for which all-zero bytes are valid.
        let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
        // SAFETY: the set handle is live (owned by `self.set`, from this `nvml`), and `data`
        // outlives the call, per nvmlEventSetWait_v2's contract.
        let ret = unsafe { wait(set.handle(), &mut data, ms) };
        match nvml_wrapper::error::nvml_try(ret) {
            Ok(()) => {}
            Err(NvmlError::Timeout) => return Ok(None),
            Err(e) => return Err(SourceError::nvml("nvmlEventSetWait_v2", e)),
        }
        // SAFETY: NVML filled `data` and its device handle belongs to this `nvml`.
        let event = unsafe { EventData::new(data, self.nvml) };
        if !event.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
            return Ok(None);
        }
        let xid = match event.event_data {
            Some(nvml_wrapper::enums::event::XidError::Value(v)) => Some(v),
            _ => None,
        };
        let gpu_uuid = event.device.uuid().ok();
        Ok(Some(XidEvent {
            gpu_uuid,
            xid,
            gpu_instance_id: Some(data.gpuInstanceId),
            compute_instance_id: Some(data.computeInstanceId),
        }))
    }

    fn reopen(&mut self) -> Result<(), SourceError> {
        self.set = None;
        let mut set = self.nvml.create_event_set().map_err(|e| SourceError::nvml("nvmlEventSetCreate", e))?;
        for uuid in &self.gpus {
            let device = match self.nvml.device_by_uuid(uuid.as_str()) {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(gpu = uuid, error = %e, "GPU not found by NVML: not health-checked");
                    continue;
                }
            };
            let supported = device.supported_event_types().unwrap_or(EventTypes::empty());
            if !supported.contains(EventTypes::CRITICAL_XID_ERROR) {
                tracing::warn!(gpu = uuid, "GPU does not report XID events: not health-checked");
                continue;
            }
            // register_events consumes the set and frees it on failure, so a failure here ends
            // this attempt; the loop retries later.
            set = device
                .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                .map_err(|e| SourceError { call: "nvmlDeviceRegisterEvents", message: e.to_string() })?;
        }
        self.set = Some(set);
        Ok(())
    }

    fn probe(&mut self, gpu_uuid: &str) -> bool {
        self.nvml.device_by_uuid(gpu_uuid).and_then(|d| d.memory_info()).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::duration::GoDuration;
    use crate::health::HealthPolicy;
    use crate::health::TrackedDevice;
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;
    use std::rc::Rc;

    /// Scripted NVML: each wait pops the next step; time only moves when the loop waits or sleeps.
    struct FakeSource {
        steps: VecDeque<Result<Option<XidEvent>, SourceError>>,
        clock: Rc<FakeClock>,
        stop: Rc<AtomicBool>,
        dead_gpus: Vec<String>,
        reopens: u32,
        probes: Vec<String>,
    }

    struct FakeClock {
        t: Cell<Instant>,
        slept: RefCell<Vec<Duration>>,
    }

    impl Clock for FakeClock {
        fn now(&self) -> Instant {
            self.t.get()
        }
        fn sleep(&self, d: Duration) {
            self.slept.borrow_mut().push(d);
            self.t.set(self.t.get() + d);
        }
    }

    impl XidSource for FakeSource {
        fn wait(&mut self, timeout: Duration) -> Result<Option<XidEvent>, SourceError> {
            match self.steps.pop_front() {
                Some(Ok(None)) | None => {
                    self.clock.t.set(self.clock.t.get() + timeout);
                    if self.steps.is_empty() {
                        self.stop.store(true, Ordering::Relaxed);
                    }
                    Ok(None)
                }
                Some(other) => other,
            }
        }
        fn reopen(&mut self) -> Result<(), SourceError> {
            self.reopens += 1;
            Ok(())
        }
        fn probe(&mut self, gpu_uuid: &str) -> bool {
            self.probes.push(gpu_uuid.to_owned());
            !self.dead_gpus.iter().any(|g| g == gpu_uuid)
        }
    }

    fn xid(gpu: &str, x: u64) -> Result<Option<XidEvent>, SourceError> {
        Ok(Some(XidEvent {
            gpu_uuid: Some(gpu.into()),
            xid: Some(x),
            gpu_instance_id: Some(u32::MAX),
            compute_instance_id: Some(u32::MAX),
        }))
    }

    fn wait_error() -> Result<Option<XidEvent>, SourceError> {
        Err(SourceError { call: "nvmlEventSetWait_v2", message: "Unknown Error".into() })
    }

    struct Run {
        published: Vec<Vec<String>>,
        source: FakeSource,
        slept: Vec<Duration>,
        metrics: Metrics,
    }

    fn run(steps: Vec<Result<Option<XidEvent>, SourceError>>, dead: &[&str], recovery_s: u64) -> Run {
        let clock = Rc::new(FakeClock { t: Cell::new(Instant::now()), slept: RefCell::new(vec![]) });
        let stop = Rc::new(AtomicBool::new(false));
        let mut source = FakeSource {
            steps: steps.into(),
            clock: clock.clone(),
            stop: stop.clone(),
            dead_gpus: dead.iter().map(|s| s.to_string()).collect(),
            reopens: 0,
            probes: vec![],
        };
        let policy = HealthPolicy {
            recovery_period: Some(GoDuration(Duration::from_secs(recovery_s))),
            ..HealthPolicy::default()
        };
        let devices =
            ["GPU-a", "GPU-b"].map(|g| TrackedDevice { uuid: g.into(), gpu_uuid: g.into(), mig: None });
        let mut tracker = HealthTracker::new(policy, devices);
        let metrics = Metrics::default();
        let mut published = Vec::new();
        let mut publish = |s: HealthSnapshot| published.push(s.unhealthy.iter().cloned().collect());
        run_health_loop(
            &mut source,
            &mut tracker,
            &*clock,
            &metrics,
            &stop,
            &mut publish,
            LoopConfig::default(),
        );
        let slept = clock.slept.borrow().clone();
        Run { published, source, slept, metrics }
    }

    #[test]
    fn xid_marks_then_quiet_period_recovers() {
        // 79 on GPU-a, an ignored 13 on GPU-b, then quiet waits (1 s each) past the 5 s period.
        let mut steps = vec![xid("GPU-a", 79), xid("GPU-b", 13)];
        steps.extend((0..7).map(|_| Ok(None)));
        let r = run(steps, &[], 5);
        assert_eq!(r.published, vec![vec!["GPU-a".to_string()], vec![]]);
        assert_eq!(r.source.probes, vec!["GPU-a"], "probed before recovery");
        let text = r.metrics.render(&[]);
        assert!(text.contains("xid_events_total{gpu=\"GPU-b\",xid=\"13\"} 1"), "{text}");
    }

    #[test]
    fn a_gpu_that_does_not_answer_stays_unhealthy() {
        let mut steps = vec![xid("GPU-a", 79)];
        steps.extend((0..12).map(|_| Ok(None)));
        let r = run(steps, &["GPU-a"], 5);
        assert_eq!(r.published, vec![vec!["GPU-a".to_string()]]);
        assert!(r.source.probes.len() >= 2, "probed again after another period: {:?}", r.source.probes);
    }

    #[test]
    fn wait_errors_are_retried_with_backoff_and_reopen() {
        let mut steps: Vec<_> = (0..4).map(|_| wait_error()).collect();
        steps.push(Ok(None));
        let r = run(steps, &[], 5);
        assert!(r.published.is_empty(), "wait errors alone mark nothing: {:?}", r.published);
        assert_eq!(r.slept, [100, 200, 400, 800].map(Duration::from_millis).to_vec());
        assert_eq!(r.source.reopens, 1, "re-created after 3 failures in a row");
        assert!(r.metrics.render(&[]).contains("nvinject_device_plugin_event_wait_errors_total 4"));
    }

    #[test]
    fn wait_error_with_a_lost_gpu_marks_only_that_gpu() {
        let r = run(vec![wait_error(), Ok(None)], &["GPU-b"], 5);
        assert_eq!(r.published, vec![vec!["GPU-b".to_string()]]);
    }
}
