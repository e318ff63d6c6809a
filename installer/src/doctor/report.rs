//! The report: the phases, one line per phase, and how it is printed.

use std::fmt;
use std::io::Write;

/// The steps of the chain, in the order they run and print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Driver and NVML.
    Driver,
    /// CDI spec present and fresh.
    Cdi,
    /// containerd runtime and shim.
    Containerd,
    /// Device plugin registered.
    DevicePlugin,
    /// A container gets a GPU.
    Container,
}

impl Phase {
    /// Every phase, in order.
    pub const ALL: [Phase; 5] =
        [Phase::Driver, Phase::Cdi, Phase::Containerd, Phase::DevicePlugin, Phase::Container];

    /// The name printed in the report and accepted by `--skip`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Driver => "driver",
            Phase::Cdi => "cdi",
            Phase::Containerd => "containerd",
            Phase::DevicePlugin => "device-plugin",
            Phase::Container => "container",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, so the report's column width applies.
        f.pad(self.name())
    }
}

impl PartialEq<str> for Phase {
    fn eq(&self, other: &str) -> bool {
        self.name() == other
    }
}

impl PartialEq<&str> for Phase {
    fn eq(&self, other: &&str) -> bool {
        self.name() == *other
    }
}

/// A phase's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Works.
    Ok,
    /// Broken; the line carries the fix.
    Fail,
    /// Not checked (asked to skip, or an earlier phase it needs failed).
    Skip,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The phase.
    pub phase: Phase,
    /// Verdict.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do (failures only).
    pub fix: Option<String>,
}

impl Line {
    pub(super) fn ok(phase: Phase, detail: impl Into<String>) -> Line {
        Line { phase, status: Status::Ok, detail: detail.into(), fix: None }
    }
    pub(super) fn fail(phase: Phase, detail: impl Into<String>, fix: impl Into<String>) -> Line {
        Line { phase, status: Status::Fail, detail: detail.into(), fix: Some(fix.into()) }
    }
    pub(super) fn skip(phase: Phase, detail: impl Into<String>) -> Line {
        Line { phase, status: Status::Skip, detail: detail.into(), fix: None }
    }
}

/// Prints the lines; returns whether no phase failed.
pub fn print(lines: &[Line], out: &mut dyn Write) -> std::io::Result<bool> {
    for line in lines {
        let status = match line.status {
            Status::Ok => "OK  ",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
        };
        writeln!(out, "{status} {:<14} {}", line.phase, line.detail)?;
        if let Some(fix) = &line.fix {
            writeln!(out, "     {:<14} fix: {fix}", "")?;
        }
    }
    Ok(!lines.iter().any(|l| l.status == Status::Fail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_print_aligned_with_the_fix_under_the_detail() {
        let lines = [
            Line::ok(Phase::Driver, "module 550.54.15 loaded"),
            Line::fail(Phase::DevicePlugin, "no socket", "start the kubelet"),
            Line::skip(Phase::Container, "skipped (--skip)"),
        ];
        let mut out = Vec::new();
        assert!(!print(&lines, &mut out).unwrap(), "a FAIL line makes the report fail");
        let expected = [
            "OK   driver         module 550.54.15 loaded",
            "FAIL device-plugin  no socket",
            "                    fix: start the kubelet",
            "SKIP container      skipped (--skip)",
            "",
        ];
        assert_eq!(String::from_utf8(out).unwrap(), expected.join("\n"));
        let mut out = Vec::new();
        assert!(print(&lines[..1], &mut out).unwrap());
    }
}
